import LMDB

/// One server per data directory, enforced: a `ProcessLock` on
/// `server.lock` in the directory, held while the server has its store
/// open. LMDB would let a second process serve the same store and keep its
/// bytes consistent, but rate limits, the push buffer and the writer queue
/// belong to each process, so two servers would each allow what the
/// operator meant for one; the second is refused at start instead.
enum DataDirectoryLock {
    static let fileName = "server.lock"

    /// Takes the lock on `directory`, which must exist.
    /// - Parameter named: the directory as the operator gave it, for messages.
    /// - Throws: `SyncServer.ConfigurationError` naming the directory and the
    ///   holder's pid when another process holds the lock; `LMDBError` with
    ///   the `errno` of a lock file that cannot be opened (no permission) or
    ///   locked at all (`ENOLCK`, as a network file system may answer).
    static func take(directory: String, named: String) throws -> ProcessLock {
        try ProcessLock(directory: directory, fileName: fileName) { pid in
            SyncServer.ConfigurationError(
                "dataDirectory \(named) is in use by another sync server (\(pid.map { "pid \($0)" } ?? "pid unknown")); "
                    + "one server serves a data directory at a time")
        }
    }
}
