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
    /// compacting again writes snapshots only for what changed since. (In a
    /// log whose server versions go down between resyncs, an entity whose
    /// snapshot could not stand in for its history keeps that history.)
    /// Offsets at and above the watermark, and those of every kept entry,
    /// do not change. The projections, the outbox and the cursor stay as they
    /// are (replaying the compacted log gives the same tables); the
    /// idempotency keys of removed intents go with them. A rebuild under way
    /// starts over from the first entry.
    ///
    /// Planning holds a few words for each entry below the watermark and
    /// each entity it names, not the entries: a new snapshot's fields are
    /// read back from the log as it is written. LMDB keeps the pages a
    /// transaction changes in memory until it commits (up to a limit of its
    /// own, past which it writes some early), and compacting a long log for
    /// the first time changes most of its pages. So a compaction whose plan
    /// removes or writes more than `compactionStepChangesMax` entries, below
    /// a watermark more than `compactionStepOffsetsMin` offsets past the
    /// first, goes in up to four steps of rising watermarks instead, each a
    /// transaction that is a whole compaction below its own watermark (the
    /// last one below `watermark`): fewer pages wait in memory at once, and
    /// writes go on between the steps. The snapshots of earlier steps that
    /// still hold stay, so the log ends as small; each step plans again,
    /// from the first entry. A failure, a close or a cancelled task between
    /// two steps leaves the steps before done: the log compacted below a
    /// lower watermark, which replays to the same tables as any compaction.
    ///
    /// The LMDB file does not shrink: freed pages are reused by later writes
    /// (`Environment.copy(to:compact:)` writes a smaller copy).
    /// - Parameters:
    ///   - watermark: 1 up to the last offset. The last entry always stays:
    ///     it is what tells a reopened log where to append, so offsets are
    ///     never handed out twice.
    ///   - dryRun: report what would happen and change nothing. A store
    ///     opened read-only plans in a read transaction (another process
    ///     may have the store open for writing). A dry run plans in one
    ///     step: a compaction that goes in steps may end with other counts
    ///     (its report gives them).
    /// - Throws: `LogStoreError.invalidArgument` for a watermark past the
    ///   end; `.projectionsStale`, in a dry run on a read-only store, for
    ///   entries appended to the log without the store since its tables
    ///   were last written (a compaction projects them first);
    ///   `CancellationError` when the task is cancelled between two steps.
    public func compact(below watermark: UInt64, dryRun: Bool = false) async throws -> CompactionReport {
        try await compact(
            below: watermark, dryRun: dryRun, stepOffsetsMin: Store.compactionStepOffsetsMin,
            stepChangesMax: Store.compactionStepChangesMax)
    }

    /// `compact(below:dryRun:)` with other bounds than
    /// `compactionStepOffsetsMin` and `compactionStepChangesMax`.
    package func compact(
        below watermark: UInt64, dryRun: Bool, stepOffsetsMin: UInt64, stepChangesMax: Int
    ) async throws -> CompactionReport {
        if dryRun, log.isReadOnly { return try planReadOnly(below: watermark) }
        // Most compactions change a little of the log: planned, they are
        // carried out in the same transaction.
        let whole = try await compactStep(
            below: watermark, of: watermark, dryRun: dryRun, changesMax: watermark > stepOffsetsMin ? stepChangesMax : .max)
        if dryRun || whole.carriedOut { return whole.plan }
        return try await compact(below: watermark, stepOffsets: watermark / 4)
    }

    /// A compaction below a watermark up to this far past the first offset
    /// is one transaction (`compact(below:)`), whatever it changes.
    public static let compactionStepOffsetsMin: UInt64 = 250_000
    /// The most entries a compaction in one transaction removes or writes
    /// (`compact(below:)`): one whose plan changes more goes in steps.
    public static let compactionStepChangesMax = 250_000

    /// `compact(below:)` in steps of `stepOffsets` offsets: each step
    /// compacts below a watermark that many offsets above the last step's
    /// (the first, above the first offset), the last below `watermark`.
    package func compact(below watermark: UInt64, stepOffsets: UInt64) async throws -> CompactionReport {
        precondition(stepOffsets > 0, "a compaction step spans at least one offset")
        let steps = Array(stride(from: 1 + stepOffsets, to: watermark, by: Int(clamping: stepOffsets))) + [watermark]
        guard steps.count > 1 else { return try await compactStep(below: watermark, of: watermark, dryRun: false).plan }
        var report = CompactionReport(watermark: watermark, dryRun: false)
        // The offsets of the snapshots the steps wrote, as they stand.
        var written: Set<UInt64> = []
        for (index, step) in steps.enumerated() {
            if index > 0 { try Task.checkCancellation() }
            let outcome = try await compactStep(below: step, of: watermark, dryRun: false, countingBefore: index == 0)
            if let before = outcome.before { report.entriesBefore = before }
            written.subtract(outcome.removed)
            written.formUnion(outcome.placed)
            // Entries below the watermark now: those kept, and the snapshots written.
            if let after = outcome.after {
                report.snapshotsWritten = written.count
                report.entriesKept = after - written.count
                report.entriesRemoved = report.entriesBefore - report.entriesKept
            }
        }
        return report
    }

    /// One compaction transaction, below `step`, of a compaction below
    /// `watermark` (which must be in the log): its plan's report, whether
    /// it was carried out (not in a dry run, nor when the plan removes or
    /// writes more than `changesMax` entries), the offsets it removed
    /// (those its snapshots took included) and those of its new snapshots;
    /// with `countingBefore`, the entries below `watermark` first, and in
    /// the last step (`step == watermark`), after.
    private func compactStep(
        below step: UInt64, of watermark: UInt64, dryRun: Bool, countingBefore: Bool = false, changesMax: Int = .max
    ) async throws -> (plan: CompactionReport, carriedOut: Bool, before: Int?, removed: [UInt64], placed: [UInt64], after: Int?) {
        try await log.perform { txn, context in
            // Entries appended to the log directly are projected first, as
            // before any store write: the plan reads the conflicts table,
            // and an entry folded away before it was projected would leave
            // rows (an outbox row, a conflict) naming entries that are gone.
            try self.catchUp(through: context.position.lastOffset, txn, &context.effects)
            try self.checkCompactionWatermark(watermark, last: context.position.lastOffset)
            let before = countingBefore ? try self.entryCount(below: watermark, txn) : nil
            let plan = try self.planCompaction(below: step, txn)
            let report = plan.report(dryRun: dryRun)
            guard !dryRun, report.entriesRemoved + report.snapshotsWritten <= changesMax else {
                return (report, false, nil, [], [], nil)
            }
            try self.carryOut(plan, txn)
            let removed = plan.sketches.indices.filter { !plan.keep[$0] }.map { plan.sketches[$0].offset }
            let placed = plan.snapshots.map { plan.sketches[$0.slot].offset }
            let after = step == watermark ? try self.entryCount(below: watermark, txn) : nil
            return (report, true, before, removed, placed, after)
        }
    }

    /// The entries in the log below `watermark`, by their keys alone.
    private func entryCount(below watermark: UInt64, _ txn: borrowing Transaction) throws -> Int {
        var count = 0
        let end = OffsetKey.encode(watermark)
        try txn.forEach(log.logDatabase) { key, _ in
            guard key.lexicographicallyPrecedes(end) else { return false }
            count += 1
            return true
        }
        return count
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

/// What planning holds of an entry below the watermark: its offset, its
/// timestamp and what the fold needs, without fields or strings. Planning
/// the compaction of a long log holds a few words per entry, not every
/// decoded entry; the fields of new snapshots are read back from the log
/// as they are written.
private struct Sketch {
    enum Kind {
        /// `entity` indexes `CompactionPlan.entityKeys`; `keyHash` hashes
        /// the idempotency key's bytes.
        case intent(entity: Int32, operation: Intent.Operation, keyHash: Int)
        case ack(intent: UInt64, version: UInt64)
        case reject(intent: UInt64)
        /// A `remote`, or a `snapshot` naming an entity: the state it
        /// confirms (absent when `deleted`), at `version`.
        case state(entity: Int32, version: UInt64, deleted: Bool, snapshot: Bool)
        case cursorOnlySnapshot
        case resync
        case conflict(intent: UInt64)
    }

    var offset: UInt64
    var timestamp: HybridTimestamp
    var kind: Kind

    var isAck: Bool { if case .ack = kind { true } else { false } }
}

/// An entity's confirmed state as the fold leaves it (`Confirmed`), by
/// reference to entries: the one whose fields are its base, and the
/// acknowledged updates merged over it since, in order. Indices are into
/// the plan's sketches.
private struct FoldedState {
    /// The resync this state follows (`epoch` of the fold): one from before
    /// the last resync is no state at all.
    var epoch = 0
    var version: UInt64 = 0
    /// A `remote`, a `snapshot` or a create intent; nil when absent.
    var base: Int?
    var updates: [Int] = []
    /// The last entry that changed this state.
    var setter: Int?
    /// The last entry that changed it and goes: a `remote`, a `snapshot`,
    /// or an ack that is the first answer to one of the entity's intents.
    /// Its new snapshot, when it needs one, goes there.
    var slot: Int?
}

/// What compaction found below the watermark and what it will write.
private struct CompactionPlan {
    var watermark: UInt64
    var sketches: [Sketch] = []
    /// The entities the entries name, in order of first appearance.
    var entityKeys: [ByteKey] = []
    /// Whether each entry below the watermark stays (parallel to `sketches`).
    var keep: [Bool] = []
    /// The new snapshots: the index of the removed entry each replaces, and
    /// the entity whose state it holds (nil: only the cursor), ascending.
    var snapshots: [(slot: Int, entity: Int32?, state: FoldedState)] = []
    /// The folded cursor ("" for none).
    var cursor = ""
    /// The index of the last resync below the watermark (-1: none).
    var lastResync = -1

    var entriesRemoved: Int { keep.count { !$0 } }

    func report(dryRun: Bool) -> CompactionReport {
        let removed = entriesRemoved
        return CompactionReport(
            watermark: watermark, entriesBefore: sketches.count, entriesRemoved: removed,
            snapshotsWritten: snapshots.count, entriesKept: sketches.count - removed, dryRun: dryRun)
    }

    /// The index of the intent at `offset` below the watermark, or nil when
    /// there is no intent there (a removed one, or another kind of entry).
    func intentIndex(_ offset: UInt64) -> Int? {
        var low = 0
        var high = sketches.count
        while low < high {
            let middle = (low + high) / 2
            if sketches[middle].offset < offset { low = middle + 1 } else { high = middle }
        }
        guard low < sketches.count, sketches[low].offset == offset, case .intent = sketches[low].kind else { return nil }
        return low
    }

    /// Keeps every conflict entry whose intent is kept, or is not an
    /// intent below the watermark (one an earlier compaction removed).
    mutating func keepConflictsOfKeptIntents() {
        for (index, sketch) in sketches.enumerated() {
            guard case .conflict(let intent) = sketch.kind else { continue }
            if intentIndex(intent).map({ keep[$0] }) ?? true { keep[index] = true }
        }
    }

    func intent(at index: Int) -> (entity: Int32, operation: Intent.Operation) {
        guard case .intent(let entity, let operation, _) = sketches[index].kind else {
            preconditionFailure("entry \(index) of the plan is not an intent")
        }
        return (entity, operation)
    }
}

extension Store {
    /// Plans a compaction (`Format/storage.md`, section 4, Compaction): one
    /// pass decodes the entries below the watermark into sketches, a second
    /// decides which intents and answers stay, a third folds every entity's
    /// confirmed state, which shows the snapshots that still hold and the
    /// ones to write, and a fourth replays the plan to check it.
    private func planCompaction(below watermark: UInt64, _ txn: borrowing Transaction) throws -> CompactionPlan {
        var plan = CompactionPlan(watermark: watermark)
        var entityIndices: [ByteKey: Int32] = [:]
        func entity(_ type: String, _ id: String) throws -> Int32 {
            let key = EntityKey.byteKey(type: type, id: id)
            if let index = entityIndices[key] { return index }
            guard let index = Int32(exactly: plan.entityKeys.count) else {
                throw LogStoreError(.invalidArgument, path: path, "more entities below the watermark than a compaction can plan for")
            }
            entityIndices[key] = index
            plan.entityKeys.append(key)
            return index
        }
        // The folded cursor, and the index of the last entry that set it,
        // since the last resync.
        var cursor: String?
        var cursorSetter: Int?
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
            let kind: Sketch.Kind
            switch entry.body {
            case .intent(let intent):
                var hasher = Hasher()
                var key = intent.idempotencyKey
                key.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
                kind = .intent(
                    entity: try entity(intent.entityType, intent.entityID), operation: intent.operation,
                    keyHash: hasher.finalize())
            case .ack(let ack): kind = .ack(intent: ack.intentOffset, version: ack.serverVersion)
            case .reject(let reject): kind = .reject(intent: reject.intentOffset)
            case .remote(let remote):
                kind = .state(
                    entity: try entity(remote.entityType, remote.entityID), version: remote.serverVersion,
                    deleted: remote.operation == .delete, snapshot: false)
                (cursor, cursorSetter) = (remote.cursor, plan.sketches.count)
            case .snapshot(let snapshot):
                kind =
                    snapshot.entityType.isEmpty
                    ? .cursorOnlySnapshot
                    : .state(
                        entity: try entity(snapshot.entityType, snapshot.entityID), version: snapshot.serverVersion,
                        deleted: snapshot.deleted, snapshot: true)
                (cursor, cursorSetter) = (snapshot.cursor.isEmpty ? nil : snapshot.cursor, plan.sketches.count)
            case .resync:
                kind = .resync
                (cursor, cursorSetter) = (nil, nil)
            case .conflict(let conflict): kind = .conflict(intent: conflict.intentOffset)
            }
            plan.sketches.append(Sketch(offset: entry.offset, timestamp: entry.timestamp, kind: kind))
            return true
        }
        entityIndices = [:]
        plan.cursor = cursor ?? ""
        let firstAnswers = try decideKept(&plan, txn)
        let states = fold(plan, firstAnswers: firstAnswers)

        // An entity whose base a snapshot set last keeps that snapshot: it
        // gives the base where it is. Any other entity with a base that a
        // removed entry changed gets a new snapshot, in place of the last
        // such entry; the kept entries give the rest their bases again.
        for (entity, state) in states.enumerated() where state.version > 0 {
            if let setter = state.setter, case .state(_, _, _, snapshot: true) = plan.sketches[setter].kind {
                plan.keep[setter] = true
            } else if let slot = state.slot {
                plan.snapshots.append((slot, Int32(entity), state))
            }
        }
        // A replay of the log as planned must give each entity its folded
        // base. An entity it would not (see `divergentEntities`) keeps the
        // entries that gave it that base instead; should any still differ,
        // the compaction keeps every entry, which is always right.
        let divergent = divergentEntities(plan, states, firstAnswers: firstAnswers)
        if !divergent.isEmpty {
            for entity in divergent { keepWhole(entity, &plan, firstAnswers: firstAnswers) }
            plan.keepConflictsOfKeptIntents()
            if !divergentEntities(plan, states, firstAnswers: firstAnswers).isEmpty {
                plan.keep = plan.keep.map { _ in true }
                plan.snapshots = []
            }
        }
        // The highest entry below the watermark that sets the cursor (a
        // snapshot, or a pulled change kept with its entity) sets the one a
        // replay leaves there, so it must carry the folded cursor. A new
        // snapshot does; so does the last entry to set the cursor, which
        // stays when it is a cursor-only snapshot above every new one (below
        // one, it would go the next time). Otherwise, when the highest is a
        // kept entry with another cursor (or there is none, and a cursor was
        // folded), a cursor-only snapshot takes the place of that last
        // entry: it goes, and it is above every kept one.
        let highestNew = plan.snapshots.map(\.slot).max()
        if let setter = cursorSetter, case .cursorOnlySnapshot = plan.sketches[setter].kind, highestNew ?? -1 < setter {
            plan.keep[setter] = true
        }
        let highestKept = plan.sketches.indices.last { index in
            switch plan.sketches[index].kind {
            case .state, .cursorOnlySnapshot: plan.keep[index]
            default: false
            }
        }
        let carried: String?  // nil: no entry sets it
        if let highestNew, highestNew > highestKept ?? -1 {
            carried = plan.cursor
        } else {
            carried = try highestKept.map { try cursorSet(at: plan.sketches[$0].offset, txn) }
        }
        if carried.map({ $0 != plan.cursor }) ?? (cursor != nil) {
            guard let setter = cursorSetter, !plan.keep[setter] else {
                preconditionFailure("the highest entry kept does not carry the cursor, and the last entry to set it stays")
            }
            plan.snapshots.append((setter, nil, FoldedState()))
        }
        plan.snapshots.sort { $0.slot < $1.slot }
        return plan
    }

    /// The cursor the remote or snapshot at `offset` sets ("" for none).
    private func cursorSet(at offset: UInt64, _ txn: borrowing Transaction) throws -> String {
        switch try EventLog.entry(at: offset, in: log.logDatabase, path: path, txn)?.body {
        case .snapshot(let snapshot)?: return snapshot.cursor
        case .remote(let remote)?: return remote.cursor
        default:
            throw LogStoreError(.corruptEntry, path: path, offset: offset, "compaction read offset \(offset) twice and found another entry")
        }
    }

    /// Marks the entries below the watermark that compaction keeps (its
    /// step 2, but for snapshots):
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
    /// - Returns: the index of each answered intent's first answer.
    private func decideKept(_ plan: inout CompactionPlan, _ txn: borrowing Transaction) throws -> [Int: Int] {
        let waiting = try waitingConflicts(txn)
        let sketches = plan.sketches
        var keep = [Bool](repeating: false, count: sketches.count)
        var firstAnswers: [Int: Int] = [:]
        var pendingCounts = [Int](repeating: 0, count: plan.entityKeys.count)
        var lastEmptied = [Int](repeating: -1, count: plan.entityKeys.count)
        var lastResync = -1
        for (index, sketch) in sketches.enumerated() {
            switch sketch.kind {
            case .intent(let entity, _, _):
                pendingCounts[Int(entity)] += 1
            case .ack(let intent, _), .reject(let intent):
                guard let intentIndex = plan.intentIndex(intent), firstAnswers[intentIndex] == nil else { break }
                firstAnswers[intentIndex] = index
                let entity = Int(plan.intent(at: intentIndex).entity)
                pendingCounts[entity] -= 1
                if pendingCounts[entity] == 0 { lastEmptied[entity] = index }
            case .resync:
                lastResync = index
            default:
                break
            }
        }
        for (index, sketch) in sketches.enumerated() {
            guard case .intent(let entity, _, _) = sketch.kind else { continue }
            guard let answer = firstAnswers[index] else {
                keep[index] = true
                continue
            }
            let entityIndex = Int(entity)
            let neededForBase = pendingCounts[entityIndex] > 0 && answer > max(lastEmptied[entityIndex], lastResync)
            if waiting.contains(sketch.offset) || neededForBase {
                keep[index] = true
                keep[answer] = true
            }
        }
        if lastResync >= 0, (0..<lastResync).contains(where: { keep[$0] && sketches[$0].isAck }) { keep[lastResync] = true }
        plan.keep = keep
        plan.lastResync = lastResync
        plan.keepConflictsOfKeptIntents()
        return firstAnswers
    }

    /// Every entity's confirmed state after the entries below the watermark
    /// (compaction's step 1), by `Confirmed`'s rules, as references to
    /// entries: none (version 0) for an entity the entries after the last
    /// resync do not confirm. A resync forgets every state by starting a
    /// new epoch, not by visiting each.
    ///
    /// With `replaying` set, the same over the log as the plan leaves it:
    /// the kept entries, and each new snapshot of an entity (in
    /// `states`, the fold) at its slot, what a replay would see.
    private func fold(
        _ plan: CompactionPlan, firstAnswers: [Int: Int], replaying states: [FoldedState]? = nil
    ) -> [FoldedState] {
        var newSnapshots: [Int: Int32] = [:]
        for snapshot in plan.snapshots { if let entity = snapshot.entity { newSnapshots[snapshot.slot] = entity } }
        var folded = [FoldedState](repeating: FoldedState(), count: plan.entityKeys.count)
        var epoch = 0
        for index in plan.sketches.indices {
            let kind: Sketch.Kind
            if let states, let entity = newSnapshots[index] {
                let state = states[Int(entity)]
                kind = .state(entity: entity, version: state.version, deleted: state.base == nil, snapshot: true)
            } else if states == nil || plan.keep[index] {
                kind = plan.sketches[index].kind
            } else {
                continue
            }
            switch kind {
            case .state(let entity, let version, let deleted, _):
                let entity = Int(entity)
                if folded[entity].epoch != epoch { folded[entity] = FoldedState(epoch: epoch) }
                if Confirmed.serverChangeApplies(version: version, over: folded[entity].version) {
                    folded[entity].version = version
                    folded[entity].base = deleted ? nil : index
                    folded[entity].updates = []
                    folded[entity].setter = index
                    folded[entity].slot = index
                }
            case .ack(let intent, let version):
                // Only the first answer to a pending intent settles it, as in
                // the projections; an answer to an intent a previous
                // compaction removed (or this one would) changes nothing.
                guard let intentIndex = plan.intentIndex(intent), firstAnswers[intentIndex] == index,
                    states == nil || plan.keep[intentIndex]
                else { break }
                let (entityIndex, operation) = plan.intent(at: intentIndex)
                let entity = Int(entityIndex)
                if folded[entity].epoch != epoch { folded[entity] = FoldedState(epoch: epoch) }
                guard
                    Confirmed.ackApplies(
                        version: version, operation, over: folded[entity].version, basePresent: folded[entity].base != nil)
                else { break }
                folded[entity].version = version
                folded[entity].setter = index
                if !plan.keep[index] { folded[entity].slot = index }
                switch operation {
                case .create:
                    folded[entity].base = intentIndex
                    folded[entity].updates = []
                case .update:
                    folded[entity].updates.append(intentIndex)
                case .delete:
                    folded[entity].base = nil
                    folded[entity].updates = []
                }
            case .resync:
                epoch += 1
            default:
                break
            }
        }
        for entity in folded.indices where folded[entity].epoch != epoch { folded[entity] = FoldedState() }
        return folded
    }

    /// The entities to which a replay of the log as the plan leaves it
    /// would give another base than the fold: a new snapshot that is not
    /// the last to change it, or kept entries that change it otherwise.
    /// Only logs whose server versions go down between resyncs have them:
    /// an ack of an update that found no base (a pulled delete before it)
    /// and a pulled change at a lower version after it, say. Without the
    /// delete, the ack would apply in a replay, above the snapshot's version.
    private func divergentEntities(_ plan: CompactionPlan, _ states: [FoldedState], firstAnswers: [Int: Int]) -> [Int32] {
        var newSnapshots: [Int32: Int] = [:]
        for snapshot in plan.snapshots { if let entity = snapshot.entity { newSnapshots[entity] = snapshot.slot } }
        let replayed = fold(plan, firstAnswers: firstAnswers, replaying: states)
        return states.indices.compactMap { entity in
            let (folded, replayed) = (states[entity], replayed[entity])
            let same =
                if let slot = newSnapshots[Int32(entity)] {
                    replayed.setter == slot
                } else {
                    replayed.version == folded.version && replayed.base == folded.base && replayed.updates == folded.updates
                }
            return same ? nil : Int32(entity)
        }
    }

    /// Keeps the entries that give `entity` its base after the last resync
    /// below the watermark, so that a replay applies them as the fold did,
    /// and drops its new snapshot: every remote and snapshot naming it, and
    /// each of its intents answered there, with that first answer.
    private func keepWhole(_ entity: Int32, _ plan: inout CompactionPlan, firstAnswers: [Int: Int]) {
        plan.snapshots.removeAll { $0.entity == entity }
        for index in plan.sketches.indices where index > plan.lastResync {
            if case .state(entity, _, _, _) = plan.sketches[index].kind { plan.keep[index] = true }
        }
        for (intent, answer) in firstAnswers where answer > plan.lastResync && plan.intent(at: intent).entity == entity {
            plan.keep[intent] = true
            plan.keep[answer] = true
        }
    }

    /// Intent offsets whose conflict waits for the app, which compaction keeps.
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
        let logDatabase = log.logDatabase
        // The new snapshots first, while every entry their fields come from
        // is there: none takes the place of an entry another one's state is
        // folded from (those name its entity, or are its intents; the
        // cursor-only snapshot's entry changed no base), and nothing is
        // deleted yet.
        for (slot, entity, state) in plan.snapshots {
            let (offset, timestamp) = (plan.sketches[slot].offset, plan.sketches[slot].timestamp)
            var snapshot = Snapshot(
                watermark: plan.watermark, cursor: plan.cursor, entityType: "", entityID: "", serverVersion: 0, fields: [:])
            if let entity {
                (snapshot.entityType, snapshot.entityID) = EntityKey.split(plan.entityKeys[Int(entity)].bytes)
                snapshot.serverVersion = state.version
                let fields = try foldedFields(state, plan, snapshot.entityType, snapshot.entityID, txn)
                (snapshot.deleted, snapshot.fields) = (fields == nil, fields ?? [:])
            }
            let entry = Entry(offset: offset, timestamp: timestamp, body: .snapshot(snapshot))
            try txn.put(logDatabase, key: OffsetKey.encode(offset), value: try EntryCodec.encode(entry))
        }
        // Then the removed entries that took no snapshot, and the
        // idempotency rows of the intents among them.
        let placed = Set(plan.snapshots.map(\.slot))
        let idempotency = try projector(txn).idempotency
        // The last kept intent with each key hash.
        var keptIntents: [Int: Int] = [:]
        for (index, sketch) in plan.sketches.enumerated() where plan.keep[index] {
            if case .intent(_, _, let keyHash) = sketch.kind { keptIntents[keyHash] = index }
        }
        for (index, sketch) in plan.sketches.enumerated() where !plan.keep[index] && !placed.contains(index) {
            if case .intent(_, _, let keyHash) = sketch.kind {
                let key = Array(try readIntent(at: sketch.offset, txn).idempotencyKey.utf8)
                // A row that names a later intent with the same key stays.
                if try txn.get(idempotency, key: key) == OffsetKey.encode(sketch.offset) {
                    if let kept = try lastKeptIntent(withKey: key, hash: keyHash, candidate: keptIntents[keyHash], plan, txn) {
                        try txn.put(idempotency, key: key, value: OffsetKey.encode(kept))
                    } else {
                        try txn.delete(idempotency, key: key)
                    }
                }
            }
            try txn.delete(logDatabase, key: OffsetKey.encode(sketch.offset))
        }
        let previous = try log.compactedBelow(txn)
        try txn.put(log.metaDatabase, key: StoreFormat.compactedBelowKey, value: max(previous, plan.watermark).bigEndianBytes)
        // A rebuild under way may have read entries just removed, or not yet
        // read the snapshots that replace them (some below its watermark):
        // its tables could not come out as a replay of this log would make
        // them, so it starts again, here.
        try restartRebuild(txn)
    }

    /// The fields of a folded state (nil: absent), read from the entries it
    /// names: its base, and each acknowledged update merged over it.
    private func foldedFields(
        _ state: FoldedState, _ plan: CompactionPlan, _ type: String, _ id: String, _ txn: borrowing Transaction
    ) throws -> Fields? {
        guard let base = state.base else { return nil }
        let offset = plan.sketches[base].offset
        var fields: Fields
        switch try EventLog.entry(at: offset, in: log.logDatabase, path: path, txn)?.body {
        case .intent(let intent)?: fields = intent.fields
        case .remote(let remote)?: fields = remote.fields
        case .snapshot(let snapshot)?: fields = snapshot.fields
        default:
            throw LogStoreError(
                .corruptEntry, path: path, offset: offset,
                "compaction read offset \(offset) again for the state of \(type)/\(id) and found another entry")
        }
        for update in state.updates { fields.merge(try readIntent(at: plan.sketches[update].offset, txn).fields) }
        return fields
    }

    /// The intent at `offset`, which planning read as one.
    private func readIntent(at offset: UInt64, _ txn: borrowing Transaction) throws -> Intent {
        guard case .intent(let intent)? = try EventLog.entry(at: offset, in: log.logDatabase, path: path, txn)?.body else {
            throw LogStoreError(.corruptEntry, path: path, offset: offset, "compaction read offset \(offset) again and found no intent")
        }
        return intent
    }

    /// The offset of the last kept intent below the watermark whose
    /// idempotency key is `key`: `candidate`, the last with its hash, when
    /// its key is the same; otherwise (two keys with one hash) the kept
    /// intents with that hash, from the last.
    private func lastKeptIntent(
        withKey key: [UInt8], hash: Int, candidate: Int?, _ plan: CompactionPlan, _ txn: borrowing Transaction
    ) throws -> UInt64? {
        guard let candidate else { return nil }
        func matches(_ index: Int) throws -> Bool {
            try readIntent(at: plan.sketches[index].offset, txn).idempotencyKey.utf8.elementsEqual(key)
        }
        if try matches(candidate) { return plan.sketches[candidate].offset }
        for index in plan.sketches.indices[..<candidate].reversed() where plan.keep[index] {
            if case .intent(_, _, hash) = plan.sketches[index].kind, try matches(index) { return plan.sketches[index].offset }
        }
        return nil
    }
}
