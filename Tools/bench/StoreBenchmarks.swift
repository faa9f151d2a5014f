import CLMDB
import Foundation
import GRDB
import LogFormat
import LogStore
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The counts sections 5-7 (the app's store API) use, after `--quick`.
struct StoreBenchSettings: Codable, Sendable {
    /// Section 5a: creates committed through `Store.write(WriteBatch)`.
    var batchedCreates: Int
    var createsPerBatch: Int
    /// Section 5b: durable single creates (and as many SQLite transactions).
    var singleCreates: Int
    /// Section 6: the log sizes replayed, smallest first.
    var replayEntries: [Int]
    /// Section 7: the entities read back.
    var readEntities: Int
}

// MARK: - The app's entity

/// The entity sections 5-7 write: a time entry (`te`) as a time-tracking app
/// keeps it, with a description, minutes, a billable flag and a start time,
/// about 200 bytes encoded. Contents come from a seeded generator and cycle
/// through `variantCount` variants, so building them costs no time in the
/// measured loops and runs are repeatable.
struct TimeEntryWorkload: Sendable {
    static let entityType = "te"
    static let variantCount = 1024
    /// Description lengths in bytes (120 on average), which makes the
    /// encoded fields about 200 bytes.
    static let descriptionBytesRange = 100...140

    struct TimeEntry: Sendable {
        var description: String
        var minutes: Int64
        var billable: Bool
        /// Microseconds since 1970.
        var startedAt: Int64

        var fields: Fields {
            [
                "description": .string(description), "minutes": .int(minutes), "billable": .bool(billable),
                "started_at": .timestamp(startedAt),
            ]
        }
    }

    private static let words = [
        "review", "sync", "spec", "draft", "call", "with", "client", "about", "the", "invoice", "fix", "outbox",
        "retry", "pairing", "on", "release", "notes", "for", "planning", "meeting", "design", "pull", "request",
        "write", "tests", "offline", "mode", "migration", "backlog", "grooming", "support", "ticket", "and",
        "onboarding", "budget", "report", "weekly", "standup", "research", "conflict", "resolution", "docs",
    ]

    let entries: [TimeEntry]
    private let fieldVariants: [Fields]

    init(seed: UInt64 = 0x7E_5EED) {
        var random = SplitMix64(seed: seed)
        let start = Int64(wallClockMilliseconds()) * 1000
        entries = (0..<TimeEntryWorkload.variantCount).map { _ in
            let range = TimeEntryWorkload.descriptionBytesRange
            let length = range.lowerBound + Int(random.next() % UInt64(range.count))
            var text = ""
            while text.utf8.count < length {
                if !text.isEmpty { text += " " }
                text += TimeEntryWorkload.words[Int(random.next() % UInt64(TimeEntryWorkload.words.count))]
            }
            return TimeEntry(
                description: String(text.prefix(length)), minutes: Int64(5 + random.next() % 236),
                billable: random.next() % 3 != 0, startedAt: start - Int64(random.next() % 86_400_000_000))
        }
        fieldVariants = entries.map(\.fields)
    }

    func entry(_ index: Int) -> TimeEntry { entries[index % TimeEntryWorkload.variantCount] }

    func fields(_ index: Int) -> Fields { fieldVariants[index % TimeEntryWorkload.variantCount] }

    /// The mean encoded size of the fields (`Fields.encode`, as in an entry body).
    var meanEncodedFieldBytes: Int {
        let total = fieldVariants.reduce(0) { total, fields in
            var writer = ByteWriter(capacity: 256)
            fields.encode(into: &writer)
            return total + writer.bytes.count
        }
        return total / fieldVariants.count
    }

    /// The encoded size of a whole create intent (header included) with the
    /// store's key and id formats.
    func createEntryBytes() throws -> Int {
        guard let id = PrefixedID(prefix: TimeEntryWorkload.entityType, id: UUIDv7.Generator.shared.next()) else {
            preconditionFailure("te is a valid ID prefix")
        }
        let intent = Intent(
            .create, idempotencyKey: UUIDv7.Generator.shared.next().uuidString, entityType: TimeEntryWorkload.entityType,
            entityID: id.description, fields: fields(0))
        let entry = Entry(offset: 1, timestamp: HybridTimestamp(rawValue: 0), body: .intent(intent))
        return try EntryCodec.encode(entry).count
    }

    /// A time-ordered id with the store's `te_` form: `sequence` orders it,
    /// `random` makes it unique across runs of the generator.
    static func entityID(sequence: Int, base milliseconds: UInt64, random: inout SplitMix64) -> String {
        let high = (milliseconds + UInt64(sequence >> 12)) << 16 | 0x7000 | UInt64(sequence & 0xFFF)
        let id = UUIDv7(high: high, low: 0x8000_0000_0000_0000 | random.next() >> 2)
        guard let prefixed = PrefixedID(prefix: entityType, id: id) else {
            preconditionFailure("\(entityType) is a valid ID prefix")
        }
        return prefixed.description
    }
}

/// The size of a store's `data.mdb` (log, projections and free pages).
private func dataFileBytes(_ workspace: Workspace, _ name: String) -> Int {
    let path = (workspace.path(name) as NSString).appendingPathComponent("data.mdb")
    let attributes = try? FileManager.default.attributesOfItem(atPath: path)
    return (attributes?[.size] as? NSNumber)?.intValue ?? 0
}

private func megabytes(_ bytes: Int) -> Double { Double(bytes) / 1e6 }

// MARK: - Section 5: store write

/// Section 5: what an app write costs, an intent plus its projection update
/// committed together.
/// a. Creates in batches with `.process` durability (`Store.write(WriteBatch)`).
/// b. Durable single creates (`Store.create`, `.full`, one per commit) beside
///    SQLite doing the same app write (entity row plus outbox row) per transaction.
enum StoreWriteBenchmark {
    static let batchedStoreName = "store-write-batched"
    static let singleStoreName = "store-write-single"
    static let sqliteName = "store-write-sqlite.db"
    static let acksStoreName = "store-write-acks"
    static let batchedTarget = 100_000.0
    /// Row c: updates pending on one entity before the acks, smaller first.
    static let pendingCounts = [200, 2000]
    /// Row c: acks per `Store.record` call.
    static let acksPerRecord = 50

    struct Outcome: Sendable {
        var section: ReportSection
        var sqliteVersion: String
    }

    static func title(_ settings: Settings) -> String {
        "5. Store write: create = intent + projection update (entity \"te\")"
    }

    static func run(_ settings: Settings, _ workspace: Workspace) async throws -> Outcome {
        let workload = TimeEntryWorkload()
        let counts = settings.store
        progress("store write: \(Report.grouped(counts.batchedCreates)) batched creates (.process)")
        let batched = try await measureBatched(counts, workload, workspace)
        workspace.remove(batchedStoreName)
        progress("store write: \(Report.grouped(counts.singleCreates)) durable single creates, ours and SQLite")
        let single = try await measureSingle(settings, workload, workspace)
        workspace.remove(singleStoreName)
        workspace.remove(sqliteName)
        let pendingList = pendingCounts.map(Report.grouped).joined(separator: " and ")
        progress("store write: in-order acks of \(pendingList) updates pending on one entity")
        var acks: [Duration] = []
        for pending in pendingCounts {
            acks.append(try await measureInOrderAcks(pending: pending, workspace))
            workspace.remove(acksStoreName)
        }
        var section = ReportSection(title(settings))
        section.rows = [batchedRow(batched, counts)] + singleRows(single, counts) + ackRows(acks)
        section.notes = try notes(settings, workload, sqlite: single.sqliteSettings)
        return Outcome(section: section, sqliteVersion: single.sqliteSettings.sqliteVersion)
    }

    private static func batchedRow(_ batched: BatchedOutcome, _ counts: StoreBenchSettings) -> ResultRow {
        let perCreate = { (duration: Duration) in Double(counts.batchedCreates) / duration.seconds }
        return ResultRow(
            "a. batched creates, .process: WriteBatch.create + Store.write",
            perCreate(batched.buildTime + batched.writeTime), "creates/s", latency: batched.batchLatency,
            target: .atLeast(batchedTarget, "creates/s"),
            detail: String(
                format: "Store.write alone %.0f creates/s, WriteBatch.create alone %.0f creates/s; data file %.0f MB",
                perCreate(batched.writeTime), perCreate(batched.buildTime), megabytes(batched.fileBytes)))
    }

    private static func singleRows(_ single: SingleSamples, _ counts: StoreBenchSettings) -> [ResultRow] {
        let ours = LatencySummary(nanoseconds: single.ours)
        let sqlite = LatencySummary(nanoseconds: single.sqlite)
        return [
            ResultRow("b. durable single creates, .full: Store.create", ours.ratePerSecond, "creates/s", latency: ours),
            ResultRow(
                "   SQLite (GRDB, WAL, synchronous=FULL): entity + outbox row", sqlite.ratePerSecond, "txn/s",
                latency: sqlite),
            ResultRow(
                "   ours/SQLite (rate)", ours.ratePerSecond / sqlite.ratePerSecond, "x",
                detail: String(
                    format: "above 1 means ours is faster; p50 %.0f µs vs %.0f µs, p99 %.0f µs vs %.0f µs",
                    ours.p50Microseconds, sqlite.p50Microseconds, ours.p99Microseconds, sqlite.p99Microseconds)
                    + writesPerCommit(single, count: counts.singleCreates)),
        ]
    }

    private static func notes(_ settings: Settings, _ workload: TimeEntryWorkload, sqlite: SQLiteOutbox.Settings)
        throws -> [String]
    {
        let counts = settings.store
        return [
            "entity \"te\": description (100-140 bytes of words), minutes int, billable bool, started_at "
                + "timestamp; fields \(workload.meanEncodedFieldBytes) bytes encoded on average, a create intent "
                + "\(try workload.createEntryBytes()) bytes with its header; ids and idempotency keys made by "
                + "WriteBatch (UUIDv7).",
            "a: \(Report.grouped(counts.batchedCreates)) creates, \(Report.grouped(counts.createsPerBatch)) per "
                + "WriteBatch (one commit each), one task, store opened at EventLog's default map size; the rate "
                + "counts building the batch (WriteBatch.create checks the fields and makes the id and key) and "
                + "Store.write; p50/p99 are per Store.write. Each create writes the log entry, the entity record, "
                + "the outbox, idempotency and count rows.",
            "b: \(Report.grouped(counts.singleCreates)) measured creates per method after \(settings.warmupCount) "
                + "unmeasured, one at a time from one task (ours: await Store.create; SQLite: DatabaseQueue.write "
                + "on a thread of its own), alternating in \(settings.rounds) rounds; rate = creates / time inside "
                + "the calls; bytes and write calls per commit from /proc/self/io (wchar, syscw).",
            "b, SQLite: one transaction = INSERT into entities (id TEXT PRIMARY KEY, type, description, minutes, "
                + "billable, started_at, updated_at) + INSERT into outbox (id INTEGER PRIMARY KEY, idempotency_key "
                + "UNIQUE, operation, entity_type, entity_id, payload JSON, created_at), the SwiftData/Core Data "
                + "outbox pattern; ids and the JSON payload are built outside the timing; "
                + "journal_mode=\(sqlite.journalMode), synchronous=\(sqlite.synchronous).",
            "b: no target. A durable LMDB commit syncs twice (fdatasync of the data pages, then the meta page "
                + "through an O_DSYNC descriptor) where SQLite's WAL syncs once, and copy-on-write rewrites the "
                + "leaf-to-root path of every B-tree a create touches (log, entities, outbox, idempotency, counts, "
                + "meta, the catalog, the free list), so DESIGN.md expects ours to lose to SQLite when every write "
                + "is its own commit. The store wins by sharing commits: group commit (section 2) and batches (row a).",
            "c: one entity created, then updated \(pendingCounts.map(Report.grouped).joined(separator: " or ")) "
                + "times (one commit each, .process), then every intent acknowledged oldest first, "
                + "\(acksPerRecord) per Store.record call, each at the next server version; rate = acks / time of "
                + "the record calls. Each ack moves its intent into the confirmed state; the visible state already "
                + "has it, so the intents still pending are not read back from the log. What still grows with "
                + "their number is the entity record, which lists their offsets (8 bytes each) and which every "
                + "ack rewrites.",
        ]
    }

    private static func ackRows(_ times: [Duration]) -> [ResultRow] {
        let perAck = zip(pendingCounts, times).map { count, time in time.seconds / Double(count + 1) * 1e6 }
        return zip(pendingCounts, times).enumerated().map { index, pair in
            let (count, time) = pair
            return ResultRow(
                "\(index == 0 ? "c." : "  ") in-order acks, \(Report.grouped(count)) updates pending on one entity",
                Double(count + 1) / time.seconds, "acks/s",
                detail: String(format: "%.1f µs per ack", perAck[index])
                    + (index == 0 ? "" : String(format: " against %.1f µs with %@ pending", perAck[0],
                        Report.grouped(pendingCounts[0]))))
        }
    }

    /// "; per commit: ours ... , SQLite ..." from the write counters.
    private static func writesPerCommit(_ single: SingleSamples, count: Int) -> String {
        guard let ours = single.oursWrites, let sqlite = single.sqliteWrites else { return "" }
        func text(_ writes: WriteCounters) -> String {
            String(format: "%.1f KB in %.1f write calls", Double(writes.bytes) / Double(count) / 1e3,
                Double(writes.calls) / Double(count))
        }
        return "; written per commit: ours \(text(ours)), SQLite \(text(sqlite))"
    }

    /// Creates one entity, updates it `pending` times, then acknowledges
    /// every intent in log order; returns the time of the `record` calls.
    private static func measureInOrderAcks(pending: Int, _ workspace: Workspace) async throws -> Duration {
        let store = try Store(path: workspace.path(acksStoreName), options: EventLog.Options(durability: .process))
        defer { store.close() }
        let id = try await store.create(type: TimeEntryWorkload.entityType, fields: ["n": 0, "note": "pending"])
        for n in 1...pending {
            try await store.update(type: TimeEntryWorkload.entityType, id: id, changes: ["n": .int(Int64(n))])
        }
        let clock = ContinuousClock()
        var elapsed = Duration.zero
        var acked = 0
        while true {
            let intents = try store.outbox(limit: acksPerRecord)
            guard !intents.isEmpty else { break }
            let outcomes = intents.enumerated().map { index, intent in
                (intent.offset, PushOutcome.acknowledged(.applied, serverVersion: UInt64(acked + index + 1)))
            }
            let start = clock.now
            let settled = try await store.record(outcomes).settled
            elapsed += clock.now - start
            guard settled.count == intents.count else {
                throw BenchError("record settled \(settled.count) of \(intents.count)")
            }
            acked += settled.count
        }
        let entity = try store.get(type: TimeEntryWorkload.entityType, id: id)
        guard acked == pending + 1, entity?.fields["n"] == .int(Int64(pending)), entity?.serverVersion == UInt64(acked)
        else { throw BenchError("after \(acked) acks the entity is \(String(describing: entity))") }
        return elapsed
    }

    struct BatchedOutcome: Sendable {
        var buildTime: Duration
        var writeTime: Duration
        var batchLatency: LatencySummary
        var fileBytes: Int
    }

    private static func measureBatched(
        _ settings: StoreBenchSettings, _ workload: TimeEntryWorkload, _ workspace: Workspace
    ) async throws -> BatchedOutcome
    {
        let store = try Store(path: workspace.path(batchedStoreName), options: EventLog.Options(durability: .process))
        defer { store.close() }
        let clock = ContinuousClock()
        var buildTime = Duration.zero
        var samples: [Int64] = []
        var created = 0
        while created < settings.batchedCreates {
            let end = min(created + settings.createsPerBatch, settings.batchedCreates)
            let buildStart = clock.now
            var batch = WriteBatch()
            for index in created..<end {
                try batch.create(type: TimeEntryWorkload.entityType, fields: workload.fields(index))
            }
            let writeStart = clock.now
            try await store.write(batch)
            let writeEnd = clock.now
            buildTime += writeStart - buildStart
            samples.append((writeEnd - writeStart).nanoseconds)
            created = end
        }
        let count = try store.count(type: TimeEntryWorkload.entityType)
        guard count == settings.batchedCreates, try store.outboxCount() == settings.batchedCreates else {
            throw BenchError("the batched store holds \(count) entities, expected \(settings.batchedCreates)")
        }
        return BatchedOutcome(
            buildTime: buildTime, writeTime: .nanoseconds(samples.reduce(0, +)),
            batchLatency: LatencySummary(nanoseconds: samples), fileBytes: dataFileBytes(workspace, batchedStoreName))
    }

    struct SingleSamples: Sendable {
        var ours: [Int64]
        var sqlite: [Int64]
        var sqliteSettings: SQLiteOutbox.Settings
        /// What the measured calls wrote, from `/proc/self/io` (nil elsewhere).
        var oursWrites: WriteCounters?
        var sqliteWrites: WriteCounters?
    }

    /// Ours from this task, SQLite on a thread of its own (it blocks in
    /// fsync), alternating in rounds so contention from elsewhere on the
    /// machine falls on both alike.
    private static func measureSingle(_ settings: Settings, _ workload: TimeEntryWorkload, _ workspace: Workspace)
        async throws -> SingleSamples
    {
        let count = settings.store.singleCreates
        let warmup = settings.warmupCount
        let store = try Store(path: workspace.path(singleStoreName), options: EventLog.Options(durability: .full))
        defer { store.close() }
        let sqlite = try SQLiteAppWrite(path: workspace.path(sqliteName))
        defer { try? sqlite.close() }
        let rows = SQLiteAppWrite.rows(count: warmup + count, workload)

        let clock = ContinuousClock()
        var ours: [Int64] = []
        ours.reserveCapacity(count)
        var sqliteSamples: [Int64] = []
        sqliteSamples.reserveCapacity(count)
        var oursWrites: WriteCounters? = WriteCounters()
        var sqliteWrites: WriteCounters? = WriteCounters()
        func runOurs(_ range: Range<Int>, record: Bool) async throws {
            let before = WriteCounters.read()
            for index in range {
                let fields = workload.fields(index)
                let start = clock.now
                _ = try await store.create(type: TimeEntryWorkload.entityType, fields: fields)
                if record { ours.append((clock.now - start).nanoseconds) }
            }
            if record { oursWrites = WriteCounters.sum(oursWrites, .written(from: before, to: .read())) }
        }
        func runSQLite(_ range: Range<Int>, record: Bool) async throws {
            let before = WriteCounters.read()
            let samples = try await onDedicatedThread("bench sqlite app writes") {
                try range.map { index in
                    let row = rows[index]
                    return try timed { try sqlite.insert(row) }.nanoseconds
                }
            }
            if record {
                sqliteSamples += samples
                sqliteWrites = WriteCounters.sum(sqliteWrites, .written(from: before, to: .read()))
            }
        }
        try await runOurs(0..<warmup, record: false)
        try await runSQLite(0..<warmup, record: false)
        for round in 0..<settings.rounds {
            let range = (warmup + round * count / settings.rounds)..<(warmup + (round + 1) * count / settings.rounds)
            if round % 2 == 0 {
                try await runOurs(range, record: true)
                try await runSQLite(range, record: true)
            } else {
                try await runSQLite(range, record: true)
                try await runOurs(range, record: true)
            }
        }
        let expected = warmup + count
        guard try store.count(type: TimeEntryWorkload.entityType) == expected, try sqlite.entityCount() == expected else {
            throw BenchError("a single-create store does not hold \(expected) entities")
        }
        return SingleSamples(
            ours: ours, sqlite: sqliteSamples, sqliteSettings: sqlite.settings, oursWrites: oursWrites,
            sqliteWrites: sqliteWrites)
    }
}

/// The SQLite side of section 5b: what an iOS app with a SwiftData or Core
/// Data store and an outbox table writes per change, the entity row and
/// the outbox row in one transaction. Opened like `SQLiteOutbox` (WAL,
/// `synchronous=FULL`, both checked).
final class SQLiteAppWrite: Sendable {
    struct Row: Sendable {
        var id: String
        var idempotencyKey: String
        var entry: TimeEntryWorkload.TimeEntry
        var payload: Data
        var createdAt: Int64
    }

    static let schema = [
        """
        CREATE TABLE entities (
            id TEXT PRIMARY KEY NOT NULL,
            type TEXT NOT NULL,
            description TEXT NOT NULL,
            minutes INTEGER NOT NULL,
            billable INTEGER NOT NULL,
            started_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL)
        """,
        """
        CREATE TABLE outbox (
            id INTEGER PRIMARY KEY,
            idempotency_key TEXT NOT NULL UNIQUE,
            operation TEXT NOT NULL,
            entity_type TEXT NOT NULL,
            entity_id TEXT NOT NULL,
            payload BLOB NOT NULL,
            created_at INTEGER NOT NULL)
        """,
    ]
    static let insertEntitySQL = """
        INSERT INTO entities (id, type, description, minutes, billable, started_at, updated_at) \
        VALUES (?, ?, ?, ?, ?, ?, ?)
        """
    static let insertOutboxSQL = """
        INSERT INTO outbox (idempotency_key, operation, entity_type, entity_id, payload, created_at) \
        VALUES (?, 'create', ?, ?, ?, ?)
        """

    private let queue: DatabaseQueue
    let settings: SQLiteOutbox.Settings

    init(path: String) throws {
        let opened = try SQLiteOutbox.openDurable(path: path, schema: SQLiteAppWrite.schema)
        queue = opened.queue
        settings = opened.settings
    }

    /// Rows for creates `0..<count`, ids and JSON built up front.
    static func rows(count: Int, _ workload: TimeEntryWorkload) -> [Row] {
        let now = Int64(wallClockMilliseconds())
        return (0..<count).map { index in
            let entry = workload.entry(index)
            // The descriptions are plain words, so no JSON escaping is needed.
            let json = """
                {"billable":\(entry.billable),"description":"\(entry.description)","minutes":\(entry.minutes),\
                "started_at":\(entry.startedAt)}
                """
            let id = PrefixedID(prefix: TimeEntryWorkload.entityType, id: UUIDv7.Generator.shared.next())?.description
            guard let id else { preconditionFailure("te is a valid ID prefix") }
            return Row(
                id: id, idempotencyKey: UUIDv7.Generator.shared.next().uuidString, entry: entry, payload: Data(json.utf8),
                createdAt: now)
        }
    }

    /// The app write: both rows in one transaction; returns after the commit.
    func insert(_ row: Row) throws {
        try queue.write { db in
            try db.cachedStatement(sql: SQLiteAppWrite.insertEntitySQL).execute(arguments: [
                row.id, TimeEntryWorkload.entityType, row.entry.description, row.entry.minutes, row.entry.billable,
                row.entry.startedAt, row.createdAt,
            ])
            try db.cachedStatement(sql: SQLiteAppWrite.insertOutboxSQL).execute(arguments: [
                row.idempotencyKey, TimeEntryWorkload.entityType, row.id, row.payload, row.createdAt,
            ])
        }
    }

    func entityCount() throws -> Int {
        try queue.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM entities") ?? 0 }
    }

    func close() throws { try queue.close() }
}

// MARK: - Section 6: replay

/// Section 6: `rebuildProjections()` over logs of growing size, with the
/// process's memory sampled while it runs.
enum ReplayBenchmark {
    static let rateTarget = 1_000_000.0
    /// Entries per `appendBlocking(contentsOf:)` while building a log.
    static let appendBatchCount = 10_000

    static func title(_ settings: Settings) -> String {
        "6. Replay: Store.rebuildProjections() over a mixed log"
    }

    struct Outcome: Sendable {
        var durability: Durability
        var entries: Int
        var kinds: ReplayLogBuilder.Counts
        var elapsed: Duration
        var buildTime: Duration
        /// Reading and decoding the same log with `EntryScanner`, no
        /// projection: the part of replay that no projection design avoids.
        var scanTime: Duration
        /// Writing the rows the replay left in the derived databases with
        /// LMDB alone, synced as the replay was: what no replay design
        /// avoids either.
        var tableWrite: (time: Duration, rows: Int)?
        var logFileBytes: Int
        var storeFileBytes: Int
        var memory: MemorySampler.Summary?
        /// Bytes the process handed to write(2) during the replay (nil
        /// where `/proc/self/io` cannot be read): LMDB writes every page a
        /// commit dirtied that way.
        var writtenBytes: Int?
        /// The replayed store opened with and without
        /// `checkPagesOnOpen`, and its data file read page by page with
        /// pread alone (`.full` only).
        var pageCheck: PageCheckTiming?
        /// The replayed store compacted below its last offset, then again
        /// at the same watermark (`.full` only).
        var compaction: CompactionTiming?
    }

    /// `Store.compact(below:)` twice at the same watermark: the first folds
    /// the log, the second finds every snapshot current and nothing to do.
    struct CompactionTiming {
        var first: Duration
        var firstReport: CompactionReport
        var memory: MemorySampler.Summary?
        var again: Duration
        var againReport: CompactionReport

        init(_ store: Store) async throws {
            let watermark = try store.log.lastOffset()
            MemorySampler.trimHeap()
            let sampler = MemorySampler.start()
            let clock = ContinuousClock()
            var start = clock.now
            firstReport = try await store.compact(below: watermark)
            first = clock.now - start
            memory = sampler?.finish()
            start = clock.now
            againReport = try await store.compact(below: watermark)
            again = clock.now - start
        }
    }

    static func run(_ settings: Settings, _ workspace: Workspace) async throws -> ReportSection {
        let workload = TimeEntryWorkload()
        var section = ReportSection(title(settings))
        var largest: Outcome?
        for entries in settings.store.replayEntries {
            let full = try await measure(entries: entries, .full, workload, workspace)
            let process = try await measure(entries: entries, .process, workload, workspace)
            section.rows += rows(full, process)
            largest = full
        }
        if let largest { section.notes.append(logNote(largest)) }
        section.notes += [
            "the log is appended raw (store.log.appendBlocking(contentsOf:), \(Report.grouped(appendBatchCount)) per "
                + "commit), so the derived tables are empty when the timed rebuildProjections() starts; it applies "
                + "\(Report.grouped(Store.replayChunkCountMax)) entries per transaction, each a commit: with two syncs "
                + "for .full (the store's default, the target row), none for .process (the same log built again in "
                + "a store of its own). Rate = entries / wall time of the call; the page cache is warm (the log was "
                + "just written). Memory rows are from the .full replay.",
            "memory: /proc/self/status sampled every \(MemorySampler.intervalMicroseconds / 1000) ms on a thread of "
                + "its own, after malloc_trim (so what building the log freed does not count). RssAnon is anonymous "
                + "memory: the Swift heap, stacks, and LMDB's dirty pages, which it keeps in malloc'd memory until "
                + "the commit writes them and then keeps for reuse. One replay chunk bounds it: it grows with how "
                + "many distinct pages a chunk dirties (more in bigger trees), not with the log's length. RssFile is file pages mapped in, mostly data.mdb read through LMDB's map: it grows with the "
                + "file and is page cache the kernel can drop, not heap. VmHWM is the peak of both (and shmem), "
                + "reset by writing 5 to /proc/self/clear_refs just before the replay.",
        ]
        return section
    }

    private static func rows(_ full: Outcome, _ process: Outcome) -> [ResultRow] {
        func mb(_ kilobytes: Int) -> Double { Double(kilobytes) * 1024 / 1e6 }
        let size = Report.grouped(full.entries)
        var rows = [
            ResultRow(
                "\(size) entries, .full: rebuildProjections", Double(full.entries) / full.elapsed.seconds,
                "entries/s", target: .atLeast(rateTarget, "entries/s"),
                detail: String(
                    format: "%.2f s; log built in %.2f s through appendBlocking(contentsOf:) (%.0f entries/s)",
                    full.elapsed.seconds, full.buildTime.seconds, Double(full.entries) / full.buildTime.seconds)),
            ResultRow(
                "   same log, .process (no fsync)", Double(process.entries) / process.elapsed.seconds, "entries/s",
                detail: String(
                    format: "%.2f s, against %.2f s with .full", process.elapsed.seconds, full.elapsed.seconds)),
            ResultRow(
                "   same log, EntryScanner alone (no projection)", Double(full.entries) / full.scanTime.seconds,
                "entries/s",
                detail: String(
                    format: "%.2f s: reading and decoding every entry, which replay does first; replay is %.1fx this",
                    full.scanTime.seconds, full.elapsed.seconds / full.scanTime.seconds)),
        ]
        if let write = process.tableWrite {
            let floor = process.scanTime + write.time
            rows.append(
                ResultRow(
                    "   floor: EntryScanner + LMDB alone writing the tables", Double(process.entries) / floor.seconds,
                    "entries/s",
                    detail: String(
                        format: "%.2f s scanning + %.2f s writing the %@ rows the replay leaves in %@ (raw LMDB, "
                            + "each table in key order with MDB_APPEND, %@ rows per commit, no sync): about what a "
                            + "replay that did nothing between reading and writing would take on one core; the "
                            + ".process replay is %.1fx this",
                        process.scanTime.seconds, write.time.seconds, Report.grouped(write.rows),
                        Store.derivedDatabaseNames.joined(separator: ", "), Report.grouped(Store.replayChunkCountMax),
                        process.elapsed.seconds / floor.seconds)))
        }
        if let write = full.tableWrite {
            let floor = full.scanTime + write.time
            rows.append(
                ResultRow(
                    "   floor at .full: EntryScanner + LMDB alone writing the tables, synced",
                    Double(full.entries) / floor.seconds, "entries/s",
                    detail: String(
                        format: "%.2f s scanning + %.2f s writing the same %@ rows in %d commits, as many as the "
                            + "replay's chunks, each with LMDB's two syncs (a lower bound: the replay rewrites pages "
                            + "and writes more); the .full replay is %.1fx this",
                        full.scanTime.seconds, write.time.seconds, Report.grouped(write.rows),
                        fullFloorCommits(full.entries), full.elapsed.seconds / floor.seconds)))
        }
        if let memory = full.memory {
            rows += [
                ResultRow(
                    "   peak RssAnon during replay", mb(memory.peakRssAnonKB), "MB",
                    detail: String(
                        format: "%.1f MB before the replay, so +%.1f MB; %d samples", mb(memory.startRssAnonKB),
                        mb(memory.peakRssAnonKB - memory.startRssAnonKB), memory.samples)),
                ResultRow(
                    "   peak RssFile during replay", mb(memory.peakRssFileKB), "MB",
                    detail: String(format: "%.1f MB before the replay", mb(memory.startRssFileKB))),
                ResultRow(
                    "   VmHWM (peak RSS) since reset", mb(memory.hwmKB ?? 0), "MB",
                    detail: memory.hwmKB == nil ? "could not reset VmHWM (/proc/self/clear_refs)" : nil),
            ]
        }
        if let written = full.writtenBytes {
            let tables = full.storeFileBytes - full.logFileBytes
            rows.append(
                ResultRow(
                    "   written during replay (write(2))", megabytes(written), "MB",
                    detail: String(
                        format: "%.0f bytes per entry, %.1fx the %.0f MB the file grew by: each chunk writes every "
                            + "page it changed, and changes to older entities (pulled updates, edits) reach pages "
                            + "across the whole tree; .full waits for the disk to take them, twice a chunk",
                        Double(written) / Double(full.entries), Double(written) / Double(max(tables, 1)),
                        megabytes(tables))))
        }
        if let check = full.pageCheck {
            let checkTime = check.checkedOpen - check.open
            rows.append(
                ResultRow(
                    "   checkPagesOnOpen: the page check of data.mdb", megabytes(check.bytes) / checkTime.seconds, "MB/s",
                    detail: String(
                        format: "%.0f ms for the %.0f MB file after the replay: an open with it took %.0f ms, one "
                            + "without %.1f ms (best of %d each); reading every page with pread alone takes %.0f ms "
                            + "(%.0f MB/s), so the check is %.1fx the read it cannot avoid",
                        checkTime.seconds * 1e3, megabytes(check.bytes), check.checkedOpen.seconds * 1e3,
                        check.open.seconds * 1e3, PageCheckTiming.rounds, check.read.seconds * 1e3,
                        megabytes(check.bytes) / check.read.seconds, checkTime.seconds / check.read.seconds)))
        }
        if let compaction = full.compaction {
            let first = compaction.firstReport
            rows += [
                ResultRow(
                    "   then compact(below: last offset)", Double(first.entriesBefore) / compaction.first.seconds,
                    "entries/s",
                    detail: String(
                        format: "%.2f s, %.1fx the scan of the log: %@ entries removed, %@ snapshots written, %@ "
                            + "kept (pending intents and the answers their base needs); %@, and every page a "
                            + "transaction changes waits in memory for its commit: peak RssAnon +%.0f MB",
                        compaction.first.seconds, compaction.first.seconds / full.scanTime.seconds,
                        Report.grouped(first.entriesRemoved), Report.grouped(first.snapshotsWritten),
                        Report.grouped(first.entriesKept),
                        first.watermark > Store.compactionStepOffsetsMin
                            && first.entriesRemoved + first.snapshotsWritten > Store.compactionStepChangesMax
                            ? "planned whole, then, changing more than \(Report.grouped(Store.compactionStepChangesMax)) "
                                + "entries, done in four steps (each planned again)" : "one transaction",
                        compaction.memory.map { mb($0.peakRssAnonKB - $0.startRssAnonKB) } ?? .nan)),
                ResultRow(
                    "   then compact again at the same watermark", compaction.again.seconds * 1e3, "ms",
                    detail: String(
                        format: "%@ entries removed, %@ snapshots written: every snapshot still holds its entity's state",
                        Report.grouped(compaction.againReport.entriesRemoved),
                        Report.grouped(compaction.againReport.snapshotsWritten))),
            ]
        }
        rows.append(
            ResultRow(
                "   data.mdb before the replay (the log)", megabytes(full.logFileBytes), "MB",
                detail: String(
                    format: "%.0f MB with the projections after the replay; the log takes %.0f bytes of file per entry",
                    megabytes(full.storeFileBytes), Double(full.logFileBytes) / Double(full.entries))))
        return rows
    }

    private static func logNote(_ outcome: Outcome) -> String {
        let kinds = outcome.kinds
        let percent = { (count: Int) in 100 * Double(count) / Double(outcome.entries) }
        return String(
            format: "the log (%@ entries): %.0f%% creates, %.0f%% updates (only changed fields; 3 in 4 on the 1,000 "
                + "newest live entities), %.0f%% deletes, %.0f%% acks (every intent on 2 in 5 local entities, in "
                + "order, soon after it; the rest stay pending), %.0f%% remote (pulled upserts and deletes of other "
                + "entities, a new cursor every 100); after replay %@ entities visible, %@ intents in the outbox.",
            Report.grouped(outcome.entries), percent(kinds.creates), percent(kinds.updates), percent(kinds.deletes),
            percent(kinds.acks), percent(kinds.remotes), Report.grouped(kinds.visible), Report.grouped(kinds.pending))
    }

    private static func measure(
        entries: Int, _ durability: Durability, _ workload: TimeEntryWorkload, _ workspace: Workspace
    ) async throws -> Outcome {
        progress("replay: building a log of \(Report.grouped(entries)) entries (.\(durability.rawValue))")
        let name = "replay-\(entries)-\(durability.rawValue)"
        defer { workspace.remove(name) }
        let store = try Store(path: workspace.path(name), options: EventLog.Options(durability: durability))
        defer { store.close() }
        let clock = ContinuousClock()
        let buildStart = clock.now
        let kinds = try await onDedicatedThread("bench replay log") {
            var builder = ReplayLogBuilder(workload: workload)
            var appended = 0
            while appended < entries {
                let count = min(appendBatchCount, entries - appended)
                let bodies = (0..<count).map { _ in builder.next() }
                let range = try store.log.appendBlocking(contentsOf: bodies)
                guard range == UInt64(appended + 1)...UInt64(appended + count) else {
                    throw BenchError("appendBlocking(contentsOf:) returned \(String(describing: range))")
                }
                appended += count
            }
            return builder.counts
        }
        let buildTime = clock.now - buildStart
        let logFileBytes = dataFileBytes(workspace, name)

        let scanTime = try await onDedicatedThread("bench replay scan") { try scanAll(store, expected: entries) }

        progress("replay: rebuildProjections over \(Report.grouped(entries)) entries (.\(durability.rawValue))")
        settleDisk()
        MemorySampler.trimHeap()
        let sampler = MemorySampler.start()
        let writtenBefore = MemorySampler.writtenBytes()
        let start = clock.now
        try await store.rebuildProjections()
        let elapsed = clock.now - start
        let writtenAfter = MemorySampler.writtenBytes()
        let memory = sampler?.finish()

        let visible = try store.count(type: TimeEntryWorkload.entityType)
        let pending = try store.outboxCount()
        guard visible == kinds.visible, pending == kinds.pending else {
            throw BenchError(
                "replay of \(entries) entries gave \(visible) visible entities and \(pending) pending intents, "
                    + "expected \(kinds.visible) and \(kinds.pending)")
        }
        let storeFileBytes = dataFileBytes(workspace, name)
        let names = try store.derivedDatabaseNamesInUse()
        store.close()
        var pageCheck: PageCheckTiming?
        if durability == .full {
            pageCheck = try await onDedicatedThread("bench page check") { try PageCheckTiming(path: workspace.path(name)) }
        }
        let tableWrite = try await onDedicatedThread("bench replay tables") {
            try writeTables(from: workspace.path(name), names: names, durability, replayedEntries: entries, workspace)
        }
        var compaction: CompactionTiming?
        if durability == .full {
            progress("replay: compact below the last offset, twice (.\(durability.rawValue))")
            let reopened = try Store(path: workspace.path(name), options: EventLog.Options(durability: durability))
            defer { reopened.close() }
            compaction = try await CompactionTiming(reopened)
        }
        return Outcome(
            durability: durability, entries: entries, kinds: kinds, elapsed: elapsed, buildTime: buildTime,
            scanTime: scanTime, tableWrite: tableWrite, logFileBytes: logFileBytes, storeFileBytes: storeFileBytes,
            memory: memory, writtenBytes: writtenAfter.flatMap { after in writtenBefore.map { after - $0 } },
            pageCheck: pageCheck, compaction: compaction)
    }
}

/// What `EventLog.Options.checkPagesOnOpen` costs: the (closed) store at
/// `path` opened read-only with and without it, the best of `rounds` each,
/// beside its data file read page by page with pread alone, the read that
/// a check of every page cannot avoid. The page cache is warm.
struct PageCheckTiming {
    static let rounds = 3
    var open: Duration
    var checkedOpen: Duration
    var read: Duration
    var bytes: Int

    init(path: String) throws {
        func openTime(checkingPages: Bool) throws -> Duration {
            var options = EventLog.Options.inspecting
            options.checkPagesOnOpen = checkingPages
            return try (0..<Self.rounds).map { _ in
                try timed { try Store(path: path, options: options).close() }
            }.min()!
        }
        open = try openTime(checkingPages: false)
        checkedOpen = try openTime(checkingPages: true)
        let file = (path as NSString).appendingPathComponent("data.mdb")
        let descriptor = Foundation.open(file, O_RDONLY)
        guard descriptor >= 0 else { throw BenchError("cannot open \(file): \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
        var page = [UInt8](repeating: 0, count: pageSize)
        var total = 0
        read = try (0..<Self.rounds).map { _ in
            try timed {
                total = 0
                while true {
                    let got = page.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, pageSize, off_t(total)) }
                    guard got >= 0 else { throw BenchError("pread of \(file): \(String(cString: strerror(errno)))") }
                    if got == 0 { break }
                    total += got
                }
            }
        }.min()!
        bytes = total
    }
}

extension ReplayBenchmark {
    /// Copies the derived databases `names` (the set in use) of the (closed)
    /// store at `path` into a new environment with LMDB alone, timing only
    /// the writes: for `.process`, `Store.replayChunkCountMax` rows per
    /// commit and no sync; for `.full`, in as many commits as the replay of
    /// `replayedEntries` made, each with its two syncs (`fullFloorCommits`).
    static func writeTables(
        from path: String, names: [String], _ durability: Durability, replayedEntries: Int, _ workspace: Workspace
    ) throws -> (time: Duration, rows: Int) {
        let rows = try RawTableCopy.read(path: path, databases: names)
        let copy = "replay-tables"
        defer { workspace.remove(copy) }
        settleDisk()
        let perCommit =
            durability == .full
            ? max(1, (rows.count + fullFloorCommits(replayedEntries) - 1) / fullFloorCommits(replayedEntries))
            : Store.replayChunkCountMax
        let time = try RawTableCopy.write(
            rows, databases: names, to: workspace.path(copy), perCommit: perCommit, syncing: durability == .full)
        return (time, rows.count)
    }

    /// The commits a replay of `entries` makes: one per chunk.
    static func fullFloorCommits(_ entries: Int) -> Int {
        max(1, (entries + Store.replayChunkCountMax - 1) / Store.replayChunkCountMax)
    }

    /// Every entry read back and decoded (checksum, body, offsets), once.
    static func scanAll(_ store: Store, expected: Int) throws -> Duration {
        var count = 0
        let elapsed = try timed {
            var scanner = store.log.entries(from: 1)
            while try scanner.next() != nil { count += 1 }
        }
        guard count == expected else { throw BenchError("EntryScanner read \(count) entries, expected \(expected)") }
        return elapsed
    }
}

/// Makes the entries of a realistic log, one at a time, with the offsets
/// they will get (the log must start empty): local intents on `te`
/// entities, acks for some of them, and changes pulled from the server for
/// other entities. It keeps what it needs to stay valid (which entities
/// exist, which intents are waiting for an ack) and what replay must give.
struct ReplayLogBuilder {
    struct Counts: Codable, Sendable {
        var creates = 0
        var updates = 0
        var deletes = 0
        var acks = 0
        var remotes = 0
        /// Entities the app should see after the replay.
        var visible = 0
        /// Intents not acknowledged.
        var pending = 0
    }

    /// Out of 100: creates, updates, deletes, remote, then acks.
    static let createShare = 30
    static let updateShare = 20
    static let deleteShare = 5
    static let remoteShare = 20
    /// Local entities the server hears of, out of 100: every intent on them
    /// is acknowledged, in log order, soon after it; intents on the others
    /// stay pending (as if that part of the app's data had not synced yet).
    /// Acking some intents of an entity and not others would make states
    /// no server could produce.
    static let syncedShare = 40
    /// Updates and deletes mostly hit recent entities, as in an app.
    static let recentCount = 1000
    static let remotesPerPage = 100

    private let workload: TimeEntryWorkload
    private var random = SplitMix64(seed: 0x12E_91A7)
    private let baseMilliseconds = wallClockMilliseconds()
    private var nextOffset: UInt64 = 1
    private var idSequence = 0
    private var fieldIndex = 0
    /// Local entities that exist, by id, and each one's last acked version.
    private var live: [String] = []
    private var localVersions: [String: UInt64] = [:]
    private var synced: Set<String> = []
    /// Intents the server will acknowledge, oldest first.
    private var toAck: [(offset: UInt64, id: String)] = []
    private var toAckHead = 0
    /// Pulled entities: id, server version, deleted.
    private var remote: [(id: String, version: UInt64, deleted: Bool)] = []
    private var remoteLive = 0
    private var cursor = ""
    private var kinds = Counts()
    /// Intents on entities the server never hears of.
    private var unsynced = 0

    /// What the log holds so far and what replaying it must give.
    var counts: Counts {
        var counts = kinds
        counts.visible = live.count + remoteLive
        counts.pending = unsynced + toAck.count - toAckHead
        return counts
    }

    init(workload: TimeEntryWorkload) { self.workload = workload }

    mutating func next() -> EntryBody {
        defer { nextOffset += 1 }
        let roll = Int(random.next() % 100)
        let (update, delete, pulled) = (
            ReplayLogBuilder.createShare, ReplayLogBuilder.createShare + ReplayLogBuilder.updateShare,
            ReplayLogBuilder.createShare + ReplayLogBuilder.updateShare + ReplayLogBuilder.deleteShare
        )
        let ack = pulled + ReplayLogBuilder.remoteShare
        switch roll {
        case update..<delete where !live.isEmpty: return intent(.update)
        case delete..<pulled where !live.isEmpty: return intent(.delete)
        case pulled..<ack: return remoteChange()
        case ack... where toAckHead < toAck.count: return acknowledgement()
        default: return intent(.create)
        }
    }

    private mutating func newID() -> String {
        defer { idSequence += 1 }
        return TimeEntryWorkload.entityID(sequence: idSequence, base: baseMilliseconds, random: &random)
    }

    /// A live entity, 3 times in 4 among the most recent ones.
    private mutating func pickLive() -> Int {
        let recent = min(live.count, ReplayLogBuilder.recentCount)
        if random.next() % 4 != 0 { return live.count - 1 - Int(random.next() % UInt64(recent)) }
        return Int(random.next() % UInt64(live.count))
    }

    private mutating func intent(_ operation: Intent.Operation) -> EntryBody {
        // Time-ordered, as WriteBatch makes them (UUIDv7).
        let key = UUIDv7(
            high: (baseMilliseconds + UInt64(nextOffset >> 12)) << 16 | 0x7000 | (nextOffset & 0xFFF),
            low: 0x8000_0000_0000_0000 | random.next() >> 2
        ).uuidString
        let id: String
        var fields = Fields()
        switch operation {
        case .create:
            id = newID()
            fields = workload.fields(fieldIndex)
            fieldIndex += 1
            live.append(id)
            kinds.creates += 1
        case .update:
            id = live[pickLive()]
            let entry = workload.entry(fieldIndex)
            fieldIndex += 1
            fields["minutes"] = .int(entry.minutes)
            if random.next() % 2 == 0 { fields["description"] = .string(entry.description) }
            if random.next() % 5 == 0 { fields["billable"] = .bool(entry.billable) }
            kinds.updates += 1
        case .delete:
            let index = pickLive()
            id = live[index]
            // Keep the newest entities at the end: close to it, shift the
            // few after the hole; further in, move the last one into it.
            if live.count - index <= ReplayLogBuilder.recentCount {
                live.remove(at: index)
            } else {
                live.swapAt(index, live.count - 1)
                live.removeLast()
            }
            kinds.deletes += 1
        }
        if operation == .create && random.next() % 100 < ReplayLogBuilder.syncedShare { synced.insert(id) }
        if synced.contains(id) {
            toAck.append((nextOffset, id))
        } else {
            unsynced += 1
        }
        return .intent(
            Intent(
                operation, idempotencyKey: key, entityType: TimeEntryWorkload.entityType, entityID: id,
                baseVersion: localVersions[id] ?? 0, fields: fields))
    }

    private mutating func acknowledgement() -> EntryBody {
        let (offset, id) = toAck[toAckHead]
        toAckHead += 1
        if toAckHead > 4096 && toAckHead * 2 > toAck.count {
            toAck.removeFirst(toAckHead)
            toAckHead = 0
        }
        let version = (localVersions[id] ?? 0) + 1
        localVersions[id] = version
        kinds.acks += 1
        return .ack(Ack(intentOffset: offset, outcome: .applied, serverVersion: version))
    }

    /// 7 in 10 a new entity, else a new version of a pulled one (1 in 6 of
    /// those a delete).
    private mutating func remoteChange() -> EntryBody {
        if kinds.remotes % ReplayLogBuilder.remotesPerPage == 0 {
            cursor = "p\(kinds.remotes / ReplayLogBuilder.remotesPerPage)."
                + UUIDv7(high: baseMilliseconds << 16 | 0x7000, low: random.next() >> 2).ulidString
        }
        kinds.remotes += 1
        let change: Remote
        if remote.isEmpty || random.next() % 10 < 7 {
            let id = newID()
            remote.append((id, 1, false))
            remoteLive += 1
            change = Remote(
                cursor: cursor, .upsert, entityType: TimeEntryWorkload.entityType, entityID: id, serverVersion: 1,
                fields: workload.fields(fieldIndex))
        } else {
            let index = Int(random.next() % UInt64(remote.count))
            remote[index].version += 1
            let deleting = !remote[index].deleted && random.next() % 6 == 0
            if deleting {
                remote[index].deleted = true
                remoteLive -= 1
            } else if remote[index].deleted {
                remote[index].deleted = false
                remoteLive += 1
            }
            change = Remote(
                cursor: cursor, deleting ? .delete : .upsert, entityType: TimeEntryWorkload.entityType,
                entityID: remote[index].id, serverVersion: remote[index].version,
                fields: deleting ? [:] : workload.fields(fieldIndex))
        }
        fieldIndex += 1
        return .remote(change)
    }
}

/// Samples the process's memory from `/proc/self/status` on a thread of its
/// own, keeping the peaks (Linux only; elsewhere `start` returns nil), and
/// reads how much it has written from `/proc/self/io`.
final class MemorySampler: Sendable {
    static let intervalMicroseconds: UInt32 = 5000

    struct Reading: Sendable {
        var rssAnonKB = 0
        var rssFileKB = 0
        var hwmKB = 0
    }

    struct Summary: Sendable {
        var samples: Int
        var startRssAnonKB: Int
        var startRssFileKB: Int
        var peakRssAnonKB: Int
        var peakRssFileKB: Int
        /// VmHWM at the end, when it could be reset at the start.
        var hwmKB: Int?
    }

    private struct State {
        var samples = 0
        var peakAnon = 0
        var peakFile = 0
    }

    private let state = Mutex(State())
    private let stop = StopFlag()
    private let stopped = DispatchSemaphore(value: 0)
    private let start: Reading
    private let hwmReset: Bool

    private init(start: Reading, hwmReset: Bool) {
        self.start = start
        self.hwmReset = hwmReset
    }

    /// Gives freed heap back to the system, so anonymous memory measures
    /// what is in use rather than what glibc's malloc kept.
    static func trimHeap() {
        #if os(Linux)
            // glibc's malloc_trim, which the Glibc module does not export
            // (malloc.h); looked up by name, a no-op where it is missing.
            typealias MallocTrim = @convention(c) (Int) -> Int32
            if let symbol = dlsym(nil, "malloc_trim") {
                _ = unsafeBitCast(symbol, to: MallocTrim.self)(0)
            }
        #endif
    }

    /// Resets VmHWM and starts sampling; nil where `/proc/self/status` is missing.
    static func start() -> MemorySampler? {
        let hwmReset = resetPeak()
        guard let first = sample() else { return nil }
        let sampler = MemorySampler(start: first, hwmReset: hwmReset)
        sampler.record(first)
        let thread = Thread { [sampler] in
            while !sampler.stop.isRaised {
                if let reading = sample() { sampler.record(reading) }
                usleep(intervalMicroseconds)
            }
            sampler.stopped.signal()
        }
        thread.name = "bench memory sampler"
        thread.start()
        return sampler
    }

    /// Stops sampling (after one last sample) and returns the peaks.
    func finish() -> Summary {
        stop.raise()
        stopped.wait()
        let last = MemorySampler.sample()
        if let last { record(last) }
        return state.withLock { state in
            Summary(
                samples: state.samples, startRssAnonKB: start.rssAnonKB, startRssFileKB: start.rssFileKB,
                peakRssAnonKB: state.peakAnon, peakRssFileKB: state.peakFile, hwmKB: hwmReset ? last?.hwmKB : nil)
        }
    }

    private func record(_ reading: Reading) {
        state.withLock { state in
            state.samples += 1
            state.peakAnon = max(state.peakAnon, reading.rssAnonKB)
            state.peakFile = max(state.peakFile, reading.rssFileKB)
        }
    }

    /// The bytes the process has passed to write(2) and its kin so far
    /// (`wchar` in `/proc/self/io`); nil where that cannot be read.
    static func writtenBytes() -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/self/io", encoding: .utf8) else { return nil }
        let line = text.split(separator: "\n").first { $0.hasPrefix("wchar:") }
        return line.flatMap { Int($0.dropFirst("wchar:".count).trimmingCharacters(in: .whitespaces)) }
    }

    /// Writing 5 to `/proc/self/clear_refs` resets VmHWM to the current RSS.
    private static func resetPeak() -> Bool {
        let descriptor = open("/proc/self/clear_refs", O_WRONLY)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        return write(descriptor, "5", 1) == 1
    }

    /// One reading of `/proc/self/status`, parsed from the bytes (a few
    /// microseconds, so sampling takes little from the measured work).
    static func sample() -> Reading? {
        let descriptor = open("/proc/self/status", O_RDONLY)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 8192) { buffer -> Reading? in
            guard let base = buffer.baseAddress else { return nil }
            var count = 0
            while count < buffer.count {
                let got = read(descriptor, base + count, buffer.count - count)
                if got <= 0 { break }
                count += got
            }
            var reading = Reading()
            var found = 0
            var lineStart = 0
            for index in 0..<count where buffer[index] == UInt8(ascii: "\n") {
                let line = UnsafeBufferPointer(rebasing: buffer[lineStart..<index])
                lineStart = index + 1
                if let value = kilobytes(line, named: "RssAnon:") {
                    reading.rssAnonKB = value
                    found += 1
                } else if let value = kilobytes(line, named: "RssFile:") {
                    reading.rssFileKB = value
                    found += 1
                } else if let value = kilobytes(line, named: "VmHWM:") {
                    reading.hwmKB = value
                    found += 1
                }
            }
            return found == 3 ? reading : nil
        }
    }

    /// The number in a line like "RssAnon:\t    1234 kB" if it has that name.
    private static func kilobytes(_ line: UnsafeBufferPointer<UInt8>, named name: StaticString) -> Int? {
        let nameBytes = UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount)
        guard line.count > nameBytes.count, line.starts(with: nameBytes) else { return nil }
        var value = 0
        var digits = 0
        for byte in line[nameBytes.count...] where (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) {
            value = value * 10 + Int(byte - UInt8(ascii: "0"))
            digits += 1
        }
        return digits > 0 ? value : nil
    }
}

