import Foundation

/// The engine's time: the wall clock, for the times it shows and stamps, and
/// a monotonic reading, for every wait. Every timer of the engine and the
/// scheduler goes through it, so tests run on a manual clock without real
/// waiting (`LogTesting.ManualClock`).
///
/// The wall clock can be set back or forward at any moment (by a person, or
/// by NTP after a boot with a wrong clock). A deadline on it would stretch a
/// backoff by a step back and cut it short by a step forward, so the engine
/// and the scheduler keep their deadlines on `monotonicMilliseconds`, which
/// only time passing moves.
public protocol SyncClock: Sendable {
    /// Milliseconds since 1970-01-01T00:00:00Z, as the wall clock reads now.
    var nowMilliseconds: UInt64 { get }

    /// Milliseconds that only time passing moves, never a step of the wall
    /// clock: the engine's deadlines are on this reading. Its origin is
    /// the clock's choice; `SystemClock` starts it at the wall clock's
    /// reading, so that it reads as Unix milliseconds (the wall clock
    /// without the steps since the process started). The default, for a
    /// clock that has no monotonic reading, is the wall clock.
    var monotonicMilliseconds: UInt64 { get }

    /// Returns once `monotonicMilliseconds` reads `deadline` or later.
    /// - Throws: `CancellationError` when the task is cancelled first.
    func sleep(untilMilliseconds deadline: UInt64) async throws
}

extension SyncClock {
    public var monotonicMilliseconds: UInt64 { nowMilliseconds }

    /// Sleeps for `milliseconds` from now.
    public func sleep(milliseconds: UInt64) async throws {
        try await sleep(untilMilliseconds: monotonicMilliseconds.addingSaturating(milliseconds))
    }
}

/// The system's wall clock, and for waits the continuous clock (which, unlike
/// the wall clock, counts time the machine spends asleep and is never set).
public struct SystemClock: SyncClock {
    /// The wall clock and the continuous clock, read once per process: the
    /// origin of `monotonicMilliseconds`, shared by every `SystemClock`.
    private static let origin = (wall: SystemClock().nowMilliseconds, instant: ContinuousClock.now)

    public init() {}

    public var nowMilliseconds: UInt64 { UInt64(max(0, Date().timeIntervalSince1970 * 1000)) }

    public var monotonicMilliseconds: UInt64 {
        let (seconds, attoseconds) = SystemClock.origin.instant.duration(to: ContinuousClock.now).components
        // The continuous clock never goes back, so the duration is never negative.
        guard seconds >= 0, attoseconds >= 0 else { return SystemClock.origin.wall }
        let elapsed = UInt64(seconds).multipliedReportingOverflow(by: 1_000)
        guard !elapsed.overflow else { return .max }
        return SystemClock.origin.wall.addingSaturating(elapsed.partialValue + UInt64(attoseconds / 1_000_000_000_000_000))
    }

    public func sleep(untilMilliseconds deadline: UInt64) async throws {
        let now = monotonicMilliseconds
        guard deadline > now else { return try Task.checkCancellation() }
        // `Task.sleep(for:)` measures on the continuous clock too.
        try await Task.sleep(for: .milliseconds(deadline - now))
    }
}
