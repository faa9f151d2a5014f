import Foundation
import LMDB
import LogFormat
@testable import LogStore
import LogTesting
import Synchronization
import Testing

/// A write job that holds the writer thread until `open()`: what queues
/// behind it waits, and the test acts meanwhile.
private final class Gate: Sendable {
    private let opened = DispatchSemaphore(value: 0)
    let started: AsyncStream<Void>
    private let start: AsyncStream<Void>.Continuation

    init() { (started, start) = AsyncStream.makeStream(of: Void.self) }

    /// Starts the job and returns once the writer runs it.
    func hold(_ log: EventLog) async -> Task<Void, any Error> {
        let job = Task {
            try await log.perform { _, _ in
                self.start.yield()
                self.opened.wait()
            }
        }
        for await _ in started { break }
        return job
    }

    func open() { opened.signal() }
}

/// Yields until `condition` holds: false when it still does not after
/// `yieldsMax` yields, which lets the tasks it waits for run many times
/// over (a guard against a hang, not a measure of time).
private func yieldUntil(_ yieldsMax: Int = 1_000_000, _ condition: () -> Bool) async -> Bool {
    for _ in 0..<yieldsMax {
        if condition() { return true }
        await Task.yield()
    }
    return condition()
}

/// The caller of a write learns its outcome: a returned call committed, a
/// thrown one did not, whatever happens to the caller's task or the store.
@Suite struct WriteOutcomeTests {
    /// A task cancelled before it writes still writes: the call returns the
    /// committed write's value, not `CancellationError`.
    @Test func aWriteInACancelledTaskCommitsAndSaysSo() async throws {
        var fixture = try StoreFixture("write-cancelled-before")
        let store = fixture.store
        let write = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await store.create(type: "te", id: "a", fields: [:])
        }
        #expect(try await write.value == "a")
        #expect(try store.get(type: "te", id: "a") != nil)
        try fixture.reopen()
        #expect(try fixture.store.get(type: "te", id: "a") != nil)
        fixture.store.close()
    }

    /// A task cancelled while its write waits in the queue: the write
    /// commits, and the call returns as it would have.
    @Test func aWriteWhoseTaskIsCancelledWhileQueuedCommitsAndSaysSo() async throws {
        var fixture = try StoreFixture("write-cancelled-queued")
        let store = fixture.store
        let gate = Gate()
        let held = await gate.hold(store.log)
        var batch = WriteBatch()
        try batch.create(type: "te", id: "a", fields: [:])
        try batch.create(type: "te", id: "b", fields: [:])
        let write = Task { [batch] in try await store.write(batch) }
        try #require(await yieldUntil { store.log.queuedWriteCount == 1 })
        write.cancel()
        gate.open()
        try await held.value
        try await write.value
        #expect(try store.count(type: "te") == 2)
        try fixture.reopen()
        #expect(try fixture.store.count(type: "te") == 2)
        fixture.store.close()
    }

    /// `close()` with writes queued behind a running one: it waits for all
    /// of them, each caller hears its commit, and a write after it is
    /// refused with `.closed`; after a reopen every acknowledged write is
    /// there.
    @Test func closeCommitsTheQueuedWritesAndRefusesLaterOnes() async throws {
        var fixture = try StoreFixture("write-close-queued")
        let store = fixture.store
        let gate = Gate()
        let held = await gate.hold(store.log)
        let writes = (0..<20).map { n in Task { try await store.create(type: "te", id: "w\(n)", fields: [:]) } }
        try #require(await yieldUntil { store.log.queuedWriteCount == writes.count })
        let closed = DispatchSemaphore(value: 0)
        Thread {
            store.close()
            closed.signal()
        }.start()
        // The close must not return before the queued writes commit.
        try #require(await yieldUntil { !store.log.isOpenForWrites })
        gate.open()
        try await held.value
        for (n, write) in writes.enumerated() { #expect(try await write.value == "w\(n)") }
        #expect(closed.wait(timeout: .now() + 60) == .success, "close hung")
        await #expect(throws: LogStoreError.self) { try await store.create(type: "te", id: "late", fields: [:]) }
        fixture.store = try Store(path: fixture.directory.path, options: .init(durability: .process))
        #expect(try fixture.store.count(type: "te") == writes.count)
        fixture.store.close()
    }

    /// A rebuild whose task is cancelled part way stops at the end of the
    /// chunk under way and drops what it built: the tables in use stay, no
    /// rebuild is left for the next open, and the next rebuild runs whole.
    @Test func aRebuildWhoseTaskIsCancelledStopsAndDropsItsWork() async throws {
        let fixture = try StoreFixture("write-cancelled-rebuild")
        let store = fixture.store
        for n in 0..<100 { try await store.create(type: "te", id: "e\(n)", fields: ["n": .int(Int64(n))]) }
        let expected = try store.derivedTables()
        let chunks = Mutex(0)
        let rebuild = Task {
            try await store.rebuildProjections(entriesPerTransaction: 10) {
                chunks.withLock { $0 += 1 }
                withUnsafeCurrentTask { $0?.cancel() }
            }
        }
        await #expect(throws: CancellationError.self) { try await rebuild.value }
        #expect(chunks.withLock { $0 } == 1)
        #expect(try store.rebuildWatermark() == nil)
        #expect(try store.derivedTables() == expected)
        try await store.rebuildProjections(entriesPerTransaction: 10)
        #expect(try store.derivedTables() == expected)
        store.close()
    }
}

