import Foundation
import LogFormat
@testable import LogStore
import LogTesting
import Testing

@Suite struct CompactionTests {
    /// A store with a history: pulled changes, acked and rejected intents,
    /// a remote delete, and intents still pending.
    private func storeWithHistory(_ name: String) async throws -> StoreFixture {
        let fixture = try StoreFixture(name)
        let store = fixture.store
        try await store.applyPulledPage([
            PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 1, fields: ["n": 1]),
            PulledChange(.upsert, entityType: "te", entityID: "b", serverVersion: 1, fields: ["n": 1]),
        ], cursor: "c1")
        try await store.update(type: "te", id: "a", changes: ["n": 2])
        try await store.create(type: "te", id: "c", fields: ["n": 3])
        let first = try store.outbox()
        try await store.record([(first[0].offset, .acknowledged(.applied, serverVersion: 2))])
        try await store.record([(first[1].offset, .rejected(code: "VALIDATION_ERROR", message: "no"))])
        try await store.applyPulledPage([PulledChange(.delete, entityType: "te", entityID: "b", serverVersion: 5)], cursor: "c2")
        try await store.update(type: "te", id: "a", changes: ["pending": true])
        return fixture
    }

    /// A compaction whose plan changes more entries than a transaction
    /// should hold goes in steps of rising watermarks, each a commit: the
    /// tables stay, the log ends as one transaction leaves it, the report
    /// counts what the steps did together, and compacting again finds
    /// nothing to do. One under the bounds is one commit.
    @Test func aLargeCompactionGoesInSteps() async throws {
        var stores: [Store] = []
        var reports: [CompactionReport] = []
        var logs: [[Entry]] = []
        for stepped in [false, true] {
            let fixture = try StoreFixture("compact-steps-\(stepped)")
            let store = fixture.store
            stores.append(store)
            // 60 entities: each created, updated twice, and all of it
            // acknowledged; then pulled changes to every other one.
            for n in 0..<60 {
                try await store.create(type: "te", id: "e\(n)", fields: ["n": .int(Int64(n))])
                try await store.update(type: "te", id: "e\(n)", changes: ["m": 1])
                try await store.update(type: "te", id: "e\(n)", changes: ["m": 2])
            }
            try await store.record(try store.outbox(limit: 1_000).enumerated().map { index, item in
                (item.offset, .acknowledged(.applied, serverVersion: UInt64(index % 3 + 1)))
            })
            try await store.applyPulledPage(
                (0..<30).map { PulledChange(.upsert, entityType: "te", entityID: "e\($0 * 2)", serverVersion: 9, fields: ["n": 9]) },
                cursor: "c1")
            try await store.update(type: "te", id: "e1", changes: ["pending": true])
            let tables = try store.derivedTables()
            let last = try store.log.lastOffset()
            let commits = store.log.environment.info().lastTransactionID
            let report = try await store.compact(
                below: last, dryRun: false, stepOffsetsMin: stepped ? 10 : .max, stepChangesMax: stepped ? 20 : .max)
            let made = store.log.environment.info().lastTransactionID - commits
            // Stepped: the transaction that planned it whole, then four steps.
            #expect(stepped ? made == 5 : made == 1, "stepped \(stepped): \(made) commits")
            // All but the idempotency rows of the intents removed.
            let after = try store.derivedTables()
            #expect(
                after.entities == tables.entities && after.counts == tables.counts && after.outboxKeys == tables.outboxKeys
                    && after.cursor == tables.cursor && after.conflicts == tables.conflicts)
            #expect(try await store.projectionProblems().isEmpty)
            let again = try await store.compact(below: last, dryRun: false, stepOffsetsMin: 10, stepChangesMax: 20)
            #expect(again.entriesRemoved == 0 && again.snapshotsWritten == 0, "\(again)")
            reports.append(report)
            logs.append(try scanAll(store.log))
        }
        defer { for store in stores { store.close() } }
        #expect(reports[0].entriesRemoved > 200 && reports[0].snapshotsWritten == 60, "\(reports[0])")
        #expect(reports[1] == reports[0])
        #expect(logs[1].map(\.offset) == logs[0].map(\.offset))
    }

    @Test func compactionFoldsHistoryAndKeepsTheTables() async throws {
        var fixture = try await storeWithHistory("compact-history")
        let store = fixture.store
        let before = try store.derivedTables()
        let last = try store.log.lastOffset()
        let pending = try store.outbox().map(\.offset)
        let report = try await store.compact(below: last)
        #expect(report.entriesRemoved == 7)
        // a (v2) and the tombstone of b (v5).
        #expect(report.snapshotsWritten == 2)
        #expect(try store.derivedTables().entities == before.entities)
        let entries = try scanAll(store.log)
        #expect(entries.count == 3)
        #expect(entries.last?.offset == last)
        #expect(try store.outbox().map(\.offset) == pending)
        let tombstone = entries.compactMap { entry -> Snapshot? in
            guard case .snapshot(let snapshot) = entry.body, snapshot.entityID == "b" else { return nil }
            return snapshot
        }.first
        #expect(tombstone?.deleted == true && tombstone?.serverVersion == 5 && tombstone?.cursor == "c2")
        #expect(try store.compactedBelow() == last)

        // Replay of the compacted log gives the same tables, also after a reopen.
        try await store.rebuildProjections()
        #expect(try store.derivedTables().entities == before.entities)
        try fixture.reopen()
        #expect(try fixture.store.get(type: "te", id: "a")?.fields == ["n": 2, "pending": true])
        #expect(try fixture.store.pullCursor() == "c2")
        // The tombstone still stops an older server change after compaction.
        try await fixture.store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "b", serverVersion: 4, fields: ["n": 9])], cursor: "c3")
        #expect(try fixture.store.get(type: "te", id: "b") == nil)
        // New appends continue after the last offset.
        try await fixture.store.create(type: "te", id: "d", fields: [:])
        #expect(try fixture.store.log.lastOffset() == last + 2)
    }

    /// storage.md section 4, Compaction, step 5: `compacted-below` becomes
    /// the greater of its value and the watermark. A later compaction below
    /// a lower watermark leaves it where it was: lowered, it would make the
    /// holes the first one left above the new value a gap, and the log
    /// would no longer read back.
    @Test func aCompactionBelowALowerWatermarkKeepsTheHigherBound() async throws {
        var fixture = try await storeWithHistory("compact-lower-watermark")
        let store = fixture.store
        let last = try store.log.lastOffset()
        _ = try await store.compact(below: last)
        let offsets = try scanAll(store.log).map(\.offset)
        // Each snapshot in place of the last removed entry that set its
        // entity's state: the ack of a's update, the delete of b.
        #expect(offsets == [5, 7, last])
        let tables = try store.derivedTables()
        // Holes now, below a watermark of 2 and above it: 1 to 4, and 6.
        let report = try await store.compact(below: 2)
        #expect(report.entriesBefore == 0 && report.entriesRemoved == 0 && report.snapshotsWritten == 0)
        #expect(try store.compactedBelow() == last)
        #expect(try scanAll(store.log).map(\.offset) == offsets)
        try await store.rebuildProjections()
        #expect(try store.derivedTables().entities == tables.entities)
        try fixture.reopen()
        #expect(try fixture.store.compactedBelow() == last)
        #expect(try scanAll(fixture.store.log).map(\.offset) == offsets)
    }

    @Test func anIntentSettledAboveTheWatermarkStays() async throws {
        let fixture = try StoreFixture("compact-settled-above")
        let store = fixture.store
        try await store.create(type: "te", id: "a", fields: [:])
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "z", serverVersion: 1)], cursor: "c")
        try await store.record([(1, .acknowledged(.applied, serverVersion: 1))])
        // Watermark 3: the intent (1) is below, its ack (3) is not.
        let report = try await store.compact(below: 3)
        #expect(report.entriesRemoved == 1)
        #expect(try store.log.entry(at: 1)?.kind == .intent)
        try await store.rebuildProjections()
        #expect(try store.get(type: "te", id: "a")?.serverVersion == 1)
    }

    @Test func aTombstoneCarriesTheCursorThroughCompaction() async throws {
        let fixture = try StoreFixture("compact-cursor")
        let store = fixture.store
        try await store.applyPulledPage([PulledChange(.delete, entityType: "te", entityID: "x", serverVersion: 1)], cursor: "c9")
        try await store.resync(reason: "test")
        try await store.applyPulledPage([PulledChange(.delete, entityType: "te", entityID: "y", serverVersion: 1)], cursor: "c10")
        try await store.create(type: "te", id: "a", fields: [:])
        let report = try await store.compact(below: 4)
        #expect(report.snapshotsWritten == 1)
        try await store.rebuildProjections()
        #expect(try store.pullCursor() == "c10")
    }

    @Test func dryRunsChangeNothingAndBadWatermarksAreRefused() async throws {
        let fixture = try await storeWithHistory("compact-dry")
        let store = fixture.store
        let entries = try scanAll(store.log)
        let last = try store.log.lastOffset()
        let report = try await store.compact(below: last, dryRun: true)
        #expect(report.dryRun && report.entriesRemoved == 7)
        #expect(try scanAll(store.log) == entries)
        for watermark in [0, last + 1] {
            let error = await #expect(throws: LogStoreError.self) { try await store.compact(below: watermark) }
            #expect(error?.code == .invalidArgument)
        }
    }

    @Test func aGapAboveTheWatermarkIsStillAGap() async throws {
        let fixture = try await storeWithHistory("compact-gap")
        let store = fixture.store
        _ = try await store.compact(below: 4)
        // Remove an entry above the watermark behind the store's back.
        _ = try store.log.environment.write { txn in try txn.delete(store.log.logDatabase, key: OffsetKey.encode(6)) }
        let error = #expect(throws: LogStoreError.self) { try scanAll(store.log) }
        #expect(error?.code == .gap && error?.offset == 6)
    }

    /// A log that lost an entry below the watermark has a gap, which a scan
    /// reports. Compaction reports it too, and changes nothing: raising
    /// `compacted-below` over it made the gap a legal hole, the log read
    /// clean, and the outbox named a pending intent no longer in it.
    @Test func compactionOfALogWithAGapIsRefused() async throws {
        let fixture = try StoreFixture("compact-lost-entry")
        let store = fixture.store
        try await store.create(type: "te", id: "a", fields: ["n": 1])  // 1
        try await store.create(type: "te", id: "b", fields: ["n": 2])  // 2, pending
        try await store.record([(1, .acknowledged(.applied, serverVersion: 1))])  // 3
        try await store.create(type: "te", id: "c", fields: ["n": 3])  // 4
        _ = try store.log.environment.write { txn in try txn.delete(store.log.logDatabase, key: OffsetKey.encode(2)) }
        for watermark: UInt64 in [2, 3, 4] {
            let error = await #expect(throws: LogStoreError.self, "below \(watermark)") { try await store.compact(below: watermark) }
            #expect(error?.code == .gap, "below \(watermark): \(String(describing: error))")
        }
        #expect(try store.compactedBelow() == 0)
        #expect(throws: LogStoreError.self) { try scanAll(store.log) }
    }

    /// storage.md section 4, Compaction ("Nothing else changes"), and
    /// section 15, Replay: a compaction starts a rebuild again only when
    /// one is under way. With none, it leaves none behind (the next open
    /// would replay the whole log into the other set).
    @Test func aCompactionStartsNoRebuildWhenNoneIsUnderWay() async throws {
        let fixture = try await storeWithHistory("compact-no-rebuild")
        let store = fixture.store
        let inUse = try store.derivedDatabaseNamesInUse()
        _ = try await store.compact(below: try store.log.lastOffset())
        #expect(try store.rebuildWatermark() == nil)
        #expect(try store.derivedDatabaseNamesInUse() == inUse)
    }

    /// storage.md section 4, Compaction, step 2: for an entity with a
    /// pending intent, its answered intents stay for the acked version
    /// only when answered after the last resync below the watermark (which
    /// set the acked version to 0). One answered before it goes, with its
    /// answer, and so does the resync.
    @Test func answersBeforeTheLastResyncAreNotKeptForTheAckedVersion() async throws {
        let fixture = try StoreFixture("compact-answer-before-resync")
        let store = fixture.store
        try await store.create(type: "te", id: "a", fields: ["n": 1])  // 1
        try await store.update(type: "te", id: "a", changes: ["n": 2])  // 2, stays pending
        try await store.record([(1, .acknowledged(.applied, serverVersion: 1))])  // 3
        try await store.resync(reason: "test")  // 4
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1)], cursor: "c1")  // 5
        try await store.create(type: "te", id: "b", fields: [:])  // 6
        let before = try store.derivedTables()
        let report = try await store.compact(below: 6)
        #expect(report.entriesRemoved == 4 && report.entriesKept == 1 && report.snapshotsWritten == 1)
        #expect(try scanAll(store.log).map(\.offset) == [2, 5, 6])
        try await store.rebuildProjections()
        #expect(try store.derivedTables().entities == before.entities)
    }

    /// Nor is the answer that emptied the entity's pending set kept, with
    /// its intent, for an intent written after it: "since the pending set
    /// was last empty" starts after that answer, whose acked version the
    /// snapshot holds. Kept, compaction would leave in the log, for good,
    /// entries that it exists to fold away.
    @Test func theAnswerThatEmptiedThePendingSetIsNotKept() async throws {
        let fixture = try StoreFixture("compact-answer-emptied-pending")
        let store = fixture.store
        defer { store.close() }
        try await store.create(type: "te", id: "a", fields: ["n": 1])  // 1
        try await store.record([(1, .acknowledged(.applied, serverVersion: 1))])  // 2: nothing pending for a
        try await store.update(type: "te", id: "a", changes: ["n": 2])  // 3, stays pending
        try await store.create(type: "te", id: "b", fields: [:])  // 4
        let before = try store.derivedTables()
        let report = try await store.compact(below: 4)
        #expect(report.entriesRemoved == 2 && report.entriesKept == 1 && report.snapshotsWritten == 1)
        #expect(try scanAll(store.log).map(\.offset) == [2, 3, 4])
        try await store.rebuildProjections()
        #expect(try store.derivedTables().entities == before.entities)
        #expect(try store.outbox().map(\.offset) == [3, 4])
    }

    /// storage.md section 4, Compaction, step 2: the last resync below the
    /// watermark stays only when a kept answer is an ack before it. A
    /// pending intent before it is no reason: the resync goes, like every
    /// other, and the snapshot of y takes the place of its pulled change.
    @Test func aResyncAfterAPendingIntentIsRemoved() async throws {
        let fixture = try StoreFixture("compact-resync-after-pending")
        let store = fixture.store
        try await store.create(type: "te", id: "a", fields: ["n": 1])  // 1, pending
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1)], cursor: "c1")  // 2
        try await store.resync(reason: "test")  // 3
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "y", serverVersion: 1)], cursor: "c2")  // 4
        try await store.create(type: "te", id: "b", fields: [:])  // 5
        let before = try store.derivedTables()
        let report = try await store.compact(below: 5)
        #expect(report.entriesRemoved == 3 && report.entriesKept == 1 && report.snapshotsWritten == 1)
        #expect(try scanAll(store.log).map(\.offset) == [1, 4, 5])
        try await store.rebuildProjections()
        #expect(try store.derivedTables().entities == before.entities)
        #expect(try store.pullCursor() == "c2")
    }

    /// A resync forgets the pull cursor, and the snapshots fold nothing
    /// from before it: with no pulled change after the resync, compaction
    /// writes no cursor, and a replay of the compacted log has none, as
    /// the store has none. A cursor from before the resync written into a
    /// snapshot would bring it back on the next rebuild, and the next pull
    /// would skip what the server has.
    @Test func aCursorFromBeforeTheLastResyncIsNotFoldedIn() async throws {
        let fixture = try StoreFixture("compact-cursor-before-resync")
        let store = fixture.store
        defer { store.close() }
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1)], cursor: "c1")  // 1
        try await store.resync(reason: "test")  // 2
        try await store.create(type: "te", id: "a", fields: [:])  // 3
        #expect(try store.pullCursor() == nil)
        let report = try await store.compact(below: 3)
        #expect(report.entriesRemoved == 2 && report.snapshotsWritten == 0)
        #expect(try await store.projectionProblems() == [])
        try await store.rebuildProjections()
        #expect(try store.pullCursor() == nil)
    }

    /// Nor does an entity's confirmed state from before the last resync
    /// outlast it in a snapshot: after a resync the server may give an
    /// entity again at a lower version (it was restored from a backup),
    /// and that is the state the snapshot holds, not the higher one the
    /// resync forgot.
    @Test func aSnapshotHoldsTheStatePulledAfterTheLastResync() async throws {
        let fixture = try StoreFixture("compact-state-before-resync")
        let store = fixture.store
        defer { store.close() }
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 5, fields: ["n": 5])], cursor: "c1")  // 1
        try await store.resync(reason: "restored")  // 2
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1, fields: ["n": 1])], cursor: "c2")  // 3
        try await store.create(type: "te", id: "a", fields: [:])  // 4
        #expect(try store.get(type: "te", id: "x")?.fields == ["n": 1])
        let report = try await store.compact(below: 4)
        #expect(report.entriesRemoved == 3 && report.snapshotsWritten == 1)
        #expect(try await store.projectionProblems() == [])
        try await store.rebuildProjections()
        #expect(try store.get(type: "te", id: "x")?.fields == ["n": 1])
        #expect(try store.pullCursor() == "c2")
    }

    /// Only entities whose state a removed entry set since the last resync
    /// get a snapshot. One pulled before the resync, whose state since
    /// comes from kept entries alone (an ack kept for the base of a pending
    /// intent), gets none: the kept entries replay it.
    @Test func anEntityPulledBeforeTheLastResyncGetsNoSnapshot() async throws {
        let fixture = try StoreFixture("compact-folded-before-resync")
        let store = fixture.store
        defer { store.close() }
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1, fields: ["n": 1])], cursor: "c1")  // 1
        try await store.resync(reason: "test")  // 2
        _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: "k3", entityType: "te", entityID: "x", fields: ["n": 3])))  // 3
        _ = try await store.log.append(.intent(Intent(.update, idempotencyKey: "k4", entityType: "te", entityID: "x", fields: ["n": 4])))  // 4, pending
        _ = try await store.log.append(.ack(Ack(intentOffset: 3, outcome: .applied, serverVersion: 2)))  // 5
        try await store.create(type: "te", id: "z", fields: [:])  // 6: projects 3-5 first
        let before = try store.derivedTables()
        let report = try await store.compact(below: 6)
        #expect(report.entriesRemoved == 2 && report.entriesKept == 3 && report.snapshotsWritten == 0)
        #expect(try scanAll(store.log).map(\.offset) == [3, 4, 5, 6])
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == before)
    }

    /// An ack of an update over no base (a resync forgot it) confirms no
    /// state: the entity has no confirmed version, and compaction writes
    /// no snapshot of it, at version 0 or any other.
    @Test func anAckOfAnUpdateAfterAResyncGivesNoSnapshot() async throws {
        let fixture = try StoreFixture("compact-ack-no-base")
        let store = fixture.store
        defer { store.close() }
        try await store.create(type: "te", id: "x", fields: ["n": 1])  // 1
        try await store.record([(1, .acknowledged(.applied, serverVersion: 1))])  // 2
        try await store.update(type: "te", id: "x", changes: ["n": 2])  // 3
        try await store.resync(reason: "test")  // 4
        try await store.record([(3, .acknowledged(.applied, serverVersion: 2))])  // 5
        try await store.create(type: "te", id: "z", fields: [:])  // 6
        let before = try store.derivedTables()
        let report = try await store.compact(below: 6)
        #expect(report.entriesRemoved == 5 && report.snapshotsWritten == 0)
        try await store.rebuildProjections()
        #expect(try store.derivedTables().entities == before.entities)
    }

    /// storage.md section 4, Compaction, steps 2 to 4: a snapshot that still
    /// holds its entity's confirmed state stays where it is, so compacting
    /// again writes snapshots only for the entities that changed since. Each
    /// new one takes the place of the pulled change that changed its
    /// entity, and carries the new cursor.
    @Test func aSecondCompactionWritesSnapshotsOnlyForWhatChanged() async throws {
        let fixture = try StoreFixture("compact-again")
        let store = fixture.store
        try await store.applyPulledPage(
            (0..<10).map {
                PulledChange(.upsert, entityType: "te", entityID: "e\($0)", serverVersion: 1, fields: ["n": .int(Int64($0))])
            }, cursor: "c1")  // 1 to 10
        try await store.create(type: "te", id: "a", fields: [:])  // 11, stays pending
        #expect(try await store.compact(below: 11).snapshotsWritten == 10)
        let firstSnapshots = try scanAll(store.log).filter { $0.kind == .snapshot }
        #expect(firstSnapshots.map(\.offset) == Array(1...10))
        try await store.applyPulledPage([
            PulledChange(.upsert, entityType: "te", entityID: "e3", serverVersion: 2, fields: ["n": 33]),
            PulledChange(.delete, entityType: "te", entityID: "e7", serverVersion: 2),
        ], cursor: "c2")  // 12, 13
        try await store.create(type: "te", id: "b", fields: [:])  // 14
        let before = try store.derivedTables()
        let report = try await store.compact(below: 14)
        // The snapshots of e3 and e7 that no longer hold, and the two changes.
        #expect(report.entriesRemoved == 4 && report.snapshotsWritten == 2 && report.entriesKept == 9)
        let entries = try scanAll(store.log)
        #expect(entries.map(\.offset) == [1, 2, 3, 5, 6, 7, 9, 10, 11, 12, 13, 14])
        // Eight snapshots are as the first compaction wrote them.
        for snapshot in firstSnapshots where ![4, 8].contains(snapshot.offset) {
            #expect(entries.contains(snapshot), "\(snapshot)")
        }
        let written = entries.compactMap { entry -> Snapshot? in
            guard entry.offset >= 12, case .snapshot(let snapshot) = entry.body else { return nil }
            return snapshot
        }
        #expect(written.map(\.entityID) == ["e3", "e7"])
        #expect(written.allSatisfy { $0.cursor == "c2" && $0.watermark == 14 && $0.serverVersion == 2 })
        #expect(written.map(\.deleted) == [false, true])
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == before)
        #expect(try store.pullCursor() == "c2")
        // Nothing changed since: compacting again writes nothing.
        let again = try await store.compact(below: 14)
        #expect(again.entriesRemoved == 0 && again.snapshotsWritten == 0)
        #expect(try scanAll(store.log) == entries)
    }

    /// storage.md section 4, Compaction, step 3: an entity gets a snapshot
    /// only when an entry that goes changed its base. Here its base comes
    /// from a kept answer, and the pulled change that goes is stale: it
    /// changed nothing, so only its cursor needs a snapshot.
    @Test func aStalePulledChangeThatGoesGivesItsEntityNoSnapshot() async throws {
        let fixture = try StoreFixture("compact-stale-pull")
        let store = fixture.store
        try await store.create(type: "te", id: "y", fields: ["n": 1])  // 1
        try await store.update(type: "te", id: "y", changes: ["n": 2])  // 2, stays pending
        try await store.record([(1, .acknowledged(.applied, serverVersion: 2))])  // 3, kept with 1
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "y", serverVersion: 1, fields: ["n": 0])], cursor: "c1")  // 4
        try await store.create(type: "te", id: "z", fields: [:])  // 5
        let before = try store.derivedTables()
        let report = try await store.compact(below: 5)
        #expect(report.entriesRemoved == 1 && report.snapshotsWritten == 1)
        guard case .snapshot(let snapshot)? = try store.log.entry(at: 4)?.body else {
            Issue.record("no snapshot at offset 4")
            return
        }
        #expect(snapshot.entityType.isEmpty && snapshot.cursor == "c1")
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == before)
        #expect(try store.get(type: "te", id: "y")?.serverVersion == 2)
    }
}

