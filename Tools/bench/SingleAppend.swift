import Foundation
import LogFormat
import LogStore

/// Section 1: durable single-entry appends, one entry per commit, measured
/// three ways on one thread: our log, raw LMDB, and SQLite through GRDB.
///
/// The three methods alternate in rounds (each round starting with a
/// different one), so a burst of disk or CPU contention from elsewhere on
/// the machine falls on all of them alike rather than on whichever ran last.
enum SingleAppendBenchmark {
    struct Samples: Sendable {
        var ours: [Int64] = []
        var raw: [Int64] = []
        var sqlite: [Int64] = []
        var sqliteSettings: SQLiteOutbox.Settings?
    }

    static let title = "1. Durable single-entry append (.full, one entry per commit, one thread)"

    struct Outcome: Sendable {
        var section: ReportSection
        /// Our single-writer rate (entries/s), which section 2's ratios are
        /// taken against.
        var singleRate: Double
        var sqliteVersion: String
    }

    static func run(_ settings: Settings, _ workload: Workload, _ workspace: Workspace) async throws -> Outcome {
        let samples = try await onDedicatedThread("bench single appends") {
            try measureAll(settings, workload, workspace)
        }
        let ours = LatencySummary(nanoseconds: samples.ours)
        let raw = LatencySummary(nanoseconds: samples.raw)
        let sqlite = LatencySummary(nanoseconds: samples.sqlite)
        var section = ReportSection(title)
        section.rows = [
            ResultRow("ours: EventLog.appendBlocking", ours.ratePerSecond, "entries/s", latency: ours),
            ResultRow("raw LMDB: mdb_put(MDB_APPEND) + commit", raw.ratePerSecond, "entries/s", latency: raw),
            ResultRow("SQLite (GRDB, WAL, synchronous=FULL)", sqlite.ratePerSecond, "rows/s", latency: sqlite),
            ResultRow(
                "overhead ours/raw (mean latency)", ours.meanMicroseconds / raw.meanMicroseconds, "x",
                target: .atMost(1.3, "x"),
                detail: String(
                    format: "p50 ratio %.2fx, p99 ratio %.2fx", ours.p50Microseconds / raw.p50Microseconds,
                    ours.p99Microseconds / raw.p99Microseconds)),
            ResultRow(
                "ours vs SQLite (rate ours/SQLite)", ours.ratePerSecond / sqlite.ratePerSecond, "x",
                detail: String(
                    format: "above 1 means ours is faster; p50 %.0f µs vs %.0f µs; raw LMDB/SQLite rate %.2fx",
                    ours.p50Microseconds, sqlite.p50Microseconds, raw.ratePerSecond / sqlite.ratePerSecond)),
        ]
        section.notes = [
            "\(settings.singleCount) measured appends per method after \(settings.warmupCount) unmeasured, "
                + "in \(settings.rounds) interleaved rounds; rate = appends / time inside the append calls.",
            "raw LMDB: MDB_NOTLS only (as Environment for .full), 1 GiB map, 8-byte big-endian keys, "
                + "values from EntryCodec.encode (encoding inside the timed call, as ours does on its writer).",
            "SQLite: outbox table (id INTEGER PRIMARY KEY, idempotency_key, entity_type, entity_id, payload BLOB, "
                + "created_at), one INSERT per DatabaseQueue.write; "
                + (samples.sqliteSettings.map { "journal_mode=\($0.journalMode), synchronous=\($0.synchronous)" } ?? ""),
        ]
        return Outcome(
            section: section, singleRate: ours.ratePerSecond, sqliteVersion: samples.sqliteSettings?.sqliteVersion ?? "?")
    }

    /// Opens the three stores and runs the rounds; blocking, on its own thread.
    private static func measureAll(_ settings: Settings, _ workload: Workload, _ workspace: Workspace) throws -> Samples {
        let log = try EventLog(path: workspace.path("single-ours"), options: EventLog.Options(durability: .full))
        defer { log.close() }
        let raw = try RawLMDBLog(path: workspace.path("single-raw"))
        defer { raw.close() }
        let sqlite = try SQLiteOutbox(path: workspace.path("single-sqlite.db"))
        defer { try? sqlite.close() }

        // Each closure appends entry `index` and returns the nanoseconds the
        // store call took; building the input stays outside the timing.
        let methods: [(Int) throws -> Int64] = [
            { index in
                let body = workload.body(index)
                return try timed { _ = try log.appendBlocking(body) }.nanoseconds
            },
            { index in
                let body = workload.body(index)
                return try timed { try raw.append(workload.encode(body, offset: raw.lastOffset + 1)) }.nanoseconds
            },
            { index in
                let key = workload.idempotencyKey(index)
                let entityID = workload.entityID(index)
                let payload = workload.payloadData[index % Workload.payloadVariantCount]
                let createdAt = Int64(wallClockMilliseconds())
                return try timed {
                    try sqlite.insert(
                        idempotencyKey: key, entityType: Workload.entityType, entityID: entityID, payload: payload,
                        createdAt: createdAt)
                }.nanoseconds
            },
        ]
        var results = [[Int64]](repeating: [], count: methods.count)
        for (method, append) in methods.enumerated() {
            for index in 0..<settings.warmupCount { _ = try append(index) }
            results[method].reserveCapacity(settings.singleCount)
        }
        for round in 0..<settings.rounds {
            let first = round * settings.singleCount / settings.rounds
            let end = (round + 1) * settings.singleCount / settings.rounds
            for step in 0..<methods.count {
                let method = (round + step) % methods.count
                for index in first..<end { results[method].append(try methods[method](settings.warmupCount + index)) }
            }
        }
        let expected = settings.warmupCount + settings.singleCount
        guard try log.lastOffset() == UInt64(expected), raw.lastOffset == UInt64(expected),
            try sqlite.rowCount() == expected
        else { throw BenchError("a single-append store does not hold \(expected) entries") }
        return Samples(ours: results[0], raw: results[1], sqlite: results[2], sqliteSettings: sqlite.settings)
    }
}
