import LMDB
import LogFormat

/// The attempt state of one pending intent, the value of the `outbox`
/// database (keyed by the intent's offset). It is the only derived state not
/// rebuilt by replay, which writes every row in its first state; a rebuild
/// of the same version then carries it over from the tables it replaces.
public struct OutboxState: Sendable, Equatable {
    public enum Status: UInt8, Sendable {
        /// Waiting to be pushed (now, or at `nextAttemptAt`).
        case pending = 0
        /// Out of retries; waits for the app (`Store.retryFailed`).
        case failed = 1
    }

    public var status = Status.pending
    /// Failed push attempts so far.
    public var attempts: UInt32 = 0
    /// Unix milliseconds before which the intent is not due; 0 for now. The
    /// sync engine sets and reads them on its clock's monotonic reading
    /// (for `SystemClock`, the wall clock without its steps since the
    /// process started).
    public var nextAttemptAt: UInt64 = 0
    /// The last failure, for people ("" before the first).
    public var lastError = ""

    public init() {}

    /// When a retry time `retryAt` lets its intent go, read at `now`: the
    /// time itself, or `now` when it lies more than `retryWaitMax` ahead.
    /// The caller sets no retry that far off, so such a time was set by a
    /// clock since set back, or under a longer limit than today's; kept, it
    /// would hold the intent as long again.
    public static func dueAt(_ retryAt: UInt64, now: UInt64, retryWaitMax: UInt64) -> UInt64 {
        retryAt > now && retryAt - now > retryWaitMax ? now : retryAt
    }

    /// Whether the intent goes in a push at `now`: pending, and its retry
    /// time come (`dueAt`).
    public func isDue(now: UInt64, retryWaitMax: UInt64) -> Bool {
        status == .pending && Self.dueAt(nextAttemptAt, now: now, retryWaitMax: retryWaitMax) <= now
    }

    func encoded() -> [UInt8] {
        var writer = ByteWriter(capacity: 24)
        writer.write(status.rawValue)
        writer.write(bigEndian: attempts)
        writer.write(bigEndian: nextAttemptAt)
        writer.write(lengthPrefixed: lastError)
        return writer.bytes
    }

    init(decoding bytes: UnsafeRawBufferPointer) throws(FormatError) {
        var reader = ByteReader(bytes)
        let statusByte = try reader.readByte("outbox status")
        guard let status = Status(rawValue: statusByte) else {
            throw reader.error(.invalidTag, "outbox status \(statusByte)", at: 0)
        }
        self.status = status
        attempts = try reader.read(UInt32.self, "attempts")
        nextAttemptAt = try reader.read(UInt64.self, "next attempt")
        lastError = try reader.readString("last error")
        guard reader.remaining == 0 else { throw reader.error(.trailingBytes, "\(reader.remaining) bytes after the state") }
    }
}

/// What `Store.record` did with the server's answers.
public struct RecordedAnswers: Sendable, Equatable {
    /// The offsets settled by the call, in the order given.
    public var settled: [UInt64] = []
    /// Conflicts whose decision was refused, each left for the app.
    public var refused: [RefusedDecision] = []
}

/// An intent waiting in the outbox, with the entry it came from.
public struct PendingIntent: Sendable, Equatable {
    public var offset: UInt64
    public var timestamp: HybridTimestamp
    public var intent: Intent
    public var state: OutboxState
}

/// The server's answer to one pushed intent, as the outbox records it.
public enum PushOutcome: Sendable, Equatable {
    case acknowledged(Ack.Outcome, serverVersion: UInt64)
    case rejected(code: String, message: String)
    /// Rejected with `CONFLICT`: the server's state, and its message.
    case conflict(ServerState, message: String)
}

extension Store {
    /// Pending intents in log order: at most `limit`, and with `now` (a
    /// reading of the clock the retry times were set on) only those due
    /// then, as `pushBatch` takes them: a retry time more than
    /// `retryWaitMax` after `now` is due too (`OutboxState.dueAt`).
    /// - Throws: `LogStoreError.invalidArgument` for a negative `limit`.
    public func outbox(limit: Int = Int.max, dueAt now: UInt64? = nil, retryWaitMax: UInt64 = .max) throws
        -> [PendingIntent]
    {
        try checkLimit(limit)
        return try log.environment.read { txn in
            var items: [PendingIntent] = []
            try txn.forEach(projector(txn).outbox) { key, value in
                guard items.count < limit else { return false }
                let state = try decodeOutboxState(value, key: key)
                let offset = try outboxOffset(key)
                if let now, !state.isDue(now: now, retryWaitMax: retryWaitMax) { return true }
                items.append(try pendingIntent(at: offset, state, txn))
                return true
            }
            return items
        }
    }

    /// The intent an outbox row names, with its state.
    func pendingIntent(at offset: UInt64, _ state: OutboxState, _ txn: borrowing Transaction) throws -> PendingIntent {
        let entry = try entryInside(txn, at: offset)
        guard case .intent(let intent) = entry.body else {
            throw LogStoreError(.corruptEntry, path: path, offset: offset, "the outbox names a \(entry.kind) entry")
        }
        return PendingIntent(offset: offset, timestamp: entry.timestamp, intent: intent, state: state)
    }

