import Foundation
import LogFormat
import LogServer
import LogStore
import LogSync
import LogTesting
import Testing

/// Conflicts of entities too big for two copies of their state to fit one
/// log entry, end to end against the real server. The server accepts an
/// entity of up to `entityFieldsBytesMax` (just under an entry), so the
/// server's state alone always fits a `conflict` entry, but the server's
/// state and a resolved state of the same size do not.
@Suite struct ConflictSizeTests {
    /// 2.5 MiB: one such entity fits an entry, two copies of it do not.
    static let blob = Value.bytes([UInt8](repeating: 0xA5, count: 5 * 512 * 1024))
    static let bigTask: Fields = ["title": "v1", "blob": blob]

    /// A strategy settles the conflict of a big entity, in a push batch with
    /// a change of another entity. Before, the `conflict` entry with both
    /// the server's and the resolved state was over the entry limit: the
    /// transaction recording the whole batch failed, the run failed, and
    /// every later run met the same conflict and failed the same way, so
    /// nothing synced any more. The resolution must be recorded as decided,
    /// without the resolved fields that no longer fit, and the other answer
    /// with it.
    @Test(arguments: [(ConflictStrategy.keepRemote, "from b"), (.keepLocal, "from a")])
    func aStrategysResolutionOfABigEntityIsRecorded(_ strategy: ConflictStrategy, _ title: String) async throws {
        let (server, a, b, id) = try await ConflictTests.taskChangedOnB("conflict-big-strategy", strategy, Self.bigTask)
        try await a.store.update(type: "task", id: id, changes: ["title": "from a"])
        let note = try await a.store.create(type: "note", fields: ["text": "from a"])
        let report = await a.sync()
        #expect(report.outcome == .completed)
        #expect(report.conflicts == 1 && report.refusedDecisions.isEmpty)
        // The note's ack is recorded, and so is `keepLocal`'s intent, pushed in the same run.
        #expect(try a.store.outboxCount() == 0)
        let conflict = try #require(try Self.lastConflict(a))
        #expect(conflict.resolution != .pending)
        #expect(conflict.serverFields == ["title": "from b", "blob": Self.blob])
        #expect(conflict.resolvedFields == [:])
        try await a.syncUntilQuiet()
        await b.sync()
        #expect(try a.store.conflicts().isEmpty)
        #expect(try a.entities("task")[id] == ["title": .string(title), "blob": Self.blob])
        #expect(try b.entities("task")[id] == ["title": .string(title), "blob": Self.blob])
        #expect(try b.entities("note")[note] == ["text": "from a"])
        try a.restart()
        #expect(try a.entities("task")[id] == ["title": .string(title), "blob": Self.blob])
        await server.stop()
    }

    /// The app settles a waiting conflict of a big entity. The waiting
    /// entry holds only the server's state, which fits; the entry that
    /// settles it would hold a second copy, and `resolveConflict` failed.
    @Test func theAppResolvesAConflictOfABigEntity() async throws {
        let (server, a, b, id) = try await ConflictTests.taskChangedOnB("conflict-big-app", .askApp, Self.bigTask)
        try await a.store.update(type: "task", id: id, changes: ["title": "from a"])
        let report = await a.sync()
        #expect(report.outcome == .completed && report.conflicts == 1)
        let waiting = try #require(try a.store.conflicts().first)
        #expect(waiting.conflict.serverFields == ["title": "from b", "blob": Self.blob])
        try await a.store.resolveConflict(intentOffset: waiting.conflict.intentOffset, .keepLocal)
        #expect(try a.store.conflicts().isEmpty)
        #expect(try Self.lastConflict(a)?.resolution == .keepLocal)
        try await a.syncUntilQuiet()
        await b.sync()
        #expect(try a.entities("task")[id] == ["title": "from a", "blob": Self.blob])
        #expect(try b.entities("task")[id] == ["title": "from a", "blob": Self.blob])
        await server.stop()
    }

