import LogSync
import LogTesting
import Testing

/// `RetryPolicy` used on its own (`Format/sync-protocol.md` section 10,
/// "Retry timing").
@Suite struct RetryPolicyTests {
    /// `RetryPolicy` is public, and its settings are plain properties: an
    /// app may use it without a `SyncEngine`, whose configuration check is
    /// then never made. A jitter outside 0...1 or NaN is taken as the
    /// nearest bound (NaN as none), not a trap. Before, `delay` trapped in
    /// `Double.random(in:)` on a NaN or negative jitter.
    @Test func aJitterOutOfRangeIsClampedNotATrap() {
        var random = SeededRandom(seed: 1)
        var policy = RetryPolicy()
        policy.jitter = .nan
        #expect(policy.delay(beforeRetry: 1, random: &random) == 1_000)
        policy.jitter = -0.5
        #expect(policy.delay(beforeRetry: 2, random: &random) == 2_000)
        policy.jitter = .infinity
        for _ in 0..<100 { #expect(policy.delay(beforeRetry: 1, random: &random) <= 2_000) }
        policy.jitter = 7
        for _ in 0..<100 { #expect(policy.delay(beforeRetry: 1, random: &random) <= 2_000) }
    }
}
