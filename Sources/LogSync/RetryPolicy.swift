/// When a retryable failure is tried again (`Format/sync-protocol.md`,
/// section 10, "Retry timing"): exponential backoff with jitter, at least
/// the server's `Retry-After` (up to `retryAfterMaxMilliseconds`), and a
/// bounded number of attempts.
public struct RetryPolicy: Sendable, Equatable {
    /// The delay before the first retry.
    public var baseDelayMilliseconds: UInt64 = 1_000
    /// No delay is longer than this (before `Retry-After`).
    public var delayMaxMilliseconds: UInt64 = 300_000
    /// An intent is attempted at most this many times, then marked failed.
    public var attemptsMax: UInt32 = 10
    /// Each delay is multiplied by a factor from 1 - jitter to 1 + jitter.
    /// In 0...1: `SyncEngine` refuses a configuration outside it
    /// (`SyncConfiguration.validate()`); used on its own, the policy takes
    /// one outside it as the nearest bound, and NaN as 0.
    public var jitter = 0.2
    /// A server's `Retry-After` is honoured up to this, here and in the
    /// circuit breaker. A server (or a proxy before it) that asks for more,
    /// such as `Retry-After: 999999999999`, is misconfigured or broken:
    /// obeyed, it would stop every scheduled sync for good. An hour is 12
    /// times the longest delay of the client's own, and one request an
    /// hour from each client costs a server nothing.
    public var retryAfterMaxMilliseconds: UInt64 = 3_600_000

    public init() {}

    /// The delay before retry `retry` (1 for the first; 0 is taken as 1), in milliseconds.
    public func delay(beforeRetry retry: UInt32, retryAfterSeconds: Int? = nil, random: inout some RandomNumberGenerator)
        -> UInt64
    {
        let doublings = min(max(retry, 1) - 1, 32)
        // Saturating, for any settings: a shift would drop the high bits of a
        // large base, and a product past UInt64 cannot be converted back.
        let (doubled, overflow) = baseDelayMilliseconds.multipliedReportingOverflow(by: 1 << UInt64(doublings))
        let backoff = overflow ? delayMaxMilliseconds : min(doubled, delayMaxMilliseconds)
        let spread = jitterInRange
        let jittered = Self.scaled(backoff, by: 1 + Double.random(in: -spread...spread, using: &random))
        return max(jittered, retryAfterMilliseconds(retryAfterSeconds))
    }

    /// The wait a `Retry-After` of `seconds` asks for, as the client honours
    /// it: 0 for none (or a negative one), at most `retryAfterMaxMilliseconds`.
    public func retryAfterMilliseconds(_ seconds: Int?) -> UInt64 {
        .milliseconds(retryAfterSeconds: seconds, atMost: retryAfterMaxMilliseconds)
    }

    /// The longest delay `delay(beforeRetry:retryAfterSeconds:random:)`
    /// gives: a retry time further off than this was not set under this
    /// policy by the clock that reads it now.
    var delayLongestMilliseconds: UInt64 {
        max(Self.scaled(delayMaxMilliseconds, by: 1 + jitterInRange), retryAfterMaxMilliseconds)
    }

    /// `jitter` in 0...1 (NaN as 0): a range of factors from a NaN or
    /// negative jitter would trap, and factors below 0 make no delay.
    private var jitterInRange: Double { jitter.isNaN ? 0 : min(max(jitter, 0), 1) }

    /// `milliseconds × factor`, rounded, and `.max` past UInt64.
    private static func scaled(_ milliseconds: UInt64, by factor: Double) -> UInt64 {
        let product = (Double(milliseconds) * factor).rounded()
        return product < Double(UInt64.max) ? UInt64(product) : .max
    }
}

/// The client's circuit breaker (section 10, "Circuit breaker"): three
/// consecutive 429 answers, on any endpoint, stop all requests for 30 s, then
/// 60 s after the next trip, up to 300 s, and at least the last `Retry-After`
/// (up to `retryAfterMaxMilliseconds`). Any other answer resets the count; a
/// request with no answer at all (`TransportError.Kind.noAnswer`) is none,
/// and leaves it. A successful push or pull also resets the delay. Health
/// answers are not recorded: the engine checks health before every run,
/// and a 429 ends its run, so the health check's 200 would reset the count
/// before every second 429.
public struct CircuitBreaker: Sendable, Equatable {
    /// Consecutive 429s that open the breaker.
    public static let thresholdCount = 3
    public static let delayBaseMilliseconds: UInt64 = 30_000
    public static let delayMaxMilliseconds: UInt64 = 300_000

    /// A `Retry-After` is honoured up to this (`RetryPolicy.retryAfterMaxMilliseconds`).
    public let retryAfterMaxMilliseconds: UInt64
    public private(set) var consecutiveRateLimits = 0
    /// The delay the next trip waits.
    public private(set) var nextDelayMilliseconds = CircuitBreaker.delayBaseMilliseconds
    /// While now is before this, no request is sent; on the clock the
    /// times given are read from (the engine's monotonic reading).
    public private(set) var openUntil: UInt64 = 0

    public init(retryAfterMaxMilliseconds: UInt64 = RetryPolicy().retryAfterMaxMilliseconds) {
        self.retryAfterMaxMilliseconds = retryAfterMaxMilliseconds
    }

    public func isOpen(at now: UInt64) -> Bool { now < openUntil }

    /// Records a 429. - Returns: whether this one opened the breaker.
    public mutating func recordRateLimited(retryAfterSeconds: Int?, at now: UInt64) -> Bool {
        consecutiveRateLimits += 1
        guard consecutiveRateLimits >= CircuitBreaker.thresholdCount else { return false }
        let retryAfter = UInt64.milliseconds(retryAfterSeconds: retryAfterSeconds, atMost: retryAfterMaxMilliseconds)
        openUntil = now.addingSaturating(max(nextDelayMilliseconds, retryAfter))
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

    /// A `Retry-After` in milliseconds, as the client honours it: 0 for
    /// none (or a negative one), and at most `limit` (the header holds any
    /// integer).
    static func milliseconds(retryAfterSeconds seconds: Int?, atMost limit: UInt64) -> UInt64 {
        let (product, overflow) = UInt64(Swift.max(0, seconds ?? 0)).multipliedReportingOverflow(by: 1_000)
        return overflow ? limit : Swift.min(product, limit)
    }
}