@Suite struct CrashShapedTests {
    struct Crash: Error {}

    /// A write that fails after it appended and projected leaves nothing:
    /// no entry, no projection, no outbox row, and the next append takes
    /// the offset the failed one would have had.
    @Test func aFailedWriteLeavesNoTrace() async throws {
        var fixture = try StoreFixture("crash-midway")
        let store = fixture.store
        try await store.create(type: "te", id: "kept", fields: [:])
        let before = try store.derivedTables()
        await #expect(throws: Crash.self) {
            try await store.write { txn, context, store in
                try store.append(.intent(Intent(.create, idempotencyKey: "k", entityType: "te", entityID: "lost", fields: [:])), txn, &context)
                try store.append(.intent(Intent(.update, idempotencyKey: "k2", entityType: "te", entityID: "kept", fields: ["x": 1])), txn, &context)
                throw Crash()
            }
        }
        #expect(try store.get(type: "te", id: "lost") == nil)
        #expect(try store.get(type: "te", id: "kept")?.fields == [:])
        #expect(try store.derivedTables() == before)
        #expect(try store.log.lastOffset() == 1)
        try await store.create(type: "te", id: "next", fields: [:])
        #expect(try store.log.lastOffset() == 2)
        try fixture.reopen()
        #expect(try scanAll(fixture.store.log).map(\.offset) == [1, 2])
    }
}

