import Foundation
import LMDB

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// What `--data` held before the server opened it, so that a start that
/// fails before it listens leaves the disk as it was found. The server makes
/// its store (and the directory) when it opens, before it binds: a port in
/// use or an address it cannot take left a new, empty store behind.
struct DataDirectoryBefore {
    /// LMDB's files of a new server store.
    static let storeFileNames = ["data.mdb", "lock.mdb"]
    /// The file a server holds locked while it has the store open
    /// (`DataDirectoryLock` in LogServer).
    static let lockFileName = "server.lock"

    let path: String
    /// The names the directory held; nil when there was no directory.
    /// A directory that could not be listed is left alone.
    private let names: Set<String>?
    private let existed: Bool

    init(_ path: String) {
        self.path = path
        var status = stat()
        existed = lstat(path, &status) == 0 || errno != ENOENT
        names = existed ? (try? FileManager.default.contentsOfDirectory(atPath: path)).map(Set.init) : nil
    }

    /// Refuses a missing directory whose parent is missing too (a path
    /// mistyped): only the store's own directory is made, and the open said
    /// "mkdir (DIR): No such file or directory [2]", naming neither
    /// the option nor the missing parent.
    /// - Throws: `SyncServerCommand.StartError` naming both.
    func checkParentExists() throws {
        guard !existed else { return }
        let trimmed = path.hasSuffix("/") && path.count > 1 ? String(path.dropLast()) : path
        guard let parent = parentDirectory(of: trimmed) else { return }
        var status = stat()
        guard lstat(parent, &status) != 0, errno == ENOENT else { return }
        throw SyncServerCommand.StartError(
            description: "cannot make --data \(path): \(parent) does not exist; only the store's own directory is made")
    }

    /// Removes the store files the failed start made (`data.mdb` and
    /// `lock.mdb`, those the directory did not hold). Call it while the
    /// server still holds `server.lock`, before it closes the store: another
    /// server started meanwhile on the same `--data` cannot take the lock,
    /// so it cannot be serving the files removed. Removed after the close,
    /// a server that took the directory in between would go on serving a
    /// file no longer in it, and lose all it stored at its exit.
    func removeStoreFiles() {
        guard let names = namesToRemove else { return }
        for name in Self.storeFileNames where !names.contains(name) {
            unlink(path + "/" + name)
        }
    }

    /// Removes `server.lock`, when the start made it and no other server
    /// has taken it since the store closed (the lock is taken first, so one
    /// that opens the file meanwhile finds it held, and stops), then the
    /// directory, when the start made it and it is empty. Never a file the
    /// directory held, and nothing recursively.
    func removeLockAndDirectory() {
        guard let names = namesToRemove else { return }
        if !names.contains(Self.lockFileName) {
            let lockPath = path + "/" + Self.lockFileName
            let descriptor = open(lockPath, O_RDWR | O_CLOEXEC)
            if descriptor >= 0 {
                if flock(descriptor, LOCK_EX | LOCK_NB) == 0 { unlink(lockPath) }
                close(descriptor)
            }
        }
        if !existed { rmdir(path) }
    }

    /// The names the directory held (none when it did not exist); nil when
    /// it existed and could not be listed, and is left alone.
    private var namesToRemove: Set<String>? { existed ? names : [] }
}
