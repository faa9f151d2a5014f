import LogFormat
import LogStore
import LogSync
import LogTesting

/// The sync workload's worker, and the checks of its promises that need
/// only the store.
///
/// The worker writes app batches (`AppWriter`: creates, updates and deletes,
/// most of them on entities written before) while a sync loop runs the
/// engine again and again, with small push batches and pull pages, so that
/// a kill lands in a push, in a pull, between their requests, or between
/// runs.
///
/// With `--compact-after N`, a run that completes compacts the log below
/// its last offset once N offsets came since the last compaction
/// (`SyncConfiguration.compactAfterOffsets`), so that kills land in
/// compactions too, and between them and the pushes and pulls.
///
/// Reports: those of `AppWriter`; `sync RUN` before each run of the engine,
/// and `synced RUN CURSOR` after a run that completed, with the store's
/// pull cursor then (`-` for none), after `compacted WATERMARK` when the
/// run compacted. A worker syncs one run at a time, so each `synced`
/// answers the `sync` before it.
extension SyncWorkload: StoreWorkload {
    /// The longest pause after an app batch, and between sync runs, in
    /// milliseconds: writes come about as fast as a debug build syncs them.
    static let writePauseMillisecondsMax = 8
    static let syncPauseMillisecondsMax = 4
    static let noCursor = "-"

    /// Small batches and pages, so that a run makes many requests and
    /// kills land between them; compaction after runs when the harness
    /// asks for it (`--compact-after`).
    static func workerConfiguration(_ worker: Worker) -> SyncConfiguration {
        var configuration = SyncConfiguration()
        configuration.pushBatchCountMax = 8
        configuration.pullPageCountMax = 4
        configuration.compactAfterOffsets = worker.compactAfterOffsets
        configuration.resyncsPerRunMax = resyncsPerRunMax
        return configuration
    }

    /// Resyncs a worker's run may start. The harness compacts the feed of
    /// every third store several times a second, each compaction answering a
    /// resync part way 410 again; on a slow host more than the default 3
    /// would come in one run, which would then fail, and end the worker.
    static let resyncsPerRunMax = 50

    static func work(_ worker: Worker) async throws {
        guard let server = worker.server else { throw HarnessError("the sync worker needs --server") }
        let store = try worker.openStore()
        let engine = try engine(store, server: server, configuration: workerConfiguration(worker))
        try await Worker.runAll([
            AppWriter.loop(task: 0, store, worker, pauseMillisecondsMax: writePauseMillisecondsMax),
            { try await syncLoop(engine, store, worker) },
        ])
    }

    /// Runs the engine until the worker is killed. A run that does not
    /// complete ends the worker: the server is up, so nothing may fail.
    private static func syncLoop(_ engine: SyncEngine, _ store: Store, _ worker: Worker) async throws {
        var random = SeededRandom(seed: worker.seed ^ 0x5EED)
        for run in 0..<worker.writesMax {
            worker.reporter.send("sync", [String(run)])
            let report = await engine.sync()
            guard report.outcome == .completed else { throw HarnessError("sync run \(run) ended \(report.outcome)") }
            if let compaction = report.compaction { worker.reporter.send("compacted", [String(compaction.watermark)]) }
            worker.reporter.send("synced", [String(run), try store.pullCursor() ?? noCursor])
            try await Task.sleep(for: .milliseconds(Int.random(in: 0...syncPauseMillisecondsMax, using: &random)))
        }
    }

    /// Acknowledged batches, completed sync runs and their compactions.
    static func acknowledgedCount(_ reports: [Report]) -> Int {
        reports.filter { ["ack", "synced", "compacted"].contains($0.verb) }.count
    }

    /// A compaction a run reported is in the log, and, in a log never
    /// compacted, the app writes' promises (`checkPromises`). In a
    /// compacted one those need the server's feed, which has the intents
    /// compaction folded away: `SyncCheck` checks them.
    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        let promised = ledger.with("compacted").compactMap { $0.words.first.flatMap { UInt64($0) } }.max() ?? 0
        let compactedBelow = try store.compactedBelow()
        if compactedBelow < promised {
            context.violation("the log is compacted below \(compactedBelow), but a sync run reported a compaction below \(promised)")
        }
        if compactedBelow == 0 {
            try checkPromises(AppPromises(ledger.reports, &context), ledger, store, log: log, folded: [], &context)
        }
        return acknowledgedCount(ledger.reports)
    }

    /// The app writes' promises (`promises`, read from `ledger`), and:
    /// every intent of a batch acknowledged before a sync run began that
    /// then completed has its answer in the log (that run pushed it and
    /// recorded the answer before it returned), or was folded away with it.
    /// After a resync, until its pull has brought the entity's latest
    /// state, the app sees its pending intents applied to nothing or to a
    /// state the pull brought (a kill part way through that pull leaves
    /// such a state).
    /// - Parameters:
    ///   - log: the client's log, with the answers to its intents.
    ///   - folded: the operations, by identity, that the server applied
    ///     and the log no longer has: a compaction folded them away.
    static func checkPromises(
        _ promises: AppPromises, _ ledger: Ledger, _ store: Store, log: [Entry], folded: Set<String>, _ context: inout IterationContext
    ) throws {
        let present = promises.checkIntents(log, &context)
        promises.checkBatches(present, folded: folded, &context)
        var answered: [UInt64: Bool] = [:]  // intent offset: rejected
        // After the last resync: each app entity's confirmed states so far,
        // none at first, then each pulled one.
        var resyncBases: [String: [Fields?]]?
        for entry in log {
            switch entry.body {
            case .ack(let ack): answered[ack.intentOffset] = false
            case .reject(let reject): answered[reject.intentOffset] = true
            case .resync: resyncBases = [:]
            case .remote(let remote) where remote.entityType == AppOperation.entityType:
                resyncBases?[remote.entityID, default: [nil]].append(remote.operation == .delete ? nil : remote.fields)
            default: break
            }
        }
        try promises.checkVisible(
            store, present, folded: folded, rejected: Set(answered.filter(\.value).keys),
            resyncBases: resyncBases, answered: Set(answered.keys), &context)
        let synced = syncedBatches(ledger)
        for batch in promises.batches where synced.contains(batch.id) {
            for operation in batch.operations {
                // A batch missing from the log is reported by `checkBatches`.
                guard let offset = present[operation.identity], answered[offset] == nil else { continue }
                context.violation(
                    "the intent at offset \(offset) (\(operation.word)) has no answer in the log, but its batch \(batch.id) was acknowledged before a sync run that completed")
            }
        }
    }

    /// The batches acknowledged before the start of a sync run that
    /// completed.
    private static func syncedBatches(_ ledger: Ledger) -> Set<String> {
        var acknowledged: [String] = []
        var atRunStart = 0
        var synced = 0
        for report in ledger.reports {
            switch report.verb {
            case "ack": acknowledged.append(report.words.first ?? "")
            case "sync": atRunStart = acknowledged.count
            case "synced": synced = atRunStart
            default: break
            }
        }
        return Set(acknowledged.prefix(synced))
    }

    /// The pull cursor after the last sync run that completed, if it had one.
    static func lastSyncedCursor(_ ledger: Ledger) -> String? {
        guard let report = ledger.with("synced").last, report.words.count == 2, report.words[1] != noCursor else { return nil }
        return report.words[1]
    }
}
