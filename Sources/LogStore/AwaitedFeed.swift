import LMDB
import LogFormat

/// A change the server acknowledged that its feed has not shown yet: the
/// entity, the version the server gave it, and the offset of the `ack`.
public struct AwaitedChange: Sendable, Equatable {
    public var entityType: String
    public var entityID: String
    public var serverVersion: UInt64
    public var ackOffset: UInt64
}

/// The `awaited-feed` database (`Format/storage.md`, section 15): entity
/// key -> the offset of the entity's latest `ack`, its server version and
/// its intent's idempotency key, while no pulled change of the entity at
/// that version or later has come.
///
/// The server puts every change it applies in the feed before it answers
/// the push (`Format/sync-protocol.md`, section 8), so a pull that starts
/// after the answer and reaches the feed's end shows the change, or a later
/// one of the entity. A row left after such a pull is a change the server
/// no longer has: its store was put back from a backup, and the client's
/// cursor is older than the backup, so no 410 says so (section 10). A
/// change at the row's version made by another operation (its idempotency
/// key differs) shows the same: the server gave the version again, so the
/// row is marked lost and no later change clears it.
///
/// It is not derived from the log: only writes made now keep it (a replay
/// leaves it alone), like the outbox's attempt state. One database serves
/// both sets of derived databases.
extension Projector {
    static let awaitedFeedName = "awaited-feed"

    /// One row. `key` is nil in a row written before rows had one (16
    /// bytes), which the feed's versions alone clear.
    struct AwaitedRow {
        var ackOffset: UInt64
        var version: UInt64
        /// The feed showed another operation's change at `version`.
        var lost = false
        var key: [UInt8]?

        func encoded() -> [UInt8] {
            var bytes = ackOffset.bigEndianBytes + version.bigEndianBytes
            if let key { bytes += [lost ? 1 : 0] + key }
            return bytes
        }
    }

    /// The server acknowledged `intent` at `version`, past the entity's base
    /// version. A row with a later version stays (answers come in order;
    /// this is a late repeat), and so does a row marked lost, which waits
    /// for the engine to report it.
    func awaitFeed(_ intent: Intent, version: UInt64, ackOffset: UInt64, _ txn: borrowing Transaction) throws {
        // A read-only store writes nothing, so it never gets here without one.
        guard let awaitedFeed else { return }
        try EntityKey.withKey(type: intent.entityType, id: intent.entityID) { key in
            if let row = try awaitedRow(key, txn), row.lost || row.version >= version { return }
            let row = AwaitedRow(ackOffset: ackOffset, version: version, key: Array(intent.idempotencyKey.utf8))
            try row.encoded().withUnsafeBytes { value in try txn.put(awaitedFeed, key: key, value: value) }
        }
    }

    /// The feed showed the entity at `version`, made by the operation with
    /// `idempotencyKey` (nil: the server did not say, or a snapshot). A row
    /// at an earlier version is done with, and so is one at this version
    /// unless the change is another operation's: then the row is lost.
    func sawInFeed(_ type: String, _ id: String, version: UInt64, idempotencyKey: String?, _ txn: borrowing Transaction)
        throws
    {
        guard let awaitedFeed else { return }
        try EntityKey.withKey(type: type, id: id) { key in
            guard var row = try awaitedRow(key, txn), !row.lost, row.version <= version else { return }
            if row.version == version, let idempotencyKey, let awaited = row.key, !awaited.elementsEqual(idempotencyKey.utf8) {
                row.lost = true
                try row.encoded().withUnsafeBytes { value in try txn.put(awaitedFeed, key: key, value: value) }
            } else {
                try txn.delete(awaitedFeed, key: key)
            }
        }
    }

    private func awaitedRow(_ key: UnsafeRawBufferPointer, _ txn: borrowing Transaction) throws -> AwaitedRow? {
        guard let awaitedFeed else { return nil }
        return try txn.withValue(awaitedFeed, key: key) { try decodeAwaited($0, key: key) }
    }

    /// Deletes the entity's row when it is still the one of the ack at `ackOffset`.
    func forgetAwaited(_ change: AwaitedChange, _ txn: borrowing Transaction) throws {
        guard let awaitedFeed else { return }
        try EntityKey.withKey(type: change.entityType, id: change.entityID) { key in
            guard try awaitedRow(key, txn)?.ackOffset == change.ackOffset else { return }
            try txn.delete(awaitedFeed, key: key)
        }
    }

