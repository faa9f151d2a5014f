import Foundation
import LogFormat
import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// `RetryPolicy` used on its own, and the circuit breaker's count of
/// consecutive 429s against a scripted server (`Format/sync-protocol.md`
/// section 10, "Retry timing" and "Circuit breaker").
@Suite struct RetryPolicyTests {
    /// `RetryPolicy` is public, and its settings are plain properties: an
    /// app may use it without a `SyncEngine`, whose configuration check is
    /// then never made. A jitter outside 0...1 or NaN is taken as the
    /// nearest bound (NaN as none), not a trap. Before, `delay` trapped in
    /// `Double.random(in:)` on a NaN or negative jitter.
    /// Section 10, "Retry timing", and section 13's constants: with the
    /// default policy, retry n waits min(1 s × 2^(n-1), 300 s) times a
    /// factor from 0.8 to 1.2 (about 1 s, 2 s, 4 s, ..., 256 s, then 300
    /// s), and an operation has 10 attempts.
    @Test func theDefaultRetryDelaysAreSection10s() {
        var random = SeededRandom(seed: 3)
        let policy = RetryPolicy()
        #expect(policy.attemptsMax == 10)
        var exact = policy
        exact.jitter = 0
        let delays = (1...11).map { exact.delay(beforeRetry: UInt32($0), random: &random) }
        #expect(delays == [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000, 300_000])
        for (retry, backoff) in [(1, 1_000.0), (9, 256_000), (10, 300_000)] {
            let jittered = (0..<200).map { _ in Double(policy.delay(beforeRetry: UInt32(retry), random: &random)) }
            #expect(jittered.allSatisfy { (backoff * 0.8...backoff * 1.2).contains($0) }, "retry \(retry)")
            // The factor spreads: not every delay is the bare backoff.
            #expect(Set(jittered).count > 1, "retry \(retry)")
        }
    }

    /// Section 10, "Circuit breaker": three consecutive 429s open it for
    /// 30 s, then 60 s after the next trip, 120 s, 240 s, and at most 300 s;
    /// another answer resets the count but not the delay, and a successful
    /// push or pull sets the delay back to 30 s.
    @Test func theBreakersDelaysDoubleFrom30To300Seconds() {
        var breaker = CircuitBreaker()
        var now: UInt64 = 1_000_000
        func trip() -> UInt64? {
            let opened = (0..<CircuitBreaker.thresholdCount).map { _ in breaker.recordRateLimited(retryAfterSeconds: nil, at: now) }
            guard opened == [false, false, true] else { return nil }
            defer { now = breaker.openUntil }
            return breaker.openUntil - now
        }
        #expect(CircuitBreaker.thresholdCount == 3)
        let trips = (0..<6).map { _ in trip() }
        #expect(trips == [30_000, 60_000, 120_000, 240_000, 300_000, 300_000])
        let twice = (0..<2).map { _ in breaker.recordRateLimited(retryAfterSeconds: nil, at: now) }
        #expect(twice == [false, false])
        breaker.recordAnswer(success: false)
        #expect(breaker.consecutiveRateLimits == 0)
        let afterAnAnswer = trip()
        #expect(afterAnAnswer == 300_000, "an answer that is no success keeps the delay")
        breaker.recordAnswer(success: true)
        let afterASuccess = trip()
        #expect(afterASuccess == 30_000)
    }

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

    /// Retries count from 1, and an app's 0 is taken as the first: before,
    /// `delay(beforeRetry: 0)` stopped the app with a precondition.
    @Test func retryZeroIsTheFirstRetryNotATrap() {
        var random = SeededRandom(seed: 1)
        var policy = RetryPolicy()
        policy.jitter = 0
        #expect(policy.delay(beforeRetry: 0, random: &random) == 1_000)
        #expect(policy.delay(beforeRetry: 0, retryAfterSeconds: 5, random: &random) == 5_000)
    }

