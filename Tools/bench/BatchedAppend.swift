import Foundation
import LogFormat
import LogStore

/// Section 3: batched appends. Each `append(contentsOf:)` call is one
/// transaction and one commit, so the syncs are shared by the whole batch.
enum BatchedAppendBenchmark {
    /// The `.full` store is kept for section 4 to scan.
    static let fullStoreName = "batched-full"
    static let processStoreName = "batched-process"
    static let rawStoreName = "batched-raw"
    static let rateTarget = 1_000_000.0

    struct Outcome: Sendable {
        var durability: Durability
        var entries: Int
        /// Time inside the `append(contentsOf:)` calls.
        var storeTime: Duration
        /// Time including building each batch's bodies.
        var wallTime: Duration
        var batchLatency: LatencySummary
        var fileBytes: Int

        var rate: Double { Double(entries) / storeTime.seconds }
    }

    static func title(_ settings: Settings) -> String {
        "3. Batched append (\(Report.grouped(settings.entries)) entries, \(Report.grouped(settings.batchSize)) per append(contentsOf:))"
    }

    static func run(_ settings: Settings, _ workload: Workload, _ workspace: Workspace, entryBytes: Int) async throws
        -> ReportSection
    {
        var section = ReportSection(title(settings))
        progress("batched append: .full")
        let full = try await measure(.full, name: fullStoreName, settings, workload, workspace)
        section.rows.append(row(full, entryBytes: entryBytes, target: .atLeast(rateTarget, "entries/s")))
        progress("batched append: raw LMDB")
        let raw = try await measureRaw(settings, workload, workspace, entryBytes: entryBytes)
        workspace.remove(rawStoreName)
        section.rows.append(
            ResultRow(
                "raw LMDB, same batches, values pre-encoded", raw.rate, "entries/s", latency: raw.batchLatency,
                detail: String(format: "ours takes %.2fx raw's time for the same batches", raw.rate / full.rate)))
        if settings.measureProcess {
            progress("batched append: .process")
            let process = try await measure(.process, name: processStoreName, settings, workload, workspace)
            workspace.remove(processStoreName)
            section.rows.append(row(process, entryBytes: entryBytes, target: nil))
        }
        section.notes = [
            "each entry: an update intent whose only field is one .bytes value of \(settings.payloadBytes) bytes; "
                + "\(entryBytes) bytes encoded (header included).",
            "rate = entries / time inside append(contentsOf:) (async API); building the bodies is outside the timing; "
                + "p50/p99 are per batch (one commit each). The store starts at EventLog's default map size and grows.",
            "raw LMDB: the same batches through mdb_put(MDB_APPEND), one transaction and commit each, values "
                + "encoded before the clock starts: the floor for .full. Ours minus raw is encoding (EntryCodec.encode, "
                + "CRC32C included) and the log's own work on its writer thread.",
        ]
        return section
    }

    private static func row(_ outcome: Outcome, entryBytes: Int, target: Target?) -> ResultRow {
        let megabytes = Double(outcome.entries * entryBytes) / 1e6
        return ResultRow(
            ".\(outcome.durability.rawValue), async append(contentsOf:)", outcome.rate, "entries/s",
            latency: outcome.batchLatency, target: target,
            detail: String(
                format: "%.0f MB/s of entry bytes; data file %.0f MB; %.0f entries/s counting body building",
                megabytes / outcome.storeTime.seconds, Double(outcome.fileBytes) / 1e6,
                Double(outcome.entries) / outcome.wallTime.seconds))
    }

    /// The raw LMDB floor: the same batches as `mdb_put(MDB_APPEND)` calls in
    /// one transaction each, with the values encoded before the clock starts.
    private static func measureRaw(_ settings: Settings, _ workload: Workload, _ workspace: Workspace, entryBytes: Int)
        async throws -> Outcome
    {
        let path = workspace.path(rawStoreName)
        let name = rawStoreName
        return try await onDedicatedThread("bench raw batches") {
            // Pages hold whole entries, so the file is larger than the bytes; 3x leaves room.
            let raw = try RawLMDBLog(path: path, mapSize: max(RawLMDBLog.mapSizeBytes, settings.entries * entryBytes * 3))
            defer { raw.close() }
            let clock = ContinuousClock()
            var samples: [Int64] = []
            let wallStart = clock.now
            var next = 0
            while next < settings.entries {
                let end = min(next + settings.batchSize, settings.entries)
                let values = try (next..<end).map { try workload.encodedEntry(index: $0, offset: UInt64($0 + 1)) }
                samples.append(try timed { try raw.append(contentsOf: values) }.nanoseconds)
                next = end
            }
            let wallTime = clock.now - wallStart
            guard raw.lastOffset == UInt64(settings.entries) else {
                throw BenchError("the raw batched log does not hold \(settings.entries) entries")
            }
            return Outcome(
                durability: .full, entries: settings.entries, storeTime: .nanoseconds(samples.reduce(0, +)),
                wallTime: wallTime, batchLatency: LatencySummary(nanoseconds: samples), fileBytes: workspace.sizeOfItem(name))
        }
    }

    private static func measure(
        _ durability: Durability, name: String, _ settings: Settings, _ workload: Workload, _ workspace: Workspace
    ) async throws -> Outcome {
        let log = try EventLog(path: workspace.path(name), options: EventLog.Options(durability: durability))
        let clock = ContinuousClock()
        var samples: [Int64] = []
        var storeNanoseconds: Int64 = 0
        let wallStart = clock.now
        var next = 0
        while next < settings.entries {
            let end = min(next + settings.batchSize, settings.entries)
            let bodies = workload.bodies(next..<end)
            let start = clock.now
            let range = try await log.append(contentsOf: bodies)
            let elapsed = (clock.now - start).nanoseconds
            guard let range, range.count == end - next, range.lowerBound == UInt64(next + 1) else {
                throw BenchError("append(contentsOf:) returned \(String(describing: range)) for entries \(next + 1)...\(end)")
            }
            samples.append(elapsed)
            storeNanoseconds += elapsed
            next = end
        }
        let wallTime = clock.now - wallStart
        guard try log.lastOffset() == UInt64(settings.entries) else {
            throw BenchError("the batched log does not hold \(settings.entries) entries")
        }
        log.close()
        return Outcome(
            durability: durability, entries: settings.entries, storeTime: .nanoseconds(storeNanoseconds),
            wallTime: wallTime, batchLatency: LatencySummary(nanoseconds: samples), fileBytes: workspace.sizeOfItem(name))
    }
}
