import Foundation
import LMDB
import LogFormat
import Synchronization

/// The reference server's storage: one LMDB environment holding, for every
/// user, the entities' current state, the change feed (with the idempotency
/// key of the operation that made each change) and its index by type, and
/// the idempotency keys of applied operations. Keys start with the user's
/// 4-byte number, so each user is a key range of its own.
///
/// Writes run one at a time on a serial queue of their own, so a durable
/// commit never blocks Swift's cooperative threads; reads run on the
/// caller's thread in short read transactions.
final class ServerStorage: Sendable {
    let environment: Environment
    let meta: Database
    let users: Database
    let entities: Database
    /// Change key (`changeKey`) -> the change as a `remote` log entry, then
    /// the idempotency key of the operation that made it (`ChangeRow`).
    let changes: Database
    /// The feed by entity type: a row (`typeChangeKey`, with an empty
    /// value) for each change, so that a pull of some types reads their
    /// changes alone, not every change in between (section 8, `types`).
    /// A change whose row does not decode is listed under the empty type,
    /// which no entity has: every such pull reads it, and names the damage
    /// as a pull of every type does.
    let typeChanges: Database
    /// The feed by scope, when the server has a scope field (section 7,
    /// "Scopes"): a row (`indexKey`, with an empty value) for each change,
    /// under its entity's scope, or the empty name for an entity without
    /// one (and a change whose row does not decode), which every pull of
    /// scopes reads. Empty when the server has none.
    let scopeChanges: Database
    let idempotency: Database
    /// The field whose string value is an entity's scope (nil: entities
    /// have none, and pulls name no scopes).
    let scopeField: String?
    /// The server's identity, made with the store; cursors carry it.
    let serverID: UUIDv7
    /// Held from open to close: one server per data directory.
    private let lock: ProcessLock
    private let writer = DispatchQueue(label: "syncserver writer")

    enum MetaKey {
        static let serverID = Array("server-id".utf8)
        static let generation = Array("generation".utf8)
        static let nextUser = Array("next-user".utf8)
        /// The scope field `scope-changes` was made for.
        static let scopeField = Array("scope-field".utf8)
    }

    /// Opens the store at `path`, creating it in a missing or empty
    /// directory (or one holding only `lost+found`: a mount point).
    /// - Throws: `SyncServer.ConfigurationError` when `path` holds files but
    ///   no store, holds an LMDB environment that is not a server's store, or
    ///   another process serves it, or, with `checkPages`, a page of its
    ///   `data.mdb` is damaged; `LMDBError` when the directory cannot be used.
    init(path: String, durability: Environment.Durability, checkPages: Bool = false, scopeField: String? = nil) throws {
        self.scopeField = scopeField
        try ServerStorage.checkHoldsNoOtherFiles(path)
        var options = Environment.Options()
        options.durability = durability
        environment = try Environment(path: path, options: options)
        // A refused open leaves nothing behind: the environment closed and
        // the lock released, and no lock file in a directory that is not a
        // server's store.
        do {
            // Before LMDB reads a table through its map: a request that
            // reached a damaged page could crash the server, and every
            // restart after it.
            if checkPages, let problems = try environment.pageProblemsInBrief() {
                throw SyncServer.ConfigurationError(
                    "\(path): damaged pages in data.mdb: \(problems) (logtool verify lists them; restore the store from a backup)")
            }
            try environment.read { txn in try ServerStorage.checkIsServerStore(txn, path: path) }
            lock = try DataDirectoryLock.take(directory: environment.path, named: path)
        } catch {
            environment.close()
            throw error
        }
        do {
            meta = try ServerStorage.open("meta", environment)
            users = try ServerStorage.open("users", environment)
            entities = try ServerStorage.open("entities", environment)
            changes = try ServerStorage.open("changes", environment)
            typeChanges = try ServerStorage.open("type-changes", environment)
            scopeChanges = try ServerStorage.open("scope-changes", environment)
            idempotency = try ServerStorage.open("idempotency", environment)
            let meta = self.meta
            serverID = try environment.write { txn in
                if let bytes = try txn.get(meta, key: MetaKey.serverID) { return try ServerStorage.serverID(bytes, path: path) }
                let id = UUIDv7.Generator.shared.next()
                try txn.put(meta, key: MetaKey.serverID, value: id.bytes)
                return id
            }
            try environment.write { txn in
                try indexFeedByType(txn)
                try indexFeedByScope(txn)
            }
        } catch {
            environment.close()
            lock.release()
            throw error
        }
    }

