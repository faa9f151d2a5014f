import Foundation
import LMDB
import LogFormat

/// Something wrong with a store, said so a person can find it.
public struct StoreProblem: Sendable, Equatable, CustomStringConvertible {
    /// The log offset involved, when there is one.
    public var offset: UInt64?
    /// The database involved (`log`, `entities`, `outbox`, ...).
    public var table: String
    public var message: String

    public init(offset: UInt64? = nil, table: String, message: String) {
        self.offset = offset
        self.table = table
        self.message = message
    }

    public var description: String {
        let place = offset.map { "\(table) at offset \($0)" } ?? table
        return "\(place): \(message)"
    }
}

extension EventLog {
    /// The most problems one verification reports before it stops looking.
    public static let problemCountMax = 1_000

    /// Checks every entry of the log: its key, its checksum and encoding, and
    /// that offsets are dense from the compaction watermark on, which is not
    /// past the last offset. Unlike a
    /// scan it goes on past a problem, reporting each one.
    /// - Returns: how many entries were read, and the problems found.
    public func verifyEntries() throws -> (checked: Int, problems: [StoreProblem]) {
        var problems: [StoreProblem] = []
        var checked = 0
        var expected: UInt64 = 1
        var position: [UInt8]? = nil
        // A chunk of entries per read transaction, so a long log never pins
        // one snapshot for long; bounded by the log's length.
        while problems.count < EventLog.problemCountMax {
            let (count, next) = try environment.read { txn -> (Int, [UInt8]?) in
                let compactedBelow = try compactedBelow(txn)
                var count = 0
                var next: [UInt8]? = nil
                try txn.withCursor(logDatabase) { cursor in
                    var item = try position.map { try cursor.seek(atLeast: $0) } ?? cursor.first()
                    while let (key, value) = item, count < EventLog.scanChunkCountMax {
                        count += 1
                        guard let offset = OffsetKey.decode(key) else {
                            problems.append(StoreProblem(table: "log", message: "a key of \(damagedKey(key)), not an offset of 8"))
                            item = try cursor.next()
                            continue
                        }
                        if offset != expected && !(offset > expected && offset <= compactedBelow) {
                            problems.append(StoreProblem(offset: expected, table: "log", message: "missing: the next entry is at offset \(offset)"))
                        }
                        if case .failure(let error) = Result(catching: { () throws(FormatError) in
                            try EntryCodec.decode(value, expectedOffset: offset)
                        }) {
                            problems.append(StoreProblem(offset: offset, table: "log", message: "\(error.code) at byte \(error.position): \(error.detail)"))
                        }
                        expected = offset &+ 1  // Wraps only past the last offset: nothing follows it.
                        item = try cursor.next()
                    }
                    next = item.map { [UInt8]($0.key) }
                }
                return (count, next)
            }
            checked += count
            guard let next else { break }
            position = next
        }
        // Compaction's watermark is at most the last offset (storage.md
        // section 4), and an import refuses another. Past it, entries
        // appended up to it could go missing with no gap reported.
        let (watermark, last) = try environment.read { txn in
            (try compactedBelow(txn), try txn.withCursor(logDatabase) { try $0.last().flatMap { OffsetKey.decode($0.key) } } ?? 0)
        }
        if watermark > max(last, 1) {
            problems.append(StoreProblem(table: "meta", message: "compacted-below is \(watermark), past the log's last offset \(last)"))
        }
        return (checked, Array(problems.prefix(EventLog.problemCountMax)))
    }

    /// Writes a consistent copy of the store into the empty directory
    /// `destination`; `compact` leaves out free pages, so the copy is as
    /// small as the data.
    public func copy(to destination: String, compact: Bool) throws {
        try environment.copy(to: destination, compact: compact)
    }

    /// The offset below which compaction may have left holes (0: never).
    public func compactedBelow() throws -> UInt64 {
        try environment.read { txn in try compactedBelow(txn) }
    }

    /// Throws `LMDBError` `.truncated` when `data.mdb` no longer holds
    /// every page in use (another process cut it short), before a read
    /// through LMDB's map meets the cut as SIGBUS; the log fails then, and
    /// every later read throws the same. For a process that reads for
    /// long, such as `logtool tail --follow`, between its reads
    /// (`Environment.checkDataFileWhole`).
    public func checkDataFileWhole() throws {
        try environment.checkDataFileWhole()
    }

