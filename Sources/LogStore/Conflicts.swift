import LMDB
import LogFormat

/// A conflict to decide: the local intent the server refused, what the app
/// saw, and what the server has.
public struct ConflictCase: Sendable, Equatable {
    public var intentOffset: UInt64
    public var intent: Intent
    /// When the intent was written (its entry's timestamp).
    public var writtenAt: HybridTimestamp
    /// The state the server had confirmed to this store (nil: none).
    public var base: Fields?
    /// Whether `base` is the state the intent was pushed against, so that
    /// the fields where `server` differs from it are those the server
    /// changed since. False when changes pulled after the intent was made
    /// (or a resync) moved the base on: it then holds server changes the
    /// intent never saw, and shows them as no change at all.
    public var baseIsCommonAncestor: Bool
    /// What the app saw when the conflict was recorded (nil: absent); for a
    /// conflict the app settles later, with the changes it made since.
    public var local: Fields?
    /// The server's state when it refused the intent (the protocol's `server_state`).
    public var server: ServerState
}

/// How a conflict is settled.
public enum ConflictDecision: Sendable, Equatable {
    /// Push the local change again, on top of the server's version.
    case keepLocal
    /// Drop the local change; the server's state stands.
    case keepRemote
    /// The entity should become these fields (a merge of both sides). A
    /// field the server's state has and these leave out is set to null (an
    /// update names the fields it sets; it removes none).
    case merged(Fields)
    /// The entity should become these fields, or be deleted (nil), as the
    /// app's own rule decided. As with `merged`, a field the server's state
    /// has and these leave out is set to null.
    case custom(Fields?)
    /// Leave it to the app: listed by `Store.conflicts()` until
    /// `Store.resolveConflict` is called, across restarts, or until the app
    /// creates or deletes the entity, which settles it `keepLocal` (the
    /// write replaced the whole state). One the app has already replaced
    /// so, when the answer comes, is settled `keepLocal` at once.
    case askApp
}

/// A decision `Store.record` refused for a conflict: the conflict was left
/// for the app instead, as `.askApp` leaves it.
public struct RefusedDecision: Sendable, Equatable {
    /// The refused intent, as `WaitingConflict.conflict.intentOffset`.
    public var intentOffset: UInt64
    public var entityType: String
    public var entityID: String
    /// Why the decision was refused, for people.
    public var reason: String

    public init(intentOffset: UInt64, entityType: String, entityID: String, reason: String) {
        self.intentOffset = intentOffset
        self.entityType = entityType
        self.entityID = entityID
        self.reason = reason
    }
}

/// A conflict waiting for the app.
public struct WaitingConflict: Sendable, Equatable {
    /// The offset of the `conflict` entry.
    public var offset: UInt64
    public var conflict: Conflict
    /// The intent the server refused.
    public var intent: Intent
    public var writtenAt: HybridTimestamp
}

extension Store {
    /// The conflicts waiting for the app, oldest intent first.
    public func conflicts() throws -> [WaitingConflict] {
        try log.environment.read { txn in
            var rows: [(intent: UInt64, value: [UInt8])] = []
            try txn.forEach(projector(txn).conflicts) { key, value in
                rows.append((try OffsetKey.decode(key, table: "conflicts", path: path), [UInt8](value)))
                return true
            }
            return try rows.map { row in
                let (offset, conflict) = try conflictEntry(row.value, ofIntent: row.intent, txn)
                let intentEntry = try entryInside(txn, at: row.intent)
                guard case .intent(let intent) = intentEntry.body else {
                    throw LogStoreError(.corruptEntry, path: path, offset: row.intent, "a conflict names an entry that is not an intent")
                }
                return WaitingConflict(offset: offset, conflict: conflict, intent: intent, writtenAt: intentEntry.timestamp)
            }
        }
    }

