import Foundation

/// The pages LMDB's free list holds, read from `data.mdb` with `pread`,
/// never through LMDB's map of the file.
///
/// Why it exists: a data file may be shorter than the pages its metadata
/// says are in use without being damaged. LMDB never writes a page that a
/// transaction allocated and freed again before it committed (a "loose"
/// page); when that page was the last one allocated, the file ends before
/// it, and `mdb_env_copy` copies only what the file holds for that reason.
/// Such pages are in the free list, so no read of the data ever reaches
/// them. A file that lacks a page *not* in the free list was cut short, and
/// the first read of that page through the map would kill the process
/// (SIGBUS). Reading the free list through LMDB could meet a missing page
/// itself; read here, a missing page is an answer, not a crash.
///
/// The layout is `DataFile`'s; the free database's values are lists of
/// page numbers with their count first.
enum FreePages {
    private typealias PageReader = DataFile.PageReader
    private typealias Bytes = DataFile.Bytes

    /// The page numbers in the free list of the meta page written by
    /// transaction `transactionID`; nil when the file does not hold that
    /// list whole (a page of it is missing or does not read as one), so
    /// that nothing can be said to be free.
    static func read(_ reader: DataFile.PageReader, transactionID: UInt64) -> Set<UInt64>? {
        let (pageSize, fileSize) = (reader.pageSize, reader.fileSize)
        guard MemoryLayout<Int>.size == 8, pageSize >= 256 else { return nil }
        // Of the two meta pages, the one LMDB opened with.
        guard let meta = reader.meta(transactionID: transactionID) else { return nil }
        var free: Set<UInt64> = []
        var pending = [meta.u64(DataFile.freeDatabaseRecord + DataFile.databaseRootOffset)]
        if pending == [DataFile.invalidPage] { return free }
        // A damaged tree could loop: no tree has more pages than the file.
        var visits = 0
        while let number = pending.popLast() {
            visits += 1
            guard visits <= fileSize / pageSize, let page = reader.page(number) else { return nil }
            let flags = page.u16(10)
            let lower = Int(page.u16(12))
            guard lower >= DataFile.pageHeaderSize, lower <= pageSize, flags & (DataFile.branchFlag | DataFile.leafFlag) != 0 else { return nil }
            for index in 0..<(lower - DataFile.pageHeaderSize) / 2 {
                let node = Int(page.u16(DataFile.pageHeaderSize + 2 * index))
                guard node >= lower, node + DataFile.nodeHeaderSize <= pageSize else { return nil }
                let low = UInt64(page.u16(node))
                let high = UInt64(page.u16(node + 2))
                let nodeFlags = page.u16(node + 4)
                let keySize = Int(page.u16(node + 6))
                if flags & DataFile.branchFlag != 0 {
                    pending.append(low | high << 16 | UInt64(nodeFlags) << 32)
                    continue
                }
                let dataSize = Int(low | high << 16)
                let dataStart = node + DataFile.nodeHeaderSize + keySize
                let list: [UInt8]?
                if nodeFlags & DataFile.bigDataFlag != 0 {
                    guard dataStart + 8 <= pageSize else { return nil }
                    list = reader.bytes(page: page.u64(dataStart), offset: DataFile.pageHeaderSize, count: dataSize)
                } else {
                    guard dataStart + dataSize <= pageSize else { return nil }
                    list = Array(page.bytes[dataStart..<dataStart + dataSize])
                }
                guard let list, list.count >= 8 else { return nil }
                let ids = Bytes(bytes: list)
                let count = ids.u64(0)
                guard count <= UInt64(list.count / 8 - 1) else { return nil }
                for id in 0..<Int(count) { free.insert(ids.u64(8 + 8 * id)) }
            }
        }
        return free
    }
}
