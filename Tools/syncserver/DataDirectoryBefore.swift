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
