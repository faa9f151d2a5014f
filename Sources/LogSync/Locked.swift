import Foundation

/// A value behind a lock, for the few pieces of state shared across
/// threads outside an actor.
final class Locked<Value: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func get() -> Value { lock.withLock { value } }
    func set(_ newValue: Value) { lock.withLock { value = newValue } }
    @discardableResult
    func update<R>(_ body: (inout Value) -> R) -> R { lock.withLock { body(&value) } }
}

/// Hands each value to every current subscriber; a new subscriber first
/// gets the latest value.
final class StateBroadcast<Element: Sendable>: Sendable {
    private struct Subscribers {
        var latest: Element
        var continuations: [UUID: AsyncStream<Element>.Continuation] = [:]
        var finished = false
    }

    private let subscribers: Locked<Subscribers>

    init(_ initial: Element) { subscribers = Locked(Subscribers(latest: initial)) }

    func subscribe() -> AsyncStream<Element> {
        let (stream, continuation) = AsyncStream<Element>.makeStream()
        let id = UUID()
        let open = subscribers.update { state -> Bool in
            continuation.yield(state.latest)
            guard !state.finished else { return false }
            state.continuations[id] = continuation
            return true
        }
        if open {
            continuation.onTermination = { [weak self] _ in self?.subscribers.update { _ = $0.continuations.removeValue(forKey: id) } }
        } else {
            continuation.finish()
        }
        return stream
    }

    func publish(_ value: Element) {
        let targets = subscribers.update { state in
            state.latest = value
            return Array(state.continuations.values)
        }
        for continuation in targets { continuation.yield(value) }
    }

    func finish() {
        let targets = subscribers.update { state in
            state.finished = true
            defer { state.continuations = [:] }
            return Array(state.continuations.values)
        }
        for continuation in targets { continuation.finish() }
    }
}