    /// How many intents wait in the outbox (pending or failed).
    public func outboxCount() throws -> Int {
        try log.environment.read { txn in try txn.count(projector(txn).outbox) }
    }

    /// Records the server's answers: an ack or reject entry per intent, each
    /// applied to the projections, all in one transaction. Answers for
    /// intents no longer in the outbox (a repeated ack) are skipped.
    ///
    /// A conflict is recorded as the protocol says (section 10): a
    /// `conflict` entry with the server's state and `resolve`'s decision,
    /// a `reject` with code `CONFLICT`, and the intent the decision needs.
    /// A decision `resolveConflict` would refuse (invalid fields, or a
    /// resolution intent over the entry limit) is recorded as `.askApp` and
    /// returned as refused: thrown, it would lose the other answers, and
    /// the same conflict would come back, and be refused again, on every
    /// push. A `conflict` entry leaves out the resolved fields when they do
    /// not fit beside the server's (`Store.settlement`).
    /// - Parameters:
    ///   - resolve: decides each conflict; called inside the write
    ///     transaction, so it must be quick and must not touch the store.
    ///     It may be called more than once for one conflict (the
    ///     transaction runs again when the map grows, or when another write
    ///     in its group commit fails), and only the last decision counts:
    ///     it must decide from the case alone, with no effects of its own.
    /// - Returns: the offsets settled by this call, and the refused decisions.
    @discardableResult
    public func record(
        _ outcomes: [(offset: UInt64, outcome: PushOutcome)],
        resolve: @escaping @Sendable (ConflictCase) -> ConflictDecision = { _ in .askApp }
    ) async throws -> RecordedAnswers {
        let outcomes = outcomes.map { OutcomeItem(offset: $0.offset, outcome: $0.outcome) }
        for item in outcomes {
            if case .conflict(let server, _) = item.outcome { try Validation.fields(server.data) }
        }
        return try await write { txn, context, store in
            var recorded = RecordedAnswers()
            let outbox = try store.projector(txn).outbox
            for item in outcomes where try txn.contains(outbox, key: OffsetKey.encode(item.offset)) {
                switch item.outcome {
                case .acknowledged(let outcome, let version):
                    try store.append(.ack(Ack(intentOffset: item.offset, outcome: outcome, serverVersion: version)), txn, &context)
                case .rejected(let code, let message):
                    try store.append(.reject(Reject(intentOffset: item.offset, code: code, message: message)), txn, &context)
                case .conflict(let server, let message):
                    let (conflictCase, record) = try store.conflictCase(item.offset, server, txn)
                    let decision = resolve(conflictCase)
                    var settlement = try store.settlement(conflictCase, decision, record, txn)
                    if let problem = Store.problem(with: decision) ?? settlement.problem {
                        let intent = conflictCase.intent
                        recorded.refused.append(
                            RefusedDecision(
                                intentOffset: item.offset, entityType: intent.entityType, entityID: intent.entityID,
                                reason: problem))
                        settlement = try store.settlement(conflictCase, .askApp, record, txn)
                    }
                    try store.append(.reject(Reject(intentOffset: item.offset, code: "CONFLICT", message: message)), txn, &context)
                    try store.settle(settlement, txn, &context)
                }
                recorded.settled.append(item.offset)
            }
            return recorded
        }
    }

    /// Makes failed intents pending again with a fresh attempt count, and
    /// says so on `intentCommits()`, as a new intent does: they are due now.
    public func retryFailed() async throws {
        try await write { txn, context, store in
            var failed: [([UInt8], OutboxState)] = []
            let outbox = try store.projector(txn).outbox
            try txn.forEach(outbox) { key, value in
                let state = try store.decodeOutboxState(value, key: key)
                if state.status == .failed { failed.append(([UInt8](key), state)) }
                return true
            }
            for (key, _) in failed {
                try txn.put(outbox, key: key, value: OutboxState().encoded())
            }
            if !failed.isEmpty { context.effects.wroteIntents = true }
        }
    }

    func outboxState(_ txn: borrowing Transaction, key: [UInt8]) throws -> OutboxState? {
        try key.withUnsafeBytes { raw in
            try txn.withValue(projector(txn).outbox, key: raw) { try decodeOutboxState($0, key: raw) }
        }
    }

    /// The offset an outbox key names. A key that is not 8 bytes is damage
    /// to report: skipped, it would hide an intent that is never pushed.
    /// - Throws: `LogStoreError.corruptEntry` naming the table and the key.
    func outboxOffset(_ key: UnsafeRawBufferPointer) throws -> UInt64 {
        try OffsetKey.decode(key, table: "outbox", path: path)
    }

    func decodeOutboxState(_ value: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer) throws -> OutboxState {
        do {
            return try OutboxState(decoding: value)
        } catch {
            throw LogStoreError(.corruptEntry, path: path, offset: OffsetKey.decode(key), "outbox: \(error)", formatError: error)
        }
    }
}

private struct OutcomeItem: Sendable {
    var offset: UInt64
    var outcome: PushOutcome
}
