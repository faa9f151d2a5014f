import Foundation

/// What `Environment.checkPages(problemCountMax:)` found.
public struct PageCheckReport: Sendable, Equatable {
    public struct Problem: Sendable, Equatable, CustomStringConvertible {
        /// The table whose tree holds the page: a database's name, `main`
        /// (LMDB's table of the named databases) or `free list`; `data.mdb`
        /// for what concerns the file as a whole.
        public var table: String
        /// The page, when the problem is in one.
        public var page: UInt64?
        public var message: String

        public var description: String { page.map { "\(table) page \($0): \(message)" } ?? "\(table): \(message)" }
    }

    /// Pages read and found sound: the tables' branch, leaf and overflow pages.
    public var pagesChecked: Int
    /// Pages the free list holds.
    public var freePages: Int
    /// The pages the snapshot uses, the two meta pages and free ones among
    /// them (LMDB's last page number, plus one).
    public var pageCount: UInt64
    /// Up to `problemCountMax`; the walk stops there, and a tree it cannot
    /// read on from stops at the first problem.
    public var problems: [Problem]

    /// The first `countMax` problems on one line, then "; and more" when
    /// the report holds more (run the check with a `problemCountMax` above
    /// `countMax` to know).
    func problemsInBrief(countMax: Int) -> String {
        problems.prefix(countMax).map(\.description).joined(separator: "; ") + (problems.count > countMax ? "; and more" : "")
    }

    /// The report of a check that read no table, for `why`.
    static func unread(_ why: String) -> Self {
        PageCheckReport(pagesChecked: 0, freePages: 0, pageCount: 0, problems: [Problem(table: "data.mdb", page: nil, message: why)])
    }
}

/// The walk behind `Environment.checkPages`: every tree of one snapshot,
/// depth first, in key order.
struct PageWalk {
    private typealias Bytes = DataFile.Bytes
    private let reader: DataFile.PageReader
    private let lastPage: UInt64
    private let problemCountMax: Int
    private var problems: [PageCheckReport.Problem] = []
    private var pagesChecked = 0
    /// One bit per page: reached by a tree, and listed free.
    private var used: [UInt64]
    private var free: [UInt64]
    private var freeCount = 0
    /// The named databases the main table lists, walked after it.
    private var named: [(name: String, record: DatabaseRecord)] = []
    /// The free list's page numbers, marked once every tree is walked.
    private var listedFree: [UInt64] = []

    private init(reader: DataFile.PageReader, lastPage: UInt64, problemCountMax: Int) {
        self.reader = reader
        self.lastPage = lastPage
        self.problemCountMax = problemCountMax
        let words = Int(clamping: lastPage / 64 + 1)
        used = [UInt64](repeating: 0, count: words)
        free = used
    }

    /// Checks the snapshot whose meta page transaction `transactionID`
    /// wrote; nil when neither meta page is that one.
    static func check(_ reader: DataFile.PageReader, transactionID: UInt64, problemCountMax: Int) -> PageCheckReport? {
        guard reader.pageSize >= 256, let meta = reader.meta(transactionID: transactionID) else { return nil }
        // Pages past the file's end can only be free ones, which the free
        // list, in the file, lists at 8 bytes each.
        let lastPage = meta.u64(DataFile.metaLastPage)
        let fileSize = UInt64(reader.fileSize)
        guard lastPage <= fileSize / UInt64(reader.pageSize) + fileSize / 8 else {
            return .unread("its meta page says pages 0...\(lastPage) are in use, more than a file of \(fileSize) bytes can hold")
        }
        // The two meta pages are always in use.
        guard lastPage >= 1 else { return .unread("its meta page says pages 0...\(lastPage) are in use, fewer than the two meta pages") }
        var walk = PageWalk(reader: reader, lastPage: lastPage, problemCountMax: problemCountMax)
        walk.run(meta)
        return walk.report
    }

    private var report: PageCheckReport {
        PageCheckReport(pagesChecked: pagesChecked, freePages: freeCount, pageCount: lastPage + 1, problems: problems)
    }

    /// An `MDB_db` record: a tree's root, depth and counts.
    struct DatabaseRecord {
        var flags: UInt16
        var depth: Int
        var branchPages: UInt64
        var leafPages: UInt64
        var overflowPages: UInt64
        var entries: UInt64
        var root: UInt64

        init(_ bytes: DataFile.Bytes, at start: Int) {
            flags = bytes.u16(start + 4)
            depth = Int(bytes.u16(start + 6))
            branchPages = bytes.u64(start + 8)
            leafPages = bytes.u64(start + 16)
            overflowPages = bytes.u64(start + 24)
            entries = bytes.u64(start + 32)
            root = bytes.u64(start + DataFile.databaseRootOffset)
        }
    }

