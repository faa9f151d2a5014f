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

    public init(_ operation: Remote.Operation, entityType: String, entityID: String, serverVersion: UInt64, fields: Fields = [:]) {
        self.operation = operation
        self.entityType = entityType
        self.entityID = entityID
        self.serverVersion = serverVersion
        self.fields = fields
    }
}

extension Store {
    /// Applies a pulled page in one transaction: a `remote` entry per
    /// change, the projection updates, and the new cursor (carried by the
    /// entries) commit together, or nothing does. An empty page changes
    /// nothing, so the cursor stays where it was.
    /// - Throws: `LogStoreError.invalidArgument` for a change whose type, id
    ///   or fields break the rules; nothing of the page is applied then.
    public func applyPulledPage(_ changes: [PulledChange], cursor: String) async throws {
        guard !cursor.isEmpty else { throw Validation.invalid("a pulled page's cursor is empty") }
        for change in changes {
            try Validation.entityType(change.entityType)
            try Validation.entityID(change.entityID)
            try Validation.fields(change.fields)
            guard change.serverVersion >= 1 else {
                throw Validation.invalid("\(change.entityType)/\(change.entityID): server versions start at 1")
            }
        }
        guard !changes.isEmpty else { return }
        try await write { txn, context, store in
            for change in changes {
                try store.append(
                    .remote(
                        Remote(
                            cursor: cursor, change.operation, entityType: change.entityType, entityID: change.entityID,
                            serverVersion: change.serverVersion, fields: change.operation == .delete ? [:] : change.fields)),
                    txn, &context)
            }
        }
    }

    /// Starts a full resync: forgets the server-confirmed state and the pull
    /// cursor (pending intents stay), so the next pull starts from scratch.
    public func resync(reason: String) async throws {
        try await write { txn, context, store in try store.append(.resync(reason: reason), txn, &context) }
    }
}

// MARK: - Replay

extension Store {
    /// Rebuilds every derived database (projections, outbox, idempotency
    /// index, counts, cursor) from the log alone, a chunk of entries per
    /// transaction. Outbox retry timers start over.
    public func rebuildProjections() async throws {
        try await rebuildProjections(entriesPerTransaction: Store.replayChunkCountMax)
    }

    /// `rebuildProjections()` with another chunk size, so tests can put
    /// chunk boundaries anywhere.
    package func rebuildProjections(entriesPerTransaction: Int) async throws {
        precondition(entriesPerTransaction > 0, "a replay chunk needs room for an entry")
        // Straight to the log's writer: `write` would stamp the watermark
        // with the last offset, which is what replay must not do.
        try await log.perform { txn, context in
            try self.clearDerived(txn)
            let last = context.position.lastOffset
            self.replayedThrough.withLock { $0 = max($0, last) }
        }
        while try await log.perform({ txn, _ in try self.replayChunk(txn, countMax: entriesPerTransaction) }) {}
    }

    /// Opening: rebuild if the derived databases have another version,
    /// otherwise apply what the log has past their watermark.
    func bringProjectionsUpToDate() throws {
        let (version, watermark) = try projectionState()
        let last = try log.lastOffset()
        if version != Store.projectionVersion {
            _ = try log.performBlocking { txn, _ in try self.clearDerived(txn) }
        } else if watermark == last {
            return
        } else if watermark > last {
            // Entries appended from here would never be projected.
            throw LogStoreError(
                .corruptEntry, path: path,
                "the projection watermark \(watermark) is past the log's last offset \(last); rebuild the projections")
        }
        // Each chunk makes progress, so this runs at most last / chunk + 1 times.
        while try log.performBlocking({ txn, _ in try self.replayChunk(txn) }) {}
    }

    package func projectionState() throws -> (version: UInt32?, watermark: UInt64) {
        try log.environment.read { txn in try projectionState(txn) }
    }

    func projectionState(_ txn: borrowing Transaction) throws -> (version: UInt32?, watermark: UInt64) {
        let version = try txn.get(log.metaDatabase, key: MetaKey.projectionVersion).flatMap { UInt32(bigEndianBytes: $0) }
        return (version, try watermark(txn))
    }

    private func clearDerived(_ txn: borrowing Transaction) throws {
        for database in [projector.entities, projector.outbox, projector.idempotency, projector.counts, projector.conflicts] {
            try txn.removeAll(database)
        }
        try txn.delete(log.metaDatabase, key: MetaKey.cursor)
        var version = ByteWriter(capacity: 4)
        version.write(bigEndian: Store.projectionVersion)
        try txn.put(log.metaDatabase, key: MetaKey.projectionVersion, value: version.bytes)
        try markWatermark(0, txn)
    }

    /// Projects what the log has past the watermark, up to `last` (normally
    /// nothing: only entries appended without the store are missing).
    func catchUp(through last: UInt64, _ txn: borrowing Transaction, _ effects: inout CommitEffects) throws {
        // Bounded: each chunk applies entries or reports none remain.
        while try watermark(txn) < last, try replayChunk(txn, &effects, live: true) {}
    }

    /// The stored watermark; 0 when there is none. A value that is not 8
    /// bytes is damage, an error: read as 0 it would apply the whole log
    /// again over the tables. (One past the log's end is caught on open.)
    private func watermark(_ txn: borrowing Transaction) throws -> UInt64 {
        try MetaKey.watermark.withUnsafeBytes { key in
            try txn.withValue(log.metaDatabase, key: key) { raw -> UInt64 in
                guard let watermark = UInt64(bigEndianBytes: raw) else {
                    throw LogStoreError(
                        .corruptEntry, path: path,
                        "the projection watermark (\(raw.count) bytes) is not an offset; rebuild the projections")
                }
                return watermark
            }
        } ?? 0
    }

    /// Applies up to `countMax` entries after the watermark.
    /// - Returns: whether entries remain.
    private func replayChunk(_ txn: borrowing Transaction, countMax: Int = Store.replayChunkCountMax) throws -> Bool {
        var effects = CommitEffects()
        return try replayChunk(txn, &effects, live: false, countMax: countMax)
    }

    private func replayChunk(
        _ txn: borrowing Transaction, _ effects: inout CommitEffects, live: Bool,
        countMax: Int = Store.replayChunkCountMax
    ) throws -> Bool {
        let watermark = try watermark(txn)
        // The last offset there is is projected: no entry can follow it.
        guard watermark < .max else { return false }
        var expected = watermark + 1
        var projected = watermark
        var more = false
        var projector = self.projector
        let cache = ProjectionCache(entryCount: countMax)
        projector.cache = cache
        let path = self.path
        let compactedBelow = try log.compactedBelow(txn)
        // A write's catch-up during a rebuild projects entries delivered long
        // ago: their events are not news.
        let replayedThrough = live ? self.replayedThrough.withLock { $0 } : 0
        var applied = 0
        try txn.forEach(log.logDatabase, from: OffsetKey.encode(expected)) { key, value in
            guard applied < countMax else {
                more = true
                return false
            }
            let entry = try EventLog.decode(
                key: key, value: value, following: &expected, compactedBelow: compactedBelow, path: path)
            try projector.apply(entry, txn, &effects, live: live && entry.offset > replayedThrough)
            projected = entry.offset
            applied += 1
            return true
        }
        try cache.flush(projector, txn)
        try markWatermark(projected, txn)
        return more
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
