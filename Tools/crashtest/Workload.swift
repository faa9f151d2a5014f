/// One way of crashing a writer: what runs, how it is stopped, and what
/// must hold afterwards. Adding a workload is one new file: a type
/// conforming to `StoreWorkload` (a worker process on a store, killed) or to
/// `Workload` (anything else; also both, for a worker the workload starts
/// itself), named in `Workloads`.
protocol Workload {
    /// The name `--workload` takes.
    static var name: String { get }
    /// One line for `--help`.
    static var summary: String { get }

    /// The parent's state for a fresh store (or server data directory) at
    /// `directory`, which does not exist yet.
    init(directory: String)

    /// Runs one iteration: start the writer, stop it (SIGKILL, or an
    /// injected fault), reopen and check, reporting every broken promise
    /// to `context`.
    /// - Throws: `HarnessError` when the harness itself cannot go on.
    mutating func iterate(_ context: inout IterationContext) async throws

    /// Stops what the workload left running (a server) after its last
    /// iteration.
    mutating func finish() async
}

extension Workload {
    mutating func finish() async {}
}

/// The workloads, in the order `--workload all` runs them.
enum Workloads {
    /// Those whose writer is a worker process on a store.
    static var stores: [any StoreWorkload.Type] {
        [
            AppendWorkload.self, AppWritesWorkload.self, PullWorkload.self, OutboxWorkload.self, CompactionWorkload.self,
            ReplayWorkload.self, ConflictWorkload.self,
        ]
    }

    /// Those whose worker process the workload starts itself, with more
    /// around it than `KilledWriter` has (a server).
    static var ownWorkers: [any StoreWorkload.Type] { [SyncWorkload.self, MapLimitWorkload.self, FullDiskWorkload.self] }

    static var all: [any Workload.Type] {
        stores.map { killed($0) } + [ServerWorkload.self, SyncWorkload.self, IOFaultWorkload.self]
    }

    /// Workloads that run only when named: each iteration takes seconds
    /// and checks what one iteration shows (`CrashTestTests` runs them).
    static var onRequest: [any Workload.Type] { [MapLimitWorkload.self, FullDiskWorkload.self] }

    private static func killed<Recipe: StoreWorkload>(_: Recipe.Type) -> any Workload.Type { KilledWriter<Recipe>.self }

    static func named(_ name: String) -> (any Workload.Type)? { (all + onRequest).first { $0.name == name } }

    /// The worker of a workload, for `crashtest worker --workload NAME`.
    static func worker(named name: String) -> (any StoreWorkload.Type)? { (stores + ownWorkers).first { $0.name == name } }

    /// The names, comma-separated, for help texts.
    static var names: String { (all + onRequest).map { $0.name }.joined(separator: ", ") }
}
