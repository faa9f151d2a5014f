import CLMDB

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Names the file behind a failed `mdb_env_open`, which LMDB's error does
/// not: an operating system's code there (no permission, a read-only file
/// system) is one of opening `lock.mdb` for reading and writing (every
/// process does, a read-only one too: it takes a slot in the reader table
/// there) or `data.mdb` (for reading, and writing unless read-only).
enum OpenFailure {
    /// Throws the error of an `mdb_env_open` of `directory` that returned
    /// `result` (nothing when it is 0), with the file that fails so in its
    /// `detail`: each is opened again here, in LMDB's order, to find it.
    static func check(_ result: Int32, directory: String, readOnly: Bool) throws(LMDBError) {
        guard result != 0 else { return }
        var error = LMDBError(code: LMDBError.Code(rawValue: result), operation: "mdb_env_open", path: directory)
        if result == MDB_INVALID, let problem = DataFile.metaPageProblem(in: directory) {
            // An LMDB file cut short or damaged: not a file of another kind.
            throw LMDBError(code: problem.missing ? .truncated : .metaPageDamaged, operation: "mdb_env_open", path: directory, detail: problem.detail)
        }
        guard result > 0 else { throw error }
        let lock = ("lock.mdb", O_RDWR, "every process that opens the environment, a read-only one too, writes its reader slot there")
        let data = ("data.mdb", readOnly ? O_RDONLY : O_RDWR, readOnly ? "a read-only open reads it" : "a writer reads and writes it")
        // A read-only open opens the data file first, a writer the lock file.
        for (name, flags, why) in readOnly ? [data, lock] : [lock, data] {
            // A read-only open of a directory succeeds, and LMDB's fails
            // with EISDIR: named as what it is, not as a file it opens.
            var status = stat()
            if stat(directory + "/" + name, &status) == 0, status.st_mode & S_IFMT == S_IFDIR {
                error.detail = "\(name) is a directory, where LMDB keeps a file"
                throw error
            }
            let descriptor = open(directory + "/" + name, flags | O_CLOEXEC)
            guard descriptor < 0 else {
                _ = close(descriptor)
                continue
            }
            if errno == result {
                error.detail = "\(name): \(why)"
            } else if errno == ENOENT, name == "lock.mdb" {
                error.detail = "lock.mdb: it cannot be made in the directory"
            }
            throw error
        }
        throw error
    }
}
