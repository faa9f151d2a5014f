import Foundation

/// LMDB's on-disk format, read from `data.mdb` with `pread`, never through
/// LMDB's map of the file: a page the file lacks is then an answer (nil),
/// not SIGBUS, and a damaged page is bytes to check, not pointers to follow.
///
/// The layout is data version 1 (liblmdb 0.9) for 64-bit builds, where page
/// numbers and sizes are 8 bytes: `MDB_page`'s 16-byte header; `MDB_meta`
/// after it on pages 0 and 1, holding the free and main databases'
/// `MDB_db` records; `MDB_node`s with 8-byte headers. LMDB writes the
/// host's byte order, little-endian on every platform this builds for.
enum DataFile {
    static let magic: UInt32 = 0xBEEF_C0DE
    static let dataVersion: UInt32 = 1
    static let pageHeaderSize = 16
    static let nodeHeaderSize = 8
    /// `mp_flags`.
    static let branchFlag: UInt16 = 0x01
    static let leafFlag: UInt16 = 0x02
    static let overflowFlag: UInt16 = 0x04
    static let metaFlag: UInt16 = 0x08
    /// `mn_flags` of a leaf node.
    static let bigDataFlag: UInt16 = 0x01
    static let subDatabaseFlag: UInt16 = 0x02
    /// `md_root` of an empty database.
    static let invalidPage = UInt64.max
    /// An `MDB_db` record's size, and where the meta page holds the free
    /// database's and the main database's.
    static let databaseRecordSize = 48
    /// `md_root` in an `MDB_db` record.
    static let databaseRootOffset = 40
    /// Where the free database's record is; its `md_pad` holds the page
    /// size (`mm_psize`).
    static let freeDatabaseRecord = 16 + 24
    static let mainDatabaseRecord = freeDatabaseRecord + databaseRecordSize
    /// The map size a meta page records (`mm_mapsize`, after the magic
    /// number, the version and the map's address).
    static let metaMapSize = pageHeaderSize + 16
    /// `MDB_meta`'s last page in use and transaction id.
    static let metaLastPage = mainDatabaseRecord + databaseRecordSize
    static let metaTransactionID = metaLastPage + 8
    /// The free database's flags: its keys are transaction ids, compared
    /// as integers (`MDB_INTEGERKEY`).
    static let integerKeyFlag: UInt16 = 0x08
    /// The longest key LMDB 0.9 writes (`MDB_MAXKEYSIZE`).
    static let keySizeMax = 511
    /// The deepest tree a cursor can walk (`CURSOR_STACK`).
    static let depthMax = 32

    /// What is wrong with a `data.mdb` that LMDB refused as invalid
    /// although one of its two meta pages is sound (LMDB opens a file only
    /// when both are): the other is missing (the file ends before it) or
    /// damaged. Nil when neither is sound (no LMDB file), or both are.
    static func metaPageProblem(in directory: String) -> (missing: Bool, detail: String)? {
        let path = directory + "/data.mdb"
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var file = stat()
        guard fstat(descriptor, &file) == 0 else { return nil }
        // The start of a meta page, as far as its transaction id.
        let reader = PageReader(descriptor: descriptor, pageSize: pageHeaderSize, fileSize: Int(file.st_size))
        let head = { (offset: Int) in reader.bytes(page: 0, offset: offset, count: metaTransactionID + 8).map(Bytes.init) }
        let isMeta = { (page: Bytes?) in
            page.map { $0.u16(10) & metaFlag != 0 && $0.u32(pageHeaderSize) == magic } ?? false
        }
        let first = head(0)
        // The page size is meta page 0's (`mm_psize`), or, that page
        // damaged, the system's, which LMDB makes new files with.
        let pageSize = isMeta(first) ? Int(first!.u32(freeDatabaseRecord)) : Int(sysconf(Int32(_SC_PAGESIZE)))
        let second = pageSize > 0 ? head(pageSize) : nil
        guard isMeta(first) != isMeta(second), let sound = isMeta(first) ? first : second else { return nil }
        let (damaged, kept) = isMeta(first) ? (1, 0) : (0, 1)
        let soundOne = "meta page \(kept) is sound (transaction \(sound.u64(metaTransactionID))), but LMDB opens a file only when both are"
        if (damaged == 0 ? first : second) == nil {
            return (true, "\(path) is \(file.st_size) bytes: it ends before meta page \(damaged) (\(pageSize) bytes from byte \(damaged * pageSize)); " + soundOne)
        }
        return (false, "\(path): meta page \(damaged) is damaged (it lacks a meta page's flag or magic number); " + soundOne)
    }

    /// Little-endian reads of a byte array.
    struct Bytes {
        let bytes: [UInt8]

        func u16(_ at: Int) -> UInt16 { UInt16(bytes[at]) | UInt16(bytes[at + 1]) << 8 }
        func u32(_ at: Int) -> UInt32 { (0..<4).reduce(0) { $0 | UInt32(bytes[at + $1]) << (8 * $1) } }
        func u64(_ at: Int) -> UInt64 { (0..<8).reduce(0) { $0 | UInt64(bytes[at + $1]) << (8 * $1) } }
    }

    struct PageReader {
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

        /// The meta page (0 or 1) written by transaction `transactionID`:
        /// the one a read transaction with that id began from.
        func meta(transactionID: UInt64) -> Bytes? {
            metaPages.first { $0.u64(metaTransactionID) == transactionID }
        }

        /// The meta page (0 or 1) of the newer transaction: the one a read
        /// transaction begun now would begin from. Nil when the file holds
        /// neither.
        func newestMeta() -> Bytes? {
            metaPages.max { $0.u64(metaTransactionID) < $1.u64(metaTransactionID) }
        }

        /// Meta pages 0 and 1, those the file holds with LMDB's magic
        /// number and version.
        private var metaPages: [Bytes] {
            [0, 1].compactMap { page($0) }.filter { page in
                page.u32(pageHeaderSize) == magic && page.u32(pageHeaderSize + 4) == dataVersion
            }
        }
    }
}
