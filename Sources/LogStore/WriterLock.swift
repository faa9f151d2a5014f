import Foundation
import LMDB
import LogFormat
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The one-writing-process rule, enforced: an exclusive advisory lock
/// (`flock`) on `writer.lock` in the store's directory, held while a store
/// is open for writing. LMDB itself would let two processes write, but each
/// writer keeps the log's position between commits, so a second one would
/// only meet failed appends; it is refused at open instead. Readers take no
/// lock. The kernel drops the lock when the process ends, however it ends.
final class WriterLock: Sendable {
    static let fileName = "writer.lock"
    private let descriptor: Int32
    private let released = Mutex(false)

    /// - Throws: `LogStoreError.writerActive` when another process holds it;
    ///   `LMDBError` with the `errno` of a lock file that cannot be opened
    ///   (no permission, out of descriptors) or locked (`failure(_:directory:)`),
    ///   as for the environment's files.
    init(directory: String) throws {
        let path = (directory as NSString).appendingPathComponent(WriterLock.fileName)
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw LMDBError(code: LMDBError.Code(rawValue: errno), operation: "open", path: directory, detail: WriterLock.fileName)
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let code = errno
            closeDescriptor(descriptor)
            throw WriterLock.failure(code, directory: directory)
        }
        // For people looking at a stuck store: who holds it.
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(descriptor, 0)
        _ = pid.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, 0) }
        self.descriptor = descriptor
    }

    /// Why `flock` refused the lock with `code`: another process holds it
    /// (`EWOULDBLOCK`), or the operating system could not lock the file at
    /// all (`ENOLCK`, as a network file system may answer), which is its
    /// error with the file named, not another writer.
    static func failure(_ code: Int32, directory: String) -> any Error {
        guard code == EWOULDBLOCK else {
            return LMDBError(code: LMDBError.Code(rawValue: code), operation: "flock", path: directory, detail: fileName)
        }
        let path = (directory as NSString).appendingPathComponent(fileName)
        let holder = (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        return LogStoreError(
            .writerActive, path: directory,
            "another process has the store open for writing\(holder.map { " (pid \($0))" } ?? "")")
    }

    /// Releases the lock; later calls do nothing (the descriptor number
    /// may already belong to another file).
    func release() {
        let first = released.withLock { released -> Bool in
            defer { released = true }
            return !released
        }
        guard first else { return }
        flock(descriptor, LOCK_UN)
        closeDescriptor(descriptor)
    }
}

private func closeDescriptor(_ descriptor: Int32) {
    _ = close(descriptor)
}
