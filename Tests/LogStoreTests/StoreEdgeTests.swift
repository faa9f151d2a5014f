import Foundation
import LMDB
import LogFormat
@testable import LogStore
import LogTesting
import Synchronization
import Testing

/// Edges of the read and write paths that the model test does not reach.
@Suite struct StoreEdgeTests {
    /// Ids are compared by their bytes, as the keys are: two ids that are
    /// canonically equivalent Unicode (`é` precomposed and `e` + U+0301) are
    /// two entities, and paging past one must not skip the other.
    @Test func pagingPastAnIDDoesNotSkipACanonicallyEquivalentOne() async throws {
        let fixture = try StoreFixture("store-all-equivalent-ids")
        let store = fixture.store
        let decomposed = "e\u{301}"  // 65 CC 81
        let precomposed = "\u{E9}"  // C3 A9
        try await store.create(type: "te", id: decomposed, fields: ["n": 1])
        try await store.create(type: "te", id: "f", fields: ["n": 2])
        try await store.create(type: "te", id: precomposed, fields: ["n": 3])
        #expect(try store.count(type: "te") == 3)
        #expect(try store.all(type: "te").count == 3)
        let first = try store.all(type: "te", limit: 1)
        #expect(first.map { Array($0.id.utf8) } == [Array(decomposed.utf8)])
        let rest = try store.all(type: "te", after: first.last?.id, limit: 10)
        #expect(rest.map { Array($0.id.utf8) } == [Array("f".utf8), Array(precomposed.utf8)])
    }

    /// Paging while entities come and go between pages: a page that starts
    /// after an id deleted since (its record gone, or kept with a pending
    /// delete over a confirmed base) resumes at the next id, ids created
    /// behind the cursor are not seen and those ahead are, and nothing is
    /// repeated; `count` agrees with a walk of every page.
    @Test func pagingAcrossDeletesAndCreatesBetweenPages() async throws {
        let fixture = try StoreFixture("store-all-between-pages")
        let store = fixture.store
        try await store.applyPulledPage(
            (0..<4).map { PulledChange(.upsert, entityType: "te", entityID: "b\($0)", serverVersion: 1, fields: [:]) }, cursor: "c1")
        var batch = WriteBatch()
        for n in 0..<4 { try batch.create(type: "te", id: "d\(n)", fields: [:]) }
        try await store.write(batch)
        let first = try store.all(type: "te", limit: 3).map(\.id)
        #expect(first == ["b0", "b1", "b2"])
        // A pending delete over a confirmed base keeps the record; a
        // pending create's record goes with its delete.
        try await store.delete(type: "te", id: "b2")
        try await store.delete(type: "te", id: "b3")
        try await store.delete(type: "te", id: "d0")
        try await store.create(type: "te", id: "a", fields: [:])
        try await store.create(type: "te", id: "b2x", fields: [:])
        let second = try store.all(type: "te", after: first.last, limit: 2).map(\.id)
        #expect(second == ["b2x", "d1"])
        try await store.delete(type: "te", id: "d1")
        let third = try store.all(type: "te", after: second.last, limit: 10).map(\.id)
        #expect(third == ["d2", "d3"])
        var walked: [String] = []
        var after: String?
        while true {
            let page = try store.all(type: "te", after: after, limit: 2)
            guard let last = page.last else { break }
            walked += page.map(\.id)
            after = last.id
        }
        #expect(walked == ["a", "b0", "b1", "b2x", "d2", "d3"])
        #expect(try store.count(type: "te") == walked.count)
    }

