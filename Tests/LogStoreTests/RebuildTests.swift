import Foundation
import LMDB
import LogFormat
@testable import LogStore
import LogTesting
import Synchronization
import Testing

/// What an app (or a sync engine) reads from a store, through the public API.
private struct Reads: Equatable {
    var counts: [String: Int] = [:]
    var entities: [String: Entity?] = [:]
    var types: [String] = []
    var remote: [Entity] = []
    var outboxCount = 0
    var outboxOffsets: [UInt64] = []
    var conflicts: [WaitingConflict] = []
    var cursor: String?

    /// Reads the counts, the entities named by `ids` (type "te"), the
    /// pulled entities (type "tr"), the outbox, the conflicts and the cursor.
    init(_ store: Store, ids: [String]) throws {
        for type in ["te", "tr", "tw"] { counts[type] = try store.count(type: type) }
        for id in ids { entities[id] = try store.get(type: "te", id: id) }
        types = try store.entityTypes()
        remote = try store.all(type: "tr", limit: Store.pageCountMax)
        outboxCount = try store.outboxCount()
        outboxOffsets = try store.outbox().map(\.offset)
        conflicts = try store.conflicts()
        cursor = try store.pullCursor()
    }
}

/// Writes, through the store, `creates` entities of type "te" (ids `e0`...),
/// acks the first `acked` of them, rejects one intent and records a conflict
/// on another, updates a few, and applies two pulled pages (types "tr"),
/// the last with the cursor "c-2": every derived table has rows, and the
/// last entries (the cursor among them) come after all the creates.
private func fill(_ store: Store, creates: Int, acked: Int) async throws {
    var next = 0
    while next < creates {
        var batch = WriteBatch()
        for n in next..<min(next + 1_000, creates) {
            try batch.create(type: "te", id: "e\(n)", fields: ["n": .int(Int64(n))])
        }
        next += batch.operations.count
        try await store.write(batch)
    }
    let outbox = try store.outbox()
    try await store.record(outbox.prefix(acked).map { ($0.offset, PushOutcome.acknowledged(.applied, serverVersion: 1)) })
    try await store.record([
        (outbox[acked].offset, .rejected(code: "VALIDATION_ERROR", message: "no")),
        (outbox[acked + 1].offset, .conflict(ServerState(serverVersion: 4, deleted: false, data: ["n": -1]), message: "changed")),
    ])
    for n in [3, 7, creates - 1] { try await store.update(type: "te", id: "e\(n)", changes: ["late": true]) }
    try await store.applyPulledPage(
        (0..<20).map { PulledChange(.upsert, entityType: "tr", entityID: "r\($0)", serverVersion: 1, fields: ["v": 1]) },
        cursor: "c-1")
    try await store.applyPulledPage(
        [PulledChange(.delete, entityType: "tr", entityID: "r0", serverVersion: 2),
         PulledChange(.upsert, entityType: "tr", entityID: "r1", serverVersion: 2, fields: ["v": 2])],
        cursor: "c-2")
}

/// The ids of "te" entities the tests look at: early and late ones, acked,
/// rejected, in conflict, updated.
private func sampleIDs(creates: Int, acked: Int) -> [String] {
    [0, 3, 7, acked - 1, acked, acked + 1, acked + 2, creates / 2, creates - 1].map { "e\($0)" }
}

