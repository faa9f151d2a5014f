import Foundation
import LogFormat
import LogStore
import LogTesting

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// I/O faults instead of kills: a worker making one write per commit runs
/// under `strace`, which makes the Nth call of one syscall fail. The worker
/// takes turns: the append worker; the app worker, whose batches commit
/// intents together with their projection and outbox updates; the
/// conflicts worker, whose pulled pages, updates, recorded answers and
/// conflict resolutions each commit log entries with the tables they
/// change; and the compaction worker, whose creates, settles and
/// compactions take turns (a compaction removes entries, writes snapshots
/// and deletes idempotency keys in one commit). The failed write must not be acknowledged, the error must
/// reach the caller as an `LMDBError` naming the failure, and no read may
/// show anything of it. The next write opens the store's environment
/// again: it must commit once the fault has passed, or meet the same
/// fault (a disk still full). The store, opened afresh, must hold every
/// acknowledged write, consistent, and nothing of the failed one. N is
/// drawn up to the most calls a run can make, so a run may end before its
/// Nth call: strace then injects nothing, and the run is counted as a
/// fault planned but never reached (strace marks each call it failed in
/// its trace).
///
/// What a `.full` commit calls, measured with `strace -f -c` on this
/// worker (24 appends: 24 `fdatasync`, 53 `pwrite64`, 26 `writev`) and
/// read in a full trace, with Debian's liblmdb 0.9.24:
/// - the dirty pages: `pwrite64` for a run of one page, `lseek` and
///   `writev` for a run of several (this build of LMDB has no
///   `MDB_USE_PWRITEV`, so `pwritev` is never called);
/// - one `fdatasync` of the data file (LMDB's first sync);
/// - one 120-byte `pwrite64` of the meta page to a second descriptor of
///   `data.mdb` opened with `O_DSYNC`: that write is LMDB's second sync,
///   which is why no second `fdatasync`, no `fsync` and no `msync` shows
///   (`msync` is used only with `MDB_WRITEMAP`, which the store does not set).
/// `writer.lock` also gets one `pwrite64` (the pid) at open, on another
/// thread; its failure is ignored by design. strace counts calls per
/// syscall and per thread, and all commits run on the store's writer
/// thread, so N counts that thread's calls: the Nth `fdatasync` is the Nth
/// commit's, and the Nth `pwrite64` lands on a data page or a meta page.
struct IOFaultWorkload: Workload {
    static let name = "io-faults"
    static let summary = "the append, app, conflicts and compact workers under strace with EIO or ENOSPC injected into the Nth sync or write"

    /// Writes a fault run makes, one commit each.
    static let appendCount = 24

    /// The workers, taking turns every `faults.count` runs, so that each
    /// fault comes to each; each writes to a store of its own.
    static var writers: [any StoreWorkload.Type] {
        [AppendWorkload.self, AppWritesWorkload.self, ConflictWorkload.self, CompactionWorkload.self]
    }

    /// One kind of fault, and how many calls of its syscall a run of
    /// `appendCount` commits makes at most (so N is drawn up to it).
    struct Fault: Sendable {
        var syscall: String
        var error: String
        /// What `strerror` says for the error, which the worker must print.
        var message: String
        /// From the Nth call on (a full disk), rather than the Nth alone.
        var persistent: Bool
        /// For each of `writers`, in its order. The app, conflicts and
        /// compaction workers' commits write more pages (outbox,
        /// idempotency keys, entity, conflict and log tables); measured as
        /// above, 24 commits made 76-81 `pwrite64` and 43-48 `writev`
        /// (app), 91-117 and 37-43 (conflicts), 94-154 and 30-60 (compact,
        /// over 19 runs on one store, as its log grew to 680 offsets).
        var callsMax: [Int]
        /// Whether the Nth call comes in every run: each `.full` commit
        /// makes one `fdatasync` on the writer thread, so a worker that
        /// ends well under it made a commit without its sync, or ignored
        /// the failure.
        var alwaysLands = false

