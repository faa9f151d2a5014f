import LogFormat
import LogStore
@testable import LogSync
import LogSyncHTTP
import LogTesting
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
}
