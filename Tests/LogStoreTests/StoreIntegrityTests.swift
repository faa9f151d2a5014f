import Foundation
import LMDB
import LogFormat
@testable import LogStore
import LogTesting
import Testing

/// A store refuses what is not a store, says what is wrong with a damaged
/// one, and never trips over bad bytes.
@Suite struct StoreIntegrityTests {
    private func key(_ offset: UInt64) -> [UInt8] { withUnsafeBytes(of: offset.bigEndian) { Array($0) } }

    /// Writes `count` entries, closes the log, and hands its raw LMDB
    /// environment and log table to `damage`.
    private func damagedStore(
        _ name: String, count: Int, damage: (borrowing Transaction, Database) throws -> Void
    ) async throws -> TemporaryDirectory {
        let directory = try TemporaryDirectory(name)
        do {
            let log = try EventLog(path: directory.path)
            _ = try await log.append(contentsOf: (1...count).map { intent($0) })
            log.close()
        }
        let environment = try Environment(path: directory.path)
        let table = try #require(try environment.openDatabase("log", create: false))
        try environment.write { txn in try damage(txn, table) }
        environment.close()
        return directory
    }

    @Test func aFlippedByteIsReportedWithItsOffset() async throws {
        let directory = try await damagedStore("integrity-flip", count: 10) { txn, table in
            var bytes = try #require(try txn.get(table, key: key(7)))
            bytes[bytes.count - 1] ^= 0x40
            try txn.put(table, key: key(7), value: bytes)
        }
        let log = try EventLog(path: directory.path)
        let error = #expect(throws: LogStoreError.self) { try scanAll(log) }
        #expect(error?.code == .corruptEntry)
        #expect(error?.offset == 7)
        #expect(error?.formatError?.code == .badChecksum)
        #expect(error?.description.contains("offset 7") == true)
        #expect(try log.entry(at: 6)?.body == intent(6))
        #expect(throws: LogStoreError.self) { try log.entry(at: 7) }
        // A scanner reads up to the damage and stays there.
        var scanner = log.entries()
        for n in 1...6 { #expect(try scanner.next()?.body == intent(n)) }
        for _ in 0..<2 {
            #expect(throws: LogStoreError.self) { try scanner.next() }
            #expect(scanner.nextOffset == 7)
        }
    }

    @Test func aLogKeyThatIsNotAnOffsetIsReportedAfterTheEntriesBeforeIt() async throws {
        // Nine bytes: it sorts after offset 5's key and before offset 6's.
        let directory = try await damagedStore("integrity-bad-key", count: 10) { txn, table in
            try txn.put(table, key: key(5) + [0], value: [1, 2, 3])
        }
        let log = try EventLog(path: directory.path)
        var scanner = log.entries()
        for n in 1...5 { #expect(try scanner.next()?.body == intent(n)) }
        for _ in 0..<2 {
            let error = #expect(throws: LogStoreError.self) { try scanner.next() }
            #expect(error?.code == .corruptEntry)
            #expect(error?.description.contains("log: a key of 9 bytes (000000000000000500), not an offset of 8") == true, "\(String(describing: error))")
        }
        // `verifyEntries` (`logtool verify`) names the key by its bytes too.
        let problems = try log.verifyEntries().problems
        #expect(problems.map(\.message).contains("a key of 9 bytes (000000000000000500), not an offset of 8"), "\(problems)")
    }

    /// `verifyEntries` goes on past a key that is not an offset: it names
    /// the key once and checks every entry after it, so damage further on
    /// is reported too. Stuck on the key, it would list it until the
    /// problem count ran out and never reach the rest of the log.
    @Test func verifyNamesAKeyThatIsNotAnOffsetOnceAndChecksTheEntriesAfterIt() async throws {
        let directory = try await damagedStore("integrity-verify-bad-key", count: 10) { txn, table in
            try txn.put(table, key: key(5) + [0], value: [1, 2, 3])
            var bytes = try #require(try txn.get(table, key: key(8)))
            bytes[bytes.count - 1] ^= 0x40
            try txn.put(table, key: key(8), value: bytes)
        }
        defer { directory.remove() }
        let log = try EventLog(path: directory.path, options: .inspecting)
        defer { log.close() }
        let (checked, problems) = try log.verifyEntries()
        #expect(checked == 11)
        #expect(problems.map(\.offset) == [nil, 8], "\(problems.prefix(3))")
        #expect(problems.first?.message == "a key of 9 bytes (000000000000000500), not an offset of 8", "\(problems.prefix(3))")
    }

    /// A key that is not an offset, met first by a scan (here one that
    /// starts past the last entry, as a reader waiting for the next one
    /// does), is reported: it is not the end of the log.
    @Test func aLogKeyThatIsNotAnOffsetMetFirstIsReported() async throws {
        let directory = try await damagedStore("integrity-bad-key-first", count: 10) { txn, table in
            try txn.put(table, key: key(12) + [0], value: [1, 2, 3])
        }
        let log = try EventLog(path: directory.path, options: .inspecting)
        defer { log.close() }
        var scanner = log.entries(from: 11)
        for _ in 0..<2 {
            let error = #expect(throws: LogStoreError.self) { try scanner.next() }
            #expect(error?.code == .corruptEntry)
            #expect(error?.description.contains("log: a key of 9 bytes (000000000000000c00), not an offset of 8") == true, "\(String(describing: error))")
            #expect(scanner.nextOffset == 11)
        }
    }

    /// A scan reads the log a chunk per read transaction. The next chunk
    /// starts just past the last key read, not at the next offset's key, so
    /// a key between the two that is not an offset is reported wherever the
    /// chunks end. Started at the next offset's key, the scan stepped over
    /// it and read the whole log as sound.
    @Test func aLogKeyBetweenTwoChunksIsReported() async throws {
        let last = UInt64(EventLog.scanChunkCountMax)
        let directory = try await damagedStore("integrity-bad-key-between-chunks", count: Int(last) + 5) { txn, table in
            try txn.put(table, key: key(last) + [0], value: [1, 2, 3])
        }
        let log = try EventLog(path: directory.path, options: .inspecting)
        defer { log.close() }
        var scanner = log.entries()
        for n in 1...last { #expect(try scanner.next()?.offset == n) }
        let error = #expect(throws: LogStoreError.self) { try scanner.next() }
        #expect(error?.code == .corruptEntry)
        #expect(error?.description.contains("log: a key of 9 bytes (000000000000040000), not an offset of 8") == true, "\(String(describing: error))")
        #expect(scanner.nextOffset == last + 1)
    }

    /// Replay reads the log a chunk per transaction too: a key that is not
    /// an offset fails the rebuild (whose tables in use stay), wherever the
    /// chunks end; one ending just before the key stepped over it.
    @Test(arguments: [Store.replayChunkCountMax, 3])
    func aLogKeyThatIsNotAnOffsetFailsARebuild(entriesPerTransaction: Int) async throws {
        let directory = try TemporaryDirectory("integrity-bad-key-rebuild")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            for n in 1...5 { try await store.create(type: "te", id: "t\(n)", fields: ["n": .int(Int64(n))]) }
            store.close()
        }
        do {
            let environment = try Environment(path: directory.path)
            defer { environment.close() }
            let table = try #require(try environment.openDatabase("log", create: false))
            try environment.write { txn in try txn.put(table, key: key(3) + [0], value: [1, 2, 3]) }
        }
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        let error = await #expect(throws: LogStoreError.self) {
            try await store.rebuildProjections(entriesPerTransaction: entriesPerTransaction)
        }
        #expect(error?.code == .corruptEntry)
        #expect(error?.description.contains("log: a key of 9 bytes (000000000000000300), not an offset of 8") == true, "\(String(describing: error))")
        #expect(try store.count(type: "te") == 5)
        #expect(try store.rebuildWatermark() == nil)
    }

    @Test func aDamagedLastEntryIsReportedAtOpen() async throws {
        let directory = try await damagedStore("integrity-last", count: 3) { txn, table in
            try txn.put(table, key: key(3), value: [1, 2, 3])
        }
        // A refused open leaves nothing open behind it (the environment,
        // the writer lock), so the next is refused for the same reason, not
        // as a second open or another writer.
        for _ in 0..<2 {
            let error = #expect(throws: LogStoreError.self) { try EventLog(path: directory.path) }
            #expect(error?.code == .corruptEntry)
            #expect(error?.offset == 3)
        }
    }

    /// Only a writer needs the last entry at open (it appends after it). A
    /// read-only open succeeds, so the entries before it can be read and
    /// `verifyEntries` can list the damage; reading the log's end fails.
    @Test func aReadOnlyOpenLeavesADamagedLastEntryToTheReadsThatMeetIt() async throws {
        let directory = try await damagedStore("integrity-last-read-only", count: 3) { txn, table in
            try txn.put(table, key: key(3), value: [1, 2, 3])
        }
        let log = try EventLog(path: directory.path, options: .inspecting)
        defer { log.close() }
        #expect(try log.entry(at: 2)?.body == intent(2))
        let error = #expect(throws: LogStoreError.self) { try log.lastOffset() }
        #expect(error?.code == .corruptEntry && error?.offset == 3)
        let (checked, problems) = try log.verifyEntries()
        #expect(checked == 3 && problems.map(\.offset) == [3], "\(problems)")
    }

    @Test func aMissingEntryIsAGap() async throws {
        let directory = try await damagedStore("integrity-gap", count: 10) { txn, table in
            try txn.delete(table, key: key(4))
        }
        let log = try EventLog(path: directory.path)
        let error = #expect(throws: LogStoreError.self) { try scanAll(log) }
        #expect(error?.code == .gap)
        #expect(error?.offset == 4)
    }

    /// storage.md section 4, "Density", at the watermark C: with entries 3
    /// to 5 missing, C = 6 makes key 6 follow 2 (6 > 3 and 6 <= C); C = 5
    /// leaves a gap, reported at 3. (A value that is not 8 bytes is damage:
    /// `aDamagedCompactionWatermarkIsNamed`.)
    @Test(arguments: [("C = 6", [0, 0, 0, 0, 0, 0, 0, 6], nil), ("C = 5", [0, 0, 0, 0, 0, 0, 0, 5], 3)] as [(String, [UInt8], UInt64?)])
    func holesAreLegalExactlyBelowTheWatermark(shape: String, watermark: [UInt8], gapAt: UInt64?) async throws {
        let directory = try await damagedStore("integrity-holes", count: 10) { txn, table in
            for offset: UInt64 in 3...5 { _ = try txn.delete(table, key: key(offset)) }
        }
        defer { directory.remove() }
        try putRaw(directory.path, database: "meta", key: Array("compacted-below".utf8), value: watermark)
        let log = try EventLog(path: directory.path)
        defer { log.close() }
        if let gapAt {
            let error = #expect(throws: LogStoreError.self, "\(shape)") { try scanAll(log) }
            #expect(error?.code == .gap && error?.offset == gapAt, "\(shape): \(String(describing: error))")
        } else {
            #expect(try scanAll(log).map(\.offset) == [1, 2, 6, 7, 8, 9, 10])
        }
    }

    /// `verifyEntries` (`logtool verify`) holds the log to the density rule
    /// a scan does, watermark C included: with entries 3 to 5 missing, C = 6
    /// makes them holes compaction left, and C = 5 (or no compaction) leaves
    /// 3 to 5 missing, one problem at 3. Nothing else checked it: a verify
    /// that passed every hole, or none at C, went unnoticed.
    @Test(arguments: [(6, false), (5, true), (0, true)] as [(UInt64, Bool)])
    func verifyReportsAHoleExactlyWhereAScanFindsAGap(watermark: UInt64, missing: Bool) async throws {
        let directory = try await damagedStore("integrity-verify-holes", count: 10) { txn, table in
            for offset: UInt64 in 3...5 { _ = try txn.delete(table, key: key(offset)) }
        }
        defer { directory.remove() }
        if watermark > 0 {
            try putRaw(directory.path, database: "meta", key: Array("compacted-below".utf8), value: watermark.bigEndianBytes)
        }
        let log = try EventLog(path: directory.path, options: .inspecting)
        defer { log.close() }
        let (checked, problems) = try log.verifyEntries()
        #expect(checked == 7)
        let expected = missing ? ["log at offset 3: missing: the next entry is at offset 6"] : []
        #expect(problems.map(\.description) == expected, "C = \(watermark)")
    }

    /// Compaction's watermark is at most the last offset (storage.md
    /// section 4). Past it (here 15 in a log of 10), an entry later lost
    /// at 11 would be taken for a hole compaction left: `verifyEntries`
    /// (`logtool verify`) reports it, and one at the last offset passes.
    @Test(arguments: [(15, true), (10, false)] as [(UInt64, Bool)])
    func aWatermarkPastTheLastOffsetIsReported(watermark: UInt64, reported: Bool) async throws {
        let directory = try await damagedStore("integrity-watermark-past-end", count: 10) { _, _ in }
        defer { directory.remove() }
        try putRaw(directory.path, database: "meta", key: Array("compacted-below".utf8), value: watermark.bigEndianBytes)
        let log = try EventLog(path: directory.path)
        defer { log.close() }
        let (checked, problems) = try log.verifyEntries()
        #expect(checked == 10)
        let expected = reported ? ["meta: compacted-below is 15, past the log's last offset 10"] : []
        #expect(problems.map(\.description) == expected)
    }

    /// The bound is the last offset or 1, whichever is more: an empty log
    /// may be compacted below 1 (`compact(below:)` and an import allow it),
    /// and `verifyEntries` finds nothing wrong with it, also after a
    /// reopen. Held to the last offset alone, a sound store was reported.
    @Test func anEmptyLogCompactedBelowOneVerifies() async throws {
        var fixture = try StoreFixture("integrity-verify-empty-compacted")
        defer { fixture.store.close() }
        _ = try await fixture.store.compact(below: 1)
        for _ in 0..<2 {
            #expect(try fixture.store.compactedBelow() == 1)
            let (checked, problems) = try fixture.store.log.verifyEntries()
            #expect(checked == 0 && problems == [], "\(problems)")
            try fixture.reopen()
        }
    }

    /// storage.md sections 4 and 16 (step 6): a reader checks a record's
    /// key, then that it may follow the offset expected, then decodes it.
    /// With 3 missing and 4 damaged, a scan reports the gap at 3, not the
    /// damage it would meet only by decoding 4 first.
    @Test func aGapIsReportedBeforeTheEntryAfterItIsDecoded() async throws {
        let directory = try await damagedStore("integrity-gap-order", count: 5) { txn, table in
            try txn.delete(table, key: key(3))
            var fourth = try #require(try txn.get(table, key: key(4)))
            fourth[fourth.count - 1] ^= 0x01
            try txn.put(table, key: key(4), value: fourth)
        }
        let log = try EventLog(path: directory.path)
        let error = #expect(throws: LogStoreError.self) { try scanAll(log) }
        #expect(error?.code == .gap, "\(String(describing: error))")
        #expect(error?.offset == 3)
    }

    @Test func anEntryUnderTheWrongKeyIsCaught() async throws {
        let directory = try await damagedStore("integrity-moved", count: 5) { txn, table in
            let second = try #require(try txn.get(table, key: key(2)))
            try txn.put(table, key: key(3), value: second)
        }
        let log = try EventLog(path: directory.path)
        let error = #expect(throws: LogStoreError.self) { try scanAll(log) }
        #expect(error?.formatError?.code == .offsetMismatch)
    }

    @Test func anotherLMDBEnvironmentIsNotAStore() throws {
        let directory = try TemporaryDirectory("integrity-other")
        try putRaw(directory.path, database: "accounts", key: [1], value: [2], create: true)
        let error = #expect(throws: LogStoreError.self) { try EventLog(path: directory.path) }
        #expect(error?.code == .notAStore)
        #expect(error?.description.contains(directory.path) == true)
    }

    @Test(arguments: [false, true])
    func aDataFileThatIsNotLMDBsIsNotAStore(readOnly: Bool) throws {
        let directory = try TemporaryDirectory("integrity-not-lmdb")
        let text = Data(String(repeating: "not a database\n", count: 600).utf8)
        _ = FileManager.default.createFile(atPath: directory.appending("data.mdb"), contents: text)
        let error = #expect(throws: LogStoreError.self) {
            try EventLog(path: directory.path, options: EventLog.Options(readOnly: readOnly))
        }
        #expect(error?.code == .notAStore)
        #expect(error?.description.contains(directory.path) == true)
        #expect(error?.description.contains("data.mdb is not an LMDB file") == true)
        // The file is as it was, and nothing was left beside it.
        #expect(FileManager.default.contents(atPath: directory.appending("data.mdb")) == text)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["data.mdb"])
    }

