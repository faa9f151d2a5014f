import LMDB
import LogFormat

/// What a compaction did (or, dry, would do).
public struct CompactionReport: Sendable, Equatable {
    /// Entries below this offset were considered.
    public var watermark: UInt64
    /// Entries below the watermark before compaction.
    public var entriesBefore = 0
    /// Entries removed from the log.
    public var entriesRemoved = 0
    /// Snapshot entries written in their place.
    public var snapshotsWritten = 0
    /// Entries kept below the watermark: intents still pending or settled
    /// above it, and their conflicts.
    public var entriesKept = 0
    public var dryRun: Bool
}

extension Store {
    /// Folds the log below `watermark` into snapshot entries so it stops
    /// growing without bound.
    ///
    /// Entries below the watermark go, except intents that are still pending
    /// or were settled at or above it (and their conflict entries): each
    /// entity's confirmed state as of the watermark, tombstones included, is
    /// written as one `snapshot` entry, reusing a freed offset below the
    /// watermark. Offsets at and above it, and those of every kept entry, do
    /// not change. The projections, the outbox and the cursor stay as they
    /// are (replaying the compacted log gives the same tables); the
    /// idempotency keys of removed intents go with them.
    ///
    /// The LMDB file does not shrink: freed pages are reused by later writes
    /// (`Environment.copy(to:compact:)` writes a smaller copy).
    /// - Parameters:
    ///   - watermark: 1 up to the last offset. The last entry always stays:
    ///     it is what tells a reopened log where to append, so offsets are
    ///     never handed out twice.
    ///   - dryRun: report what would happen and change nothing.
    /// - Throws: `LogStoreError.invalidArgument` for a watermark past the end.
    public func compact(below watermark: UInt64, dryRun: Bool = false) async throws -> CompactionReport {
        try await log.perform { txn, context in
            let last = max(context.position.lastOffset, 1)
            guard (1...last).contains(watermark) else {
                throw LogStoreError(
                    .invalidArgument, path: self.path, "compaction watermark \(watermark) is outside 1...\(last)")
            }
            let plan = try self.planCompaction(below: watermark, txn)
            if !dryRun { try self.carryOut(plan, txn) }
            return plan.report(dryRun: dryRun)
        }
    }

    /// The offset below which the log may have holes left by compaction (0
    /// when it was never compacted).
    public func compactedBelow() throws -> UInt64 { try log.compactedBelow() }
}

/// What compaction found below the watermark and what it will write.
private struct CompactionPlan {
    var watermark: UInt64
    var entriesBefore = 0
    /// Offsets to remove, ascending, with the timestamps they had.
    var removed: [(offset: UInt64, timestamp: HybridTimestamp)] = []
    /// Idempotency keys of removed intents.
    var removedKeys: [(key: String, offset: UInt64)] = []
    var snapshots: [Snapshot] = []

    func report(dryRun: Bool) -> CompactionReport {
        CompactionReport(
            watermark: watermark, entriesBefore: entriesBefore, entriesRemoved: removed.count,
            snapshotsWritten: snapshots.count, entriesKept: entriesBefore - removed.count, dryRun: dryRun)
    }
}

