import LogFormat
import LogStore

/// App writes through `Store`: batches of creates, updates and deletes,
/// each an intent plus its projection update in one commit, from
/// concurrent tasks, on a map that keeps growing (`Worker.smallMapSize`).
///
/// Reports: `try BATCH OP...` and `ack BATCH` (see `AppWriter`); with
/// `--count`, `fail BATCH` when the write threw, and `seen BATCH WHAT` for
/// each read that then still answered and showed something of it.
enum AppWritesWorkload: StoreWorkload {
    static let name = "app"
    static let summary = "create/update/delete batches through Store, with projections, from concurrent tasks"

    /// Concurrent writer tasks, each on entities of its own.
    static let writerCount = 3

    static func work(_ worker: Worker) async throws {
        // Fault runs keep the default map, so that no growth adds calls.
        let store = try worker.openStore(smallMap: worker.count == nil)
        if worker.count != nil { return try await writeOneByOne(store, worker) }
        try await Worker.runAll((0..<writerCount).map { AppWriter.loop(task: $0, store, worker) })
    }

    /// One batch per commit, in order, `worker.count` of them, from one
    /// task: under an injected fault the Nth sync belongs to a known batch.
    /// A failed batch is reported (`fail BATCH`) and ends the worker, after
    /// the reads show nothing of it (`seen` otherwise) and one more batch
    /// shows whether the store now refuses writes, as it must.
    private static func writeOneByOne(_ store: Store, _ worker: Worker) async throws {
        var writer = AppWriter(task: 0, worker: worker)
        for _ in 0..<worker.writesMax {
            let before = try AppView(store)
            do {
                try await writer.writeBatch(store, worker)
            } catch {
                let id = writer.lastBatch.id
                before.reportFailure(id, of: writer.lastBatch.operations, store, worker)
                throw await CommitFailure.after("batch \(id)", failed: error) {
                    writer.forgetLastBatch()
                    try await writer.writeBatch(store, worker)
                    return "succeeded"
                }
            }
        }
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        try AppPromises(ledger.reports, &context).check(store, log: log, rejected: [], &context)
    }
}

/// What the app sees of the writes of one task, read before a batch, so
/// that a failed batch can be shown to have left no trace in any read.
struct AppView {
    var entities: [String: Fields]
    var count: Int
    var outboxCount: Int

    init(_ store: Store) throws {
        entities = Dictionary(uniqueKeysWithValues: try StoreCheck.entities(store, type: AppOperation.entityType).map { ($0.id, $0.fields) })
        count = try store.count(type: AppOperation.entityType)
        outboxCount = try store.outboxCount()
    }

    /// Reports the write `failed` (`fail`), and each thing the reads of
    /// `store` now show of it (`seen`): what differs from this view for the
    /// entities of `operations`, and `more` differences the caller found.
    func reportFailure(
        _ failed: String, of operations: [AppOperation], more: [String] = [], _ store: Store, _ worker: Worker
    ) {
        worker.reporter.send("fail", [failed])
        for difference in differences(store, ids: operations.map(\.id)) + more {
            worker.reporter.send("seen", [failed, difference])
        }
    }

    /// What the reads of `store` show now that differs from this view, one
    /// word each, for the entities `ids` and the whole table. A read that
    /// throws shows nothing (a read after a failed commit opens the store
    /// again first, and fails when that does).
    func differences(_ store: Store, ids: [String]) -> [String] {
        var found: [String] = []
        for id in ids {
            if case .success(let seen) = Result(catching: { try store.get(type: AppOperation.entityType, id: id) }), seen?.fields != entities[id] {
                found.append("get:\(id)")
            }
        }
        if let all = try? StoreCheck.entities(store, type: AppOperation.entityType),
            Dictionary(uniqueKeysWithValues: all.map { ($0.id, $0.fields) }) != entities
        {
            found.append("all")
        }
        if let seen = try? store.count(type: AppOperation.entityType), seen != count { found.append("count:\(count)->\(seen)") }
        if let seen = try? store.outboxCount(), seen != outboxCount { found.append("outbox:\(outboxCount)->\(seen)") }
        return found
    }
}