    /// An update that adds a field in another spelling of one the entity
    /// has (U+0065 U+0301 beside U+00E9) is refused by name, as the server
    /// refuses it: the entity would hold both, which no push or pull can
    /// carry in one object. Before, the store took it and showed both; the
    /// server answered the push `VALIDATION_ERROR` later, and a `keepLocal`
    /// that brings an entity back as the app saw it pushed a body the
    /// server refuses whole, with every other change in it.
    @Test func anUpdateAddingAnotherSpellingOfAFieldIsRefused() async throws {
        let fixture = try StoreFixture("store-update-equivalent-name")
        let store = fixture.store
        try await store.create(type: "te", id: "a", fields: ["\u{E9}": 1])
        let error = await #expect(throws: LogStoreError.self) {
            try await store.update(type: "te", id: "a", changes: ["e\u{301}": 2])
        }
        #expect(error?.code == .invalidArgument)
        #expect(String(describing: error).contains("te/a") && String(describing: error).contains("Unicode normalization"))
        try await store.update(type: "te", id: "a", changes: ["\u{E9}": 3])
        #expect(try store.get(type: "te", id: "a")?.fields == ["\u{E9}": 3])
        // Also over a create earlier in the same batch, which commits nothing.
        var batch = WriteBatch()
        try batch.create(type: "te", id: "b", fields: ["e\u{301}": 1])
        try batch.update(type: "te", id: "b", changes: ["\u{E9}": 2])
        await #expect(throws: LogStoreError.self) { try await store.write(batch) }
        #expect(try store.get(type: "te", id: "b") == nil)
    }

    /// An entity too big for one log entry, written by the app or pulled
    /// from a server that breaks the protocol's `entityFieldsBytesMax`, is
    /// refused as an invalid argument naming the entity and the sizes, and
    /// nothing of its batch or page is written. Before, the encoder's
    /// `FormatError` came out, naming the offset the entry would have had
    /// and not the entity.
    @Test func anEntityTooBigForAnEntryIsRefusedByName() async throws {
        let fixture = try StoreFixture("store-entity-too-big")
        let store = fixture.store
        let blob: Fields = ["blob": .bytes([UInt8](repeating: 1, count: Limits.entryBodyBytesMax))]
        try await store.create(type: "te", id: "small", fields: ["n": 1])
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "tr", entityID: "r0", serverVersion: 1)], cursor: "c1")
        let last = try store.log.lastOffset()
        func expectRefused(_ name: String, _ write: () async throws -> Void) async {
            do {
                try await write()
                Issue.record("\(name): written")
            } catch {
                let refused = error as? LogStoreError
                #expect(refused?.code == .invalidArgument, "\(name): \(error)")
                #expect("\(error)".contains(name) && "\(error)".contains("\(Limits.entryBodyBytesMax)"), "\(error)")
            }
        }
        var batch = WriteBatch()
        try batch.create(type: "te", id: "fine", fields: ["n": 2])
        try batch.create(type: "te", id: "big", fields: blob)
        await expectRefused("te/big") { try await store.write(batch) }
        await expectRefused("te/small") { try await store.update(type: "te", id: "small", changes: blob) }
        await expectRefused("tr/r1") {
            try await store.applyPulledPage(
                [PulledChange(.upsert, entityType: "tr", entityID: "r0", serverVersion: 2, fields: ["v": 2]),
                 PulledChange(.upsert, entityType: "tr", entityID: "r1", serverVersion: 1, fields: blob)],
                cursor: "c2")
        }
        #expect(try store.log.lastOffset() == last)
        #expect(try store.get(type: "te", id: "fine") == nil)
        #expect(try store.get(type: "tr", id: "r0")?.serverVersion == 1)
        #expect(try store.pullCursor() == "c1")
        try await store.create(type: "te", id: "after", fields: ["n": 3])
        #expect(try store.log.lastOffset() == last + 1)
    }

    /// A store holding te/a, reopened after its `counts` row `key` was set
    /// to `value` behind its back.
    private func storeWithACountsRow(key: [UInt8], value: [UInt8]) async throws -> (TemporaryDirectory, Store) {
        let directory = try TemporaryDirectory("store-counts-damage")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            store.close()
        }
        try putRaw(directory.path, database: "counts", key: key, value: value)
        return (directory, try Store(path: directory.path, options: .init(durability: .process)))
    }

    /// A damaged `counts` value is reported as damage, not a trap: a u64
    /// with its top bit set does not fit an `Int`, a value of 3 bytes is
    /// no u64, and `Int.max` fits one but has no room for the next entity
    /// (adding 1 to it trapped). Each names the table and its row, as the
    /// other tables' damage does: it said "the visible count of te".
    @Test(arguments: [
        ([0xFF, 0, 0, 0, 0, 0, 0, 1], "counts: the row of te is damaged: 8 bytes, not a u64 of 8 that fits an Int"),
        ([0, 0, 1], "counts: the row of te is damaged: 3 bytes, not a u64 of 8 that fits an Int"),
        ([0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF], "counts: the row of te holds \(Int.max), with no room for one more"),
    ] as [([UInt8], String)])
    func aDamagedCountIsDamageNotATrap(value: [UInt8], message: String) async throws {
        let (directory, store) = try await storeWithACountsRow(key: Array("te".utf8), value: value)
        defer { store.close(); directory.remove() }
        if value[0] & 0x80 != 0 || value.count != 8 {
            let error = #expect(throws: LogStoreError.self) { try store.count(type: "te") }
            #expect(error?.code == .corruptEntry && error?.detail == message, "\(String(describing: error))")
        }
        let writeError = await #expect(throws: LogStoreError.self) { try await store.create(type: "te", id: "b", fields: [:]) }
        #expect(writeError?.code == .corruptEntry && writeError?.detail == message, "\(String(describing: writeError))")
    }

    /// A `counts` key that is not UTF-8 is named as damage by
    /// `entityTypes()`: it was read as text, with a replacement character,
    /// and listed as a type no entity has.
    @Test func aCountsKeyThatIsNotUTF8IsNamed() async throws {
        let (directory, store) = try await storeWithACountsRow(key: [0x74, 0xFF], value: UInt64(1).bigEndianBytes)
        defer { store.close(); directory.remove() }
        let error = #expect(throws: LogStoreError.self) { try store.entityTypes() }
        #expect(error?.code == .corruptEntry && error?.detail == "counts: a key of 2 bytes (74ff), not an entity type in UTF-8", "\(String(describing: error))")
    }

    /// A damaged projection watermark is reported when the store opens: as
    /// the largest offset it trapped (nothing follows it), as a value of the
    /// wrong length it read as 0 and applied the whole log again over the
    /// tables, and past the log's end it left later entries unprojected.
    @Test func aDamagedProjectionWatermarkIsReportedOnOpen() async throws {
        let damaged: [(name: String, value: [UInt8])] = [
            ("largest", [UInt8](repeating: 0xFF, count: 8)), ("short", [0, 0, 1]), ("past-the-end", [0, 0, 0, 0, 0, 0, 0, 9]),
        ]
        for (name, value) in damaged {
            let directory = try TemporaryDirectory("store-watermark-\(name)")
            do {
                let store = try Store(path: directory.path, options: .init(durability: .process))
                try await store.create(type: "te", id: "a", fields: ["n": 1])
                try await store.create(type: "te", id: "b", fields: ["n": 2])
                store.close()
            }
            try putRaw(directory.path, database: "meta", key: Array("projection-watermark".utf8), value: value)
            let error = #expect(throws: LogStoreError.self, "\(name)") {
                try Store(path: directory.path, options: .init(durability: .process)).close()
            }
            #expect(error?.code == .corruptEntry, "\(name)")
            #expect(error?.detail.contains("projection watermark") == true, "\(name): \(String(describing: error))")
        }
    }

    private final class Flag: Sendable {
        let value = Atomic<Bool>(false)
    }

    /// Store writes made while `rebuildProjections` runs publish their own
    /// events; the rebuild publishes none, as the entries it replays were
    /// delivered when first written.
    @Test func writesDuringARebuildDoNotRepeatPastEvents() async throws {
        let fixture = try StoreFixture("store-rebuild-events")
        let store = fixture.store
        let events = store.events()
        for n in 0..<40 { try await store.create(type: "te", id: "e\(n)", fields: [:]) }
        let first = try #require(try store.outbox().first)
        try await store.record([(first.offset, .rejected(code: "VALIDATION_ERROR", message: "no"))])
        let done = Flag()
        let rebuild = Task {
            defer { done.value.store(true, ordering: .releasing) }
            try await store.rebuildProjections(entriesPerTransaction: 1)
        }
        var writes = 0
        while !done.value.load(ordering: .acquiring) {
            try await store.create(type: "tw", id: "w\(writes)", fields: [:])
            writes += 1
        }
        try await rebuild.value
        #expect(writes > 0)
        #expect(try store.count(type: "te") == 39)
        #expect(try store.count(type: "tw") == writes)
        store.close()
        var rejected = 0
        for await event in events {
            if case .rejected = event { rejected += 1 }
        }
        #expect(rejected == 1, "after \(writes) writes during the rebuild")
    }
}