    /// A custom rule's decision whose resolution intent is over the entry
    /// limit cannot be recorded. Before, it aborted the transaction
    /// recording the batch, as an oversized `conflict` entry did. It must
    /// be refused like an invalid decision: the conflict waits for the app
    /// with the reason, and the batch's other answer is recorded. The app's
    /// own decision that is too large is refused as invalid, and the app
    /// can settle the conflict otherwise.
    @Test func aResolutionIntentTooLargeForAnEntryLeavesTheConflictForTheApp() async throws {
        let notes = Value.bytes([UInt8](repeating: 1, count: Limits.entryBodyBytesMax))
        let tooLarge = ConflictStrategy.custom { conflict in .merged(conflict.server.data.merging(["notes": notes])) }
        let (server, a, b, id) = try await ConflictTests.taskChangedOnB("conflict-big-intent", tooLarge)
        try await a.store.update(type: "task", id: id, changes: ["title": "from a"])
        let note = try await a.store.create(type: "note", fields: ["text": "from a"])
        let report = await a.sync()
        #expect(report.outcome == .completed)
        #expect(report.acknowledged == 1 && report.conflicts == 1)
        #expect(report.refusedDecisions.map { [$0.entityType, $0.entityID] } == [["task", id]])
        #expect(report.refusedDecisions.first?.reason.contains("over the entry limit") == true)
        #expect(try a.store.conflicts().map(\.intent.fields) == [["title": "from a"]])
        #expect(try a.entities("task")[id] == ["title": "from b"])
        #expect(try await server.pullAll().contains { $0.entityID == note })
        let next = await a.sync()
        #expect(next.outcome == .completed && next.conflicts == 0 && next.refusedDecisions.isEmpty)
        let waiting = try #require(try a.store.conflicts().first)
        await #expect {
            try await a.store.resolveConflict(intentOffset: waiting.conflict.intentOffset, .merged(["title": "x", "notes": notes]))
        } throws: { ($0 as? LogStoreError)?.code == .invalidArgument }
        #expect(try a.store.conflicts().count == 1)
        try await a.store.resolveConflict(intentOffset: waiting.conflict.intentOffset, .keepLocal)
        try await a.syncUntilQuiet()
        await b.sync()
        #expect(try a.store.conflicts().isEmpty)
        #expect(try b.entities("task")[id] == ["title": "from a"])
        await server.stop()
    }

    /// `keepLocal` against a server that deleted the entity brings it back
    /// with a create of what the app sees, which can be larger than an entry
    /// (the app's update added to an entity near the limit; the server would
    /// refuse it too). The reference server answers an update of a deleted
    /// entity `ENTITY_NOT_FOUND`, so this conflict is recorded directly in a
    /// real store: the decision is refused, and the conflict waits.
    @Test func aKeepLocalTooLargeToRecreateADeletedEntityLeavesTheConflictForTheApp() async throws {
        let directory = try TemporaryDirectory("conflict-big-recreate")
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "task", entityID: "t1", serverVersion: 1, fields: Self.bigTask)], cursor: "c1")
        try await store.update(type: "task", id: "t1", changes: ["notes": Self.blob])
        let update = try #require(try store.outbox().first)
        let deleted = ServerState(serverVersion: 2, deleted: true, data: [:])
        let recorded = try await store.record([(update.offset, .conflict(deleted, message: "deleted"))]) { _ in .keepLocal }
        #expect(recorded.settled == [update.offset])
        #expect(recorded.refused.map(\.entityID) == ["t1"])
        #expect(recorded.refused.first?.reason.contains("over the entry limit") == true)
        #expect(try store.conflicts().map(\.conflict.intentOffset) == [update.offset])
        #expect(try store.outboxCount() == 0)
    }

    static func lastConflict(_ replica: Replica) throws -> Conflict? {
        guard case .conflict(let conflict) = try replica.entries(.conflict).last?.body else { return nil }
        return conflict
    }
}