        func rule(_ n: Int) -> String { "inject=\(syscall):error=\(error):when=\(n)\(persistent ? "+" : "")" }
    }

    static let faults = [
        Fault(
            syscall: "fdatasync", error: "EIO", message: "Input/output error", persistent: false,
            callsMax: [appendCount, appendCount, appendCount, appendCount], alwaysLands: true),
        Fault(
            syscall: "pwrite64", error: "EIO", message: "Input/output error", persistent: false,
            callsMax: [appendCount * 2 + 4, appendCount * 4, appendCount * 5, appendCount * 6]),
        Fault(
            syscall: "pwrite64", error: "ENOSPC", message: "No space left on device", persistent: true,
            callsMax: [appendCount * 2 + 4, appendCount * 4, appendCount * 5, appendCount * 6]),
        Fault(
            syscall: "writev", error: "ENOSPC", message: "No space left on device", persistent: true,
            callsMax: [appendCount + 2, appendCount * 2 + 4, appendCount * 2 + 4, appendCount * 2 + 12]),
    ]

    /// A worker under `strace` runs a few times slower; this bounds a hang.
    static let runDurationMax = Duration.seconds(120)

    let directory: String
    /// What each of `writers` reported, in `writers`' order.
    private var ledgers = writers.map { _ in Ledger() }
    /// Whether strace was seen to trace a process here (see `checkTracing`).
    private var tracingWorks = false

    init(directory: String) { self.directory = directory }

    mutating func iterate(_ context: inout IterationContext) async throws {
        guard let strace = ToolRun.onPath("strace") else {
            throw HarnessError("strace is not installed (Tools/ensure-packages installs it); the io-faults workload needs it")
        }
        if !tracingWorks {
            try await Self.checkTracing(strace)
            tracingWorks = true
        }
        let writerIndex = context.iteration / Self.faults.count % Self.writers.count
        let writer = Self.writers[writerIndex]
        let store = writerIndex == 0 ? directory : directory + "." + writer.name
        try Self.prepareStore(store)
        let fault = Self.faults[context.iteration % Self.faults.count]
        // Drawn also under --fault-call, so every later choice is the seed's.
        let callsMax = fault.callsMax[writerIndex]
        let drawn = Int.random(in: 1...callsMax, using: &context.random)
        let n = context.options.faultCall ?? drawn
        var options = context.options
        options.durability = .full
        // strace prints each traced call there, an injected one marked.
        let trace = directory + ".strace"
        defer { try? FileManager.default.removeItem(atPath: trace) }
        let arguments =
            ["-f", "-qq", "-o", trace, "-e", "trace=\(fault.syscall)", "-e", fault.rule(n), options.executable]
            + WorkerRun.arguments(writer.name, store: store, seed: context.workerSeed(), options)
            + ["--count", String(Self.appendCount)]
        // In a group of its own, so that a kill takes the traced worker too
        // (strace killed alone leaves it running, detached).
        let child = try ChildProcess("strace", executable: strace, arguments: arguments, ownProcessGroup: true)
        guard await child.waitForExit(timeout: Self.runDurationMax) else {
            child.kill()
            throw HarnessError("the worker under strace \(fault.rule(n)) did not end within \(Self.runDurationMax)")
        }
        let reports = WorkerRun.parse(child.outputLines, &context)
        ledgers[writerIndex].append(reports)
        let fired = try Self.injectedCallCount(trace) > 0
        if fired { context.tally.faults += 1 } else { context.tally.faultsUnreached += 1 }
        context.tally.acknowledged += writer.acknowledgedCount(reports)
        judge(child, reports, Planned(fault: fault, n: n, callsMax: callsMax, fired: fired), &context)
        await StoreCheck.afterCrash(writer, directory: store, ledger: ledgers[writerIndex], &context)
    }

