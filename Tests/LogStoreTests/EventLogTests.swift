import Foundation
import LMDB
import LogFormat
@testable import LogStore
import LogTesting
import Testing

func intent(_ n: Int, type: String = "te") -> EntryBody {
    .intent(Intent(.create, idempotencyKey: "key-\(n)", entityType: type, entityID: "\(type)_\(n)", fields: ["n": .int(Int64(n))]))
}

/// Reads the whole log through the checking scanner.
func scanAll(_ log: EventLog, from start: UInt64 = 1, through end: UInt64? = nil) throws -> [Entry] {
    var scanner = log.entries(from: start, through: end)
    var entries: [Entry] = []
    while let entry = try scanner.next() { entries.append(entry) }
    return entries
}

@Suite struct EventLogTests {
    @Test func anEmptyLog() throws {
        let directory = try TemporaryDirectory("log-empty")
        let log = try EventLog(path: directory.path)
        #expect(try log.lastOffset() == 0)
        #expect(try log.entry(at: 1) == nil)
        #expect(try scanAll(log).isEmpty)
        #expect(try scanAll(log, from: 5, through: 9).isEmpty)
    }

    @Test(arguments: Durability.allCases)
    func appendAndReadBack(durability: Durability) async throws {
        let directory = try TemporaryDirectory("log-append")
        let log = try EventLog(path: directory.path, options: .init(durability: durability))
        let first = try await log.append(intent(1))
        let range = try await log.append(contentsOf: (2...5).map { intent($0) })
        #expect(first == 1)
        #expect(range == 2...5)
        #expect(try await log.append(contentsOf: []) == nil)
        let entries = try scanAll(log)
        #expect(entries.map(\.offset) == [1, 2, 3, 4, 5])
        #expect(entries.map(\.body) == (1...5).map { intent($0) })
        #expect(zip(entries, entries.dropFirst()).allSatisfy { $0.timestamp < $1.timestamp })
        #expect(try log.entry(at: 3)?.body == intent(3))
    }

    @Test func sixtyFourConcurrentTasksGetDenseOffsets() async throws {
        let directory = try TemporaryDirectory("log-tasks")
        let log = try EventLog(path: directory.path)
        let perWriter = 40
        let commitsBefore = log.environment.info().lastTransactionID
        let offsets = try await withThrowingTaskGroup(of: [(UInt64, Int)].self) { group in
            for writer in 0..<64 {
                group.addTask {
                    var mine: [(UInt64, Int)] = []
                    for i in 0..<perWriter {
                        let n = writer * perWriter + i
                        mine.append((try await log.append(intent(n)), n))
                    }
                    return mine
                }
            }
            var all: [(UInt64, Int)] = []
            for try await mine in group { all += mine }
            return all
        }
        try checkDense(log, offsets: offsets, count: 64 * perWriter)
        checkShared(log, commitsBefore: commitsBefore, appends: 64 * perWriter)
    }

    @Test func sixtyFourConcurrentThreadsGetDenseOffsets() throws {
        let directory = try TemporaryDirectory("log-threads")
        let log = try EventLog(path: directory.path)
        let perWriter = 40
        let commitsBefore = log.environment.info().lastTransactionID
        let results = ResultBox()
        // Threads of their own: DispatchQueue.concurrentPerform would run
        // the 64 writers on as many threads as there are cores.
        let finished = DispatchGroup()
        for writer in 0..<64 {
            finished.enter()
            Thread {
                defer { finished.leave() }
                for i in 0..<perWriter {
                    let n = writer * perWriter + i
                    do {
                        results.add(try log.appendBlocking(intent(n)), n)
                    } catch {
                        results.fail(error)
                    }
                }
            }.start()
        }
        finished.wait()
        #expect(results.errors.isEmpty)
        try checkDense(log, offsets: results.offsets, count: 64 * perWriter)
        checkShared(log, commitsBefore: commitsBefore, appends: 64 * perWriter)
    }

    /// Concurrent appends shared their commits: at least two to a commit on
    /// average (each commit syncs, while 63 other writers wait to append).
    private func checkShared(_ log: EventLog, commitsBefore: Int, appends: Int) {
        let commits = log.environment.info().lastTransactionID - commitsBefore
        #expect(commits * 2 <= appends, "\(appends) appends took \(commits) commits")
    }