// MARK: - Section 7: read

/// Section 7: reads from one thread, the way an app's UI asks for entities.
enum ReadBenchmark {
    static let getTarget = 1_000_000.0
    static let storeName = "read"
    static let pageLimit = 1000
    static let passes = 2
    /// Creates (and acks) per transaction while populating.
    static let batchCount = 1000
    /// Entities the server has acknowledged, out of 100.
    static let syncedShare = 75
    /// The hot set: this many ids, each read `hotRounds` times.
    static let hotCount = 1000
    static let hotRounds = 100
    /// Gets per `Store.read` snapshot in the snapshot row: a screen's worth.
    static let snapshotGetCount = 100

    static func title(_ settings: Settings) -> String {
        "7. Read: Store.get and Store.all over \(Report.grouped(settings.store.readEntities)) entities"
    }

    struct Best: Sendable {
        var get: Duration = .seconds(Int64.max)
        var page: Duration = .seconds(Int64.max)
        /// LMDB alone, the store closed: `mdb_get` in one read transaction,
        /// and with a renewed transaction per get as the store's pool does.
        var rawGet: Duration = .seconds(Int64.max)
        var rawRenewGet: Duration = .seconds(Int64.max)
        /// The same with each value copied out: the least any get that
        /// returns the data does (it touches the value's bytes).
        var rawCopyGet: Duration = .seconds(Int64.max)
        /// `hotCount` ids read `hotRounds` times over: their pages stay in
        /// the CPU caches, so what remains is the code's own cost.
        var hotGet: Duration = .seconds(Int64.max)
        var rawHotCopyGet: Duration = .seconds(Int64.max)
        /// The shuffled ids, `snapshotGetCount` gets per `Store.read`.
        var snapshotGet: Duration = .seconds(Int64.max)
    }

