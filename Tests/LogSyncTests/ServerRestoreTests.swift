import LogFormat
import LogTesting
import Testing

/// A server whose store the operator put back from a backup lost the
/// changes made since; each replica must come to hold what it holds
/// (`ConvergenceTests` runs this at random, under faults).
@Suite struct ServerRestoreTests {
    /// A replica whose push was acknowledged but whose pull then failed
    /// keeps a cursor from before its own change. The restored store still
    /// holds the change that cursor points after, so it is no reason for a
    /// 410; yet the acknowledged change is gone from the server, and a
    /// replica that kept it would hold an entity no other replica and no
    /// server ever will. The operator's forced resync after the restore
    /// (section 12) takes it out: every replica then forgets its confirmed
    /// state and pulls the restored feed whole.
    /// The resync forgets the confirmed state, not the changes the feed
    /// has yet to show: the full pull ends without the lost one, which the
    /// replica then lists for its app, with no second resync.
    @Test func anOperatorResyncAfterTheRestoreTakesOutAnAcknowledgedChangeItLost() async throws {
        let run = try await LaggingCursorRun("restore-resync")
        try await run.server.forceResync()
        try await run.syncAndCheck()
        #expect(run.a.lostChanges.map { $0.serverVersion } == [1], "\(run.a.lostChanges)")
        #expect(run.a.resyncs == 1)
        #expect(run.b.lostChanges.isEmpty)
        #expect(try run.a.store.acknowledgedChangesNotInFeed(through: .max).isEmpty)
    }

    /// Without the operator's resync no 410 tells the replica of its lost
    /// change, but the feed does: it ends without the change the server
    /// acknowledged, so the replica resyncs of its own accord.
    @Test func withoutAResyncAReplicaSeesTheFeedEndWithoutItsAcknowledgedChange() async throws {
        let run = try await LaggingCursorRun("restore-lagging")
        try await run.syncAndCheck()
        #expect(run.a.lostChanges.map { $0.serverVersion } == [1], "\(run.a.lostChanges)")
        #expect(run.b.lostChanges.isEmpty)
        #expect(try run.a.store.acknowledgedChangesNotInFeed(through: .max).isEmpty)
    }

    /// A replica whose cursor is newer than the backup is refused it
    /// (410) and resyncs; the full pull ends without the change it pushed
    /// after that cursor, which it lists for its app as well.
    @Test func aReplicaRefusedItsCursorListsTheAcknowledgedChangeTheRestoreLost() async throws {
        let server = try await TestServer("restore-refused")
        let a = try Replica("restore-refused-a", server: server)
        let b = try Replica("restore-refused-b", server: server)
        _ = try await a.store.create(type: "task", fields: Fields([("title", .string("kept"))]))
        try await a.syncUntilQuiet()
        let backup = server.directory.appending("backup")
        try await server.backUp(to: backup)
        try a.connect(to: server)
        try b.connect(to: server)
        _ = try await b.store.create(type: "task", fields: Fields([("title", .string("gone"))]))
        try await b.syncUntilQuiet()
        try await a.syncUntilQuiet()
        try a.connect(to: server, transport: FailingPulls(server, retryAfterSeconds: nil))
        _ = try await a.store.create(type: "task", fields: Fields([("title", .string("lost"))]))
        #expect(await a.sync().acknowledged == 1)
        try await server.restore(from: backup)
        try a.connect(to: server)
        try b.connect(to: server)
        try await b.syncUntilQuiet()
        try await a.syncUntilQuiet()
        #expect(try a.entities("task") == b.entities("task"))
        #expect(try a.entities("task").values.map { $0["title"] } == [.string("kept")])
        #expect(a.resyncs == 1)
        #expect(a.lostChanges.map { $0.serverVersion } == [1], "\(a.lostChanges)")
        await server.stop()
    }

    /// A replica that never pulled has no cursor, yet its pull from the
    /// start is no resync: the acknowledged create the restore lost gave it
    /// a base, which only a resync takes out.
    @Test func aReplicaThatNeverPulledResyncsAChangeTheRestoreLost() async throws {
        let server = try await TestServer("restore-first")
        let a = try Replica("restore-first-a", server: server)
        let backup = server.directory.appending("backup")
        try await server.backUp(to: backup)
        try a.connect(to: server, transport: FailingPulls(server, retryAfterSeconds: nil))
        _ = try await a.store.create(type: "task", fields: Fields([("title", .string("lost"))]))
        #expect(await a.sync().acknowledged == 1)
        #expect(try a.store.pullCursor() == nil)
        try await server.restore(from: backup)
        try a.connect(to: server)
        try await a.syncUntilQuiet()
        let held = try a.entities("task")
        #expect(held.isEmpty, "\(held)")
        #expect(a.lostChanges.map { $0.serverVersion } == [1], "\(a.lostChanges)")
        #expect(a.resyncs == 1)
        await server.stop()
    }
}

/// Replica `a` wrote "kept" and synced, the server was backed up, `a`
/// wrote "lost", pushed it (acknowledged) and failed to pull, and the
/// backup was restored: the server holds "kept" alone.
private struct LaggingCursorRun {
    let server: TestServer
    let a: Replica
    let b: Replica

    init(_ name: String) async throws {
        server = try await TestServer(name)
        a = try Replica("\(name)-a", server: server)
        b = try Replica("\(name)-b", server: server)
        _ = try await a.store.create(type: "task", fields: Fields([("title", .string("kept"))]))
        try await a.syncUntilQuiet()
        let backup = server.directory.appending("backup")
        try await server.backUp(to: backup)
        try a.connect(to: server, transport: FailingPulls(server, retryAfterSeconds: nil))
        _ = try await a.store.create(type: "task", fields: Fields([("title", .string("lost"))]))
        let lagging = await a.sync()
        #expect(lagging.acknowledged == 1 && lagging.outcome != .completed, "\(lagging)")
        try await server.restore(from: backup)
        try a.connect(to: server)
        try b.connect(to: server)
    }

    /// `b` writes "after", both sync until quiet, and each holds what the
    /// server holds: "kept" and "after".
    func syncAndCheck() async throws {
        _ = try await b.store.create(type: "task", fields: Fields([("title", .string("after"))]))
        try await b.syncUntilQuiet()
        try await a.syncUntilQuiet()
        try await b.syncUntilQuiet()
        let onServer = try await server.pullAll().map { $0.data?["title"] }
        #expect(onServer.count == 2, "\(onServer)")
        for (name, replica) in [("a", a), ("b", b)] {
            let titles = try replica.entities("task").values.map { $0["title"] }
            #expect(Set(titles) == Set(onServer), "\(name) holds \(titles), the server \(onServer)")
        }
        await server.stop()
    }
}
