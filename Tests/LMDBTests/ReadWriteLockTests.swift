import Foundation
@testable import LMDB
import Testing

/// The map-resize lock is taken shared again by a thread that already holds
/// it shared (a read inside a write job). That must not wait for a writer
/// queued in between (a map resize), which waits for the first hold: the
/// two would wait for each other for good.
@Suite struct ReadWriteLockTests {
    @Test func aNestedSharedHoldDoesNotQueueBehindAWaitingWriter() throws {
        let lock = ReadWriteLock()
        let writerDone = DispatchSemaphore(value: 0)
        let nestedDone = DispatchSemaphore(value: 0)
        lock.lockShared()
        let writer = Thread {
            lock.withExclusive {}
            writerDone.signal()
        }
        writer.start()
        // The writer cannot get in while the first hold lasts; give it time
        // to queue (if it has not yet, the test passes without showing anything).
        Thread.sleep(forTimeInterval: 0.1)
        #expect(writerDone.wait(timeout: .now()) == .timedOut, "the writer got in during a shared hold")
        let nested = Thread {
            // Stands in for the same thread's second hold: glibc's reader
            // preference does not look at which thread asks.
            lock.lockShared()
            lock.unlock()
            nestedDone.signal()
        }
        nested.start()
        let nestedFinished = nestedDone.wait(timeout: .now() + 10) == .success
        lock.unlock()
        #expect(nestedFinished, "a shared hold queued behind the waiting writer")
        #expect(writerDone.wait(timeout: .now() + 10) == .success, "the writer never got in")
        if !nestedFinished { _ = nestedDone.wait(timeout: .now() + 10) }
    }
}
