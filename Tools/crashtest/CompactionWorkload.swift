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
/// each intent recorded as applied, and `try compact:N WATERMARK` before
/// a compaction (followed by its steps' length in offsets, for one in
/// steps), `compacted WATERMARK` after it returned. With `--count`
/// (a fault run), also `try settle:N` before a settle, and for each
/// settle and compaction `ack STEP` after it returned or `fail STEP` when
/// it threw, as `AppWriter` reports its batches. N is the worker's tag and
/// a number, so a step is named once in a store's ledger.
enum CompactionWorkload: StoreWorkload {
    static let name = "compact"
    static let summary = "Store.compact in a loop while creates come and are acknowledged"

    /// The most pending intents one `record` call acknowledges.
    static let settleCountMax = 8
    /// How far below the log's end a compaction's watermark may be.
    static let watermarkLagMax: UInt64 = 40
    /// The same in a fault run, whose log is short: most of its
    /// compactions remove entries.
    static let faultRunWatermarkLagMax: UInt64 = 4
    /// The longest step of a compaction in steps, in offsets.
    static let stepOffsetsMax: UInt64 = 64
    /// The pause between compactions, in milliseconds.
    static let pauseMillisecondsMax = 30
    /// Entries a rebuild applies per transaction (see `ReplayWorkload`).
    static let rebuildChunkCount = 100

    static func work(_ worker: Worker) async throws {
        // Fault runs keep the default map, so that no growth adds calls.
        if worker.count != nil { return try await commitOneByOne(try worker.openStore(), worker) }
        let store = try worker.openStore(smallMap: true)
        let writer = AppWriter.loop(task: 0, store, worker, createsOnly: true)
        let settler: Worker.Loop = {
            for _ in 0..<worker.writesMax {
                if try await !settle(store, worker) { try await Task.sleep(for: .milliseconds(1)) }
            }
        }
        let compactor: Worker.Loop = {
            var random = SeededRandom(seed: ~worker.seed)
            for number in 0..<worker.writesMax {
                try await Task.sleep(for: .milliseconds(Int.random(in: 1...pauseMillisecondsMax, using: &random)))
                try await compact("compact:\(worker.tag)-\(number)", lagMax: watermarkLagMax, inSteps: true, store, worker, &random)
            }
        }
        let rebuilder: Worker.Loop = {
            for _ in 0..<worker.writesMax { try await store.rebuildProjections(entriesPerTransaction: rebuildChunkCount) }
        }
        try await Worker.runAll([writer, settler, compactor, rebuilder])
    }

    /// Acknowledges up to `settleCountMax` pending intents as applied, in
    /// one commit, and reports each.
    /// - Returns: false when none was pending (no commit).
    private static func settle(_ store: Store, _ worker: Worker) async throws -> Bool {
        let pending = try store.outbox(limit: settleCountMax)
        guard !pending.isEmpty else { return false }
        let settled = Set(try await store.record(pending.map { ($0.offset, .acknowledged(.applied, serverVersion: 1)) }).settled)
        for item in pending where settled.contains(item.offset) {
            worker.reporter.send("settled", [String(item.offset), item.intent.entityID])
        }
        return true
    }

    /// Compacts below a watermark up to `lagMax` under the log's end,
    /// reported as `step`; with `inSteps`, every other one in steps of 1 to
    /// `stepOffsetsMax` offsets (as `compact(below:)` compacts a long log),
    /// so that kills land between them. (A fault run's compaction stays one
    /// commit, which its Nth failed write belongs to.)
    private static func compact(
        _ step: String, lagMax: UInt64, inSteps: Bool, _ store: Store, _ worker: Worker, _ random: inout SeededRandom
    ) async throws {
        let last = try store.log.lastOffset()
        guard last > 1 else { return }
        let watermark = max(1, last - min(last, UInt64.random(in: 0...lagMax, using: &random)))
        // The lie: a compaction reported, far past the log's end, that never ran.
        if worker.reporter.lie("compacted", [String(last + Reporter.lieDistance)]) { return }
        if inSteps, Bool.random(using: &random) {
            let stepOffsets = UInt64.random(in: 1...stepOffsetsMax, using: &random)
            // Each step may be the last to commit before a kill.
            worker.reporter.send("try", [step, String(watermark), String(stepOffsets)])
            _ = try await store.compact(below: watermark, stepOffsets: stepOffsets)
        } else {
            worker.reporter.send("try", [step, String(watermark)])
            _ = try await store.compact(below: watermark)
        }
        worker.reporter.send("compacted", [String(watermark)])
    }

