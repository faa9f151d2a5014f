import Foundation
import LMDB
import LogFormat
@testable import LogStore
import LogTesting
import Synchronization
import Testing

/// Opens the store at `path` once it is closed (a store still open in this
/// process refuses a second open); nil when it stays open for `seconds`.
private func openOnceClosed(_ path: String, seconds: Double = 60) async throws -> Store? {
    let attempts = Int(seconds * 100)
    for _ in 0..<attempts {
        do {
            return try Store(path: path, options: .init(durability: .process))
        } catch let error as LMDBError where error.code == .alreadyOpen {
            try await Task.sleep(for: .milliseconds(10))
        }
    }
    return nil
}

@Suite struct StoreCloseTests {
    /// A write job lets go of the store before its caller hears the
    /// outcome, so the caller's reference is the last one: a store dropped
    /// right after a write is released (and closed) at once, by its caller.
    /// A job that kept the store would release it later on the writer
    /// thread (after a failed write) or its completion queue.
    @Test(arguments: [true, false])
    func aStoreDroppedAfterAWriteIsReleasedAtOnce(writeFails: Bool) async throws {
        let directory = try TemporaryDirectory("store-release-after-write")
        for round in 0..<50 {
            var store: Store? = try Store(path: directory.path, options: .init(durability: .process))
            if writeFails {
                _ = try? await store?.update(type: "te", id: "missing", changes: ["n": 1])
            } else {
                _ = try? await store?.create(type: "te", id: "r\(round)", fields: [:])
            }
            weak let released = store
            store = nil
            try #require(released == nil, "round \(round): a write job still held the store")
        }
    }

    /// A log closed from inside its own write (where its `deinit` runs
    /// should the writer drop its last reference) neither waits for the
    /// writer, which would wait for itself, nor closes the environment
    /// under the open transaction: it closes once the writer stops.
    @Test func aLogClosedInsideItsOwnWriteCloses() async throws {
        let directory = try TemporaryDirectory("log-close-inside-write")
        let log = try EventLog(path: directory.path, options: .init(durability: .process))
        // Not awaited before the reopen, which bounds the wait: a writer
        // that waits for itself never finishes this write.
        let write = Task.detached {
            try await log.perform { txn, context in
                log.close()
                return try context.append(intent(1), in: txn)
            }
        }
        let reopened = try await openOnceClosed(directory.path)
        try #require(reopened != nil, "the log never closed")
        #expect(try await write.value == 1)
        #expect(try reopened?.log.lastOffset() == 1)
        reopened?.close()
    }

    /// Two threads close a store while others write and read. Each close
    /// returns only when the writes it found queued are committed; a write
    /// either commits (and is there after a reopen) or is refused with
    /// `LogStoreError.closed`; a read either reads or fails with
    /// `LMDBError.closed`. Nothing traps, nothing hangs.
    @Test func closingTwiceWhileWritingAndReading() async throws {
        let directory = try TemporaryDirectory("store-close-race")
        for round in 0..<20 {
            // Durable commits (an fsync each) keep writes queued long enough
            // for the second close to find some.
            let store = try Store(path: directory.path, options: .init(durability: .full))
            let writers = (0..<4).map { writer in
                Task.detached { () -> (ids: [String], errors: [String]) in
                    var ids: [String] = []
                    for n in 0..<1_000 {
                        do {
                            ids.append(try await store.create(type: "te", id: "r\(round)w\(writer)n\(n)", fields: [:]))
                        } catch let error as LogStoreError where error.code == .closed {
                            return (ids, [])
                        } catch {
                            return (ids, ["\(error)"])
                        }
                    }
                    return (ids, [])
                }
            }
            let readerErrors = Mutex<[String]>([])
            let threadsDone = DispatchSemaphore(value: 0)
            Thread {
                for n in 0..<100_000 {
                    do {
                        _ = try store.get(type: "te", id: "r\(round)w0n\(n % 50)")
                    } catch let error as LMDBError where error.code == .closed {
                        break
                    } catch {
                        readerErrors.withLock { $0.append("\(error)") }
                        break
                    }
                }
                threadsDone.signal()
            }.start()
            // Close once the writers are under way.
            var waits = 0
            while try store.log.lastOffset() < 8, waits < 5_000 {
                waits += 1
                try await Task.sleep(for: .milliseconds(1))
            }
            for _ in 0..<2 {
                Thread {
                    store.close()
                    threadsDone.signal()
                }.start()
            }
            for _ in 0..<3 {
                try #require(threadsDone.wait(timeout: .now() + 60) == .success, "a close or a read hung")
            }
            var committed: [String] = []
            for writer in writers {
                let (ids, errors) = await writer.value
                #expect(errors.isEmpty, "round \(round): a write failed otherwise than refused: \(errors)")
                committed += ids
            }
            #expect(readerErrors.withLock { $0 }.isEmpty)
            let reopened = try Store(path: directory.path, options: .init(durability: .process))
            for id in committed { #expect(try reopened.get(type: "te", id: id) != nil, "round \(round): \(id) lost") }
            reopened.close()
        }
    }
}

/// Runs `body` on a thread of its own; false when it has not returned
/// within `seconds` (a hang).
private func finishes(within seconds: Double = 60, _ body: @escaping @Sendable () -> Void) -> Bool {
    let done = DispatchSemaphore(value: 0)
    Thread {
        body()
        done.signal()
    }.start()
    return done.wait(timeout: .now() + seconds) == .success
}

extension StoreCloseTests {
    /// A store closed between two chunks of `rebuildProjections` refuses the
    /// next chunk with `.closed`; the next open finishes the rebuild from
    /// the watermark the last chunk left, to the same tables.
    @Test func closeDuringARebuild() async throws {
        let directory = try TemporaryDirectory("life-rebuild-close")
        var store = try Store(path: directory.path, options: .init(durability: .process))
        // Many one-entry chunks, so the close comes long before the end.
        _ = try store.log.appendBlocking(contentsOf: (1...3_000).map { intent($0) })
        try await store.create(type: "te", id: "last", fields: [:])
        let expected = try store.derivedTables()
        let rebuild = Task.detached { [store] in try await store.rebuildProjections(entriesPerTransaction: 1) }
        var waits = 0
        while try store.rebuildWatermark() ?? 0 < 50, waits < 10_000 {
            waits += 1
            try await Task.sleep(for: .milliseconds(1))
        }
        let closing = store
        let closed = finishes { closing.close() }
        #expect(closed, "close hung")
        do {
            try await rebuild.value
            Issue.record("the rebuild finished after close")
        } catch let error as LogStoreError {
            #expect(error.code == .closed, "\(error)")
        } catch {
            Issue.record("unexpected \(error)")
        }
        store = try Store(path: directory.path, options: .init(durability: .process))
        #expect(try store.derivedTables() == expected)
        store.close()
    }

