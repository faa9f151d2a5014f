import CLMDB

/// A named database (an LMDB "DBI") inside an environment. Values of this
/// type are only handles, trivially copied; all access goes through a
/// `Transaction`.
public struct Database: Hashable, Sendable {
    let dbi: MDB_dbi
}

/// Flags for `Transaction.put`.
public struct PutFlags: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// The key sorts after every key in the database (`MDB_APPEND`): LMDB
    /// skips the search and fills pages completely. A key out of order fails
    /// with `keyExists`.
    public static let append = PutFlags(rawValue: UInt32(MDB_APPEND))
    /// Fail with `keyExists` instead of replacing an existing value.
    public static let noOverwrite = PutFlags(rawValue: UInt32(MDB_NOOVERWRITE))
}

/// A database's size (`mdb_stat`): its keys, and the pages of its B-tree
/// (branch, leaf and overflow pages; free pages belong to no database).
public struct DatabaseStatistics: Sendable, Equatable {
    public var entries: Int
    /// Levels of the B-tree (0 when empty).
    public var depth: Int
    public var pages: Int
    public var pageSize: Int
    /// The bytes of file its pages take.
    public var bytes: Int { pages * pageSize }
}

/// A read or write transaction, valid only inside the closure that received
/// it (`Environment.read` or `Environment.write`). It cannot be copied or
/// kept. Buffers it hands out point into the memory map and are valid until
/// the transaction ends or the same key is written.
public struct Transaction: ~Copyable {
    let handle: OpaquePointer
    public let isReadOnly: Bool
    let path: String

    @usableFromInline
    init(handle: OpaquePointer, isReadOnly: Bool, path: String) {
        self.handle = handle
        self.isReadOnly = isReadOnly
        self.path = path
    }

    /// A second handle on `other`, for a wrapper that is used only while
    /// `other` is borrowed (a store's read snapshot holds one). Ending the
    /// transaction stays with whoever began it.
    package init(borrowing other: borrowing Transaction) {
        self.init(handle: other.handle, isReadOnly: other.isReadOnly, path: other.path)
    }

    /// For a read transaction, the id of the commit whose state it sees
    /// (`mdb_txn_id`): two read transactions with the same id see the same
    /// data, in any process. Nil for a write transaction, whose id names a
    /// commit not made yet (and reused should it abort).
    public var snapshotID: UInt64? { isReadOnly ? UInt64(mdb_txn_id(handle)) : nil }

    /// Calls `body` with the value stored under `key`, or returns nil if
    /// there is none. The buffer is valid only during the call. The value's
    /// first cache lines are prefetched together before `body` runs (on a
    /// table bigger than the caches this made `Store.get` about 12% faster).
    @inlinable
    public func withValue<R>(
        _ database: Database, key: UnsafeRawBufferPointer, _ body: (UnsafeRawBufferPointer) throws -> R
    ) throws -> R? {
        guard let value = try value(database, key: key) else { return nil }
        if let start = value.baseAddress { clmdb_prefetch(start, value.count) }
        return try body(value)
    }

    /// The stored value (pointing into the map), or nil.
    @usableFromInline
    func value(_ database: Database, key: UnsafeRawBufferPointer) throws(LMDBError) -> UnsafeRawBufferPointer? {
        var keyValue = MDB_val(mv_size: key.count, mv_data: UnsafeMutableRawPointer(mutating: key.baseAddress))
        var data = MDB_val()
        let result = mdb_get(handle, database.dbi, &keyValue, &data)
        if result == MDB_NOTFOUND { return nil }
        try check(result, "mdb_get", path: path)
        return UnsafeRawBufferPointer(start: data.mv_data, count: data.mv_size)
    }

    /// Whether `key` has a value (nothing is copied).
    public func contains(_ database: Database, key: [UInt8]) throws -> Bool {
        try key.withUnsafeBytes { key in try value(database, key: key) != nil }
    }

    /// A copy of the value stored under `key`, or nil.
    public func get(_ database: Database, key: [UInt8]) throws -> [UInt8]? {
        try key.withUnsafeBytes { key in try withValue(database, key: key) { [UInt8]($0) } }
    }

    /// Stores `value` under `key`.
    /// - Throws: `LMDBError` with `.mapFull` (the environment grows and
    ///   retries the whole write), `.keyExists` (with `.append` or
    ///   `.noOverwrite`), `.badValueSize` (a key over 511 bytes).
    public func put(
        _ database: Database, key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, flags: PutFlags = []
    ) throws(LMDBError) {
        precondition(!isReadOnly, "put in a read-only transaction")
        var keyValue = MDB_val(mv_size: key.count, mv_data: UnsafeMutableRawPointer(mutating: key.baseAddress))
        var data = MDB_val(mv_size: value.count, mv_data: UnsafeMutableRawPointer(mutating: value.baseAddress))
        try check(mdb_put(handle, database.dbi, &keyValue, &data, flags.rawValue), "mdb_put", path: path)
    }

    public func put(_ database: Database, key: [UInt8], value: [UInt8], flags: PutFlags = []) throws(LMDBError) {
        try key.withUnsafeBytes { key in
            value.withUnsafeBytes { value in
                Result { () throws(LMDBError) in try put(database, key: key, value: value, flags: flags) }
            }
        }.get()
    }

    /// Removes `key`. Returns false if it was not there.
    @discardableResult
    public func delete(_ database: Database, key: [UInt8]) throws(LMDBError) -> Bool {
        try key.withUnsafeBytes { key in Result { () throws(LMDBError) in try delete(database, key: key) } }.get()
    }