@Suite struct RawAppendTests {
    /// Entries appended to a store's log directly are projected before the
    /// next store write, never skipped.
    @Test func rawAppendsAreProjected() async throws {
        var fixture = try StoreFixture("raw-append")
        let store = fixture.store
        _ = try await store.log.append(.remote(Remote(cursor: "c1", .upsert, entityType: "te", entityID: "r", serverVersion: 1, fields: ["n": 1])))
        try await store.create(type: "te", id: "s", fields: [:])
        #expect(try store.get(type: "te", id: "r")?.fields == ["n": 1])
        let incremental = try store.derivedTables()
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == incremental)
        // Appended with no store write after it: the next open catches up.
        _ = try await store.log.append(.remote(Remote(cursor: "c2", .upsert, entityType: "te", entityID: "q", serverVersion: 1)))
        try fixture.reopen()
        #expect(try fixture.store.get(type: "te", id: "q") != nil)
    }

    /// Replay appends keys past the end of a table and looks up no record
    /// there; keys that do not arrive in order (idempotency keys from a
    /// clock that stepped back, a repeated key, entity types that sort
    /// before the last one written) must still be put in place, and
    /// records before the end loaded, as the incremental path does.
    @Test func keysOutOfOrderReplayAsTheyWereWritten() async throws {
        let fixture = try StoreFixture("raw-append-order")
        let store = fixture.store
        func intent(_ operation: Intent.Operation, _ key: String, _ type: String, _ id: String, _ fields: Fields = [:])
            -> EntryBody
        {
            .intent(Intent(operation, idempotencyKey: key, entityType: type, entityID: id, fields: fields))
        }
        let bodies: [EntryBody] = [
            intent(.create, "k5", "b", "x", ["n": 1]),  // 1
            intent(.create, "k3", "a", "y", ["n": 2]),  // 2: type a sorts before b
            intent(.update, "k9", "b", "x", ["n": 3]),  // 3
            intent(.create, "k3", "b", "w", ["n": 4]),  // 4: k3 again
            intent(.update, "a1", "a", "y", ["m": 5]),  // 5
            .ack(Ack(intentOffset: 1, outcome: .applied, serverVersion: 1)),  // 6
            intent(.delete, "k9", "b", "w"),  // 7: k9 again
        ]
        for body in bodies { _ = try await store.log.append(body) }
        try await store.create(type: "c", id: "z", fields: [:])  // 8: projects 1-7 first
        let incremental = try store.derivedTables()
        for chunk in [1, 2, 3, 100] {
            try await store.rebuildProjections(entriesPerTransaction: chunk)
            #expect(try store.derivedTables() == incremental, "chunks of \(chunk)")
        }
        #expect(try store.get(type: "b", id: "x")?.fields == ["n": 3])
        #expect(try store.get(type: "a", id: "y")?.fields == ["n": 2, "m": 5])
        #expect(try store.get(type: "b", id: "w") == nil)
        #expect(try store.intentOffset(idempotencyKey: "k3") == 4)
        #expect(try store.intentOffset(idempotencyKey: "k9") == 7)
        #expect(try store.intentOffset(idempotencyKey: "a1") == 5)
        #expect(try store.intentOffset(idempotencyKey: "k5") == 1)
    }

    /// Two intents with one idempotency key (a raw append can repeat one):
    /// compaction removes the later, acknowledged one, whose offset the
    /// key's row holds, and keeps the earlier, pending one. The row then
    /// names the kept intent, as a replay of the compacted log writes it;
    /// deleting it left tables no replay would make.
    @Test func aRowOfARepeatedKeyNamesTheKeptIntentAfterCompaction() async throws {
        let fixture = try StoreFixture("compact-repeated-key")
        let store = fixture.store
        _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: "k", entityType: "a", entityID: "x", fields: ["n": 1])))  // 1, pending
        _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: "k", entityType: "b", entityID: "y", fields: ["n": 2])))  // 2
        _ = try await store.log.append(.ack(Ack(intentOffset: 2, outcome: .applied, serverVersion: 1)))  // 3
        try await store.create(type: "c", id: "z", fields: [:])  // 4: projects 1-3 first
        #expect(try store.intentOffset(idempotencyKey: "k") == 2)
        let report = try await store.compact(below: 4)
        #expect(report.entriesKept == 1)
        #expect(try store.intentOffset(idempotencyKey: "k") == 1)
        let compacted = try store.derivedTables()
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == compacted)
        #expect(try await store.projectionProblems().isEmpty)
    }

    /// With two kept intents of that key before the removed one, the row
    /// names the later of the two: a replay of the compacted log writes
    /// each intent's offset over the one before it, so the last kept wins.
    @Test func aRowOfARepeatedKeyNamesTheLastKeptIntent() async throws {
        let fixture = try StoreFixture("compact-repeated-key-last")
        let store = fixture.store
        defer { store.close() }
        for (type, n) in [("a", 1), ("b", 2), ("c", 3)] {  // 1 and 2 pending, 3 acked
            _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: "k", entityType: type, entityID: "x", fields: ["n": .int(Int64(n))])))
        }
        _ = try await store.log.append(.ack(Ack(intentOffset: 3, outcome: .applied, serverVersion: 1)))  // 4
        try await store.create(type: "d", id: "z", fields: [:])  // 5: projects 1-4 first
        #expect(try store.intentOffset(idempotencyKey: "k") == 3)
        let report = try await store.compact(below: 5)
        #expect(report.entriesKept == 2)
        #expect(try store.intentOffset(idempotencyKey: "k") == 2)
        #expect(try await store.projectionProblems().isEmpty)
    }

    /// storage.md section 4, Compaction, step 2: a removed intent's
    /// idempotency row is deleted only if it still holds that intent's
    /// offset. With a repeated key whose later intent is at or above the
    /// watermark, the row names that later intent, and stays.
    @Test func aRowNamingALaterIntentWithTheSameKeyStays() async throws {
        let fixture = try StoreFixture("compact-repeated-key-above")
        let store = fixture.store
        _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: "k", entityType: "a", entityID: "x", fields: [:])))  // 1
        _ = try await store.log.append(.ack(Ack(intentOffset: 1, outcome: .applied, serverVersion: 1)))  // 2
        _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: "k", entityType: "b", entityID: "y", fields: [:])))  // 3, pending
        try await store.create(type: "c", id: "z", fields: [:])  // 4: projects 1-3 first
        #expect(try store.intentOffset(idempotencyKey: "k") == 3)
        let report = try await store.compact(below: 3)
        #expect(report.entriesRemoved == 2)
        #expect(try store.intentOffset(idempotencyKey: "k") == 3)
        let compacted = try store.derivedTables()
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == compacted)
    }

    /// A removed intent whose key's row names a later intent is passed
    /// over, and the removed intents after it are still seen to: the row
    /// of each that holds its offset is deleted. Stopped at the first row
    /// that stays, compaction left rows no replay of the compacted log
    /// makes, and a key whose intent is gone still named it.
    @Test func theRowsOfRemovedIntentsAfterOneWhoseRowStaysAreDeleted() async throws {
        let fixture = try StoreFixture("compact-repeated-key-then-another")
        defer { fixture.directory.remove() }
        let store = fixture.store
        defer { store.close() }
        _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: "k", entityType: "a", entityID: "x", fields: [:])))  // 1
        _ = try await store.log.append(.ack(Ack(intentOffset: 1, outcome: .applied, serverVersion: 1)))  // 2
        _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: "j", entityType: "b", entityID: "y", fields: [:])))  // 3
        _ = try await store.log.append(.ack(Ack(intentOffset: 3, outcome: .applied, serverVersion: 1)))  // 4
        _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: "k", entityType: "c", entityID: "z", fields: [:])))  // 5, pending
        try await store.create(type: "d", id: "w", fields: [:])  // 6: projects 1-5 first
        #expect(try store.intentOffset(idempotencyKey: "j") == 3)
        let report = try await store.compact(below: 5)
        #expect(report.entriesRemoved == 4)
        #expect(try store.intentOffset(idempotencyKey: "k") == 5)
        #expect(try store.intentOffset(idempotencyKey: "j") == nil)
        #expect(try await store.projectionProblems().isEmpty)
    }

    /// storage.md section 4, Compaction, step 1 (and section 15): only an
    /// intent's first answer settles it. A second ack, or an ack after a
    /// reject, changes nothing in the projections, so the fold must not
    /// apply it either: its snapshot would give the entity a base no replay
    /// of the log before compaction gives.
    @Test func onlyTheFirstAnswerOfAnIntentFoldsIntoTheSnapshots() async throws {
        let fixture = try StoreFixture("compact-second-answer")
        let store = fixture.store
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "b", serverVersion: 1, fields: ["n": 1])], cursor: "c1")  // 1
        try await store.create(type: "te", id: "a", fields: ["n": 1])  // 2
        try await store.update(type: "te", id: "b", changes: ["n": 2])  // 3
        try await store.record([(2, .acknowledged(.applied, serverVersion: 1))])  // 4
        try await store.record([(3, .rejected(code: "VALIDATION_ERROR", message: "no"))])  // 5
        _ = try await store.log.append(.ack(Ack(intentOffset: 2, outcome: .applied, serverVersion: 5)))  // 6: a second answer
        _ = try await store.log.append(.ack(Ack(intentOffset: 3, outcome: .applied, serverVersion: 6)))  // 7: an ack after the reject
        try await store.create(type: "te", id: "z", fields: [:])  // 8: projects 6 and 7 first
        let before = try store.derivedTables()
        #expect(try store.get(type: "te", id: "a")?.serverVersion == 1)
        #expect(try store.get(type: "te", id: "b")?.fields == ["n": 1])
        let report = try await store.compact(below: 8)
        #expect(report.entriesRemoved == 7 && report.snapshotsWritten == 2)
        try await store.rebuildProjections()
        #expect(try store.derivedTables().entities == before.entities)
        #expect(try store.get(type: "te", id: "a")?.serverVersion == 1)
        let b = try store.get(type: "te", id: "b")
        #expect(b?.serverVersion == 1 && b?.fields == ["n": 1])
    }

    /// An intent kept for its entity's acknowledged version (a later one
    /// is pending) keeps its first answer, the one the projections took,
    /// and a second answer goes. Kept with the second instead, a replay
    /// of the compacted log gives the pending intent another base.
    @Test func aKeptIntentKeepsItsFirstAnswer() async throws {
        let fixture = try StoreFixture("compact-kept-first-answer")
        let store = fixture.store
        defer { store.close() }
        try await store.create(type: "te", id: "a", fields: ["n": 1])  // 1
        try await store.update(type: "te", id: "a", changes: ["n": 2])  // 2, pending
        try await store.record([(1, .acknowledged(.applied, serverVersion: 1))])  // 3
        _ = try await store.log.append(.ack(Ack(intentOffset: 1, outcome: .applied, serverVersion: 5)))  // 4: a second answer
        try await store.create(type: "te", id: "z", fields: [:])  // 5: projects 4 first
        let before = try store.derivedTables()
        let report = try await store.compact(below: 5)
        #expect(report.entriesRemoved == 1 && report.entriesKept == 3)
        #expect(try scanAll(store.log).map(\.offset) == [1, 2, 3, 5])
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == before)
    }

    /// Two idempotency keys that are canonically equivalent Unicode but
    /// different bytes (U+00E9, and U+0065 U+0301) are two keys, as the
    /// idempotency table keys them by bytes. Compaction removed the
    /// acknowledged intent of one and, its kept keys keyed by `String`,
    /// pointed that key's row at the kept intent of the other: a row no
    /// replay of the compacted log writes.
    @Test func canonicallyEquivalentKeysStayApartThroughCompaction() async throws {
        let fixture = try StoreFixture("compact-equivalent-keys")
        let store = fixture.store
        let (precomposed, decomposed) = ("caf\u{E9}", "cafe\u{301}")
        #expect(precomposed == decomposed && !precomposed.utf8.elementsEqual(decomposed.utf8))
        _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: precomposed, entityType: "a", entityID: "x", fields: [:])))  // 1, pending
        _ = try await store.log.append(.intent(Intent(.create, idempotencyKey: decomposed, entityType: "b", entityID: "y", fields: [:])))  // 2
        _ = try await store.log.append(.ack(Ack(intentOffset: 2, outcome: .applied, serverVersion: 1)))  // 3
        try await store.create(type: "c", id: "z", fields: [:])  // 4: projects 1-3 first
        #expect(try store.intentOffset(idempotencyKey: precomposed) == 1)
        #expect(try store.intentOffset(idempotencyKey: decomposed) == 2)
        let report = try await store.compact(below: 4)
        #expect(report.entriesRemoved == 2)
        #expect(try store.intentOffset(idempotencyKey: precomposed) == 1)
        #expect(try store.intentOffset(idempotencyKey: decomposed) == nil)
        let compacted = try store.derivedTables()
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == compacted)
    }

    /// Entries appended to the log directly are projected before a
    /// compaction folds them away, as before any store write: otherwise the
    /// outbox keeps a row for an intent the compaction removed.
    @Test func compactionProjectsRawAppendsFirst() async throws {
        let fixture = try StoreFixture("raw-append-compact")
        let store = fixture.store
        try await store.create(type: "te", id: "a", fields: ["n": 1])  // 1
        _ = try await store.log.append(.ack(Ack(intentOffset: 1, outcome: .applied, serverVersion: 1)))  // 2
        _ = try await store.log.append(.remote(Remote(cursor: "c1", .upsert, entityType: "te", entityID: "b", serverVersion: 1)))  // 3
        _ = try await store.compact(below: 3)
        #expect(try store.outbox().isEmpty)
        #expect(try store.get(type: "te", id: "a")?.serverVersion == 1)
        let incremental = try store.derivedTables()
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == incremental)
    }

    /// Among them, cursors a pull could not send back (empty, a byte
    /// outside `!` to `~`, over `Wire.cursorBytesMax`): `pullCursor` reads
    /// them as damage. A snapshot's empty cursor is none, and allowed.
    @Test func appendsTheProjectionsCouldNotApplyAreRefused() async throws {
        let fixture = try StoreFixture("raw-invalid")
        let log = fixture.store.log
        let bad: [EntryBody] = [
            .intent(Intent(.create, idempotencyKey: "", entityType: "te", entityID: "a")),
            .intent(Intent(.create, idempotencyKey: "k", entityType: "", entityID: "a")),
            .intent(Intent(.create, idempotencyKey: "k", entityType: "te", entityID: "")),
            .intent(Intent(.create, idempotencyKey: "k", entityType: "te", entityID: "a", fields: ["x": .double(.infinity)])),
            .remote(Remote(cursor: "c", .upsert, entityType: "te", entityID: "a", serverVersion: 0)),
            .remote(Remote(cursor: "", .upsert, entityType: "te", entityID: "a", serverVersion: 1)),
            .remote(Remote(cursor: "c 1", .upsert, entityType: "te", entityID: "a", serverVersion: 1)),
            .remote(Remote(cursor: String(repeating: "c", count: Wire.cursorBytesMax + 1), .upsert, entityType: "te", entityID: "a", serverVersion: 1)),
            .snapshot(Snapshot(watermark: 1, cursor: "c\u{7F}", entityType: "", entityID: "", serverVersion: 0, fields: [:])),
            .ack(Ack(intentOffset: 0, outcome: .applied, serverVersion: 1)),
        ]
        for body in bad {
            let error = await #expect(throws: LogStoreError.self, "\(body)") { try await log.append(body) }
            #expect(error?.code == .invalidArgument)
        }
        #expect(try log.lastOffset() == 0)
    }

    /// A log written by other software may hold a snapshot with only a
    /// cursor; replay and compaction keep the cursor.
    @Test func aCursorOnlySnapshotKeepsTheCursor() async throws {
        var fixture = try StoreFixture("cursor-only")
        _ = try await fixture.store.log.append(.snapshot(Snapshot(watermark: 1, cursor: "c7", entityType: "", entityID: "", serverVersion: 0, fields: [:])))
        try await fixture.store.create(type: "te", id: "a", fields: [:])
        #expect(try fixture.store.pullCursor() == "c7")
        let entries = try scanAll(fixture.store.log)
        // It is the last entry to set the cursor below the watermark, so it
        // stays as it is.
        let report = try await fixture.store.compact(below: 2)
        #expect(report.snapshotsWritten == 0 && report.entriesRemoved == 0)
        #expect(try scanAll(fixture.store.log) == entries)
        try fixture.reopen()
        try await fixture.store.rebuildProjections()
        #expect(try fixture.store.pullCursor() == "c7")
    }

    /// A kept snapshot carries the cursor of the compaction that wrote it.
    /// When a later one folds another cursor but no entity's state changed,
    /// a cursor-only snapshot above the kept one carries it: otherwise a
    /// replay would end on the older cursor. The change: a stale pulled
    /// change with a newer cursor; or, in a log written by other software,
    /// a snapshot that confirms nothing (server version 0) and has no cursor.
    @Test(arguments: [
        (EntryBody.remote(Remote(cursor: "c2", .upsert, entityType: "te", entityID: "x", serverVersion: 4, fields: ["n": 4])), "c2"),
        (.snapshot(Snapshot(watermark: 3, cursor: "", entityType: "te", entityID: "y", serverVersion: 0, fields: [:])), ""),
    ])
    func anotherCursorAboveAKeptSnapshotGetsACursorOnlySnapshot(change: EntryBody, cursor: String) async throws {
        let fixture = try StoreFixture("compact-cursor-over-kept")
        let store = fixture.store
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 5, fields: ["n": 5])], cursor: "c1")  // 1
        try await store.create(type: "te", id: "a", fields: [:])  // 2, stays pending
        _ = try await store.compact(below: 2)
        _ = try await store.log.append(change)  // 3
        try await store.create(type: "te", id: "b", fields: [:])  // 4
        #expect(try store.pullCursor() == (cursor.isEmpty ? nil : cursor))
        let before = try store.derivedTables()
        let report = try await store.compact(below: 4)
        #expect(report.entriesRemoved == 1 && report.snapshotsWritten == 1)
        guard case .snapshot(let kept)? = try store.log.entry(at: 1)?.body, case .snapshot(let carrier)? = try store.log.entry(at: 3)?.body
        else {
            Issue.record("no snapshots at offsets 1 and 3")
            return
        }
        #expect(kept.entityID == "x" && kept.cursor == "c1" && kept.watermark == 2)
        #expect(carrier.entityType.isEmpty && carrier.cursor == cursor && carrier.watermark == 4)
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == before)
        #expect(try store.pullCursor() == (cursor.isEmpty ? nil : cursor))
    }
}