extension StoreEdgeTests {
    /// A store released without `close()` still ends its streams: its log
    /// closes in `deinit`, and a `for await` over `changes(type:)` or
    /// `events()` must not wait forever for a commit that cannot come.
    @Test func aStoreReleasedWithoutCloseEndsItsStreams() async throws {
        let directory = try TemporaryDirectory("store-release-streams")
        var store: Store? = try Store(path: directory.path, options: .init(durability: .process))
        let changes = try #require(store).changes(type: "te")
        let events = try #require(store).events()
        try await store?.create(type: "te", fields: [:])
        weak let released = store
        store = nil
        #expect(released == nil)
        let ended = await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                for await _ in changes {}
                for await _ in events {}
                return true
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(60))
                return false
            }
            let first = await group.next() ?? false
            group.cancelAll()
            return first
        }
        #expect(ended, "the streams of a released store never ended")
    }
}

extension StoreEdgeTests {
    /// Offsets run to 2^64 - 1 (`Format/limits.md`). A log whose last entry
    /// has that offset (an import can make one) is read, replayed and
    /// verified like any other; an append, which has no offset left to
    /// take, is refused with an error rather than an overflow trap. The log
    /// fills one scan chunk exactly, so the scanner looks past its last
    /// entry for more.
    @Test func aLogAtTheLastOffsetIsReadAndRefusesAppends() async throws {
        var fixture = try StoreFixture("store-last-offset")
        let count = UInt64(EventLog.scanChunkCountMax)
        let entries = (0..<count).map { index in
            Entry(
                offset: .max - count + 1 + index, timestamp: HybridTimestamp(rawValue: (1 + index) << 16),
                body: .resync(reason: "imported"))
        }
        try await fixture.store.restore(entries, compactedBelow: .max - count + 1)
        try fixture.reopen()
        let store = fixture.store
        var scanner = store.log.entries(from: 1)
        var offsets: [UInt64] = []
        while let entry = try scanner.next(), offsets.count <= count { offsets.append(entry.offset) }
        // Counted, not listed: a failure would print a thousand offsets.
        #expect(offsets.count == entries.count && offsets.elementsEqual(entries.map(\.offset)), "\(offsets.count) read")
        let verified = try store.log.verifyEntries()
        #expect(verified.checked == Int(count) && verified.problems.isEmpty, "\(verified.problems)")
        let error = await #expect(throws: LogStoreError.self) { try await store.create(type: "te", fields: [:]) }
        #expect(error?.code == .logFull)
        #expect(error?.description.contains("18446744073709551615") == true, "\(String(describing: error))")
        #expect(try store.count(type: "te") == 0)
        try await store.rebuildProjections()
    }