    /// The LMDB map: its size and how much of it is in use.
    public func mapUsage() -> (mapSize: Int, usedBytes: Int) {
        let info = environment.info()
        return (info.mapSize, info.usedBytes)
    }
}

extension Store {
    /// Each table's keys and the pages it takes, as one commit has them:
    /// `log`, `meta`, the derived databases in use, named without the
    /// suffix of their set (`entities`, not `entities.1`), then
    /// `awaited-feed` (when the store has it).
    /// - Throws: `LogStoreError.projectionsStale` in a store opened
    ///   read-only before the derived databases in use were made.
    public func tableStatistics() throws -> [(name: String, statistics: DatabaseStatistics)] {
        try log.environment.read { txn in
            let projector = try projector(txn)
            let awaited = projector.awaitedFeed.map { [(Projector.awaitedFeedName, $0)] } ?? []
            return try (zip(["log", "meta"] + Store.derivedDatabaseNames, [log.logDatabase, log.metaDatabase] + projector.databases) + awaited)
                .map { name, database in (name, try txn.statistics(database)) }
        }
    }
}

/// What `Store.verify(path:scratchDirectory:)` found.
public struct VerificationReport: Sendable, Equatable {
    /// Log entries read.
    public var checked: Int
    /// Every problem found, each with where it is (up to `problemCountMax`).
    public var problems: [StoreProblem]
}

extension Store {
    /// Verifies the store at `path` without writing to it, as `logtool
    /// verify` does: first the structure of every page of `data.mdb`
    /// (`Environment.checkPages`), read without LMDB, which would follow a
    /// damaged page wherever it points; when the pages are sound, every
    /// entry of the log (key, checksum, encoding, dense offsets); and when
    /// the log is sound, every derived table against a replay made in a
    /// copy under `scratchDirectory`.
    ///
    /// The store is opened read-only (no writer lock), so it may run while
    /// another process writes; this process must not have it open.
    /// - Throws: `LogStoreError.notAStore` and what a read-only open throws;
    ///   stale projections are a problem of the report, not an error.
    public static func verify(path: String, scratchDirectory: String) async throws -> VerificationReport {
        let pageProblems = try pageProblems(path: path)
        guard pageProblems.isEmpty else { return VerificationReport(checked: 0, problems: pageProblems) }
        let log = try EventLog(path: path, options: .inspecting)
        let (checked, entryProblems) = try log.verifyEntries()
        log.close()
        guard entryProblems.isEmpty else { return VerificationReport(checked: checked, problems: entryProblems) }
        do {
            let store = try Store(path: path, options: .inspecting)
            defer { store.close() }
            let problems = try await store.verifyProjections(scratchDirectory: scratchDirectory)
            return VerificationReport(checked: checked, problems: problems)
        } catch let error as LogStoreError where error.code == .projectionsStale {
            return VerificationReport(checked: checked, problems: [StoreProblem(table: "meta", message: error.detail)])
        }
    }

    /// The page check of the store at `path` (`Environment.checkPages`),
    /// its problems named by table and page. It opens no table: LMDB would
    /// read the table of tables through its map to find them.
    static func pageProblems(path: String) throws -> [StoreProblem] {
        let environment = try EventLog.openEnvironment(path: path, options: .inspecting)
        defer { environment.close() }
        return try environment.checkPages(problemCountMax: EventLog.problemCountMax).problems.map { problem in
            StoreProblem(table: problem.table, message: problem.page.map { "page \($0): \(problem.message)" } ?? problem.message)
        }
    }

