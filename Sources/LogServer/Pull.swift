import Foundation
import LMDB
import LogFormat

/// An opaque pull cursor: the server's ID, the resync generation it was
/// made in, the offset in the user's own feed it points after, a mark of
/// the change at that offset, for a pull of some types or scopes only a
/// mark of those, and the compactions of the user's feed before it was made, in
/// base64url. Clients never look inside; the server refuses one it did not
/// make.
struct Cursor: Equatable {
    var serverID: UUIDv7
    var generation: UInt64
    var offset: UInt64
    /// The CRC32C of the stored change at `offset` (0 at offset 0), so that
    /// a store that lost changes (restored from a backup) and then grew
    /// past the offset again tells the cursor apart from its own: the
    /// change there is another one. Nil in a cursor issued before marks,
    /// which is taken unchecked.
    var mark: UInt32?
    /// `Cursor.filterMark` of the types and scopes the pull that made it
    /// named; nil for a pull of every change. A cursor goes only with the
    /// filter it was made for: the changes of other types or scopes before
    /// it were skipped.
    var filter: UInt32?
    /// How many compactions of the user's feed had dropped changes when it
    /// was made (`ServerStorage.compactions`): a compaction since dropped
    /// changes its chain would show, or not, as the horizon says; one
    /// before it made the feed it was made on. Nil in a cursor issued
    /// before it was kept, which is taken as made before any compaction.
    var compactions: UInt32?

    var token: String {
        var bytes = serverID.bytes
        bytes += generation.bigEndianBytes
        bytes += offset.bigEndianBytes
        if let mark { bytes += mark.bigEndianBytes }
        if let filter { bytes += filter.bigEndianBytes }
        if let compactions {
            bytes += compactions.bigEndianBytes
            bytes.append(filter == nil ? Cursor.compactedLayout : Cursor.compactedTypedLayout)
        }
        return Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    init(serverID: UUIDv7, generation: UInt64, offset: UInt64, mark: UInt32?, filter: UInt32? = nil, compactions: UInt32? = nil) {
        precondition(filter == nil || mark != nil, "a cursor with a filter mark has a change mark")
        precondition(compactions == nil || mark != nil, "a cursor with a compaction count has a change mark")
        self.serverID = serverID
        self.generation = generation
        self.offset = offset
        self.mark = mark
        self.filter = filter
        self.compactions = compactions
    }

    /// Nil unless `token` is one this encoding produced, by its length:
    /// 60 characters (45 bytes: both marks, the compaction count and the
    /// layout byte 2), 55 (41 bytes: the change mark, the count and the
    /// layout byte 1), or one issued before the count was kept: 54 (40
    /// bytes, with both marks), 48 (36 bytes, with a change mark) or 43 (32
    /// bytes, issued before marks).
    init?(token: String) {
        guard let byteCount = Cursor.byteCounts[token.utf8.count], token.utf8.allSatisfy({ Cursor.alphabet.contains($0) })
        else { return nil }
        let count = token.utf8.count
        let padding = String(repeating: "=", count: (4 - count % 4) % 4)
        let standard = token.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/") + padding
        guard let data = Data(base64Encoded: standard).map(Array.init), data.count == byteCount,
            let id = UUIDv7(bytes: data.prefix(16)), let generation = UInt64(bigEndianBytes: Array(data[16..<24])),
            let offset = UInt64(bigEndianBytes: Array(data[24..<32]))
        else { return nil }
        let typed = byteCount == 40 || byteCount == 45
        let counted = byteCount == 41 || byteCount == 45
        if counted, data[byteCount - 1] != (typed ? Cursor.compactedTypedLayout : Cursor.compactedLayout) { return nil }
        self.init(
            serverID: id, generation: generation, offset: offset,
            mark: byteCount >= 36 ? UInt32(bigEndianBytes: Array(data[32..<36])) : nil,
            filter: typed ? UInt32(bigEndianBytes: Array(data[36..<40])) : nil,
            compactions: counted ? UInt32(bigEndianBytes: Array(data[(byteCount - 5)..<(byteCount - 1)])) : nil)
        // The decoder ignores the last character's pad bits: a token that
        // differs from this one only there was never issued.
        guard self.token == token else { return nil }
    }

    /// The layout byte at the end of a token with a compaction count,
    /// without a filter mark and with one.
    static let compactedLayout: UInt8 = 1
    static let compactedTypedLayout: UInt8 = 2

    /// The bytes of a token, by its length (base64url without padding).
    private static let byteCounts = [43: 32, 48: 36, 54: 40, 55: 41, 60: 45]

    /// The mark of a pull's `types` and `scopes`, nil when it names
    /// neither. Of `types` alone: the CRC32C of the names, sorted, each
    /// followed by a comma (no name holds one). With `scopes`: the CRC32C
    /// of "scopes:", the scopes so listed, "types:", and the types so
    /// listed, or "*" for every type.
    static func filterMark(types: Set<String>?, scopes: Set<String>?) -> UInt32? {
        func listed(_ names: Set<String>) -> String { names.sorted().map { $0 + "," }.joined() }
        guard let scopes else { return types.map { CRC32C.checksum(Array(listed($0).utf8)) } }
        return CRC32C.checksum(Array(("scopes:" + listed(scopes) + "types:" + (types.map(listed) ?? "*")).utf8))
    }

    private static let alphabet = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
}

extension SyncService {
    /// A page of the caller's change feed after `cursor` (nil: from the
    /// start), at most `limit` changes, in feed order; with `types`, only
    /// changes of those types, and with `scopes`, only changes of entities
    /// in those scopes or in none (section 8).
    /// - Throws: `ServiceError` `.cursorInvalid` for a cursor this server did
    ///   not make, or made for other types or scopes; `.validationError` for
    ///   a limit outside 1...1000, or scopes on a server without a scope field.
    func pull(
        cursor token: String?, limit: Int, types: Set<String>? = nil, scopes: Set<String>? = nil, as identity: Identity
    ) throws -> PullResponse {
        guard (1...Wire.pullPageCountMax).contains(limit) else {
            throw ServiceError(.validationError, "limit must be 1 to \(Wire.pullPageCountMax), not \(limit)")
        }
        guard scopes == nil || storage.scopeField != nil else { throw ServiceError.noScopeField }
        let filter = Cursor.filterMark(types: types, scopes: scopes)
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
            // Below the horizon, a compaction since the cursor was made
            // dropped changes its chain would show (section 8); a pull from
            // the start, or a cursor made on the compacted feed, has none.
            let compactions = try user.map { try storage.compactions(user: $0, txn) } ?? 0
            if let cursor, let user, cursor.offset > 0, cursor.compactions ?? 0 < compactions,
                cursor.offset < (try storage.horizon(user: user, txn))
            {
                throw ServiceError(.cursorInvalid, "the cursor points below the feed's compaction horizon; pull again without one")
            }
            // A store that lost changes and grew past the cursor again has
            // another change at its offset: a page after it would skip the
            // changes the store made in their place.
            if let cursor, let mark = cursor.mark, try self.mark(user: user, offset: cursor.offset, txn) != mark {
                throw ServiceError(.cursorInvalid, "the cursor names a change this server's feed does not hold; pull again without one")
            }
            // The changes of other types or scopes before the cursor were
            // skipped: it cannot serve a pull it was not made for.
            if let cursor, cursor.filter != filter {
                throw ServiceError(
                    .cursorInvalid, "the cursor was made for a pull of other types or scopes; pull again without one")
            }
            guard let user else {
                return PullResponse(changes: [], cursor: token ?? startCursor(generation, filter: filter, compactions: 0), hasMore: false)
            }
            var page = PageBuilder(limit: limit, types: types, scopes: scopes.map { ($0, storage.scopeField) })
            return try self.page(
                &page, user: user, after: cursor?.offset ?? 0, token: token, filter: filter, generation: generation,
                compactions: compactions, txn)
        }
    }