    /// Each appended entry's timestamp is greater than the last one's
    /// (`storage.md` section 10). After an imported entry at the last
    /// timestamp there is none: the append is refused, where it wrote a
    /// second entry with the same timestamp.
    @Test func aLogAtTheLastTimestampRefusesAppends() async throws {
        var fixture = try StoreFixture("store-last-timestamp")
        let entry = Entry(offset: 1, timestamp: HybridTimestamp(rawValue: .max), body: .resync(reason: "imported"))
        try await fixture.store.restore([entry], compactedBelow: 0)
        try fixture.reopen()
        let error = await #expect(throws: LogStoreError.self) { try await fixture.store.create(type: "te", fields: [:]) }
        #expect(error?.code == .logFull)
        #expect(error?.description.contains("timestamp") == true, "\(String(describing: error))")
        #expect(try fixture.store.log.lastOffset() == 1)
    }

    /// An import keeps the log's rule that each timestamp is greater than
    /// the last (`storage.md` section 10): an entry with the same timestamp
    /// as the one before it is refused, naming it, and nothing is written.
    /// The entries an import writes count in the log's statistics.
    @Test func anImportRefusesARepeatedTimestamp() async throws {
        let fixture = try StoreFixture("store-import-same-timestamp")
        let store = fixture.store
        let entries = (1...3).map { offset in
            Entry(
                offset: UInt64(offset), timestamp: HybridTimestamp(rawValue: offset == 3 ? 2 << 16 : UInt64(offset) << 16),
                body: .resync(reason: "imported"))
        }
        let error = await #expect(throws: LogStoreError.self) { try await store.restore(entries, compactedBelow: 0) }
        #expect(error?.code == .invalidArgument)
        #expect(error?.offset == 3)
        #expect(error?.detail.contains("entry 3 of the import, at offset 3") == true, "\(String(describing: error))")
        #expect(try store.log.lastOffset() == 0)
        #expect(store.log.statistics.entries == 0)

        try await store.restore(Array(entries.prefix(2)), compactedBelow: 0)
        #expect(try store.log.lastOffset() == 2)
        #expect(store.log.statistics.entries == 2)
    }

