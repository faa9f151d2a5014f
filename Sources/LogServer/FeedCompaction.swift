import LMDB
import LogFormat

/// What `POST /v1/admin/compact` did (section 12).
struct FeedCompactionReport: Codable, Equatable, Sendable {
    /// Changes dropped from the feeds, superseded by later ones.
    var removed = 0
    /// Changes kept below the new horizons: each the latest of its entity
    /// (or one whose row does not read back, which compaction leaves).
    var kept = 0
    /// Users whose feed has a change.
    var users = 0
}

extension ServerStorage {
    /// The `meta` key of the user's compaction horizon.
    static func horizonKey(_ user: UInt32) -> [UInt8] { Array("horizon/".utf8) + user.bigEndianBytes }

    /// The `meta` key of the count of the user's compactions.
    static func compactionsKey(_ user: UInt32) -> [UInt8] { Array("compactions/".utf8) + user.bigEndianBytes }

    /// How many compaction transactions dropped changes of the user's feed
    /// (each cursor carries the count it was made at); 0 before any.
    func compactions(user: UInt32, _ txn: borrowing Transaction) throws -> UInt32 {
        try ServerStorage.number(try txn.get(meta, key: ServerStorage.compactionsKey(user)), "the compaction count of user \(user)") ?? 0
    }

    /// The offset in the user's feed of the last change compaction dropped
    /// (section 8, "Compaction"): a cursor below it, made before that
    /// compaction, would miss it; 0 before any.
    func horizon(user: UInt32, _ txn: borrowing Transaction) throws -> UInt64 {
        try ServerStorage.number(try txn.get(meta, key: ServerStorage.horizonKey(user)), "the compaction horizon of user \(user)") ?? 0
    }
}

extension SyncService {
    /// Compacts every user's feed up to its last change: drops each change
    /// that a later change of the same entity superseded, and moves the
    /// user's horizon to the last change it dropped, so that the cursors
    /// that would miss a dropped change (those pointing below it) are
    /// answered 410 (section 8), and no other. Every entity's latest change
    /// stays, deletions included: a pull from the beginning still delivers
    /// every entity's current state.
    ///
    /// It reads each feed from its start (changes an earlier compaction
    /// kept may have been superseded since) in transactions of up to
    /// `chunkCountMax` changes, each moving the horizon as it drops, so
    /// that pushes go on between them and a stop part way leaves every
    /// cursor at or above the horizon a whole feed after it.
    func compactFeeds(chunkCountMax: Int = SyncService.compactionChunkCountMax) async throws -> FeedCompactionReport {
        let users = try storage.read { txn in
            var numbers: [UInt32] = []
            try txn.forEach(storage.users) { _, value in
                if let number = UInt32(bigEndianBytes: value) { numbers.append(number) }
                return true
            }
            return numbers
        }
        var report = FeedCompactionReport()
        for user in users {
            let target = try storage.read { txn in try storage.lastOffset(user: user, txn) }
            guard target > 0 else { continue }
            report.users += 1
            var position: UInt64 = 0
            while position < target {
                let chunk = try await storage.write { [position] txn in
                    try self.compactChunk(user: user, after: position, through: target, countMax: chunkCountMax, txn)
                }
                report.removed += chunk.removed
                report.kept += chunk.kept
                position = chunk.last
            }
        }
        return report
    }

    /// Changes one compaction transaction reads at most.
    static let compactionChunkCountMax = 10_000

    /// Drops the superseded ones of the user's changes after `position`,
    /// up to `countMax` of them and none past `target`, and moves the
    /// horizon past them.
    /// - Returns: how many it dropped and kept, and the offset it read to
    ///   (`target` once no change is left before it).
    private func compactChunk(
        user: UInt32, after position: UInt64, through target: UInt64, countMax: Int, _ txn: borrowing Transaction
    ) throws -> (removed: Int, kept: Int, last: UInt64) {
        var superseded: [(offset: UInt64, type: String, scope: String)] = []
        var last = position
        var read = 0
        try txn.forEach(storage.changes, from: ServerStorage.changeKey(user, position + 1)) { key, row in
            guard key.count == 12, key.starts(with: user.bigEndianBytes),
                let offset = UInt64(bigEndianBytes: Array(key[4..<12])), offset <= target, read < countMax
            else { return false }
            read += 1
            last = offset
            // A row that does not read back stays, as does a change whose
            // entity's state does not: compaction drops only what it knows
            // a later change replaced.
            guard let change = try? ChangeRow.decode(row, offset: offset).change,
                let state = try? loadState(ServerStorage.entityKey(user, change.entityType, change.entityID), txn),
                state.version > change.serverVersion
            else { return true }
            superseded.append((offset, change.entityType, storage.scopeIndexed(change.fields)))
            return true
        }
        // Read to `target` unless the chunk filled first.
        if read < countMax { last = target }
        // A cursor made before this transaction, below a change it drops,
        // would miss it: the horizon moves past it and the count goes up,
        // in the same transaction. (Cursors made after it, on the feed
        // without the change, carry the new count.)
        if let dropped = superseded.last?.offset {
            if try storage.horizon(user: user, txn) < dropped {
                try txn.put(storage.meta, key: ServerStorage.horizonKey(user), value: dropped.bigEndianBytes)
            }
            let count = try storage.compactions(user: user, txn)
            guard count < .max else { throw ServiceError(.internalError, "user \(user)'s feed has no compaction count left") }
            try txn.put(storage.meta, key: ServerStorage.compactionsKey(user), value: (count + 1).bigEndianBytes)
        }
        // Deleted once the walk is over: a delete would move its cursor.
        for (offset, type, scope) in superseded {
            try txn.delete(storage.changes, key: ServerStorage.changeKey(user, offset))
            try txn.delete(storage.typeChanges, key: ServerStorage.indexKey(user, type, offset))
            if storage.scopeField != nil {
                try txn.delete(storage.scopeChanges, key: ServerStorage.indexKey(user, scope, offset))
            }
        }
        return (superseded.count, read - superseded.count, last)
    }
}