    /// The mark of the user's change at `offset` (`Cursor.mark`): 0 at 0,
    /// nil when the feed holds no change there.
    private func mark(user: UInt32?, offset: UInt64, _ txn: borrowing Transaction) throws -> UInt32? {
        guard offset > 0 else { return 0 }
        guard let user else { return nil }
        return try ServerStorage.changeKey(user, offset).withUnsafeBytes { key in
            try txn.withValue(storage.changes, key: key) { CRC32C.checksum($0) }
        }
    }

    /// Fills `page` after `after`, where the request's cursor `token` (nil:
    /// none) points; an empty page answers with that same token. With a
    /// filter (`Cursor.filterMark`), its cursor points at its last change.
    private func page(
        _ page: inout PageBuilder, user: UInt32, after: UInt64, token: String?, filter: UInt32?, generation: UInt64,
        compactions: UInt32, _ txn: borrowing Transaction
    ) throws -> PullResponse {
        // Only damage puts a change at the last offset there is: none follows it.
        if after < .max { try fill(&page, user: user, after: after, txn) }
        // Section 8: a page without changes keeps the request's cursor.
        guard let last = page.last else {
            return PullResponse(
                changes: [], cursor: token ?? startCursor(generation, filter: filter, compactions: compactions), hasMore: page.hasMore)
        }
        let next = Cursor(
            serverID: storage.serverID, generation: generation, offset: last.offset, mark: last.mark, filter: filter,
            compactions: compactions)
        return PullResponse(changes: page.changes, cursor: next.token, hasMore: page.hasMore)
    }