    /// A store opened without creating one (read-only, or with
    /// `createIfMissing` off) refuses a directory with no `data.mdb` and a
    /// path with nothing there as "not a sync store", saying which, and
    /// creates nothing in either.
    @Test(arguments: [(true, true), (true, false), (false, false)])
    func aPathWithoutAStoreIsRefusedWhenNotCreating(readOnly: Bool, createIfMissing: Bool) throws {
        let directory = try TemporaryDirectory("integrity-empty")
        _ = FileManager.default.createFile(atPath: directory.appending("notes.txt"), contents: Data("hi".utf8))
        var options = EventLog.Options(readOnly: readOnly)
        options.createIfMissing = createIfMissing
        let error = #expect(throws: LogStoreError.self) { try EventLog(path: directory.path, options: options) }
        #expect(error?.code == .notAStore)
        #expect(error?.detail == "no data.mdb in the directory")
        let missing = directory.appending("missing")
        let missingError = #expect(throws: LogStoreError.self) { try EventLog(path: missing, options: options) }
        #expect(missingError?.code == .notAStore)
        #expect(missingError?.detail == "no such directory")
        // Nothing was created in a directory that is not ours.
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["notes.txt"])
    }

    /// storage.md section 3: a new store's marker is the magic (`SYNCLOG`
    /// and a zero byte) and the store version 1 as a `u32`, and its
    /// `store-id` is 16 bytes, a UUIDv7 (version bits `0111`).
    @Test func aNewStoreWritesTheSpecifiedMarker() throws {
        let directory = try TemporaryDirectory("integrity-marker")
        defer { directory.remove() }
        do {
            let log = try EventLog(path: directory.path)
            log.close()
        }
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let meta = try #require(try environment.openDatabase("meta", create: false))
        let format = try environment.read { txn in try txn.get(meta, key: Array("format".utf8)) }
        let storeID = try environment.read { txn in try txn.get(meta, key: Array("store-id".utf8)) }
        #expect(format == [0x53, 0x59, 0x4e, 0x43, 0x4c, 0x4f, 0x47, 0x00, 0x00, 0x00, 0x00, 0x01])
        #expect(storeID?.count == 16 && storeID.map { $0[6] >> 4 } == 7, "\(String(describing: storeID))")
    }

    /// storage.md section 3, "Opening a store", step 2: a `format` key that
    /// is absent, not exactly 12 bytes, or without the magic is not a sync
    /// store ("not a sync store", not "unsupported format").
    @Test(arguments: [
        ("absent", nil), ("another magic", Array("SYNCLOG!".utf8) + [0, 0, 0, 1]),
        ("11 bytes", Array("SYNCLOG\0".utf8) + [0, 0, 1]), ("13 bytes", Array("SYNCLOG\0".utf8) + [0, 0, 0, 1, 0]),
    ] as [(String, [UInt8]?)])
    func aDamagedMarkerIsNotAStore(damage: String, marker: [UInt8]?) throws {
        let directory = try TemporaryDirectory("integrity-marker-damaged")
        defer { directory.remove() }
        do {
            let log = try EventLog(path: directory.path)
            log.close()
        }
        do {
            let environment = try Environment(path: directory.path)
            defer { environment.close() }
            let meta = try #require(try environment.openDatabase("meta", create: false))
            try environment.write { txn in
                if let marker { try txn.put(meta, key: Array("format".utf8), value: marker) } else { _ = try txn.delete(meta, key: Array("format".utf8)) }
            }
        }
        for readOnly in [false, true] {
            let error = #expect(throws: LogStoreError.self, "\(damage)") {
                try EventLog(path: directory.path, options: EventLog.Options(readOnly: readOnly))
            }
            #expect(error?.code == .notAStore, "\(damage), read-only \(readOnly): \(String(describing: error))")
        }
    }

    @Test func aNewerStoreVersionIsRefused() throws {
        let directory = try TemporaryDirectory("integrity-version")
        do {
            let log = try EventLog(path: directory.path)
            log.close()
        }
        try putRaw(directory.path, database: "meta", key: Array("format".utf8), value: Array("SYNCLOG\0".utf8) + [0, 0, 0, 2])
        let error = #expect(throws: LogStoreError.self) { try EventLog(path: directory.path) }
        #expect(error?.code == .unsupportedFormat)
        #expect(error?.detail.contains("version 2") == true)
    }

    /// A writable open that is refused lets go of the writer lock, and
    /// leaves no lock file in an environment that is not a store: once the
    /// store is put right, this process opens it for writing again.
    @Test func aRefusedOpenHoldsNoWriterLock() throws {
        let directory = try TemporaryDirectory("integrity-refused-lock")
        do {
            let log = try EventLog(path: directory.path)
            log.close()
        }
        func setVersion(_ version: UInt8) throws {
            try putRaw(directory.path, database: "meta", key: Array("format".utf8), value: Array("SYNCLOG\0".utf8) + [0, 0, 0, version])
        }
        try setVersion(2)
        let error = #expect(throws: LogStoreError.self) { try EventLog(path: directory.path) }
        #expect(error?.code == .unsupportedFormat)
        try setVersion(1)
        let reopened = try EventLog(path: directory.path)
        reopened.close()

        let other = try TemporaryDirectory("integrity-refused-lock-other")
        try putRaw(other.path, database: "accounts", key: [1], value: [2], create: true)
        #expect(throws: LogStoreError.self) { try EventLog(path: other.path) }
        #expect(!FileManager.default.fileExists(atPath: other.appending("writer.lock")))
    }

    /// A writer lock file that cannot be opened (here a directory in its
    /// place; as well a file this user may not write, or a process out of
    /// descriptors) is the operating system's error, named with the file,
    /// as the environment's own files give one. It was
    /// `LogStoreError.writerActive`, which tells the app another process
    /// writes the store: the one thing that was not so.
    @Test func aWriterLockFileThatCannotBeOpenedIsNotAnotherWriter() throws {
        let directory = try TemporaryDirectory("integrity-writer-lock-unopenable")
        try EventLog(path: directory.path).close()
        let lock = directory.appending("writer.lock")
        try FileManager.default.removeItem(atPath: lock)
        try FileManager.default.createDirectory(atPath: lock, withIntermediateDirectories: false)
        let error = #expect(throws: LMDBError.self) { try EventLog(path: directory.path) }
        #expect(error?.code == LMDBError.Code(rawValue: EISDIR), "\(String(describing: error))")
        #expect(error?.description.contains(directory.path) == true && error?.description.contains("writer.lock") == true)
        try FileManager.default.removeItem(atPath: lock)
        try EventLog(path: directory.path).close()
    }

    /// Only a lock another process holds is another writer: `flock`'s other
    /// failures (`ENOLCK` from a file system that cannot lock) are the
    /// operating system's error, named with the file. Every failure was
    /// `writerActive`. (No test machine makes `flock` fail so; the held
    /// lock is `WriterLockTests`' real second process.)
    @Test func aLockTheSystemRefusesIsNotAnotherWriter() throws {
        let directory = try TemporaryDirectory("integrity-writer-lock-refused")
        let refused = WriterLock.failure(ENOLCK, directory: directory.path)
        #expect((refused as? LMDBError)?.code == LMDBError.Code(rawValue: ENOLCK), "\(refused)")
        #expect("\(refused)".contains("writer.lock") && "\(refused)".contains(directory.path), "\(refused)")
        let held = WriterLock.failure(EWOULDBLOCK, directory: directory.path)
        #expect((held as? LogStoreError)?.code == .writerActive, "\(held)")
    }

    /// Damage to an outbox row makes the outbox unreadable; verify reports it.
    @Test func verifyFindsADamagedOutboxRow() async throws {
        let directory = try await Self.storeOfEmptyEntities("integrity-outbox", ids: ["a"])
        // Status 7 is no status (storage.md, section 15, "outbox").
        try putRaw(directory.path, database: "outbox", key: key(1), value: [7] + [UInt8](repeating: 0, count: 16))
        do {
            let store = try Store(path: directory.path, options: .inspecting)
            defer { store.close() }
            let error = #expect(throws: LogStoreError.self) { try store.outbox() }
            #expect(error?.code == .corruptEntry)
        }
        let scratch = try TemporaryDirectory("integrity-outbox-scratch")
        let report = try await Store.verify(path: directory.path, scratchDirectory: scratch.path)
        #expect(report.problems.contains { $0.table == "outbox" && $0.offset == 1 }, "\(report.problems)")
    }

    /// An outbox key that is not an 8-byte offset is an error naming the
    /// table and the key, for every read of the outbox, as a damaged value
    /// is. The list and the push batch skipped the row, so the damage was
    /// hidden and its intent never pushed, and the summary counted it. A
    /// rebuild writes the rows from the log and leaves it out.
    @Test func anOutboxKeyThatIsNotAnOffsetIsNamed() async throws {
        let directory = try await Self.storeOfEmptyEntities("integrity-outbox-key", ids: ["a", "b"])
        defer { directory.remove() }
        // Nine bytes, in its initial state: it sorts between rows 1 and 2.
        try putRaw(directory.path, database: "outbox", key: key(1) + [0], value: [UInt8](repeating: 0, count: 17))
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        let reads: [(String, () throws -> Void)] = [
            ("outbox", { _ = try store.outbox() }), ("outbox due", { _ = try store.outbox(dueAt: 0) }),
            ("pushBatch", { _ = try store.pushBatch(limit: 10, now: 0) }), ("outboxSummary", { _ = try store.outboxSummary() }),
        ]
        for (name, read) in reads {
            let error = #expect(throws: LogStoreError.self, "\(name)") { try read() }
            #expect(error?.code == .corruptEntry, "\(name): \(String(describing: error))")
            #expect(
                error?.detail.contains("outbox: a key of 9 bytes (000000000000000100)") == true, "\(name): \(String(describing: error))")
        }
        try await store.rebuildProjections()
        #expect(try store.outbox().map(\.offset) == [1, 2])
        #expect(try store.pushBatch(limit: 10, now: 0).map(\.offset) == [1, 2])
    }

    /// A rebuild, the repair for derived tables, starts a damaged outbox
    /// row over (pending, never tried). It copied the damage into the new
    /// tables with the attempt states, and the outbox stayed unreadable:
    /// every push failed, for good.
    @Test func aRebuildStartsADamagedOutboxRowOver() async throws {
        let directory = try TemporaryDirectory("integrity-outbox-rebuild")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            try await store.create(type: "te", id: "b", fields: [:])
            try await store.scheduleRetry(offsets: [2], error: "timeout", at: 0, attemptsMax: 10)
            store.close()
        }
        // Status 7 is no status (storage.md, section 15, "outbox").
        try putRaw(directory.path, database: "outbox", key: key(1), value: [7] + [UInt8](repeating: 0, count: 16))
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        let error = #expect(throws: LogStoreError.self) { try store.outbox() }
        #expect(error?.code == .corruptEntry && error?.offset == 1, "\(String(describing: error))")
        try await store.rebuildProjections()
        let pending = try store.outbox()
        #expect(pending.map(\.offset) == [1, 2])
        #expect(pending.first?.state == OutboxState())
        // The row that decodes keeps its attempt state.
        #expect(pending.last?.state.attempts == 1 && pending.last?.state.lastError == "timeout")
    }

    /// A damaged awaited-feed row stops every answer and pulled change of
    /// its entity (`AwaitedFeedTests`); verify names it, as it names a
    /// damaged outbox row. Replay cannot compare the table (it is not
    /// derived from the log), so verify reported the store sound.
    @Test func verifyFindsADamagedAwaitedFeedRow() async throws {
        let directory = try await Self.storeOfEmptyEntities("integrity-awaited", ids: ["a"])
        // A row is 16 bytes: the ack's offset and the server version (storage.md, section 15).
        try putRaw(directory.path, database: "awaited-feed", key: Array("te\0a".utf8), value: [1, 2, 3])
        let scratch = try TemporaryDirectory("integrity-awaited-scratch")
        let report = try await Store.verify(path: directory.path, scratchDirectory: scratch.path)
        #expect(
            report.problems.contains { $0.table == "awaited-feed" && $0.message.contains("te/a is damaged: 3 bytes") },
            "\(report.problems)")
    }

    /// A compaction watermark that is not 8 bytes is damage named as such.
    /// It was read as 0 (never compacted), so the holes compaction left
    /// below it read as entries lost from the log: a gap at offset 1.
    @Test func aDamagedCompactionWatermarkIsNamed() async throws {
        // The holes a compaction below 3 leaves, and its watermark, damaged.
        let directory = try await damagedStore("integrity-compacted-below", count: 5) { txn, table in
            for offset: UInt64 in [1, 2] { try txn.delete(table, key: key(offset)) }
        }
        try putRaw(directory.path, database: "meta", key: Array("compacted-below".utf8), value: [0, 0, 3])
        let log = try EventLog(path: directory.path, options: .inspecting)
        defer { log.close() }
        for read in [{ _ = try scanAll(log) }, { _ = try log.compactedBelow() }, { _ = try log.verifyEntries() }] {
            let error = #expect(throws: LogStoreError.self) { try read() }
            #expect(error?.code == .corruptEntry, "\(String(describing: error))")
            #expect(error?.detail.contains("compacted-below") == true && error?.detail.contains("is 3 bytes") == true, "\(String(describing: error))")
        }
    }

    /// An idempotency row whose value is not an 8-byte offset is an error
    /// naming the table and the key. It read as a key the store does not
    /// know (nil), though the log holds its intent.
    @Test func aDamagedIdempotencyRowIsNamed() async throws {
        let directory = try TemporaryDirectory("integrity-idempotency")
        let key: String
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            key = try #require(try store.outbox().first?.intent.idempotencyKey)
            store.close()
        }
        try putRaw(directory.path, database: "idempotency", key: Array(key.utf8), value: [0, 1])
        let store = try Store(path: directory.path, options: .inspecting)
        defer { store.close() }
        let error = #expect(throws: LogStoreError.self) { try store.intentOffset(idempotencyKey: key) }
        #expect(error?.code == .corruptEntry, "\(String(describing: error))")
        #expect(error?.detail.contains("idempotency") == true && error?.detail.contains(key) == true, "\(String(describing: error))")
    }

    /// A damaged entity record is an error naming the entity and the store
    /// when the app reads it, one at a time or by pages; not a trap, and
    /// not an entity that is silently missing.
    @Test func aDamagedEntityRecordIsNamedByGetAndAll() async throws {
        let directory = try TemporaryDirectory("integrity-entity")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: ["title": "kept"])
            try await store.create(type: "te", id: "b", fields: ["title": "damaged"])
            store.close()
        }
        // Record version 9 is no layout (storage.md, section 15, "entities").
        try putRaw(directory.path, database: "entities", key: Array("te".utf8) + [0] + Array("b".utf8), value: [9, 0])
        let store = try Store(path: directory.path, options: .inspecting)
        defer { store.close() }
        #expect(try store.get(type: "te", id: "a")?.fields["title"] == "kept")
        for read in [{ _ = try store.get(type: "te", id: "b") }, { _ = try store.all(type: "te") }] {
            let error = #expect(throws: LogStoreError.self) { try read() }
            #expect(error?.code == .corruptEntry)
            #expect(error?.path == store.path && error?.detail.contains("entity te/b") == true, "\(String(describing: error))")
        }
    }

    /// A store of te/a (1, pending) and te/b: created (2), acknowledged at
    /// version 4 (3), then updated (4, pending), so b's record holds a base
    /// and a pending offset. Closed.
    static func makeStoreWithAPendingUpdate(_ directory: TemporaryDirectory) async throws {
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        try await store.create(type: "te", id: "a", fields: ["title": "kept"])
        try await store.create(type: "te", id: "b", fields: ["title": "b", "n": 1])
        try await store.record([(2, .acknowledged(.applied, serverVersion: 4))])
        try await store.update(type: "te", id: "b", changes: ["n": 2])
    }

    /// Seeded damage to one entity's record (te/b: a server base at
    /// version 4, one intent pending on it): a bit flipped, the record cut
    /// short or extended, a length rewritten. Every read and write that
    /// meets it uses what decodes or throws a `LogStoreError` naming the
    /// entity, never traps; the other entity stays readable. A rebuild
    /// puts the record right.
    @Test func seededDamageToAnEntityRecordIsNamedByItsEntity() async throws {
        let seed = SeededRandom.seed(default: 86_028_121)
        var random = SeededRandom(seed: seed)
        let key = Array("te".utf8) + [0] + Array("b".utf8)
        for round in 0..<24 {
            let directory = try TemporaryDirectory("integrity-entity-seeded")
            try await Self.makeStoreWithAPendingUpdate(directory)
            let environment = try Environment(path: directory.path)
            let entities = try #require(try environment.openDatabase("entities", create: false))
            try environment.write { txn in
                var bytes = try #require(try txn.get(entities, key: key))
                mutate(&bytes, using: &random, largeLength: 0x2000_0000)
                try txn.put(entities, key: key, value: bytes)
            }
            environment.close()
            let store = try Store(path: directory.path, options: .init(durability: .process))
            defer { store.close() }
            let context = "seed \(seed) round \(round)"
            let reads: [() async throws -> Void] = [
                { _ = try store.get(type: "te", id: "b") },
                { _ = try store.all(type: "te") },
                { _ = try store.pushBatch(limit: 10, now: 0) },
                { try await store.update(type: "te", id: "b", changes: ["n": 3]) },
                { try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "b", serverVersion: 5, fields: ["n": 5])], cursor: "c") },
                { try await store.record([(4, .acknowledged(.applied, serverVersion: 6))]) },
            ]
            for (index, read) in reads.enumerated() {
                do {
                    try await read()
                } catch let error as LogStoreError {
                    #expect(error.description.contains("te/b"), "\(context) call \(index): \(error)")
                } catch {
                    Issue.record("\(context) call \(index): \(error)")
                }
            }
            #expect(try store.get(type: "te", id: "a")?.fields == ["title": "kept"], "\(context)")
            try await store.rebuildProjections()
            #expect(try store.get(type: "te", id: "b") != nil, "\(context)")
        }
    }

    /// A pending offset of a record that decodes but names the wrong entry
    /// (damage the layout cannot see: te/b's pending intent 4 read as 1,
    /// 3 or 99) is an error naming the entity when a server change or an
    /// answer folds the pending intents again, not an entry of another
    /// entity applied to it (1, te/a's create), nor an error about an ack
    /// or reject that is not there.
    @Test(arguments: [1, 3, 99] as [UInt8])
    func aPendingOffsetNamingAnotherEntryIsNamedByItsEntity(offset: UInt8) async throws {
        let directory = try TemporaryDirectory("integrity-entity-pending")
        try await Self.makeStoreWithAPendingUpdate(directory)
        let key = Array("te".utf8) + [0] + Array("b".utf8)
        let environment = try Environment(path: directory.path)
        let entities = try #require(try environment.openDatabase("entities", create: false))
        try environment.write { txn in
            var bytes = try #require(try txn.get(entities, key: key))
            // Version, flags (base and visible), base version 4, one pending offset: 4.
            #expect(Array(bytes[0..<22]) == [1, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 4])
            bytes[21] = offset
            try txn.put(entities, key: key, value: bytes)
        }
        environment.close()
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        let change = PulledChange(.upsert, entityType: "te", entityID: "b", serverVersion: 5, fields: ["n": 5])
        let error = await #expect(throws: LogStoreError.self) { try await store.applyPulledPage([change], cursor: "c") }
        #expect(error?.code == .corruptEntry, "\(String(describing: error))")
        #expect(error?.description.contains("te/b") == true && error?.offset == UInt64(offset), "\(String(describing: error))")
        #expect(try store.get(type: "te", id: "b")?.fields == ["title": "b", "n": 2])
        // A rebuild puts the record right: the server's state, with the update over it.
        try await store.rebuildProjections()
        try await store.applyPulledPage([change], cursor: "c")
        #expect(try store.get(type: "te", id: "b")?.fields == ["n": 2])
    }

    /// An attempt count at its maximum in a pending outbox row (damaged or
    /// forged data: the API marks an intent failed long before) is counted
    /// once more without a trap, and the intent is marked failed.
    @Test func anAttemptCountAtItsMaximumDoesNotTrap() async throws {
        let directory = try await Self.storeOfEmptyEntities("integrity-attempts", ids: ["a"])
        // Pending, attempts 0xFFFFFFFF, due now, no error (storage.md, section 15, "outbox").
        let row: [UInt8] = [0] + [0xFF, 0xFF, 0xFF, 0xFF] + [UInt8](repeating: 0, count: 8) + [0, 0, 0, 0]
        try putRaw(directory.path, database: "outbox", key: key(1), value: row)
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        try await store.scheduleRetry(offsets: [1], error: "timeout", at: 0, attemptsMax: 10)
        let state = try #require(try store.outbox().first?.state)
        #expect(state.attempts == .max && state.status == .failed)
    }

    /// storage.md section 15, "`conflicts`": a row whose key or value is
    /// not 8 bytes, or that names an entry of another kind, is reported as
    /// "corrupt entry", and one that names a missing entry as "gap in the
    /// log", by the list of waiting conflicts, and by `resolveConflict` of
    /// the row's intent. That said "not found" for a damaged row, so the
    /// app was told no conflict waits where the list showed damage. (The
    /// 7-byte key is no intent's row: resolving intent 1 finds none.) The
    /// list names the row as the outbox names its damaged rows, by its key
    /// or its intent: it said "a row is not two offsets", and, for a
    /// missing entry, only the offset.
    @Test(arguments: [
        ("a value of 3 bytes", [0, 0, 0, 0, 0, 0, 0, 1], [0, 0, 1], LogStoreError.Code.corruptEntry,
         "conflicts: the row of intent 1 is 3 bytes, not an offset of 8"),
        ("a key of 7 bytes", [0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0, 1], .corruptEntry,
         "conflicts: a key of 7 bytes (00000000000001), not an offset of 8"),
        ("an intent named as the conflict", [0, 0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0, 1], .corruptEntry,
         "conflicts: the row of intent 1 names an entry that is not a conflict"),
        ("a missing entry", [0, 0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, 0, 99], .gap,
         "conflicts: the row of intent 1 names offset 99, which holds no entry"),
    ] as [(String, [UInt8], [UInt8], LogStoreError.Code, String)])
    func aDamagedConflictsRowIsReported(damage: String, key: [UInt8], value: [UInt8], code: LogStoreError.Code, message: String) async throws {
        let directory = try TemporaryDirectory("integrity-conflicts")
        defer { directory.remove() }
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            #expect(try store.conflicts().isEmpty)
            store.close()
        }
        try putRaw(directory.path, database: "conflicts", key: key, value: value)
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        let error = #expect(throws: LogStoreError.self, "\(damage)") { try store.conflicts() }
        #expect(error?.code == code && error?.detail == message, "\(damage): \(String(describing: error))")
        let resolved = await #expect(throws: LogStoreError.self, "\(damage)") {
            try await store.resolveConflict(intentOffset: 1, .keepRemote)
        }
        #expect(resolved?.code == (key.count == 8 ? code : .notFound), "\(damage): \(String(describing: resolved))")
        if key.count == 8 {
            #expect(resolved?.detail == message, "\(damage): \(String(describing: resolved))")
        }
        // Compaction keeps the intents whose conflicts wait: a key it cannot
        // read stops it, where it was skipped, and the intent it named could
        // be folded away before the app decided. Nothing is removed.
        if key.count != 8 {
            try await store.create(type: "te", id: "b", fields: [:])
            let compacted = await #expect(throws: LogStoreError.self, "\(damage)") { try await store.compact(below: 2) }
            #expect(compacted?.code == .corruptEntry && compacted?.detail == message, "\(damage): \(String(describing: compacted))")
            #expect(try store.compactedBelow() == 0)
        }
    }

    /// storage.md section 15, "Derived `meta` keys": a stored pull cursor
    /// the protocol does not allow (empty, a byte outside `!` to `~`, over
    /// 1024 bytes) is "corrupt entry" naming the key; it was read as text,
    /// with replacement characters, and sent. A resync deletes it, and a
    /// page's cursor that the read would call damage is refused.
    @Test(arguments: [
        ("empty", []), ("a byte past ~", Array("c1".utf8) + [0x7F]), ("a space", Array("c 1".utf8)),
        ("not UTF-8", [0x63, 0xFF]), ("1025 bytes", [UInt8](repeating: 0x63, count: 1025)),
    ] as [(String, [UInt8])])
    func aDamagedPullCursorIsNamed(damage: String, bytes: [UInt8]) async throws {
        let directory = try TemporaryDirectory("integrity-cursor")
        defer { directory.remove() }
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 1)], cursor: "c1")
            #expect(try store.pullCursor() == "c1")
            store.close()
        }
        try putRaw(directory.path, database: "meta", key: Array("cursor".utf8), value: bytes)
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        let error = #expect(throws: LogStoreError.self, "\(damage)") { try store.pullCursor() }
        #expect(error?.code == .corruptEntry, "\(damage): \(String(describing: error))")
        #expect(error?.detail.contains("the pull cursor (key \"cursor\", \(bytes.count) bytes)") == true, "\(damage): \(String(describing: error))")
        try await store.resync(reason: "test")
        #expect(try store.pullCursor() == nil, "\(damage)")
        let text = String(decoding: bytes, as: UTF8.self)
        let refused = await #expect(throws: LogStoreError.self, "\(damage)") {
            try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 2)], cursor: text)
        }
        #expect(refused?.code == .invalidArgument, "\(damage): \(String(describing: refused))")
        #expect(try store.pullCursor() == nil, "\(damage)")
    }

    @Test func aReadOnlyStoreReadsButRefusesAppends() async throws {
        let directory = try TemporaryDirectory("integrity-readonly")
        do {
            let log = try EventLog(path: directory.path)
            _ = try await log.append(contentsOf: (1...3).map { intent($0) })
            log.close()
        }
        let log = try EventLog(path: directory.path, options: .init(readOnly: true))
        #expect(try log.lastOffset() == 3)
        #expect(try scanAll(log).count == 3)
        await #expect(throws: LMDBError.self) { try await log.append(intent(4)) }
    }
}

