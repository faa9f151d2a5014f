import Foundation
import LMDB
import LogFormat

/// An opaque pull cursor: the server's ID, the resync generation it was
/// made in and the offset in the user's own feed it points after, in
/// base64url. Clients never look inside; the server refuses one it did not
/// make.
struct Cursor: Equatable {
    var serverID: UUIDv7
    var generation: UInt64
    var offset: UInt64

    var token: String {
        var bytes = serverID.bytes
        bytes += generation.bigEndianBytes
        bytes += offset.bigEndianBytes
        return Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    init(serverID: UUIDv7, generation: UInt64, offset: UInt64) {
        self.serverID = serverID
        self.generation = generation
        self.offset = offset
    }

    /// Nil unless `token` is one this encoding produced.
    init?(token: String) {
        guard token.utf8.count == 43, token.utf8.allSatisfy({ Cursor.alphabet.contains($0) }) else { return nil }
        let standard = token.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/") + "="
        guard let data = Data(base64Encoded: standard), data.count == 32, let id = UUIDv7(bytes: data.prefix(16)),
            let generation = UInt64(bigEndianBytes: Array(data[16..<24])), let offset = UInt64(bigEndianBytes: Array(data[24..<32]))
        else { return nil }
        self.init(serverID: id, generation: generation, offset: offset)
        // The decoder ignores the last character's two pad bits: a token
        // that differs from this one only there was never issued.
        guard self.token == token else { return nil }
    }

    private static let alphabet = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
}

extension SyncService {
    /// A page of the caller's change feed after `cursor` (nil: from the
    /// start), at most `limit` changes, in feed order.
    /// - Throws: `ServiceError` `.cursorInvalid` for a cursor this server did
    ///   not make; `.validationError` for a limit outside 1...1000.
    func pull(cursor token: String?, limit: Int, as identity: Identity) throws -> PullResponse {
        guard (1...Wire.pullPageCountMax).contains(limit) else {
            throw ServiceError(.validationError, "limit must be 1 to \(Wire.pullPageCountMax), not \(limit)")
        }
        let cursor = try token.map { token -> Cursor in
            guard let cursor = Cursor(token: token), cursor.serverID == storage.serverID else {
                throw ServiceError(.cursorInvalid, "the cursor was not made by this server; pull again without one")
            }
            return cursor
        }
        return try storage.read { txn in
            let generation = try storage.generation(txn)
            if let cursor, cursor.generation < generation {
                return PullResponse(changes: [], cursor: "", hasMore: true, forceResync: true)
            }
            // A cursor of a later generation, or past the end of the user's
            // feed, was never issued by this store (one restored from a backup,
            // say): an empty page that kept it would skip the changes made
            // next. A cursor this server issued points at one of the user's
            // own changes, or at 0.
            let user = try storage.userNumber(identity.user, txn)
            let end = try user.map { try storage.lastOffset(user: $0, txn) } ?? 0
            if let cursor, cursor.generation > generation || cursor.offset > end {
                throw ServiceError(.cursorInvalid, "the cursor points past the end of this server's feed; pull again without one")
            }
            let after = cursor?.offset ?? 0
            guard let user else {
                let same = Cursor(serverID: storage.serverID, generation: generation, offset: after)
                return PullResponse(changes: [], cursor: same.token, hasMore: false)
            }
            return try page(user: user, after: after, limit: limit, generation: generation, txn)
        }
    }

    private func page(user: UInt32, after: UInt64, limit: Int, generation: UInt64, _ txn: borrowing Transaction) throws
        -> PullResponse
    {
        let prefix = user.bigEndianBytes
        var changes: [PullChange] = []
        var last = after
        var hasMore = false
        // Entries' bytes, about what their changes take as JSON: a page of
        // 1,000 entities near the fields limit would be gigabytes, built in
        // memory. It stops near `requestBodyBytesMax`, as section 8 allows,
        // but holds at least one change.
        var bytes = 0
        try txn.forEach(storage.changes, from: ServerStorage.changeKey(user, after + 1)) { key, value in
            guard key.count == 12, key.starts(with: prefix) else { return false }
            guard changes.count < limit, changes.isEmpty || bytes + value.count <= Wire.requestBodyBytesMax else {
                hasMore = true
                return false
            }
            bytes += value.count
            let offset = UInt64(bigEndianBytes: Array(key[4..<12])) ?? 0
            let entry: Entry
            do {
                entry = try EntryCodec.decode(value, expectedOffset: offset)
            } catch {
                throw ServiceError(.internalError, "change \(offset) is damaged: \(error)")
            }
            guard case .remote(let remote) = entry.body else {
                throw ServiceError(.internalError, "change \(offset) is a \(entry.kind) entry")
            }
            changes.append(
                PullChange(
                    entityType: remote.entityType, entityID: remote.entityID,
                    operation: remote.operation == .delete ? .delete : .upsert,
                    data: remote.operation == .delete ? nil : remote.fields, serverVersion: remote.serverVersion,
                    updatedAt: Value.rfc3339(microseconds: Int64(entry.timestamp.milliseconds) * 1000)))
            last = offset
            return true
        }
        let next = Cursor(serverID: storage.serverID, generation: generation, offset: last)
        return PullResponse(changes: changes, cursor: next.token, hasMore: hasMore)
    }

    /// Forces every client to resync: cursors made before this answer
    /// `force_resync`. Returns the new generation.
    func forceResync() async throws -> UInt64 {
        try await storage.write { txn in
            let generation = try self.storage.generation(txn) + 1
            try self.storage.setGeneration(generation, txn)
            return generation
        }
    }
}