    /// Compares every derived database (entities, counts, idempotency keys,
    /// outbox keys, conflicts, cursor, watermark) with what a replay of the log
    /// computes, and reports the outbox and awaited-feed rows that do not
    /// decode (replay does not make their values). The replay runs in a
    /// copy of the store made in `scratchDirectory`, so the store itself is
    /// only read.
    /// - Returns: one problem per differing row (up to `problemCountMax`).
    public func verifyProjections(scratchDirectory: String) async throws -> [StoreProblem] {
        let copyPath = (scratchDirectory as NSString).appendingPathComponent("replay")
        try FileManager.default.createDirectory(atPath: copyPath, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: copyPath) }
        try log.environment.copy(to: copyPath, compact: false)
        // The stored tables are read from the copy too: the log and its
        // projections from one snapshot. Read from this store, they would
        // include commits made after the copy, which the replay lacks.
        let stored: DerivedTables
        var problems: [StoreProblem] = []
        do {
            let snapshot = try Store(path: copyPath, options: .inspecting)
            defer { snapshot.close() }
            stored = try snapshot.derivedTables()
            problems += try snapshot.damagedOutboxRows()
            problems += try snapshot.log.environment.read { txn in try snapshot.projector(txn).damagedAwaitedRows(txn) }
        }
        let copy = try Store(path: copyPath, options: .init(durability: .process))
        defer { copy.close() }
        try await copy.rebuildProjections()
        let replayed = try copy.derivedTables()
        problems += Store.compare("entities", stored.entities, replayed.entities, pairs: true, keys: .entity)
        problems += Store.compare("counts", stored.counts, replayed.counts, pairs: true, keys: .text)
        problems += Store.compare("idempotency", stored.idempotency, replayed.idempotency, pairs: true, keys: .text)
        problems += Store.compare("outbox", stored.outboxKeys, replayed.outboxKeys, pairs: false, keys: .offset)
        problems += Store.compare("conflicts", stored.conflicts, replayed.conflicts, pairs: true, keys: .offset)
        if stored.cursor != replayed.cursor {
            let (have, want) = (stored.cursor.map(Store.quoted) ?? "none", replayed.cursor.map(Store.quoted) ?? "none")
            problems.append(StoreProblem(table: "meta", message: "cursor is \(have), the log says \(want)"))
        }
        if stored.watermark != replayed.watermark {
            problems.append(StoreProblem(table: "meta", message: "projection watermark is \(stored.watermark), the log ends at \(replayed.watermark)"))
        }
        return Array(problems.prefix(EventLog.problemCountMax))
    }

    /// Outbox rows whose attempt state does not decode. Replay resets
    /// those values, so it cannot compare them, but the store cannot read
    /// its outbox while one is damaged.
    private func damagedOutboxRows() throws -> [StoreProblem] {
        try log.environment.read { txn in
            var problems: [StoreProblem] = []
            try txn.forEach(projector(txn).outbox) { key, value in
                do {
                    _ = try OutboxState(decoding: value)
                } catch {
                    problems.append(StoreProblem(offset: OffsetKey.decode(key), table: "outbox", message: "attempt state: \(error)"))
                }
                return problems.count < EventLog.problemCountMax
            }
            return problems
        }
    }

    /// What the keys of a derived database hold, which names a row.
    private enum KeyKind {
        /// Type, a zero byte, id (`entities`): named `type/id`.
        case entity
        /// A name (`counts` by type, `idempotency` by key): quoted.
        case text
        /// An intent's offset, 8 bytes big-endian (`outbox`, `conflicts`):
        /// named `#offset`.
        case offset
    }

    /// Rows (key, value pairs flattened, or keys alone) that differ.
    private static func compare(
        _ table: String, _ stored: [[UInt8]], _ replayed: [[UInt8]], pairs: Bool, keys: KeyKind
    ) -> [StoreProblem] {
        func rows(_ flat: [[UInt8]]) -> [[UInt8]: [UInt8]] {
            var rows: [[UInt8]: [UInt8]] = [:]
            var index = 0
            while index < flat.count {
                rows[flat[index]] = pairs && index + 1 < flat.count ? flat[index + 1] : []
                index += pairs ? 2 : 1
            }
            return rows
        }
        let have = rows(stored)
        let want = rows(replayed)
        var problems: [StoreProblem] = []
        for key in Set(have.keys).union(want.keys).sorted(by: { $0.lexicographicallyPrecedes($1) }) {
            let name = Store.name(key, keys)
            switch (have[key], want[key]) {
            case (nil, _): problems.append(StoreProblem(table: table, message: "\(name) is missing; the log has it"))
            case (_, nil): problems.append(StoreProblem(table: table, message: "\(name) is there, but nothing in the log makes it"))
            case (let a?, let b?) where a != b: problems.append(StoreProblem(table: table, message: "\(name) differs from what the log makes"))
            default: break
            }
        }
        return problems
    }

    /// How a message names the row under `key`. A key that does not hold
    /// what its table's keys hold (damage) is quoted as it is.
    private static func name(_ key: [UInt8], _ kind: KeyKind) -> String {
        switch kind {
        case .entity where key.contains(0):
            let (type, id) = EntityKey.split(key)
            return "\(type)/\(id)"
        case .offset:
            if let offset = UInt64(bigEndianBytes: key) { return "#\(offset)" }
        case .entity, .text:
            break
        }
        return quoted(key)
    }

    private static func quoted(_ bytes: [UInt8]) -> String { "\"" + String(decoding: bytes, as: UTF8.self) + "\"" }
}