    /// What a tree's leaves hold, which sets how its keys compare.
    private enum Kind {
        /// The free list: transaction ids as 8-byte integer keys, lists of
        /// page numbers as values.
        case free
        /// LMDB's main table: the named databases' records.
        case main
        case plain
    }

    private mutating func run(_ meta: DataFile.Bytes) {
        walkTree("free list", DatabaseRecord(meta, at: DataFile.freeDatabaseRecord), .free)
        walkTree("main", DatabaseRecord(meta, at: DataFile.mainDatabaseRecord), .main)
        for (name, record) in named { walkTree(name, record, .plain) }
        for page in listedFree { markFree(page) }
        guard problems.isEmpty else { return }
        // Each page from 2 on is counted once, so never more than all.
        let accounted = 2 + UInt64(pagesChecked) + UInt64(freeCount)
        if accounted < lastPage + 1 {
            let lost = lastPage + 1 - accounted
            report("data.mdb", nil, "\(lost) of the \(lastPage + 1) pages in use are in no table and not in the free list")
        }
    }

    private var isFull: Bool { problems.count >= problemCountMax }

    private mutating func report(_ table: String, _ page: UInt64?, _ message: String) {
        guard !isFull else { return }
        problems.append(.init(table: table, page: page, message: message))
    }

    /// Sets `page`'s bit in `set`; false when it was set already.
    private static func mark(_ page: UInt64, in set: inout [UInt64]) -> Bool {
        let (word, bit) = (Int(page >> 6), UInt64(1) << (page & 63))
        guard set[word] & bit == 0 else { return false }
        set[word] |= bit
        return true
    }

    private mutating func markFree(_ page: UInt64) {
        guard page >= 2, page <= lastPage else {
            return report("free list", nil, "lists page \(page), outside the pages in use (2...\(lastPage))")
        }
        guard used[Int(page >> 6)] & (UInt64(1) << (page & 63)) == 0 else {
            return report("free list", nil, "lists page \(page), which a table uses")
        }
        guard Self.mark(page, in: &free) else { return report("free list", nil, "lists page \(page) twice") }
        freeCount += 1
    }

    /// The counts a walk finds, to hold against the tree's record.
    private struct Tally: Equatable {
        var branchPages: UInt64 = 0
        var leafPages: UInt64 = 0
        var overflowPages: UInt64 = 0
        var entries: UInt64 = 0
    }

    private mutating func walkTree(_ name: String, _ record: DatabaseRecord, _ kind: Kind) {
        let flags: UInt16 = kind == .free ? DataFile.integerKeyFlag : 0
        guard record.flags == flags else {
            return report(name, nil, "its record has flags 0x\(String(record.flags, radix: 16)), where this library makes its tables with 0x\(String(flags, radix: 16))")
        }
        if record.root == DataFile.invalidPage {
            if record.depth != 0 || record.entries != 0 || record.branchPages | record.leafPages | record.overflowPages != 0 {
                report(name, nil, "its record has no root page, yet a depth of \(record.depth) and \(record.entries) entries")
            }
            return
        }
        guard (1...DataFile.depthMax).contains(record.depth) else {
            return report(name, nil, "its record has a depth of \(record.depth), where a tree has 1 to \(DataFile.depthMax) levels")
        }
        let problemsBefore = problems.count
        var tally = Tally()
        visit(record.root, from: nil, level: 1, of: record.depth, name, kind, bounds: (nil, nil), &tally)
        let stated = Tally(
            branchPages: record.branchPages, leafPages: record.leafPages, overflowPages: record.overflowPages, entries: record.entries)
        if problems.count == problemsBefore, tally != stated {
            report(
                name, nil,
                "its record counts \(stated.branchPages) branch, \(stated.leafPages) leaf and \(stated.overflowPages) overflow pages and \(stated.entries) entries; its tree has \(tally.branchPages), \(tally.leafPages), \(tally.overflowPages) and \(tally.entries)"
            )
        }
    }

    /// A key's place in its page's bytes.
    private typealias KeyRange = Range<Int>

