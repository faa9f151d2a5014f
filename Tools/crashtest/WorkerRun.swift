import Foundation
import LogStore
import LogTesting

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Starting a worker and killing it.
enum WorkerRun {
    /// A generous bound for a slow machine.
    static let exitWaitMax = Duration.seconds(60)

    /// The arguments that start a worker of `workload` on `store`.
    static func arguments(_ workload: String, store: String, seed: UInt64, _ options: HarnessOptions) -> [String] {
        ["worker", "--workload", workload, "--store", store, "--durability", options.durability.rawValue, "--seed", String(seed)]
            + (options.injectViolation ? ["--lie"] : []) + (options.injectHang ? ["--hang"] : [])
            + (options.injectExit ? ["--exit-early"] : [])
    }

    /// Starts a worker on `store`, kills it with SIGKILL after a random
    /// delay, and returns what it reported. Most kills wait for the worker
    /// to report `ready` first, so they land among its writes; one in
    /// `openKillShare` counts from the start, so some land while it opens.
    /// - Parameter more: arguments the workload's worker needs besides the
    ///   common ones.
    static func killed(_ workload: String, store: String, more: [String] = [], _ context: inout IterationContext) async throws -> [Report] {
        let seed = context.workerSeed()
        let worker = try ChildProcess(
            "worker", executable: context.options.executable,
            arguments: arguments(workload, store: store, seed: seed, context.options) + more)
        let afterReady = Int.random(in: 0..<openKillShare, using: &context.random) != 0
        let delay = context.randomDelay()
        // A lying worker is killed only after its lie, so that it is told.
        let start = context.options.injectViolation ? "lied" : afterReady ? "ready" : nil
        // A worker that never gets there hung opening or recovering its
        // store: that is what a kill must never lead to.
        let wait = context.options.readyWaitMax
        if let start, await worker.waitForLine(timeout: wait, where: { $0 == start }) == nil {
            context.violation("the worker (seed \(seed)) did not report \(start) within \(wait): it hung opening or recovering \(store)")
        }
        try? await Task.sleep(for: delay)
        worker.kill()
        guard await worker.waitForExit(timeout: exitWaitMax) else {
            // A worker that crashed by itself may be held up by the Swift
            // runtime's backtracer, which keeps its stderr open.
            throw HarnessError("worker pid \(worker.pid) on \(store) did not end within \(exitWaitMax) of SIGKILL: \(worker.errorText)")
        }
        if worker.ending == .signal(SIGKILL) {
            context.tally.kills += 1
        } else {
            context.violation("the worker (seed \(seed)) ended by itself with \(worker.ending) before its kill: \(worker.errorText)")
        }
        return parse(worker.outputLines, &context)
    }

    /// Starts a worker on `store` with `durability` that ends by itself
    /// (no kill), and returns it ended, with what it reported.
    /// - Throws: `HarnessError` when it has not ended within `durationMax`.
    static func endingByItself(
        _ workload: String, store: String, durability: Durability, within durationMax: Duration, _ context: inout IterationContext
    ) async throws -> (worker: ChildProcess, reports: [Report]) {
        var options = context.options
        options.durability = durability
        let worker = try ChildProcess(
            "worker", executable: options.executable,
            arguments: arguments(workload, store: store, seed: context.workerSeed(), options))
        guard await worker.waitForExit(timeout: durationMax) else {
            worker.kill()
            throw HarnessError("the \(workload) worker did not end within \(durationMax): \(worker.errorText)")
        }
        return (worker, parse(worker.outputLines, &context))
    }

    /// One kill in this many is timed from the start instead of from `ready`.
    static let openKillShare = 8

    static func parse(_ lines: [String], _ context: inout IterationContext) -> [Report] {
        lines.compactMap { line in
            guard let report = Report(line: line) else {
                context.violation("the worker wrote a line that is no report: \"\(line.prefix(80))\"")
                return nil
            }
            return report
        }
    }
}
