import LogFormat
import LogStore

/// What app writers promised, read from their reports, and the checks of
/// a store against it.
struct AppPromises {
    struct Batch {
        var id: String
        var operations: [AppOperation]
        var acknowledged = false
        /// The write threw (`fail`): the caller was told it did not commit.
        var failed = false
    }

    private(set) var batches: [Batch] = []
    private var batchIndex: [String: Int] = [:]
    private var operations: [String: (batch: Int, operation: AppOperation)] = [:]

    init(_ reports: [Report], _ context: inout IterationContext) {
        for report in reports {
            switch report.verb {
            case "try":
                let parsed = report.words.dropFirst().compactMap(AppOperation.init(word:))
                guard let id = report.words.first, parsed.count == report.words.count - 1 else {
                    context.violation("a malformed report: \(report)")
                    continue
                }
                batchIndex[id] = batches.count
                for operation in parsed { operations[operation.identity] = (batches.count, operation) }
                batches.append(Batch(id: id, operations: parsed))
            case "ack":
                guard let id = report.words.first, let index = batchIndex[id] else {
                    context.violation("an acknowledgement of batch \(report.words.first ?? "?"), which was never tried")
                    continue
                }
                batches[index].acknowledged = true
            case "fail":
                guard let id = report.words.first, let index = batchIndex[id] else {
                    context.violation("a failure of batch \(report.words.first ?? "?"), which was never tried")
                    continue
                }
                batches[index].failed = true
            default:
                break
            }
        }
    }

    /// Acknowledged batches (each one `Store.write` call).
    var acknowledgedCount: Int { batches.filter(\.acknowledged).count }

    /// Every check below, for a store that was never compacted.
    /// - Parameter rejected: intents whose first answer is a reject; they
    ///   leave what the app sees.
    /// - Returns: how many acknowledged batches it checked.
    func check(_ store: Store, log: [Entry], rejected: Set<UInt64>, _ context: inout IterationContext) throws -> Int {
        let present = checkIntents(log, &context)
        checkBatches(present, &context)
        try checkVisible(store, present, rejected: rejected, &context)
        return acknowledgedCount
    }

    /// Checks that every app intent in the log was tried, once, and holds
    /// what was written.
    /// - Returns: the offset of each operation found, by identity.
    func checkIntents(_ log: [Entry], _ context: inout IterationContext) -> [String: UInt64] {
        var present: [String: UInt64] = [:]
        for entry in log {
            guard case .intent(let intent) = entry.body, intent.entityType == AppOperation.entityType else { continue }
            guard let identity = AppOperation.identity(of: intent), let (_, operation) = operations[identity] else {
                context.violation("log at offset \(entry.offset): an intent on te/\(intent.entityID) that was never tried")
                continue
            }
            if let earlier = present[identity] {
                context.violation("log: \(operation.word) is there twice, at offsets \(earlier) and \(entry.offset)")
            }
            present[identity] = entry.offset
            if intent.operation != operation.intentOperation || intent.entityID != operation.id || intent.fields != operation.fields {
                context.violation("log at offset \(entry.offset): the intent of \(operation.word) is not what was written")
            }
        }
        return present
    }

    /// Whether `seen` is what a resync's pull, part way, leaves: one of
    /// `bases` with the entity's last intents applied, from one on (in the
    /// order they were made) that is no later than the first not
    /// `answered`.
    private static func isPartway(
        _ seen: Fields?, _ made: [(offset: UInt64?, operation: AppOperation)], bases: [Fields?], answered: Set<UInt64>
    ) -> Bool {
        let firstPending = made.firstIndex { item in item.offset.map { !answered.contains($0) } ?? false } ?? made.count
        return bases.contains { base in
            (0...firstPending).contains { start in made[start...].reduce(base) { $1.operation.applied(to: $0) } == seen }
        }
    }

    /// Whether a worker tried the operation with this identity.
    func wasTried(_ identity: String) -> Bool { operations[identity] != nil }

    /// Checks that each acknowledged batch is in the log whole, each failed
    /// one not at all, and each other batch whole or not at all.
    /// - Parameter folded: operations, by identity, that compaction folded
    ///   away after the server applied them: not in the log, but written.
    func checkBatches(_ present: [String: UInt64], folded: Set<String> = [], _ context: inout IterationContext) {
        for batch in batches {
            let inLog = batch.operations.filter { present[$0.identity] != nil }.count
            let found = inLog + batch.operations.filter { present[$0.identity] == nil && folded.contains($0.identity) }.count
            let place = found == inLog ? "in the log" : "in the log or folded away by compaction"
            if batch.failed && found != 0 {
                context.violation("batch \(batch.id), whose write failed, has \(found) of its \(batch.operations.count) intents \(place)")
            } else if batch.acknowledged && found != batch.operations.count {
                context.violation("the acknowledged batch \(batch.id) has \(found) of its \(batch.operations.count) intents \(place)")
            } else if found != 0 && found != batch.operations.count {
                context.violation("batch \(batch.id) (in flight at a kill) has \(found) of \(batch.operations.count) intents \(place); a batch commits whole or not at all")
            }
        }
    }

    /// Checks that each entity's intents in the log are in the order they
    /// were made and that the app sees what its intents make, in that
    /// order, leaving out `rejected` ones.
    /// - Parameters:
    ///   - folded: as for `checkBatches`; these count as made.
    ///   - resyncBases: when the log has a resync, the states each entity
    ///     was confirmed at since the last one (nil first: none; then each
    ///     one pulled; an entity not pulled since has nil alone). Until
    ///     the resync's pull has brought the latest, the app may see one of
    ///     them with the entity's later intents applied, every intent not
    ///     `answered` among them.
    func checkVisible(
        _ store: Store, _ present: [String: UInt64], folded: Set<String> = [], rejected: Set<UInt64>,
        resyncBases: [String: [Fields?]]? = nil, answered: Set<UInt64> = [], _ context: inout IterationContext
    ) throws {
        // Each entity's operations, in the order they were made, with their offsets (nil: folded away).
        var byEntity: [String: [(offset: UInt64?, operation: AppOperation)]] = [:]
        for batch in batches {
            for operation in batch.operations {
                if let offset = present[operation.identity] {
                    byEntity[operation.id, default: []].append((offset, operation))
                } else if folded.contains(operation.identity) {
                    byEntity[operation.id, default: []].append((nil, operation))
                }
            }
        }
        for (id, found) in byEntity.sorted(by: { $0.key < $1.key }) {
            let inLog = found.compactMap { item in item.offset.map { (offset: $0, sequence: item.operation.sequence) } }
            if inLog.sorted(by: { $0.offset < $1.offset }).map(\.sequence) != inLog.map(\.sequence).sorted() {
                context.violation("log: the intents on te/\(id) are not in the order they were made")
            }
            let made = found.sorted { $0.operation.sequence < $1.operation.sequence }
                .filter { item in item.offset.map { !rejected.contains($0) } ?? true }
            let expected = made.reduce(nil as Fields?) { $1.operation.applied(to: $0) }
            let seen = try store.get(type: AppOperation.entityType, id: id)?.fields
            if seen != expected, !Self.isPartway(seen, made, bases: resyncBases.map { $0[id] ?? [nil] } ?? [], answered: answered) {
                context.violation("te/\(id): the app sees \(seen.map(\.description) ?? "nothing"), its intents make \(expected.map(\.description) ?? "nothing")")
            }
        }
    }
}
