import Foundation
@testable import LMDB
import LogTesting
import Testing

/// `Environment.checkPages`: every page of a sound file passes and is
/// counted once; damage inside a page the file holds, which LMDB would
/// follow through its map, is a problem naming the table and the page.
/// The damaged pages are found by reading the file here, not through the
/// check.
@Suite struct PageCheckTests {
    /// LMDB makes its pages the size of the system's.
    private static let pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
    private static let keyCount = 3_000

    private static func key(_ n: Int) -> [UInt8] { Array("key-\(String(format: "%05d", n))".utf8) }

    /// An environment of three tables: `small` (3,000 keys, two levels),
    /// `big` (values on overflow pages) and `gone`. With `changed`, a
    /// second commit empties `gone`, deletes a third of `small` and
    /// overwrites a value of `big` with a smaller one, so that the free
    /// list holds pages (among them the first commit's copies of the pages
    /// it changed: the damage tests make none, so that the one page
    /// holding a key is the one in use).
    private static func makeEnvironment(_ directory: TemporaryDirectory, changed: Bool = false) throws {
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let (small, big, gone) = try (#require(try environment.openDatabase("small")), #require(try environment.openDatabase("big")), #require(try environment.openDatabase("gone")))
        try environment.write { txn in
            for n in 0..<keyCount { try txn.put(small, key: key(n), value: [UInt8](repeating: UInt8(n % 251), count: 100)) }
            for n in 0..<5 { try txn.put(big, key: key(n), value: [UInt8](repeating: UInt8(n), count: 10_000)) }
            for n in 0..<100 { try txn.put(gone, key: key(n), value: [1]) }
        }
        guard changed else { return }
        try environment.write { txn in
            for n in stride(from: 0, to: keyCount, by: 3) { _ = try txn.delete(small, key: key(n)) }
            for n in 0..<100 { _ = try txn.delete(gone, key: key(n)) }
            try txn.put(big, key: key(0), value: [UInt8](repeating: 9, count: 5_000))
        }
    }

    @Test func aSoundFileHasNoProblemAndEveryPageIsCountedOnce() throws {
        let directory = try TemporaryDirectory("page-check-sound")
        try Self.makeEnvironment(directory, changed: true)
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let report = try environment.checkPages()
        #expect(report.problems == [])
        // Every table's pages as LMDB counts them, the free list's and the
        // main table's among them.
        let tables = try [Database(dbi: 0), Database(dbi: 1)] + ["small", "big", "gone"].map { try #require(try environment.openDatabase($0)) }
        let pages = try environment.read { txn in try tables.reduce(0) { $0 + (try txn.statistics($1).pages) } }
        #expect(report.pagesChecked == pages)
        #expect(report.freePages > 0, "the deletes freed pages")
        #expect(UInt64(report.pagesChecked + report.freePages + 2) == report.pageCount)
        #expect(report.pageCount == UInt64(environment.info().usedBytes / Self.pageSize))
    }

    /// A page of the file, found by what it holds.
    private struct FoundPage {
        let number: Int
        var bytes: [UInt8]
        var flags: UInt16 { UInt16(bytes[10]) | UInt16(bytes[11]) << 8 }
        func node(_ index: Int) -> Int { Int(bytes[16 + 2 * index]) | Int(bytes[17 + 2 * index]) << 8 }
        func u64(_ offset: Int) -> UInt64 { (0..<8).reduce(0) { $0 | UInt64(bytes[offset + $1]) << (8 * $1) } }
    }

    private static func pages(_ directory: TemporaryDirectory) throws -> [FoundPage] {
        let data = [UInt8](try Data(contentsOf: URL(fileURLWithPath: directory.path + "/data.mdb")))
        return stride(from: 2 * pageSize, to: data.count, by: pageSize).map { FoundPage(number: $0 / pageSize, bytes: Array(data[$0..<$0 + pageSize])) }
    }

    private static func write(_ page: FoundPage, _ directory: TemporaryDirectory) throws {
        let file = try FileHandle(forWritingTo: URL(fileURLWithPath: directory.path + "/data.mdb"))
        defer { try? file.close() }
        try file.seek(toOffset: UInt64(page.number * pageSize))
        file.write(Data(page.bytes))
    }

    /// Damage to one page, and the problem it must make.
    struct Damage: CustomTestStringConvertible, Sendable {
        let name: String
        /// The page it damages: a leaf of `small`, the branch above them,
        /// or the first page of a value of `big`.
        let target: Target
        enum Target { case leaf, branch, overflow }
        let message: String
        /// Given the page's bytes and where its node 1 is.
        let damage: @Sendable (inout [UInt8], _ node: Int) -> Void
        var testDescription: String { name }
    }

    static let damages: [Damage] = [
        Damage(name: "free space bounds", target: .leaf, message: "its free space runs from byte 65534") { bytes, _ in
            (bytes[12], bytes[13]) = (0xFE, 0xFF)
        },
        Damage(name: "a value's size", target: .leaf, message: "node 1's value of 4294967295 bytes runs past the page") { bytes, node in
            for offset in node..<node + 4 { bytes[offset] = 0xFF }
        },
        Damage(name: "a node's offset", target: .leaf, message: "node 1 is at byte 65535") { bytes, _ in
            (bytes[18], bytes[19]) = (0xFF, 0xFF)
        },
        Damage(name: "a key's size", target: .leaf, message: "node 1's key of 65535 bytes runs past the page") { bytes, node in
            (bytes[node + 6], bytes[node + 7]) = (0xFF, 0xFF)
        },
        Damage(name: "key order", target: .leaf, message: "node 1's key is not past the key before it") { bytes, node in
            bytes[node + 8] = 0x00
        },
        Damage(name: "the page number", target: .leaf, message: "its header says it is page 7777") { bytes, _ in
            (bytes[0], bytes[1], bytes[2], bytes[3]) = (0x61, 0x1E, 0, 0)
        },
        Damage(name: "the page's flags", target: .leaf, message: "has flags 0x0, where a leaf page (level 2 of 2) has 0x2") { bytes, _ in
            (bytes[10], bytes[11]) = (0, 0)
        },
        Damage(name: "a child past the end", target: .branch, message: "refers to page 1099511627775, outside the pages in use") { bytes, node in
            for offset in node..<node + 6 { bytes[offset] = 0xFF }
            (bytes[node + 4], bytes[node + 5]) = (0xFF, 0x00)
        },
        Damage(name: "a child twice", target: .branch, message: "which is reached from elsewhere too") { bytes, node in
            // Node 1's child is node 2's too.
            let next = Int(bytes[20]) | Int(bytes[21]) << 8
            for offset in 0..<6 { bytes[next + offset] = bytes[node + offset] }
        },
        Damage(name: "an overflow page's count", target: .overflow, message: "is no overflow page for a value of 10000 bytes") { bytes, _ in
            (bytes[12], bytes[13], bytes[14], bytes[15]) = (1, 0, 0, 0)
        },
    ]

    @Test(arguments: damages) func damageInsideAPageIsAProblemNamingItsTableAndPage(_ damage: Damage) throws {
        let directory = try TemporaryDirectory("page-check-damage")
        try Self.makeEnvironment(directory)
        let pages = try Self.pages(directory)
        // A leaf of `small` holds its keys, and a branch the first key of
        // each leaf below it: no other table has such keys. Only `big`
        // has values on overflow pages.
        let target = try #require(
            pages.first { page in
                switch damage.target {
                case .leaf: page.flags == 0x02 && page.bytes.firstRange(of: Self.key(1_501)) != nil
                case .branch: page.flags == 0x01 && page.bytes.firstRange(of: Array("key-".utf8)) != nil
                case .overflow: page.flags == 0x04
                }
            })
        var damaged = target
        damage.damage(&damaged.bytes, damaged.node(1))
        try Self.write(damaged, directory)
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let problems = try environment.checkPages().problems
        let problem = try #require(problems.first, "no problem found")
        #expect(problem.table == (damage.target == .overflow ? "big" : "small"), "\(problems)")
        #expect(problem.page == UInt64(target.number), "\(problems)")
        #expect(problem.message.contains(damage.message), "\(problems)")
    }

    /// A meta page whose last page in use is 0, below the two meta pages
    /// themselves, is a problem, not a trap (the page fuzzer's first
    /// finding: the count of pages lost went below zero).
    @Test func aMetaPageCountingFewerPagesThanTheMetaPagesIsAProblem() throws {
        let directory = try TemporaryDirectory("page-check-last-page")
        try Self.makeEnvironment(directory)
        let data = [UInt8](try Data(contentsOf: URL(fileURLWithPath: directory.path + "/data.mdb")))
        var metas = (0..<2).map { FoundPage(number: $0, bytes: Array(data[$0 * Self.pageSize..<($0 + 1) * Self.pageSize])) }
        let newer = metas[0].u64(144) > metas[1].u64(144) ? 0 : 1
        for offset in 136..<144 { metas[newer].bytes[offset] = 0 }
        try Self.write(metas[newer], directory)
        let descriptor = open(directory.path + "/data.mdb", O_RDONLY)
        defer { close(descriptor) }
        let reader = DataFile.PageReader(descriptor: descriptor, pageSize: Self.pageSize, fileSize: data.count)
        let report = PageWalk.check(reader, transactionID: metas[newer].u64(144), problemCountMax: 100)
        #expect(report?.problems.map(\.description) == ["data.mdb: its meta page says pages 0...0 are in use, fewer than the two meta pages"])
    }

    /// Pages that no table reaches and the free list does not hold (the
    /// free list's root forgotten, here) are lost to every later write:
    /// LMDB's own audit counts pages the same way.
    @Test func pagesInNoTableAndNotFreeAreAProblem() throws {
        let directory = try TemporaryDirectory("page-check-lost")
        try Self.makeEnvironment(directory, changed: true)
        let before: PageCheckReport
        do {
            let environment = try Environment(path: directory.path)
            defer { environment.close() }
            before = try environment.checkPages()
        }
        // The newer meta page's record of the free list, made that of an
        // empty tree: its root, depth, page counts and entries.
        let data = [UInt8](try Data(contentsOf: URL(fileURLWithPath: directory.path + "/data.mdb")))
        var metas = (0..<2).map { FoundPage(number: $0, bytes: Array(data[$0 * Self.pageSize..<($0 + 1) * Self.pageSize])) }
        let newer = metas[0].u64(144) > metas[1].u64(144) ? 0 : 1
        let freeListPages = metas[newer].u64(48) + metas[newer].u64(56) + metas[newer].u64(64)
        for offset in 46..<80 { metas[newer].bytes[offset] = 0 }
        for offset in 80..<88 { metas[newer].bytes[offset] = 0xFF }
        try Self.write(metas[newer], directory)
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let lost = UInt64(before.freePages) + freeListPages
        #expect(
            try environment.checkPages().problems.map(\.description) == [
                "data.mdb: \(lost) of the \(before.pageCount) pages in use are in no table and not in the free list"
            ])
    }
}