/// What a read on a thread of its own saw of the log (handed over with semaphores).
private final class SnapshotRead: @unchecked Sendable {
    var watermark: UInt64 = 0
    var lastOffset: UInt64 = 0
    var entries: [Entry] = []
    var error: (any Error)?
}

private func waitOff(_ semaphore: DispatchSemaphore) async {
    await withCheckedContinuation { continuation in
        DispatchQueue.global().async {
            semaphore.wait()
            continuation.resume()
        }
    }
}

/// An export reads one snapshot: a compaction that commits while it reads
/// (and reuses offsets below its watermark for snapshots) changes nothing it
/// sees, where a scan in chunks goes on in the compacted log.
@Test func aSnapshotReadIsUnchangedByACompactionDuringIt() async throws {
    let fixture = try StoreFixture("snapshot-read")
    let store = fixture.store
    // Pulled changes of ten entities, over three scan chunks: compaction
    // folds them into ten snapshots.
    let count = 3 * EventLog.scanChunkCountMax
    for start in stride(from: 0, to: count, by: 500) {
        try await store.applyPulledPage(
            (start..<min(start + 500, count)).map {
                PulledChange(.upsert, entityType: "te", entityID: "e\($0 % 10)", serverVersion: UInt64($0 + 1), fields: ["n": .int(Int64($0))])
            }, cursor: "c\(start)")
    }
    let before = try scanAll(store.log)
    let last = try store.log.lastOffset()
    let read = SnapshotRead()
    let (firstEntry, compacted, done) = (DispatchSemaphore(value: 0), DispatchSemaphore(value: 0), DispatchSemaphore(value: 0))
    let log = store.log
    Thread {
        do {
            try log.readSnapshot { watermark, lastOffset in
                (read.watermark, read.lastOffset) = (watermark, lastOffset)
            } visit: { entry in
                read.entries.append(entry)
                if read.entries.count == 1 {
                    firstEntry.signal()
                    compacted.wait()
                }
            }
        } catch {
            read.error = error
        }
        done.signal()
    }.start()
    await waitOff(firstEntry)
    // Far below the initial map: the compaction cannot need to grow it,
    // which would wait for the snapshot (and so for itself).
    // The reader goes on whatever happens here, so a failure cannot hang it.
    var report: CompactionReport?
    do {
        report = try await store.compact(below: last)
    } catch {
        Issue.record(error)
    }
    compacted.signal()
    #expect(report?.entriesRemoved == count - 1 && report?.snapshotsWritten == 10)
    await waitOff(done)
    #expect(read.error == nil)
    #expect(read.watermark == 0 && read.lastOffset == last)
    #expect(read.entries == before)
    // A scan now reads the compacted log: the snapshot read did not.
    #expect(try scanAll(store.log).count == 11)
}