/// A store whose environment failed opens it again by itself before its
/// next read or write, keeping the app's `Store` (and everything holding
/// it) usable. The failure here is its data file cut while open, which a
/// test can make and mend in-process; failed commits (a full disk, an I/O
/// error) are made in a child process by the crash harness (`full-disk`,
/// `io-faults`).
@Suite struct StoreReopeningTests {
    @Test func aStoreReadsAndWritesAgainOnceItsFailureIsMended() async throws {
        var fixture = try StoreFixture("store-reopening", durability: .full)
        let store = fixture.store
        for n in 0..<50 { _ = try await store.create(type: "te", id: "e\(n)", fields: ["n": .int(Int64(n))]) }
        let lastBefore = try store.log.lastOffset()
        let cut = try DataFileCut(directory: fixture.directory.path, toBytes: 4_096 * 3)
        #expect(throws: LMDBError.self) { try store.log.checkDataFileWhole() }

        // Still cut: each call tries to reopen, and fails naming the cut.
        let read = #expect(throws: LMDBError.self) { try store.get(type: "te", id: "e1") }
        #expect(read?.code == .environmentFailed && read?.detail?.contains("data file truncated") == true, "\(String(describing: read))")
        await #expect(throws: LMDBError.self) { try await store.create(type: "te", id: "lost", fields: [:]) }

        try cut.mend()
        #expect(try store.get(type: "te", id: "e49")?.fields == ["n": 49])
        #expect(try store.log.lastOffset() == lastBefore)
        _ = try await store.create(type: "te", id: "after", fields: [:])
        #expect(try store.log.lastOffset() == lastBefore + 1)
        #expect(try store.count(type: "te") == 51 && store.get(type: "te", id: "lost") == nil)
        #expect(try await store.projectionProblems().isEmpty)
        try fixture.reopen()
        #expect(try fixture.store.count(type: "te") == 51)
        fixture.store.close()
    }
}

extension StoreReopeningTests {
    /// Failures and reopenings while readers on threads of their own and a
    /// writer keep going: no read or write sees anything but the store's
    /// data or an `.environmentFailed` that raced with a failure, every
    /// acknowledged write is there at the end, at dense offsets, and the
    /// tables equal a replay. (A reopening waits for the transactions under
    /// way and aborts the pooled ones; a reader that comes during one waits
    /// for it.)
    @Test func readersAndAWriterGoOnThroughRepeatedReopenings() async throws {
        var fixture = try StoreFixture("store-reopening-concurrent")
        let store = fixture.store
        for n in 0..<100 { _ = try await store.create(type: "te", id: "seed\(n)", fields: ["n": .int(Int64(n))]) }
        let stop = Atomic(false)
        let unexpected = Mutex<[String]>([])
        let reads = Atomic(0)
        let finished = DispatchGroup()
        for reader in 0..<3 {
            finished.enter()
            Thread.detachNewThread {
                defer { finished.leave() }
                var n = 0
                while !stop.load(ordering: .relaxed) {
                    do {
                        let id = "seed\((n * 7 + reader) % 100)"
                        guard try store.get(type: "te", id: id) != nil, try store.count(type: "te") >= 100 else {
                            unexpected.withLock { $0.append("reader \(reader): \(id) missing") }
                            return
                        }
                        reads.add(1, ordering: .relaxed)
                    } catch let error as LMDBError where error.code == .environmentFailed {
                    } catch {
                        unexpected.withLock { $0.append("reader \(reader): \(error)") }
                        return
                    }
                    n += 1
                }
            }
        }
        let writer = Task {
            var acknowledged: [String] = []
            var n = 0
            while !stop.load(ordering: .relaxed) {
                do {
                    acknowledged.append(try await store.create(type: "te", id: "w\(n)", fields: [:]))
                } catch let error as LMDBError where error.code == .environmentFailed {
                } catch {
                    unexpected.withLock { $0.append("writer: \(error)") }
                    break
                }
                n += 1
            }
            return acknowledged
        }
        for _ in 0..<200 {
            store.log.environment.failForTesting()
            try await Task.sleep(for: .microseconds(500))
        }
        stop.store(true, ordering: .relaxed)
        let acknowledged = await writer.value
        await withCheckedContinuation { done in finished.notify(queue: .global()) { done.resume() } }
        #expect(unexpected.withLock { $0 }.isEmpty, "\(unexpected.withLock { $0 })")
        #expect(store.log.environment.reopenCount > 0 && reads.load(ordering: .relaxed) > 0 && !acknowledged.isEmpty)
        for id in acknowledged { #expect(try store.get(type: "te", id: id) != nil, "\(id)") }
        #expect(try store.log.lastOffset() == UInt64(100 + acknowledged.count))
        #expect(try await store.projectionProblems().isEmpty)
        try fixture.reopen()
        #expect(try fixture.store.count(type: "te") == 100 + acknowledged.count)
        fixture.store.close()
    }
}