    /// Holes below the compaction watermark may be of any width (an import
    /// can make them). Replay flagged every offset between two pending
    /// intents: across 2^63 offsets it trapped, and across 2^33 it would
    /// have allocated 8 GB. Both intents stay pending, through a replay too.
    @Test func aHoleWiderThanMemoryBetweenPendingIntentsReplays() async throws {
        let fixture = try StoreFixture("store-wide-hole")
        let store = fixture.store
        let far: UInt64 = 1 << 63 + 2
        let entries = [(1, "a"), (far, "b"), (far + 1, "c")].enumerated().map { index, intent in
            Entry(
                offset: intent.0, timestamp: HybridTimestamp(rawValue: UInt64(1 + index) << 16),
                body: .intent(Intent(.create, idempotencyKey: "k-\(intent.1)", entityType: "te", entityID: intent.1, fields: [:])))
        }
        try await store.restore(entries, compactedBelow: far)
        let tables = try store.derivedTables()
        #expect(try store.outbox().map(\.offset) == [1, far, far + 1])
        try await store.rebuildProjections(entriesPerTransaction: 2)
        #expect(try store.derivedTables() == tables)
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == tables)
        #expect(try store.count(type: "te") == 3)
    }

    /// An import writes into an empty store only: into one with entries it
    /// is refused, and nothing is written, also when its offsets would
    /// follow the store's last one (appended, they would mix two logs).
    @Test func anImportIntoAStoreWithEntriesIsRefused() async throws {
        let fixture = try StoreFixture("store-import-not-empty")
        defer { fixture.directory.remove() }
        let store = fixture.store
        defer { store.close() }
        try await store.create(type: "te", id: "a", fields: [:])
        let entry = Entry(offset: 2, timestamp: HybridTimestamp(rawValue: .max >> 1), body: .resync(reason: "imported"))
        let error = await #expect(throws: LogStoreError.self) { try await store.restore([entry], compactedBelow: 0) }
        #expect(error?.code == .invalidArgument)
        #expect(error?.detail.contains("import needs an empty store") == true, "\(String(describing: error))")
        #expect(try store.log.lastOffset() == 1)
    }

    /// The compaction watermark of an import is at most its last offset or
    /// 1, whichever is more, as compaction's: an empty log compacted below 1
    /// (what an export of one holds) is imported as it was, and verifies.
    @Test func anEmptyImportCompactedBelowOneIsTaken() async throws {
        var fixture = try StoreFixture("store-import-empty-compacted")
        defer { fixture.directory.remove() }
        try await fixture.store.restore([], compactedBelow: 1)
        try fixture.reopen()
        #expect(try fixture.store.compactedBelow() == 1)
        #expect(try fixture.store.log.lastOffset() == 0)
        fixture.store.close()
    }

    /// A pulled change at server version 0 (a writer never appends one, an
    /// import refuses one, but a log written by other software may hold
    /// one) is stale (`Format/storage.md` section 15, `remote`: "a reader
    /// that meets one treats ... the version 0 as stale"), also for an
    /// entity the server never confirmed: it gives no base, and the entity
    /// stays absent, in the tables kept on open and in a replay. Its cursor
    /// is still the store's.
    @Test func aPulledChangeAtVersionZeroWrittenByOtherSoftwareIsStale() async throws {
        var fixture = try StoreFixture("store-remote-version-zero")
        fixture.store.close()
        let entry = Entry(
            offset: 1, timestamp: HybridTimestamp(rawValue: 1 << 16),
            body: .remote(Remote(cursor: "c1", .upsert, entityType: "te", entityID: "a", serverVersion: 0, fields: ["x": 1])))
        try putRaw(fixture.directory.path, database: "log", key: OffsetKey.encode(1), value: try EntryCodec.encode(entry))
        fixture.store = try Store(path: fixture.directory.path, options: .init(durability: .process))
        let store = fixture.store
        #expect(try store.get(type: "te", id: "a") == nil)
        #expect(try store.count(type: "te") == 0)
        let tables = try store.derivedTables()
        #expect(tables.entities.isEmpty && tables.watermark == 1)
        #expect(try store.pullCursor() == "c1")
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == tables)
    }
}

