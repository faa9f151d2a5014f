import LogFormat
import LogStore
import LogTesting

/// The sync side of the outbox: the server's answers (acks as applied or
/// duplicate, and rejects) recorded with `Store.record` while creates keep
/// coming, as a sync engine does after each push.
///
/// Reports: those of `AppWriter` (creates only), and `settled OFFSET
/// OUTCOME` for each intent a `record` call settled.
enum OutboxWorkload: StoreWorkload {
    static let name = "outbox"
    static let summary = "acks and rejects recorded in the outbox (Store.record) while creates keep coming"

    /// The most pending intents one `record` call answers.
    static let settleCountMax = 8
    static let rejectCode = "VALIDATION_ERROR"

    /// The answers the workload records, as its reports name them.
    enum Outcome: String, CaseIterable, Sendable {
        case applied, duplicate, rejected

        var pushOutcome: PushOutcome {
            switch self {
            case .applied: .acknowledged(.applied, serverVersion: 1)
            case .duplicate: .acknowledged(.duplicate, serverVersion: 1)
            case .rejected: .rejected(code: OutboxWorkload.rejectCode, message: "crashtest")
            }
        }

        /// The outcome an answer entry records, and the intent it answers.
        static func of(_ body: EntryBody) -> (intentOffset: UInt64, outcome: Outcome)? {
            switch body {
            case .ack(let ack): (ack.intentOffset, ack.outcome == .applied ? .applied : .duplicate)
            case .reject(let reject): (reject.intentOffset, .rejected)
            default: nil
            }
        }
    }

    static func work(_ worker: Worker) async throws {
        let store = try worker.openStore()
        let writer = AppWriter.loop(task: 0, store, worker, createsOnly: true)
        try await Worker.runAll([writer, { try await settle(store, worker) }])
    }

    /// Answers some of the pending intents, each with a random outcome,
    /// and reports those the call settled.
    private static func settle(_ store: Store, _ worker: Worker) async throws {
        var random = SeededRandom(seed: ~worker.seed)
        for _ in 0..<worker.writesMax {
            let answers = try store.outbox(limit: settleCountMax).compactMap { pending -> (UInt64, Outcome)? in
                Bool.random(using: &random) ? (pending.offset, Outcome.allCases.randomElement(using: &random)!) : nil
            }
            guard !answers.isEmpty else {
                try await Task.sleep(for: .milliseconds(1))
                continue
            }
            // The lie: an answer reported as recorded for an intent that does not exist.
            if worker.reporter.lie("settled", [String(try store.log.lastOffset() + Reporter.lieDistance), Outcome.applied.rawValue]) { continue }
            let settled = Set(try await store.record(answers.map { ($0.0, $0.1.pushOutcome) }).settled)
            for (offset, outcome) in answers where settled.contains(offset) {
                worker.reporter.send("settled", [String(offset), outcome.rawValue])
            }
        }
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        var intents: [UInt64: Intent] = [:]
        var answers: [UInt64: (offset: UInt64, outcome: Outcome)] = [:]
        for entry in log {
            if case .intent(let intent) = entry.body { intents[entry.offset] = intent }
            guard let (intentOffset, outcome) = Outcome.of(entry.body) else { continue }
            if let first = answers[intentOffset] {
                context.violation("log at offset \(entry.offset): a second answer to the intent at \(intentOffset) (the first is at \(first.offset))")
            } else {
                answers[intentOffset] = (entry.offset, outcome)
            }
        }
        let rejected = Set(answers.filter { $0.value.outcome == .rejected }.keys)
        var checked = try AppPromises(ledger.reports, &context).check(store, log: log, rejected: rejected, &context)
        for report in ledger.with("settled") {
            guard report.words.count == 2, let offset = UInt64(report.words[0]), let outcome = Outcome(rawValue: report.words[1]) else {
                context.violation("a malformed report: \(report)")
                continue
            }
            checked += 1
            guard let answer = answers[offset] else {
                context.violation("the intent at offset \(offset) was acknowledged as \(outcome), but the log has no answer to it")
                continue
            }
            if answer.outcome != outcome {
                context.violation("the intent at offset \(offset) was acknowledged as \(outcome); the log answers it \(answer.outcome) at offset \(answer.offset)")
            }
            guard let intent = intents[offset] else {
                context.violation("the intent at offset \(offset), acknowledged as \(outcome), is not in the log")
                continue
            }
            try checkEntity(store, intent, outcome, &context)
        }
        return checked
    }

    /// A rejected create leaves what the app sees; an acknowledged one is
    /// confirmed at server version 1 with nothing pending.
    private static func checkEntity(_ store: Store, _ intent: Intent, _ outcome: Outcome, _ context: inout IterationContext) throws {
        let entity = try store.get(type: intent.entityType, id: intent.entityID)
        let name = "\(intent.entityType)/\(intent.entityID)"
        if outcome == .rejected {
            if entity != nil { context.violation("\(name): its create was rejected, yet the app sees it") }
        } else if entity?.serverVersion != 1 || entity?.pendingIntentCount != 0 {
            let seen = entity.map { "version \($0.serverVersion) with \($0.pendingIntentCount) pending" } ?? "nothing"
            context.violation("\(name): acknowledged (\(outcome)) at server version 1, but the app sees \(seen)")
        }
    }
}
