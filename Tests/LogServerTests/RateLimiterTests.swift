import Testing

@testable import LogServer

@Suite struct RateLimiterTests {
    /// Concurrent requests read the clock before they queue for the
    /// limiter's lock, so one can bring an earlier time than the one before
    /// it. That must not move the bucket's clock back: the time between the
    /// two would be refilled twice, granting tokens the rate never allowed.
    @Test func aRequestThatReadTheClockEarlierRefillsNothingTwice() {
        let limiter = RateLimiter(rate: 1, burst: 1)
        #expect(limiter.take("alice", now: 100) == nil)
        #expect(limiter.take("alice", now: 100.6) != nil)
        #expect(limiter.take("alice", now: 100) != nil)
        // 0.6 s after the only token was taken, at one token a second.
        #expect(limiter.take("alice", now: 100.6) != nil)
    }
}