    static func run(_ settings: Settings, _ workspace: Workspace) async throws -> ReportSection {
        let count = settings.store.readEntities
        let workload = TimeEntryWorkload()
        progress("read: creating \(Report.grouped(count)) entities")
        let store = try Store(path: workspace.path(storeName), options: EventLog.Options(durability: .process))
        defer {
            store.close()
            workspace.remove(storeName)
        }
        var ids = try await populate(store, count: count, workload)
        var random = SplitMix64(seed: 0x4EAD)
        ids.shuffle(using: &random)
        // Copied in the order they are read, as the raw loop's keys are, so
        // neither loop pays a cache miss on the id itself.
        let shuffled = ids.map { String(decoding: Array($0.utf8), as: UTF8.self) }
        progress("read: gets and pages")
        let path = store.path
        let best = try await onDedicatedThread("bench reads") {
            var best = try measure(store, ids: shuffled)
            // One environment per process: LMDB is opened directly only
            // once the store is closed.
            store.close()
            try measureRaw(path: path, ids: shuffled, into: &best)
            return best
        }
        let hotSize = min(hotCount, count)
        var section = ReportSection(title(settings))
        section.rows = [
            ResultRow(
                "Store.get(type:id:), shuffled ids, one thread", Double(count) / best.get.seconds, "gets/s",
                target: .atLeast(getTarget, "gets/s"),
                detail: String(
                    format: "%.0f ns per get; LMDB alone (store closed, same keys): mdb_get %.0f ns, with "
                        + "mdb_txn_renew + mdb_txn_reset around each %.0f ns, and with the value copied out too "
                        + "%.0f ns; the rest is the store's (key, Environment.read, record decode, Entity)",
                    Double(best.get.nanoseconds) / Double(count), Double(best.rawGet.nanoseconds) / Double(count),
                    Double(best.rawRenewGet.nanoseconds) / Double(count),
                    Double(best.rawCopyGet.nanoseconds) / Double(count))),
            ResultRow(
                "Store.get(type:id:), \(Report.grouped(hotSize)) ids read \(hotRounds) times",
                Double(hotSize * hotRounds) / best.hotGet.seconds, "gets/s",
                detail: String(
                    format: "%.0f ns per get; LMDB alone, with mdb_txn_renew + mdb_txn_reset and the value copied "
                        + "out: %.0f ns. The pages stay in the CPU caches, so this is the store's own cost without "
                        + "the memory latency of the shuffled row",
                    Double(best.hotGet.nanoseconds) / Double(hotSize * hotRounds),
                    Double(best.rawHotCopyGet.nanoseconds) / Double(hotSize * hotRounds))),
            ResultRow(
                "StoreSnapshot.get, shuffled ids, \(snapshotGetCount) per Store.read", Double(count) / best.snapshotGet.seconds,
                "gets/s",
                detail: String(
                    format: "%.0f ns per get: the shuffled row's gets, one read transaction for each %d of them "
                        + "(reads that must see one commit, such as a screen's entities)",
                    Double(best.snapshotGet.nanoseconds) / Double(count), snapshotGetCount)),
            ResultRow(
                "Store.all(type:after:limit: \(pageLimit)), every page", Double(count) / best.page.seconds, "entities/s",
                detail: String(format: "%.0f ns per entity", Double(best.page.nanoseconds) / Double(count))),
        ]
        section.notes = [
            "\(Report.grouped(count)) te entities created in batches of 1,000 (.process), \(syncedShare)% of them "
                + "then acknowledged (their records hold the confirmed and the visible state), read in a seeded "
                + "shuffled order (the ids, like the raw loop's keys, laid out in memory in that order); best of "
                + "\(passes) passes each, page cache warm. Each get is a read transaction "
                + "(pooled), a B-tree lookup, decoding the entity record and building an Entity."
        ]
        return section
    }