    /// Deletes the rows that do not decode, for a resync (which keeps the
    /// others for the pull from the start): a damaged row stops every
    /// answer and pulled change of its entity, and a resync is what an app
    /// can do about it.
    func dropDamagedAwaited(_ txn: borrowing Transaction) throws {
        guard let awaitedFeed else { return }
        var damaged: [[UInt8]] = []
        // Read first: a delete while a cursor walks the database would move it.
        try txn.forEach(awaitedFeed) { key, value in
            if (try? decodeAwaited(value, key: key)) == nil { damaged.append([UInt8](key)) }
            return true
        }
        for key in damaged { try txn.delete(awaitedFeed, key: key) }
    }

    /// The rows that do not decode, for `Store.verify`: replay does not
    /// make this table, so it cannot compare it, but a damaged row stops
    /// every answer and pulled change of its entity.
    func damagedAwaitedRows(_ txn: borrowing Transaction) throws -> [StoreProblem] {
        guard let awaitedFeed else { return [] }
        var problems: [StoreProblem] = []
        try txn.forEach(awaitedFeed) { key, value in
            do {
                _ = try decodeAwaited(value, key: key)
            } catch {
                let detail = (error as? LogStoreError)?.detail ?? "\(error)"
                problems.append(StoreProblem(table: Projector.awaitedFeedName, message: detail))
            }
            return problems.count < EventLog.problemCountMax
        }
        return problems
    }

    /// Every row, in entity key order.
    func awaitedChanges(_ txn: borrowing Transaction) throws -> [AwaitedChange] {
        guard let awaitedFeed else { return [] }
        var changes: [AwaitedChange] = []
        try txn.forEach(awaitedFeed) { key, value in
            let row = try decodeAwaited(value, key: key)
            let (type, id) = EntityKey.split([UInt8](key))
            changes.append(AwaitedChange(entityType: type, entityID: id, serverVersion: row.version, ackOffset: row.ackOffset))
            return true
        }
        return changes
    }

    /// A row: the ack's offset and the version (8 bytes each, big-endian),
    /// then a byte 0 (awaited) or 1 (lost) and the idempotency key (1 to
    /// `Limits.idempotencyKeyBytesMax` bytes); a row written before rows
    /// held keys ends after the version.
    private func decodeAwaited(_ value: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer) throws -> AwaitedRow {
        guard value.count == 16 || (18...17 + Limits.idempotencyKeyBytesMax).contains(value.count),
            value.count == 16 || value[16] <= 1,
            let offset = UInt64(bigEndianBytes: UnsafeRawBufferPointer(rebasing: value[0..<8])),
            let version = UInt64(bigEndianBytes: UnsafeRawBufferPointer(rebasing: value[8..<16]))
        else {
            let (type, id) = EntityKey.split([UInt8](key))
            throw LogStoreError(
                .corruptEntry, path: path,
                "the \(Projector.awaitedFeedName) row of \(type)/\(id) is damaged: \(value.count) bytes, "
                    + "not 16 nor a state byte of 0 or 1 and a key of 1 to \(Limits.idempotencyKeyBytesMax) bytes after 16")
        }
        guard value.count > 16 else { return AwaitedRow(ackOffset: offset, version: version) }
        return AwaitedRow(ackOffset: offset, version: version, lost: value[16] == 1, key: Array(value[17...]))
    }
}

extension Store {
    /// The changes the server acknowledged that its feed has not shown since,
    /// of acks at or below `offset`, in entity key order. After a pull that
    /// began once the log ended at `offset` and reached the feed's end, any
    /// is a change the server lost (see `SyncEngine`'s pull).
    public func acknowledgedChangesNotInFeed(through offset: UInt64) throws -> [AwaitedChange] {
        try log.environment.read { txn in try projector(txn).awaitedChanges(txn).filter { $0.ackOffset <= offset } }
    }

    /// Stops waiting for `changes` (from `acknowledgedChangesNotInFeed`),
    /// found lost and reported: a pull from the feed's start ended without
    /// them, so the confirmed state is the server's already. A row a later
    /// ack of its entity replaced stays.
    public func forgetAcknowledgedChanges(_ changes: [AwaitedChange]) async throws {
        guard !changes.isEmpty else { return }
        try await write { txn, _, store in
            let projector = try store.projector(txn)
            for change in changes { try projector.forgetAwaited(change, txn) }
        }
    }
}