    /// `worker.count` commits one at a time, for a fault run (the Nth sync
    /// or write then belongs to a known commit): by turns a batch of
    /// creates, a settle of the intents pending and a compaction. A failed
    /// commit is reported (`fail STEP`) and ends the worker, after the
    /// reads show nothing of it (`seen STEP WHAT` otherwise) and one more
    /// batch shows whether the store now refuses writes, as it must.
    private static func commitOneByOne(_ store: Store, _ worker: Worker) async throws {
        var writer = AppWriter(task: 0, worker: worker, createsOnly: true)
        var random = SeededRandom(seed: ~worker.seed)
        for number in 0..<worker.writesMax {
            let round = "\(worker.tag)-\(number / 3)"
            let before = try AppView(store)
            let compactedBefore = try store.compactedBelow()
            // The settle or compaction under way; "" for a batch, which
            // reports itself.
            var step = ""
            do {
                switch number % 3 {
                case 0:
                    try await writer.writeBatch(store, worker)
                case 1:
                    step = "settle:\(round)"
                    worker.reporter.send("try", [step])
                    _ = try await settle(store, worker)
                    worker.reporter.send("ack", [step])
                default:
                    step = "compact:\(round)"
                    try await compact(step, lagMax: faultRunWatermarkLagMax, inSteps: false, store, worker, &random)
                    worker.reporter.send("ack", [step])
                }
            } catch {
                let failed = step.isEmpty ? writer.lastBatch.id : step
                let now = try? store.compactedBelow()
                let moved = now.flatMap { $0 != compactedBefore ? ["compactedBelow:\(compactedBefore)->\($0)"] : nil } ?? []
                before.reportFailure(failed, of: writer.lastBatch.operations, more: moved, store, worker)
                throw await CommitFailure.after(failed, failed: error) {
                    if step.isEmpty { writer.forgetLastBatch() }
                    try await writer.writeBatch(store, worker)
                    return "succeeded"
                }
            }
        }
    }

    /// Whether `report` is about a settle or a compaction (`try`, `ack`,
    /// `fail` or `seen` of `settle:N` or `compact:N`), not an app batch.
    private static func isStep(_ report: Report) -> Bool {
        guard let first = report.words.first else { return false }
        return first.hasPrefix("settle:") || first.hasPrefix("compact:")
    }

    /// Acknowledged batches, intents settled and compactions; the `ack` of
    /// a settle or a compaction is counted by its `settled` or `compacted`.
    static func acknowledgedCount(_ reports: [Report]) -> Int {
        reports.filter { Report.acknowledgementVerbs.contains($0.verb) && !isStep($0) }.count
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        let promises = AppPromises(ledger.reports.filter { !isStep($0) }, &context)
        _ = promises.checkIntents(log, &context)
        let promised = ledger.with("compacted").compactMap { $0.words.first.flatMap { UInt64($0) } }.max() ?? 0
        let compactedBelow = try store.compactedBelow()
        if compactedBelow < promised {
            context.violation("the log is compacted below \(compactedBelow), but a compaction below \(promised) was acknowledged")
        }
        try checkFailedCompactions(ledger, compactedBelow: compactedBelow, promised: promised, &context)
        var tried = Set<String>()
        for batch in promises.batches {
            for operation in batch.operations {
                tried.insert(operation.id)
                let seen = try store.get(type: AppOperation.entityType, id: operation.id)?.fields
                let broken =
                    batch.acknowledged ? seen != operation.fields : batch.failed ? seen != nil : seen != nil && seen != operation.fields
                if broken {
                    let state = batch.acknowledged ? "acknowledged" : batch.failed ? "whose write failed" : "in flight at a kill"
                    context.violation("te/\(operation.id), \(state), the app sees \(seen.map(\.description) ?? "nothing"), not what was created")
                }
            }
        }
        try checkSettled(ledger, store, &context)
        checkOffsetsKept(ledger, log, compactedBelow: compactedBelow, &context)
        try checkNoStrangers(store, tried: tried, &context)
        return promises.acknowledgedCount + ledger.with("settled").count + ledger.with("compacted").count
    }

    /// A log compacted further than every acknowledged compaction was
    /// compacted by one in flight at a kill: one tried and not failed, to
    /// its watermark or, in steps, to one of its steps'. A compaction whose
    /// commit failed left nothing.
    private static func checkFailedCompactions(
        _ ledger: Ledger, compactedBelow: UInt64, promised: UInt64, _ context: inout IterationContext
    ) throws {
        guard compactedBelow > promised else { return }
        let failed = Set(ledger.with("fail").compactMap(\.words.first))
        let tried = ledger.with("try").filter { $0.words.count >= 2 && $0.words[0].hasPrefix("compact:") }
        // In steps of S offsets: 1 + S, 1 + 2S, ... below the watermark.
        func reaches(_ report: Report) -> Bool {
            guard let watermark = UInt64(report.words[1]) else { return false }
            guard report.words.count == 3, let step = UInt64(report.words[2]), step > 0 else { return watermark == compactedBelow }
            return watermark == compactedBelow || (compactedBelow < watermark && compactedBelow > step && (compactedBelow - 1) % step == 0)
        }
        guard !tried.contains(where: { reaches($0) && !failed.contains($0.words[0]) }) else { return }
        let failedThere = tried.first(where: reaches).map { " (\($0.words[0]), whose commit failed)" } ?? ""
        context.violation("the log is compacted below \(compactedBelow), which no compaction that could have committed reached\(failedThere)")
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