    /// Settles a conflict that waits for the app: writes a `conflict` entry
    /// with the decision and, when the decision needs it, a new intent that
    /// pushes the outcome on top of the server's version.
    /// - Parameters:
    ///   - intentOffset: the refused intent, as `WaitingConflict.conflict.intentOffset`.
    ///   - decision: anything but `.askApp`.
    /// - Throws: `LogStoreError.notFound` when no conflict of that intent
    ///   waits; `.corruptEntry` or `.gap` when its `conflicts` row is
    ///   damaged, as `conflicts()` reports it; `.invalidArgument` for
    ///   `.askApp`, invalid fields, or a decision whose intent would be
    ///   over the entry limit (`Settlement.problem`).
    public func resolveConflict(intentOffset: UInt64, _ decision: ConflictDecision) async throws {
        guard decision != .askApp else { throw Validation.invalid("a conflict is resolved by a decision other than askApp") }
        try Store.validate(decision)
        try await write { txn, context, store in
            let pending = try store.waitingConflict(of: intentOffset, txn)
            let server = ServerState(serverVersion: pending.serverVersion, deleted: pending.serverDeleted, data: pending.serverFields)
            var (conflictCase, record) = try store.conflictCase(intentOffset, server, txn)
            conflictCase.local = try store.localState(waiting: pending, conflictCase, record, txn)
            let settlement = try store.settlement(conflictCase, decision, record, txn)
            if let problem = settlement.problem { throw Validation.invalid(problem) }
            try store.settle(settlement, txn, &context)
        }
    }

    /// The `conflict` entry the `conflicts` row of `intentOffset` names.
    /// A damaged row is reported as `conflicts()` reports it: read as no
    /// row, it told the app no conflict waits while the list showed damage.
    /// - Throws: `LogStoreError.notFound` when there is no row;
    ///   `.corruptEntry` naming the row when its value is not 8 bytes or
    ///   names an entry that is not a conflict; `.gap` when the entry is missing.
    private func waitingConflict(of intentOffset: UInt64, _ txn: borrowing Transaction) throws -> Conflict {
        guard let value = try txn.get(projector(txn).conflicts, key: OffsetKey.encode(intentOffset)) else {
            throw LogStoreError(.notFound, path: path, offset: intentOffset, "no conflict of intent \(intentOffset) waits for the app")
        }
        return try conflictEntry(value, ofIntent: intentOffset, txn).conflict
    }

    /// The `conflict` entry that `value`, the `conflicts` row of `intent`, names.
    /// - Throws: `LogStoreError.corruptEntry` naming the row when the value
    ///   is not 8 bytes or names an entry that is not a conflict; `.gap`
    ///   when the entry is missing.
    private func conflictEntry(_ value: [UInt8], ofIntent intent: UInt64, _ txn: borrowing Transaction) throws
        -> (offset: UInt64, conflict: Conflict)
    {
        guard let offset = UInt64(bigEndianBytes: value) else {
            throw LogStoreError(
                .corruptEntry, path: path, offset: intent, "conflicts: the row of intent \(intent) is \(value.count) bytes, not an offset of 8")
        }
        guard let entry = try EventLog.entry(at: offset, in: log.logDatabase, path: path, txn) else {
            throw LogStoreError(.gap, path: path, offset: offset, "conflicts: the row of intent \(intent) names offset \(offset), which holds no entry")
        }
        guard case .conflict(let conflict) = entry.body else {
            throw LogStoreError(
                .corruptEntry, path: path, offset: offset, "conflicts: the row of intent \(intent) names an entry that is not a conflict")
        }
        return (offset, conflict)
    }

    /// What the conflict looks like from this store, read inside a write,
    /// and the entity's record it was read from, which `localState` and
    /// `settlement` read too.
    func conflictCase(_ offset: UInt64, _ server: ServerState, _ txn: borrowing Transaction) throws
        -> (conflictCase: ConflictCase, record: EntityRecord?)
    {
        let entry = try entryInside(txn, at: offset)
        guard case .intent(let intent) = entry.body else {
            throw LogStoreError(.corruptEntry, path: path, offset: offset, "a conflict names an entry that is not an intent")
        }
        let record = try projector(txn).load(intent.entityType, intent.entityID, txn)
        // The base version it was pushed with (`pushBatch`).
        let sent = max(intent.baseVersion, record?.ackedVersion ?? 0)
        let conflictCase = ConflictCase(
            intentOffset: offset, intent: intent, writtenAt: entry.timestamp, base: record?.base,
            baseIsCommonAncestor: (record?.baseVersion ?? 0) == sent, local: record?.visible, server: server)
        return (conflictCase, record)
    }

