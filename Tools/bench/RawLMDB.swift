import CLMDB
import Foundation

/// A failed LMDB call in the raw baseline, named like the wrapper's errors.
struct RawLMDBError: Error, CustomStringConvertible {
    let code: Int32
    let operation: String

    var description: String { "\(operation): \(String(cString: mdb_strerror(code))) [\(code)]" }
}

@inline(__always)
private func rawCheck(_ result: Int32, _ operation: String) throws(RawLMDBError) {
    if result != 0 { throw RawLMDBError(code: result, operation: operation) }
}

/// LMDB called directly, the floor our log is measured against: the flags
/// `Environment` uses for `.full` (`MDB_NOTLS`, nothing that skips a sync),
/// a 1 GiB map, and a `log` database with 8-byte big-endian keys written
/// with `MDB_APPEND`. Used from one thread at a time.
final class RawLMDBLog {
    /// Large enough that no baseline run grows the map.
    static let mapSizeBytes = 1 << 30
    static let databaseCountMax: UInt32 = 8

    private let environment: OpaquePointer
    private let database: MDB_dbi
    private(set) var lastOffset: UInt64 = 0
    private var isOpen = true

    /// Opens (or creates) the environment in the directory `path`.
    /// - Parameters:
    ///   - readOnly: open an existing store (ours or this baseline's) with
    ///     `MDB_RDONLY`, as a reader would.
    ///   - mapSize: the map in bytes; the baseline never grows it.
    init(path: String, readOnly: Bool = false, mapSize: Int = RawLMDBLog.mapSizeBytes) throws {
        if !readOnly { try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true) }
        (environment, database) = try rawOpen(path: path, mapSize: mapSize, readOnly: readOnly, database: "log")
    }

    deinit { close() }

    func close() {
        guard isOpen else { return }
        isOpen = false
        mdb_env_close(environment)
    }

    /// Appends one value at the next offset in a transaction of its own,
    /// returning after the commit (and its syncs).
    func append(_ value: [UInt8]) throws(RawLMDBError) {
        try append(contentsOf: CollectionOfOne(value))
    }

    /// Appends the values at the next offsets in one transaction.
    func append(contentsOf values: some Collection<[UInt8]>) throws(RawLMDBError) {
        precondition(isOpen, "append after close")
        var txn: OpaquePointer?
        try rawCheck(mdb_txn_begin(environment, nil, 0, &txn), "mdb_txn_begin")
        var offset = lastOffset
        for value in values {
            offset += 1
            let result = put(txn, offset: offset, value)
            guard result == 0 else {
                mdb_txn_abort(txn)
                throw RawLMDBError(code: result, operation: "mdb_put")
            }
        }
        try rawCheck(mdb_txn_commit(txn), "mdb_txn_commit")
        lastOffset = offset
    }

    private func put(_ txn: OpaquePointer?, offset: UInt64, _ value: [UInt8]) -> Int32 {
        withUnsafeBytes(of: offset.bigEndian) { key in
            value.withUnsafeBytes { data in rawPut(txn, database, key: key, value: data, flags: MDB_APPEND) }
        }
    }

    /// Walks the whole `log` database with one cursor in one read
    /// transaction, calling `visit` with each key and value (pointers into
    /// the map, valid only during the call). Returns the number of entries.
    func walk(_ visit: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Void) throws -> Int {
        precondition(isOpen, "walk after close")
        var txn: OpaquePointer?
        try rawCheck(mdb_txn_begin(environment, nil, UInt32(MDB_RDONLY), &txn), "mdb_txn_begin")
        defer { mdb_txn_abort(txn) }
        return try rawForEach(txn, database, visit)
    }

    /// The id of the environment's last committed transaction: the
    /// difference across a run is the number of commits it made.
    func lastTransactionID() -> Int {
        precondition(isOpen, "info after close")
        var info = MDB_envinfo()
        mdb_env_info(environment, &info)
        return info.me_last_txnid
    }

    /// The version of liblmdb this process linked.
    static var libraryVersion: String { String(cString: mdb_version(nil, nil, nil)) }
}

/// Puts one key and value with `flags`; LMDB's result code.
@inline(__always)
func rawPut(
    _ txn: OpaquePointer?, _ database: MDB_dbi, key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, flags: Int32
) -> Int32 {
    var keyValue = MDB_val(mv_size: key.count, mv_data: UnsafeMutableRawPointer(mutating: key.baseAddress))
    var dataValue = MDB_val(mv_size: value.count, mv_data: UnsafeMutableRawPointer(mutating: value.baseAddress))
    return mdb_put(txn, database, &keyValue, &dataValue, UInt32(flags))
}

/// Walks `database` in key order with one cursor in `txn`, calling `visit`
/// with each key and value (pointers into the map, valid only during the
/// call). Returns the number of rows.
func rawForEach(
    _ txn: OpaquePointer?, _ database: MDB_dbi, _ visit: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Void
) throws -> Int {
    var cursor: OpaquePointer?
    try rawCheck(mdb_cursor_open(txn, database, &cursor), "mdb_cursor_open")
    defer { mdb_cursor_close(cursor) }
    var key = MDB_val()
    var data = MDB_val()
    var count = 0
    var result = mdb_cursor_get(cursor, &key, &data, MDB_FIRST)
    while result == 0 {
        try visit(
            UnsafeRawBufferPointer(start: key.mv_data, count: key.mv_size),
            UnsafeRawBufferPointer(start: data.mv_data, count: data.mv_size))
        count += 1
        result = mdb_cursor_get(cursor, &key, &data, MDB_NEXT)
    }
    guard result == MDB_NOTFOUND else { throw RawLMDBError(code: result, operation: "mdb_cursor_get") }
    return count
}

