import LogFormat
@testable import LogStore
import LogTesting
import Testing

/// Compaction of logs written by other software, in any order the store
/// accepts for appending: intents with repeated idempotency keys, answers
/// naming any earlier offset (an intent, another entry, one already
/// answered), pulled changes with stale versions, snapshots of any version
/// with or without a cursor, cursor-only snapshots, resyncs and conflicts.
/// Whatever the log, compaction changes no table (but for the idempotency
/// rows of removed intents), changes nothing at or above its watermark, and
/// a replay of the compacted log gives the same tables; compacting again
/// at the same watermark changes nothing at all. The same holds of a
/// compaction in steps of rising watermarks.
@Suite struct ForeignLogCompactionTests {
    static let sequenceCount = 400
    static let entities = [("te", "a"), ("te", "b"), ("te", "c"), ("prj", "p")]

    @Test func anyLogCompactsToTheSameTables() async throws {
        let seed = SeededRandom.seed(default: 20_261_127)
        var random = RandomEntries(seed: seed)
        var kinds: [EntryKind: Int] = [:]
        var snapshotsKept = 0
        var keptWhole = 0
        for sequence in 0..<Self.sequenceCount {
            try await run(
                &random, narrow: !sequence.isMultiple(of: 3), falling: sequence % 3 == 1, kinds: &kinds,
                snapshotsKept: &snapshotsKept, keptWhole: &keptWhole, label: "SEED=\(seed) sequence \(sequence)")
        }
        // The logs held every kind, and compactions kept snapshots of
        // earlier ones (so both ways a snapshot can go were taken).
        for kind in EntryKind.allCases { #expect(kinds[kind, default: 0] > Self.sequenceCount, "\(kind): \(kinds[kind, default: 0])") }
        #expect(snapshotsKept > Self.sequenceCount)
        // Some compactions kept an entity whole (section 4, step 2).
        #expect(keptWhole > Self.sequenceCount / 20, "entities kept whole: \(keptWhole)")
    }

    /// `falling`: the log starts with the history of an entity whose
    /// server versions go down (as in
    /// `anAckThatFoundNoBaseStillFindsNoneAfterCompaction`), its versions
    /// drawn at random and other entries between its steps.
    private func run(
        _ random: inout RandomEntries, narrow: Bool, falling: Bool, kinds: inout [EntryKind: Int],
        snapshotsKept: inout Int, keptWhole: inout Int, label: String
    ) async throws {
        let fixture = try StoreFixture("foreign-compaction")
        let store = fixture.store
        defer { store.close() }
        var keys: [String] = []
        var intents: [UInt64] = []
        func append(_ body: EntryBody) async throws -> UInt64 {
            let offset = try await store.log.append(body)
            if body.kind == .intent { intents.append(offset) }
            kinds[body.kind, default: 0] += 1
            return offset
        }
        func appendOthers(_ random: inout RandomEntries) async throws {
            for _ in 0..<random.int(0...2) {
                _ = try await append(Self.body(&random, narrow: narrow, last: try store.log.lastOffset(), intents: intents, keys: &keys))
            }
        }
        if falling {
            let (ackVersion, deleteVersion) = (UInt64(random.int(1...3)), UInt64(random.int(3...5)))
            let create = try await append(.intent(Intent(.create, idempotencyKey: "f1", entityType: "te", entityID: "a", fields: ["n": 1])))
            try await appendOthers(&random)
            _ = try await append(.intent(Intent(.update, idempotencyKey: "f2", entityType: "te", entityID: "a", fields: ["m": 2])))
            try await appendOthers(&random)
            _ = try await append(.ack(Ack(intentOffset: create, outcome: .applied, serverVersion: ackVersion)))
            try await appendOthers(&random)
            _ = try await append(
                random.int(0...1) == 0
                    ? .remote(Remote(cursor: "c1", .delete, entityType: "te", entityID: "a", serverVersion: deleteVersion))
                    : .snapshot(
                        Snapshot(watermark: 1, cursor: "c1", entityType: "te", entityID: "a", serverVersion: deleteVersion, deleted: true, fields: [:])))
            try await appendOthers(&random)
            let update = try await append(.intent(Intent(.update, idempotencyKey: "f3", entityType: "te", entityID: "a", fields: ["o": 3])))
            try await appendOthers(&random)
            _ = try await append(.ack(Ack(intentOffset: update, outcome: .applied, serverVersion: deleteVersion + UInt64(random.int(2...4)))))
            try await appendOthers(&random)
            _ = try await append(
                .remote(
                    Remote(
                        cursor: "c2", .upsert, entityType: "te", entityID: "a", serverVersion: deleteVersion + UInt64(random.int(0...1)),
                        fields: ["n": 9])))
        }
        for round in 0..<4 {
            for _ in 0..<random.int(5...30) {
                _ = try await append(Self.body(&random, narrow: narrow, last: try store.log.lastOffset(), intents: intents, keys: &keys))
            }
            try await store.record([])
            var label = "\(label) round \(round)"
            let watermark = UInt64(random.int(1...Int(try store.log.lastOffset())))
            let before = try store.derivedTables()
            let entriesBefore = try scanAll(store.log)
            // Every other compaction goes in steps of 1 to 8 offsets, each a
            // compaction below its own watermark (`compact(below:)` steps
            // a long log's).
            let steps: UInt64? = round.isMultiple(of: 2) ? nil : UInt64(random.int(1...8))
            let report =
                if let steps { try await store.compact(below: watermark, stepOffsets: steps) } else {
                    try await store.compact(below: watermark)
                }
            if let steps { label += " (in steps of \(steps))" }
            let after = try store.derivedTables()
            #expect(
                after.entities == before.entities && after.counts == before.counts && after.outboxKeys == before.outboxKeys
                    && after.cursor == before.cursor && after.conflicts == before.conflicts,
                "\(label): compaction below \(watermark) changed the tables")
            let entriesAfter = try scanAll(store.log)
            #expect(
                entriesAfter.filter { $0.offset >= watermark } == entriesBefore.filter { $0.offset >= watermark },
                "\(label): compaction below \(watermark) changed entries above it")
            #expect(entriesAfter.count == entriesBefore.count - report.entriesRemoved + report.snapshotsWritten, "\(label)")
            let written = entriesAfter.filter { $0.kind == .snapshot && $0.offset < watermark && !entriesBefore.contains($0) }
            #expect(report.snapshotsWritten == written.count, "\(label): \(report), \(written.count) snapshots new")
            snapshotsKept += entriesAfter.filter { entry in
                entry.kind == .snapshot && entry.offset < watermark && entriesBefore.contains(entry)
            }.count
            // A pulled change kept below the watermark: its entity was kept whole.
            keptWhole += entriesAfter.contains { $0.kind == .remote && $0.offset < watermark } ? 1 : 0
            let again = try await store.compact(below: watermark)
            #expect(again.entriesRemoved == 0 && again.snapshotsWritten == 0, "\(label): compacting again at \(watermark): \(again)")
            #expect(try scanAll(store.log) == entriesAfter, "\(label): compacting again changed the log")
            // Every other replay takes a few entries per transaction, so chunk
            // boundaries fall between intents, their answers and snapshots.
            let chunk = round.isMultiple(of: 2) ? Store.replayChunkCountMax : random.int(1...4)
            try await store.rebuildProjections(entriesPerTransaction: chunk)
            #expect(
                try store.derivedTables() == after,
                "\(label): a replay (\(chunk) entries per transaction) of the log compacted below \(watermark) gives other tables")
        }
    }

    /// A body the store accepts for appending, naming a few entities and
    /// the offsets up to `last` (most often one of `intents`), so that
    /// answers and conflicts often find an intent and snapshots meet the
    /// entities' other entries. `narrow`: two entities, versions up to 4
    /// and mostly updates, so that answers meet entities that a pulled
    /// delete left without a base, and versions go down between resyncs.
    private static func body(
        _ random: inout RandomEntries, narrow: Bool, last: UInt64, intents: [UInt64], keys: inout [String]
    ) -> EntryBody {
        let (type, id) = entities[random.int(0...(narrow ? 1 : entities.count - 1))]
        let version = UInt64(random.int(1...(narrow ? 4 : 8)))
        let earlier =
            !intents.isEmpty && random.int(0...3) != 0
            ? intents[random.int(0...intents.count - 1)] : UInt64(random.int(1...max(Int(last), 1)))
        let cursor = random.int(0...3) == 0 ? "" : "c\(random.int(1...99))"
        switch random.int(0...19) {
        case 0..<6:
            let operation = narrow && random.int(0...1) == 0 ? .update : Intent.Operation.allCases[random.int(0...2)]
            let key = !keys.isEmpty && random.int(0...7) == 0 ? keys[random.int(0...keys.count - 1)] : "k\(keys.count)"
            keys.append(key)
            return .intent(
                Intent(
                    operation, idempotencyKey: key, entityType: type, entityID: id,
                    fields: operation == .delete ? [:] : random.storeFields(countMax: 3)))
        case 6..<10:
            return .ack(Ack(intentOffset: earlier, outcome: Ack.Outcome.allCases[random.int(0...1)], serverVersion: version))
        case 10:
            return .reject(Reject(intentOffset: earlier, code: "VALIDATION_ERROR", message: "no"))
        case 11..<14:
            let operation = Remote.Operation.allCases[random.int(0...1)]
            return .remote(
                Remote(
                    cursor: "c\(random.int(1...99))", operation, entityType: type, entityID: id, serverVersion: version,
                    fields: operation == .delete ? [:] : random.storeFields(countMax: 3)))
        case 14..<17:
            if random.int(0...4) == 0 {
                return .snapshot(Snapshot(watermark: earlier, cursor: cursor, entityType: "", entityID: "", serverVersion: 0, fields: [:]))
            }
            let deleted = random.int(0...3) == 0
            return .snapshot(
                Snapshot(
                    watermark: earlier, cursor: cursor, entityType: type, entityID: id, serverVersion: version - 1,
                    deleted: deleted, fields: deleted ? [:] : random.storeFields(countMax: 3)))
        case 17:
            return .resync(reason: "test")
        default:
            let resolutions: [Conflict.Resolution] = [.pending, .pending, .keepLocal, .keepRemote]
            return .conflict(
                Conflict(
                    intentOffset: earlier, entityType: type, entityID: id, serverVersion: version,
                    serverFields: random.storeFields(countMax: 2), resolution: resolutions[random.int(0...3)]))
        }
    }
}