    /// Every offset from 1 to `count` handed out once, and each entry is the
    /// one its writer appended there.
    private func checkDense(_ log: EventLog, offsets: [(UInt64, Int)], count: Int) throws {
        #expect(offsets.count == count)
        #expect(Set(offsets.map(\.0)) == Set(1...UInt64(count)))
        #expect(try log.lastOffset() == UInt64(count))
        let entries = try scanAll(log)
        #expect(entries.count == count)
        for (offset, n) in offsets {
            #expect(entries[Int(offset) - 1].body == intent(n))
        }
    }

    /// A negative `initialMapSize` is refused naming the option the caller
    /// set, before anything is made: the environment below names its own
    /// option, `mapSize`, which the caller never set.
    @Test func aNegativeInitialMapSizeIsNamedAsSet() throws {
        let directory = try TemporaryDirectory("log-map-size")
        let path = directory.appending("store")
        var options = EventLog.Options()
        options.initialMapSize = -1
        let error = #expect(throws: LogStoreError.self) { try Store(path: path, options: options) }
        #expect(error?.code == .invalidArgument, "\(String(describing: error))")
        #expect(error?.detail.contains("initialMapSize -1") == true, "\(String(describing: error))")
        #expect(access(path, F_OK) != 0)
    }

    /// An `initialMapSize` of 0 is LMDB's default, not a mistake: the
    /// store opens and takes appends.
    @Test func aZeroInitialMapSizeOpensWithLMDBsDefault() async throws {
        let directory = try TemporaryDirectory("log-map-size-zero")
        var options = EventLog.Options()
        options.initialMapSize = 0
        let log = try EventLog(path: directory.path, options: options)
        defer { log.close() }
        #expect(try await log.append(intent(1)) == 1)
        #expect(log.mapUsage().mapSize > 0)
    }

    @Test func reopeningKeepsEveryEntry() async throws {
        let directory = try TemporaryDirectory("log-reopen")
        var random = RandomEntries(seed: 31)
        let bodies = (0..<3000).map { _ in random.storeBody() }
        let before: [Entry]
        do {
            let log = try EventLog(path: directory.path)
            for chunk in stride(from: 0, to: bodies.count, by: 250) {
                _ = try await log.append(contentsOf: Array(bodies[chunk..<chunk + 250]))
            }
            before = try scanAll(log)
            log.close()
        }
        let log = try EventLog(path: directory.path)
        #expect(try log.lastOffset() == 3000)
        #expect(try scanAll(log) == before)
        #expect(before.map(\.body) == bodies)
        // Appends continue after the last offset, with later timestamps.
        #expect(try await log.append(intent(1)) == 3001)
        #expect(try log.entry(at: 3001)!.timestamp > before.last!.timestamp)
    }

    @Test func scanningRanges() async throws {
        let directory = try TemporaryDirectory("log-ranges")
        let log = try EventLog(path: directory.path)
        // More than one scan chunk, so ranges cross chunk boundaries.
        let total = EventLog.scanChunkCountMax * 2 + 17
        _ = try await log.append(contentsOf: (1...total).map { intent($0) })
        #expect(try scanAll(log).count == total)
        #expect(try scanAll(log, from: 1, through: 1).map(\.offset) == [1])
        #expect(try scanAll(log, from: 1000, through: 1100).map(\.offset) == Array(1000...1100))
        #expect(try scanAll(log, from: UInt64(total) - 2).map(\.offset) == Array(UInt64(total) - 2...UInt64(total)))
        #expect(try scanAll(log, from: UInt64(total) + 1).isEmpty)
        #expect(try scanAll(log, from: 10, through: 9).isEmpty)
        #expect(try scanAll(log, from: 0, through: 2).map(\.offset) == [1, 2])
    }

    @Test func bigEntriesAreScannedInChunksOfBoundedBytes() async throws {
        let directory = try TemporaryDirectory("log-big-scan")
        let log = try EventLog(path: directory.path)
        // Three of these pass `scanChunkBytesMax`, so a chunk ends early and
        // the next one must start at the right entry.
        let size = EventLog.scanChunkBytesMax * 3 / 8
        let bodies = (1...7).map { n in
            EntryBody.intent(
                Intent(.create, idempotencyKey: "big-\(n)", entityType: "te", entityID: "te_\(n)",
                       fields: ["blob": .bytes([UInt8](repeating: UInt8(n), count: size))]))
        }
        _ = try await log.append(contentsOf: bodies)
        #expect(try scanAll(log).map(\.body) == bodies)
        #expect(try scanAll(log, from: 3, through: 6).map(\.body) == Array(bodies[2...5]))
    }