/// Opens an environment with `MDB_NOTLS` and one named database in it (made
/// if missing and writable): the setup both raw baselines share.
func rawOpen(path: String, mapSize: Int, readOnly: Bool, database name: String) throws(RawLMDBError)
    -> (environment: OpaquePointer, database: MDB_dbi)
{
    let (handle, databases) = try rawOpen(path: path, mapSize: mapSize, readOnly: readOnly, databases: [name])
    return (handle, databases[0])
}

/// Opens an environment with `MDB_NOTLS` (and `extraFlags`) and the named
/// databases in it, made if missing and writable.
func rawOpen(path: String, mapSize: Int, readOnly: Bool, extraFlags: Int32 = 0, databases names: [String])
    throws(RawLMDBError) -> (environment: OpaquePointer, databases: [MDB_dbi])
{
    var handle: OpaquePointer?
    try rawCheck(mdb_env_create(&handle), "mdb_env_create")
    guard let handle else { preconditionFailure("mdb_env_create returned no environment") }
    do throws(RawLMDBError) {
        // Read-only, LMDB takes the larger of this and the size the file records.
        try rawCheck(mdb_env_set_mapsize(handle, mapSize), "mdb_env_set_mapsize")
        try rawCheck(mdb_env_set_maxdbs(handle, RawLMDBLog.databaseCountMax), "mdb_env_set_maxdbs")
        let flags = UInt32(MDB_NOTLS) | UInt32(extraFlags) | (readOnly ? UInt32(MDB_RDONLY) : 0)
        try rawCheck(mdb_env_open(handle, path, flags, 0o644), "mdb_env_open")
        var txn: OpaquePointer?
        try rawCheck(mdb_txn_begin(handle, nil, readOnly ? UInt32(MDB_RDONLY) : 0, &txn), "mdb_txn_begin")
        var databases: [MDB_dbi] = []
        for name in names {
            var dbi = MDB_dbi()
            let result = mdb_dbi_open(txn, name, readOnly ? 0 : UInt32(MDB_CREATE), &dbi)
            guard result == 0 else {
                mdb_txn_abort(txn)
                throw RawLMDBError(code: result, operation: "mdb_dbi_open(\(name))")
            }
            databases.append(dbi)
        }
        // Committing keeps the handles open for later transactions.
        try rawCheck(mdb_txn_commit(txn), "mdb_txn_commit")
        return (handle, databases)
    } catch {
        mdb_env_close(handle)
        throw error
    }
}

/// The rows some databases of a store hold, copied with LMDB alone into a
/// new environment: the floor under writing those rows at all.
enum RawTableCopy {
    struct Row {
        /// An index into the database names the rows were read with.
        var database: Int
        var key: [UInt8]
        var value: [UInt8]
    }

    /// Every row of `databases` in the store at `path`, database by
    /// database, each in key order. Open it only while the store is closed.
    static func read(path: String, databases: [String]) throws -> [Row] {
        let (environment, handles) = try rawOpen(
            path: path, mapSize: RawLMDBLog.mapSizeBytes, readOnly: true, databases: databases)
        defer { mdb_env_close(environment) }
        var txn: OpaquePointer?
        try rawCheck(mdb_txn_begin(environment, nil, UInt32(MDB_RDONLY), &txn), "mdb_txn_begin")
        defer { mdb_txn_abort(txn) }
        var rows: [Row] = []
        for (index, database) in handles.enumerated() {
            _ = try rawForEach(txn, database) { key, value in
                rows.append(Row(database: index, key: [UInt8](key), value: [UInt8](value)))
            }
        }
        return rows
    }

    /// Writes `rows` (in key order within each database, as `read` gives
    /// them) into a new environment at `path` with `MDB_APPEND`, `perCommit`
    /// rows per transaction, each commit with LMDB's two syncs (`syncing`)
    /// or none, and returns the time it took.
    static func write(
        _ rows: [Row], databases: [String], to path: String, perCommit: Int, syncing: Bool = false
    ) throws -> Duration {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        // Twice the rows' bytes leaves room for node headers, branch pages
        // and values spilling to overflow pages, however large the log was.
        let bytes = rows.reduce(0) { $0 + $1.key.count + $1.value.count + 16 }
        let (environment, handles) = try rawOpen(
            path: path, mapSize: max(RawLMDBLog.mapSizeBytes, 2 * bytes), readOnly: false,
            extraFlags: syncing ? 0 : MDB_NOSYNC,
            databases: databases)
        defer { mdb_env_close(environment) }
        return try timed {
            var start = 0
            while start < rows.count {
                var txn: OpaquePointer?
                try rawCheck(mdb_txn_begin(environment, nil, 0, &txn), "mdb_txn_begin")
                for row in rows[start..<min(start + perCommit, rows.count)] {
                    let result = row.key.withUnsafeBytes { key in
                        row.value.withUnsafeBytes { value in
                            rawPut(txn, handles[row.database], key: key, value: value, flags: MDB_APPEND)
                        }
                    }
                    guard result == 0 else {
                        mdb_txn_abort(txn)
                        throw RawLMDBError(code: result, operation: "mdb_put")
                    }
                }
                try rawCheck(mdb_txn_commit(txn), "mdb_txn_commit")
                start += perCommit
            }
        }
    }
}
