import Foundation
@testable import LMDB
import LogTesting
import Synchronization
import Testing

@Suite struct EnvironmentTests {
    private func key(_ n: Int) -> [UInt8] { withUnsafeBytes(of: UInt64(n).bigEndian) { Array($0) } }

    /// A write that fills the map inside a read on the same thread cannot
    /// grow it (growing waits for every read of the process to end, that
    /// one too): it fails with `.mapFull` saying why, where it waited for
    /// itself for good, and the same write outside the read grows the map.
    @Test func aWriteInsideAReadThatFillsTheMapIsAnError() throws {
        let directory = try TemporaryDirectory("lmdb-grow-in-read")
        var options = Environment.Options()
        options.mapSize = 64 * 1024
        options.durability = .process
        let environment = try Environment(path: directory.path, options: options)
        defer { environment.close() }
        let table = try #require(try environment.openDatabase("t"))
        let fill = { (txn: borrowing Transaction) throws in
            try txn.put(table, key: [1], value: [UInt8](repeating: 7, count: 1 << 20))
        }
        try environment.read { _ in
            let error = #expect(throws: LMDBError.self) { try environment.write(fill) }
            #expect(error?.code == .mapFull, "\(String(describing: error))")
            #expect(error?.description.contains("write outside the read") == true, "\(String(describing: error))")
        }
        try environment.write(fill)
        #expect(try environment.read { txn in try txn.get(table, key: [1])?.count } == 1 << 20)
    }

    @Test func mapGrowsFromATinyMapWithNoLostEntry() throws {
        let directory = try TemporaryDirectory("lmdb-growth")
        var options = Environment.Options()
        options.mapSize = 64 * 1024
        options.durability = .process
        let initialMapSize: Int
        do {
            let environment = try Environment(path: directory.path, options: options)
            initialMapSize = environment.info().mapSize
            let table = try #require(try environment.openDatabase("t"))
            // 20,000 values of 600 bytes (about 12 MB) in transactions of 500,
            // and one transaction of 5 MB on its own, all through map growth.
            for batch in 0..<40 {
                try environment.write { txn in
                    for n in batch * 500..<(batch + 1) * 500 {
                        try txn.put(table, key: key(n), value: [UInt8](repeating: UInt8(n % 251), count: 600))
                    }
                }
            }
            try environment.write { txn in
                for n in 20_000..<20_010 {
                    try txn.put(table, key: key(n), value: [UInt8](repeating: 9, count: 500_000))
                }
            }
            #expect(environment.info().mapSize > 12 * 1024 * 1024)
            environment.close()
        }
        let reopened = try Environment(path: directory.path, options: options)
        #expect(reopened.info().mapSize > initialMapSize)
        let table = try #require(try reopened.openDatabase("t", create: false))
        let (count, samples, last) = try reopened.read { txn in
            (
                try txn.count(table),
                try stride(from: 0, to: 20_000, by: 997).map { try txn.get(table, key: key($0)) },
                try txn.get(table, key: key(20_009))
            )
        }
        #expect(count == 20_010)
        for (index, n) in stride(from: 0, to: 20_000, by: 997).enumerated() {
            #expect(samples[index] == [UInt8](repeating: UInt8(n % 251), count: 600))
        }
        #expect(last?.count == 500_000)
    }

    @Test func reopenKeepsCommittedData() throws {
        let directory = try TemporaryDirectory("lmdb-reopen")
        do {
            let environment = try Environment(path: directory.path)
            let table = try #require(try environment.openDatabase("t"))
            try environment.write { txn in try txn.put(table, key: [1], value: [42]) }
        }
        let environment = try Environment(path: directory.path)
        let table = try #require(try environment.openDatabase("t", create: false))
        #expect(try environment.read { txn in try txn.get(table, key: [1]) } == [42])
        #expect(try environment.openDatabase("missing", create: false) == nil)
    }