    /// Walks the page `number` (referred to from page `parent`) at `level`
    /// of a tree `depth` deep, whose keys are all at least `bounds.lower`
    /// and below `bounds.upper` (nil: no bound).
    private mutating func visit(
        _ number: UInt64, from parent: UInt64?, level: Int, of depth: Int, _ name: String, _ kind: Kind,
        bounds: (lower: [UInt8]?, upper: [UInt8]?), _ tally: inout Tally
    ) {
        guard !isFull else { return }
        guard number >= 2, number <= lastPage else {
            return report(name, parent, "refers to page \(number), outside the pages in use (2...\(lastPage))")
        }
        guard Self.mark(number, in: &used) else {
            return report(name, parent, "refers to page \(number), which is reached from elsewhere too")
        }
        guard let page = reader.page(number) else {
            return report(name, number, "is past the end of the file (\(reader.fileSize) bytes)")
        }
        pagesChecked += 1
        let isLeaf = level == depth
        let pageSize = reader.pageSize
        let stated = page.u64(0)
        guard stated == number else { return report(name, number, "its header says it is page \(stated)") }
        let flags = page.u16(10)
        let expected = isLeaf ? DataFile.leafFlag : DataFile.branchFlag
        guard flags == expected else {
            let role = isLeaf ? "a leaf" : "a branch"
            return report(name, number, "has flags 0x\(String(flags, radix: 16)), where \(role) page (level \(level) of \(depth)) has 0x\(expected)")
        }
        let (lower, upper) = (Int(page.u16(12)), Int(page.u16(14)))
        guard lower >= DataFile.pageHeaderSize, lower % 2 == 0, lower <= upper, upper <= pageSize else {
            return report(name, number, "its free space runs from byte \(lower) to \(upper), which does not fit a page of \(pageSize) bytes")
        }
        let count = (lower - DataFile.pageHeaderSize) / 2
        guard count > 0 else { return report(name, number, "holds no node") }
        if isLeaf { tally.leafPages += 1 } else { tally.branchPages += 1 }
        var keys: [KeyRange] = []
        keys.reserveCapacity(count)
        var children: [UInt64] = []
        for index in 0..<count {
            let node = Int(page.u16(DataFile.pageHeaderSize + 2 * index))
            guard node >= upper, node + DataFile.nodeHeaderSize <= pageSize else {
                return report(name, number, "node \(index) is at byte \(node), outside the page's nodes (\(upper)..<\(pageSize))")
            }
            let (low, high, nodeFlags) = (UInt64(page.u16(node)), UInt64(page.u16(node + 2)), page.u16(node + 4))
            let keyStart = node + DataFile.nodeHeaderSize
            let key = keyStart..<keyStart + Int(page.u16(node + 6))
            guard key.upperBound <= pageSize else {
                return report(name, number, "node \(index)'s key of \(key.count) bytes runs past the page")
            }
            // A branch's first key is never read (it stands for everything
            // below the second), so it may be empty.
            let leastKeySize = isLeaf || index > 0 ? 1 : 0
            guard (leastKeySize...DataFile.keySizeMax).contains(key.count), kind != .free || key.count == 8 || (!isLeaf && index == 0) else {
                return report(name, number, "node \(index)'s key is \(key.count) bytes")
            }
            if isLeaf || index > 0, let problem = orderProblem(page, key, after: keys.last, isFirst: isLeaf ? index == 0 : index == 1, bounds, kind) {
                return report(name, number, "node \(index)'s key \(problem)")
            }
            keys.append(key)
            if !isLeaf {
                children.append(low | high << 16 | UInt64(nodeFlags) << 32)
                continue
            }
            tally.entries += 1
            guard readLeafValue(page, number, index, key: key, low | high << 16, nodeFlags, name, kind, &tally) else { return }
        }
        for (index, child) in children.enumerated() {
            let lowerBound = index == 0 ? bounds.lower : Array(page.bytes[keys[index]])
            let upperBound = index + 1 < count ? Array(page.bytes[keys[index + 1]]) : bounds.upper
            visit(child, from: number, level: level + 1, of: depth, name, kind, bounds: (lowerBound, upperBound), &tally)
        }
    }

    /// Why `key` is out of order: not past the key before it in its page,
    /// or, the first one, not within the bounds the branch above sets.
    private func orderProblem(
        _ page: Bytes, _ key: KeyRange, after previous: KeyRange?, isFirst: Bool, _ bounds: (lower: [UInt8]?, upper: [UInt8]?), _ kind: Kind
    ) -> String? {
        let bytes = page.bytes[key]
        if !isFirst, let previous, Self.compare(page.bytes[previous], bytes, kind) >= 0 {
            return "is not past the key before it"
        }
        if isFirst, let lower = bounds.lower, Self.compare(lower[...], bytes, kind) > 0 {
            return "sorts before the first key its branch gives it"
        }
        if let upper = bounds.upper, Self.compare(bytes, upper[...], kind) >= 0 {
            return "sorts at or past the key that starts the next branch"
        }
        return nil
    }

