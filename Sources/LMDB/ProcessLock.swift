import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One process at a time, enforced: an exclusive advisory lock (`flock`)
/// on a file in a directory, taken without waiting and held until
/// `release()` (or the lock's end). The holder writes its pid into the
/// file, for the next process refused and for people looking at the
/// directory. The kernel drops the lock when the process ends, however it
/// ends, so a killed holder never blocks the next one.
///
/// The client store's writer (`writer.lock`) and the sync server's data
/// directory (`server.lock`) each hold one.
public final class ProcessLock: Sendable {
    private let descriptor: Int32
    private let released = Mutex(false)

    /// Takes the lock on `fileName` in `directory`, which must exist.
    /// - Parameter held: the error for a lock another process holds, given
    ///   the holder's pid as its file names it (nil when it does not yet).
    /// - Throws: what `held` makes; `LMDBError` with the `errno` of a lock
    ///   file that cannot be opened (no permission, out of descriptors) or
    ///   locked at all (`failure(_:directory:fileName:held:)`), naming the file.
    public init(directory: String, fileName: String, held: (_ holderPID: String?) -> any Error) throws {
        let path = (directory as NSString).appendingPathComponent(fileName)
        let descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard descriptor >= 0 else {
            throw LMDBError(code: LMDBError.Code(rawValue: errno), operation: "open", path: directory, detail: fileName)
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let code = errno
            _ = close(descriptor)
            throw ProcessLock.failure(code, directory: directory, fileName: fileName, held: held)
        }
        let pid = Array("\(getpid())\n".utf8)
        _ = ftruncate(descriptor, 0)
        _ = pid.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, 0) }
        self.descriptor = descriptor
    }

    deinit { release() }

    /// Why `flock` refused the lock with `code`: another process holds it
    /// (`EWOULDBLOCK`: `held`'s error), or the operating system could not
    /// lock the file at all (`ENOLCK`, as a network file system may answer),
    /// which is its error with the file named, not another holder.
    public static func failure(
        _ code: Int32, directory: String, fileName: String, held: (_ holderPID: String?) -> any Error
    ) -> any Error {
        guard code == EWOULDBLOCK else {
            return LMDBError(code: LMDBError.Code(rawValue: code), operation: "flock", path: directory, detail: fileName)
        }
        let path = (directory as NSString).appendingPathComponent(fileName)
        let text = (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        // Empty for the moment between the holder's lock and its write.
        guard let text, !text.isEmpty, text.utf8.count <= 20, text.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else {
            return held(nil)
        }
        return held(text)
    }

    /// Releases the lock; later calls do nothing (the descriptor number
    /// may already belong to another file).
    public func release() {
        let first = released.withLock { released -> Bool in
            defer { released = true }
            return !released
        }
        guard first else { return }
        flock(descriptor, LOCK_UN)
        _ = close(descriptor)
    }
}
