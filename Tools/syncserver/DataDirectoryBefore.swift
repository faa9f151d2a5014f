import Foundation

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
    /// The files a new server store is made of: LMDB's two and the server's lock.
    static let storeFileNames = ["data.mdb", "lock.mdb", "server.lock"]

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
        // Not `deletingLastPathComponent`: Foundation on Linux traps on a path of one character.
        guard let slash = trimmed.lastIndex(of: "/") else { return }
        let parent = trimmed[..<slash].isEmpty ? "/" : String(trimmed[..<slash])
        var status = stat()
        guard lstat(parent, &status) != 0, errno == ENOENT else { return }
        throw SyncServerCommand.StartError(
            description: "cannot make --data \(path): \(parent) does not exist; only the store's own directory is made")
    }

    /// Removes what the failed start made: the store's files the directory
    /// did not hold, and the directory itself when there was none. Never a
    /// file it held, and nothing recursively: a directory that others wrote
    /// to meanwhile keeps what they wrote. Call it with the store closed.
    func restore() {
        if existed && names == nil { return }
        for name in Self.storeFileNames where names?.contains(name) != true {
            unlink(path + "/" + name)
        }
        if !existed { rmdir(path) }
    }
}