    /// What the app saw when the conflict was recorded, for a decision made
    /// later, with the changes the app made since. The visible state no
    /// longer shows it: the `reject` took the refused intent out of the
    /// pending ones, and a pull may since have replaced the base the intent
    /// was made on (a pulled delete leaves none). For an entity the server
    /// deleted, where `keepLocal` recreates this state, the waiting entry
    /// keeps it (`settlement`), and the entity's intents after the refused
    /// one are applied over it (again, for those it already holds: updates
    /// applied twice in order give the same state). An entry without it
    /// (written by an older store, or a state too large for an entry, which
    /// no create could carry either) gets the refused intent applied again
    /// in its place among the pending ones, over the base as it is now.
    /// A later delete leaves no state: the app sees no entity.
    func localState(
        waiting: Conflict, _ conflictCase: ConflictCase, _ record: EntityRecord?, _ txn: borrowing Transaction
    ) throws -> Fields? {
        let refused = conflictCase.intentOffset
        let projector = try self.projector(txn)
        let pending = record?.pending ?? []
        let later = pending.filter { $0 > refused }
        let (type, id) = (conflictCase.intent.entityType, conflictCase.intent.entityID)
        if waiting.serverDeleted, !waiting.resolvedFields.isEmpty {
            return try projector.fold(waiting.resolvedFields, later, of: type, id, txn)
        }
        let before = try projector.fold(record?.base, pending.filter { $0 < refused }, of: type, id, txn)
        return try projector.fold(Projector.applying(conflictCase.intent, to: before), later, of: type, id, txn)
    }

    /// The entries that record `decision`, planned before any is appended
    /// so that a decision that cannot be recorded is refused whole.
    ///
    /// The `conflict` entry keeps the state the decision settled on only
    /// when it fits: the server allows an entity of up to
    /// `entityFieldsBytesMax`, just under an entry, so the server's state
    /// alone always fits, but not with a second state of that size. No rule
    /// reads the resolved fields (`Format/storage.md`, section 7): the
    /// resolution intent appended after the entry carries the change, and
    /// the server's state stays in the entry, so a trace of the conflict is
    /// kept whole and only a copy is left out.
    ///
    /// A conflict left for the app whose entity the server deleted keeps
    /// what the app saw in its `resolved_fields` instead (when it fits), so
    /// that a `keepLocal` decided later recreates that state, as one decided
    /// now does (`localState(waiting:_:_:_:)`): once the server's delete is
    /// pulled, the log holds it nowhere else.
    ///
    /// The resolution intent goes at the end of the log, so it is pushed
    /// after the entity's intents that came after the refused one, and must
    /// not undo them. When one of them is a create or a delete, the app has
    /// replaced the whole state since: what it sees now stands, and the
    /// resolution pushes nothing (a create after the app's delete would
    /// bring the entity back). Later updates only take their fields out of
    /// an update; a create has them (`ConflictCase.local`, or
    /// `pushed(_:over:_:)` adds them).
    /// - Parameter record: the entity's record, as `conflictCase` read it.
    func settlement(
        _ conflictCase: ConflictCase, _ decision: ConflictDecision, _ record: EntityRecord?, _ txn: borrowing Transaction
    ) throws -> Settlement {
        let projector = try self.projector(txn)
        let later = try (record?.pending ?? []).filter { $0 > conflictCase.intentOffset }.map { try projector.readIntent(at: $0, txn) }
        let replaced = later.contains { $0.operation != .update }
        // Every decision keeps what the app sees then: none is left to the
        // app, as the write settles a conflict already waiting
        // (`settleWaitingConflicts`).
        var outcome = ConflictOutcome(decision == .askApp && replaced ? .keepLocal : decision, conflictCase)
        if outcome.intent != nil, replaced {
            outcome.intent = nil
            outcome.resolvedFields = conflictCase.local ?? [:]
        }
        let intent = conflictCase.intent
        let server = conflictCase.server
        var conflict = Conflict(
            intentOffset: conflictCase.intentOffset, entityType: intent.entityType, entityID: intent.entityID,
            serverVersion: server.serverVersion, serverDeleted: server.deleted, serverFields: server.data,
            resolution: outcome.resolution, resolvedFields: outcome.resolvedFields)
        if outcome.resolution == .pending, server.deleted { conflict.resolvedFields = conflictCase.local ?? [:] }
        conflict.dropResolvedFieldsThatDoNotFit()
        let resolution = pushed(outcome, over: conflictCase.base, later).map { operation, fields in
            Intent(
                operation, idempotencyKey: WriteBatch.newKey(), entityType: intent.entityType, entityID: intent.entityID,
                baseVersion: server.serverVersion, fields: fields)
        }
        return Settlement(conflict: conflict, intent: resolution)
    }