extension Store {
    /// Folds the entries below the watermark with the same rules the
    /// projections use (`Confirmed`), in one pass.
    private func planCompaction(below watermark: UInt64, _ txn: borrowing Transaction) throws -> CompactionPlan {
        var plan = CompactionPlan(watermark: watermark)
        var confirmed: [[UInt8]: Confirmed] = [:]
        var cursor: String?
        var intents: [UInt64: Intent] = [:]
        var settled: Set<UInt64> = []
        var entries: [(offset: UInt64, timestamp: HybridTimestamp, body: EntryBody)] = []
        let path = self.path
        try txn.forEach(log.logDatabase) { key, value in
            let entry = try EventLog.decode(key: key, value: value, path: path)
            guard entry.offset < watermark else { return false }
            entries.append((entry.offset, entry.timestamp, entry.body))
            switch entry.body {
            case .intent(let intent):
                intents[entry.offset] = intent
            case .ack(let ack):
                // Only the first answer to a pending intent settles it, as in
                // the projections; an answer to an intent a previous
                // compaction removed changes nothing.
                guard let intent = intents[ack.intentOffset], settled.insert(ack.intentOffset).inserted else { break }
                let key = EntityKey.encode(type: intent.entityType, id: intent.entityID)
                confirmed[key] = (confirmed[key] ?? Confirmed()).applying(ack: intent, version: ack.serverVersion)
            case .reject(let reject):
                settled.insert(reject.intentOffset)
            case .remote(let remote):
                let key = EntityKey.encode(type: remote.entityType, id: remote.entityID)
                confirmed[key] = (confirmed[key] ?? Confirmed()).applying(
                    version: remote.serverVersion, state: remote.operation == .upsert ? remote.fields : nil)
                cursor = remote.cursor
            case .snapshot(let snapshot):
                if !snapshot.entityType.isEmpty {
                    let key = EntityKey.encode(type: snapshot.entityType, id: snapshot.entityID)
                    confirmed[key] = (confirmed[key] ?? Confirmed()).applying(
                        version: snapshot.serverVersion, state: snapshot.deleted ? nil : snapshot.fields)
                }
                cursor = snapshot.cursor.isEmpty ? nil : snapshot.cursor
            case .resync:
                confirmed = [:]
                cursor = nil
            case .conflict:
                break
            }
            return true
        }
        plan.entriesBefore = entries.count
        for entry in entries {
            switch entry.body {
            case .intent(let intent) where settled.contains(entry.offset):
                plan.removed.append((entry.offset, entry.timestamp))
                plan.removedKeys.append((intent.idempotencyKey, entry.offset))
            case .intent:
                break  // Pending, or settled at or above the watermark: stays.
            case .conflict(let conflict) where !settled.contains(conflict.intentOffset):
                break  // Its intent stays, and so does the record of the conflict.
            default:
                plan.removed.append((entry.offset, entry.timestamp))
            }
        }
        for (key, state) in confirmed.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) where state.version > 0 {
            let (type, id) = EntityKey.split(key)
            plan.snapshots.append(
                Snapshot(
                    watermark: watermark, cursor: cursor ?? "", entityType: type, entityID: id,
                    serverVersion: state.version, deleted: state.fields == nil, fields: state.fields ?? [:]))
        }
        if plan.snapshots.isEmpty, let cursor {
            plan.snapshots.append(Snapshot(watermark: watermark, cursor: cursor, entityType: "", entityID: "", serverVersion: 0, fields: [:]))
        }
        // Every snapshot stands for at least one removed entry that set its
        // entity's state (or the cursor), so the freed offsets suffice.
        precondition(plan.snapshots.count <= plan.removed.count, "more snapshots than freed offsets")
        return plan
    }

    private func carryOut(_ plan: CompactionPlan, _ txn: borrowing Transaction) throws {
        for (offset, _) in plan.removed { try txn.delete(log.logDatabase, key: OffsetKey.encode(offset)) }
        for (key, offset) in plan.removedKeys {
            let bytes = Array(key.utf8)
            if try txn.get(projector.idempotency, key: bytes) == OffsetKey.encode(offset) {
                try txn.delete(projector.idempotency, key: bytes)
            }
        }
        for (snapshot, slot) in zip(plan.snapshots, plan.removed) {
            let entry = Entry(offset: slot.offset, timestamp: slot.timestamp, body: .snapshot(snapshot))
            try txn.put(log.logDatabase, key: OffsetKey.encode(slot.offset), value: try EntryCodec.encode(entry))
        }
        let previous = try log.compactedBelow(txn)
        try txn.put(log.metaDatabase, key: StoreFormat.compactedBelowKey, value: max(previous, plan.watermark).bigEndianBytes)
    }
}
