import LogFormat
import LogStore
@testable import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// Calls that interleave with a run at its suspension points: each run
/// reads the store before it awaits the server and writes after, and a
/// store call made meanwhile must not be undone by that write.
@Suite struct InterleavingTests {
    /// An app's own `Store.resync` while a pull waits for its page: the
    /// page was pulled from the cursor the resync forgot, so applied it
    /// would set the cursor past the changes the resync forgot, and they
    /// would never come back. The run pulls again from the feed's start.
    @Test func aResyncWhileAPullWaitsIsNotUndoneByItsPage() async throws {
        let server = try await TestServer("resync-during-pull")
        let pulls = HeldRequests(HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback))
        let a = try Replica("a", server: server, transport: pulls)
        let b = try Replica("b", server: server)
        try await b.store.create(type: "task", id: "t1", fields: ["n": 1])
        try await b.store.create(type: "task", id: "t2", fields: ["n": 2])
        #expect(await b.sync().outcome == .completed)
        #expect(await a.sync().outcome == .completed)
        #expect(try a.entities("task").keys.sorted() == ["t1", "t2"])

        try await b.store.create(type: "task", id: "t3", fields: ["n": 3])
        #expect(await b.sync().outcome == .completed)
        let gate = pulls.holdPull()
        let run = Task { await a.engine.sync() }
        try await gate.waitUntilHeld()
        // Forgets t1 and t2 until a pull from the feed's start brings them back.
        try await a.store.resync(reason: "the app's own")
        gate.release()
        let report = await run.value
        #expect(report.outcome == .completed, "\(report)")
        let afterRun = try a.entities("task").keys.sorted()
        #expect(afterRun == ["t1", "t2", "t3"], "\(afterRun)")
        #expect(await a.sync().outcome == .completed)
        let afterNext = try a.entities("task").keys.sorted()
        #expect(afterNext == ["t1", "t2", "t3"], "\(afterNext)")
        await server.stop()
    }

    /// After an app's `Store.resync` while a pull waits for its page, the
    /// pull from the feed's start is a new chain of cursors: a cursor of
    /// the old chain that comes again is no sign of a feed that makes no
    /// progress. Pages of one change each; the resync comes as the second
    /// page is pulled, and the run pulls all three changes again.
    @Test func aResyncWhileAPullWaitsStartsANewChainOfCursors() async throws {
        let server = try await TestServer("resync-during-pull-chain")
        let pulls = BeforeEachPull(HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback))
        var configuration = SyncConfiguration()
        configuration.pullPageCountMax = 1
        let a = try Replica("a", server: server, configuration: configuration, transport: pulls)
        let b = try Replica("b", server: server)
        for n in 1...3 { try await b.store.create(type: "task", id: "t\(n)", fields: ["n": .int(Int64(n))]) }
        #expect(await b.sync().outcome == .completed)
        let store = a.store
        pulls.set { pull in
            guard pull == 2 else { return }
            do { try await store.resync(reason: "the app's own") } catch { Issue.record("\(error)") }
        }
        let report = await a.sync()
        #expect(report.outcome == .completed, "\(report)")
        #expect(pulls.count == 5, "one page before the resync, the one it made stale, and three")
        #expect(try a.entities("task").keys.sorted() == ["t1", "t2", "t3"])
        await server.stop()
    }
}

/// Through `inner`, calling the action set with each pull's number (from
/// 1) before the pull is sent.
final class BeforeEachPull: SyncTransport {
    private let inner: HTTPTransport
    private let state = Mutex<(count: Int, action: (@Sendable (Int) async -> Void)?)>((0, nil))

    init(_ inner: HTTPTransport) { self.inner = inner }

    /// The pulls so far.
    var count: Int { state.withLock { $0.count } }

    func set(_ action: @escaping @Sendable (Int) async -> Void) { state.withLock { $0.action = action } }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { try await inner.push(request) }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        let (number, action) = state.withLock { state in
            state.count += 1
            return (state.count, state.action)
        }
        await action?(number)
        return try await inner.pull(cursor: cursor, limit: limit, types: types)
    }
}
