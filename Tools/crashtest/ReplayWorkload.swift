import Foundation
import LMDB
import LogFormat
import LogStore
import LogTesting

/// Full replays (`Store.rebuildProjections`) over and over while app
/// writes go on and the outbox's attempt state changes (`OutboxMarks`). A
/// replay fills the second set of derived tables, a chunk per transaction,
/// and switches to it in the last, so a kill can leave that set half full;
/// the reopen must finish it and bring the tables in line with the log,
/// with every acknowledged attempt state carried over. The map keeps
/// growing meanwhile (`Worker.smallMapSize`), under reads of the outbox.
/// Some workers first mark the tables as an older build's, so that their
/// open rebuilds them as an upgrade does, and are killed in that too.
///
/// Reports: those of `AppWriter` and `OutboxMarks`, `rebuilt` after each
/// replay, and `downgrade` before a worker marks the tables older and
/// `upgraded` once its open has rebuilt them (the outbox's attempt state
/// starts over then, as the older layout is not carried over).
enum ReplayWorkload: StoreWorkload {
    static let name = "replay"
    static let summary = "Store.rebuildProjections in a loop while app writes and outbox marks go on"

    /// Entries the log gets before replays start, so that each replay has
    /// something to do (written in batches of `seedBatchCount` creates).
    static let seedEntryCount: UInt64 = 2_000
    static let seedBatchCount = 50
    /// Entries a replay applies per transaction: a fraction of the log, so
    /// that each replay takes several chunks and most kills land between
    /// two of them (with `Store.replayChunkCountMax`, one chunk would
    /// replay the whole log and leave nothing part way for a reopen).
    static let chunkCount = 400
    /// One worker in this many opens tables marked as an older build's.
    static let upgradeShare = 4
    /// The projection version the tables are marked with: older than this
    /// build's, as a store an app upgrade opens has.
    static let olderProjectionVersion: UInt32 = 3

    static func work(_ worker: Worker) async throws {
        var random = SeededRandom(seed: worker.seed ^ 0x7570_6772)
        let upgrading = try Int.random(in: 0..<upgradeShare, using: &random) == 0 && markTablesOlder(worker)
        // Kills timed from `ready` land in the upgrade the open makes.
        if upgrading { worker.reporter.send("ready") }
        let store = try worker.openStore(reportingReady: false, smallMap: true)
        if upgrading { worker.reporter.send("upgraded") }
        var seeder = AppWriter(task: 0, worker: worker, createsOnly: true, operationsMax: seedBatchCount)
        // Each batch adds at least one entry, so this ends.
        while try store.log.lastOffset() < seedEntryCount { try await seeder.writeBatch(store, worker) }
        // Only now: kills timed from `ready` land among replays, not in the
        // seeding (about a second of a debug build's first iterations).
        if !upgrading { worker.reporter.send("ready") }
        let replayer: Worker.Loop = {
            for _ in 0..<worker.writesMax {
                try await store.rebuildProjections(entriesPerTransaction: chunkCount)
                worker.reporter.send("rebuilt")
            }
        }
        try await Worker.runAll([AppWriter.loop(task: 1, store, worker), replayer, OutboxMarks.loop(store, worker)])
    }

    /// Sets the store's `projection-version` (`Format/storage.md`, section
    /// 3) to `olderProjectionVersion`, so that the next open rebuilds every
    /// derived table, as after an upgrade.
    /// - Returns: false when there is no store with tables to mark yet.
    private static func markTablesOlder(_ worker: Worker) throws -> Bool {
        guard FileManager.default.fileExists(atPath: (worker.store as NSString).appendingPathComponent("data.mdb")) else { return false }
        // Before the write: from its commit on, the next open starts the
        // outbox's attempt state over.
        worker.reporter.send("downgrade")
        var options = Environment.Options()
        options.durability = worker.durability
        let environment = try Environment(path: worker.store, options: options)
        defer { environment.close() }
        guard let meta = try environment.openDatabase("meta", create: false) else { return false }
        try environment.write { txn in
            try txn.put(meta, key: Array("projection-version".utf8), value: olderProjectionVersion.bigEndianBytes)
        }
        return true
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        try AppPromises(ledger.reports, &context).check(store, log: log, rejected: [], &context)
            + OutboxMarks.check(ledger, store, &context)
    }

    static func acknowledgedCount(_ reports: [Report]) -> Int {
        reports.filter { Report.acknowledgementVerbs.contains($0.verb) || $0.verb == "marked" }.count
    }
}