extension StoreEdgeTests {
    /// No offset follows the last, 2^64 - 1: an import with an entry after
    /// one there (here at that offset again, with a later timestamp) is
    /// refused with an error naming the entry, and nothing is written. The
    /// offset expected next wraps to 0 there rather than trapping on
    /// overflow, and an entry that does not ascend is never put.
    @Test func anImportWithAnEntryAfterTheLastOffsetIsRefused() async throws {
        let fixture = try StoreFixture("store-import-past-last-offset")
        defer { fixture.directory.remove() }
        let store = fixture.store
        defer { store.close() }
        let entries = (1...2).map { index in
            Entry(offset: .max, timestamp: HybridTimestamp(rawValue: UInt64(index) << 16), body: .resync(reason: "imported"))
        }
        let error = await #expect(throws: LogStoreError.self) { try await store.restore(entries, compactedBelow: .max) }
        #expect(error?.code == .invalidArgument && error?.offset == .max, "\(String(describing: error))")
        #expect(error?.detail.contains("entry 2 of the import, at offset 18446744073709551615") == true, "\(String(describing: error))")
        #expect(try store.log.lastOffset() == 0)
    }

    /// An entry of an import that breaks a rule of what the log may hold
    /// (here an intent with no entity type) is refused naming it by its
    /// place and its offset, the error's `offset` included, as an entry out
    /// of order is; the rule's own error has no offset.
    @Test func anImportRefusesAnInvalidEntryNamingItsOffset() async throws {
        let fixture = try StoreFixture("store-import-invalid-entry")
        defer { fixture.directory.remove() }
        let store = fixture.store
        defer { store.close() }
        let entries = [
            Entry(offset: 1, timestamp: HybridTimestamp(rawValue: 1 << 16), body: .resync(reason: "imported")),
            Entry(
                offset: 2, timestamp: HybridTimestamp(rawValue: 2 << 16),
                body: .intent(Intent(.create, idempotencyKey: "k", entityType: "", entityID: "a", fields: [:]))),
        ]
        let error = await #expect(throws: LogStoreError.self) { try await store.restore(entries, compactedBelow: 0) }
        #expect(error?.code == .invalidArgument && error?.offset == 2, "\(String(describing: error))")
        #expect(error?.detail.hasPrefix("entry 2 of the import, at offset 2: ") == true, "\(String(describing: error))")
        #expect(try store.log.lastOffset() == 0)
    }

    /// Each imported entry's timestamp is greater than the one before it;
    /// the first has none before it, so any timestamp is taken, 0 too (a
    /// log written by other software may start there), and the next must
    /// still be greater.
    @Test func anImportsFirstEntryMayHaveTimestampZero() async throws {
        let fixture = try StoreFixture("store-import-timestamp-zero")
        defer { fixture.directory.remove() }
        let store = fixture.store
        defer { store.close() }
        let entries = (0...1).map { index in
            Entry(offset: UInt64(index + 1), timestamp: HybridTimestamp(rawValue: UInt64(index)), body: .resync(reason: "imported"))
        }
        try await store.restore(entries, compactedBelow: 0)
        #expect(try scanAll(store.log).map(\.timestamp.rawValue) == [0, 1])
    }
}