    /// Creates `count` entities in batches and has the server acknowledge
    /// the first `syncedShare` of them (records then hold the confirmed
    /// state and the visible one, as in an app that has synced); returns
    /// their ids.
    private static func populate(_ store: Store, count: Int, _ workload: TimeEntryWorkload) async throws -> [String] {
        var ids: [String] = []
        ids.reserveCapacity(count)
        while ids.count < count {
            var batch = WriteBatch()
            for index in ids.count..<min(ids.count + batchCount, count) {
                ids.append(try batch.create(type: TimeEntryWorkload.entityType, fields: workload.fields(index)))
            }
            try await store.write(batch)
        }
        let synced = count * syncedShare / 100
        var acknowledged = 0
        while acknowledged < synced {
            let pending = try store.outbox(limit: min(batchCount, synced - acknowledged))
            guard !pending.isEmpty else { throw BenchError("the outbox ran out after \(acknowledged) acks") }
            let settled = try await store.record(
                pending.map { ($0.offset, PushOutcome.acknowledged(.applied, serverVersion: 1)) }).settled
            guard settled.count == pending.count else { throw BenchError("record settled \(settled.count) intents") }
            acknowledged += settled.count
        }
        guard try store.outboxCount() == count - synced else { throw BenchError("the outbox holds the wrong intents") }
        return ids
    }