    /// Streams subscribed after `close()` end at once.
    @Test func streamsSubscribedAfterCloseEnd() async throws {
        let fixture = try StoreFixture("life-streams")
        try await fixture.store.create(type: "te", fields: [:])
        fixture.store.close()
        #expect(await ends(fixture.store.changes(type: "te")))
        #expect(await ends(fixture.store.events()))
        #expect(await ends(fixture.store.intentCommits()))
    }

    /// A read-only open of a store this process has open for writing is
    /// refused (`.alreadyOpen`) and leaves the writer as it was.
    @Test func readOnlyOpenWhileOpenForWriting() async throws {
        let fixture = try StoreFixture("life-readonly")
        try await fixture.store.create(type: "te", id: "a", fields: [:])
        #expect(throws: LMDBError.self) { try Store(path: fixture.directory.path, options: .init(readOnly: true)) }
        try await fixture.store.create(type: "te", id: "b", fields: [:])
        #expect(try fixture.store.count(type: "te") == 2)
        fixture.store.close()
        let reader = try Store(path: fixture.directory.path, options: .init(readOnly: true))
        #expect(try reader.count(type: "te") == 2)
        reader.close()
        let writer = try Store(path: fixture.directory.path, options: .init(durability: .process))
        #expect(try writer.count(type: "te") == 2)
        writer.close()
    }

