import LMDB
import LogFormat

/// One change in a pulled page: the entity's full server state after it.
public struct PulledChange: Sendable, Equatable {
    public var operation: Remote.Operation
    public var entityType: String
    public var entityID: String
    public var serverVersion: UInt64
    /// The entity's fields (empty for a delete).
    public var fields: Fields
    /// The idempotency key of the operation that made the change, when the
    /// server says (`Format/sync-protocol.md`, section 8). It tells a change
    /// the server lost from another made at its version (`awaited-feed`);
    /// the log does not keep it.
    public var idempotencyKey: String?

    public init(
        _ operation: Remote.Operation, entityType: String, entityID: String, serverVersion: UInt64, fields: Fields = [:],
        idempotencyKey: String? = nil
    ) {
        self.operation = operation
        self.entityType = entityType
        self.entityID = entityID
        self.serverVersion = serverVersion
        self.fields = fields
        self.idempotencyKey = idempotencyKey
    }
}

extension Store {
    /// Applies a pulled page in one transaction: a `remote` entry per
    /// change, the projection updates, and the new cursor (carried by the
    /// entries) commit together, or nothing does. An empty page changes
    /// nothing, so the cursor stays where it was.
    /// - Throws: `LogStoreError.invalidArgument` for a cursor the protocol
    ///   does not allow (`Wire.cursorProblem`: `pullCursor` would read it
    ///   back as damage), or a change whose type, id or fields break the
    ///   rules, or too big for one entry (a server that breaks the
    ///   protocol's `entityFieldsBytesMax`); nothing of the page is applied
    ///   then.
    public func applyPulledPage(_ changes: [PulledChange], cursor: String) async throws {
        try checkPulledPage(changes, cursor: cursor)
        guard !changes.isEmpty else { return }
        try await write { txn, context, store in try store.apply(changes, cursor: cursor, txn, &context) }
    }

    /// `applyPulledPage(_:cursor:)` for a page pulled from `pulledFrom`
    /// (nil: from the feed's start), applied only while the pull cursor is
    /// still that one. The pull awaits the page with no transaction open,
    /// so a `resync` may forget the cursor meanwhile: applied, the page
    /// would set the cursor past the changes the resync forgot, and no pull
    /// would bring them back.
    /// - Returns: false, with nothing applied, when the pull cursor is no
    ///   longer `pulledFrom` (for an empty page too): the pull goes on from
    ///   the cursor the store has.
    /// - Throws: as `applyPulledPage(_:cursor:)`.
    public func applyPulledPage(_ changes: [PulledChange], cursor: String, pulledFrom: String?) async throws -> Bool {
        try checkPulledPage(changes, cursor: cursor)
        let expected = pulledFrom.map { Array($0.utf8) }
        guard !changes.isEmpty else {
            return try log.environment.read { txn in try txn.get(log.metaDatabase, key: MetaKey.cursor) == expected }
        }
        return try await write { txn, context, store in
            guard try txn.get(store.log.metaDatabase, key: MetaKey.cursor) == expected else { return false }
            try store.apply(changes, cursor: cursor, txn, &context)
            return true
        }
    }

    /// The checks of a pulled page made before its transaction.
    private func checkPulledPage(_ changes: [PulledChange], cursor: String) throws {
        if let problem = Wire.cursorProblem(cursor.utf8) { throw Validation.invalid("a pulled page's cursor \(problem)") }
        for change in changes {
            try Validation.entityType(change.entityType)
            try Validation.entityID(change.entityID)
            try Validation.fields(change.fields)
            guard change.serverVersion >= 1 else {
                throw Validation.invalid("\(change.entityType)/\(change.entityID): server versions start at 1")
            }
        }
    }

    /// Appends a `remote` entry per change, with `cursor`, and applies it.
    private func apply(_ changes: [PulledChange], cursor: String, _ txn: borrowing Transaction, _ context: inout WriteContext)
        throws
    {
        let projector = try projector(txn)
        for change in changes {
            try append(
                .remote(
                    Remote(
                        cursor: cursor, change.operation, entityType: change.entityType, entityID: change.entityID,
                        serverVersion: change.serverVersion, fields: change.operation == .delete ? [:] : change.fields)),
                txn, &context)
            try projector.sawInFeed(
                change.entityType, change.entityID, version: change.serverVersion, idempotencyKey: change.idempotencyKey, txn)
        }
    }

    /// Starts a full resync: forgets the server-confirmed state and the pull
    /// cursor (pending intents stay), so the next pull starts from scratch.
    public func resync(reason: String) async throws {
        try await write { txn, context, store in try store.append(.resync(reason: reason), txn, &context) }
    }
}

// MARK: - Comparing derived state

/// The derived databases' contents, in key order: what replay must reproduce.
/// Outbox values are left out (retry timers start over on replay, by
/// design); the outbox's keys are kept.
package struct DerivedTables: Equatable, Sendable {
    package var entities: [[UInt8]] = []
    package var counts: [[UInt8]] = []
    package var idempotency: [[UInt8]] = []
    package var outboxKeys: [[UInt8]] = []
    package var conflicts: [[UInt8]] = []
    package var cursor: [UInt8]?
    package var watermark: UInt64 = 0
}

extension Store {
    /// A copy of the derived databases, for comparing with a replay.
    package func derivedTables() throws -> DerivedTables {
        try log.environment.read { txn in
            let projector = try self.projector(txn)
            var tables = DerivedTables()
            tables.entities = try rows(projector.entities, txn)
            tables.counts = try rows(projector.counts, txn)
            tables.idempotency = try rows(projector.idempotency, txn)
            tables.outboxKeys = try rows(projector.outbox, txn, keysOnly: true)
            tables.conflicts = try rows(projector.conflicts, txn)
            tables.cursor = try txn.get(log.metaDatabase, key: MetaKey.cursor)
            tables.watermark = try watermark(txn)
            return tables
        }
    }

    /// Keys and values (or keys only) of a database, flattened in key order.
    private func rows(_ database: Database, _ txn: borrowing Transaction, keysOnly: Bool = false) throws -> [[UInt8]] {
        var rows: [[UInt8]] = []
        try txn.forEach(database) { key, value in
            rows.append([UInt8](key))
            if !keysOnly { rows.append([UInt8](value)) }
            return true
        }
        return rows
    }
}