    static let protocolHeaders = ["Sync-Protocol-Version": "1", "Content-Type": "application/json"]
    static let health = Data(#"{"status": "ok", "protocol_version": 1, "server_id": "01KAQ3H2M4Z8X0V6T5R7P9N1B3"}"#.utf8)
    static let rateLimited = Data(#"{"error": {"code": "RATE_LIMITED", "message": "slow down", "retryable": true}}"#.utf8)

    /// Two 429s, then a pull that gets no answer at all (the server takes
    /// the request and never answers: a timeout), then a 429: the breaker
    /// opens on that third 429, as the timeout is no answer, and only "any
    /// answer other than 429" resets the count. Before, the timeout
    /// counted as an answer and reset the count, so the run failed.
    @Test func aRequestWithNoAnswerLeavesTheRateLimitCountAlone() async throws {
        let pulls = Atomic<Int>(0)
        let server = try ScriptedServer { request in
            guard request.path == "/v1/pull" else { return .answer(status: 200, headers: Self.protocolHeaders, body: Self.health) }
            let pull = pulls.add(1, ordering: .relaxed).newValue
            guard pull != 3 else { return .silence }
            var headers = Self.protocolHeaders
            headers["Retry-After"] = "1"
            return .answer(status: 429, headers: headers, body: Self.rateLimited)
        }
        defer { server.stop() }
        var options = loopback
        options.requestTimeout = 1
        let a = try Replica(
            "breaker-no-answer", url: server.url, transport: HTTPTransport(baseURL: server.url, token: "alice-token", options: options))
        #expect(await a.sync().outcome == .failed("pull: /v1/pull: HTTP 429, RATE_LIMITED: slow down"))
        #expect(await a.sync().outcome == .failed("pull: /v1/pull: HTTP 429, RATE_LIMITED: slow down"))
        guard case .failed = await a.sync().outcome else {
            Issue.record("a pull that times out fails the run")
            return
        }
        #expect(await a.sync().outcome == .rateLimited, "the third 429 in a row opens the breaker")
        #expect(await a.engine.breakerOpenUntil != nil)
    }

    /// A real HTTP answer that is not a 429 (here a 503) still resets the
    /// count: two 429s, a 503, a 429 do not open the breaker.
    @Test func anAnswerOtherThan429ResetsTheRateLimitCount() async throws {
        let pulls = Atomic<Int>(0)
        let server = try ScriptedServer { request in
            guard request.path == "/v1/pull" else { return .answer(status: 200, headers: Self.protocolHeaders, body: Self.health) }
            let pull = pulls.add(1, ordering: .relaxed).newValue
            return .answer(status: pull == 3 ? 503 : 429, headers: Self.protocolHeaders, body: Self.rateLimited)
        }
        defer { server.stop() }
        let a = try Replica("breaker-answer", url: server.url)
        for _ in 0..<4 {
            guard case .failed = await a.sync().outcome else {
                Issue.record("the breaker opened")
                return
            }
        }
        #expect(await a.engine.breakerOpenUntil == nil)
    }

    /// Answers other than a 429 that are no error status reset the count
    /// too: a refused cursor (410, which the pull resyncs after), a page
    /// too long to read (asked again for half as many changes), a page
    /// that breaks the protocol (the run fails). Two 429s, one of these and
    /// more 429s: the breaker stays closed, and every run fails.
    @Test(arguments: ["refused cursor", "page too long", "broken page"])
    func everyAnswerOtherThan429ResetsTheRateLimitCount(_ shape: String) async throws {
        let pulls = Atomic<Int>(0)
        let answer: ScriptedServer.Reply =
            switch shape {
            case "refused cursor":
                .answer(
                    status: 410, headers: Self.protocolHeaders,
                    body: Data(#"{"error": {"code": "CURSOR_INVALID", "message": "unknown cursor", "retryable": false}}"#.utf8))
            case "page too long":
                .answer(status: 200, headers: Self.protocolHeaders, body: Data(repeating: 0x20, count: 4_096))
            default:
                .answer(status: 200, headers: Self.protocolHeaders, body: Data(#"{"changes": [], "cursor": "c1", "has_more": true, "force_resync": false}"#.utf8))
            }
        let server = try ScriptedServer { request in
            guard request.path == "/v1/pull" else { return .answer(status: 200, headers: Self.protocolHeaders, body: Self.health) }
            let pull = pulls.add(1, ordering: .relaxed).newValue
            return pull == 3 ? answer : .answer(status: 429, headers: Self.protocolHeaders, body: Self.rateLimited)
        }
        defer { server.stop() }
        var options = loopback
        options.responseBodyBytesMax = 1_024
        let a = try Replica(
            "breaker-\(shape.replacingOccurrences(of: " ", with: "-"))", url: server.url,
            transport: HTTPTransport(baseURL: server.url, token: "alice-token", options: options))
        for run in 1...4 {
            guard case .failed(let message) = await a.sync().outcome else {
                Issue.record("\(shape): run \(run) opened the breaker")
                return
            }
            #expect(message.contains("429") != (shape == "broken page" && run == 3), "\(shape): run \(run): \(message)")
        }
        #expect(await a.engine.breakerOpenUntil == nil)
        #expect(pulls.load(ordering: .relaxed) == (shape == "broken page" ? 4 : 5), "\(shape)")
    }

    /// An answered push resets the count too: two pulls answered 429, then
    /// a run whose push is answered and whose pull meets a 429 again, and
    /// the breaker stays closed.
    @Test func anAnsweredPushResetsTheRateLimitCount() async throws {
        let server = try await TestServer("breaker-push-answered")
        let a = try Replica("breaker-push", server: server, transport: FailingPulls(server, failure: TransportError(.status(429, .rateLimited), "HTTP 429")))
        for _ in 0..<2 { #expect(await a.sync().outcome == .failed("pull: HTTP 429")) }
        try await a.store.create(type: "task", fields: ["n": 1])
        let report = await a.sync()
        #expect(report.outcome == .failed("pull: HTTP 429") && report.acknowledged == 1, "\(report)")
        #expect(await a.engine.breakerOpenUntil == nil)
        await server.stop()
    }
}

/// `Retry-After` in its HTTP-date form (RFC 9110 section 10.2.3), which a
/// proxy or another server may send: the delay is the date less the
/// response's `Date` (or, without one, the client's clock), at least 0.
/// Before, the transport read only the seconds form and ignored a date.
@Suite struct RetryAfterDateTests {
    func retryAfter(_ headers: [String: String]) async throws -> Int? {
        let server = try ScriptedServer { _ in
            .answer(status: 503, headers: RetryPolicyTests.protocolHeaders.merging(headers) { $1 }, body: Data())
        }
        defer { server.stop() }
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        do {
            _ = try await transport.pull(cursor: nil, limit: 100)
            Issue.record("expected a 503")
            return nil
        } catch {
            #expect(error.kind == .status(503, nil), "\(error)")
            return error.retryAfterSeconds
        }
    }

    static func httpDate(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return formatter.string(from: date)
    }

    @Test func aDateIsMeasuredFromTheResponsesDate() async throws {
        let date = "Wed, 21 Oct 2015 07:26:00 GMT"
        #expect(try await retryAfter(["Date": date, "Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"]) == 120)
        // The two obsolete forms a recipient must accept too.
        #expect(try await retryAfter(["Date": date, "Retry-After": "Wednesday, 21-Oct-15 07:28:00 GMT"]) == 120)
        #expect(try await retryAfter(["Date": date, "Retry-After": "Wed Oct 21 07:28:00 2015"]) == 120)
        #expect(try await retryAfter(["Date": date, "Retry-After": "Wed, 21 Oct 2015 07:25:00 GMT"]) == 0, "a past date: now")
        #expect(try await retryAfter(["Date": date, "Retry-After": "soon"]) == nil)
    }

    @Test func withoutADateHeaderTheClientsClockIsUsed() async throws {
        let asked = Date()
        let seconds = try #require(try await retryAfter(["Retry-After": Self.httpDate(asked.addingTimeInterval(600))]))
        // The header's date is in whole seconds, and the exchange took some
        // time (seconds, on a loaded machine): no bound tighter than that.
        let taken = Int(Date().timeIntervalSince(asked).rounded(.up))
        #expect((600 - taken - 1...600).contains(seconds), "\(seconds) after \(taken) s")
        #expect(try await retryAfter(["Retry-After": "Thu, 01 Jan 1970 00:00:00 GMT"]) == 0)
    }

    /// A number of seconds longer than an `Int` holds is honoured up to
    /// `retryAfterMax`, as `Retry-After: 999999999999` is. Before, it was
    /// no `Retry-After` at all, and the client came back after a second.
    @Test func secondsPastAnIntAreCapped() async throws {
        let seconds = try #require(try await retryAfter(["Retry-After": "99999999999999999999"]))
        #expect(RetryPolicy().retryAfterMilliseconds(seconds) == RetryPolicy().retryAfterMaxMilliseconds)
    }

    /// A date far off is honoured up to `retryAfterMax`, as the seconds form is.
    @Test func aDateFarOffIsCappedAsSecondsAre() async throws {
        let seconds = try #require(
            try await retryAfter(["Date": "Wed, 21 Oct 2015 07:26:00 GMT", "Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"]))
        #expect(RetryPolicy().retryAfterMilliseconds(seconds) == RetryPolicy().retryAfterMaxMilliseconds)
    }
}