extension StoreIntegrityTests {
    /// A closed store holding the entities te/`ids`, with no fields, each
    /// created by an intent of its own (offsets 1, 2, ...).
    static func storeOfEmptyEntities(_ name: String, ids: [String]) async throws -> TemporaryDirectory {
        let directory = try TemporaryDirectory(name)
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        for id in ids { try await store.create(type: "te", id: id, fields: [:]) }
        return directory
    }

    /// A store holding te/a (n: 1) and te/b (n: 2), whose `entities` table
    /// `damage` then changes with LMDB alone.
    private static func storeOfTwoEntities(
        _ name: String, damage: (borrowing Transaction, Database) throws -> Void
    ) async throws -> TemporaryDirectory {
        let directory = try TemporaryDirectory(name)
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: ["n": 1])
            try await store.create(type: "te", id: "b", fields: ["n": 2])
            store.close()
        }
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let entities = try #require(try environment.openDatabase("entities", create: false))
        try environment.write { txn in try damage(txn, entities) }
        return directory
    }

    /// `verify` compares each derived row with what a replay makes: a row
    /// under the right key with another entity's record (each row sound by
    /// itself) is reported as differing, by its entity.
    @Test func verifyReportsARowThatDiffersFromWhatTheLogMakes() async throws {
        let directory = try await Self.storeOfTwoEntities("integrity-verify-differs") { txn, entities in
            let b = try #require(try txn.get(entities, key: Array("te".utf8) + [0] + Array("b".utf8)))
            try txn.put(entities, key: Array("te".utf8) + [0] + Array("a".utf8), value: b)
        }
        let scratch = try TemporaryDirectory("integrity-verify-differs-scratch")
        let report = try await Store.verify(path: directory.path, scratchDirectory: scratch.path)
        #expect(report.problems == [StoreProblem(table: "entities", message: "te/a differs from what the log makes")], "\(report.problems)")
    }

    /// `verify` opens the store read-only, which refuses projections that
    /// lag the log (an entry appended without the store): that is a
    /// problem of the report, with the entries checked, not an error that
    /// leaves `logtool verify` saying nothing of the store.
    @Test func verifyReportsProjectionsBehindTheLogAsAProblem() async throws {
        let fixture = try StoreFixture("integrity-verify-stale")
        defer { fixture.directory.remove() }
        try await fixture.store.create(type: "te", id: "a", fields: [:])
        _ = try await fixture.store.log.append(intent(2))
        fixture.store.close()
        let scratch = try TemporaryDirectory("integrity-verify-stale-scratch")
        defer { scratch.remove() }
        let report = try await Store.verify(path: fixture.directory.path, scratchDirectory: scratch.path)
        #expect(report.checked == 2)
        let message = "projections are version \(Store.projectionVersion) at offset 1; open the store writable to rebuild them"
        #expect(report.problems == [StoreProblem(table: "meta", message: message)], "\(report.problems)")
    }

    /// An `entities` key with no zero byte holds no type and id (damage):
    /// `verify` quotes it as it is, as `name` says, rather than name an
    /// entity `stray/` that has no empty id.
    @Test func verifyQuotesAnEntityKeyWithNoZeroByte() async throws {
        let directory = try await Self.storeOfEmptyEntities("integrity-verify-entity-key", ids: ["a"])
        defer { directory.remove() }
        try putRaw(directory.path, database: "entities", key: Array("stray".utf8), value: [0])
        let scratch = try TemporaryDirectory("integrity-verify-entity-key-scratch")
        defer { scratch.remove() }
        let report = try await Store.verify(path: directory.path, scratchDirectory: scratch.path)
        #expect(
            report.problems == [StoreProblem(table: "entities", message: "\"stray\" is there, but nothing in the log makes it")],
            "\(report.problems)")
    }

    /// `verify` says which way a row differs: one the log makes that the
    /// tables lack is missing (a row nothing in the log makes is the other
    /// case, `verifyReportsOnlyTheOutboxRowNothingInTheLogMakes`). Named
    /// the other way round, a user would look for a stray row to delete.
    @Test func verifyReportsARowTheLogMakesThatIsMissing() async throws {
        let directory = try await Self.storeOfTwoEntities("integrity-verify-missing") { txn, entities in
            _ = try txn.delete(entities, key: Array("te".utf8) + [0] + Array("b".utf8))
        }
        defer { directory.remove() }
        let scratch = try TemporaryDirectory("integrity-verify-missing-scratch")
        defer { scratch.remove() }
        let report = try await Store.verify(path: directory.path, scratchDirectory: scratch.path)
        #expect(report.problems == [StoreProblem(table: "entities", message: "te/b is missing; the log has it")], "\(report.problems)")
    }

    /// storage.md section 15, Replay: `verifyProjections` compares `cursor`
    /// with the replay's. A cursor the log does not give is reported, as
    /// text, whatever its length (one of 8 bytes was named as an offset).
    @Test func verifyReportsACursorTheLogDoesNotGive() async throws {
        let fixture = try StoreFixture("integrity-verify-cursor")
        let store = fixture.store
        try await store.create(type: "te", id: "a", fields: [:])
        #expect(try await store.projectionProblems() == [])
        let log = store.log
        _ = try await log.perform { txn, _ in try txn.put(log.metaDatabase, key: MetaKey.cursor, value: Array("stray-01".utf8)) }
        let problems = try await store.projectionProblems()
        #expect(problems == [StoreProblem(table: "meta", message: "cursor is \"stray-01\", the log says none")], "\(problems)")
    }

    /// storage.md section 15, Replay: `verify` compares the `outbox` keys
    /// alone (replay writes every value in its first state). A row nothing
    /// in the log makes, between two the log makes, is one problem, that
    /// row; compared as key and value pairs, the keys paired up wrongly,
    /// and the rows beside it were reported instead.
    @Test func verifyReportsOnlyTheOutboxRowNothingInTheLogMakes() async throws {
        let directory = try TemporaryDirectory("integrity-verify-outbox-key")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            for id in ["a", "b", "c"] { try await store.create(type: "te", id: id, fields: [:]) }
            try await store.record([(2, .acknowledged(.applied, serverVersion: 1))])
            #expect(try store.outbox().map(\.offset) == [1, 3])
            store.close()
        }
        try putRaw(directory.path, database: "outbox", key: key(2), value: Projector.newOutboxState)
        let scratch = try TemporaryDirectory("integrity-verify-outbox-key-scratch")
        let report = try await Store.verify(path: directory.path, scratchDirectory: scratch.path)
        #expect(report.problems == [StoreProblem(table: "outbox", message: "#2 is there, but nothing in the log makes it")], "\(report.problems)")
    }

    /// `verify` names a row by what its table's key holds: a type or an
    /// idempotency key as text, an intent's offset as `#n`. Before, a key
    /// with a zero byte was taken for an entity's (so every offset below
    /// 2^56 was named as an empty type and a garbled id), and a name of 8
    /// bytes for an offset.
    @Test func verifyNamesEachRowByWhatItsKeyHolds() async throws {
        let directory = try TemporaryDirectory("integrity-verify-names")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "eightbyt", id: "a", fields: [:])
            store.close()
        }
        try putRaw(directory.path, database: "counts", key: Array("eightbyt".utf8), value: UInt64(9).bigEndianBytes)
        try putRaw(directory.path, database: "idempotency", key: Array("k-000001".utf8), value: key(1))
        try putRaw(directory.path, database: "conflicts", key: key(1), value: key(1))
        let scratch = try TemporaryDirectory("integrity-verify-names-scratch")
        let report = try await Store.verify(path: directory.path, scratchDirectory: scratch.path)
        #expect(
            report.problems == [
                StoreProblem(table: "counts", message: "\"eightbyt\" differs from what the log makes"),
                StoreProblem(table: "idempotency", message: "\"k-000001\" is there, but nothing in the log makes it"),
                StoreProblem(table: "conflicts", message: "#1 is there, but nothing in the log makes it"),
            ], "\(report.problems)")
    }
}