    @Test func aThrowingWriteLeavesNothingBehind() throws {
        struct Stop: Error {}
        let directory = try TemporaryDirectory("lmdb-abort")
        let environment = try Environment(path: directory.path)
        let table = try #require(try environment.openDatabase("t"))
        #expect(throws: Stop.self) {
            try environment.write { txn in
                try txn.put(table, key: [1], value: [1])
                throw Stop()
            }
        }
        #expect(try environment.read { txn in try txn.count(table) } == 0)
    }

    /// A read that has ended holds no snapshot: its pooled transaction is
    /// reset. One kept on its snapshot would keep every page later writes
    /// free from reuse, and the file would grow with each write.
    @Test func anEndedReadHoldsNoSnapshot() throws {
        let directory = try TemporaryDirectory("lmdb-idle-read")
        var options = Environment.Options()
        options.durability = .process
        let environment = try Environment(path: directory.path, options: options)
        let table = try #require(try environment.openDatabase("t"))
        let value = [UInt8](repeating: 7, count: 64 * 1024)
        try environment.write { txn in try txn.put(table, key: [1], value: value) }
        #expect(try environment.read { txn in try txn.get(table, key: [1]) } == value)
        let before = environment.info().usedBytes
        // Each write frees the 64 KiB of overflow pages the one before wrote.
        for round in 0..<200 {
            try environment.write { txn in try txn.put(table, key: [1], value: value.map { $0 &+ UInt8(round % 200) }) }
        }
        let grown = environment.info().usedBytes - before
        // Pinned, the snapshot would keep all of them: about 13 MB.
        #expect(grown < 1_000_000, "the file grew by \(grown) bytes")
        #expect(try environment.read { txn in try txn.get(table, key: [1]) } == value.map { $0 &+ 199 })
    }

    /// Concurrent readers share the pooled read transactions (the lock-free
    /// spare and the locked pool): each sees one snapshot, none is handed to
    /// two readers at once, none is lost (a new one would take another
    /// reader slot), and the environment closes and reopens with the last
    /// write whole.
    @Test func concurrentReadersShareThePool() throws {
        let directory = try TemporaryDirectory("lmdb-readers")
        var options = Environment.Options()
        options.durability = .process
        let environment = try Environment(path: directory.path, options: options)
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in
            try txn.put(table, key: [1], value: key(0))
            try txn.put(table, key: [2], value: key(0))
        }
        let readerCount = 8
        let torn = Mutex(0)
        let done = Atomic<Bool>(false)
        let rounds = Atomic<Int>(0)
        let writer = Thread {
            while !done.load(ordering: .relaxed) {
                let round = rounds.wrappingAdd(1, ordering: .relaxed).newValue
                try? environment.write { txn in
                    try txn.put(table, key: [1], value: key(round))
                    try txn.put(table, key: [2], value: key(round))
                }
            }
        }
        writer.start()
        // Threads of their own: `concurrentPerform` would run as many at
        // once as there are cores.
        let readers = (0..<readerCount).map { _ in
            Thread {
                for _ in 0..<5_000 {
                    let pair = try? environment.read { txn in (try txn.get(table, key: [1]), try txn.get(table, key: [2])) }
                    if pair == nil || pair?.0 != pair?.1 || pair?.0 == nil { torn.withLock { $0 += 1 } }
                }
            }
        }
        readers.forEach { $0.start() }
        while readers.contains(where: { !$0.isFinished }) { usleep(1_000) }
        done.store(true, ordering: .relaxed)
        #expect(torn.withLock { $0 } == 0)
        #expect(rounds.load(ordering: .relaxed) > 1)
        // One slot per transaction ever begun: at most one per reader
        // running at once (the writer takes none).
        #expect(environment.info().readersUsed <= readerCount)
        while !writer.isFinished { usleep(1_000) }
        environment.close()
        let reopened = try Environment(path: directory.path, options: options)
        let table2 = try #require(try reopened.openDatabase("t", create: false))
        let pair = try reopened.read { txn in (try txn.get(table2, key: [1]), try txn.get(table2, key: [2])) }
        #expect(pair.0 != nil && pair.0 == pair.1)
    }

    @Test func nestedTransactionRollsBackAlone() throws {
        struct Stop: Error {}
        let directory = try TemporaryDirectory("lmdb-nested")
        let environment = try Environment(path: directory.path)
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in
            try txn.put(table, key: [1], value: [1])
            #expect(throws: Stop.self) {
                try txn.nested { child in
                    try child.put(table, key: [2], value: [2])
                    throw Stop()
                }
            }
            try txn.nested { child in try child.put(table, key: [3], value: [3]) }
        }
        let values = try environment.read { txn in try [1, 2, 3].map { try txn.get(table, key: [UInt8($0)]) } }
        #expect(values == [[1], nil, [3]])
    }

    @Test func cursorsWalkAndSeekInKeyOrder() throws {
        let directory = try TemporaryDirectory("lmdb-cursor")
        let environment = try Environment(path: directory.path)
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in
            for n in [5, 1, 3, 9] { try txn.put(table, key: key(n), value: [UInt8(n)]) }
        }
        let (seen, moves) = try environment.read { txn in
            var seen: [UInt8] = []
            try txn.forEach(table, from: key(2)) { _, value in
                seen.append(value[0])
                return true
            }
            let moves = try txn.withCursor(table) { cursor in
                [
                    try cursor.last()?.value.first, try cursor.previous()?.value.first,
                    try cursor.seek(atLeast: key(10))?.value.first, try cursor.first()?.value.first,
                ]
            }
            return (seen, moves)
        }
        #expect(seen == [3, 5, 9])
        #expect(moves == [9, 5, nil, 1])
    }

    @Test func appendOutOfOrderIsRefused() throws {
        let directory = try TemporaryDirectory("lmdb-append")
        let environment = try Environment(path: directory.path)
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in try txn.put(table, key: key(2), value: [2], flags: .append) }
        do {
            try environment.write { txn in try txn.put(table, key: key(1), value: [1], flags: .append) }
            Issue.record("an out-of-order append succeeded")
        } catch let error as LMDBError {
            #expect(error.code == .keyExists)
            #expect(error.operation == "mdb_put")
        }
    }

    @Test func openingOneDirectoryTwiceIsRefused() throws {
        let directory = try TemporaryDirectory("lmdb-twice")
        let first = try Environment(path: directory.path)
        // A second spelling of the same directory is the same environment.
        let error = #expect(throws: LMDBError.self) { try Environment(path: directory.path + "/.") }
        #expect(error?.code == .alreadyOpen)
        first.close()
        _ = try Environment(path: directory.path)
    }

    @Test func closedEnvironmentThrows() throws {
        let directory = try TemporaryDirectory("lmdb-closed")
        let environment = try Environment(path: directory.path)
        environment.close()
        let error = #expect(throws: LMDBError.self) { try environment.read { _ in () } }
        #expect(error?.code == .closed)
    }

    /// Two threads close the environment while others read and write: LMDB
    /// closes once (a second `mdb_env_close` would free twice), and each
    /// read or write either completes or fails with `.closed`, never reads
    /// a freed environment.
    @Test func closingTwiceWhileReadingAndWriting() throws {
        let directory = try TemporaryDirectory("lmdb-close-race")
        var options = Environment.Options()
        options.durability = .process
        for _ in 0..<50 {
            let environment = try Environment(path: directory.path, options: options)
            let table = try #require(try environment.openDatabase("t"))
            try environment.write { txn in try txn.put(table, key: key(0), value: [1]) }
            let unexpected = Mutex<[String]>([])
            let done = DispatchSemaphore(value: 0)
            let work: [@Sendable (Int) throws -> Void] = [
                { n in _ = try environment.read { txn in try txn.get(table, key: self.key(n % 8)) } },
                { n in _ = try environment.read { txn in try txn.get(table, key: self.key(n % 8)) } },
                { n in try environment.write { txn in try txn.put(table, key: self.key(n % 8), value: [2]) } },
            ]
            for body in work {
                Thread {
                    for n in 0..<100_000 {
                        do {
                            try body(n)
                        } catch let error as LMDBError where error.code == .closed {
                            break
                        } catch {
                            unexpected.withLock { $0.append("\(error)") }
                            break
                        }
                    }
                    done.signal()
                }.start()
            }
            for _ in 0..<2 {
                Thread {
                    environment.close()
                    done.signal()
                }.start()
            }
            for _ in 0..<work.count + 2 {
                try #require(done.wait(timeout: .now() + 60) == .success, "a close, read or write hung")
            }
            #expect(unexpected.withLock { $0 }.isEmpty)
            #expect(throws: LMDBError.self) { try environment.read { _ in () } }
        }
    }

    /// `info()` after `close()` reads no freed environment: it reports the
    /// map as it was at the close.
    @Test func infoAfterCloseIsTheLastInfo() throws {
        let directory = try TemporaryDirectory("lmdb-closed-info")
        let environment = try Environment(path: directory.path)
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in try txn.put(table, key: [1], value: [UInt8](repeating: 7, count: 100_000)) }
        let before = environment.info()
        environment.close()
        for _ in 0..<3 {
            let after = environment.info()
            #expect(after.mapSize == before.mapSize)
            #expect(after.usedBytes == before.usedBytes)
            #expect(after.lastTransactionID == before.lastTransactionID)
        }
    }

    private final class Flag: Sendable {
        let value = Atomic<Bool>(false)
    }

    /// `info()` while another thread grows the map (which unmaps and maps
    /// it again) never reads a map being replaced.
    @Test func infoDuringMapGrowthIsSafe() throws {
        let directory = try TemporaryDirectory("lmdb-info-growth")
        for _ in 0..<20 {
            try? FileManager.default.removeItem(atPath: directory.appending("data.mdb"))
            try? FileManager.default.removeItem(atPath: directory.appending("lock.mdb"))
            var options = Environment.Options()
            options.mapSize = 64 * 1024
            options.durability = .process
            let environment = try Environment(path: directory.path, options: options)
            let table = try #require(try environment.openDatabase("t"))
            let done = Flag()
            let stopped = DispatchSemaphore(value: 0)
            Thread {
                var calls = 0
                while !done.value.load(ordering: .acquiring) {
                    calls &+= environment.info().usedBytes
                }
                withExtendedLifetime(calls) {}
                stopped.signal()
            }.start()
            for n in 0..<400 {
                try environment.write { txn in try txn.put(table, key: key(n), value: [UInt8](repeating: 1, count: 8_000)) }
            }
            done.value.store(true, ordering: .releasing)
            stopped.wait()
            environment.close()
        }
    }

    /// Growing the map waits for every transaction in this process to end.
    /// Readers on several threads, one read after another, keep some read
    /// open nearly all the time; the growth must still get its turn, or
    /// every write waits for good. The wait below only guards against that
    /// hang.
    @Test func mapGrowthIsNotStarvedByContinuousReaders() throws {
        let directory = try TemporaryDirectory("lmdb-growth-readers")
        var options = Environment.Options()
        options.mapSize = 64 * 1024
        options.durability = .process
        let environment = try Environment(path: directory.path, options: options)
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in try txn.put(table, key: key(0), value: [1]) }
        let readerCount = 6
        let done = Flag()
        let reading = DispatchGroup()
        for _ in 0..<readerCount {
            reading.enter()
            Thread {
                while !done.value.load(ordering: .acquiring) {
                    _ = try? environment.read { txn in try txn.get(table, key: key(0)) }
                }
                reading.leave()
            }.start()
        }
        let written = DispatchSemaphore(value: 0)
        Thread {
            // About 3 MB, past 64 KiB: the map grows several times.
            for n in 1...400 {
                try? environment.write { txn in try txn.put(table, key: key(n), value: [UInt8](repeating: 1, count: 8_000)) }
            }
            written.signal()
        }.start()
        let finished = written.wait(timeout: .now() + 60) == .success
        done.value.store(true, ordering: .releasing)
        reading.wait()
        if !finished { written.wait() }
        #expect(finished, "the writes waited for the readers for 60 s")
        #expect(try environment.read { txn in try txn.count(table) } == 401)
        environment.close()
    }

    @Test func aFileIsNotADirectory() throws {
        let directory = try TemporaryDirectory("lmdb-file")
        let file = directory.appending("plain")
        _ = FileManager.default.createFile(atPath: file, contents: Data("hello".utf8))
        let error = #expect(throws: LMDBError.self) { try Environment(path: file) }
        #expect(error?.code == .notADirectory)
        #expect(error?.description.contains(file) == true)
        #expect(error?.detail == "an environment is a directory holding data.mdb, not a file")
    }

    /// An environment's data file given for the environment (`logtool stat
    /// STORE/data.mdb`) is named with the directory to give instead. Before,
    /// "open (STORE/data.mdb): Not a directory [20]" alone.
    @Test func aDataFileGivenForItsEnvironmentNamesTheDirectory() throws {
        let directory = try TemporaryDirectory("lmdb-data-file")
        try Environment(path: directory.path).close()
        let error = #expect(throws: LMDBError.self) { try Environment(path: directory.appending("data.mdb")) }
        #expect(error?.code == .notADirectory)
        #expect(error?.detail?.hasSuffix("; give the directory it is in, \(directory.path)") == true, "\(String(describing: error))")
    }

    /// `parentDirectory(of:)`, which the open's message and the tools'
    /// checks of a new store's parent share: the root for a path just under
    /// it, nil for a bare name, and no trap on a path of one character.
    @Test func theParentDirectoryOfAPath() {
        #expect(parentDirectory(of: "/srv/store/data.mdb") == "/srv/store")
        #expect(parentDirectory(of: "store/data.mdb") == "store")
        #expect(parentDirectory(of: "/store") == "/")
        #expect(parentDirectory(of: "/") == "/")
        #expect(parentDirectory(of: "s") == nil)
        #expect(parentDirectory(of: "") == nil)
    }

    @Test func aMissingDirectoryIsNotCreatedWhenAskedNotTo() throws {
        let directory = try TemporaryDirectory("lmdb-missing")
        var options = Environment.Options()
        options.createIfMissing = false
        let error = #expect(throws: LMDBError.self) {
            try Environment(path: directory.appending("absent"), options: options)
        }
        #expect(error?.code == .noSuchFile)
        #expect(!FileManager.default.fileExists(atPath: directory.appending("absent")))
    }

    @Test(arguments: [false, true])
    func garbageInTheDataFileIsNotAnEnvironment(readOnly: Bool) throws {
        let directory = try TemporaryDirectory("lmdb-garbage")
        let garbage = Data((0..<16_384).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        _ = FileManager.default.createFile(atPath: directory.appending("data.mdb"), contents: garbage)
        var options = Environment.Options()
        options.readOnly = readOnly
        let error = #expect(throws: LMDBError.self) { try Environment(path: directory.path, options: options) }
        #expect(error?.code == .invalid)
        // Nothing was written over the file we could not read, and nothing
        // was left beside it (LMDB makes its lock file first).
        #expect(FileManager.default.contents(atPath: directory.appending("data.mdb")) == garbage)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["data.mdb"])
    }

    /// A data file cut short (after its two meta pages, or part way) lacks
    /// pages its metadata says are in use; LMDB would read them through its
    /// map and the process would die of SIGBUS. The open says so instead,
    /// naming the file and both sizes, and leaves the file as it was.
    @Test(arguments: [false, true])
    func aTruncatedDataFileIsRefused(readOnly: Bool) throws {
        let directory = try TemporaryDirectory("lmdb-truncated")
        do {
            let environment = try Environment(path: directory.path)
            let table = try #require(try environment.openDatabase("t"))
            try environment.write { txn in
                for n in 0..<200 { try txn.put(table, key: key(n), value: [UInt8](repeating: 1, count: 600)) }
            }
            environment.close()
        }
        let file = directory.appending("data.mdb")
        let whole = try #require(try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int)
        var options = Environment.Options()
        options.readOnly = readOnly
        for size in [8192, whole / 2] {
            let handle = try #require(FileHandle(forUpdatingAtPath: file))
            try handle.truncate(atOffset: UInt64(size))
            try handle.close()
            let error = #expect(throws: LMDBError.self) { try Environment(path: directory.path, options: options) }
            #expect(error?.code == .truncated)
            #expect(error?.description.contains("\(file) is \(size) bytes") == true, "\(String(describing: error))")
            #expect(error?.description.contains("(\(whole) bytes)") == true, "\(String(describing: error))")
            #expect(try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int == size)
        }
    }

    /// A data file may end before the last page its metadata counts and be
    /// whole: LMDB never writes a page that a transaction allocated and
    /// freed again before it committed, and such pages are in the free
    /// list, which no read reaches. Made here by cutting a file back to
    /// where its free tail starts (a value freed at the end of the file,
    /// then commits that move the tree's pages into lower free ones), it
    /// opens and reads whole, read-only and writable, where a check of its
    /// size alone refused it; cut one page further, into a page in use, it
    /// is refused.
    @Test func aFileEndingWhereItsFreePagesStartIsWhole() throws {
        let directory = try TemporaryDirectory("lmdb-free-tail")
        let file = directory.appending("data.mdb")
        let value = [UInt8](repeating: 7, count: 300)
        let info: Environment.Info
        do {
            let environment = try Environment(path: directory.path)
            let table = try #require(try environment.openDatabase("t"))
            try environment.write { txn in for n in 0..<100 { try txn.put(table, key: key(n), value: value) } }
            try environment.write { txn in try txn.put(table, key: key(1_000), value: [UInt8](repeating: 9, count: 400_000)) }
            _ = try environment.write { txn in try txn.delete(table, key: key(1_000)) }
            for _ in 0..<8 {
                try environment.write { txn in
                    try txn.put(table, key: key(0), value: value)
                    try txn.put(table, key: key(99), value: value)
                }
            }
            info = environment.info()
            environment.close()
        }
        let size = try #require(try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int)
        let descriptor = open(file, O_RDONLY)
        let free = try #require(
            FreePages.read(
                DataFile.PageReader(descriptor: descriptor, pageSize: info.pageSize, fileSize: size), transactionID: UInt64(info.lastTransactionID)))
        close(descriptor)
        var tail = UInt64(info.usedBytes / info.pageSize)
        while tail > 0, free.contains(tail - 1) { tail -= 1 }
        try #require(Int(tail) + 50 < info.usedBytes / info.pageSize, "no free tail to cut: \(free.sorted())")
        func cut(to pages: UInt64) throws {
            let handle = try #require(FileHandle(forUpdatingAtPath: file))
            try handle.truncate(atOffset: pages * UInt64(info.pageSize))
            try handle.close()
        }
        try cut(to: tail)
        for readOnly in [true, false] {
            var options = Environment.Options()
            options.readOnly = readOnly
            let environment = try Environment(path: directory.path, options: options)
            let table = try #require(try environment.openDatabase("t", create: false))
            let values = try environment.read { txn in try (0..<100).map { try txn.get(table, key: key($0)) } }
            #expect(values.count == 100 && values.allSatisfy { $0 == value })
            environment.close()
        }
        try cut(to: tail - 1)
        let error = #expect(throws: LMDBError.self) { try Environment(path: directory.path) }
        #expect(error?.code == .truncated)
    }

    /// LMDB takes an empty data file for a new environment and writes one
    /// into it: read-only that fails with a bare EBADF, and an open that may
    /// not create must not. Both are refused, naming the empty file; an open
    /// that may create makes the environment, as in a new directory.
    @Test func anEmptyDataFileIsAnEnvironmentOnlyWhereOneMayBeCreated() throws {
        let directory = try TemporaryDirectory("lmdb-empty-file")
        let file = directory.appending("data.mdb")
        _ = FileManager.default.createFile(atPath: file, contents: Data())
        var readOnly = Environment.Options()
        readOnly.readOnly = true
        var existing = Environment.Options()
        existing.createIfMissing = false
        for options in [readOnly, existing] {
            let error = #expect(throws: LMDBError.self) { try Environment(path: directory.path, options: options) }
            #expect(error?.code == .invalid)
            #expect(error?.description.contains("data.mdb is empty (0 bytes)") == true, "\(String(describing: error))")
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["data.mdb"])
            #expect(FileManager.default.contents(atPath: file)?.isEmpty == true)
        }
        let created = try Environment(path: directory.path)
        defer { created.close() }
        #expect(try created.openDatabase("t") != nil)
    }

    /// A failed copy names the environment being copied, which a failure
    /// on a damaged file is about, and says where the copy was going: a
    /// caller's scratch directory alone told a reader nothing.
    @Test func aFailedCopyNamesTheEnvironmentAndTheDestination() throws {
        let directory = try TemporaryDirectory("lmdb-copy-fails")
        let source = directory.appending("source")
        let environment = try Environment(path: source)
        defer { environment.close() }
        let destination = directory.appending("missing/copy")
        let error = #expect(throws: LMDBError.self) { try environment.copy(to: destination, compact: false) }
        #expect(error?.path == environment.path)
        #expect(error?.description.contains("copying into \(destination)") == true, "\(String(describing: error))")
    }

    @Test func aRefusedOpenKeepsALockFileThatWasThere() throws {
        let directory = try TemporaryDirectory("lmdb-garbage-lock")
        _ = FileManager.default.createFile(atPath: directory.appending("data.mdb"), contents: Data(repeating: 7, count: 8192))
        let lock = Data("someone's lock file".utf8)
        _ = FileManager.default.createFile(atPath: directory.appending("lock.mdb"), contents: lock)
        let error = #expect(throws: LMDBError.self) { try Environment(path: directory.path) }
        #expect(error != nil)
        #expect(FileManager.default.fileExists(atPath: directory.appending("lock.mdb")))
    }

    @Test func anUnwritableDirectoryGivesAClearError() throws {
        let directory = try TemporaryDirectory("lmdb-unwritable")
        let path: String
        if geteuid() == 0 {
            // Permissions do not stop root; sysfs refuses new files even to root.
            path = "/sys/kernel"
            try #require(FileManager.default.fileExists(atPath: path))
        } else {
            path = directory.appending("locked")
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
            chmod(path, 0o555)
        }
        let error = #expect(throws: LMDBError.self) { try Environment(path: path) }
        #expect([LMDBError.Code.permissionDenied, .readOnlyFileSystem].contains(error?.code))
        #expect(error?.description.contains(path) == true)
        // LMDB's error names no file: the detail says which one, and why.
        #expect(error?.detail == "lock.mdb: it cannot be made in the directory", "\(String(describing: error))")
    }
}