    /// The server ID stored as `bytes`.
    /// - Throws: `SyncServer.ConfigurationError` naming the key and the
    ///   directory when they are not a UUIDv7, as the server writes it: damage.
    ///   A new ID in its place would make every client resync for no reason,
    ///   and the damage would go unnamed.
    private static func serverID(_ bytes: [UInt8], path: String) throws -> UUIDv7 {
        guard let id = UUIDv7(bytes: bytes), id.version == 7, id.low >> 62 == 0b10 else {
            let shown = bytes.prefix(16).map { String(format: "%02x", $0) }.joined() + (bytes.count > 16 ? "…" : "")
            throw SyncServer.ConfigurationError(
                "dataDirectory \(path) is damaged: its meta key server-id holds \(bytes.count) bytes (\(shown)), "
                    + "not a UUIDv7; restore the directory from a backup")
        }
        return id
    }

    /// The names a directory may hold without a data file: LMDB's lock
    /// file, which it makes first (a first start killed in between leaves
    /// it alone), the server's, which stays when an operator removes the
    /// data file to start afresh, and `lost+found`, which `mkfs` makes at
    /// the root of a new file system: a mount point holding only it is as
    /// empty as a file system can be.
    private static let namesWithoutStore: Set<String> = ["lock.mdb", DataDirectoryLock.fileName, "lost+found"]
    /// The names a refusal lists; it counts the others.
    private static let listedFileCountMax = 3