    /// The floor under `Store.get`: the same keys (`Format/storage.md`,
    /// entities: type, a zero byte, id) looked up with LMDB directly.
    private static func measureRaw(path: String, ids: [String], into best: inout Best) throws {
        let keys = ids.map { Array(TimeEntryWorkload.entityType.utf8) + [0] + Array($0.utf8) }
        let hotKeys = Array(repeating: keys.prefix(hotCount), count: hotRounds).flatMap { $0 }
        let reader = try RawEntityReader(path: path)
        defer { reader.close() }
        for _ in 0..<passes {
            var bytes = 0
            best.rawGet = min(best.rawGet, try timed { bytes &+= try reader.getAll(keys, renewEach: false) })
            best.rawRenewGet = min(best.rawRenewGet, try timed { bytes &+= try reader.getAll(keys, renewEach: true) })
            best.rawCopyGet = min(
                best.rawCopyGet, try timed { bytes &+= try reader.getAll(keys, renewEach: true, copyValue: true) })
            best.rawHotCopyGet = min(
                best.rawHotCopyGet, try timed { bytes &+= try reader.getAll(hotKeys, renewEach: true, copyValue: true) })
            guard bytes > 0 else { throw BenchError("raw gets read nothing") }
        }
    }

    private static func measure(_ store: Store, ids: [String]) throws -> Best {
        var best = Best()
        for _ in 0..<passes {
            var fieldCount = 0
            var hotFieldCount = 0
            let get = try timed {
                for id in ids {
                    guard let entity = try store.get(type: TimeEntryWorkload.entityType, id: id) else {
                        throw BenchError("Store.get found no te/\(id)")
                    }
                    fieldCount &+= entity.fields.count
                }
            }
            best.get = min(best.get, get)
            let hot = ids.prefix(hotCount)
            let hotGet = try timed {
                for _ in 0..<hotRounds {
                    for id in hot {
                        guard let entity = try store.get(type: TimeEntryWorkload.entityType, id: id) else {
                            throw BenchError("Store.get found no te/\(id)")
                        }
                        hotFieldCount &+= entity.fields.count
                    }
                }
            }
            best.hotGet = min(best.hotGet, hotGet)
            var snapshotFieldCount = 0
            let snapshotGet = try timed {
                for start in stride(from: 0, to: ids.count, by: snapshotGetCount) {
                    try store.read { snapshot in
                        for id in ids[start..<min(start + snapshotGetCount, ids.count)] {
                            guard let entity = try snapshot.get(type: TimeEntryWorkload.entityType, id: id) else {
                                throw BenchError("StoreSnapshot.get found no te/\(id)")
                            }
                            snapshotFieldCount &+= entity.fields.count
                        }
                    }
                }
            }
            best.snapshotGet = min(best.snapshotGet, snapshotGet)
            var seen = 0
            let page = try timed {
                var after: String?
                while true {
                    let page = try store.all(type: TimeEntryWorkload.entityType, after: after, limit: pageLimit)
                    guard let last = page.last else { break }
                    seen += page.count
                    after = last.id
                }
            }
            best.page = min(best.page, page)
            // Using the results keeps the optimizer from dropping the reads.
            guard fieldCount == ids.count * 4, hotFieldCount == hot.count * hotRounds * 4, snapshotFieldCount == ids.count * 4,
                seen == ids.count
            else {
                throw BenchError("reads saw \(fieldCount) fields and \(seen) paged entities for \(ids.count) entities")
            }
        }
        return best
    }
}