@Suite struct RebuildTests {
    /// While `rebuildProjections` runs (here paused after its first chunk
    /// of `Store.replayChunkCountMax` entries, with more to come), every
    /// read sees the tables as they were before it: no entity missing or in
    /// an older state, the same outbox and conflicts, and the pull cursor
    /// kept (a sync engine pulling then would otherwise start from the
    /// beginning). Afterwards the tables are the same again.
    @Test func readsDuringARebuildSeeTheTablesAsBefore() async throws {
        let fixture = try StoreFixture("rebuild-reads")
        let store = fixture.store
        let creates = Store.replayChunkCountMax + 1_000
        try await fill(store, creates: creates, acked: 2_000)
        let ids = sampleIDs(creates: creates, acked: 2_000)
        let before = try Reads(store, ids: ids)
        let tables = try store.derivedTables()
        #expect(before.cursor == "c-2")
        // One create rejected, one refused with a conflict.
        #expect(before.counts["te"] == creates - 2)
        var pauses = 0
        try await store.rebuildProjections(entriesPerTransaction: Store.replayChunkCountMax) {
            pauses += 1
            let during = try Reads(store, ids: ids)
            #expect(during.cursor == before.cursor, "pause \(pauses): the pull cursor")
            #expect(during.counts == before.counts, "pause \(pauses): the counts")
            for id in ids { #expect(during.entities[id] == before.entities[id], "pause \(pauses): te/\(id)") }
            #expect(during.remote == before.remote, "pause \(pauses): the pulled entities")
            #expect(during.outboxOffsets == before.outboxOffsets, "pause \(pauses): the outbox")
            #expect(during.conflicts == before.conflicts, "pause \(pauses): the conflicts")
            #expect(during == before, "pause \(pauses)")
            #expect(try store.derivedTables() == tables, "pause \(pauses): the derived tables")
        }
        #expect(pauses >= 1, "the rebuild took one chunk")
        #expect(try Reads(store, ids: ids) == before)
        #expect(try store.derivedTables() == tables)
        store.close()
    }

    /// App writes made while a rebuild runs are read back at once, each
    /// applied alone (not the rest of the rebuild in its transaction), and
    /// are in the tables the rebuild leaves, which are what a replay of the
    /// whole log gives.
    @Test func writesDuringARebuildAreReadAtOnceAndKept() async throws {
        let fixture = try StoreFixture("rebuild-writes")
        let store = fixture.store
        try await fill(store, creates: 1_000, acked: 300)
        let outbox = try store.outbox()
        let teCount = try store.count(type: "te")
        var pauses = 0
        try await store.rebuildProjections(entriesPerTransaction: 100) {
            pauses += 1
            guard pauses == 2 else { return }
            #expect(try store.outboxCount() == outbox.count)
            let created = try await store.create(type: "tw", fields: ["new": true])
            #expect(try store.get(type: "tw", id: created)?.fields == ["new": true])
            try await store.update(type: "te", id: "e900", changes: ["n": 9_000])
            #expect(try store.get(type: "te", id: "e900")?.fields["n"] == 9_000)
            try await store.delete(type: "te", id: "e950")
            #expect(try store.get(type: "te", id: "e950") == nil)
            try await store.record([(outbox[10].offset, .acknowledged(.applied, serverVersion: 1))])
            #expect(try store.outboxCount() == outbox.count + 3 - 1)
            try await store.applyPulledPage(
                [PulledChange(.upsert, entityType: "tr", entityID: "r9", serverVersion: 3, fields: ["v": 3])], cursor: "c-3")
            #expect(try store.pullCursor() == "c-3")
            #expect(try store.get(type: "te", id: "e999")?.fields["late"] == true)
            #expect(try store.count(type: "te") == teCount - 1)
        }
        // A log of about 1,300 entries: a write that finished the rebuild
        // in its own transaction would leave the rebuild nothing to pause for.
        #expect(pauses > 10, "the rebuild paused \(pauses) times")
        #expect(try store.count(type: "te") == teCount - 1)
        #expect(try store.count(type: "tw") == 1)
        #expect(try store.get(type: "te", id: "e900")?.fields["n"] == 9_000)
        #expect(try store.get(type: "tr", id: "r9")?.fields == ["v": 3])
        #expect(try store.pullCursor() == "c-3")
        #expect(try await store.projectionProblems() == [])
        store.close()
    }

    /// Much written while a rebuild runs (here 350 entries at its second
    /// pause, with chunks of 100), and nothing after: the rebuild goes on in
    /// chunks of 100, rather than taking all of it in its last transaction
    /// (whose dirty pages a bulk import would make as big as the import).
    @Test func writesDuringARebuildAreReplayedInBoundedChunks() async throws {
        let fixture = try StoreFixture("rebuild-bounded")
        let store = fixture.store
        try await fill(store, creates: 1_000, acked: 300)
        var pauses = 0
        var watermarks: [UInt64] = []
        try await store.rebuildProjections(entriesPerTransaction: 100) {
            pauses += 1
            watermarks.append(try #require(try store.rebuildWatermark()))
            guard pauses == 2 else { return }
            for batch in 0..<7 {
                var writes = WriteBatch()
                for n in 0..<50 { try writes.create(type: "tw", id: "w\(batch)-\(n)", fields: [:]) }
                try await store.write(writes)
            }
        }
        let last = try store.log.lastOffset()
        let steps = zip(watermarks, watermarks.dropFirst() + [last]).map { $1 - $0 }
        #expect(steps.allSatisfy { $0 <= 100 }, "entries per chunk after the first: \(steps)")
        #expect(try store.count(type: "tw") == 350)
        #expect(try await store.projectionProblems() == [])
        store.close()
    }

    /// storage.md section 15, Replay: past the last offset there was when
    /// the rebuild started, a chunk takes every entry left only when it
    /// finds fewer than half a chunk's entries gone since the chunk before.
    /// Exactly half (2 of a chunk of 4) is not fewer: the chunk stays
    /// bounded.
    @Test func aChunkThatFindsExactlyHalfAChunkGoneStaysBounded() async throws {
        let fixture = try StoreFixture("rebuild-half-gone")
        defer { fixture.store.close() }
        // 4 entries written after the first chunk, 2 after the second:
        // the third chunk finds 8 - 6 = 2 entries gone since the second.
        #expect(try await Self.rebuildWatermarks(fixture.store, writingAfterChunks: [4, 2]) == [4, 8, 12])
        #expect(try fixture.store.count(type: "tw") == 6)
    }

    /// Rebuilds `store` after writing 8 entries to it, in chunks of 4,
    /// with `writes[n]` entries of type `tw` written after chunk n + 1.
    /// - Returns: the rebuild's watermark after each chunk but the last.
    private static func rebuildWatermarks(_ store: Store, writingAfterChunks writes: [Int]) async throws -> [UInt64] {
        for n in 0..<8 { try await store.create(type: "te", id: "s\(n)", fields: [:]) }  // 1-8
        var watermarks: [UInt64] = []
        try await store.rebuildProjections(entriesPerTransaction: 4) {
            let chunk = watermarks.count
            watermarks.append(try #require(try store.rebuildWatermark()))
            for n in 0..<(chunk < writes.count ? writes[chunk] : 0) {
                try await store.create(type: "tw", id: "w\(chunk)-\(n)", fields: [:])
            }
        }
        return watermarks
    }

    /// storage.md section 15, Replay: the rule for entries written while a
    /// rebuild runs holds from the chunk that starts at the last offset
    /// there was when the rebuild started (8 here), which has replayed all
    /// of those. Writes kept up with it (5 entries after a chunk that left
    /// 5), so it takes every entry left and ends the rebuild, rather than
    /// a chunk of 4 and one more after it.
    @Test func theChunkAtTheStartsLastOffsetCatchesUpWithWrites() async throws {
        let fixture = try StoreFixture("rebuild-catch-up-at-start")
        defer { fixture.store.close() }
        // 1 entry written after the first chunk (9), 5 after the second (10-14).
        #expect(try await Self.rebuildWatermarks(fixture.store, writingAfterChunks: [1, 5]) == [4, 8])
        #expect(try fixture.store.count(type: "tw") == 6)
        #expect(try fixture.store.rebuildWatermark() == nil)
    }

    /// A store closed part way through a rebuild keeps the tables it had:
    /// a read-only open (a tool's) reads them all, and the next writable
    /// open finishes the rebuild, to the same tables.
    @Test func aStoreClosedDuringARebuildKeepsItsTables() async throws {
        let directory = try TemporaryDirectory("rebuild-close")
        var store = try Store(path: directory.path, options: .init(durability: .process))
        try await fill(store, creates: 1_000, acked: 300)
        let ids = sampleIDs(creates: 1_000, acked: 300)
        let before = try Reads(store, ids: ids)
        let tables = try store.derivedTables()
        do {
            try await store.rebuildProjections(entriesPerTransaction: 100) { [store] in store.close() }
            Issue.record("the rebuild went on after close")
        } catch let error as LogStoreError {
            #expect(error.code == .closed, "\(error)")
        }
        let reader = try Store(path: directory.path, options: .init(readOnly: true))
        #expect(try Reads(reader, ids: ids) == before)
        reader.close()
        store = try Store(path: directory.path, options: .init(durability: .process))
        #expect(try Reads(store, ids: ids) == before)
        #expect(try store.derivedTables() == tables)
        store.close()
    }

    /// The next writable open resumes a rebuild stopped part way from its
    /// watermark: here it replays the half chunk left in one commit, and
    /// does not start again from the first entry (emptying the set, then
    /// two chunks). Started again on every open, the rebuild of a big log
    /// whose app is stopped during each open would never end.
    @Test func aRebuildStoppedPartWayIsResumedWhereItStopped() async throws {
        let directory = try TemporaryDirectory("rebuild-resume")
        defer { directory.remove() }
        let chunk = Store.replayChunkCountMax
        var store = try Store(path: directory.path, options: .init(durability: .process))
        _ = try await store.log.append(contentsOf: (1...chunk + chunk / 2).map { intent($0) })
        do {
            try await store.rebuildProjections(entriesPerTransaction: chunk) { [store] in store.close() }
            Issue.record("the rebuild went on after close")
        } catch let error as LogStoreError {
            #expect(error.code == .closed, "\(error)")
        }
        // As they were at the close.
        let commitsBefore = store.log.environment.info().lastTransactionID
        store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        #expect(store.log.environment.info().lastTransactionID - commitsBefore == 1)
        #expect(try store.rebuildWatermark() == nil)
        #expect(try store.count(type: "te") == chunk + chunk / 2)
    }

    /// A compaction while a rebuild runs rewrites entries the rebuild may
    /// have read already (or not yet): the tables must still come out as a
    /// replay of the compacted log makes them, and reads meanwhile stay
    /// whole.
    @Test func aCompactionDuringARebuild() async throws {
        let fixture = try StoreFixture("rebuild-compact")
        let store = fixture.store
        try await fill(store, creates: 400, acked: 300)
        let ids = sampleIDs(creates: 400, acked: 300)
        let before = try Reads(store, ids: ids)
        var pauses = 0
        try await store.rebuildProjections(entriesPerTransaction: 50) {
            pauses += 1
            guard pauses == 3 else { return }
            let report = try await store.compact(below: try store.log.lastOffset() - 5)
            #expect(report.entriesRemoved > 0)
            #expect(try Reads(store, ids: ids) == before)
        }
        #expect(try Reads(store, ids: ids) == before)
        #expect(try await store.projectionProblems() == [])
        store.close()
    }

    /// Readers on a thread of their own and writers in tasks run while a
    /// rebuild in small chunks goes on: no read ever sees an entity of the
    /// log missing, a wrong count, or the pull cursor gone.
    @Test func readersNeverSeeAHalfBuiltTable() async throws {
        for round in 0..<3 {
            let fixture = try StoreFixture("rebuild-race")
            let store = fixture.store
            try await fill(store, creates: 1_000, acked: 300)
            let ids = sampleIDs(creates: 1_000, acked: 300)
            let before = try Reads(store, ids: ids)
            let done = Atomic<Bool>(false)
            let problems = Mutex<[String]>([])
            let reads = Atomic<Int>(0)
            let readerDone = DispatchSemaphore(value: 0)
            Thread {
                defer { readerDone.signal() }
                while !done.load(ordering: .acquiring) {
                    do {
                        let seen = try Reads(store, ids: ids)
                        // Writers only add "tw" entities.
                        var expected = before
                        expected.counts["tw"] = seen.counts["tw"]
                        expected.types = seen.types
                        expected.outboxCount = seen.outboxCount
                        expected.outboxOffsets = seen.outboxOffsets
                        if seen != expected {
                            problems.withLock { $0.append("cursor \(seen.cursor ?? "nil"), counts \(seen.counts)") }
                        }
                        reads.add(1, ordering: .relaxed)
                    } catch {
                        problems.withLock { $0.append("\(error)") }
                        return
                    }
                }
            }.start()
            let writer = Task {
                var written = 0
                while !done.load(ordering: .acquiring) {
                    try await store.create(type: "tw", id: "w\(written)", fields: [:])
                    written += 1
                }
                return written
            }
            var pauses = 0
            do {
                // Also when the rebuild fails: the reader and the writer stop.
                defer { done.store(true, ordering: .releasing) }
                // Each pause waits for a read to finish, so reads and chunks
                // interleave (and writes, which go on meanwhile, outrun chunks).
                try await store.rebuildProjections(entriesPerTransaction: 20) {
                    pauses += 1
                    // About 1,300 entries at the start: a rebuild that chased the
                    // writes chunk by chunk would never end.
                    try #require(pauses < 1_000, "round \(round): the rebuild never caught up with the writes")
                    let seen = reads.load(ordering: .relaxed)
                    var polls = 0
                    while reads.load(ordering: .relaxed) < seen + 1, polls < 100_000 {
                        polls += 1
                        await Task.yield()
                    }
                }
            }
            let written = try await writer.value
            readerDone.wait()
            let seen = problems.withLock { $0 }
            #expect(seen.isEmpty, "round \(round): \(seen.count) bad reads in \(reads.load(ordering: .relaxed)), first \(seen.prefix(3))")
            #expect(try store.count(type: "tw") == written)
            #expect(try await store.projectionProblems() == [], "round \(round), \(pauses) pauses")
            store.close()
        }
    }
}

/// The rows of every derived database of both sets, and the rebuild's
/// `meta` keys, of the closed store at `path`, read with LMDB alone.
/// Writes into the `meta` database of the closed store at `path` as a
/// crash, damage or other software would have left it.
private func writeMeta(_ path: String, _ write: (borrowing Transaction, Database) throws -> Void) throws {
    let environment = try Environment(path: path)
    defer { environment.close() }
    let meta = try #require(try environment.openDatabase("meta", create: false))
    try environment.write { txn in try write(txn, meta) }
}

private func rawDerivedState(_ path: String) throws -> (rows: [String: Int], meta: [String: [UInt8]]) {
    let environment = try Environment(path: path)
    defer { environment.close() }
    var rows: [String: Int] = [:]
    for set in 0..<2 {
        for name in Store.derivedDatabaseNames(set: set) {
            let database = try #require(try environment.openDatabase(name, create: false), "\(name)")
            rows[name] = try environment.read { txn in try txn.count(database) }
        }
    }
    let meta = try #require(try environment.openDatabase("meta", create: false))
    var values: [String: [UInt8]] = [:]
    try environment.read { txn in
        for key in ["projection-set", "projection-version", "rebuild-version", "rebuild-watermark", "rebuild-cursor"] {
            values[key] = try txn.get(meta, key: Array(key.utf8))
        }
    }
    return (rows, values)
}

extension RebuildTests {
    /// A new store uses set 0; each rebuild fills the other set, puts it in
    /// use and empties the one it replaced, so a store holds one copy of
    /// its tables between rebuilds, and no rebuild key is left behind.
    @Test func eachRebuildSwitchesSetsAndEmptiesTheOldOne() async throws {
        var fixture = try StoreFixture("rebuild-switch")
        try await fill(fixture.store, creates: 300, acked: 100)
        let tables = try fixture.store.derivedTables()
        #expect(try fixture.store.derivedDatabaseNamesInUse() == Store.derivedDatabaseNames)
        for round in 1...3 {
            try await fixture.store.rebuildProjections(entriesPerTransaction: 100)
            let set = round % 2
            #expect(try fixture.store.derivedDatabaseNamesInUse() == Store.derivedDatabaseNames(set: set), "round \(round)")
            #expect(try fixture.store.derivedTables() == tables, "round \(round)")
            fixture.store.close()
            let (rows, meta) = try rawDerivedState(fixture.directory.path)
            for name in Store.derivedDatabaseNames(set: 1 - set) { #expect(rows[name] == 0, "round \(round): \(name)") }
            #expect(rows[Store.derivedDatabaseNames(set: set)[0]] == tables.entities.count / 2, "round \(round): entities in use")
            #expect(meta["projection-set"] == [UInt8(set)], "round \(round)")
            #expect(meta["projection-version"] == Store.projectionVersion.bigEndianBytes, "round \(round)")
            #expect(meta["rebuild-version"] == nil && meta["rebuild-watermark"] == nil && meta["rebuild-cursor"] == nil, "round \(round)")
            try fixture.reopen()
            #expect(try fixture.store.derivedTables() == tables, "round \(round) after reopening")
        }
        fixture.store.close()
    }

    /// A rebuild stopped part way records how far it got; the next
    /// writable open goes on from there and puts the new set in use.
    @Test func aRebuildStoppedPartWayIsFinishedByTheNextOpen() async throws {
        let directory = try TemporaryDirectory("rebuild-resume")
        var store = try Store(path: directory.path, options: .init(durability: .process))
        try await fill(store, creates: 1_000, acked: 300)
        let tables = try store.derivedTables()
        var pauses = 0
        await #expect(throws: LogStoreError.self) {
            try await store.rebuildProjections(entriesPerTransaction: 100) { [store] in
                pauses += 1
                if pauses == 3 { store.close() }
            }
        }
        let (_, meta) = try rawDerivedState(directory.path)
        #expect(meta["rebuild-watermark"] == UInt64(300).bigEndianBytes)
        #expect(meta["projection-set"] == nil)
        let reader = try Store(path: directory.path, options: .inspecting)
        #expect(try reader.rebuildWatermark() == 300)
        #expect(try reader.derivedTables() == tables)
        reader.close()
        store = try Store(path: directory.path, options: .init(durability: .process))
        #expect(try store.rebuildWatermark() == nil)
        #expect(try store.derivedDatabaseNamesInUse() == Store.derivedDatabaseNames(set: 1))
        #expect(try store.derivedTables() == tables)
        store.close()
    }

    /// A rebuild the next open cannot go on with starts over from the first
    /// entry, its half-filled set emptied first: one past the log's end (a
    /// copy cut short by `logtool replay --to`), one of another projection
    /// version, or one over tables in use of another version (a build of
    /// that version may have written to the set since).
    @Test(arguments: ["past the log", "other version", "tables of another version"])
    func aRebuildThatCannotGoOnStartsOver(_ case: String) async throws {
        let directory = try TemporaryDirectory("rebuild-start-over")
        var store = try Store(path: directory.path, options: .init(durability: .process))
        try await fill(store, creates: 500, acked: 100)
        let tables = try store.derivedTables()
        await #expect(throws: LogStoreError.self) {
            try await store.rebuildProjections(entriesPerTransaction: 100) { [store] in store.close() }
        }
        let last = try store.log.lastOffset()
        do {
            let environment = try Environment(path: directory.path)
            let meta = try #require(try environment.openDatabase("meta", create: false))
            let entities = try #require(try environment.openDatabase("entities.1", create: false))
            try environment.write { txn in
                // A row no replay makes: it must not survive.
                try txn.put(entities, key: Array("te".utf8) + [0] + Array("ghost".utf8), value: [0])
                switch `case` {
                case "past the log": try txn.put(meta, key: Array("rebuild-watermark".utf8), value: (last + 10).bigEndianBytes)
                case "other version": try txn.put(meta, key: Array("rebuild-version".utf8), value: UInt32(99).bigEndianBytes)
                default: try txn.put(meta, key: Array("projection-version".utf8), value: UInt32(3).bigEndianBytes)
                }
            }
            environment.close()
        }
        store = try Store(path: directory.path, options: .init(durability: .process))
        #expect(try store.rebuildWatermark() == nil)
        #expect(try store.get(type: "te", id: "ghost") == nil)
        #expect(try store.derivedTables() == tables)
        store.close()
    }
}

extension RebuildTests {
    /// A rebuild that meets a damaged entry fails with it, and is dropped:
    /// the tables in use stay, reads go on, and the next open does not try
    /// the rebuild again (it would fail the open).
    @Test func aRebuildThatFailsLeavesTheTablesInUse() async throws {
        var fixture = try StoreFixture("rebuild-fails")
        let store = fixture.store
        try await fill(store, creates: 500, acked: 100)
        let ids = sampleIDs(creates: 500, acked: 100)
        let before = try Reads(store, ids: ids)
        let tables = try store.derivedTables()
        let log = store.log
        // An acknowledged intent: no read of the app's reads looks at it.
        _ = try await log.perform { txn, _ in
            let key = OffsetKey.encode(50)
            var bytes = try #require(try txn.get(log.logDatabase, key: key))
            bytes[bytes.count - 1] ^= 0x40
            try txn.put(log.logDatabase, key: key, value: bytes)
        }
        let error = await #expect(throws: LogStoreError.self) {
            try await store.rebuildProjections(entriesPerTransaction: 100)
        }
        #expect(error?.code == .corruptEntry && error?.offset == 50, "\(String(describing: error))")
        #expect(try store.rebuildWatermark() == nil)
        #expect(try Reads(store, ids: ids) == before)
        try await store.create(type: "tw", id: "after", fields: [:])
        try fixture.reopen()
        #expect(try fixture.store.get(type: "tw", id: "after") != nil)
        var expected = before
        expected.counts["tw"] = 1
        expected.types.append("tw")
        expected.outboxCount += 1
        let seen = try Reads(fixture.store, ids: ids)
        #expect(seen.counts == expected.counts && seen.entities == expected.entities && seen.cursor == before.cursor)
        #expect(try fixture.store.derivedTables().entities.count == tables.entities.count + 2)
        fixture.store.close()
    }
}

extension RebuildTests {
    /// The outbox's attempt state is the one derived state the log does not
    /// hold. A rebuild of the same version keeps it for every intent still
    /// pending, also when set while the rebuild ran: a `failed` intent
    /// stays failed (a sync running meanwhile must not push it again), a
    /// scheduled retry keeps its time and count. A rebuild to another
    /// version (another outbox layout) starts it over.
    @Test func aRebuildKeepsTheOutboxsAttemptState() async throws {
        var fixture = try StoreFixture("rebuild-outbox-state")
        try await fill(fixture.store, creates: 1_000, acked: 300)
        let pending = try fixture.store.outbox()
        let (failed, retrying, laterRetrying) = (pending[0].offset, pending[1].offset, pending[2].offset)
        try await fixture.store.markFailed(offsets: [failed], error: "gave up")
        try await fixture.store.scheduleRetry(offsets: [retrying], error: "503", at: 1_234, attemptsMax: 10)
        var pauses = 0
        try await fixture.store.rebuildProjections(entriesPerTransaction: 100) {
            pauses += 1
            if pauses == 3 {
                try await fixture.store.scheduleRetry(offsets: [laterRetrying], error: "timeout", at: 5_678, attemptsMax: 10)
            }
        }
        #expect(pauses > 3)
        let states = try Dictionary(uniqueKeysWithValues: fixture.store.outbox().map { ($0.offset, $0.state) })
        #expect(states.count == pending.count)
        #expect(states[failed]?.status == .failed && states[failed]?.lastError == "gave up", "\(String(describing: states[failed]))")
        #expect(states[retrying]?.nextAttemptAt == 1_234 && states[retrying]?.attempts == 1)
        #expect(states[laterRetrying]?.nextAttemptAt == 5_678 && states[laterRetrying]?.lastError == "timeout")
        #expect(states[pending[3].offset] == OutboxState())
        #expect(try fixture.store.outboxSummary().failedCount == 1)

        // Tables of another projection version: their outbox rows may have
        // another layout, so the rebuild on open starts the state over.
        fixture.store.close()
        try putRaw(fixture.directory.path, database: "meta", key: Array("projection-version".utf8), value: [0, 0, 0, 1])
        try fixture.reopen()
        #expect(try fixture.store.outbox().allSatisfy { $0.state == OutboxState() })
    }
}

extension RebuildTests {
    /// storage.md section 15, "Replay": a `projection-version` that is
    /// absent, not 4 bytes, or not 4 is refused by a read-only open
    /// ("projections stale"), and rebuilt from the log by a writable one,
    /// after which a read-only open reads the store.
    @Test(arguments: [("absent", nil), ("3", [0, 0, 0, 3]), ("3 bytes", [0, 0, 4]), ("5 bytes", [0, 0, 0, 0, 4])] as [(String, [UInt8]?)])
    func aProjectionVersionOtherThan4IsStaleReadOnlyAndRebuiltWritable(shape: String, version: [UInt8]?) async throws {
        var fixture = try StoreFixture("projection-version-\(shape.replacingOccurrences(of: " ", with: "-"))")
        let id = try await fixture.store.create(type: "te", fields: ["a": 1])
        fixture.store.close()
        try writeMeta(fixture.directory.path) { txn, meta in
            let key = Array("projection-version".utf8)
            if let version { try txn.put(meta, key: key, value: version) } else { _ = try txn.delete(meta, key: key) }
        }
        let refused = #expect(throws: LogStoreError.self, "\(shape)") { try Store(path: fixture.directory.path, options: .inspecting) }
        #expect(refused?.code == .projectionsStale, "\(shape): \(String(describing: refused))")
        try fixture.reopen()
        #expect(try fixture.store.projectionState().version == Store.projectionVersion, "\(shape)")
        #expect(try fixture.store.get(type: "te", id: id)?.fields == ["a": 1])
        fixture.store.close()
        let reader = try Store(path: fixture.directory.path, options: .inspecting)
        defer { reader.close() }
        #expect(try reader.get(type: "te", id: id)?.fields == ["a": 1], "\(shape)")
    }
}

extension RebuildTests {
    /// storage.md section 15, Replay: the chunk that ends a rebuild copies
    /// `rebuild-cursor` to `cursor`, or deletes `cursor` when the replay
    /// set none. A cursor the log does not give (damage, which a rebuild
    /// repairs) does not survive it.
    @Test func aRebuildDeletesACursorTheLogDoesNotGive() async throws {
        var fixture = try StoreFixture("rebuild-stray-cursor")
        try await fixture.store.create(type: "te", id: "a", fields: [:])
        let tables = try fixture.store.derivedTables()
        #expect(tables.cursor == nil)
        let log = fixture.store.log
        _ = try await log.perform { txn, _ in try txn.put(log.metaDatabase, key: MetaKey.cursor, value: Array("stray".utf8)) }
        #expect(try fixture.store.pullCursor() == "stray")
        try await fixture.store.rebuildProjections()
        #expect(try fixture.store.pullCursor() == nil)
        #expect(try fixture.store.derivedTables() == tables)
        try fixture.reopen()
        #expect(try fixture.store.pullCursor() == nil)
    }