    /// Refuses a directory that holds files but no data file (`data.mdb`):
    /// notes, another program's files, a `--data` mistyped. A store made
    /// there would mix the server's files with them. A missing or empty
    /// directory (a mount point's `lost+found` aside) is where a store is
    /// made; a file is named as one (LMDB said "open (FILE): Not a
    /// directory [20]"); any other path that cannot be listed (no
    /// permission) is the environment's to refuse.
    private static func checkHoldsNoOtherFiles(_ path: String) throws {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), !isDirectory.boolValue {
            throw SyncServer.ConfigurationError(
                "dataDirectory \(path) is a file, not a directory; give a missing or empty directory, or a server's store")
        }
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: path), !names.contains("data.mdb") else {
            return
        }
        let others = names.filter { !namesWithoutStore.contains($0) }.sorted()
        guard !others.isEmpty else { return }
        var listed = others.prefix(listedFileCountMax).joined(separator: ", ")
        if others.count > listedFileCountMax { listed += " and \(others.count - listedFileCountMax) more" }
        throw SyncServer.ConfigurationError(
            "dataDirectory \(path) holds no server store (no data.mdb) but other files (\(listed)); "
                + "give a missing or empty directory, or a server's store")
    }

    /// Refuses an environment some other program made (a client's sync
    /// store, a `--data` mistyped): the server would add its databases to
    /// it, and its pushes would write into tables of the same names
    /// (`entities`, `idempotency`) that mean something else there. An
    /// environment that holds anything is the server's when its `meta`
    /// holds the server's identity, or is empty: a first start that
    /// stopped before it wrote the identity, which `meta`, made first,
    /// comes before.
    private static func checkIsServerStore(_ txn: borrowing Transaction, path: String) throws {
        guard let main = try txn.openDatabase(nil, create: false), try txn.count(main) > 0 else { return }
        // A "meta" that is a plain key, not a database, is not the server's either.
        let meta = try? txn.openDatabase("meta", create: false)
        if let meta, try txn.count(meta) == 0 || txn.get(meta, key: MetaKey.serverID) != nil { return }
        let what = meta == nil ? "no meta database" : "a meta database without a server id"
        throw SyncServer.ConfigurationError(
            "dataDirectory \(path) holds an LMDB environment that is not a sync server's store (\(what); a client's sync store?)")
    }

    /// Lists every change in `type-changes` when it does not: in a store
    /// made before it, or one a server that did not keep it wrote to
    /// since. Each change has one row there, so equal counts mean it is
    /// whole (a key in `changes` of another length than 12, which only
    /// damage makes, has none, and makes every open index again).
    private func indexFeedByType(_ txn: borrowing Transaction) throws {
        guard try txn.count(typeChanges) != txn.count(changes) else { return }
        try txn.removeAll(typeChanges)
        try indexEveryChange(in: typeChanges, txn) { $0?.entityType ?? "" }
    }

    /// Puts a row in `index` for every change of the feed, under the name
    /// `name` gives its change (nil: a row that does not decode).
    private func indexEveryChange(in index: Database, _ txn: borrowing Transaction, name: (Remote?) -> String) throws {
        // Writes to one database do not move a cursor on another.
        try txn.forEach(changes) { key, row in
            guard key.count == 12, let user = UInt32(bigEndianBytes: Array(key[0..<4])),
                let offset = UInt64(bigEndianBytes: Array(key[4..<12]))
            else { return true }
            let change = (try? ChangeRow.decode(row, offset: offset))?.change
            try txn.put(index, key: ServerStorage.indexKey(user, name(change), offset), value: [])
            return true
        }
    }

    /// Lists every change in `scope-changes` under its scope when it was
    /// made for another scope field, or does not hold one row per change
    /// (as `indexFeedByType`); empties it when the server has no scope
    /// field, so that one given later indexes the feed afresh.
    private func indexFeedByScope(_ txn: borrowing Transaction) throws {
        let stored = try txn.get(meta, key: MetaKey.scopeField)
        guard let scopeField else {
            // Only what there is: an open that changes nothing commits nothing.
            if try txn.count(scopeChanges) > 0 { try txn.removeAll(scopeChanges) }
            if stored != nil { try txn.delete(meta, key: MetaKey.scopeField) }
            return
        }
        guard try stored != Array(scopeField.utf8) || txn.count(scopeChanges) != txn.count(changes) else { return }
        try txn.removeAll(scopeChanges)
        try txn.put(meta, key: MetaKey.scopeField, value: Array(scopeField.utf8))
        try indexEveryChange(in: scopeChanges, txn) { $0.map { scopeIndexed($0.fields) } ?? "" }
    }

    // MARK: Scopes

    /// The scope a value of the scope field gives: "" for none (absent or
    /// null), nil for a value that is no scope (not a string, or a string
    /// `Wire.scopeProblem` refuses).
    static func scope(_ value: Value?) -> String? {
        switch value {
        case nil, .null?: ""
        case .string(let scope)? where Wire.scopeProblem(scope) == nil: scope
        default: nil
        }
    }

    /// The scope under which `scope-changes` lists a change, or an entity
    /// state, with `fields`: the scope field's, or "" for none, and for a
    /// value that is no scope, which only an entity stored before the
    /// server had this scope field holds: every pull of scopes reads it.
    func scopeIndexed(_ fields: Fields) -> String { ServerStorage.scopeIndexed(fields, field: scopeField) }

    static func scopeIndexed(_ fields: Fields, field: String?) -> String { field.flatMap { scope(fields[$0]) } ?? "" }

    private static func open(_ name: String, _ environment: Environment) throws -> Database {
        guard let database = try environment.openDatabase(name, create: true) else {
            preconditionFailure("mdb_dbi_open with MDB_CREATE returned no database")
        }
        return database
    }

    /// Waits for queued writes, closes the environment, then releases the
    /// lock: the reverse of opening.
    func close() {
        writer.sync {}
        environment.close()
        lock.release()
    }

    /// Runs `body` in a write transaction on the writer queue; returns after
    /// the commit (with `.full` durability, after the fsync).
    func write<T: Sendable>(_ body: @escaping @Sendable (borrowing Transaction) throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            writer.async {
                continuation.resume(with: Result { try self.environment.write(body) })
            }
        }
    }

    func read<T>(_ body: (borrowing Transaction) throws -> T) throws -> T {
        try environment.read(body)
    }

    // MARK: Keys and counters

    /// The number stored in `value`, nil when there is none.
    /// - Throws: `ServiceError.internalError` naming the row (`what`) for a
    ///   value of another length: damage. Read as absent, it would hand out
    ///   again a number already given (a user's, with her data) or apply an
    ///   operation again.
    static func number<T: FixedWidthInteger>(_ value: [UInt8]?, _ what: @autoclosure () -> String) throws -> T? {
        guard let value else { return nil }
        guard let number = T(bigEndianBytes: value) else {
            throw ServiceError(
                .internalError, "the server's storage is damaged: \(what()) is \(value.count) bytes, not \(MemoryLayout<T>.size)")
        }
        return number
    }

    func userNumber(_ user: String, _ txn: borrowing Transaction) throws -> UInt32? {
        try ServerStorage.number(try txn.get(users, key: Array(user.utf8)), "the number of user \(SyncService.quoted(user))")
    }

    /// The user's number, assigning the next one on first use.
    /// - Throws: `ServiceError.internalError` when every number of a
    ///   `UInt32`, the first 4 bytes of the user's keys, has been assigned.
    func userNumberCreating(_ user: String, _ txn: borrowing Transaction) throws -> UInt32 {
        if let number = try userNumber(user, txn) { return number }
        let last: UInt32 = try ServerStorage.number(try txn.get(meta, key: MetaKey.nextUser), "meta next-user") ?? 0
        // A trap here would take every other user's requests down with it.
        guard last < .max else {
            throw ServiceError(.internalError, "the server has no user number left for a new user: all \(last) are taken")
        }
        let number = last + 1
        try txn.put(meta, key: MetaKey.nextUser, value: number.bigEndianBytes)
        try txn.put(users, key: Array(user.utf8), value: number.bigEndianBytes)
        return number
    }

    /// The offset of the user's last change; 0 before their first.
    func lastOffset(user: UInt32, _ txn: borrowing Transaction) throws -> UInt64 {
        try txn.withCursor(changes) { cursor in
            let end = ServerStorage.changeKey(user, .max)
            var item = try cursor.seek(atLeast: end)
            if let found = item, found.key.elementsEqual(end) { return .max }
            item = try item == nil ? cursor.last() : cursor.previous()
            guard let (key, _) = item, key.count == 12, key.starts(with: user.bigEndianBytes) else { return 0 }
            return UInt64(bigEndianBytes: Array(key[4..<12])) ?? 0
        }
    }

    /// The offset of the user's next change. Each user's feed counts its
    /// own changes (1, 2, 3, ...), so the offsets in a user's cursors say
    /// nothing of how much other users write. (Stores made before counted
    /// one sequence for all users; each user's feed goes on from its last
    /// offset, so their cursors stay valid.)
    /// - Throws: `ServiceError.internalError` when the user's feed ends at
    ///   the last offset there is, which only damage could make.
    func nextOffset(user: UInt32, _ txn: borrowing Transaction) throws -> UInt64 {
        let last = try lastOffset(user: user, txn)
        guard last < .max else { throw ServiceError(.internalError, "the change feed of user \(user) is full") }
        return last + 1
    }

    func generation(_ txn: borrowing Transaction) throws -> UInt64 {
        try ServerStorage.number(try txn.get(meta, key: MetaKey.generation), "meta generation") ?? 0
    }

    func setGeneration(_ generation: UInt64, _ txn: borrowing Transaction) throws {
        try txn.put(meta, key: MetaKey.generation, value: generation.bigEndianBytes)
    }

    static func entityKey(_ user: UInt32, _ type: String, _ id: String) -> [UInt8] {
        user.bigEndianBytes + Array(type.utf8) + [0] + Array(id.utf8)
    }

    static func changeKey(_ user: UInt32, _ offset: UInt64) -> [UInt8] { user.bigEndianBytes + offset.bigEndianBytes }

    /// A key of `type-changes` or `scope-changes`: the user's number, the
    /// type's or scope's UTF-8 and a zero byte (neither holds one), then
    /// the change's offset.
    static func indexKey(_ user: UInt32, _ name: String, _ offset: UInt64) -> [UInt8] {
        user.bigEndianBytes + Array(name.utf8) + [0] + offset.bigEndianBytes
    }

    /// Appends the user's change at `offset`, of `entry`, made by the
    /// operation `idempotencyKey`, to the feed and its indexes: by type,
    /// and with a scope field, by `scope`.
    func appendChange(
        _ entry: Entry, _ change: Remote, scope: String, idempotencyKey: String, user: UInt32, _ txn: borrowing Transaction
    ) throws {
        try txn.put(
            changes, key: ServerStorage.changeKey(user, entry.offset),
            value: try ChangeRow.encode(entry, idempotencyKey: idempotencyKey))
        try txn.put(typeChanges, key: ServerStorage.indexKey(user, change.entityType, entry.offset), value: [])
        if scopeField != nil {
            try txn.put(scopeChanges, key: ServerStorage.indexKey(user, scope, entry.offset), value: [])
        }
    }

    /// The offsets of the user's changes that `index` (`type-changes` or
    /// `scope-changes`) lists under `names` after `after`, in feed order,
    /// with those it lists under the empty name (damaged rows, and in
    /// `scope-changes` changes without a scope): at most `countMax` of
    /// each name, so the first `countMax` are the first in the feed, and
    /// fewer than `countMax` are all there are.
    func changeOffsets(
        in index: Database, user: UInt32, names: Set<String>, after: UInt64, countMax: Int, _ txn: borrowing Transaction
    ) throws -> [UInt64] {
        var offsets: [UInt64] = []
        for name in names.union([""]) {
            let prefix = ServerStorage.indexKey(user, name, 0).dropLast(8)
            var found = 0
            try txn.forEach(index, from: Array(prefix) + (after + 1).bigEndianBytes) { key, _ in
                guard key.count == prefix.count + 8, key.starts(with: prefix),
                    let offset = UInt64(bigEndianBytes: Array(key[prefix.count...]))
                else { return false }
                offsets.append(offset)
                found += 1
                return found < countMax
            }
        }
        offsets.sort()
        return offsets
    }

    static func idempotencyKey(_ user: UInt32, _ key: String) -> [UInt8] { user.bigEndianBytes + Array(key.utf8) }
}