extension StoreIntegrityTests {
    /// `verifyEntries` reports at most `EventLog.problemCountMax` problems,
    /// the first in log order, and stops looking at the end of the chunk
    /// in which it found that many: with the first chunk's first
    /// `problemCountMax` entries damaged, or all of them (more problems
    /// than it reports), and every entry of the next chunk damaged too, it
    /// reads the first chunk alone and lists exactly the first
    /// `problemCountMax` problems. Nothing else pinned the limit: a
    /// verification that read on, or listed every problem, went unnoticed.
    @Test(arguments: [EventLog.problemCountMax, EventLog.scanChunkCountMax])
    func verifyReportsAtMostProblemCountMaxProblemsAndStopsAtTheEndOfTheirChunk(damagedInFirstChunk: Int) async throws {
        try #require(EventLog.problemCountMax < EventLog.scanChunkCountMax)
        let chunk = EventLog.scanChunkCountMax
        let damaged = Array(1...damagedInFirstChunk) + Array(chunk + 1...chunk + 5)
        let directory = try await damagedStore("integrity-verify-problem-count", count: chunk + 5) { txn, table in
            for offset in damaged.map(UInt64.init) {
                var bytes = try #require(try txn.get(table, key: key(offset)))
                bytes[bytes.count - 1] ^= 0x40
                try txn.put(table, key: key(offset), value: bytes)
            }
        }
        defer { directory.remove() }
        let log = try EventLog(path: directory.path, options: .inspecting)
        defer { log.close() }
        let (checked, problems) = try log.verifyEntries()
        #expect(checked == chunk)
        // Counted, not listed: a failure would print a thousand problems.
        #expect(problems.count == EventLog.problemCountMax, "\(problems.count) problems")
        #expect(problems.map(\.offset).elementsEqual((1...EventLog.problemCountMax).map { UInt64($0) }), "\(problems.prefix(3))")
    }

