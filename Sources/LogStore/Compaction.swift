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
    /// above it, and their conflicts; intents whose conflict waits for the
    /// app, with their answers (and the last resync after such an ack);
    /// snapshots an earlier compaction wrote that still hold what they did.
    public var entriesKept = 0
    public var dryRun: Bool
}

extension Store {
    /// Folds the log below `watermark` into snapshot entries so it stops
    /// growing without bound.
    ///
    /// Entries below the watermark go, except intents that are still pending
    /// or were settled at or above it (and their conflict entries), and
    /// intents whose conflict waits for the app (with their answers): each
    /// entity's confirmed state as of the watermark, tombstones included, is
    /// written as one `snapshot` entry, reusing a freed offset below the
    /// watermark. A snapshot that an earlier compaction wrote, and that
    /// still holds its entity's confirmed state, stays as it is, so
    /// compacting again writes snapshots only for what changed since.
    /// Offsets at and above the watermark, and those of every kept entry,
    /// do not change. The projections, the outbox and the cursor stay as they
    /// are (replaying the compacted log gives the same tables); the
    /// idempotency keys of removed intents go with them. A rebuild under way
    /// starts over from the first entry.
    ///
    /// The LMDB file does not shrink: freed pages are reused by later writes
    /// (`Environment.copy(to:compact:)` writes a smaller copy).
    /// - Parameters:
    ///   - watermark: 1 up to the last offset. The last entry always stays:
    ///     it is what tells a reopened log where to append, so offsets are
    ///     never handed out twice.
    ///   - dryRun: report what would happen and change nothing. A store
    ///     opened read-only plans in a read transaction (another process
    ///     may have the store open for writing).
    /// - Throws: `LogStoreError.invalidArgument` for a watermark past the
    ///   end; `.projectionsStale`, in a dry run on a read-only store, for
    ///   entries appended to the log without the store since its tables
    ///   were last written (a compaction projects them first).
    public func compact(below watermark: UInt64, dryRun: Bool = false) async throws -> CompactionReport {
        if dryRun, log.isReadOnly { return try planReadOnly(below: watermark) }
        return try await log.perform { txn, context in
            // Entries appended to the log directly are projected first, as
            // before any store write: the plan reads the conflicts table,
            // and an entry folded away before it was projected would leave
            // rows (an outbox row, a conflict) naming entries that are gone.
            try self.catchUp(through: context.position.lastOffset, txn, &context.effects)
            try self.checkCompactionWatermark(watermark, last: context.position.lastOffset)
            let plan = try self.planCompaction(below: watermark, txn)
            if !dryRun { try self.carryOut(plan, txn) }
            return plan.report(dryRun: dryRun)
        }
    }

    /// A dry run on a read-only store: the plan from one snapshot, whose
    /// tables must hold every entry of its log, as a read-only open requires.
    private func planReadOnly(below watermark: UInt64) throws -> CompactionReport {
        try log.environment.read { txn in
            let last = try EventLog.lastPosition(txn, log: log.logDatabase, path: path).lastOffset
            let projected = try self.watermark(txn)
            guard projected == last else {
                throw LogStoreError(
                    .projectionsStale, path: path,
                    "the projections reach offset \(projected) of \(last); open the store writable to bring them up to date")
            }
            try checkCompactionWatermark(watermark, last: last)
            return try planCompaction(below: watermark, txn).report(dryRun: true)
        }
    }

