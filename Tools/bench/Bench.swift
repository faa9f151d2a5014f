import ArgumentParser
import Foundation
import LogFormat

/// The counts one run uses, after `--quick` is applied.
struct Settings: Codable, Sendable {
    var singleCount: Int
    var warmupCount: Int
    var rounds: Int
    var writerCounts: [Int]
    var groupSeconds: Double
    var entries: Int
    var batchSize: Int
    var payloadBytes: Int
    var measureProcess: Bool
    var scanPasses: Int
    /// Sections 5-7 (`StoreBenchmarks.swift`).
    var store: StoreBenchSettings
    /// Section 8 (`ServerBenchmarks.swift`).
    var server: ServerBenchSettings
    /// Section 9 (`SyncBenchmarks.swift`).
    var sync: SyncBenchSettings
}

/// The store's benchmark, one run measuring side by side:
/// 1. durable single-entry appends: ours, raw LMDB, SQLite (`SingleAppend.swift`);
/// 2. group commit with concurrent appenders (`GroupCommitThroughput.swift`);
/// 3. batched appends (`BatchedAppend.swift`);
/// 4. a full scan of the log from 3 (`ScanRate.swift`);
/// 5-7. the app's store API (`StoreBenchmarks.swift`): creates with their
///    projection updates, batched and durable (beside SQLite), replay of
///    the projections from the log, and reads.
/// 8. the reference server over loopback HTTP (`ServerBenchmarks.swift`);
/// 9. the sync engine end to end: a flush of pending intents and an initial
///    pull, through `HTTPTransport` to that server (`SyncBenchmarks.swift`).
/// It prints a table (targets beside the numbers they apply to) and writes
/// the same results as JSON.
@main
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: """
            Measures the log's durable appends, group commit, batched appends and scans beside raw LMDB and SQLite, \
            the store's writes, replay and reads, the sync server, and the sync engine end to end.
            """,
        discussion: """
            Everything runs in one process, in a scratch directory that is removed at the end. Build it in \
            release mode; a debug build measures the compiler, not the store.
            """)

    /// The most concurrent appenders one run may ask for.
    static let writerCountMax = 1024
    /// The longest group-commit run, so a typo cannot hold the machine.
    static let groupSecondsMax = 60.0

    @Option(help: "Durable single-entry appends per method (ours, raw LMDB, SQLite).")
    var singleCount = 2000

    @Option(help: "Unmeasured appends per method before measuring.")
    var warmupCount = 100

    @Option(help: "Rounds the single-entry methods alternate in.")
    var rounds = 4

    @Option(help: "Concurrent appender counts for group commit, comma-separated.")
    var writers = "1,4,16,64"

    @Option(help: "Seconds each group-commit run lasts.")
    var groupSeconds = 2.0

    @Option(help: "Entries appended in batches, then scanned.")
    var entries = 1_000_000

    @Option(help: "Entries per append(contentsOf:) call (one commit each).")
    var batchSize = 10_000

    @Option(help: "Bytes in each entry's payload field.")
    var payloadBytes = 200

    @Option(help: "Passes over the log for each scan measurement (the best counts).")
    var scanPasses = 2

    @Option(help: "Section store-write: creates committed through Store.write(WriteBatch), .process durability.")
    var storeCreates = 100_000

    @Option(help: "Section store-write: creates per WriteBatch.")
    var storeBatchSize = 1000

    @Option(help: "Section store-write: durable single creates (ours and SQLite, each).")
    var storeSingleCount = 2000

    @Option(help: "Section replay: log sizes to build and replay, comma-separated.")
    var replayEntries = "100000,1000000"

    @Option(help: "Section read: entities to create and read back.")
    var readEntities = 100_000

    @Option(help: "Section sync: intents written to a store, then flushed by one sync.")
    var syncIntents = 10_000

    @Option(help: "Section sync: entities on the server that one sync pulls into an empty store.")
    var syncEntities = 100_000

    @Flag(inversion: .prefixedNo, help: "Also measure batched appends with .process durability.")
    var process = true

    @Flag(help: "Small counts for a CI smoke run (a few seconds); overrides the count options.")
    var quick = false

    @Option(
        help: """
            Sections to run, comma-separated: single, group, batched, scan (scan runs batched too), store-write, \
            replay, read, server, sync.
            """)
    var only = "single,group,batched,scan,store-write,replay,read,server,sync"

    @Option(help: "Where to write the results as JSON.")
    var json = "bench-results.json"

    @Option(help: "Directory for the scratch stores (default: the system's temporary directory).")
    var scratchDirectory: String?

    func validate() throws {
        guard singleCount > 0, warmupCount >= 0, rounds > 0, rounds <= singleCount else {
            throw ValidationError("--single-count and --rounds must be positive, with rounds <= single count")
        }
        let counts = try writerCounts()
        guard !counts.isEmpty, counts.allSatisfy({ $0 > 0 && $0 <= Bench.writerCountMax }) else {
            throw ValidationError("--writers takes counts from 1 to \(Bench.writerCountMax)")
        }
        guard groupSeconds > 0, groupSeconds <= Bench.groupSecondsMax else {
            throw ValidationError("--group-seconds must be in (0, \(Bench.groupSecondsMax)]")
        }
        guard entries > 0, batchSize > 0, batchSize <= entries, scanPasses > 0 else {
            throw ValidationError("--entries, --batch-size and --scan-passes must be positive, batch <= entries")
        }
        guard Set(sectionNames()).isSubset(of: Bench.sectionNamesKnown), !sectionNames().isEmpty else {
            throw ValidationError("--only takes \(Bench.sectionNamesKnown.sorted().joined(separator: ", "))")
        }
        guard payloadBytes >= 0, payloadBytes <= Limits.entryBodyBytesMax / 2 else {
            throw ValidationError("--payload-bytes must be in 0...\(Limits.entryBodyBytesMax / 2)")
        }
        guard storeCreates > 0, storeBatchSize > 0, storeBatchSize <= storeCreates, storeSingleCount >= rounds,
            readEntities > 0, syncIntents > 0, syncEntities > 0
        else {
            throw ValidationError(
                "--store-creates, --store-batch-size, --read-entities, --sync-intents and --sync-entities must be "
                    + "positive, batch <= creates, and --store-single-count at least --rounds")
        }
        let sizes = try replayEntryCounts()
        guard !sizes.isEmpty, sizes.allSatisfy({ $0 > 0 }) else {
            throw ValidationError("--replay-entries takes positive counts")
        }
    }

    static let sectionNamesKnown: Set<String> = [
        "single", "group", "batched", "scan", "store-write", "replay", "read", "server", "sync",
    ]

    private func sectionNames() -> [String] {
        only.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
    }

    private func writerCounts() throws -> [Int] {
        try writers.split(separator: ",").map { text in
            guard let count = Int(text.trimmingCharacters(in: .whitespaces)) else {
                throw ValidationError("--writers: \"\(text)\" is not a number")
            }
            return count
        }
    }

    private func replayEntryCounts() throws -> [Int] {
        try replayEntries.split(separator: ",").map { text in
            guard let count = Int(text.trimmingCharacters(in: .whitespaces)) else {
                throw ValidationError("--replay-entries: \"\(text)\" is not a number")
            }
            return count
        }
    }

    private func settings() throws -> Settings {
        if quick {
            return Settings(
                singleCount: 200, warmupCount: 20, rounds: 2, writerCounts: [1, 4, 16, 64], groupSeconds: 0.25,
                entries: 50_000, batchSize: 5_000, payloadBytes: payloadBytes, measureProcess: process, scanPasses: 1,
                store: StoreBenchSettings(
                    batchedCreates: 10_000, createsPerBatch: 1_000, singleCreates: 100, replayEntries: [20_000, 100_000],
                    readEntities: 20_000),
                server: ServerBenchSettings(pushOperations: 1_000, pushBatch: 500, pullChanges: 5_000, pullPage: 1_000),
                sync: SyncBenchSettings(intents: 1_000, entities: 10_000))
        }
        return Settings(
            singleCount: singleCount, warmupCount: warmupCount, rounds: rounds, writerCounts: try writerCounts(),
            groupSeconds: groupSeconds, entries: entries, batchSize: batchSize, payloadBytes: payloadBytes,
            measureProcess: process, scanPasses: scanPasses,
            store: StoreBenchSettings(
                batchedCreates: storeCreates, createsPerBatch: storeBatchSize, singleCreates: storeSingleCount,
                replayEntries: try replayEntryCounts().sorted(), readEntities: readEntities),
            server: ServerBenchSettings(pushOperations: 10_000, pushBatch: 500, pullChanges: 100_000, pullPage: 1_000),
            sync: SyncBenchSettings(intents: syncIntents, entities: syncEntities))
    }

    func run() async throws {
        let settings = try settings()
        let workspace = try Workspace.create(under: scratchDirectory ?? NSTemporaryDirectory())
        defer { workspace.removeAll() }
        let workload = Workload(payloadBytes: settings.payloadBytes)
        let sizes = try workload.encodedSizes()
        if workspace.fileSystem == "tmpfs" {
            progress("warning: \(workspace.root) is on tmpfs, where fsync costs nothing; use --scratch-directory")
        }
        progress("scratch stores in \(workspace.root) (\(workspace.fileSystem)); entry \(sizes.entry) bytes")

        let sections = Set(sectionNames())
        var report = Report(
            generatedAt: ISO8601DateFormatter().string(from: Date()), quick: quick, settings: settings,
            machine: Report.Machine(
                cores: ProcessInfo.processInfo.activeProcessorCount, scratchDirectory: workspace.root,
                scratchFileSystem: workspace.fileSystem, lmdbVersion: RawLMDBLog.libraryVersion, sqliteVersion: "-",
                loadAverageAtStart: loadAverage(), loadAverageAtEnd: ""),
            entryBytes: sizes.entry, entryBodyBytes: sizes.body)
        /// Whether the run includes one of `names`; if so, the disk is
        /// settled first (`settleDisk`), so each section starts clean.
        func runs(_ names: String...) -> Bool {
            guard names.contains(where: sections.contains) else { return false }
            settleDisk()
            return true
        }
        var singleRate: Double?
        if runs("single") {
            progress("single-entry appends")
            let single = try await SingleAppendBenchmark.run(settings, workload, workspace)
            report.machine.sqliteVersion = single.sqliteVersion
            report.add(single.section)
            singleRate = single.singleRate
        }
        if runs("group") {
            report.add(try await GroupCommitBenchmark.run(settings, workload, workspace, singleRate: singleRate))
        }
        if runs("batched", "scan") {
            report.add(try await BatchedAppendBenchmark.run(settings, workload, workspace, entryBytes: sizes.entry))
        }
        if runs("scan") {
            report.add(try await ScanBenchmark.run(settings, workspace, storeName: BatchedAppendBenchmark.fullStoreName))
        }
        if runs("store-write") {
            let storeWrite = try await StoreWriteBenchmark.run(settings, workspace)
            if report.machine.sqliteVersion == "-" { report.machine.sqliteVersion = storeWrite.sqliteVersion }
            report.add(storeWrite.section)
        }
        if runs("replay") {
            report.add(try await ReplayBenchmark.run(settings, workspace))
        }
        if runs("read") {
            report.add(try await ReadBenchmark.run(settings, workspace))
        }
        if runs("server") {
            report.add(try await ServerBenchmark.run(settings, workspace))
        }
        if runs("sync") {
            report.add(try await SyncBenchmark.run(settings, workspace))
        }

        report.machine.loadAverageAtEnd = loadAverage()
        print(header(report))
        print(report.table())
        try report.writeJSON(to: json)
        progress("wrote \(json)")
    }

    private func header(_ report: Report) -> String {
        """
        SyncStore bench\(quick ? " (quick)" : ""): \(report.machine.cores) cores, scratch on \
        \(report.machine.scratchFileSystem), \(report.machine.lmdbVersion), SQLite \(report.machine.sqliteVersion)
        entry (sections 1-4): update intent, one .bytes field of \(report.settings.payloadBytes) bytes = \
        \(report.entryBodyBytes)-byte body, \(report.entryBytes) bytes encoded
        load average (1/5/15 min) at start \(report.machine.loadAverageAtStart), at end \(report.machine.loadAverageAtEnd)
        """
    }

    /// The first three fields of `/proc/loadavg`, or "unknown".
    private func loadAverage() -> String {
        guard let text = try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8) else { return "unknown" }
        return text.split(separator: " ").prefix(3).joined(separator: " ")
    }
}
