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

    /// At a rate slow enough (`--rate-limit 1e-20` is accepted), the wait
    /// for the next token is past any `Int`: converting it trapped, which
    /// killed the server on the first request over the limit. It is the
    /// longest wait there is (clients wait at most an hour, section 10).
    @Test func aWaitLongerThanAnIntHoldsIsTheLongestWait() {
        let limiter = RateLimiter(rate: 1e-20, burst: 1)
        #expect(limiter.take("alice", now: 0) == nil)
        #expect(limiter.take("alice", now: 0) == Int.max)
    }
}