/// An ack kept for its entity's acknowledged version may have changed
/// nothing in the log because its update came when the entity had no base
/// (a pulled delete, or a tombstone, had removed it). With that entry
/// folded into a snapshot after the ack, the same ack would apply in a
/// replay, at a version above the snapshot's (a server whose versions went
/// down). Such an entity keeps the entries that gave it its base; the
/// others are compacted as usual. Found by `anyLogCompactsToTheSameTables`
/// (the compaction before this one had the same flaw: its snapshot went to
/// the lowest freed offset, before the ack).
@Test(arguments: [
    EntryBody.remote(Remote(cursor: "c1", .delete, entityType: "te", entityID: "a", serverVersion: 2)),
    .snapshot(Snapshot(watermark: 4, cursor: "c1", entityType: "te", entityID: "a", serverVersion: 2, deleted: true, fields: [:])),
])
func anAckThatFoundNoBaseStillFindsNoneAfterCompaction(removingTheBase: EntryBody) async throws {
    let fixture = try StoreFixture("compact-ack-no-base")
    let store = fixture.store
    defer { store.close() }
    let bodies: [EntryBody] = [
        .intent(Intent(.create, idempotencyKey: "k1", entityType: "te", entityID: "a", fields: ["n": 1])),  // 1
        .intent(Intent(.update, idempotencyKey: "k2", entityType: "te", entityID: "a", fields: ["m": 2])),  // 2, stays pending
        .ack(Ack(intentOffset: 1, outcome: .applied, serverVersion: 1)),  // 3
        removingTheBase,  // 4
        .intent(Intent(.update, idempotencyKey: "k3", entityType: "te", entityID: "a", fields: ["o": 3])),  // 5
        .ack(Ack(intentOffset: 5, outcome: .applied, serverVersion: 6)),  // 6: no base to apply it to
        .remote(Remote(cursor: "c2", .upsert, entityType: "te", entityID: "x", serverVersion: 1, fields: ["x": 1])),  // 7
        .remote(Remote(cursor: "c3", .upsert, entityType: "te", entityID: "a", serverVersion: 3, fields: ["n": 9])),  // 8
        .intent(Intent(.create, idempotencyKey: "k4", entityType: "te", entityID: "z")),  // 9
    ]
    for body in bodies { _ = try await store.log.append(body) }
    try await store.record([])
    #expect(try store.get(type: "te", id: "a")?.serverVersion == 3)
    let before = try store.derivedTables()
    let report = try await store.compact(below: 9)
    // Only x's pulled change goes, for a snapshot in its place.
    #expect(report.entriesRemoved == 1 && report.snapshotsWritten == 1)
    guard case .snapshot(let snapshot)? = try store.log.entry(at: 7)?.body else {
        Issue.record("no snapshot at offset 7")
        return
    }
    #expect(snapshot.entityID == "x" && snapshot.cursor == "c3")
    #expect(try store.derivedTables().entities == before.entities)
    try await store.rebuildProjections()
    #expect(try store.derivedTables() == before)
    #expect(try store.get(type: "te", id: "a")?.serverVersion == 3)
    let again = try await store.compact(below: 9)
    #expect(again.entriesRemoved == 0 && again.snapshotsWritten == 0)
}
