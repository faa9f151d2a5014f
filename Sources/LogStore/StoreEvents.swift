import LogFormat
import Synchronization

/// Something the app must hear about that it did not ask for: nothing in
/// this list is ever dropped silently. Each is also in the log, so an app
/// that was not listening can still find it there.
public enum StoreEvent: Sendable, Equatable {
    /// The server refused an intent for good; it left the visible state.
    case rejected(RejectedIntent)
    /// An intent met a newer server state (see `Conflict`).
    case conflict(offset: UInt64, Conflict)
    /// An intent exhausted its retries and waits for the app.
    case retriesExhausted(offset: UInt64, entityType: String, entityID: String, lastError: String)
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

/// Fans values out to any number of `AsyncStream` subscribers. Streams
/// buffer without bound, so a slow reader never loses a value; it is the
/// reader's job to keep up. Made with a latest value (a state feed), it
/// hands each new subscriber that value first.
package final class Broadcast<Element: Sendable>: Sendable {
    private struct State {
        var nextID = 0
        var continuations: [Int: AsyncStream<Element>.Continuation] = [:]
        var finished = false
        /// Kept and replayed only when the broadcast was made with one.
        var latest: Element?
    }

    private let state: Mutex<State>

    /// - Parameter latest: a first value for subscribers, replaced by each
    ///   published one; nil for a feed of events, which replays nothing.
    package init(latest: Element? = nil) { state = Mutex(State(latest: latest)) }

    package func subscribe() -> AsyncStream<Element> {
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self, bufferingPolicy: .unbounded)
        let id: Int? = state.withLock { state in
            if let latest = state.latest { continuation.yield(latest) }
            guard !state.finished else { return nil }
            defer { state.nextID += 1 }
            state.continuations[state.nextID] = continuation
            return state.nextID
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.continuations.removeValue(forKey: id) }
        }
        return stream
    }

    /// Streams still open: each ends its registration when it terminates
    /// (finished, or its reader cancelled or gone).
    package var subscriberCount: Int { state.withLock { $0.continuations.count } }

    package func publish(_ element: Element) {
        let continuations = state.withLock { state in
            if state.latest != nil { state.latest = element }
            return Array(state.continuations.values)
        }
        for continuation in continuations { continuation.yield(element) }
    }

    /// A broadcast released with its owner (an engine the app let go)
    /// ends its streams: nothing can publish to them any more, and a
    /// reader's `for await` would otherwise wait forever.
    deinit { finish() }

    /// Ends every stream (the store closed).
    package func finish() {
        let continuations = state.withLock { state in
            state.finished = true
            defer { state.continuations = [:] }
            return Array(state.continuations.values)
        }
        for continuation in continuations { continuation.finish() }
    }
}
