import Foundation
import LogFormat
import LogServer
import LogStore
import LogSync
import LogTesting
import Testing

/// How a server `CONFLICT` becomes a decision, end to end against the real
/// server: the resolution intent must not undo what the app did after the
/// change that conflicted.
@Suite struct ConflictTests {
    /// Replica `a` settles tasks' conflicts with `strategy`; `b` creates a
    /// task with `fields`, both sync, and `b` changes its title to
    /// "from b" and pushes it, which `a` has not pulled yet.
    static func taskChangedOnB(_ name: String, _ strategy: ConflictStrategy, _ fields: Fields = ["title": "v1"])
        async throws -> (server: TestServer, a: Replica, b: Replica, id: String)
    {
        let server = try await TestServer(name)
        var configuration = SyncConfiguration()
        configuration.conflictStrategies["task"] = strategy
        let a = try Replica("a", server: server, configuration: configuration)
        let b = try Replica("b", server: server)
        // Each step must go through: a setup sync that failed (a timeout on
        // a loaded machine) would otherwise surface as a missing conflict.
        func synced(_ replica: Replica, _ step: String) async throws {
            let report = await replica.sync()
            try #require(report.outcome == .completed, "setup, \(step): \(report)")
        }
        let id = try await b.store.create(type: "task", fields: fields)
        try await synced(b, "b pushes the task")
        try await synced(a, "a pulls it")
        try await b.store.update(type: "task", id: id, changes: ["title": "from b"])
        try await synced(b, "b pushes its change")
        return (server, a, b, id)
    }

    /// Two updates on one entity are pushed together; the first conflicts on
    /// `title` and the second, which only names `done`, is applied. The
    /// first is pushed again on the server's version (`keepLocal`), and
    /// must not set `done` back to what the first update said: the app set
    /// it again afterwards.
    @Test(arguments: [ConflictStrategy.keepLocal, .fieldMerge(prefer: .local)])
    func aResolutionKeepsALaterChangeOfTheSameField(_ strategy: ConflictStrategy) async throws {
        let (server, a, b, id) = try await Self.taskChangedOnB("conflict-later-intent", strategy, ["title": "v1", "done": false])
        // A form saves both fields; then the app unchecks `done` again.
        try await a.store.update(type: "task", id: id, changes: ["title": "from a", "done": true])
        try await a.store.update(type: "task", id: id, changes: ["done": false])
        #expect(try a.entities("task")[id] == ["title": "from a", "done": false])
        let report = await a.sync()
        #expect(report.conflicts == 1)
        try await a.syncUntilQuiet()
        await b.sync()
        let onA = try a.entities("task")[id]
        let onB = try b.entities("task")[id]
        #expect(onA == ["title": "from a", "done": false])
        #expect(onB == ["title": "from a", "done": false])
        await server.stop()
    }

    /// Two replicas create an entity with the same ID offline (one settings
    /// record per user), and `b`'s create meets `a`'s on the server. `b`
    /// keeps its own values with `strategy`, over `a`'s fields it does not
    /// have: it has never pulled the entity, so the resolution is a create
    /// made against the server's version, which the server applies as a
    /// replace (`sync-protocol.md`, section 7). Both replicas end with the
    /// same state, and `b`'s later change, pushed before the resolution,
    /// is in it.
    @Test(arguments: [ConflictStrategy.keepLocal, .fieldMerge(prefer: .local)])
    func aCreateThatMetAnotherReplicasCreateOfTheSameIDIsKept(_ strategy: ConflictStrategy) async throws {
        let server = try await TestServer("conflict-same-id-create")
        var configuration = SyncConfiguration()
        configuration.conflictStrategies["settings"] = strategy
        let a = try Replica("a", server: server)
        let b = try Replica("b", server: server, configuration: configuration)
        try await a.store.create(type: "settings", id: "me", fields: ["theme": "dark", "font": "serif"])
        try await b.store.create(type: "settings", id: "me", fields: ["theme": "light"])
        try await b.store.update(type: "settings", id: "me", changes: ["size": 12])
        try #require(await a.sync().outcome == .completed)
        // The create and the update both met `a`'s version; the
        // resolution of the first carries the second's field, and the
        // server applies it in the same run.
        let report = await b.sync()
        #expect(report.conflicts == 2)
        #expect(try b.store.outbox().isEmpty)
        try await b.syncUntilQuiet()
        await a.sync()
        let expected: Fields = ["theme": "light", "font": "serif", "size": 12]
        #expect(try b.entities("settings") == ["me": expected])
        #expect(try a.entities("settings") == ["me": expected])
        #expect(try b.store.conflicts().isEmpty)
        await server.stop()
    }