    /// LMDB's order: bytes as `memcmp` with the shorter first on a tie
    /// (`mdb_cmp_memn`), or, for the free list, 8-byte integers.
    private static func compare(_ a: ArraySlice<UInt8>, _ b: ArraySlice<UInt8>, _ kind: Kind) -> Int {
        if kind == .free, a.count == 8, b.count == 8 {
            let (x, y) = (integer(a), integer(b))
            return x < y ? -1 : x == y ? 0 : 1
        }
        for (x, y) in zip(a, b) where x != y { return x < y ? -1 : 1 }
        return a.count < b.count ? -1 : a.count == b.count ? 0 : 1
    }

    private static func integer(_ bytes: ArraySlice<UInt8>) -> UInt64 {
        bytes.reversed().reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// Checks a leaf node's value (where it is, and what the free list and
    /// the main table hold in theirs); false when the page cannot be read on.
    private mutating func readLeafValue(
        _ page: Bytes, _ number: UInt64, _ index: Int, key: KeyRange, _ size: UInt64, _ flags: UInt16, _ name: String, _ kind: Kind,
        _ tally: inout Tally
    ) -> Bool {
        let allowed = DataFile.bigDataFlag | (kind == .main ? DataFile.subDatabaseFlag : 0)
        let isBig = flags & DataFile.bigDataFlag != 0
        guard flags & ~allowed == 0, !(isBig && flags & DataFile.subDatabaseFlag != 0) else {
            report(name, number, "node \(index) has flags 0x\(String(flags, radix: 16)), which no node of such a table has")
            return false
        }
        let valueStart = key.upperBound
        let value: [UInt8]?
        if isBig {
            guard valueStart + 8 <= reader.pageSize else {
                report(name, number, "node \(index)'s overflow page number runs past the page")
                return false
            }
            let first = page.u64(valueStart)
            guard checkOverflow(first, size: size, from: number, name, &tally) else { return false }
            // Only the free list's values are read; the rest are the
            // caller's bytes, which LMDB hands over as they are.
            value = kind == .free ? reader.bytes(page: first, offset: DataFile.pageHeaderSize, count: Int(size)) : nil
        } else {
            guard UInt64(valueStart) + size <= UInt64(reader.pageSize) else {
                report(name, number, "node \(index)'s value of \(size) bytes runs past the page")
                return false
            }
            value = Array(page.bytes[valueStart..<valueStart + Int(size)])
        }
        switch kind {
        case .plain: break
        case .free:
            guard let value, value.count >= 8, value.count % 8 == 0, Bytes(bytes: value).u64(0) <= UInt64(value.count / 8 - 1) else {
                report(name, number, "node \(index)'s value is no list of page numbers (\(size) bytes)")
                return false
            }
            let list = Bytes(bytes: value)
            for item in 0..<Int(list.u64(0)) { listedFree.append(list.u64(8 + 8 * item)) }
        case .main:
            guard flags & DataFile.subDatabaseFlag != 0, let value else { break }
            guard value.count == DataFile.databaseRecordSize else {
                report(name, number, "node \(index)'s database record is \(value.count) bytes, not \(DataFile.databaseRecordSize)")
                return false
            }
            let tableName = String(decoding: page.bytes[key], as: UTF8.self)
            named.append((tableName, DatabaseRecord(Bytes(bytes: value), at: 0)))
        }
        return true
    }

    /// Checks the overflow pages of a value of `size` bytes from page
    /// `first` on, and counts them in.
    private mutating func checkOverflow(_ first: UInt64, size: UInt64, from leaf: UInt64, _ name: String, _ tally: inout Tally) -> Bool {
        let pageSize = UInt64(reader.pageSize)
        guard first >= 2, first <= lastPage else {
            report(name, leaf, "refers to overflow page \(first), outside the pages in use (2...\(lastPage))")
            return false
        }
        guard let header = reader.bytes(page: first, offset: 0, count: DataFile.pageHeaderSize).map(Bytes.init) else {
            report(name, first, "is past the end of the file (\(reader.fileSize) bytes)")
            return false
        }
        let needed = (UInt64(DataFile.pageHeaderSize) - 1 + size) / pageSize + 1
        let pages = UInt64(header.u32(12))
        guard header.u64(0) == first, header.u16(10) == DataFile.overflowFlag, pages >= needed, pages - 1 <= lastPage - first else {
            report(
                name, first,
                "is no overflow page for a value of \(size) bytes (it says page \(header.u64(0)), flags 0x\(String(header.u16(10), radix: 16)), \(pages) pages)"
            )
            return false
        }
        guard (first + pages) * pageSize <= UInt64(reader.fileSize) else {
            report(name, first, "its \(pages) pages run past the end of the file (\(reader.fileSize) bytes)")
            return false
        }
        for page in first..<first + pages where !Self.mark(page, in: &used) {
            report(name, leaf, "its overflow page \(page) is reached from elsewhere too")
            return false
        }
        pagesChecked += Int(pages)
        tally.overflowPages += pages
        return true
    }
}
