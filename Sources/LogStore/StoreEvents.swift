import LogFormat
import Synchronization

/// Something the app must hear about, mostly what it did not ask for
/// (a conflict it resolves itself is told too): nothing in this list is
/// ever dropped silently. Each is also in the store, so an app
/// that was not listening, or fell behind (`missed`), can still find it
/// there: waiting conflicts in `Store.conflicts()`, failed intents in
/// `Store.outbox()`, and every rejection and conflict as a `reject` or
/// `conflict` entry in the log.
public enum StoreEvent: Sendable, Equatable {
    /// The server refused an intent for good; it left the visible state.
    /// A conflict is one too (code `CONFLICT`), beside its `conflict`
    /// event: what the strategy or the app keeps of the change comes back
    /// as a new intent.
    case rejected(RejectedIntent)
    /// An intent met a newer server state (see `Conflict`): one for each
    /// `conflict` entry, the one that records it (decided by the strategy,
    /// or waiting for the app) and then the app's own decision on a waiting
    /// one (`Store.resolveConflict`), or the `keepLocal` that the app's
    /// create or delete of the entity settles it with.
    case conflict(offset: UInt64, Conflict)
    /// An intent exhausted its retries, or was in a push the server refused
    /// as a whole (a 400, 401 or 403): it is `failed`, and neither it nor
    /// the later intents of its entity are pushed until the app calls
    /// `Store.retryFailed()`.
    case retriesExhausted(offset: UInt64, entityType: String, entityID: String, lastError: String)
    /// The reader fell `Store.eventBufferCountMax` events behind, and the
    /// stream dropped the `count` events that came next instead of holding
    /// them for it; the ones after this value were kept again. The reader
    /// looks in the store for what it missed.
    case missed(count: Int)
}

/// A rejected intent, with what the app needs to tell its user.
public struct RejectedIntent: Sendable, Equatable {
    public var intentOffset: UInt64
    public var operation: Intent.Operation
    public var entityType: String
    public var entityID: String
    public var code: String
    public var message: String

    public init(
        intentOffset: UInt64, operation: Intent.Operation, entityType: String, entityID: String, code: String,
        message: String
    ) {
        self.intentOffset = intentOffset
        self.operation = operation
        self.entityType = entityType
        self.entityID = entityID
        self.code = code
        self.message = message
    }
}

/// A commit touched entities of `entityType`; `offset` is the log position
/// after that commit.
public struct StoreChange: Sendable, Equatable {
    public var entityType: String
    public var offset: UInt64

    public init(entityType: String, offset: UInt64) {
        self.entityType = entityType
        self.offset = offset
    }
}

/// Fans values out to any number of streams, each with a bound on what it
/// holds for a reader that is slow or never reads: the newest values only
/// (a signal or a state, where the last says all), or the first ones and a
/// count of those it missed (events, `BoundedStream`). Made with a latest
/// value (a state feed), it hands each new subscriber that value first.
package final class Broadcast<Element: Sendable>: Sendable {
    private struct Subscriber: Sendable {
        let deliver: @Sendable (Element) -> Void
        let finish: @Sendable () -> Void
    }

    private struct State {
        var nextID = 0
        var subscribers: [Int: Subscriber] = [:]
        var finished = false
        /// Kept and replayed only when the broadcast was made with one.
        var latest: Element?
    }

    private let state: Mutex<State>

    /// - Parameter latest: a first value for subscribers, replaced by each
    ///   published one; nil for a feed of events, which replays nothing.
    package init(latest: Element? = nil) { state = Mutex(State(latest: latest)) }

    /// A stream that holds the newest `countMax` values its reader has not
    /// read, dropping older ones, of those that `accepts` lets through.
    package func subscribe(
        bufferingNewest countMax: Int, where accepts: @escaping @Sendable (Element) -> Bool = { _ in true }
    ) -> AsyncStream<Element> {
        precondition(countMax > 0, "a stream must hold a value")
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self, bufferingPolicy: .bufferingNewest(countMax))
        let subscriber = Subscriber(
            deliver: { if accepts($0) { continuation.yield($0) } }, finish: { continuation.finish() })
        if let id = register(subscriber) {
            continuation.onTermination = { [weak self] _ in self?.unregister(id) }
        }
        return stream
    }

    /// A stream that holds the first `countMax` values its reader has not
    /// read, then yields `missed(count)` in place of those it drops.
    package func subscribe(
        keepingFirst countMax: Int, missed: @escaping @Sendable (Int) -> Element
    ) -> BoundedStream<Element> {
        let buffer = BoundedStream<Element>.Buffer(countMax: countMax, missed: missed)
        let (doorbell, ring) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let subscriber = Subscriber(
            deliver: { value in
                buffer.put(value)
                ring.yield()
            },
            finish: { ring.finish() })
        if let id = register(subscriber) {
            ring.onTermination = { [weak self] termination in
                if case .cancelled = termination { buffer.removeAll() }
                self?.unregister(id)
            }
        }
        return BoundedStream(buffer: buffer, doorbell: doorbell)
    }

    /// Hands `subscriber` the latest value, if any, and adds it; nil (and
    /// the subscriber finished) when the broadcast has finished.
    private func register(_ subscriber: Subscriber) -> Int? {
        let id: Int? = state.withLock { state in
            if let latest = state.latest { subscriber.deliver(latest) }
            guard !state.finished else { return nil }
            defer { state.nextID += 1 }
            state.subscribers[state.nextID] = subscriber
            return state.nextID
        }
        if id == nil { subscriber.finish() }
        return id
    }

    private func unregister(_ id: Int) {
        _ = state.withLock { $0.subscribers.removeValue(forKey: id) }
    }

    /// Streams still open: each ends its registration when it terminates
    /// (finished, or its reader cancelled or gone).
    package var subscriberCount: Int { state.withLock { $0.subscribers.count } }

    package func publish(_ element: Element) {
        let subscribers = state.withLock { state in
            if state.latest != nil { state.latest = element }
            return Array(state.subscribers.values)
        }
        for subscriber in subscribers { subscriber.deliver(element) }
    }

    /// A broadcast released with its owner (an engine the app let go)
    /// ends its streams: nothing can publish to them any more, and a
    /// reader's `for await` would otherwise wait forever.
    deinit { finish() }

    /// Ends every stream (the store closed).
    package func finish() {
        let subscribers = state.withLock { state in
            state.finished = true
            defer { state.subscribers = [:] }
            return Array(state.subscribers.values)
        }
        for subscriber in subscribers { subscriber.finish() }
    }
}
