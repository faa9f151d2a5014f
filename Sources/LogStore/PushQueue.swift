import LMDB
import LogFormat

/// What the outbox holds, for scheduling and for the app's sync health.
public struct OutboxSummary: Sendable, Equatable {
    /// Intents waiting to be pushed (due or not).
    public var pendingCount = 0
    /// Intents out of retries, waiting for the app (`Store.retryFailed`).
    public var failedCount = 0
    /// When the earliest pending intent that is not due yet becomes due
    /// (its retry time, as `pushBatch` compares it); nil when none waits for
    /// a retry.
    public var nextAttemptAt: UInt64?
    /// When the oldest intent in the outbox was written (Unix milliseconds).
    public var oldestWrittenAt: UInt64?
    /// When the oldest pending intent (not failed) was written.
    public var oldestPendingWrittenAt: UInt64?
    /// Pending intents of the types the summary was asked to hold
    /// (`outboxSummary(holdingTypes:)`): not pushed now.
    public var heldCount = 0
    /// When the oldest pending intent not of those types was written.
    public var oldestUnheldPendingWrittenAt: UInt64?
}

extension Store {
    /// The next intents to push, in log order: at most `limit`, each due at
    /// `now`, with the base version to send.
    ///
    /// An intent that is not due, or has failed, holds back every later
    /// intent on its entity: the server must apply one entity's changes in
    /// the order the app made them (`Format/sync-protocol.md` section 10).
    /// Each returned intent's `baseVersion` is the one to send: the greater
    /// of the version it was made against and the server versions answered
    /// for earlier intents on its entity (section 7).
    /// - Parameters:
    ///   - now: Unix milliseconds, on the clock the retry times were set by
    ///     (the sync engine's monotonic reading).
    ///   - retryWaitMax: an intent whose retry time is more than this after
    ///     `now` is due too (`OutboxState.dueAt`).
    ///   - holdingTypes: entity types whose intents are not pushed now (the
    ///     sync engine's `NetworkPolicy` on an expensive path). They hold
    ///     back nothing else: each entity is of one type.
    /// - Throws: `LogStoreError.invalidArgument` for a negative `limit`.
    public func pushBatch(limit: Int, now: UInt64, retryWaitMax: UInt64 = .max, holdingTypes: Set<String> = []) throws
        -> [PendingIntent]
    {
        try checkLimit(limit)
        guard limit > 0 else { return [] }
        return try log.environment.read { txn in
            var batch: [PendingIntent] = []
            let projector = try self.projector(txn)
            try forEachDue(txn, projector, now: now, retryWaitMax: retryWaitMax, holdingTypes: holdingTypes) { item in
                var item = item
                item.intent.baseVersion = max(
                    item.intent.baseVersion, try projector.ackedVersion(item.intent.entityType, item.intent.entityID, txn))
                batch.append(item)
                return batch.count < limit
            }
            return batch
        }
    }

    /// How many intents pushes at `now` would send, their batches put
    /// together: every pending intent due then, but those held behind an
    /// intent on their entity that is not (`pushBatch`'s rules). A sync
    /// run's push progress counts them. Reads the outbox, and its intents
    /// only when one of them holds others back, or types are held.
    public func dueCount(now: UInt64, retryWaitMax: UInt64 = .max, holdingTypes: Set<String> = []) throws -> Int {
        try log.environment.read { txn in
            let projector = try self.projector(txn)
            var count = 0
            var holds = !holdingTypes.isEmpty
            if !holds {
                try txn.forEach(projector.outbox) { key, value in
                    holds = !(try decodeOutboxState(value, key: key).isDue(now: now, retryWaitMax: retryWaitMax))
                    if !holds { count += 1 }
                    return !holds
                }
            }
            guard holds else { return count }
            count = 0
            try forEachDue(txn, projector, now: now, retryWaitMax: retryWaitMax, holdingTypes: holdingTypes) { _ in
                count += 1
                return true
            }
            return count
        }
    }

    /// Calls `body` with each outbox intent due at `now`, in log order,
    /// until it returns false. An intent that is not due, or has failed,
    /// holds back every later intent on its entity; those of
    /// `holdingTypes` are skipped.
    private func forEachDue(
        _ txn: borrowing Transaction, _ projector: Projector, now: UInt64, retryWaitMax: UInt64, holdingTypes: Set<String>,
        _ body: (PendingIntent) throws -> Bool
    ) throws {
        var held: Set<ByteKey> = []
        try txn.forEach(projector.outbox) { key, value in
            let item = try pendingIntent(at: try outboxOffset(key), try decodeOutboxState(value, key: key), txn)
            guard !holdingTypes.contains(item.intent.entityType) else { return true }
            let entity = EntityKey.byteKey(type: item.intent.entityType, id: item.intent.entityID)
            guard !held.contains(entity) else { return true }
            guard item.state.isDue(now: now, retryWaitMax: retryWaitMax) else {
                held.insert(entity)
                return true
            }
            return try body(item)
        }
    }

