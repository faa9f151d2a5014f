import Foundation
import LogFormat
import LogStore
import Synchronization

/// Section 2: group commit. Many appenders at once, `.full` durability; the
/// writer thread coalesces whatever is queued into one commit, so the rate
/// should grow with the number of appenders while each commit still pays
/// its two syncs.
///
/// Two ways of calling, both measured: threads calling `appendBlocking`
/// (servers, tools, code outside Swift concurrency) and tasks calling the
/// async `append` (what an app does).
enum GroupCommitBenchmark {
    enum Mode: String, CaseIterable, Sendable {
        case threads = "threads x appendBlocking"
        case tasks = "tasks x async append"
    }

    struct Outcome: Sendable {
        var mode: Mode
        var writers: Int
        var completed: Int
        var elapsed: Duration
        var latency: LatencySummary
        /// Commits made during the run (from LMDB's transaction id).
        var commits: Int

        var rate: Double { Double(completed) / elapsed.seconds }
    }

    /// The unmeasured appends that create the store's file and warm it.
    static let warmupCountMax = 50
    /// Bodies built ahead for each writer, which it cycles through, so the
    /// run measures the store rather than the building of intents (which
    /// would take CPU from the writer thread on a two-core machine).
    static let bodiesPerWriterCount = 256
    /// The group-commit stores start with a map no run fills (about 60 MB
    /// of entries fit in EventLog's default 64 MiB, and a 2 s run writes
    /// that much), because a map that fills inside `mdb_txn_commit` fails
    /// the environment today instead of growing it. Section 3 exercises growth.
    static let initialMapBytes = 1 << 30
    static let ratioTarget = 20.0

    static func title(_ settings: Settings) -> String {
        "2. Group commit (.full, concurrent appenders, \(settings.groupSeconds) s per run)"
    }

    /// - Parameter singleRate: section 1's single-writer rate, if it ran.
    static func run(_ settings: Settings, _ workload: Workload, _ workspace: Workspace, singleRate: Double?) async throws
        -> ReportSection
    {
        var section = ReportSection(title(settings))
        for mode in Mode.allCases {
            var outcomes: [Outcome] = []
            for writers in settings.writerCounts {
                progress("group commit: \(writers) \(mode.rawValue)")
                outcomes.append(try await measure(mode, writers: writers, settings, workload, workspace))
            }
            // The faster of the two single-writer measurements is the
            // reference: a slow moment of the disk during either would
            // otherwise flatter the ratio.
            let oneWriter = outcomes.first { $0.writers == 1 }?.rate
            let single = [singleRate, oneWriter].compactMap { $0 }.max()
            let reference = single ?? outcomes[0].rate
            // Without a single-writer run (`--writers` without 1, section 1
            // not run) the fewest writers measured are the reference, and
            // the row says so.
            let referenceName = single != nil ? "single-writer" : "\(outcomes[0].writers)-writer"
            section.rows += outcomes.map { row($0, singleRate: reference) }
            if let most = outcomes.max(by: { $0.writers < $1.writers }), most.writers > 1 {
                section.rows.append(
                    ResultRow(
                        "\(most.writers)-writer rate / \(referenceName) rate (\(mode == .threads ? "threads" : "tasks"))",
                        most.rate / reference, "x", target: .atLeast(ratioTarget, "x"),
                        detail: "\(referenceName) reference \(Report.format(reference, "entries/s"))"))
            }
        }
        section.notes = [
            "single-writer reference = the faster of section 1's EventLog.appendBlocking rate"
                + (singleRate.map { " (\(Report.format($0, "entries/s")))" } ?? " (not run)")
                + " and the same mode's 1-writer run here.",
            "each writer appends back to back until the run ends, cycling through \(bodiesPerWriterCount) bodies "
                + "built beforehand; rate = completed appends / run time; "
                + "p50/p99 are per-append latencies; commits counted from LMDB's last transaction id.",
            "tasks run on Swift's cooperative pool (one thread per core); the writer is a thread of its own.",
            "these stores start with a 1 GiB map: a map that fills inside mdb_txn_commit fails the environment "
                + "(.environmentFailed) instead of growing, which ended runs at EventLog's default 64 MiB.",
        ]
        return section
    }

    private static func row(_ outcome: Outcome, singleRate: Double) -> ResultRow {
        let perCommit = Double(outcome.completed) / Double(max(outcome.commits, 1))
        return ResultRow(
            "\(outcome.mode.rawValue) \(outcome.writers)", outcome.rate, "entries/s", latency: outcome.latency,
            detail: String(
                format: "%d appends in %d commits (%.1f entries/commit, %.0f commits/s), %.1fx the reference",
                outcome.completed, outcome.commits, perCommit, Double(outcome.commits) / outcome.elapsed.seconds,
                outcome.rate / singleRate))
    }

