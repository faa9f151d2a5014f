import LogFormat
import LogStore
import LogTesting

/// Compaction (`Store.compact`) again and again while creates come and
/// are acknowledged: settled intents below the watermark fold into
/// snapshots, so an acknowledged create may leave the log, but never what
/// the app sees. A rebuild runs meanwhile, in small chunks: each compaction
/// starts it over, so kills land in rebuilds restarted by a compaction. The
/// map keeps growing meanwhile (`Worker.smallMapSize`).
///
/// Reports: those of `AppWriter` (creates only), `settled OFFSET ID` for
/// each intent recorded as applied, and `compacted WATERMARK`.
enum CompactionWorkload: StoreWorkload {
    static let name = "compact"
    static let summary = "Store.compact in a loop while creates come and are acknowledged"

    /// The most pending intents one `record` call acknowledges.
    static let settleCountMax = 8
    /// How far below the log's end a compaction's watermark may be.
    static let watermarkLagMax: UInt64 = 40
    /// The pause between compactions, in milliseconds.
    static let pauseMillisecondsMax = 30
    /// Entries a rebuild applies per transaction (see `ReplayWorkload`).
    static let rebuildChunkCount = 100

    static func work(_ worker: Worker) async throws {
        let store = try worker.openStore(smallMap: true)
        let writer = AppWriter.loop(task: 0, store, worker, createsOnly: true)
        let rebuilder: Worker.Loop = {
            for _ in 0..<worker.writesMax { try await store.rebuildProjections(entriesPerTransaction: rebuildChunkCount) }
        }
        try await Worker.runAll([writer, { try await settle(store, worker) }, { try await compact(store, worker) }, rebuilder])
    }

    /// Acknowledges pending intents as applied, and reports each.
    private static func settle(_ store: Store, _ worker: Worker) async throws {
        for _ in 0..<worker.writesMax {
            let pending = try store.outbox(limit: settleCountMax)
            guard !pending.isEmpty else {
                try await Task.sleep(for: .milliseconds(1))
                continue
            }
            let settled = Set(try await store.record(pending.map { ($0.offset, .acknowledged(.applied, serverVersion: 1)) }).settled)
            for item in pending where settled.contains(item.offset) {
                worker.reporter.send("settled", [String(item.offset), item.intent.entityID])
            }
        }
    }

    private static func compact(_ store: Store, _ worker: Worker) async throws {
        var random = SeededRandom(seed: ~worker.seed)
        for _ in 0..<worker.writesMax {
            try await Task.sleep(for: .milliseconds(Int.random(in: 1...pauseMillisecondsMax, using: &random)))
            let last = try store.log.lastOffset()
            guard last > 1 else { continue }
            let watermark = max(1, last - min(last, UInt64.random(in: 0...watermarkLagMax, using: &random)))
            // The lie: a compaction reported, far past the log's end, that never ran.
            if worker.reporter.lie("compacted", [String(last + Reporter.lieDistance)]) { continue }
            _ = try await store.compact(below: watermark)
            worker.reporter.send("compacted", [String(watermark)])
        }
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        let promises = AppPromises(ledger.reports, &context)
        _ = promises.checkIntents(log, &context)
        let promised = ledger.with("compacted").compactMap { $0.words.first.flatMap { UInt64($0) } }.max() ?? 0
        let compactedBelow = try store.compactedBelow()
        if compactedBelow < promised {
            context.violation("the log is compacted below \(compactedBelow), but a compaction below \(promised) was acknowledged")
        }
        var tried = Set<String>()
        for batch in promises.batches {
            for operation in batch.operations {
                tried.insert(operation.id)
                let seen = try store.get(type: AppOperation.entityType, id: operation.id)?.fields
                if batch.acknowledged ? seen != operation.fields : seen != nil && seen != operation.fields {
                    let state = batch.acknowledged ? "acknowledged" : "in flight at a kill"
                    context.violation("te/\(operation.id), \(state), the app sees \(seen.map(\.description) ?? "nothing"), not what was created")
                }
            }
        }
        try checkSettled(ledger, store, &context)
        checkOffsetsKept(ledger, log, compactedBelow: compactedBelow, &context)
        try checkNoStrangers(store, tried: tried, &context)
        return promises.acknowledgedCount + ledger.with("settled").count + ledger.with("compacted").count
    }

    /// Each acknowledged intent is confirmed at server version 1.
    private static func checkSettled(_ ledger: Ledger, _ store: Store, _ context: inout IterationContext) throws {
        for report in ledger.with("settled") {
            guard report.words.count == 2 else {
                context.violation("a malformed report: \(report)")
                continue
            }
            let entity = try store.get(type: AppOperation.entityType, id: report.words[1])
            if entity?.serverVersion != 1 || entity?.pendingIntentCount != 0 {
                let seen = entity.map { "version \($0.serverVersion) with \($0.pendingIntentCount) pending" } ?? "nothing"
                context.violation("te/\(report.words[1]): acknowledged at server version 1 (intent \(report.words[0])), but the app sees \(seen)")
            }
        }
    }

    /// Compaction keeps every entry at or above its watermark at its
    /// offset: each settled intent there is still in the log, where the
    /// outbox said it was. Below it an intent is folded away or kept where
    /// it was: no other intent takes its offset.
    private static func checkOffsetsKept(
        _ ledger: Ledger, _ log: [Entry], compactedBelow: UInt64, _ context: inout IterationContext
    ) {
        let intents = Dictionary(
            log.compactMap { entry -> (UInt64, String)? in
                guard case .intent(let intent) = entry.body else { return nil }
                return (entry.offset, intent.entityID)
            }, uniquingKeysWith: { first, _ in first })
        for report in ledger.with("settled") {
            guard report.words.count == 2, let offset = UInt64(report.words[0]) else { continue }
            if offset < compactedBelow, let found = intents[offset], found != report.words[1] {
                context.violation("log at offset \(offset), below the watermark \(compactedBelow): the intent on te/\(found), not te/\(report.words[1])'s settled create")
            } else if offset >= compactedBelow, intents[offset] != report.words[1] {
                let found = intents[offset].map { "the intent on te/\($0)" } ?? "no intent"
                context.violation("log at offset \(offset), at or above the watermark \(compactedBelow): \(found), not te/\(report.words[1])'s settled create")
            }
        }
    }

    /// Every entity the app sees was created by a worker.
    private static func checkNoStrangers(_ store: Store, tried: Set<String>, _ context: inout IterationContext) throws {
        for entity in try StoreCheck.entities(store, type: AppOperation.entityType) where !tried.contains(entity.id) {
            context.violation("te/\(entity.id): the app sees an entity no worker created")
        }
    }
}
