import LogStore
import LogTesting

/// Settings of one run of the harness.
struct HarnessOptions: Sendable {
    var iterations: Int
    var seed: UInt64
    var durability: Durability
    /// The longest a writer runs before it is killed, in milliseconds.
    var delayMillisecondsMax: Int
    /// Where the stores go; each workload gets directories below it.
    var directory: String
    /// This executable, started again as a worker.
    var executable: String
    var syncserver: String
    /// Makes every writer lie once (`--inject-violation`).
    var injectViolation: Bool
    /// Makes every writer hang before it opens its store (`--inject-hang`).
    var injectHang = false
    /// Makes every writer exit (status 0) before it opens its store
    /// (`--inject-exit`).
    var injectExit = false
    /// How long a writer may take to report `ready` (a debug worker opens
    /// its store in well under a second; generous for a slow machine).
    var readyWaitMax = Duration.seconds(60)
    /// The call every io-faults run fails (`--fault-call`); nil: one drawn
    /// at random per run.
    var faultCall: Int?
}

/// A promise the store (or server) broke, or a rule it broke, and where.
struct Violation: Sendable, CustomStringConvertible {
    var workload: String
    var iteration: Int
    var message: String

    var description: String { "\(workload) iteration \(iteration): \(message)" }
}

/// Counts over a run, for the summary line.
struct Tally: Sendable {
    var iterations = 0
    var kills = 0
    /// Runs in which strace injected the I/O fault planned for them, and
    /// those in which a commit (or the open) failed because of it.
    var faults = 0
    var failedCommits = 0
    /// Runs that ended before the call their fault was planned for.
    var faultsUnreached = 0
    /// Acknowledgements received, each counted once.
    var acknowledged = 0
    /// Acknowledged writes checked after a kill, counted at every check:
    /// each one is checked again after every later kill of its store.
    var checks = 0
    var violations: [Violation] = []

    mutating func add(_ other: Tally) {
        iterations += other.iterations
        kills += other.kills
        faults += other.faults
        failedCommits += other.failedCommits
        faultsUnreached += other.faultsUnreached
        acknowledged += other.acknowledged
        checks += other.checks
        violations += other.violations
    }
}

/// What one iteration of a workload works with, and where it reports.
struct IterationContext {
    let options: HarnessOptions
    let workload: String
    let iteration: Int
    /// Seeded from the run's seed, the workload and the iteration alone, so
    /// `--seed S --workload W --iterations I+1` replays iteration I's
    /// choices whatever earlier iterations drew.
    var random: SeededRandom
    var tally = Tally()

    mutating func violation(_ message: String) {
        tally.violations.append(Violation(workload: workload, iteration: iteration, message: message))
    }

    /// How long to let a writer run: 0 up to `delayMillisecondsMax`.
    mutating func randomDelay() -> Duration {
        .milliseconds(Int.random(in: 0...options.delayMillisecondsMax, using: &random))
    }

    /// A seed for a worker process.
    mutating func workerSeed() -> UInt64 { random.next() }
}