/// A store's `entities` database opened read-only with LMDB directly, for
/// the floor under `Store.get`. Open it only while the store is closed.
final class RawEntityReader {
    private let environment: OpaquePointer
    private let database: MDB_dbi
    private var isOpen = true

    init(path: String) throws {
        (environment, database) = try rawOpen(
            path: path, mapSize: RawLMDBLog.mapSizeBytes, readOnly: true, database: "entities")
    }

    deinit { close() }

    func close() {
        guard isOpen else { return }
        isOpen = false
        mdb_env_close(environment)
    }

    /// Looks up every key, in one read transaction or (`renewEach`) in a
    /// transaction renewed before and reset after each lookup, copying each
    /// value into a new array when `copyValue` is set; returns the bytes of
    /// the values found, and throws if one is missing.
    func getAll(_ keys: [[UInt8]], renewEach: Bool, copyValue: Bool = false) throws -> Int {
        var txn: OpaquePointer?
        try rawCheck(mdb_txn_begin(environment, nil, UInt32(MDB_RDONLY), &txn), "mdb_txn_begin")
        defer { mdb_txn_abort(txn) }
        if renewEach { mdb_txn_reset(txn) }
        var bytes = 0
        for key in keys {
            if renewEach { try rawCheck(mdb_txn_renew(txn), "mdb_txn_renew") }
            let result = key.withUnsafeBytes { raw in
                var keyValue = MDB_val(mv_size: raw.count, mv_data: UnsafeMutableRawPointer(mutating: raw.baseAddress))
                var value = MDB_val()
                let result = mdb_get(txn, database, &keyValue, &value)
                guard result == 0 else { return result }
                let found = UnsafeRawBufferPointer(start: value.mv_data, count: value.mv_size)
                if copyValue {
                    let copy = [UInt8](found)
                    bytes &+= copy.count &+ Int(copy.last ?? 0)
                } else {
                    bytes &+= found.count
                }
                return result
            }
            if renewEach { mdb_txn_reset(txn) }
            guard result == 0 else { throw RawLMDBError(code: result, operation: "mdb_get") }
        }
        return bytes
    }
}