    /// `verifyEntries` counts the entries of every chunk it reads, and
    /// checks them all: in a log of two chunks and three entries, each
    /// entry is counted once and damage in the last is found. Counted by
    /// the last chunk alone, `logtool verify` said 3 entries were checked.
    @Test func verifyCountsAndChecksTheEntriesOfEveryChunk() async throws {
        let count = 2 * EventLog.scanChunkCountMax + 3
        let directory = try await damagedStore("integrity-verify-chunks", count: count) { txn, table in
            var bytes = try #require(try txn.get(table, key: key(UInt64(count))))
            bytes[bytes.count - 1] ^= 0x40
            try txn.put(table, key: key(UInt64(count)), value: bytes)
        }
        defer { directory.remove() }
        let log = try EventLog(path: directory.path, options: .inspecting)
        defer { log.close() }
        let (checked, problems) = try log.verifyEntries()
        #expect(checked == count)
        #expect(problems.map(\.offset) == [UInt64(count)], "\(problems.prefix(3))")
    }

    /// `verify` lists at most `EventLog.problemCountMax` rows that differ
    /// from a replay, the first in key order: one stray idempotency row
    /// more than that is reported as that many, the last left out.
    @Test func verifyReportsAtMostProblemCountMaxDifferingRows() async throws {
        let directory = try await Self.storeOfEmptyEntities("integrity-verify-row-count", ids: ["a"])
        defer { directory.remove() }
        // Zero-padded, so key order is number order.
        let names = (0...EventLog.problemCountMax).map { "stray-" + String(String($0 + 10_000).dropFirst()) }
        do {
            let environment = try Environment(path: directory.path)
            defer { environment.close() }
            let idempotency = try #require(try environment.openDatabase("idempotency", create: false))
            try environment.write { txn in
                for name in names { try txn.put(idempotency, key: Array(name.utf8), value: key(1)) }
            }
        }
        let scratch = try TemporaryDirectory("integrity-verify-row-count-scratch")
        defer { scratch.remove() }
        let report = try await Store.verify(path: directory.path, scratchDirectory: scratch.path)
        #expect(report.checked == 1)
        let expected = names.dropLast().map { StoreProblem(table: "idempotency", message: "\"\($0)\" is there, but nothing in the log makes it") }
        // Counted, not listed: a failure would print a thousand problems.
        #expect(report.problems.count == EventLog.problemCountMax, "\(report.problems.count) problems")
        #expect(report.problems.elementsEqual(expected), "\(report.problems.prefix(3))")
    }

