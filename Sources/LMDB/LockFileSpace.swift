import Foundation

/// The lock file's blocks, allocated before LMDB makes the file itself.
///
/// Why it exists: LMDB makes a new `lock.mdb` with `ftruncate` (a sparse
/// file) and then writes it through a shared `mmap`. On a full disk the
/// first store to that memory finds no block to give it, and the kernel
/// kills the process with SIGBUS: no error reaches the caller. Allocated
/// here first, LMDB finds the file at its full size and only maps it, and
/// a full disk is an `ENOSPC` error from `open`.
enum LockFileSpace {
    /// LMDB's `sizeof(MDB_reader)` and `sizeof(MDB_txninfo)` on a build
    /// with 64-byte cache lines (Debian's liblmdb 0.9.24): a reader slot is
    /// one cache line, the header three (two counters and the first slot).
    static let readerBytes = 64
    static let headerBytes = 3 * 64

    /// The size LMDB gives a new lock file (`rsize` in
    /// `mdb_env_setup_locks`). A file at least this long is taken as it is.
    static func bytes(maxReaders: Int) -> Int {
        precondition(maxReaders >= 1, "an environment has at least one reader slot")
        return (maxReaders - 1) * readerBytes + headerBytes
    }

    /// Makes `directory`'s lock file with its blocks allocated, when there
    /// is none yet. An existing file (another process's, or one made since
    /// it was looked for) is left alone. A file system that cannot allocate
    /// ahead leaves the file to LMDB as before.
    /// - Throws: `LMDBError` with `.noSpace` (or the quota's code) when the
    ///   disk has no room for it; the file is removed then.
    static func allocate(directory: String, maxReaders: Int) throws(LMDBError) {
        let path = directory + "/lock.mdb"
        let file = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard file >= 0 else { return }
        let result = posix_fallocate(file, 0, off_t(bytes(maxReaders: maxReaders)))
        _ = close(file)
        guard result == ENOSPC || result == EDQUOT else {
            // Done, or not supported here: LMDB sizes the file as before.
            if result != 0 { unlink(path) }
            return
        }
        unlink(path)
        throw LMDBError(code: LMDBError.Code(rawValue: result), operation: "posix_fallocate", path: directory, detail: "lock.mdb")
    }
}
