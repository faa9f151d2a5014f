import Foundation
import LogSync

/// A clock that moves only when a test says so: `advance(by:)` wakes every
/// sleeper whose deadline has come. Timers of the engine and the scheduler
/// run on it without real waiting. `stepWallClock(by:)` sets the wall clock
/// alone forward or back, as an administrator or NTP does.
public final class ManualClock: SyncClock, @unchecked Sendable {
    private struct Sleeper {
        var deadline: UInt64
        var continuation: CheckedContinuation<Void, any Error>
    }

    private let lock = NSLock()
    private var now: UInt64
    private var monotonic: UInt64
    private var sleepers: [UUID: Sleeper] = [:]

    public init(startingAt milliseconds: UInt64 = 1_795_000_000_000) {
        now = milliseconds
        monotonic = milliseconds
    }

    public var nowMilliseconds: UInt64 { lock.withLock { now } }

    /// Starts at the wall clock's reading, and moves only with `advance(by:)`.
    public var monotonicMilliseconds: UInt64 { lock.withLock { monotonic } }

    /// How many tasks sleep on this clock now.
    public var sleeperCount: Int { lock.withLock { sleepers.count } }

    /// When each sleeping task wakes, on the monotonic reading, earliest
    /// first: a test can tell that a timer was set where it should be.
    public var sleeperDeadlines: [UInt64] { lock.withLock { sleepers.values.map(\.deadline).sorted() } }

    public func sleep(untilMilliseconds deadline: UInt64) async throws {
        let id = UUID()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let ready = lock.withLock { () -> Bool in
                    if deadline <= monotonic || Task.isCancelled { return true }
                    sleepers[id] = Sleeper(deadline: deadline, continuation: continuation)
                    return false
                }
                if ready { continuation.resume() }
            }
        } onCancel: {
            let sleeper = lock.withLock { sleepers.removeValue(forKey: id) }
            sleeper?.continuation.resume(throwing: CancellationError())
        }
        try Task.checkCancellation()
    }

    /// Moves time forward and wakes the sleepers whose deadline has come.
    public func advance(by milliseconds: UInt64) {
        let due = lock.withLock { () -> [Sleeper] in
            now += milliseconds
            monotonic += milliseconds
            let ready = sleepers.filter { $0.value.deadline <= monotonic }
            for id in ready.keys { sleepers.removeValue(forKey: id) }
            return Array(ready.values)
        }
        for sleeper in due { sleeper.continuation.resume() }
    }

    /// Sets the wall clock forward (a positive step) or back (a negative
    /// one) without time passing: sleepers wake no sooner and no later.
    public func stepWallClock(by milliseconds: Int64) {
        lock.withLock {
            now = milliseconds < 0 ? now - min(now, milliseconds.magnitude) : now + UInt64(milliseconds)
        }
    }

    /// Waits (really, briefly) until `count` tasks sleep on the clock, so a
    /// test advances time only once its timers are set (`hangSeconds`
    /// bounds the wait).
    public func waitForSleepers(_ count: Int, timeoutSeconds: Double = hangSeconds) async throws {
        let deadline = Date().addingTimeInterval(timeoutSeconds)
        while sleeperCount < count {
            guard Date() < deadline else { throw WaitTimedOut("\(sleeperCount) of \(count) sleepers within \(timeoutSeconds) s") }
            try await Task.sleep(for: .milliseconds(2))
        }
    }
}