    /// `verify` reads every outbox and awaited-feed row for damage, not
    /// just up to the first: a damaged outbox row after a sound one, and
    /// each of two damaged awaited-feed rows, is reported. Stopped after
    /// the first row, it reported the store sound, or named one row of two.
    @Test func verifyNamesEveryDamagedOutboxAndAwaitedFeedRow() async throws {
        let directory = try await Self.storeOfEmptyEntities("integrity-verify-damaged-rows", ids: ["a", "b"])
        defer { directory.remove() }
        // Status 7 is no status (storage.md, section 15, "outbox"); an
        // awaited-feed row is 16 bytes.
        try putRaw(directory.path, database: "outbox", key: key(2), value: [7] + [UInt8](repeating: 0, count: 16))
        for id in ["a", "b"] { try putRaw(directory.path, database: "awaited-feed", key: Array("te\0\(id)".utf8), value: [1, 2, 3]) }
        let scratch = try TemporaryDirectory("integrity-verify-damaged-rows-scratch")
        defer { scratch.remove() }
        let report = try await Store.verify(path: directory.path, scratchDirectory: scratch.path)
        #expect(report.problems.filter { $0.table == "outbox" }.map(\.offset) == [2], "\(report.problems)")
        let awaited = report.problems.filter { $0.table == "awaited-feed" }.map(\.message)
        #expect(awaited.count == 2 && awaited[0].contains("te/a is damaged") && awaited[1].contains("te/b is damaged"), "\(report.problems)")
    }
}

