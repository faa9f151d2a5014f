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
/// The layout is LMDB's on-disk format, data version 1 (liblmdb 0.9), for
/// 64-bit builds, where page numbers and sizes are 8 bytes: `MDB_page`'s
/// 16-byte header, `MDB_meta` after it on pages 0 and 1, `MDB_node`s with
/// 8-byte headers, and the free database's values, which are lists of page
/// numbers with their count first.
enum FreePages {
    private static let magic: UInt32 = 0xBEEF_C0DE
    private static let dataVersion: UInt32 = 1
    private static let pageHeaderSize = 16
    private static let nodeHeaderSize = 8
    private static let branchFlag: UInt16 = 0x01
    private static let leafFlag: UInt16 = 0x02
    private static let bigDataFlag: UInt16 = 0x01
    private static let invalidPage = UInt64.max
    /// `MDB_meta` offsets from the start of a meta page.
    private static let freeDatabaseRoot = 16 + 24 + 40
    private static let metaTransactionID = 16 + 24 + 2 * 48 + 8

    /// The page numbers in the free list of the meta page written by
    /// transaction `transactionID`; nil when the file does not hold that
    /// list whole (a page of it is missing or does not read as one), so
    /// that nothing can be said to be free.
    static func read(descriptor: Int32, pageSize: Int, transactionID: UInt64, fileSize: Int) -> Set<UInt64>? {
        guard MemoryLayout<Int>.size == 8, pageSize >= 256 else { return nil }
        let reader = PageReader(descriptor: descriptor, pageSize: pageSize, fileSize: fileSize)
        // Of the two meta pages, the one LMDB opened with.
        guard let meta = [0, 1].lazy.compactMap({ reader.page($0) }).first(where: { page in
            page.u32(pageHeaderSize) == magic && page.u32(pageHeaderSize + 4) == dataVersion
                && page.u64(metaTransactionID) == transactionID
        }) else { return nil }
        var free: Set<UInt64> = []
        var pending = [meta.u64(freeDatabaseRoot)]
        if pending == [invalidPage] { return free }
        // A damaged tree could loop: no tree has more pages than the file.
        var visits = 0
        while let number = pending.popLast() {
            visits += 1
            guard visits <= fileSize / pageSize, let page = reader.page(number) else { return nil }
            let flags = page.u16(10)
            let lower = Int(page.u16(12))
            guard lower >= pageHeaderSize, lower <= pageSize, flags & (branchFlag | leafFlag) != 0 else { return nil }
            for index in 0..<(lower - pageHeaderSize) / 2 {
                let node = Int(page.u16(pageHeaderSize + 2 * index))
                guard node >= lower, node + nodeHeaderSize <= pageSize else { return nil }
                let low = UInt64(page.u16(node))
                let high = UInt64(page.u16(node + 2))
                let nodeFlags = page.u16(node + 4)
                let keySize = Int(page.u16(node + 6))
                if flags & branchFlag != 0 {
                    pending.append(low | high << 16 | UInt64(nodeFlags) << 32)
                    continue
                }
                let dataSize = Int(low | high << 16)
                let dataStart = node + nodeHeaderSize + keySize
                let list: [UInt8]?
                if nodeFlags & bigDataFlag != 0 {
                    guard dataStart + 8 <= pageSize else { return nil }
                    list = reader.bytes(page: page.u64(dataStart), offset: pageHeaderSize, count: dataSize)
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

    /// Little-endian reads of a byte array (LMDB writes the host's order,
    /// little-endian on every platform this builds for).
    private struct Bytes {
        let bytes: [UInt8]

        func u16(_ at: Int) -> UInt16 { UInt16(bytes[at]) | UInt16(bytes[at + 1]) << 8 }
        func u32(_ at: Int) -> UInt32 { (0..<4).reduce(0) { $0 | UInt32(bytes[at + $1]) << (8 * $1) } }
        func u64(_ at: Int) -> UInt64 { (0..<8).reduce(0) { $0 | UInt64(bytes[at + $1]) << (8 * $1) } }
    }

    private struct PageReader {
        let descriptor: Int32
        let pageSize: Int
        let fileSize: Int

        /// Page `number`, whole, or nil when the file does not hold it.
        func page(_ number: UInt64) -> Bytes? {
            bytes(page: number, offset: 0, count: pageSize).map(Bytes.init)
        }

        /// `count` bytes from `offset` into page `number` (they may run on
        /// into the pages after it, as an overflow value does), or nil when
        /// the file does not hold them all.
        func bytes(page number: UInt64, offset: Int, count: Int) -> [UInt8]? {
            let (start, startOverflow) = number.multipliedReportingOverflow(by: UInt64(pageSize))
            guard !startOverflow, start <= UInt64(fileSize), count >= 0,
                UInt64(offset) + UInt64(count) <= UInt64(fileSize) - start
            else { return nil }
            var buffer = [UInt8](repeating: 0, count: count)
            var done = 0
            while done < count {
                let read = buffer.withUnsafeMutableBytes { raw in
                    pread(descriptor, raw.baseAddress! + done, count - done, off_t(start) + off_t(offset + done))
                }
                guard read > 0 else { return nil }
                done += read
            }
            return buffer
        }
    }
}