    /// How many calls strace failed in a run, from its output at `path`:
    /// it marks each one it failed `(INJECTED)`. None when the run ended
    /// before the Nth call.
    private static func injectedCallCount(_ path: String) throws -> Int {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw HarnessError("strace left no trace at \(path)")
        }
        return text.split(separator: "\n").count { $0.hasSuffix("(INJECTED)") }
    }

    /// The fault a run was given, and whether strace injected it.
    struct Planned {
        var fault: Fault
        var n: Int
        var callsMax: Int
        var fired: Bool
        var rule: String { fault.rule(n) }
    }

    /// The worker must have made every write (the fault hit nothing a
    /// commit depends on, or never came) or failed with a clear
    /// `LMDBError`, without acknowledging the failed write or showing it
    /// to a read, and then reopened for the next one.
    private func judge(_ child: ChildProcess, _ reports: [Report], _ planned: Planned, _ context: inout IterationContext) {
        let (rule, fault) = (planned.rule, planned.fault)
        let acknowledged = reports.filter { $0.verb == "ack" }.count
        let failed = reports.filter { $0.verb == "fail" }.flatMap(\.words)
        for seen in reports where seen.verb == "seen" {
            context.violation("under \(rule) a read showed the failed write \(seen.words.joined(separator: " ")) (before the reopen)")
        }
        let errors = child.errorText
        switch child.ending {
        case .exit(0):
            if acknowledged != Self.appendCount {
                context.violation("under \(rule) the worker ended well after \(acknowledged) of \(Self.appendCount) writes")
            } else if fault.alwaysLands, planned.fired {
                context.violation("under \(rule) all \(Self.appendCount) writes were acknowledged: a failed sync was ignored")
            } else if fault.alwaysLands, planned.n <= planned.callsMax {
                context.violation("under \(rule) all \(Self.appendCount) writes were acknowledged before that sync: a commit did not sync")
            }
        case .exit(3):
            context.tally.failedCommits += 1
            if !errors.contains("LMDBError") || !errors.contains(fault.message) {
                context.violation("under \(rule) the worker failed without an LMDBError saying \"\(fault.message)\": \(errors)")
            }
            // The store opens its environment again: the next write commits
            // once the fault has passed (strace fails one call), or meets
            // the same fault (a disk that stays full; a commit that does not
            // call the failing syscall commits).
            let next = errors.components(separatedBy: "the next write: ").dropFirst().first ?? ""
            let faultAgain = fault.persistent && next.hasPrefix("LMDBError") && next.contains(fault.message)
            if !failed.isEmpty && !next.hasPrefix("succeeded") && !faultAgain {
                context.violation("under \(rule) the next write after a failed commit did not reopen the store and commit: \(errors)")
            }
            for key in failed where reports.contains(where: { $0.verb == "ack" && $0.words.contains(key) }) {
                context.violation("under \(rule) the failed write \(key) was acknowledged")
            }
        default:
            context.violation("under \(rule) the worker ended with \(child.ending): \(errors)")
        }
    }

    /// Creates the store before the faulty run, so that every run starts
    /// from an existing store, as a store's life is mostly spent.
    private static func prepareStore(_ directory: String) throws {
        guard !FileManager.default.fileExists(atPath: directory) else { return }
        do {
            try Store(path: directory, options: .init(durability: .full)).close()
        } catch {
            throw HarnessError("cannot create the store at \(directory): \(error)")
        }
    }

    /// strace that cannot trace (ptrace refused, as in a container without
    /// `CAP_SYS_PTRACE`) makes every run fail the same way, which would
    /// read as a store violating its guarantees: the harness cannot run
    /// this workload here, and says so.
    private static func checkTracing(_ strace: String) async throws {
        let probe = try ChildProcess("strace", executable: strace, arguments: ["-f", "-qq", "-o", "/dev/null", "/bin/true"])
        guard await probe.waitForExit(timeout: .seconds(60)) else {
            probe.kill()
            throw HarnessError("strace did not trace /bin/true within 60 s; the io-faults workload needs it")
        }
        guard probe.ending == .exit(0) else {
            throw HarnessError(
                "strace cannot trace here (\(probe.ending): \(probe.errorText.trimmingCharacters(in: .whitespacesAndNewlines))); "
                    + "the io-faults workload needs ptrace (in a container: --cap-add SYS_PTRACE)")
        }
    }
}