    /// Counts the outbox by status and finds its next retry time and its
    /// oldest intents, reading only the outbox and at most three entries;
    /// with `holdingTypes`, the intent of every pending row too, to count
    /// those of these types (`heldCount`).
    public func outboxSummary(holdingTypes: Set<String> = []) throws -> OutboxSummary {
        try log.environment.read { txn in
            var summary = OutboxSummary()
            var oldest: UInt64?
            var oldestPending: UInt64?
            var oldestUnheld: UInt64?
            try txn.forEach(projector(txn).outbox) { key, value in
                let state = try decodeOutboxState(value, key: key)
                let offset = try outboxOffset(key)
                if oldest == nil { oldest = offset }
                switch state.status {
                case .pending:
                    summary.pendingCount += 1
                    if oldestPending == nil { oldestPending = offset }
                    if !holdingTypes.isEmpty, holdingTypes.contains(try pendingIntent(at: offset, state, txn).intent.entityType) {
                        summary.heldCount += 1
                    } else if oldestUnheld == nil {
                        oldestUnheld = offset
                    }
                    if state.nextAttemptAt > 0 {
                        summary.nextAttemptAt = min(summary.nextAttemptAt ?? .max, state.nextAttemptAt)
                    }
                case .failed:
                    summary.failedCount += 1
                }
                return true
            }
            // Each offset's entry read once: they are most often the same.
            var writtenAt: [UInt64: UInt64] = [:]
            for offset in [oldest, oldestPending, oldestUnheld].compactMap({ $0 }) where writtenAt[offset] == nil {
                writtenAt[offset] = try entryInside(txn, at: offset).timestamp.milliseconds
            }
            summary.oldestWrittenAt = oldest.flatMap { writtenAt[$0] }
            summary.oldestPendingWrittenAt = oldestPending.flatMap { writtenAt[$0] }
            summary.oldestUnheldPendingWrittenAt = oldestUnheld.flatMap { writtenAt[$0] }
            return summary
        }
    }

    /// The earliest time after `now` at which a pending intent's retry time
    /// lets it go (`OutboxState.dueAt`, as `pushBatch` compares it), nil
    /// when no pending intent waits for one: when a sync run must come for
    /// the intents a run left waiting. Reads only the outbox.
    public func nextRetry(after now: UInt64, retryWaitMax: UInt64 = .max) throws -> UInt64? {
        try log.environment.read { txn in
            var earliest: UInt64?
            try txn.forEach(projector(txn).outbox) { key, value in
                let state = try decodeOutboxState(value, key: key)
                let dueAt = OutboxState.dueAt(state.nextAttemptAt, now: now, retryWaitMax: retryWaitMax)
                if state.status == .pending, dueAt > now { earliest = min(earliest ?? .max, dueAt) }
                return true
            }
            return earliest
        }
    }

    /// Schedules another attempt for pending intents after a retryable
    /// failure, in one transaction. An intent that reaches `attemptsMax`
    /// failed attempts is marked failed, and a `.retriesExhausted` event
    /// tells the app. Offsets no longer in the outbox are skipped.
    public func scheduleRetry(offsets: [UInt64], error: String, at time: UInt64, attemptsMax: UInt32) async throws {
        try await recordFailedAttempt(offsets, error: error) { state in
            state.nextAttemptAt = time
            return state.attempts >= attemptsMax
        }
    }

    /// Marks pending intents failed at once (a permanent failure of the
    /// whole request they were in, which is no judgement on each of them):
    /// they wait for the app's `retryFailed`, and a `.retriesExhausted`
    /// event tells it.
    public func markFailed(offsets: [UInt64], error: String) async throws {
        try await recordFailedAttempt(offsets, error: error) { _ in true }
    }

    /// Counts a failed attempt for each pending intent in `offsets` (others
    /// are skipped), lets `update` set its next attempt, and marks it failed,
    /// with an event for the app, when `update` says so.
    private func recordFailedAttempt(
        _ offsets: [UInt64], error: String, _ update: @escaping @Sendable (inout OutboxState) -> Bool
    ) async throws {
        // Each intent once: one failed request is one attempt, however
        // often the caller names it.
        var seen = Set<UInt64>()
        let offsets = offsets.filter { seen.insert($0).inserted }
        try await write { txn, context, store in
            let projector = try store.projector(txn)
            for offset in offsets {
                let key = OffsetKey.encode(offset)
                guard var state = try store.outboxState(txn, key: key), state.status == .pending else { continue }
                // Saturating: a count at its maximum (damaged or forged; the
                // API marks an intent failed long before) must not trap.
                state.attempts = state.attempts == .max ? .max : state.attempts + 1
                state.lastError = error
                if update(&state) {
                    state.status = .failed
                    state.nextAttemptAt = 0
                    let intent = try projector.readIntent(at: offset, txn)
                    context.effects.events.append(
                        .retriesExhausted(offset: offset, entityType: intent.entityType, entityID: intent.entityID, lastError: error))
                }
                try txn.put(projector.outbox, key: key, value: state.encoded())
            }
        }
    }
}
