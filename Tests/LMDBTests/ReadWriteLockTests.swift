import Foundation
@testable import LMDB
import Synchronization
import Testing

/// The map-resize lock is taken shared again by a thread that already holds
/// it shared (a read inside a write job). That must not wait for a writer
/// queued in between (a map resize), which waits for the first hold: the
/// two would wait for each other for good. A thread that holds it in no way
/// must wait for that writer, though, or readers on several threads could
/// keep it out for good.
@Suite struct ReadWriteLockTests {
    @Test func aNestedSharedHoldDoesNotQueueBehindAWaitingWriter() throws {
        let lock = ReadWriteLock()
        let writerDone = DispatchSemaphore(value: 0)
        let nestedDone = DispatchSemaphore(value: 0)
        let held = DispatchSemaphore(value: 0)
        let writerStarted = DispatchSemaphore(value: 0)
        // One thread holds the lock, and takes it again once the writer has
        // had time to queue; a hang of its own stays on that thread.
        Thread {
            lock.lockShared()
            held.signal()
            writerStarted.wait()
            Thread.sleep(forTimeInterval: 0.1)
            lock.withShared {}
            lock.unlock()
            nestedDone.signal()
        }.start()
        held.wait()
        Thread {
            writerStarted.signal()
            lock.withExclusive {}
            writerDone.signal()
        }.start()
        let nestedFinished = nestedDone.wait(timeout: .now() + 60) == .success
        #expect(nestedFinished, "a nested shared hold queued behind the waiting writer")
        #expect(writerDone.wait(timeout: .now() + 60) == .success, "the writer never got in")
    }

    @Test func aNewSharedHoldQueuesBehindAWaitingWriter() throws {
        let lock = ReadWriteLock()
        let order = Mutex<[String]>([])
        let writerDone = DispatchSemaphore(value: 0)
        let readerDone = DispatchSemaphore(value: 0)
        lock.lockShared()
        Thread {
            lock.withExclusive { order.withLock { $0.append("writer") } }
            writerDone.signal()
        }.start()
        // Once the writer is counted, a new reader waits at the gate; then
        // time for the reader to reach it (one that has not yet by the
        // unlock comes after the writer anyway, and the test shows nothing).
        for _ in 0..<60_000 where lock.writersWaitingOrHolding == 0 { Thread.sleep(forTimeInterval: 0.001) }
        try #require(lock.writersWaitingOrHolding == 1, "the writer never came")
        Thread {
            lock.withShared { order.withLock { $0.append("reader") } }
            readerDone.signal()
        }.start()
        Thread.sleep(forTimeInterval: 0.1)
        lock.unlock()
        #expect(writerDone.wait(timeout: .now() + 60) == .success, "the writer never got in")
        #expect(readerDone.wait(timeout: .now() + 60) == .success, "the reader never got in")
        #expect(order.withLock { $0 } == ["writer", "reader"])
    }

    /// Two threads each hold one environment's lock and read the other
    /// environment while both have a writer waiting. A hold of either lock
    /// lets a thread pass both gates; waiting at the other's gate, each
    /// would wait for a writer that waits for its own hold.
    @Test func aHoldOfAnotherLockPassesTheGate() throws {
        let locks = [ReadWriteLock(), ReadWriteLock()]
        let held = DispatchSemaphore(value: 0)
        let writersStarted = DispatchSemaphore(value: 0)
        let readersDone = DispatchSemaphore(value: 0)
        let writersDone = DispatchSemaphore(value: 0)
        for index in 0..<2 {
            Thread {
                locks[index].lockShared()
                held.signal()
                writersStarted.wait()
                // Time for the writers to queue.
                Thread.sleep(forTimeInterval: 0.1)
                locks[1 - index].withShared {}
                locks[index].unlock()
                readersDone.signal()
            }.start()
        }
        held.wait()
        held.wait()
        for lock in locks {
            Thread {
                writersStarted.signal()
                lock.withExclusive {}
                writersDone.signal()
            }.start()
        }
        var finished = 0
        while finished < 2, readersDone.wait(timeout: .now() + 60) == .success { finished += 1 }
        #expect(finished == 2, "a reader holding one lock waited at the other's gate")
        while finished < 4, writersDone.wait(timeout: .now() + 60) == .success { finished += 1 }
        #expect(finished == 4, "a writer never got in")
    }
}