/// A row of the change feed: the change as an encoded `remote` entry, then
/// the UTF-8 idempotency key of the operation that made it, which the feed
/// shows with the change (section 8). In the change's own row, its key
/// costs a push's commit no B-tree of its own. A row written before the
/// server kept keys ends with its entry, and its change shows none.
enum ChangeRow {
    static func encode(_ entry: Entry, idempotencyKey: String) throws -> [UInt8] {
        try EntryCodec.encode(entry) + Array(idempotencyKey.utf8)
    }

    /// The change stored at `offset` as `row`, and its operation's key.
    /// - Throws: `ServiceError.internalError` naming the change when the
    ///   row does not read back: damage.
    static func decode(_ row: UnsafeRawBufferPointer, offset: UInt64) throws -> (change: Remote, timestamp: HybridTimestamp, idempotencyKey: String?) {
        let entry: Entry
        let key: UnsafeRawBufferPointer
        do {
            let count = EntryCodec.count(ofEntryAt: row) ?? row.count
            entry = try EntryCodec.decode(UnsafeRawBufferPointer(rebasing: row[..<count]), expectedOffset: offset)
            key = UnsafeRawBufferPointer(rebasing: row[count...])
        } catch {
            throw ServiceError(.internalError, "change \(offset) is damaged: \(error)")
        }
        guard case .remote(let change) = entry.body else {
            throw ServiceError(.internalError, "change \(offset) is a \(entry.kind) entry")
        }
        guard !key.isEmpty else { return (change, entry.timestamp, nil) }
        guard let idempotencyKey = String(validating: key, as: UTF8.self) else {
            throw ServiceError(.internalError, "change \(offset) is damaged: its idempotency key (\(key.count) bytes) is not UTF-8")
        }
        return (change, entry.timestamp, idempotencyKey)
    }
}
