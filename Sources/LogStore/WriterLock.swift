import LMDB

/// The one-writing-process rule, enforced: a `ProcessLock` on `writer.lock`
/// in the store's directory, held while a store is open for writing. LMDB
/// itself would let two processes write, but each writer keeps the log's
/// position between commits, so a second one would only meet failed
/// appends; it is refused at open instead. Readers take no lock.
enum WriterLock {
    static let fileName = "writer.lock"

    /// - Throws: `LogStoreError.writerActive` when another process holds it;
    ///   `LMDBError` with the `errno` of a lock file that cannot be opened
    ///   (no permission, out of descriptors) or locked (`failure(_:directory:)`),
    ///   as for the environment's files.
    static func take(directory: String) throws -> ProcessLock {
        try ProcessLock(directory: directory, fileName: fileName) { anotherWriter(directory, pid: $0) }
    }

    /// Why `flock` refused the lock with `code` (`ProcessLock.failure`).
    static func failure(_ code: Int32, directory: String) -> any Error {
        ProcessLock.failure(code, directory: directory, fileName: fileName) { anotherWriter(directory, pid: $0) }
    }

    private static func anotherWriter(_ directory: String, pid: String?) -> any Error {
        LogStoreError(.writerActive, path: directory, "another process has the store open for writing\(pid.map { " (pid \($0))" } ?? "")")
    }
}
