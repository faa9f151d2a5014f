import LogFormat
import LogStore

/// App writes through `Store`: batches of creates, updates and deletes,
/// each an intent plus its projection update in one commit, from
/// concurrent tasks, on a map that keeps growing (`Worker.smallMapSize`).
///
/// Reports: `try BATCH OP...` and `ack BATCH` (see `AppWriter`).
enum AppWritesWorkload: StoreWorkload {
    static let name = "app"
    static let summary = "create/update/delete batches through Store, with projections, from concurrent tasks"

    /// Concurrent writer tasks, each on entities of its own.
    static let writerCount = 3

    static func work(_ worker: Worker) async throws {
        let store = try worker.openStore(smallMap: true)
        try await Worker.runAll((0..<writerCount).map { AppWriter.loop(task: $0, store, worker) })
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        try AppPromises(ledger.reports, &context).check(store, log: log, rejected: [], &context)
    }
}
