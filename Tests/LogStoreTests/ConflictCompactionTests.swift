import LogFormat
@testable import LogStore
import LogTesting
import Testing

/// Conflicts that wait for the app across compaction: the tables a replay
/// of the compacted log gives must be those the store had, and the conflict
/// must stay listable and resolvable.
@Suite struct ConflictCompactionTests {
    /// Compacts below `watermark` and checks the tables stay as they were
    /// (but for the idempotency rows of removed intents), after the
    /// compaction, a replay and a reopen.
    private func compactKeepingTables(_ fixture: inout StoreFixture, below watermark: UInt64) async throws {
        var before = try fixture.store.derivedTables()
        _ = try await fixture.store.compact(below: watermark)
        let compacted = try fixture.store.derivedTables()
        before.idempotency = compacted.idempotency
        #expect(compacted == before)
        try await fixture.store.rebuildProjections()
        #expect(try fixture.store.derivedTables() == compacted)
        try fixture.reopen()
        try await fixture.store.rebuildProjections()
        #expect(try fixture.store.derivedTables() == compacted)
    }

    /// Compaction keeps the answer of an intent whose conflict waits; a
    /// resync after that answer, below the watermark, forgot the base the
    /// answer gave. Before, the resync was removed and a replay of the kept
    /// ack gave the entity that base again. The resync now stays, and the
    /// snapshots go after it (here, not at the freed offset 1).
    @Test func aResyncAfterTheKeptAnswerOfAWaitingConflictStillForgetsItsBase() async throws {
        var fixture = try StoreFixture("conflict-ack-resync")
        let store = fixture.store
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1, fields: [:])], cursor: "c0")  // 1
        try await store.create(type: "te", id: "a", fields: ["n": 1])  // 2
        try await store.record([(2, .acknowledged(.applied, serverVersion: 1))])  // 3
        _ = try await store.log.append(
            .conflict(
                Conflict(
                    intentOffset: 2, entityType: "te", entityID: "a", serverVersion: 2, serverDeleted: false,
                    serverFields: ["n": 2], resolution: .pending, resolvedFields: [:])))  // 4
        try await store.resync(reason: "test")  // 5
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "b", serverVersion: 1, fields: [:])], cursor: "c1")  // 6
        try await store.create(type: "te", id: "c", fields: [:])  // 7
        #expect(try store.get(type: "te", id: "a") == nil)
        try await compactKeepingTables(&fixture, below: 7)
        #expect(try scanAll(fixture.store.log).map(\.offset) == [2, 3, 4, 5, 6, 7])
        #expect(try fixture.store.get(type: "te", id: "a") == nil)
        #expect(try fixture.store.get(type: "te", id: "b") != nil)
        #expect(try fixture.store.pullCursor() == "c1")
        #expect(try fixture.store.conflicts().map(\.conflict.intentOffset) == [2])
        try await fixture.store.resolveConflict(intentOffset: 2, .keepRemote)
        #expect(try fixture.store.conflicts().isEmpty)
        try await compactKeepingTables(&fixture, below: try fixture.store.log.lastOffset())
    }

    /// storage.md section 4, Compaction, step 2: a conflict entry whose
    /// intent an earlier compaction removed stays. A pending one still
    /// waits, and on replay its `conflicts` row comes from that entry alone.
    @Test func aWaitingConflictWhoseIntentAnEarlierCompactionRemovedStays() async throws {
        var fixture = try StoreFixture("conflict-intent-removed")
        try await fixture.store.create(type: "te", id: "a", fields: ["n": 1])  // 1
        try await fixture.store.record([(1, .acknowledged(.applied, serverVersion: 1))])  // 2
        try await fixture.store.create(type: "te", id: "b", fields: [:])  // 3, pending
        _ = try await fixture.store.compact(below: 3)
        #expect(try fixture.store.log.entry(at: 2)?.kind == .snapshot)
        // A conflict that waits on the removed intent: only a raw append
        // writes one; an empty record projects it.
        _ = try await fixture.store.log.append(
            .conflict(
                Conflict(
                    intentOffset: 1, entityType: "te", entityID: "a", serverVersion: 2, serverFields: ["n": 2],
                    resolution: .pending)))  // 4
        try await fixture.store.record([])
        try await fixture.store.create(type: "te", id: "c", fields: [:])  // 5
        #expect(try fixture.store.derivedTables().conflicts.count == 2)
        try await compactKeepingTables(&fixture, below: 5)
        #expect(try fixture.store.log.entry(at: 4)?.kind == .conflict)
        #expect(try fixture.store.derivedTables().conflicts.count == 2)
    }

    /// A conflict the app no longer waits for goes with its intent: the
    /// intent was answered (the reject a conflict writes) and decided
    /// below the watermark, so compaction removes the intent, its answer
    /// and its conflict entry, and keeps nothing of them in the log.
    @Test func aDecidedConflictGoesWithItsIntent() async throws {
        var fixture = try StoreFixture("conflict-decided-removed")
        try await fixture.store.create(type: "te", id: "a", fields: ["n": 1])  // 1
        let server = ServerState(serverVersion: 3, deleted: false, data: ["n": 3])
        _ = try await fixture.store.record([(1, .conflict(server, message: "newer"))]) { _ in .keepRemote }  // 2, 3
        try await fixture.store.create(type: "te", id: "z", fields: [:])
        let last = try fixture.store.log.lastOffset()
        #expect(try fixture.store.conflicts().isEmpty)
        #expect(try await fixture.store.compact(below: last, dryRun: true).entriesKept == 0)
        try await compactKeepingTables(&fixture, below: last)
        #expect(try !scanAll(fixture.store.log).contains { $0.kind == .conflict })
        fixture.store.close()
    }

    /// A conflict left for the app (answered by a reject), compacted twice,
    /// resolved between, with pulls and a reopen: the tables stay, and the
    /// conflict is listed until it is resolved.
    @Test(arguments: [ConflictDecision.keepLocal, .keepRemote, .merged(["n": 9]), .custom(nil)])
    func aWaitingConflictSurvivesRepeatedCompaction(_ decision: ConflictDecision) async throws {
        var fixture = try StoreFixture("conflict-compacted-twice")
        try await fixture.store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 1, fields: ["n": 1])], cursor: "c1")
        try await fixture.store.update(type: "te", id: "a", changes: ["n": 2])  // 2
        let server = ServerState(serverVersion: 3, deleted: false, data: ["n": 3])
        try await fixture.store.record([(2, .conflict(server, message: "newer"))]) { _ in .askApp }
        try await fixture.store.update(type: "te", id: "a", changes: ["m": 1])
        try await fixture.store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 3, fields: ["n": 3])], cursor: "c2")
        try await fixture.store.create(type: "te", id: "z", fields: [:])
        try await compactKeepingTables(&fixture, below: try fixture.store.log.lastOffset())
        #expect(try fixture.store.conflicts().map(\.conflict.intentOffset) == [2])
        try await fixture.store.resync(reason: "test")
        try await fixture.store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 4, fields: ["n": 4])], cursor: "c3")
        try await fixture.store.create(type: "te", id: "y", fields: [:])
        try await compactKeepingTables(&fixture, below: try fixture.store.log.lastOffset())
        #expect(try fixture.store.conflicts().map(\.conflict.intentOffset) == [2])
        try await fixture.store.resolveConflict(intentOffset: 2, decision)
        #expect(try fixture.store.conflicts().isEmpty)
        try await compactKeepingTables(&fixture, below: try fixture.store.log.lastOffset())
        #expect(try fixture.store.conflicts().isEmpty)
    }
}
