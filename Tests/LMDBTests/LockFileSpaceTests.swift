import Foundation
@testable import LMDB
import LogTesting
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A new environment on a full disk. These tests mount a small tmpfs, so
/// they need root (with `CAP_SYS_ADMIN`); elsewhere they are skipped.
@Suite struct LockFileSpaceTests {
    /// Bytes of the file system mounted for a test: a few pages.
    static let fileSystemBytes = 64 << 10

    /// Whether a tmpfs can be mounted here (tried once, and unmounted).
    static let canMount: Bool = {
        guard let directory = try? TemporaryDirectory("lmdb-mount-probe") else { return false }
        guard mountSmallFileSystem(directory.path) else { return false }
        _ = umount2(directory.path, Int32(MNT_DETACH))
        return true
    }()

    static func mountSmallFileSystem(_ path: String) -> Bool {
        #if os(Linux)
            return mount("tmpfs", path, "tmpfs", 0, "size=\(fileSystemBytes)") == 0
        #else
            return false
        #endif
    }

    /// Fills the file system at `path` until it has no block left.
    static func fill(_ path: String) {
        let file = open(path + "/fill", O_WRONLY | O_CREAT, 0o644)
        defer { _ = close(file) }
        let block = [UInt8](repeating: 1, count: 4096)
        // Bounded by the file system's size.
        for _ in 0...(fileSystemBytes / block.count) where write(file, block, block.count) > 0 {}
    }

    /// LMDB makes a new lock file sparse and writes it through `mmap`; on a
    /// full disk that write kills the process with SIGBUS. Allocated first,
    /// the open fails with `.noSpace` naming the lock file, leaves no lock
    /// file behind, and succeeds once there is room.
    @Test(.enabled(if: canMount, "mounting a small tmpfs needs root with CAP_SYS_ADMIN"))
    func aNewEnvironmentOnAFullDiskIsAnError() throws {
        let mountPoint = try TemporaryDirectory("lmdb-full-disk")
        try #require(Self.mountSmallFileSystem(mountPoint.path))
        defer { _ = umount2(mountPoint.path, Int32(MNT_DETACH)) }
        Self.fill(mountPoint.path)
        let store = mountPoint.appending("store")
        let error = #expect(throws: LMDBError.self) { try Environment(path: store) }
        #expect(error?.code == .noSpace, "\(String(describing: error))")
        #expect(error?.description.contains("lock.mdb") == true, "\(String(describing: error))")
        #expect(access(store + "/lock.mdb", F_OK) != 0)
        unlink(mountPoint.path + "/fill")
        var options = Environment.Options()
        options.mapSize = 32 << 10
        let environment = try Environment(path: store, options: options)
        environment.close()
    }

    /// LMDB takes its counts of databases and readers as `UInt32`: an
    /// `Options` count outside that range is refused naming it, before
    /// anything is made, where converting it trapped.
    /// So is a negative map size, which failed the open as "Cannot allocate
    /// memory", naming no option.
    @Test(arguments: [("maxDatabases", -1), ("maxDatabases", Int(UInt32.max) + 1), ("maxReaders", -1), ("maxReaders", 0), ("mapSize", -1)])
    func aCountLMDBCannotTakeIsRefused(name: String, count: Int) throws {
        let directory = try TemporaryDirectory("lmdb-counts")
        defer { directory.remove() }
        var options = Environment.Options()
        switch name {
        case "maxDatabases": options.maxDatabases = count
        case "maxReaders": options.maxReaders = count
        default: options.mapSize = count
        }
        let store = directory.path + "/store"
        let error = #expect(throws: LMDBError.self) { try Environment(path: store, options: options) }
        #expect(error?.code == .invalidArgument, "\(String(describing: error))")
        #expect(error?.description.contains("\(name) \(count)") == true, "\(String(describing: error))")
        #expect(access(store, F_OK) != 0)
    }

    /// The size allocated is the one LMDB makes, so LMDB keeps its reader
    /// count: a file of another size would change it.
    @Test func theAllocatedSizeIsLMDBs() throws {
        let directory = try TemporaryDirectory("lmdb-lock-size")
        var options = Environment.Options()
        options.maxReaders = 50
        let environment = try Environment(path: directory.path, options: options)
        defer { environment.close() }
        var file = stat()
        #expect(stat(directory.path + "/lock.mdb", &file) == 0)
        #expect(Int(file.st_size) == LockFileSpace.bytes(maxReaders: 50))
        #expect(Int(file.st_blocks) * 512 >= LockFileSpace.bytes(maxReaders: 50))
        #expect(environment.info().maxReaders == 50)
    }
}
