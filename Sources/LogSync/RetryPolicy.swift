/// When a retryable failure is tried again (`Format/sync-protocol.md`,
/// section 10, "Retry timing"): exponential backoff with jitter, at least
/// the server's `Retry-After`, and a bounded number of attempts.
public struct RetryPolicy: Sendable, Equatable {
    /// The delay before the first retry.
    public var baseDelayMilliseconds: UInt64 = 1_000
    /// No delay is longer than this (before `Retry-After`).
    public var delayMaxMilliseconds: UInt64 = 300_000
    /// An intent is attempted at most this many times, then marked failed.
    public var attemptsMax: UInt32 = 10
    /// Each delay is multiplied by a factor from 1 - jitter to 1 + jitter.
    public var jitter = 0.2

    public init() {}

    /// The delay before retry `retry` (1 for the first), in milliseconds.
    public func delay(beforeRetry retry: UInt32, retryAfterSeconds: Int? = nil, random: inout some RandomNumberGenerator)
        -> UInt64
    {
        precondition(retry >= 1, "retries count from 1")
        let doublings = min(retry - 1, 32)
        // Saturating, for any settings: a shift would drop the high bits of a
        // large base, and a product past UInt64 cannot be converted back.
        let (doubled, overflow) = baseDelayMilliseconds.multipliedReportingOverflow(by: 1 << UInt64(doublings))
        let backoff = overflow ? delayMaxMilliseconds : min(doubled, delayMaxMilliseconds)
        let factor = 1 + Double.random(in: -jitter...jitter, using: &random)
        let product = (Double(backoff) * factor).rounded()
        let jittered = product < Double(UInt64.max) ? UInt64(product) : .max
        return max(jittered, .milliseconds(retryAfterSeconds: retryAfterSeconds))
    }
}

/// The client's circuit breaker (section 10, "Circuit breaker"): three
/// consecutive 429 answers, on any endpoint, stop all requests for 30 s, then
/// 60 s after the next trip, up to 300 s, and at least the last `Retry-After`.
/// Any other answer resets the count; a successful push or pull also resets
/// the delay.
public struct CircuitBreaker: Sendable, Equatable {
    /// Consecutive 429s that open the breaker.
    public static let thresholdCount = 3
    public static let delayBaseMilliseconds: UInt64 = 30_000
    public static let delayMaxMilliseconds: UInt64 = 300_000

    public private(set) var consecutiveRateLimits = 0
    /// The delay the next trip waits.
    public private(set) var nextDelayMilliseconds = CircuitBreaker.delayBaseMilliseconds
    /// While now is before this (Unix milliseconds), no request is sent.
    public private(set) var openUntil: UInt64 = 0

    public init() {}

    public func isOpen(at now: UInt64) -> Bool { now < openUntil }

    /// Records a 429. - Returns: whether this one opened the breaker.
    public mutating func recordRateLimited(retryAfterSeconds: Int?, at now: UInt64) -> Bool {
        consecutiveRateLimits += 1
        guard consecutiveRateLimits >= CircuitBreaker.thresholdCount else { return false }
        openUntil = now.addingSaturating(max(nextDelayMilliseconds, .milliseconds(retryAfterSeconds: retryAfterSeconds)))
        nextDelayMilliseconds = min(nextDelayMilliseconds * 2, CircuitBreaker.delayMaxMilliseconds)
        consecutiveRateLimits = 0
        return true
    }

    /// Records any answer other than 429; `success` for a 2xx push or pull.
    public mutating func recordAnswer(success: Bool) {
        consecutiveRateLimits = 0
        if success { nextDelayMilliseconds = CircuitBreaker.delayBaseMilliseconds }
    }
}

extension UInt64 {
    /// `self + other`, or `.max` when that does not fit: a deadline that far
    /// off is never reached.
    func addingSaturating(_ other: UInt64) -> UInt64 {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? .max : sum
    }

    /// A `Retry-After` in milliseconds: 0 for none (or a negative one), and
    /// `.max` for one too large to count (the header holds any integer).
    static func milliseconds(retryAfterSeconds seconds: Int?) -> UInt64 {
        let (product, overflow) = UInt64(Swift.max(0, seconds ?? 0)).multipliedReportingOverflow(by: 1_000)
        return overflow ? .max : product
    }
}