    /// The other half of the same rule: a cursor the log gives replaces
    /// the one the tables in use had, which damage made another. Kept, the
    /// next pull would go on from a place the server never gave.
    @Test func aRebuildPutsBackTheCursorTheLogGives() async throws {
        var fixture = try StoreFixture("rebuild-wrong-cursor")
        try await fixture.store.applyPulledPage(
            [PulledChange(.upsert, entityType: "tr", entityID: "r", serverVersion: 1, fields: [:])], cursor: "c-1")
        let tables = try fixture.store.derivedTables()
        let log = fixture.store.log
        _ = try await log.perform { txn, _ in try txn.put(log.metaDatabase, key: MetaKey.cursor, value: Array("stray".utf8)) }
        #expect(try fixture.store.pullCursor() == "stray")
        try await fixture.store.rebuildProjections()
        #expect(try fixture.store.pullCursor() == "c-1")
        #expect(try fixture.store.derivedTables() == tables)
        try fixture.reopen()
        #expect(try fixture.store.pullCursor() == "c-1")
        fixture.store.close()
    }

    /// storage.md section 15, Replay: a rebuild carries attempt state only
    /// to the `outbox` rows with the same keys in the set it filled. An
    /// intent whose answer was appended to the log directly (the tables in
    /// use have not applied it) is settled in the replay, and its old row,
    /// failed, does not come back.
    @Test func aRebuildCarriesNoAttemptStateToAnIntentItFoundSettled() async throws {
        let fixture = try StoreFixture("rebuild-carry-settled")
        let store = fixture.store
        try await store.create(type: "te", id: "a", fields: [:])  // 1
        try await store.markFailed(offsets: [1], error: "gave up")
        _ = try await store.log.append(.ack(Ack(intentOffset: 1, outcome: .applied, serverVersion: 1)))  // 2
        try await store.rebuildProjections()
        #expect(try store.outbox().isEmpty)
        #expect(try store.get(type: "te", id: "a")?.serverVersion == 1)
    }
}

extension RebuildTests {
    /// storage.md section 15, Replay: a replay gives the same `outbox` keys
    /// as the incremental path. A resync in a chunk writes out the intents
    /// the chunk staged before it; the rest of the chunk must not stage
    /// them again, nor leave the row of one acked after the resync.
    @Test func aReplayedResyncAmongPendingIntentsGivesTheSameOutbox() async throws {
        let fixture = try StoreFixture("rebuild-resync-outbox")
        let store = fixture.store
        try await store.create(type: "te", id: "a", fields: ["n": 1])  // 1
        try await store.create(type: "te", id: "b", fields: ["n": 2])  // 2
        try await store.resync(reason: "test")  // 3
        try await store.record([(1, .acknowledged(.applied, serverVersion: 1))])  // 4
        try await store.create(type: "te", id: "c", fields: [:])  // 5
        let tables = try store.derivedTables()
        #expect(try store.outbox().map(\.offset) == [2, 5])
        // One chunk: the resync and the entries around it.
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == tables)
        #expect(try store.outbox().map(\.offset) == [2, 5])
    }