    @discardableResult
    public func delete(_ database: Database, key: UnsafeRawBufferPointer) throws(LMDBError) -> Bool {
        precondition(!isReadOnly, "delete in a read-only transaction")
        var keyValue = MDB_val(mv_size: key.count, mv_data: UnsafeMutableRawPointer(mutating: key.baseAddress))
        let result = mdb_del(handle, database.dbi, &keyValue, nil)
        if result == MDB_NOTFOUND { return false }
        try check(result, "mdb_del", path: path)
        return true
    }

    /// Removes every key of `database`, keeping the database itself.
    public func removeAll(_ database: Database) throws(LMDBError) {
        precondition(!isReadOnly, "removeAll in a read-only transaction")
        try check(mdb_drop(handle, database.dbi, 0), "mdb_drop", path: path)
    }

    /// The number of keys in `database`.
    public func count(_ database: Database) throws(LMDBError) -> Int {
        try statistics(database).entries
    }

    /// What `database` holds: its keys, and the pages its B-tree takes.
    public func statistics(_ database: Database) throws(LMDBError) -> DatabaseStatistics {
        var stat = MDB_stat()
        try check(mdb_stat(handle, database.dbi, &stat), "mdb_stat", path: path)
        return DatabaseStatistics(
            entries: stat.ms_entries, depth: Int(stat.ms_depth),
            pages: stat.ms_branch_pages + stat.ms_leaf_pages + stat.ms_overflow_pages, pageSize: Int(stat.ms_psize))
    }

    /// Runs `body` with a cursor over `database`; the cursor closes on return.
    public func withCursor<R>(_ database: Database, _ body: (inout Cursor) throws -> R) throws -> R {
        var cursorHandle: OpaquePointer?
        try check(mdb_cursor_open(handle, database.dbi, &cursorHandle), "mdb_cursor_open", path: path)
        guard let cursorHandle else { preconditionFailure("mdb_cursor_open returned no cursor") }
        var cursor = Cursor(handle: cursorHandle, path: path)
        defer { mdb_cursor_close(cursorHandle) }
        return try body(&cursor)
    }

    /// Calls `body` for each key and value from `start` (or the first key)
    /// in key order, until it returns false or the keys run out.
    public func forEach(
        _ database: Database, from start: [UInt8]? = nil,
        _ body: (_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) throws -> Bool
    ) throws {
        try withCursor(database) { cursor in
            var item = try start.map { try cursor.seek(atLeast: $0) } ?? cursor.first()
            while let (key, value) = item, try body(key, value) {
                item = try cursor.next()
            }
        }
    }

    /// Opens a named database (nil names the main database) inside this
    /// transaction. The handle stays valid once the transaction commits.
    /// Call this only while no other transaction in the process opens
    /// databases (at startup); `Environment.openDatabase` takes care of that.
    /// - Returns: nil when the database does not exist and `create` is false.
    public func openDatabase(_ name: String?, create: Bool) throws(LMDBError) -> Database? {
        precondition(!create || !isReadOnly, "creating a database in a read-only transaction")
        var dbi = MDB_dbi()
        let result = mdb_dbi_open(handle, name, create ? UInt32(MDB_CREATE) : 0, &dbi)
        if result == MDB_NOTFOUND { return nil }
        try check(result, "mdb_dbi_open", path: path)
        return Database(dbi: dbi)
    }

    /// Runs `body` in a child transaction: its writes join this transaction
    /// if it returns, and are undone (while this transaction goes on) if it
    /// throws.
    public func nested<R>(_ body: (borrowing Transaction) throws -> R) throws -> R {
        precondition(!isReadOnly, "nested transaction inside a read-only one")
        var child: OpaquePointer?
        try check(mdb_txn_begin(mdb_txn_env(handle), handle, 0, &child), "mdb_txn_begin", path: path)
        guard let child else { preconditionFailure("mdb_txn_begin returned no transaction") }
        let value: R
        do {
            let transaction = Transaction(handle: child, isReadOnly: false, path: path)
            value = try body(transaction)
        } catch {
            mdb_txn_abort(child)
            throw error
        }
        try check(mdb_txn_commit(child), "mdb_txn_commit", path: path)
        return value
    }
}

/// A position in a database, valid inside `Transaction.withCursor`. Each
/// move returns the key and value there, or nil past either end.
public struct Cursor: ~Copyable {
    let handle: OpaquePointer
    let path: String
    public typealias Item = (key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer)

    public mutating func first() throws(LMDBError) -> Item? { try move(MDB_FIRST) }
    public mutating func last() throws(LMDBError) -> Item? { try move(MDB_LAST) }
    public mutating func next() throws(LMDBError) -> Item? { try move(MDB_NEXT) }
    public mutating func previous() throws(LMDBError) -> Item? { try move(MDB_PREV) }

    /// Moves to the first key at or after `key`.
    public mutating func seek(atLeast key: [UInt8]) throws(LMDBError) -> Item? {
        try key.withUnsafeBytes { key in
            Result { () throws(LMDBError) in
                var keyValue = MDB_val(
                    mv_size: key.count, mv_data: UnsafeMutableRawPointer(mutating: key.baseAddress))
                return try move(MDB_SET_RANGE, key: &keyValue)
            }
        }.get()
    }

    private mutating func move(_ operation: MDB_cursor_op) throws(LMDBError) -> Item? {
        var key = MDB_val()
        return try move(operation, key: &key)
    }

    private mutating func move(_ operation: MDB_cursor_op, key: inout MDB_val) throws(LMDBError) -> Item? {
        var data = MDB_val()
        let result = mdb_cursor_get(handle, &key, &data, operation)
        if result == MDB_NOTFOUND { return nil }
        try check(result, "mdb_cursor_get", path: path)
        return (
            UnsafeRawBufferPointer(start: key.mv_data, count: key.mv_size),
            UnsafeRawBufferPointer(start: data.mv_data, count: data.mv_size)
        )
    }
}
