import Foundation
import LogFormat
import LogStore
import LogTesting

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A disk that fills and then has room again, under an app that keeps its
/// `Store`: the app writer (`AppWriter`, one batch per commit) limits the
/// size of the files it writes (`RLIMIT_FSIZE`) to a little more than its
/// store's data file, and writes until a batch fails as on a full disk.
/// Its reads must go on meanwhile, and once it lifts the limit its next
/// batches must commit on the same `Store`, which opens its environment
/// again by itself. No kill: the worker ends by itself, and the store,
/// opened afresh, must hold every acknowledged batch and nothing of a
/// failed one.
///
/// Reports: those of `AppWritesWorkload` (`try BATCH OP...`, `ack BATCH`,
/// `fail BATCH`, `seen BATCH WHAT` for a read that showed something of the
/// failed batch), and `full COUNT` (a read answered while the disk was
/// full, with the entity count) and `room` (the limit lifted).
struct FullDiskWorkload: StoreWorkload, Workload {
    static let name = "full-disk"
    static let summary = "app writes until the disk is full (RLIMIT_FSIZE), reads meanwhile, then writes on the same Store once there is room"

    /// Batches written before the limit.
    static let warmupCount = 20
    /// Room the limit leaves past the data file: a few commits' pages.
    static let headroomBytes = 64 << 10
    /// Batches after the limit is lifted, each of which must commit.
    static let afterCount = 20
    /// A bound on a run whose disk never fills.
    static let runDurationMax = Duration.seconds(120)

    let directory: String
    private var ledger = Ledger()

    init(directory: String) { self.directory = directory }

    // MARK: - The worker

    static func work(_ worker: Worker) async throws {
        // Past the limit, a write that would start beyond it raises
        // SIGXFSZ, which ends the process unless ignored; ignored, it fails
        // with EFBIG, as a full disk fails with ENOSPC.
        signal(SIGXFSZ, SIG_IGN)
        let store = try worker.openStore()
        var writer = AppWriter(task: 0, worker: worker)
        for _ in 0..<warmupCount { try await writer.writeBatch(store, worker) }
        try limitFileSize(try dataFileSize(worker.store) + headroomBytes)
        var failure: (any Error)?
        var written = 0
        while failure == nil, written < worker.writesMax {
            let before = try AppView(store)
            do {
                try await writer.writeBatch(store, worker)
                written += 1
            } catch {
                // These reads open the environment again, the disk still full.
                before.reportFailure(writer.lastBatch.id, of: writer.lastBatch.operations, store, worker)
                writer.forgetLastBatch()
                failure = error
            }
        }
        guard let failure else { throw HarnessError("the store never filled the disk") }
        FileHandle.standardError.write(Data("the disk is full: \(type(of: failure)): \(failure)\n".utf8))
        // Reads go on while the disk is full.
        worker.reporter.send("full", [String(try store.count(type: AppOperation.entityType))])
        try limitFileSize(nil)
        worker.reporter.send("room")
        for _ in 0..<afterCount { try await writer.writeBatch(store, worker) }
        store.close()
    }

    private static func dataFileSize(_ store: String) throws -> Int {
        guard let size = try FileManager.default.attributesOfItem(atPath: store + "/data.mdb")[.size] as? Int else {
            throw HarnessError("no size for \(store)/data.mdb")
        }
        return size
    }

    /// Sets this process's soft limit on the size of files it writes
    /// (nil: none), keeping the hard limit, so that it can lift it again.
    private static func limitFileSize(_ bytes: Int?) throws {
        #if os(Linux)
            let resource = __rlimit_resource_t(RLIMIT_FSIZE.rawValue)
        #else
            let resource = RLIMIT_FSIZE
        #endif
        var limit = rlimit()
        guard getrlimit(resource, &limit) == 0 else {
            throw HarnessError("getrlimit(RLIMIT_FSIZE): \(String(cString: strerror(errno)))")
        }
        limit.rlim_cur = bytes.map { rlim_t($0) } ?? limit.rlim_max
        guard setrlimit(resource, &limit) == 0 else {
            throw HarnessError("setrlimit(RLIMIT_FSIZE): \(String(cString: strerror(errno)))")
        }
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        try AppWritesWorkload.check(ledger, store, log: log, &context)
    }

    // MARK: - The parent

    mutating func iterate(_ context: inout IterationContext) async throws {
        let (worker, reports) = try await WorkerRun.endingByItself(
            Self.name, store: directory, durability: .full, within: Self.runDurationMax, &context)
        ledger.append(reports)
        context.tally.acknowledged += Self.acknowledgedCount(reports)
        judge(worker, reports, &context)
        await StoreCheck.afterCrash(Self.self, directory: directory, ledger: ledger, &context)
    }

    /// The worker must have filled the disk (a batch failed with an
    /// `LMDBError`), read while it was full without seeing the failed
    /// batch, and committed every batch once it had room; no failed batch
    /// may be acknowledged.
    private func judge(_ worker: ChildProcess, _ reports: [Report], _ context: inout IterationContext) {
        let errors = worker.errorText
        guard worker.ending == .exit(0) else {
            return context.violation("the full-disk worker ended with \(worker.ending): \(errors)")
        }
        context.tally.faults += 1
        context.tally.failedCommits += 1
        if !errors.contains("the disk is full: LMDBError") {
            context.violation("the write that filled the disk failed without an LMDBError: \(errors)")
        }
        let verbs = reports.map(\.verb)
        guard let full = verbs.firstIndex(of: "full"), let room = verbs.firstIndex(of: "room") else {
            return context.violation("the worker did not report reading while full and then having room: \(verbs)")
        }
        let acknowledgedAfter = verbs[room...].count { $0 == "ack" }
        if acknowledgedAfter != Self.afterCount {
            context.violation("\(acknowledgedAfter) of \(Self.afterCount) batches committed once the disk had room")
        }
        if full > room { context.violation("the worker had room before it read while full") }
        for seen in reports where seen.verb == "seen" {
            context.violation("a read showed the failed batch: \(seen.words.joined(separator: " "))")
        }
        let failed = Set(reports.filter { $0.verb == "fail" }.flatMap(\.words))
        for key in failed where reports.contains(where: { $0.verb == "ack" && $0.words.contains(key) }) {
            context.violation("the failed batch \(key) was acknowledged")
        }
    }
}