    @Test func aScanSeesEntriesAppendedWhileItRuns() async throws {
        let directory = try TemporaryDirectory("log-live-scan")
        let log = try EventLog(path: directory.path)
        _ = try await log.append(contentsOf: (1...EventLog.scanChunkCountMax + 1).map { intent($0) })
        var scanner = log.entries()
        for _ in 0..<EventLog.scanChunkCountMax { _ = try scanner.next() }
        _ = try await log.append(intent(0))
        var rest: [UInt64] = []
        while let entry = try scanner.next() { rest.append(entry.offset) }
        #expect(rest == [UInt64(EventLog.scanChunkCountMax) + 1, UInt64(EventLog.scanChunkCountMax) + 2])
    }

    @Test func aBatchIsAllOrNothingAndDoesNotHurtItsGroup() async throws {
        let directory = try TemporaryDirectory("log-batch")
        let log = try EventLog(path: directory.path)
        let oversized = EntryBody.intent(
            Intent(.create, idempotencyKey: "big", entityType: "te", entityID: "te_big",
                   fields: ["blob": .bytes([UInt8](repeating: 1, count: Limits.entryBodyBytesMax))]))
        // Submitted together, so they are likely to share one transaction.
        async let bad = Result(catching: { try await log.append(contentsOf: [intent(1), oversized, intent(2)]) })
        async let good = log.append(contentsOf: [intent(3), intent(4)])
        let (badResult, goodRange) = try await (bad, good)
        #expect(throws: FormatError.self) { try badResult.get() }
        #expect(goodRange == 1...2)
        #expect(try scanAll(log).map(\.body) == [intent(3), intent(4)])
    }

    /// `statistics` counts what this process committed: each commit, the
    /// writes it carried and the entries they appended (the demo's "writes
    /// per commit"). A write the log refuses is not one of them, though its
    /// group still commits; restored entries count as entries.
    @Test func statisticsCountWhatWasCommitted() async throws {
        let directory = try TemporaryDirectory("log-statistics")
        let log = try EventLog(path: directory.path)
        #expect(log.statistics == EventLog.Statistics())
        _ = try await log.append(intent(1))
        _ = try await log.append(contentsOf: (2...4).map { intent($0) })
        #expect(log.statistics == EventLog.Statistics(commits: 2, writes: 2, entries: 4))

        let oversized = EntryBody.intent(
            Intent(.create, idempotencyKey: "big", entityType: "te", entityID: "te_big",
                   fields: ["blob": .bytes([UInt8](repeating: 1, count: Limits.entryBodyBytesMax))]))
        await #expect(throws: FormatError.self) { try await log.append(oversized) }
        #expect(log.statistics.writes == 2)
        #expect(log.statistics.entries == 4)
    }

    /// A log opened read-only refuses every append as not permitted, naming
    /// why, and the log stays as it was.
    @Test func aReadOnlyLogRefusesAppends() async throws {
        let directory = try TemporaryDirectory("log-read-only")
        let writer = try EventLog(path: directory.path)
        _ = try await writer.append(intent(1))
        writer.close()
        let log = try EventLog(path: directory.path, options: .inspecting)
        defer { log.close() }
        let error = await #expect(throws: LMDBError.self) { try await log.append(intent(2)) }
        #expect(error?.code == .permissionDenied)
        #expect(error?.description.contains("store opened read-only") == true, "\(String(describing: error))")
        let blocking = #expect(throws: LMDBError.self) { try log.appendBlocking(contentsOf: [intent(2)]) }
        #expect(blocking?.code == .permissionDenied)
        #expect(try log.lastOffset() == 1)
    }

    @Test func appendsAfterCloseAreRefused() async throws {
        let directory = try TemporaryDirectory("log-closed")
        let log = try EventLog(path: directory.path)
        log.close()
        await #expect(throws: LogStoreError.self) { try await log.append(intent(1)) }
        #expect(throws: LogStoreError.self) { try log.appendBlocking(intent(1)) }
    }
}

extension Result where Failure == any Error {
    init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}

/// Collects results from many threads.
final class ResultBox: @unchecked Sendable {
    private let lock = NSLock()
    private var storedOffsets: [(UInt64, Int)] = []
    private var storedErrors: [any Error] = []

    func add(_ offset: UInt64, _ n: Int) { lock.withLock { storedOffsets.append((offset, n)) } }
    func fail(_ error: any Error) { lock.withLock { storedErrors.append(error) } }
    var offsets: [(UInt64, Int)] { lock.withLock { storedOffsets } }
    var errors: [any Error] { lock.withLock { storedErrors } }
}
