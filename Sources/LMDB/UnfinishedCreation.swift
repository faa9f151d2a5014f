import Foundation

/// A data file whose creation LMDB began and never finished, found and
/// emptied before an open that may create the environment.
///
/// Why it exists: LMDB creates an environment by writing its two meta pages
/// in one `pwrite`. A disk that fills during that write (a short write,
/// which LMDB reports as `ENOSPC`), or a process killed between the two
/// pages, leaves a data file holding the first page alone, and every later
/// open refuses it as `MDB_INVALID`: the directory stays unusable after the
/// space is freed. That page says no transaction was ever committed, so the
/// file holds nothing to lose; emptied, it becomes a new environment as
/// LMDB makes it, as an empty file left by a process killed before the
/// write does.
///
/// The layout read is `DataFile`'s.
enum UnfinishedCreation {
    /// Empties `directory`'s data file when it is an unfinished creation,
    /// and only while no process has the environment open: LMDB's first
    /// opener holds a write lock on the lock file's first byte while it
    /// creates, and every opener a read lock after, so taking that lock
    /// here shows nobody is there. The lock is released before LMDB opens
    /// the environment (closing a descriptor of the lock file would release
    /// LMDB's own locks on it later).
    /// - Returns: whether the data file was emptied.
    @discardableResult
    static func discard(directory: String) -> Bool {
        let data = open(directory + "/data.mdb", O_RDWR | O_CLOEXEC)
        guard data >= 0 else { return false }
        defer { closeFile(data) }
        guard isUnfinished(data) else { return false }
        let lock = open(directory + "/lock.mdb", O_RDWR | O_CLOEXEC)
        guard lock >= 0 else { return false }
        defer { closeFile(lock) }
        var range = flock()
        range.l_type = Int16(F_WRLCK)
        range.l_whence = Int16(SEEK_SET)
        range.l_start = 0
        range.l_len = 1
        guard fcntl(lock, F_SETLK, &range) == 0, isUnfinished(data) else { return false }
        return ftruncate(data, 0) == 0
    }

    /// Whether the file holds less than two pages and its first page is a
    /// meta page that no committed transaction wrote.
    private static func isUnfinished(_ data: Int32) -> Bool {
        guard MemoryLayout<Int>.size == 8 else { return false }
        var file = stat()
        guard fstat(data, &file) == 0 else { return false }
        // Up to the end of the transaction id.
        let reader = DataFile.PageReader(descriptor: data, pageSize: DataFile.pageHeaderSize, fileSize: Int(file.st_size))
        guard let meta = reader.bytes(page: 0, offset: 0, count: DataFile.metaTransactionID + 8).map(DataFile.Bytes.init) else {
            return false
        }
        let pageSize = UInt64(meta.u32(DataFile.freeDatabaseRecord))
        return meta.u32(DataFile.pageHeaderSize) == DataFile.magic && meta.u32(DataFile.pageHeaderSize + 4) == DataFile.dataVersion
            && meta.u16(10) & DataFile.metaFlag != 0 && meta.u64(DataFile.metaTransactionID) == 0
            && pageSize >= 512 && UInt64(file.st_size) < 2 * pageSize
    }
}

private func closeFile(_ descriptor: Int32) {
    _ = close(descriptor)
}