    private func checkCompactionWatermark(_ watermark: UInt64, last: UInt64) throws {
        guard (1...max(last, 1)).contains(watermark) else {
            throw LogStoreError(.invalidArgument, path: path, "compaction watermark \(watermark) is outside 1...\(max(last, 1))")
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
    /// The last kept intent below the watermark with each key: what a
    /// replay leaves in a key's row when a later intent with the same key
    /// (a log with repeated keys) is removed. Keyed by bytes, as the
    /// idempotency table is: `String` equality would merge two keys that
    /// are canonically equivalent Unicode but different bytes.
    var keptKeys: [ByteKey: UInt64] = [:]
    var snapshots: [Snapshot] = []
    /// The last resync below the watermark, when it is kept (0 when not):
    /// the snapshots go after it, or it would forget them.
    var keptResync: UInt64 = 0

    /// The freed offsets the snapshots may take, with their timestamps.
    var slots: [(offset: UInt64, timestamp: HybridTimestamp)] { removed.filter { $0.offset > keptResync } }

    /// Where each new snapshot goes: the highest slots, in order.
    var placements: Zip2Sequence<[Snapshot], ArraySlice<(offset: UInt64, timestamp: HybridTimestamp)>> {
        zip(snapshots, slots.suffix(snapshots.count))
    }

    func report(dryRun: Bool) -> CompactionReport {
        CompactionReport(
            watermark: watermark, entriesBefore: entriesBefore, entriesRemoved: removed.count,
            snapshotsWritten: snapshots.count, entriesKept: entriesBefore - removed.count, dryRun: dryRun)
    }
}

extension Store {
    /// Folds the entries below the watermark with the same rules the
    /// projections use (`Confirmed`): one pass reads them, a second decides
    /// which intents and answers stay, a third folds them all, which shows
    /// the snapshots that still hold and the ones to write
    /// (`Format/storage.md`, section 4, Compaction).
    private func planCompaction(below watermark: UInt64, _ txn: borrowing Transaction) throws -> CompactionPlan {
        var plan = CompactionPlan(watermark: watermark)
        var entries: [(offset: UInt64, timestamp: HybridTimestamp, body: EntryBody)] = []
        let path = self.path
        let compactedBelow = try log.compactedBelow(txn)
        var expected: UInt64 = 1
        try txn.forEach(log.logDatabase) { key, value in
            // Read as a scan reads the log, through the first entry at or
            // above the watermark: an entry lost below it would otherwise
            // become a hole once `compacted-below` rises over it, and its
            // loss could not be seen again.
            let entry = try EventLog.decode(
                key: key, value: value, following: &expected, compactedBelow: compactedBelow, path: path)
            guard entry.offset < watermark else { return false }
            entries.append((entry.offset, entry.timestamp, entry.body))
            return true
        }
        plan.entriesBefore = entries.count
        var kept = try keptBelowWatermark(entries, txn)
        plan.keptResync = entries.last { if case .resync = $0.body { true } else { false } }
            .map { kept.contains($0.offset) ? $0.offset : 0 } ?? 0
        var confirmed: [[UInt8]: Confirmed] = [:]
        // Entities whose confirmed state an entry other than a kept one set
        // since the last resync: only they may need a snapshot (the kept
        // entries replay the rest).
        var folded: Set<[UInt8]> = []
        var cursor: String?
        // Since the last resync: each entity's last snapshot, and the last
        // entry that set the cursor (whether it is a cursor-only snapshot).
        var lastSnapshots: [[UInt8]: (offset: UInt64, state: Confirmed, cursor: String)] = [:]
        var lastCursorEntry: (offset: UInt64, cursorOnly: Bool)?
        var intents: [UInt64: Intent] = [:]
        var settled: Set<UInt64> = []
        for entry in entries {
            let keep = kept.contains(entry.offset)
            switch entry.body {
            case .intent(let intent):
                intents[entry.offset] = intent
                if keep {
                    plan.keptKeys[ByteKey(Array(intent.idempotencyKey.utf8))] = entry.offset
                } else {
                    plan.removedKeys.append((intent.idempotencyKey, entry.offset))
                }
            case .ack(let ack):
                // Only the first answer to a pending intent settles it, as in
                // the projections; an answer to an intent a previous
                // compaction removed changes nothing.
                guard let intent = intents[ack.intentOffset], settled.insert(ack.intentOffset).inserted else { break }
                let key = EntityKey.encode(type: intent.entityType, id: intent.entityID)
                confirmed[key] = (confirmed[key] ?? Confirmed()).applying(ack: intent, version: ack.serverVersion)
                if !keep { folded.insert(key) }
            case .reject(let reject):
                settled.insert(reject.intentOffset)
            case .remote(let remote):
                let key = EntityKey.encode(type: remote.entityType, id: remote.entityID)
                confirmed[key] = (confirmed[key] ?? Confirmed()).applying(
                    version: remote.serverVersion, state: remote.operation == .upsert ? remote.fields : nil)
                folded.insert(key)
                cursor = remote.cursor
                lastCursorEntry = (entry.offset, false)
            case .snapshot(let snapshot):
                if !snapshot.entityType.isEmpty {
                    let key = EntityKey.encode(type: snapshot.entityType, id: snapshot.entityID)
                    let state = Confirmed(version: snapshot.serverVersion, fields: snapshot.deleted ? nil : snapshot.fields)
                    confirmed[key] = (confirmed[key] ?? Confirmed()).applying(version: state.version, state: state.fields)
                    folded.insert(key)
                    lastSnapshots[key] = (entry.offset, state, snapshot.cursor)
                }
                cursor = snapshot.cursor.isEmpty ? nil : snapshot.cursor
                lastCursorEntry = (entry.offset, snapshot.entityType.isEmpty)
            case .resync:
                confirmed = [:]
                folded = []
                cursor = nil
                lastSnapshots = [:]
                lastCursorEntry = nil
            case .conflict:
                break
            }
        }
        // An entity's last snapshot that holds its confirmed state stays
        // where it is: replayed there, it gives that state as a new one
        // would (a kept answer after it is no newer, or the state would
        // differ). Values: the cursor each one sets.
        var keptSnapshots: [UInt64: String] = [:]
        var current: Set<[UInt8]> = []
        for (key, snapshot) in lastSnapshots where snapshot.state.version > 0 && confirmed[key] == snapshot.state {
            keptSnapshots[snapshot.offset] = snapshot.cursor
            current.insert(key)
        }
        for (key, state) in confirmed.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) })
        where state.version > 0 && folded.contains(key) && !current.contains(key) {
            let (type, id) = EntityKey.split(key)
            plan.snapshots.append(
                Snapshot(
                    watermark: watermark, cursor: cursor ?? "", entityType: type, entityID: id,
                    serverVersion: state.version, deleted: state.fields == nil, fields: state.fields ?? [:]))
        }
        // The highest snapshot below the watermark sets the cursor a replay
        // leaves there, so it must carry the folded one. New snapshots take
        // the highest freed offsets and carry it; a kept snapshot above them
        // all has it too (every entry after it is kept, and no kept entry
        // sets the cursor). Without new ones, the last entry to set the
        // cursor stays when it is a cursor-only snapshot; otherwise, when the
        // highest kept snapshot carries another cursor (or there is none,
        // and a cursor was folded), a cursor-only snapshot carries it, above
        // that one: the entry that set the folded cursor was freed there.
        if plan.snapshots.isEmpty {
            if let last = lastCursorEntry, last.cursorOnly { keptSnapshots[last.offset] = cursor ?? "" }
            let top = keptSnapshots.max { $0.key < $1.key }
            if top.map({ $0.value != cursor ?? "" }) ?? (cursor != nil) {
                plan.snapshots.append(
                    Snapshot(watermark: watermark, cursor: cursor ?? "", entityType: "", entityID: "", serverVersion: 0, fields: [:]))
            }
        }
        kept.formUnion(keptSnapshots.keys)
        plan.removed = entries.filter { !kept.contains($0.offset) }.map { ($0.offset, $0.timestamp) }
        // Every new snapshot stands for at least one removed entry that set
        // its entity's state (or the cursor) after the last resync, so the
        // freed offsets after it suffice.
        let slots = plan.slots
        precondition(plan.snapshots.count <= slots.count, "more snapshots than freed offsets")
        let topKept = keptSnapshots.keys.max() ?? 0
        precondition(
            plan.snapshots.isEmpty || (slots.last?.offset ?? 0) > topKept || keptSnapshots[topKept] == cursor ?? "",
            "the folded cursor would sit below a kept snapshot")
        return plan
    }

    /// The offsets below the watermark that compaction keeps:
    /// - intents not settled below it (pending, or answered at or above it);
    /// - intents whose conflict waits for the app, with their answers;
    /// - for an entity with intents not settled below the watermark, every
    ///   intent answered since its pending set was last empty (and since the
    ///   last resync), with its answer: replaying them gives the same
    ///   acknowledged version (`EntityRecord.ackedVersion`), the base its
    ///   pending intents are pushed with;
    /// - conflict entries of every kept intent;
    /// - the last resync, when the kept answer of a waiting conflict is an
    ///   ack before it: replaying that ack gives the entity a base, which
    ///   the resync must forget again.
    private func keptBelowWatermark(
        _ entries: [(offset: UInt64, timestamp: HybridTimestamp, body: EntryBody)], _ txn: borrowing Transaction
    ) throws -> Set<UInt64> {
        let waiting = try waitingConflicts(txn)
        var intents: [UInt64: ByteKey] = [:]
        var answers: [UInt64: UInt64] = [:]  // intent -> its first answer
        var acks: Set<UInt64> = []
        var pending: [ByteKey: Set<UInt64>] = [:]
        var lastEmpty: [ByteKey: UInt64] = [:]
        var lastResync: UInt64 = 0
        func answer(_ intent: UInt64, at offset: UInt64) {
            guard let entity = intents[intent], answers[intent] == nil else { return }
            answers[intent] = offset
            pending[entity]?.remove(intent)
            if pending[entity]?.isEmpty ?? true { lastEmpty[entity] = offset }
        }
        for entry in entries {
            switch entry.body {
            case .intent(let intent):
                let entity = EntityKey.byteKey(type: intent.entityType, id: intent.entityID)
                intents[entry.offset] = entity
                pending[entity, default: []].insert(entry.offset)
            case .ack(let ack):
                acks.insert(entry.offset)
                answer(ack.intentOffset, at: entry.offset)
            case .reject(let reject): answer(reject.intentOffset, at: entry.offset)
            case .resync: lastResync = entry.offset
            default: break
            }
        }
        var kept: Set<UInt64> = []
        for (offset, entity) in intents {
            guard let answer = answers[offset] else {
                kept.insert(offset)
                continue
            }
            let stillPending = !(pending[entity]?.isEmpty ?? true)
            let neededForBase = stillPending && answer > max(lastEmpty[entity] ?? 0, lastResync)
            if waiting.contains(offset) || neededForBase {
                kept.insert(offset)
                kept.insert(answer)
            }
        }
        if kept.contains(where: { $0 < lastResync && acks.contains($0) }) { kept.insert(lastResync) }
        for entry in entries {
            if case .conflict(let conflict) = entry.body, kept.contains(conflict.intentOffset) || intents[conflict.intentOffset] == nil {
                kept.insert(entry.offset)
            }
        }
        return kept
    }

    /// Intent offsets whose conflict waits for the app.
    /// The intents whose conflicts wait for the app, which compaction keeps.
    /// - Throws: `LogStoreError.corruptEntry` for a key that is not an
    ///   offset: skipped, its intent would be compacted away while the app
    ///   has still to decide.
    private func waitingConflicts(_ txn: borrowing Transaction) throws -> Set<UInt64> {
        var offsets: Set<UInt64> = []
        try txn.forEach(projector(txn).conflicts) { key, _ in
            offsets.insert(try OffsetKey.decode(key, table: "conflicts", path: path))
            return true
        }
        return offsets
    }

    private func carryOut(_ plan: CompactionPlan, _ txn: borrowing Transaction) throws {
        for (offset, _) in plan.removed { try txn.delete(log.logDatabase, key: OffsetKey.encode(offset)) }
        let idempotency = try projector(txn).idempotency
        for (key, offset) in plan.removedKeys {
            let bytes = Array(key.utf8)
            guard try txn.get(idempotency, key: bytes) == OffsetKey.encode(offset) else { continue }
            if let kept = plan.keptKeys[ByteKey(bytes)] {
                try txn.put(idempotency, key: bytes, value: OffsetKey.encode(kept))
            } else {
                try txn.delete(idempotency, key: bytes)
            }
        }
        for (snapshot, slot) in plan.placements {
            let entry = Entry(offset: slot.offset, timestamp: slot.timestamp, body: .snapshot(snapshot))
            try txn.put(log.logDatabase, key: OffsetKey.encode(slot.offset), value: try EntryCodec.encode(entry))
        }
        let previous = try log.compactedBelow(txn)
        try txn.put(log.metaDatabase, key: StoreFormat.compactedBelowKey, value: max(previous, plan.watermark).bigEndianBytes)
        // A rebuild under way may have read entries just removed, or not yet
        // read the snapshots that replace them (some below its watermark):
        // its tables could not come out as a replay of this log would make
        // them, so it starts again, here.
        try restartRebuild(txn)
    }
}
