import LogFormat

/// What the append workers promised, read from their reports.
struct AppendPromises {
    /// The keys of each `try`, in order; a key's batch is its index here.
    private var batches: [[String]] = []
    private var batchOfKey: [String: Int] = [:]
    private(set) var acknowledged: [String: UInt64] = [:]
    private(set) var failed: Set<String> = []

    init(_ reports: [Report], _ context: inout IterationContext) {
        for report in reports {
            switch report.verb {
            case "try":
                for key in report.words { batchOfKey[key] = batches.count }
                batches.append(report.words)
            case "ack":
                guard report.words.count >= 2, let first = UInt64(report.words[0]) else {
                    context.violation("a malformed report: \(report)")
                    continue
                }
                for (index, key) in report.words.dropFirst().enumerated() { acknowledged[key] = first + UInt64(index) }
            case "fail":
                failed.formUnion(report.words)
            default:
                break
            }
        }
    }

    /// Checks that every entry of the log was attempted and is intact, that
    /// every acknowledged key is at its offset, that no append reported
    /// failed is there (a store that committed a write it reported failed
    /// would have the app write it again), and that every batch is in the
    /// log whole or not at all.
    /// - Returns: how many acknowledged appends it checked.
    func check(_ log: [Entry], _ context: inout IterationContext) -> Int {
        var found: [String: UInt64] = [:]
        for entry in log {
            guard case .intent(let intent) = entry.body else {
                context.violation("log at offset \(entry.offset): a \(entry.kind) entry; this workload appends intents only")
                continue
            }
            let key = intent.idempotencyKey
            guard batchOfKey[key] != nil else {
                context.violation("log at offset \(entry.offset): intent \(key) was never attempted")
                continue
            }
            if let earlier = found[key] {
                context.violation("log: intent \(key) is there twice, at offsets \(earlier) and \(entry.offset)")
            }
            found[key] = entry.offset
            if entry.body != AppendWorkload.body(key: key) {
                context.violation("log at offset \(entry.offset): intent \(key) is not what was appended")
            }
        }
        for (key, offset) in acknowledged.sorted(by: { $0.value < $1.value }) {
            guard let at = found[key] else {
                context.violation("the acknowledged append \(key) (offset \(offset)) is not in the log")
                continue
            }
            if at != offset { context.violation("the acknowledged append \(key) was promised offset \(offset) and is at \(at)") }
        }
        for key in failed.sorted() {
            if let at = found[key] { context.violation("the failed append \(key) is in the log at offset \(at)") }
        }
        for batch in batches where batch.count > 1 {
            let offsets = batch.compactMap { found[$0] }
            if !offsets.isEmpty && offsets.count != batch.count {
                context.violation("log: \(offsets.count) of the \(batch.count) entries of batch \(batch[0]) are there; a batch commits whole or not at all")
            } else if let first = offsets.first, offsets != Array(first..<first + UInt64(offsets.count)) {
                context.violation("log: the entries of batch \(batch[0]) are at offsets \(offsets), not one after another")
            }
        }
        return acknowledged.count
    }
}
