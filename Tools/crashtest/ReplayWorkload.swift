import LogFormat
import LogStore

/// Full replays (`Store.rebuildProjections`) over and over while app
/// writes go on. A replay fills the second set of derived tables, a chunk
/// per transaction, and switches to it in the last, so a kill can leave
/// that set half full; the reopen must finish it and bring the tables in
/// line with the log. The map keeps growing meanwhile
/// (`Worker.smallMapSize`).
///
/// Reports: those of `AppWriter`, and `rebuilt` after each replay.
enum ReplayWorkload: StoreWorkload {
    static let name = "replay"
    static let summary = "Store.rebuildProjections in a loop while app writes go on"

    /// Entries the log gets before replays start, so that each replay has
    /// something to do (written in batches of `seedBatchCount` creates).
    static let seedEntryCount: UInt64 = 2_000
    static let seedBatchCount = 50

    static func work(_ worker: Worker) async throws {
        let store = try worker.openStore(reportingReady: false, smallMap: true)
        var seeder = AppWriter(task: 0, worker: worker, createsOnly: true, operationsMax: seedBatchCount)
        // Each batch adds at least one entry, so this ends.
        while try store.log.lastOffset() < seedEntryCount { try await seeder.writeBatch(store, worker) }
        // Only now: kills timed from `ready` land among replays, not in the
        // seeding (about a second of a debug build's first iterations).
        worker.reporter.send("ready")
        let replayer: Worker.Loop = {
            for _ in 0..<worker.writesMax {
                try await store.rebuildProjections()
                worker.reporter.send("rebuilt")
            }
        }
        try await Worker.runAll([AppWriter.loop(task: 1, store, worker), replayer])
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        try AppPromises(ledger.reports, &context).check(store, log: log, rejected: [], &context)
    }
}