    /// Takes the user's changes after `after` into `page` until it is full
    /// or they run out. With scopes or types, an index of the feed names
    /// the changes to read, so that a pull of a rare type, or of one
    /// project among many, does not read every other change on its way: by
    /// scope when the pull names scopes (and then it reads the scopes'
    /// changes of other types too, and skips them), by type otherwise.
    private func fill(_ page: inout PageBuilder, user: UInt32, after: UInt64, _ txn: borrowing Transaction) throws {
        if let scopes = page.scopes {
            return try fill(&page, from: storage.scopeChanges, "scope", names: scopes.names, user: user, after: after, txn)
        }
        if let types = page.types {
            return try fill(&page, from: storage.typeChanges, "type", names: types, user: user, after: after, txn)
        }
        let prefix = user.bigEndianBytes
        try txn.forEach(storage.changes, from: ServerStorage.changeKey(user, after + 1)) { key, row in
            guard key.count == 12, key.starts(with: prefix) else { return false }
            return try page.take(row, offset: UInt64(bigEndianBytes: Array(key[4..<12])) ?? 0)
        }
    }

    /// Takes the changes `index` lists under `names` (and the empty name)
    /// into `page`, a round of the first `limit + 1` offsets at a time: a
    /// page that skips changes may need more than one.
    private func fill(
        _ page: inout PageBuilder, from index: Database, _ what: String, names: Set<String>, user: UInt32, after: UInt64,
        _ txn: borrowing Transaction
    ) throws {
        let countMax = page.limit + 1
        var after = after
        while true {
            let offsets = try storage.changeOffsets(in: index, user: user, names: names, after: after, countMax: countMax, txn)
            // Past the first `countMax`, a name's offsets may have been cut short.
            for offset in offsets.prefix(countMax) {
                let taken = try ServerStorage.changeKey(user, offset).withUnsafeBytes { key in
                    try txn.withValue(storage.changes, key: key) { row in try page.take(row, offset: offset) }
                }
                guard let taken else {
                    throw ServiceError(.internalError, "the feed's index by \(what) lists change \(offset), which the feed does not hold")
                }
                guard taken else { return }
            }
            // Fewer than `countMax` are all there are.
            guard offsets.count >= countMax else { return }
            after = offsets[countMax - 1]
        }
    }

    /// A cursor for the start of the feed, for a pull with `filter`
    /// (`Cursor.filterMark`; nil: every change).
    private func startCursor(_ generation: UInt64, filter: UInt32?, compactions: UInt32) -> String {
        Cursor(serverID: storage.serverID, generation: generation, offset: 0, mark: 0, filter: filter, compactions: compactions).token
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

/// The changes of one pulled page, taken from the feed's rows in feed order.
private struct PageBuilder {
    let limit: Int
    let types: Set<String>?
    /// The scopes a pull named, and the server's scope field.
    let scopes: (names: Set<String>, field: String?)?
    private(set) var changes: [PullChange] = []
    /// The offset and mark (`Cursor.mark`) of the last change taken.
    private(set) var last: (offset: UInt64, mark: UInt32)?
    private(set) var hasMore = false
    /// Entries' bytes, about what their changes take as JSON: a page of
    /// 1,000 entities near the fields limit would be gigabytes, built in
    /// memory. It stops near `requestBodyBytesMax`, as section 8 allows,
    /// but holds at least one change.
    private var bytes = 0

    init(limit: Int, types: Set<String>?, scopes: (names: Set<String>, field: String?)?) {
        self.limit = limit
        self.types = types
        self.scopes = scopes
    }

    /// Takes the change in `row`, at `offset`, unless the page is full or
    /// the change is of a type the pull of scopes did not ask for.
    /// - Returns: false, taking nothing, when the page is full: more
    ///   changes follow it.
    /// - Throws: `ServiceError.internalError` for a row that does not
    ///   read back, or whose type or scope the pull did not ask for while
    ///   an index listed it for them: damage.
    mutating func take(_ row: UnsafeRawBufferPointer, offset: UInt64) throws -> Bool {
        let full = changes.count >= limit || (!changes.isEmpty && bytes + row.count > Wire.requestBodyBytesMax)
        // A pull of scopes and types skips changes; only one it would take
        // shows that more follow.
        let skips = scopes != nil && types != nil
        if full, !skips {
            hasMore = true
            return false
        }
        let (remote, timestamp, idempotencyKey) = try ChangeRow.decode(row, offset: offset)
        if let scopes {
            let scope = ServerStorage.scopeIndexed(remote.fields, field: scopes.field)
            guard scope.isEmpty || scopes.names.contains(scope) else {
                throw ServiceError(.internalError, "the feed's index by scope lists change \(offset) under another scope than its own, \(scope)")
            }
        }
        if let types, !types.contains(remote.entityType) {
            if skips { return true }
            throw ServiceError(
                .internalError, "the feed's index by type lists change \(offset) under another type than its own, \(remote.entityType)")
        }
        if full {
            hasMore = true
            return false
        }
        bytes += row.count
        changes.append(
            PullChange(
                entityType: remote.entityType, entityID: remote.entityID,
                operation: remote.operation == .delete ? .delete : .upsert,
                data: remote.operation == .delete ? nil : remote.fields, serverVersion: remote.serverVersion,
                updatedAt: Value.rfc3339(microseconds: Int64(timestamp.milliseconds) * 1000),
                idempotencyKey: idempotencyKey))
        last = (offset, CRC32C.checksum(row))
        return true
    }
}
