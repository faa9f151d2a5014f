import Foundation
import LogTesting

/// Runs workloads iteration by iteration and prints what broke.
struct Harness {
    /// Iterations on one store before a workload starts a fresh one: enough
    /// to crash on top of earlier crashes, few enough that the checks,
    /// which read the whole store after every kill, stay fast.
    static let iterationsPerStoreMax = 10
    /// Violations printed in full per workload; the rest are counted.
    static let violationsShownMax = 20
    /// Iterations from which a workload run must have acknowledged a write.
    static let acknowledgedRunIterationsMin = 10

    let options: HarnessOptions

    func run(_ workloads: [any Workload.Type]) async throws -> Tally {
        var tally = Tally()
        for workload in workloads { tally.add(try await run(workload)) }
        return tally
    }

    private func run<W: Workload>(_: W.Type) async throws -> Tally {
        let started = ContinuousClock.now
        var tally = Tally()
        var workload = W(directory: directory(W.self, store: 0))
        var violationsBefore = 0
        do {
            for iteration in 0..<options.iterations {
                if iteration > 0 && iteration % Harness.iterationsPerStoreMax == 0 {
                    await workload.finish()
                    let store = iteration / Harness.iterationsPerStoreMax
                    // A store that broke a promise is kept for a look.
                    if tally.violations.count == violationsBefore {
                        try? FileManager.default.removeItem(atPath: directory(W.self, store: store - 1))
                    }
                    violationsBefore = tally.violations.count
                    workload = W(directory: directory(W.self, store: store))
                }
                var context = IterationContext(
                    options: options, workload: W.name, iteration: iteration,
                    random: SeededRandom(seed: options.seed ^ Payload.fnv1a("\(W.name)/\(iteration)")))
                try await workload.iterate(&context)
                context.tally.iterations += 1
                for violation in context.tally.violations.prefix(max(0, Harness.violationsShownMax - tally.violations.count)) {
                    say(violation)
                }
                tally.add(context.tally)
            }
        } catch {
            await workload.finish()
            throw error
        }
        await workload.finish()
        // A run that acknowledged nothing checked nothing: its workers never
        // wrote before their kills (a hang, or a worker that no longer
        // writes), and it must not pass as a clean run. One iteration may
        // acknowledge nothing (a kill timed from the start, or after a few
        // milliseconds; about one in seven), so only a run of
        // `acknowledgedRunIterationsMin` or more is held to it: all of them
        // doing so by chance is about one in 10^9.
        if tally.acknowledged == 0, tally.iterations >= Harness.acknowledgedRunIterationsMin, options.delayMillisecondsMax > 0 {
            let violation = Violation(
                workload: W.name, iteration: tally.iterations - 1,
                message: "no write was acknowledged in \(tally.iterations) iterations: nothing was checked")
            tally.violations.append(violation)
            say(violation)
        }
        let elapsed = ContinuousClock.now - started
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        Harness.say("crashtest: \(W.name): \(Harness.counts(tally)) (\(String(format: "%.1f", seconds)) s)")
        if let first = tally.violations.first {
            Harness.say("crashtest: replay with: crashtest --seed \(options.seed) --workload \(W.name) --iterations \(first.iteration + 1) --durability \(options.durability.rawValue)")
        }
        return tally
    }

    /// Prints a violation as it is found, with the seed that replays it.
    private func say(_ violation: Violation) {
        Harness.say("crashtest: VIOLATION (seed \(options.seed)) \(violation)")
    }

    private func directory<W: Workload>(_: W.Type, store: Int) -> String {
        (options.directory as NSString).appendingPathComponent("\(W.name)-\(store)")
    }

    /// Prints a line at once, so that a log (and CI) shows each workload
    /// as it ends, even when stdout is a pipe.
    static func say(_ line: String) {
        print(line)
        fflush(nil)
    }

    static func counts(_ tally: Tally) -> String {
        let faults =
            tally.faults + tally.faultsUnreached > 0
            ? ", \(tally.faults) I/O faults (\(tally.failedCommits) failed a write), \(tally.faultsUnreached) planned but never reached"
            : ""
        return "\(tally.iterations) iterations, \(tally.kills) kills\(faults), \(tally.acknowledged) acknowledged writes checked "
            + "\(tally.checks) times, \(tally.violations.count) violations"
    }

    /// The last line of a run.
    static func summary(_ tally: Tally, _ options: HarnessOptions) -> String {
        "crashtest: \(counts(tally)) (seed \(options.seed), durability \(options.durability.rawValue))"
    }
}

/// A failure of the harness itself (not of the store under test): a tool
/// that is missing, a directory it cannot make, a child that never ends.
/// (A child that cannot start at all is a `ChildProcessError`.)
struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