extension Store {
    /// Makes one pass over the entries of an import, from the first: a
    /// function that returns the next entry, nil after the last, with how a
    /// message names it (`logtool import` names its line in the file).
    package typealias ImportEntries = @Sendable () throws -> () throws -> (entry: Entry, place: String)?

    /// Writes exported entries into this empty store as they were (offsets
    /// and timestamps kept), sets the compaction watermark the export had,
    /// and rebuilds the projections: an exact copy of the exported log.
    /// - Throws: `LogStoreError.invalidArgument` when the store is not empty
    ///   or the entries are out of order or leave a hole that replay would
    ///   refuse (offsets are dense except below `compactedBelow`); nothing
    ///   is written then.
    package func restore(_ entries: [Entry], compactedBelow: UInt64) async throws {
        try await restore(compactedBelow: compactedBelow) {
            var iterator = entries.enumerated().makeIterator()
            return { iterator.next().map { ($1, "entry \($0 + 1) of the import") } }
        }
    }

    /// `restore(_:compactedBelow:)` for entries read one at a time, so an
    /// import of any length holds one entry in memory, not all of them.
    /// - Parameters:
    ///   - entries: makes a pass over the entries. It runs again, for a
    ///     pass from the first entry, when the transaction does (the map
    ///     was full, and grew). What a pass throws ends the restore, with
    ///     nothing written.
    /// - Returns: the number of entries restored.
    /// - Throws: as `restore(_:compactedBelow:)`, and what `entries` throws.
    @discardableResult
    package func restore(compactedBelow: UInt64, entries: @escaping ImportEntries) async throws -> Int {
        let count = try await log.perform { txn, context in
            guard context.position.lastOffset == 0 else {
                throw LogStoreError(.invalidArgument, path: self.path, "import needs an empty store")
            }
            let next = try entries()
            var count = 0
            // Bounded by the import's entries.
            while let item = try next() {
                count += 1
                try self.restore(item.entry, place: item.place, compactedBelow: compactedBelow, txn, &context)
            }
            // Compaction's watermark is at most the last offset (1 for an
            // empty log); past it, holes would hide entries appended later.
            let last = context.position.lastOffset
            guard compactedBelow <= max(last, 1) else {
                throw LogStoreError(
                    .invalidArgument, path: self.path,
                    "the compaction watermark \(compactedBelow) is past the last offset of the import, \(last)")
            }
            if compactedBelow > 0 {
                try txn.put(self.log.metaDatabase, key: StoreFormat.compactedBelowKey, value: compactedBelow.bigEndianBytes)
            }
            return count
        }
        try await rebuildProjections()
        return count
    }

    /// Writes an entry of an import, named in messages by `place`, after
    /// checking it follows the last one as replay requires.
    private func restore(
        _ entry: Entry, place: String, compactedBelow: UInt64, _ txn: borrowing Transaction, _ context: inout WriteContext
    ) throws {
        // Past the last offset it wraps to 0, which no offset follows.
        let expected = context.position.lastOffset &+ 1
        do {
            // Replay's own rule, checked before anything commits.
            try EventLog.checkDensity(expected: expected, found: entry.offset, compactedBelow: compactedBelow, path: path)
        } catch {
            throw LogStoreError(
                .invalidArgument, path: path, offset: entry.offset,
                "\(place) has offset \(entry.offset) where \(expected) comes next "
                    + "(offsets may skip only up to the compaction watermark, \(compactedBelow))")
        }
        do {
            try context.restore(entry, in: txn)
        } catch var error as LogStoreError where error.code == .invalidArgument {
            // Named as the density error above is: which entry, at which offset.
            error.offset = entry.offset
            error.detail = "\(place), at offset \(entry.offset): \(error.detail)"
            throw error
        }
    }
}