    /// storage.md section 15, Replay: the next open resumes a rebuild only
    /// when `rebuild-watermark` is at most the last offset; one that is
    /// absent or does not decode is no such offset, so the rebuild starts
    /// over, its set emptied first. (Resumed, it replayed over the rows
    /// already there, or failed the open.)
    @Test(arguments: ["absent", "3 bytes"])
    func aRebuildWhoseWatermarkDoesNotReadStartsOver(_ watermark: String) async throws {
        var fixture = try StoreFixture("rebuild-watermark-\(watermark.replacingOccurrences(of: " ", with: "-"))")
        for n in 0..<3 { try await fixture.store.create(type: "te", id: "e\(n)", fields: ["n": .int(Int64(n))]) }
        let tables = try fixture.store.derivedTables()
        fixture.store.close()
        // A row no replay makes: it must not survive.
        try putRaw(fixture.directory.path, database: "entities.1", key: Array("te".utf8) + [0] + Array("ghost".utf8), value: [0], create: true)
        try writeMeta(fixture.directory.path) { txn, meta in
            try txn.put(meta, key: Array("rebuild-version".utf8), value: Store.projectionVersion.bigEndianBytes)
            if watermark == "3 bytes" { try txn.put(meta, key: Array("rebuild-watermark".utf8), value: [0, 0, 1]) }
        }
        try fixture.reopen()
        #expect(try fixture.store.rebuildWatermark() == nil)
        #expect(try fixture.store.get(type: "te", id: "ghost") == nil)
        #expect(try fixture.store.derivedTables() == tables)
    }