/// A snapshot that compaction places after an answer it kept, at the same
/// version, must still win in a replay (found by review of the spec).
@Test func aSnapshotWinsOverAKeptAnswerOfTheSameVersion() async throws {
    let fixture = try StoreFixture("snapshot-after-kept-answer")
    let store = fixture.store
    try await store.create(type: "b", id: "y", fields: ["k": 0])  // 1
    try await store.update(type: "b", id: "y", changes: ["b": 2])  // 2
    try await store.update(type: "b", id: "y", changes: ["c": 3])  // 3, stays pending
    try await store.record([(1, .acknowledged(.applied, serverVersion: 1))])  // 4
    try await store.applyPulledPage([PulledChange(.upsert, entityType: "b", entityID: "y", serverVersion: 2, fields: ["k": 9])], cursor: "c1")  // 5
    try await store.record([(2, .acknowledged(.applied, serverVersion: 3))])  // 6
    try await store.applyPulledPage([PulledChange(.upsert, entityType: "a", entityID: "x", serverVersion: 1, fields: ["n": 1])], cursor: "c2")  // 7
    try await store.applyPulledPage([PulledChange(.upsert, entityType: "a", entityID: "z", serverVersion: 1, fields: ["n": 2])], cursor: "c3")  // 8
    let before = try store.derivedTables()
    _ = try await store.compact(below: 8)
    try await store.rebuildProjections()
    #expect(try store.derivedTables() == before)
    #expect(try store.get(type: "b", id: "y")?.fields == ["k": 9, "b": 2, "c": 3])
}
