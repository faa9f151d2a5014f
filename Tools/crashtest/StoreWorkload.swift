import LogFormat
import LogStore

/// A workload whose writer is a `crashtest worker` process on a store: the
/// parent starts it, kills it with SIGKILL after a random delay, reopens
/// the store and checks it against everything the workers reported
/// (`KilledWriter` runs it). A conforming type holds no state: the worker
/// side and the parent's check.
protocol StoreWorkload {
    /// The name `--workload` takes.
    static var name: String { get }
    /// One line for `--help`.
    static var summary: String { get }

    /// In the worker: opens the store, reports `ready`, and writes until
    /// killed (or, with `worker.count`, until that many writes are done),
    /// reporting each acknowledgement only after the call returned.
    static func work(_ worker: Worker) async throws

    /// In the parent, with the store reopened and its log read: checks
    /// every promise of the ledger.
    /// - Returns: how many acknowledged writes it checked.
    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int

    /// How many acknowledged writes these reports hold.
    static func acknowledgedCount(_ reports: [Report]) -> Int
}

extension StoreWorkload {
    /// By default, one acknowledged write per report of one.
    static func acknowledgedCount(_ reports: [Report]) -> Int {
        reports.filter { Report.acknowledgementVerbs.contains($0.verb) }.count
    }
}

/// A store workload as the harness runs it: the store's directory and
/// the reports of every worker that wrote to it.
struct KilledWriter<Recipe: StoreWorkload>: Workload {
    static var name: String { Recipe.name }
    static var summary: String { Recipe.summary }

    let directory: String
    private var ledger = Ledger()

    init(directory: String) { self.directory = directory }

    mutating func iterate(_ context: inout IterationContext) async throws {
        let reports = try await WorkerRun.killed(Recipe.name, store: directory, &context)
        ledger.append(reports)
        context.tally.acknowledged += Recipe.acknowledgedCount(reports)
        await StoreCheck.afterCrash(Recipe.self, directory: directory, ledger: ledger, &context)
    }
}
