import Foundation
import LMDB
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One server per data directory, enforced: an exclusive advisory lock
/// (`flock`) on `server.lock` in the directory, held while the server has
/// its store open. LMDB would let a second process serve the same store and
/// keep its bytes consistent, but rate limits, the push buffer and the
/// writer queue belong to each process, so two servers would each allow
/// what the operator meant for one; the second is refused at start instead.
/// The kernel drops the lock when the process ends, however it ends (a
/// SIGKILLed server's lock never blocks a restart).
final class DataDirectoryLock: Sendable {
    static let fileName = "server.lock"
    private let descriptor: Int32
    private let released = Mutex(false)

    /// Takes the lock on `directory`, which must exist.
    /// - Parameter named: the directory as the operator gave it, for messages.
    /// - Throws: `SyncServer.ConfigurationError` naming the directory and the
    ///   holder's pid when another process holds the lock; `LMDBError` with
    ///   the `errno` of a lock file that cannot be opened (no permission) or
    ///   locked at all (`ENOLCK`, as a network file system may answer).
    init(directory: String, named: String) throws {
        let path = (directory as NSString).appendingPathComponent(DataDirectoryLock.fileName)
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw LMDBError(
                code: LMDBError.Code(rawValue: errno), operation: "open", path: directory, detail: DataDirectoryLock.fileName)
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let code = errno
            closeDescriptor(descriptor)
            guard code == EWOULDBLOCK else {
                throw LMDBError(
                    code: LMDBError.Code(rawValue: code), operation: "flock", path: directory, detail: DataDirectoryLock.fileName)
            }
            throw SyncServer.ConfigurationError(
                "dataDirectory \(named) is in use by another sync server (\(DataDirectoryLock.holder(path))); "
                    + "one server serves a data directory at a time")
        }
        // For the next server refused, and people looking at the directory: who holds it.
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(descriptor, 0)
        _ = pid.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, 0) }
        self.descriptor = descriptor
    }

    deinit { release() }

    /// The holder as its lock file names it. The file is empty for the
    /// moment between the holder taking the lock and writing its pid.
    private static func holder(_ path: String) -> String {
        let text = (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let text, !text.isEmpty, text.utf8.count <= 20, text.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else {
            return "pid unknown"
        }
        return "pid \(text)"
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