    /// storage.md section 15, Replay: a rebuild starts by deleting
    /// `rebuild-cursor`. One started over on open (here, after a rebuild of
    /// another version) must not end with the pull cursor the rebuild
    /// before it had reached: the log gives none.
    @Test func aRebuildStartedOverForgetsThePullCursorOfTheOneBefore() async throws {
        var fixture = try StoreFixture("rebuild-start-over-cursor")
        try await fixture.store.create(type: "te", id: "a", fields: [:])
        let tables = try fixture.store.derivedTables()
        #expect(tables.cursor == nil)
        fixture.store.close()
        try writeMeta(fixture.directory.path) { txn, meta in
            try txn.put(meta, key: Array("rebuild-version".utf8), value: UInt32(99).bigEndianBytes)
            try txn.put(meta, key: Array("rebuild-watermark".utf8), value: UInt64(1).bigEndianBytes)
            try txn.put(meta, key: Array("rebuild-cursor".utf8), value: Array("stale".utf8))
        }
        try fixture.reopen()
        #expect(try fixture.store.rebuildWatermark() == nil)
        #expect(try fixture.store.pullCursor() == nil)
        #expect(try fixture.store.derivedTables() == tables)
    }
}

extension RebuildTests {
    /// `changes(type:)`: the commit that ends a rebuild gives a change to
    /// every type with entities in the tables before it or after it. Here
    /// the tables in use had lost the count of "te", which the log makes,
    /// and held one of "stray", which nothing in the log makes: the rebuild
    /// changes what the app sees of both, so each stream gets a change.
    @Test func aRebuildGivesAChangeToTheTypesOfTheTablesBeforeAndAfter() async throws {
        let directory = try TemporaryDirectory("rebuild-changes")
        defer { directory.remove() }
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            store.close()
        }
        do {
            let environment = try Environment(path: directory.path)
            defer { environment.close() }
            let counts = try #require(try environment.openDatabase("counts", create: false))
            try environment.write { txn in
                _ = try txn.delete(counts, key: Array("te".utf8))
                try txn.put(counts, key: Array("stray".utf8), value: UInt64(1).bigEndianBytes)
            }
        }
        let store = try Store(path: directory.path, options: .init(durability: .process))
        let (te, stray) = (store.changes(type: "te"), store.changes(type: "stray"))
        try await store.rebuildProjections()
        #expect(try store.count(type: "te") == 1 && store.count(type: "stray") == 0)
        store.close()
        #expect(await drained(te).map(\.entityType) == ["te"])
        #expect(await drained(stray).map(\.entityType) == ["stray"])
    }
}