    /// Settles the waiting conflicts of an entity the app has just created
    /// or deleted (`Store.write`): the write replaced the whole state, so
    /// what the app sees now stands, whatever it would decide, as it does
    /// for a decision made while the write is pending (`settlement`). A
    /// decision made after the write is answered could not tell: no pending
    /// intent would show it, and a `keepLocal` would bring back the state
    /// the conflict kept. Each is settled `keepLocal`, with what the app
    /// sees and no resolution intent.
    func settleWaitingConflicts(
        of type: String, _ id: String, _ projector: Projector, _ txn: borrowing Transaction, _ context: inout WriteContext
    ) throws {
        var waiting: [Conflict] = []
        try txn.forEach(projector.conflicts) { key, value in
            // A damaged row is no reason to refuse the app's write: the
            // list of conflicts, their resolution and compaction report it.
            do {
                let intent = try OffsetKey.decode(key, table: "conflicts", path: path)
                let conflict = try conflictEntry([UInt8](value), ofIntent: intent, txn).conflict
                if conflict.entityType == type, conflict.entityID == id { waiting.append(conflict) }
            } catch is LogStoreError {}
            return true
        }
        guard !waiting.isEmpty else { return }
        let seen = try projector.load(type, id, txn)?.visible ?? [:]
        for var conflict in waiting {
            conflict.resolution = .keepLocal
            conflict.resolvedFields = seen
            conflict.dropResolvedFieldsThatDoNotFit()
            try append(.conflict(conflict), txn, &context)
        }
    }

    /// Appends the entries of a settlement whose `problem` is nil.
    func settle(_ settlement: Settlement, _ txn: borrowing Transaction, _ context: inout WriteContext) throws {
        precondition(settlement.problem == nil, "a settlement is checked before it is appended")
        try append(.conflict(settlement.conflict), txn, &context)
        if let intent = settlement.intent { try append(.intent(intent), txn, &context) }
    }

    /// The intent that pushes `outcome`, given the entity's confirmed state
    /// (`base`) and the app's later updates (`later`, the entity's pending
    /// intents after the refused one), which are pushed before it.
    ///
    /// An update applies over the confirmed state, and this store may have
    /// none of an entity the server has: its create met another replica's
    /// create of the same ID, not pulled yet. The update would show nothing
    /// until a pull brought the server's state, so the app's own entity
    /// would vanish. The resolution is then a create of the whole state it
    /// settled on, with the later updates over it, made against the
    /// server's version: the server applies it as a replace of that version
    /// (`Format/sync-protocol.md`, section 7), and the app sees it at once.
    ///
    /// An update leaves out the fields the later updates set: naming one,
    /// pushed after them, it would undo the app's later change (pushed on
    /// the version that change's ack gives, the server would apply it).
    private func pushed(_ outcome: ConflictOutcome, over base: Fields?, _ later: [Intent]) -> (Intent.Operation, Fields)? {
        guard let (operation, fields) = outcome.intent, operation == .update else { return outcome.intent }
        guard base != nil else {
            return (.create, later.reduce(outcome.resolvedFields) { $0.merging($1.fields) })
        }
        var remaining = fields
        for change in later {
            for (name, _) in change.fields { remaining[name] = nil }
        }
        return remaining.isEmpty ? nil : (operation, remaining)
    }

    static func validate(_ decision: ConflictDecision) throws {
        if let problem = problem(with: decision) { throw Validation.invalid(problem) }
    }

    /// Why `decision` cannot be recorded (fields the store would refuse from
    /// the app), or nil when it can.
    static func problem(with decision: ConflictDecision) -> String? {
        switch decision {
        case .merged(let fields), .custom(.some(let fields)): NameRules.fieldsProblem(fields)
        case .keepLocal, .keepRemote, .custom(nil), .askApp: nil
        }
    }
}

/// The entries that record a conflict's decision: the `conflict` entry and,
/// when the decision needs one, the intent that pushes its outcome on top of
/// the server's version.
struct Settlement {
    var conflict: Conflict
    var intent: Intent?