    /// Two stores in two directories, closed at once from two threads while
    /// they write: neither close waits for the other, and both reopen.
    @Test func twoStoresClosedConcurrently() async throws {
        for round in 0..<20 {
            let a = try TemporaryDirectory("life-two-a")
            let b = try TemporaryDirectory("life-two-b")
            let stores = [try Store(path: a.path, options: .init(durability: .full)), try Store(path: b.path, options: .init(durability: .full))]
            let writers = stores.map { store in
                Task.detached {
                    for n in 0..<200 {
                        do { try await store.create(type: "te", id: "n\(n)", fields: [:]) } catch { return }
                    }
                }
            }
            try await Task.sleep(for: .milliseconds(2))
            let done = DispatchSemaphore(value: 0)
            for store in stores {
                Thread {
                    store.close()
                    done.signal()
                }.start()
            }
            for _ in stores { try #require(done.wait(timeout: .now() + 60) == .success, "round \(round): a close hung") }
            for writer in writers { await writer.value }
            for path in [a.path, b.path] {
                let reopened = try Store(path: path, options: .init(durability: .process))
                reopened.close()
            }
        }
    }

    /// An open refused after the writer started (a watermark past the log)
    /// closes what it opened: the next open meets the same error, not
    /// `.alreadyOpen` or `.writerActive`.
    @Test func aStoreThatFailsToOpenCanBeOpenedAgain() async throws {
        let directory = try TemporaryDirectory("life-open-fails")
        let store = try Store(path: directory.path, options: .init(durability: .process))
        try await store.create(type: "te", fields: [:])
        _ = try await store.log.perform { txn, _ in try store.markWatermark(99, txn) }
        store.close()
        for _ in 0..<3 {
            do {
                _ = try Store(path: directory.path, options: .init(durability: .process))
                Issue.record("opened")
            } catch let error as LogStoreError {
                #expect(error.code == .corruptEntry, "\(error)")
            } catch {
                Issue.record("\(error)")
            }
        }
    }

    /// A compaction queued as the store closes commits whole or not at all:
    /// the reopened store's tables are what a replay of its log gives.
    @Test func compactWhileClosing() async throws {
        for round in 0..<10 {
            let directory = try TemporaryDirectory("life-compact-close")
            let store = try Store(path: directory.path, options: .init(durability: .process))
            for n in 0..<100 { try await store.create(type: "te", id: "e\(n)", fields: [:]) }
            let outbox = try store.outbox()
            try await store.record(outbox.prefix(80).map { ($0.offset, PushOutcome.acknowledged(.applied, serverVersion: 1)) })
            let last = try store.log.lastOffset()
            let compaction = Task.detached { try await store.compact(below: last) }
            let closed = finishes { store.close() }
            #expect(closed)
            _ = try? await compaction.value
            let reopened = try Store(path: directory.path, options: .init(durability: .process))
            let tables = try reopened.derivedTables()
            try await reopened.rebuildProjections()
            #expect(try reopened.derivedTables() == tables, "round \(round)")
            reopened.close()
        }
    }

    /// A `record` whose task held the last reference to the store delivers
    /// its event, and the stream ends when the store goes.
    @Test func eventsOfARecordWhoseStoreWasDropped() async throws {
        let directory = try TemporaryDirectory("life-record-dropped")
        for round in 0..<20 {
            var store: Store? = try Store(path: directory.path, options: .init(durability: .process))
            try await store?.create(type: "te", id: "r\(round)", fields: [:])
            let offset = try #require(try store?.outbox().first?.offset)
            let events = try #require(store).events()
            let record = Task.detached { [store] in
                try await store?.record([(offset, .rejected(code: "NO", message: "no"))])
            }
            store = nil
            _ = try await record.value
            let collected = await withTaskGroup(of: Int?.self) { group in
                group.addTask {
                    var count = 0
                    for await _ in events { count += 1 }
                    return count
                }
                group.addTask {
                    try? await Task.sleep(for: .seconds(60))
                    return nil
                }
                let first = await group.next() ?? nil
                group.cancelAll()
                return first
            }
            #expect(collected == 1, "round \(round)")
        }
    }
}

extension StoreCloseTests {
    /// A read-only open refused for stale projections closes the
    /// environment it opened, so a writable open (and then a read-only
    /// one) succeeds.
    @Test func aRefusedReadOnlyOpenLeavesTheStoreClosed() async throws {
        let directory = try TemporaryDirectory("life-readonly-stale")
        let log = try EventLog(path: directory.path, options: .init(durability: .process))
        _ = try log.appendBlocking(intent(1))
        log.close()
        for _ in 0..<2 {
            #expect(throws: LogStoreError.self) { try Store(path: directory.path, options: .inspecting) }
        }
        let store = try Store(path: directory.path, options: .init(durability: .process))
        _ = try await store.log.append(intent(2))
        store.close()
        for _ in 0..<2 {
            #expect(throws: LogStoreError.self) { try Store(path: directory.path, options: .inspecting) }
        }
        let writer = try Store(path: directory.path, options: .init(durability: .process))
        writer.close()
        let reader = try Store(path: directory.path, options: .inspecting)
        #expect(try reader.count(type: "te") == 2)
        reader.close()
    }
}

extension StoreCloseTests {
    /// `store.log.close()` closes the store (the log's doc says so), so the
    /// store's streams end, those subscribed before and after alike.
    @Test func closingTheLogEndsTheStoresStreams() async throws {
        let fixture = try StoreFixture("life-log-close-streams")
        let before = fixture.store.changes(type: "te")
        try await fixture.store.create(type: "te", fields: [:])
        fixture.store.log.close()
        #expect(await ends(before))
        #expect(await ends(fixture.store.changes(type: "te")))
        #expect(await ends(fixture.store.events()))
        #expect(await ends(fixture.store.intentCommits()))
    }

    /// A store closed on the writer's own thread (inside a write, where a
    /// `deinit` would run) returns before the writer has committed; the
    /// streams end only after it has, so the write is still heard.
    @Test func aStoreClosedInsideItsOwnWriteStillPublishesIt() async throws {
        let fixture = try StoreFixture("life-close-inside-write")
        let changes = fixture.store.changes(type: "te")
        let intents = fixture.store.intentCommits()
        try await fixture.store.write { txn, context, store in
            store.close()
            try store.append(intent(1), txn, &context)
        }
        var heard = 0
        for await _ in changes { heard += 1 }
        for await _ in intents { heard += 1 }
        #expect(heard == 2)
    }
}
