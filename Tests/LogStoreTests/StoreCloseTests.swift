import Foundation
import LMDB
import LogFormat
@testable import LogStore
import LogTesting
import Synchronization
import Testing

/// Opens the store at `path` once it is closed (a store still open in this
/// process refuses a second open); nil when it stays open for `seconds`.
private func openOnceClosed(_ path: String, seconds: Double = 10) async throws -> Store? {
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
                try #require(threadsDone.wait(timeout: .now() + 10) == .success, "a close or a read hung")
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