private func rawCheck(_ result: Int32, _ operation: String) throws(RawLMDBError) {
    if result != 0 { throw RawLMDBError(code: result, operation: operation) }
}

/// The process's write system calls so far, from `/proc/self/io` (`wchar`:
/// bytes passed to write calls, `syscw`: their number), to tell what one
/// commit writes. The syncs are not counted.
struct WriteCounters: Sendable {
    var bytes = 0
    var calls = 0

    static func read() -> WriteCounters? {
        guard let text = try? String(contentsOfFile: "/proc/self/io", encoding: .utf8) else { return nil }
        var counters = WriteCounters()
        var found = 0
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ")
            guard parts.count == 2, let value = Int(parts[1]) else { continue }
            if parts[0] == "wchar:" {
                counters.bytes = value
                found += 1
            } else if parts[0] == "syscw:" {
                counters.calls = value
                found += 1
            }
        }
        return found == 2 ? counters : nil
    }

    /// What was written between two readings (nil if either is missing).
    static func written(from before: WriteCounters?, to after: WriteCounters?) -> WriteCounters? {
        guard let after, let before else { return nil }
        return WriteCounters(bytes: after.bytes - before.bytes, calls: after.calls - before.calls)
    }

    static func sum(_ sum: WriteCounters?, _ more: WriteCounters?) -> WriteCounters? {
        guard let sum, let more else { return nil }
        return WriteCounters(bytes: sum.bytes + more.bytes, calls: sum.calls + more.calls)
    }
}
