import Foundation

/// The engine's time: wall-clock milliseconds, and sleeping until one. Every
/// timer of the engine and the scheduler goes through it, so tests run on a
/// manual clock without real waiting (`LogTesting.ManualClock`).
public protocol SyncClock: Sendable {
    /// Milliseconds since 1970-01-01T00:00:00Z.
    var nowMilliseconds: UInt64 { get }

    /// Returns at `deadline` (Unix milliseconds) or later.
    /// - Throws: `CancellationError` when the task is cancelled first.
    func sleep(untilMilliseconds deadline: UInt64) async throws
}

extension SyncClock {
    /// Sleeps for `milliseconds` from now.
    public func sleep(milliseconds: UInt64) async throws {
        try await sleep(untilMilliseconds: nowMilliseconds.addingSaturating(milliseconds))
    }
}

/// The system's wall clock. Sleeps are measured on the monotonic clock, so a
/// wall-clock step only shifts when later deadlines are computed.
public struct SystemClock: SyncClock {
    public init() {}

    public var nowMilliseconds: UInt64 { UInt64(max(0, Date().timeIntervalSince1970 * 1000)) }

    public func sleep(untilMilliseconds deadline: UInt64) async throws {
        let now = nowMilliseconds
        guard deadline > now else { return try Task.checkCancellation() }
        try await Task.sleep(for: .milliseconds(deadline - now))
    }
}