    /// Why the entries cannot be written, or nil when they can. The
    /// `conflict` entry always can, its resolved fields left out when they
    /// do not fit (`Store.settlement`), as long as the server's state keeps
    /// to the protocol's `entityFieldsBytesMax`. The intent can be over the
    /// entry limit: a create that brings back what the app sees (its changes
    /// on top of an entity near the limit), or a merge that adds that much.
    /// The server would refuse such a state anyway; thrown, it would abort
    /// the transaction recording a whole push batch on every run.
    var problem: String? {
        guard let intent else { return nil }
        let bytes = Settlement.bodyBytes(.intent(intent))
        guard bytes > Limits.entryBodyBytesMax else { return nil }
        return "the resolution would be an \(intent.operation) intent of \(bytes) bytes, "
            + "over the entry limit of \(Limits.entryBodyBytesMax) bytes"
    }

    /// The size of an entry body, which `Limits.entryBodyBytesMax` bounds.
    static func bodyBytes(_ body: EntryBody) -> Int { EntryCodec.encodedSize(body) - EntryCodec.headerBytes }
}

extension Conflict {
    /// Leaves `resolvedFields` empty when the entry with them would be over
    /// the entry limit: they are a copy for people (`Format/storage.md`,
    /// section 7), and the server's state, which always fits, is kept.
    mutating func dropResolvedFieldsThatDoNotFit() {
        if Settlement.bodyBytes(.conflict(self)) > Limits.entryBodyBytesMax { resolvedFields = [:] }
    }
}

/// What a decision amounts to: the resolution recorded in the log, the
/// state it settles on, and the intent (if any) that pushes that state.
struct ConflictOutcome: Equatable {
    var resolution: Conflict.Resolution
    var resolvedFields: Fields
    var intent: (Intent.Operation, Fields)?

    static func == (lhs: ConflictOutcome, rhs: ConflictOutcome) -> Bool {
        lhs.resolution == rhs.resolution && lhs.resolvedFields == rhs.resolvedFields
            && lhs.intent?.0 == rhs.intent?.0 && lhs.intent?.1 == rhs.intent?.1
    }

    init(resolution: Conflict.Resolution, resolvedFields: Fields, intent: (Intent.Operation, Fields)?) {
        self.resolution = resolution
        self.resolvedFields = resolvedFields
        self.intent = intent
    }

    init(_ decision: ConflictDecision, _ conflictCase: ConflictCase) {
        let server = conflictCase.server
        let serverState: Fields? = server.deleted ? nil : server.data
        switch decision {
        case .askApp:
            self.init(resolution: .pending, resolvedFields: [:], intent: nil)
        case .keepRemote:
            self.init(resolution: .keepRemote, resolvedFields: serverState ?? [:], intent: nil)
        case .keepLocal:
            let local = conflictCase.intent
            switch local.operation {
            case .create, .update:
                guard let serverState else {
                    // The server deleted it: bring back what the app sees,
                    // a refused create's later updates included (the server
                    // answers them `ENTITY_NOT_FOUND`, and this create, pushed
                    // after them, is all that carries their fields).
                    let fields = conflictCase.local ?? local.fields
                    self.init(resolution: .keepLocal, resolvedFields: fields, intent: (.create, fields))
                    return
                }
                self.init(resolution: .keepLocal, resolvedFields: serverState.merging(local.fields), intent: (.update, local.fields))
            case .delete:
                self.init(resolution: .keepLocal, resolvedFields: [:], intent: serverState == nil ? nil : (.delete, [:]))
            }
        case .merged(let target):
            self.init(resolution: .merged, target: target, serverState: serverState)
        case .custom(let target):
            self.init(resolution: .custom, target: target, serverState: serverState)
        }
    }

    /// Moves the server's state to `target` (nil: deleted) with one intent,
    /// or none when they already agree. An update cannot remove a field, so
    /// a field the target lacks is set to null.
    private init(resolution: Conflict.Resolution, target: Fields?, serverState: Fields?) {
        switch (target, serverState) {
        case (nil, nil):
            self.init(resolution: resolution, resolvedFields: [:], intent: nil)
        case (nil, .some):
            self.init(resolution: resolution, resolvedFields: [:], intent: (.delete, [:]))
        case (.some(let target), nil):
            self.init(resolution: resolution, resolvedFields: target, intent: (.create, target))
        case (.some(let target), .some(let server)):
            var changes: [(String, Value)] = target.filter { server[$0.name] != $0.value }.map { ($0.name, $0.value) }
            changes += server.filter { target[$0.name] == nil && $0.value != .null }.map { ($0.name, Value.null) }
            let intent: (Intent.Operation, Fields)? = changes.isEmpty ? nil : (.update, Fields(changes))
            self.init(resolution: resolution, resolvedFields: server.merging(Fields(changes)), intent: intent)
        }
    }
}
