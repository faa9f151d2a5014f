import Foundation
import LogFormat
import LogStore
import LogTesting

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A map that cannot grow: the append writer opens its store with a small
/// map (`Worker.smallMapSize`), limits its own address space (`RLIMIT_AS`)
/// to a little more than it uses once warmed up, and appends until a
/// growth of the map fails (`mmap` answers `ENOMEM`, as it does on a
/// device with a small address space). LMDB unmaps the old map before it
/// maps the new one, so after that failure the environment has no map:
/// the failed append must not be acknowledged, and its caller must get an
/// `LMDBError` saying so. The next append opens the environment again
/// (never touching the unmapped pages): it commits when it fits the map
/// as it was, or fails as the map cannot grow again; and the store must
/// reopen with every acknowledged append intact. No kill: the worker ends
/// by itself.
///
/// Reports: those of `AppendWorkload` (`try KEY...`, `ack FIRST KEY...`,
/// `fail KEY...`), a batch of `batchCount` per append.
struct MapLimitWorkload: Workload, StoreWorkload {
    static let name = "map-limit"
    static let summary = "appends until the map cannot grow (RLIMIT_AS): the store fails the append cleanly, reopens, and keeps what it acknowledged"

    /// Address space the worker leaves itself past what it uses once warmed
    /// up: the map outgrows it after a few MiB of appends.
    static let headroomBytes = 4 << 20
    /// Appends made before the limit, so the threads and allocator arenas
    /// the worker needs exist by then.
    static let warmupCount = 20
    static let batchCount = 50
    /// A bound on a run whose map never meets the limit.
    static let runDurationMax = Duration.seconds(120)

    let directory: String
    private var ledger = Ledger()

    init(directory: String) { self.directory = directory }

    mutating func iterate(_ context: inout IterationContext) async throws {
        let (worker, reports) = try await WorkerRun.endingByItself(
            Self.name, store: directory, durability: .process, within: Self.runDurationMax, &context)
        ledger.append(reports)
        context.tally.acknowledged += AppendWorkload.acknowledgedCount(reports)
        judge(worker, reports, &context)
        await StoreCheck.afterCrash(Self.self, directory: directory, ledger: ledger, &context)
    }

    /// The worker must end with a failed append (its map could not grow),
    /// told as an `LMDBError`, and a next append that the reopened
    /// environment committed, or failed as its map could not grow.
    private func judge(_ worker: ChildProcess, _ reports: [Report], _ context: inout IterationContext) {
        let errors = worker.errorText
        guard worker.ending == .exit(3) else {
            return context.violation("the worker ended with \(worker.ending), not a failed append: \(errors)")
        }
        // Counted with the I/O faults: the summary's one tally of writes
        // failed on purpose.
        context.tally.faults += 1
        context.tally.failedCommits += 1
        if !errors.contains("LMDBError") || !errors.contains("Cannot allocate memory") {
            context.violation("the append that could not grow the map failed without an LMDBError saying so: \(errors)")
        }
        let next = errors.components(separatedBy: "the next write: ").dropFirst().first ?? ""
        if !next.hasPrefix("succeeded") && !(next.hasPrefix("LMDBError") && next.contains("Cannot allocate memory")) {
            context.violation("the next append after the map could not grow did not reopen the store: \(errors)")
        }
        let failed = Set(reports.filter { $0.verb == "fail" }.flatMap(\.words))
        for key in failed where reports.contains(where: { $0.verb == "ack" && $0.words.contains(key) }) {
            context.violation("the failed append \(key) was acknowledged")
        }
    }

    static func work(_ worker: Worker) async throws {
        var options = worker.options
        options.initialMapSize = Worker.smallMapSize
        let log = try EventLog(path: worker.store, options: options)
        worker.reporter.send("ready")
        for number in 0..<worker.writesMax {
            if number == warmupCount { try limitAddressSpace() }
            let keys = (0..<batchCount).map { "\(worker.tag)-0-\(number)-\($0)" }
            worker.reporter.send("try", keys)
            let offsets: ClosedRange<UInt64>?
            do {
                offsets = try await log.append(contentsOf: keys.map(AppendWorkload.body(key:)))
            } catch {
                worker.reporter.send("fail", keys)
                throw await CommitFailure.after("append of \(keys[0])...", failed: error) {
                    "succeeded at offset \(try await reportedAppend(keys[0] + "-after", log, worker))"
                }
            }
            guard let offsets else { preconditionFailure("appending \(batchCount) entries returned no offsets") }
            worker.reporter.send("ack", [String(offsets.lowerBound)] + keys)
        }
    }

    /// Caps this process's address space at what it maps now plus
    /// `headroomBytes`.
    private static func limitAddressSpace() throws {
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmSize:") }),
            let kibibytes = line.split(separator: " ").dropFirst().first.flatMap({ Int($0) })
        else { throw HarnessError("no VmSize in /proc/self/status: the map-limit workload needs Linux") }
        let bytes = rlim_t(kibibytes * 1024 + headroomBytes)
        var limit = rlimit(rlim_cur: bytes, rlim_max: bytes)
        #if os(Linux)
            let resource = __rlimit_resource_t(RLIMIT_AS.rawValue)
        #else
            let resource = RLIMIT_AS
        #endif
        guard setrlimit(resource, &limit) == 0 else {
            throw HarnessError("setrlimit(RLIMIT_AS): \(String(cString: strerror(errno)))")
        }
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        AppendPromises(ledger.reports, &context).check(log, &context)
    }

    static func acknowledgedCount(_ reports: [Report]) -> Int { AppendWorkload.acknowledgedCount(reports) }
}