    /// One run in a fresh store: warm up, note the transaction id, run, and
    /// count the commits the run made.
    private static func measure(
        _ mode: Mode, writers: Int, _ settings: Settings, _ workload: Workload, _ workspace: Workspace
    ) async throws -> Outcome {
        let name = "group-\(mode == .threads ? "threads" : "tasks")-\(writers)"
        let path = workspace.path(name)
        defer { workspace.remove(name) }
        let warmupCount = min(settings.warmupCount, warmupCountMax)
        let options = {
            var options = EventLog.Options(durability: .full)
            options.initialMapSize = initialMapBytes
            return options
        }()
        let before = try await onDedicatedThread("bench warm-up") {
            let log = try EventLog(path: path, options: options)
            for index in 0..<warmupCount { _ = try log.appendBlocking(workload.body(index)) }
            log.close()
            return try transactionID(path)
        }
        let log = try EventLog(path: path, options: options)
        let seconds = settings.groupSeconds
        let (elapsed, perWriter) =
            switch mode {
            case .threads: try await runThreadWriters(log, writers: writers, seconds: seconds, workload)
            case .tasks: try await runTaskWriters(log, writers: writers, seconds: seconds, workload)
            }
        let completed = perWriter.reduce(0) { $0 + $1.count }
        guard try log.lastOffset() == UInt64(warmupCount + completed) else {
            throw BenchError("the group-commit log does not hold \(warmupCount + completed) entries")
        }
        log.close()
        let after = try transactionID(path)
        return Outcome(
            mode: mode, writers: writers, completed: completed, elapsed: elapsed,
            latency: LatencySummary(nanoseconds: perWriter.flatMap { $0 }), commits: after - before)
    }

    private static func transactionID(_ path: String) throws -> Int {
        let raw = try RawLMDBLog(path: path, readOnly: true)
        defer { raw.close() }
        return raw.lastTransactionID()
    }

    /// The bodies writer `writer` of `writers` cycles through: its own
    /// indices, so no two writers share one.
    private static func prebuiltBodies(writer: Int, writers: Int, _ workload: Workload) -> [EntryBody] {
        (0..<bodiesPerWriterCount).map { workload.body(writer + $0 * writers) }
    }

    /// `writers` threads append until `seconds` pass; returns the run time
    /// and each writer's latencies.
    private static func runThreadWriters(_ log: EventLog, writers: Int, seconds: Double, _ workload: Workload)
        async throws -> (Duration, [[Int64]])
    {
        try await onDedicatedThread("bench group control") {
            let stop = StopFlag()
            let collected = Collected()
            let elapsed = runThreads(count: writers, name: "bench writer", whileRunning: {
                Thread.sleep(forTimeInterval: seconds)
                stop.raise()
            }) { writer in
                let clock = ContinuousClock()
                let bodies = prebuiltBodies(writer: writer, writers: writers, workload)
                var latencies: [Int64] = []
                do {
                    while !stop.isRaised {
                        let body = bodies[latencies.count % bodies.count]
                        let start = clock.now
                        _ = try log.appendBlocking(body)
                        latencies.append((clock.now - start).nanoseconds)
                    }
                    collected.add(latencies)
                } catch {
                    collected.fail(error)
                }
            }
            return (elapsed, try collected.result())
        }
    }

    /// `writers` tasks append with the async API until `seconds` pass.
    private static func runTaskWriters(_ log: EventLog, writers: Int, seconds: Double, _ workload: Workload)
        async throws -> (Duration, [[Int64]])
    {
        let stop = StopFlag()
        let clock = ContinuousClock()
        let begin = clock.now
        let perWriter = try await withThrowingTaskGroup(of: [Int64].self) { group in
            // Whatever ends this closure, the writers must stop, or the group waits for them forever.
            defer { stop.raise() }
            for writer in 0..<writers {
                let bodies = prebuiltBodies(writer: writer, writers: writers, workload)
                group.addTask {
                    var latencies: [Int64] = []
                    while !stop.isRaised {
                        let body = bodies[latencies.count % bodies.count]
                        let start = clock.now
                        _ = try await log.append(body)
                        latencies.append((clock.now - start).nanoseconds)
                    }
                    return latencies
                }
            }
            try await Task.sleep(for: .seconds(seconds))
            stop.raise()
            var all: [[Int64]] = []
            for try await latencies in group { all.append(latencies) }
            return all
        }
        return (clock.now - begin, perWriter)
    }
}

/// What the writer threads hand back: their latencies, or the errors they
/// met. Every distinct error is kept (up to `distinctErrorCountMax`), since
/// the first one a thread records is not always the first that happened:
/// after a failed commit the others see only `.environmentFailed`.
private final class Collected: Sendable {
    static let distinctErrorCountMax = 4
    private let state = Mutex<(latencies: [[Int64]], errors: [String])>(([], []))

    func add(_ latencies: [Int64]) { state.withLock { $0.latencies.append(latencies) } }

    func fail(_ error: any Error) {
        let text = String(describing: error)
        state.withLock { state in
            if state.errors.count < Collected.distinctErrorCountMax && !state.errors.contains(text) {
                state.errors.append(text)
            }
        }
    }

    func result() throws -> [[Int64]] {
        try state.withLock { state in
            if !state.errors.isEmpty { throw BenchError("writers failed: " + state.errors.joined(separator: " | ")) }
            return state.latencies
        }
    }
}

/// A progress line on standard error, so standard output holds only the report.
func progress(_ message: String) {
    FileHandle.standardError.write(Data("bench: \(message)\n".utf8))
}