extension StoreIntegrityTests {
    /// With `checkPagesOnOpen`, damage inside the pages of `data.mdb` (here
    /// every page past the meta pages names another page in its header)
    /// fails the open, read-only or not, with `.damagedPages` naming a
    /// table and a page, before LMDB reads a table through its map; and
    /// leaves the directory as it was. A sound store opens so and works.
    @Test(arguments: [false, true]) func checkPagesOnOpenRefusesDamagedPages(readOnly: Bool) async throws {
        let directory = try TemporaryDirectory("store-check-pages-on-open")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: ["n": 1])
            store.close()
        }
        var options = EventLog.Options(durability: .process, readOnly: readOnly)
        options.checkPagesOnOpen = true
        do {
            let store = try Store(path: directory.path, options: options)
            defer { store.close() }
            #expect(try store.get(type: "te", id: "a")?.fields == ["n": 1])
        }
        let file = directory.appending("data.mdb")
        let bytes = try damagePageHeaders(ofDataFile: file)
        let before = try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted()

        let error = #expect(throws: LogStoreError.self) { try Store(path: directory.path, options: options) }
        #expect(error?.code == .damagedPages, "\(String(describing: error))")
        #expect(error?.detail.contains(#/page \d+: its header says it is page 17216961135462248174/#) == true, "\(String(describing: error))")
        #expect(error?.detail.hasSuffix("(logtool verify lists them all)") == true, "\(String(describing: error))")
        #expect(FileManager.default.contents(atPath: file) == bytes)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted() == before)
    }
}