    /// `fieldMerge(prefer: .remote)` gives a field both sides changed to the
    /// server. Here the push of the local change fails, and while it waits
    /// for its retry a pull brings the other replica's change of the same
    /// field: the store's base is then the server's state, no longer the
    /// state the change was made against, so comparing the server with it
    /// shows no server change at all. The server's change must not be
    /// overwritten as if only the local side had changed the field.
    @Test func aMergePreferringTheServerDoesNotTakeAPulledChangeForTheCommonBase() async throws {
        let (server, a, b, id) = try await Self.taskChangedOnB("conflict-merge-after-pull", .fieldMerge(prefer: .remote))
        try await a.store.update(type: "task", id: id, changes: ["title": "from a"])
        try await server.faults(FaultSettings(failNext: 1, status: 503))
        #expect(await a.sync().acknowledged == 0)
        // The change waits for its retry; this run only pulls.
        #expect(await a.sync().changes == 1)
        try await a.syncUntilQuiet()
        await b.sync()
        let onB = try b.entities("task")[id]
        #expect(onB == ["title": "from b"])
        // Which side changed `title` cannot be told any more: the app decides.
        #expect(try a.store.conflicts().map(\.intent.fields) == [["title": "from a"]])
        #expect(try a.entities("task")[id] == ["title": "from b"])
        await server.stop()
    }

    /// A `custom` rule that returns a decision the store refuses (here a
    /// merge naming a reserved field) must not wedge sync: the conflict is
    /// left for the app, as `askApp` leaves it, and the rest of the run goes
    /// on. Before, the refusal aborted the transaction recording the whole
    /// push batch, the run failed, and every later run met the same conflict
    /// and failed the same way, so no other change synced either.
    @Test func anInvalidCustomDecisionLeavesTheConflictForTheApp() async throws {
        let refused = ConflictStrategy.custom { conflict in .merged(conflict.server.data.merging(["$merged": true])) }
        let (server, a, b, id) = try await Self.taskChangedOnB("conflict-invalid-custom", refused)
        let pulled = try await b.store.create(type: "note", fields: ["text": "from b"])
        await b.sync()
        // The conflicting update and a create of another entity, pushed together.
        try await a.store.update(type: "task", id: id, changes: ["title": "from a"])
        let pushed = try await a.store.create(type: "note", fields: ["text": "from a"])
        let report = await a.sync()
        #expect(report.outcome == .completed)
        #expect(report.acknowledged == 1 && report.conflicts == 1)
        #expect(report.refusedDecisions.map { [$0.entityType, $0.entityID] } == [["task", id]])
        #expect(report.refusedDecisions.first?.reason.contains("\"$merged\"") == true)
        #expect(try a.store.outboxCount() == 0)
        #expect(try a.store.conflicts().map(\.intent.fields) == [["title": "from a"]])
        #expect(try a.entities("task")[id] == ["title": "from b"])
        #expect(try a.entities("note") == [pulled: ["text": "from b"], pushed: ["text": "from a"]])
        #expect(try await server.pullAll().contains { $0.entityID == pushed })
        // Nothing comes back: the next run has nothing to push or refuse.
        let next = await a.sync()
        #expect(next.outcome == .completed && next.conflicts == 0 && next.refusedDecisions.isEmpty)
        // The app settles it itself, as any conflict that waits for it.
        let waiting = try #require(try a.store.conflicts().first)
        try await a.store.resolveConflict(intentOffset: waiting.conflict.intentOffset, .keepLocal)
        try await a.syncUntilQuiet()
        #expect(try a.store.conflicts().isEmpty)
        #expect(try await server.pullAll().last { $0.entityID == id }?.data == ["title": "from a"])
        await server.stop()
    }
}