extension EnvironmentTests {
    /// Reads see the snapshot of a commit, named by its id: the same id
    /// until the next commit, a greater one after it (an aborted write
    /// changes nothing); a write transaction has none.
    @Test func snapshotIDsNameCommits() throws {
        let directory = try TemporaryDirectory("lmdb-snapshot-id")
        var options = Environment.Options()
        options.durability = .process
        let environment = try Environment(path: directory.path, options: options)
        defer { environment.close() }
        let table = try #require(try environment.openDatabase("t"))
        let first = try #require(try environment.read { txn in txn.snapshotID })
        #expect(try environment.read { txn in txn.snapshotID } == first)
        try environment.write { txn in
            #expect(txn.snapshotID == nil)
            try txn.put(table, key: [1], value: [1])
        }
        let second = try #require(try environment.read { txn in txn.snapshotID })
        #expect(second > first)
        struct Refused: Error {}
        #expect(throws: Refused.self) {
            try environment.write { txn in
                try txn.put(table, key: [2], value: [2])
                throw Refused()
            }
        }
        #expect(try environment.read { txn in txn.snapshotID } == second)
    }
}

extension EnvironmentTests {
    /// The map grows up to `mapSizeMax` and no further. A write that does
    /// not fit there fails with `.mapFull` once the map has reached it,
    /// without running again at that size, and writes that fit go on.
    @Test func theMapGrowsNoFurtherThanItsMaximum() throws {
        let directory = try TemporaryDirectory("lmdb-growth-max")
        var options = Environment.Options()
        options.mapSize = 64 * 1024
        // Not a doubling of the map size: the last step stops at it.
        options.mapSizeMax = 192 * 1024
        options.durability = .process
        let environment = try Environment(path: directory.path, options: options)
        defer { environment.close() }
        let table = try #require(try environment.openDatabase("t"))
        var runs = 0
        let error = #expect(throws: LMDBError.self) {
            try environment.write { txn in
                runs += 1
                try txn.put(table, key: [1], value: [UInt8](repeating: 7, count: 1 << 20))
            }
        }
        #expect(error?.code == .mapFull, "\(String(describing: error))")
        #expect(environment.info().mapSize == options.mapSizeMax)
        // At 64 KiB, 128 KiB and 192 KiB; none more at the maximum.
        #expect(runs == 3)
        try environment.write { txn in try txn.put(table, key: [2], value: [2]) }
        #expect(try environment.read { txn in try txn.get(table, key: [2]) } == [2])
    }

    /// A damaged meta page (a bit of its magic number flipped) beside a
    /// sound one is named as such, with the sound one's transaction, where
    /// LMDB's own error said the file was not LMDB's. Nothing is written
    /// to the file, and no lock file is left beside it.
    @Test(arguments: [0, 1]) func aDamagedMetaPageIsNamedAsSuch(page: Int) throws {
        let directory = try TemporaryDirectory("lmdb-damaged-meta")
        let pageSize: Int
        do {
            let environment = try Environment(path: directory.path)
            defer { environment.close() }
            pageSize = environment.info().pageSize
            let table = try #require(try environment.openDatabase("t"))
            try environment.write { txn in try txn.put(table, key: [1], value: [1]) }
        }
        try FileManager.default.removeItem(atPath: directory.appending("lock.mdb"))
        let file = directory.appending("data.mdb")
        var bytes = try #require(FileManager.default.contents(atPath: file))
        bytes[page * pageSize + 16] ^= 0x01
        try bytes.write(to: URL(fileURLWithPath: file))
        let error = #expect(throws: LMDBError.self) { try Environment(path: directory.path) }
        #expect(error?.code == .metaPageDamaged, "\(String(describing: error))")
        let detail = error?.detail ?? ""
        #expect(detail.contains("\(file): meta page \(page) is damaged"), "\(detail)")
        #expect(detail.contains("meta page \(1 - page) is sound (transaction "), "\(detail)")
        #expect(FileManager.default.contents(atPath: file) == bytes)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["data.mdb"])
    }

    /// A data file holding only its first meta page, which no commit wrote
    /// (a disk that filled while LMDB made the environment, or a process
    /// killed then), holds nothing: an open that may create makes the
    /// environment there, where LMDB alone refused it for good. The first
    /// page of a file that has had commits is not that: it is refused, and
    /// the file is left as it was.
    @Test func aDataFileCutToItsFirstPageIsMadeAgainOnlyWhenNothingWasCommitted() throws {
        let directory = try TemporaryDirectory("lmdb-unfinished-creation")
        let file = directory.appending("data.mdb")
        func cutToFirstPage() throws -> Int {
            let environment = try Environment(path: directory.path)
            let pageSize = environment.info().pageSize
            environment.close()
            let handle = try #require(FileHandle(forUpdatingAtPath: file))
            try handle.truncate(atOffset: UInt64(pageSize))
            try handle.close()
            return pageSize
        }
        _ = try cutToFirstPage()
        do {
            let environment = try Environment(path: directory.path)
            defer { environment.close() }
            let table = try #require(try environment.openDatabase("t"))
            try environment.write { txn in try txn.put(table, key: [1], value: [1]) }
        }
        // Two commits since: the first meta page is the second one's.
        let pageSize = try cutToFirstPage()
        let error = #expect(throws: LMDBError.self) { try Environment(path: directory.path) }
        #expect(error?.code == .truncated, "\(String(describing: error))")
        #expect(error?.detail?.contains("\(file) is \(pageSize) bytes: it ends before meta page 1") == true, "\(String(describing: error))")
        #expect(error?.detail?.contains("meta page 0 is sound (transaction 2)") == true, "\(String(describing: error))")
        #expect(try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int == pageSize)
    }

    /// A data file cut short while the environment is open (by another
    /// process) is named by `checkDataFileWhole`, which reads the file
    /// with pread alone: LMDB's next read through the map would have died
    /// of SIGBUS. Cut below its meta pages, it says so.
    @Test func aDataFileCutWhileOpenIsNamedBeforeAnyRead() throws {
        let directory = try TemporaryDirectory("lmdb-cut-while-open")
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in
            for n in 0..<200 { try txn.put(table, key: key(n), value: [UInt8](repeating: 7, count: 1_000)) }
        }
        try environment.checkDataFileWhole()
        let file = directory.appending("data.mdb")
        let pageSize = environment.info().pageSize
        let lastPage = environment.info().usedBytes / pageSize - 1
        let handle = try #require(FileHandle(forUpdatingAtPath: file))
        defer { try? handle.close() }

        try handle.truncate(atOffset: UInt64(4 * pageSize))
        let cut = #expect(throws: LMDBError.self) { try environment.checkDataFileWhole() }
        #expect(cut?.code == .truncated && cut?.operation == "read", "\(String(describing: cut))")
        #expect(
            cut?.detail == "\(directory.path)/data.mdb is \(4 * pageSize) bytes; its metadata says pages 0...\(lastPage) of "
                + "\(pageSize) bytes are in use (\((lastPage + 1) * pageSize) bytes)", "\(String(describing: cut))")

        // Failed: a read names the cut rather than meet it in the map, and
        // the numbers are the meta page's (closing reads none either).
        let read = #expect(throws: LMDBError.self) { try environment.read { txn in try txn.get(table, key: key(0)) } }
        #expect(read?.code == .truncated && read?.detail == cut?.detail, "\(String(describing: read))")
        #expect(environment.info().usedBytes == (lastPage + 1) * pageSize && environment.info().lastTransactionID == 2)
    }

    /// An environment told to reopen after a failure (`reopensAfterFailure`)
    /// does so before its next transaction. The failure here is a data file
    /// cut while open: reopening it while it is still cut fails, naming
    /// both, and leaves the environment failed; once the file is whole
    /// again, the next read reopens it, its databases keep their handles,
    /// and writes commit.
    @Test func aFailedEnvironmentReopensBeforeItsNextTransaction() throws {
        let directory = try TemporaryDirectory("lmdb-reopen")
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let first = try #require(try environment.openDatabase("first"))
        let second = try #require(try environment.openDatabase("second"))
        environment.reopensAfterFailure(keeping: ["second": second, "first": first])
        try environment.write { txn in
            for n in 0..<200 { try txn.put(first, key: key(n), value: [UInt8](repeating: 7, count: 1_000)) }
            try txn.put(second, key: key(0), value: [2])
        }
        let cut = try DataFileCut(directory: directory.path, toBytes: UInt64(4 * environment.info().pageSize))
        #expect(throws: LMDBError.self) { try environment.checkDataFileWhole() }

        for attempt in 0..<2 {
            let stillCut = #expect(throws: LMDBError.self) { try environment.read { txn in try txn.get(second, key: key(0)) } }
            #expect(stillCut?.code == .environmentFailed && stillCut?.operation == "reopen", "\(String(describing: stillCut))")
            #expect(stillCut?.detail?.contains("data file truncated") == true, "attempt \(attempt): \(String(describing: stillCut))")
            #expect(throws: LMDBError.self) { try environment.write { txn in try txn.put(second, key: key(1), value: [1]) } }
        }
        #expect(environment.reopenCount == 0)

        try cut.mend()
        #expect(try environment.read { txn in try txn.get(second, key: key(0)) } == [2])
        #expect(environment.reopenCount == 1)
        try environment.write { txn in try txn.put(first, key: key(500), value: [5]) }
        #expect(try environment.read { txn in try txn.get(first, key: key(500)) } == [5])
        #expect(try environment.read { txn in try txn.get(first, key: key(199)) }?.count == 1_000)
        #expect(environment.reopenCount == 1)
    }

    /// A failed environment not told to reopen stays failed, also once the
    /// cause is gone; and one whose reopening failed closes safely (LMDB's
    /// handle is gone by then), with the numbers it had (none: the file
    /// was cut below its meta pages).
    @Test func aFailedEnvironmentReopensOnlyWhenToldAndClosesAfterAFailedReopening() throws {
        for reopens in [false, true] {
            let directory = try TemporaryDirectory("lmdb-reopen-\(reopens)")
            let environment = try Environment(path: directory.path)
            let table = try #require(try environment.openDatabase("t"))
            if reopens { environment.reopensAfterFailure(keeping: ["t": table]) }
            try environment.write { txn in try txn.put(table, key: key(1), value: [1]) }
            let cut = try DataFileCut(directory: directory.path, toBytes: 0)
            #expect(throws: LMDBError.self) { try environment.checkDataFileWhole() }
            let read = #expect(throws: LMDBError.self) { try environment.read { txn in try txn.get(table, key: key(1)) } }
            #expect(read?.code == (reopens ? .environmentFailed : .truncated), "\(String(describing: read))")
            try cut.mend()
            if !reopens {
                let still = #expect(throws: LMDBError.self) { try environment.read { txn in try txn.get(table, key: key(1)) } }
                #expect(still?.code == .truncated, "\(String(describing: still))")
            }
            environment.close()
            #expect(environment.info().usedBytes == 0 && environment.info().lastTransactionID == 0)
            let closed = #expect(throws: LMDBError.self) { try environment.read { txn in try txn.get(table, key: key(1)) } }
            #expect(closed?.code == .closed, "\(String(describing: closed))")
            directory.remove()
        }
    }

    /// A data file cut below its meta pages: nothing in it says what was in
    /// use.
    @Test func aDataFileCutToNothingWhileOpenIsNamedBeforeAnyRead() throws {
        let directory = try TemporaryDirectory("lmdb-cut-to-nothing")
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in try txn.put(table, key: key(1), value: [1]) }
        try #require(FileHandle(forUpdatingAtPath: directory.appending("data.mdb"))).truncate(atOffset: 0)
        let empty = #expect(throws: LMDBError.self) { try environment.checkDataFileWhole() }
        #expect(empty?.code == .truncated, "\(String(describing: empty))")
        #expect(
            empty?.detail == "\(directory.path)/data.mdb is 0 bytes: it no longer holds a sound meta page", "\(String(describing: empty))")
        #expect(environment.info().usedBytes == 0)
        #expect(throws: LMDBError.self) { try environment.read { txn in try txn.get(table, key: key(1)) } }
    }

    /// Checks while another thread commits find the file whole every time:
    /// a commit between the check's reads of the meta page and of the
    /// file's size, or of the free list, is no cut.
    @Test func aDataFileBeingWrittenIsWhole() throws {
        let directory = try TemporaryDirectory("lmdb-whole-while-written")
        var options = Environment.Options()
        options.durability = .process
        let environment = try Environment(path: directory.path, options: options)
        defer { environment.close() }
        let table = try #require(try environment.openDatabase("t"))
        let done = Atomic<Bool>(false)
        let writer = Thread {
            defer { done.store(true, ordering: .releasing) }
            // Values of 2 to 3 pages, some deleted again: overflow pages
            // are freed and reused, and the file grows.
            for round in 0..<400 {
                _ = try? environment.write { txn in
                    try txn.put(table, key: key(round), value: [UInt8](repeating: 1, count: 9_000))
                    if round % 3 == 0 { _ = try txn.delete(table, key: key(round / 2)) }
                }
            }
        }
        writer.start()
        var checks = 0
        while !done.load(ordering: .acquiring) || checks == 0 {
            try environment.checkDataFileWhole()
            checks += 1
        }
        #expect(try environment.read { txn in try txn.get(table, key: key(399)) }?.count == 9_000)
    }

    @Test func checkingTheDataFileOfAClosedEnvironmentIsAnError() throws {
        let directory = try TemporaryDirectory("lmdb-whole-closed")
        let environment = try Environment(path: directory.path)
        environment.close()
        let error = #expect(throws: LMDBError.self) { try environment.checkDataFileWhole() }
        #expect(error?.code == .closed, "\(String(describing: error))")
    }

    /// A read-only environment opens the databases it has whatever
    /// `create` says (it can make none): a missing one is nil.
    @Test func aReadOnlyEnvironmentOpensDatabasesWithoutWriting() throws {
        let directory = try TemporaryDirectory("lmdb-read-only-databases")
        do {
            let environment = try Environment(path: directory.path)
            defer { environment.close() }
            let table = try #require(try environment.openDatabase("t"))
            try environment.write { txn in try txn.put(table, key: [1], value: [1]) }
        }
        var options = Environment.Options()
        options.readOnly = true
        let environment = try Environment(path: directory.path, options: options)
        defer { environment.close() }
        let table = try #require(try environment.openDatabase("t"))
        #expect(try environment.read { txn in try txn.get(table, key: [1]) } == [1])
        #expect(try environment.openDatabase("missing") == nil)
    }

    /// `delete` says whether the key was there.
    @Test func deleteSaysWhetherTheKeyWasThere() throws {
        let directory = try TemporaryDirectory("lmdb-delete")
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in try txn.put(table, key: [1], value: [1]) }
        let deleted = try environment.write { txn in [try txn.delete(table, key: [1]), try txn.delete(table, key: [1])] }
        #expect(deleted == [true, false])
    }

    /// A database's pages count the overflow pages of its big values,
    /// which most of its bytes may be in.
    @Test func statisticsCountOverflowPages() throws {
        let directory = try TemporaryDirectory("lmdb-statistics")
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in try txn.put(table, key: [1], value: [UInt8](repeating: 7, count: 100_000)) }
        let statistics = try environment.read { txn in try txn.statistics(table) }
        #expect(statistics.entries == 1)
        #expect(statistics.bytes >= 100_000, "\(statistics)")
    }

    /// `forEach` stops at the first key for which `body` returns false.
    @Test func forEachStopsWhenTheBodySaysSo() throws {
        let directory = try TemporaryDirectory("lmdb-for-each-stop")
        let environment = try Environment(path: directory.path)
        defer { environment.close() }
        let table = try #require(try environment.openDatabase("t"))
        try environment.write { txn in for n in 1...5 { try txn.put(table, key: key(n), value: [UInt8(n)]) } }
        let seen = try environment.read { txn in
            var seen: [UInt8] = []
            try txn.forEach(table) { _, value in
                seen.append(value[0])
                return value[0] < 3
            }
            return seen
        }
        #expect(seen == [1, 2, 3])
    }
}

extension EnvironmentTests {
    /// A `data.mdb` that is a directory is named as one. A read-only open
    /// said only "mdb_env_open (DIR): Is a directory", naming no file (a
    /// directory opens for reading), and a writer "data.mdb: a writer reads
    /// and writes it", as if the file were one it may not write.
    @Test(arguments: [false, true]) func aDataFileThatIsADirectoryIsNamed(readOnly: Bool) throws {
        let directory = try TemporaryDirectory("lmdb-data-directory")
        try FileManager.default.createDirectory(atPath: directory.appending("data.mdb"), withIntermediateDirectories: false)
        var options = Environment.Options()
        options.readOnly = readOnly
        let error = #expect(throws: LMDBError.self) { try Environment(path: directory.path, options: options) }
        #expect(error?.detail == "data.mdb is a directory, where LMDB keeps a file", "\(String(describing: error))")
    }
}
