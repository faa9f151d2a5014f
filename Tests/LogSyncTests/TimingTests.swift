import LogFormat
import LogServer
import LogStore
@testable import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// Timing at the edges: delays and deadlines near the end of UInt64, and a
/// scheduler that must stay stopped.
@Suite struct TimingTests {
    /// `Retry-After` is the server's number (any integer the header holds):
    /// the client honours it up to `RetryPolicy.retryAfterMaxMilliseconds`
    /// (an hour), in a retry's delay and in the breaker, and never traps.
    @Test func aHugeRetryAfterIsHonouredUpToTheCap() {
        var random = SeededRandom(seed: 1)
        var policy = RetryPolicy()
        #expect(policy.retryAfterMaxMilliseconds == 3_600_000)
        for seconds in [Int.max, 999_999_999_999, Int(UInt64.max / 1_000) + 1, 3_601] {
            #expect(policy.delay(beforeRetry: 1, retryAfterSeconds: seconds, random: &random) == 3_600_000, "\(seconds) s")
        }
        #expect(policy.delay(beforeRetry: 3, retryAfterSeconds: 3_599, random: &random) == 3_599_000)
        #expect((800...1_200).contains(policy.delay(beforeRetry: 1, retryAfterSeconds: -5, random: &random)))
        policy.retryAfterMaxMilliseconds = 86_400_000
        #expect(policy.delay(beforeRetry: 1, retryAfterSeconds: Int.max, random: &random) == 86_400_000)
        let now: UInt64 = 1_795_000_000_000
        for (seconds, open) in [(Int.max, UInt64(3_600_000)), (100, 100_000), (1, 30_000)] {
            var breaker = CircuitBreaker()
            var opened: [Bool] = []
            for _ in 0..<3 { opened.append(breaker.recordRateLimited(retryAfterSeconds: seconds, at: now)) }
            #expect(opened == [false, false, true])
            #expect(breaker.openUntil == now + open, "Retry-After: \(seconds)")
        }
    }

    /// The engine with a server that answers with an enormous
    /// `Retry-After` (999,999,999,999 s, or `Int.max`): a 503 on a push
    /// holds the intent and the next run an hour, not 31,000 years, and
    /// three 429s open the breaker for an hour; then the run goes through.
    @Test func anEngineToldToWaitForeverWaitsAnHour() async throws {
        let server = try await TestServer("retry-after-huge")
        for (status, seconds) in [(503, 999_999_999_999), (429, Int.max)] {
            let transport = Refusing(server, status: status, retryAfterSeconds: seconds)
            let a = try Replica("huge-\(status)", server: server, transport: transport)
            try await a.store.create(type: "task", fields: ["n": 1])
            let runs = status == 429 ? 3 : 1
            for _ in 0..<runs { #expect(await a.sync().outcome != .completed) }
            let now = a.clock.nowMilliseconds
            let health = try await a.engine.health()
            #expect(health.nextAttemptAt == now + 3_600_000 && health.nextRunAt == now + 3_600_000, "\(status): \(health)")
            if status == 429 { #expect(health.breakerOpenUntil == now + 3_600_000) }
            transport.recover()
            a.clock.advance(by: 3_599_999)
            #expect(await a.sync().acknowledged == 0, "\(status): not due before the hour")
            a.clock.advance(by: 1)
            let report = await a.sync()
            #expect(report.outcome == .completed && report.acknowledged == 1, "\(status): \(report)")
        }
        await server.stop()
    }

    /// A user's "retry now" after a rate-limit storm (seed 002, pitfall 3:
    /// the banner must not go on saying sync is paused): resetting the
    /// breaker takes the engine out of `.rateLimited`, and the scheduler,
    /// whose retry timer waited for the breaker's end, keeps only to the
    /// failed runs' backoff (seconds, where the breaker holds 30).
    @Test func resettingTheBreakerEndsTheRateLimitedState() async throws {
        let server = try await TestServer("breaker-reset")
        let transport = Refusing(server, status: 429, retryAfterSeconds: 1)
        let a = try Replica("breaker-reset", server: server, transport: transport)
        for _ in 0..<3 { _ = await a.sync() }
        guard case .rateLimited = await a.engine.state else {
            Issue.record("three 429s left \(await a.engine.state)")
            return
        }
        let breakerEnd = try #require(await a.engine.nextRunDeadline)
        let scheduler = SyncScheduler.online(a.engine, clock: a.clock, periodMilliseconds: 600_000)
        await scheduler.start()
        try await a.clock.waitForSleepers(2)  // the periodic timer, and the retry timer at the breaker's end
        await scheduler.settle()
        #expect(await scheduler.triggered.isEmpty)
        transport.recover()
        await a.engine.resetCircuitBreaker()
        #expect(await a.engine.state == .idle)
        #expect(await a.engine.breakerOpenUntil == nil)
        let nextRun = try #require(await a.engine.nextRunDeadline)
        #expect(nextRun < breakerEnd)
        // The retry timer moves from the breaker's end to the backoff's.
        try await waitUntil { a.clock.sleeperDeadlines.contains(nextRun) && !a.clock.sleeperDeadlines.contains(breakerEnd) }
        a.clock.advance(by: nextRun - a.clock.monotonicMilliseconds)
        try await waitUntil { await scheduler.triggered == [.retry] }
        await scheduler.settle()
        #expect(await a.engine.state == .idle)
        await scheduler.stop()
        await server.stop()
    }

    /// A pull refused with `Retry-After: 999999999999` does not stop the
    /// scheduler: it retries an hour later.
    @Test func aHugeRetryAfterDoesNotStopScheduledSyncs() async throws {
        let server = try await TestServer("retry-after-huge-scheduler")
        let pulls = FailingPulls(server, retryAfterSeconds: 999_999_999_999)
        let (replica, scheduler) = try await ClockStepTests.startFailing("huge-scheduler", server, pulls)
        #expect(await replica.engine.nextRunAt == replica.clock.nowMilliseconds + 3_600_000)
        pulls.recover()
        replica.clock.advance(by: 3_600_000)
        try await waitUntil { await scheduler.triggered == [.started, .retry] }
        await scheduler.settle()
        #expect(pulls.count == 2)
        #expect(await replica.engine.nextRunAt == nil)
        #expect(await replica.engine.lastError == nil)
        await scheduler.stop()
        await server.stop()
    }

    /// An intent whose retry time lies further off than any wait the
    /// policy gives (written before the cap, when a huge `Retry-After` made
    /// it `UInt64.max`, or by a wall clock since set back) is due now.
    @Test func anIntentWaitingLongerThanAnyRetryIsDue() async throws {
        let server = try await TestServer("retry-time-beyond-cap")
        let a = try Replica("beyond-cap", server: server)
        for n in 0..<3 { try await a.store.create(type: "task", fields: ["n": .int(Int64(n))]) }
        let offsets = try a.store.pushBatch(limit: 10, now: 0).map(\.offset)
        let now = a.clock.nowMilliseconds
        for (offset, time) in zip(offsets, [UInt64.max, now + 2 * 3_600_000]) {
            try await a.store.scheduleRetry(offsets: [offset], error: "refused", at: time, attemptsMax: 10)
        }
        #expect(try await a.engine.health().nextAttemptAt == now, "due now, shown as now")
        try await a.store.scheduleRetry(offsets: [offsets[2]], error: "refused", at: now + 1_000, attemptsMax: 10)
        let report = await a.sync()
        #expect(report.acknowledged == 2, "the two beyond any wait are pushed; the third waits its second: \(report)")
        #expect(try await a.engine.health().nextAttemptAt == now + 1_000)
        await server.stop()
    }

    /// The longest wait is the longer of the policy's longest delay with
    /// its jitter (300 s × 1.2) and `retryAfterMax`: with a `retryAfterMax`
    /// under 360 s, a retry time 350 s off is one the policy may have set
    /// (a 300 s delay jittered up), and it waits; only a time further off
    /// than any wait is due now.
    @Test func aRetryWithinTheLongestJitteredDelayWaits() async throws {
        let server = try await TestServer("retry-time-within-jitter")
        var configuration = SyncConfiguration()
        configuration.retry.retryAfterMaxMilliseconds = 60_000
        let a = try Replica("within-jitter", server: server, configuration: configuration)
        try await a.store.create(type: "task", fields: ["n": 1])
        let offset = try #require(try a.store.outbox().first?.offset)
        let now = a.clock.nowMilliseconds
        try await a.store.scheduleRetry(offsets: [offset], error: "refused", at: now + 350_000, attemptsMax: 10)
        #expect(try await a.engine.health().nextAttemptAt == now + 350_000, "not due before its time")
        #expect(await a.sync().acknowledged == 0)
        await server.stop()
    }

    /// A background run without a real budget (`.max`) is simply a sync.
    @Test func anUnboundedBackgroundRunCompletes() async throws {
        let server = try await TestServer("background-unbounded")
        let a = try Replica("a", server: server)
        let scheduler = SyncScheduler(engine: a.engine, clock: a.clock, monitor: FixedConnectivity(online: false))
        #expect(await scheduler.runBackground(budgetMilliseconds: .max).outcome == .completed)
        await server.stop()
    }

    /// Connectivity reports that arrive while the scheduler stops (a flapping
    /// network) are not handled after `stop()`: no timer is set, and no sync
    /// starts, however long the clock runs.
    @Test func aStoppedSchedulerStaysStopped() async throws {
        let server = try await TestServer("scheduler-stopped")
        let replica = try Replica("stopped", server: server)
        let (monitor, scheduler) = await ScriptedConnectivity.started(replica)
        try await replica.clock.waitForSleepers(1)  // the periodic timer
        await scheduler.settle()
        for _ in 0..<50 {
            monitor.continuation.yield(.unsatisfied)
            monitor.continuation.yield(.satisfied)
        }
        await scheduler.stop()
        try await Task.sleep(for: .milliseconds(300))
        #expect(replica.clock.sleeperCount == 0, "a timer was set after stop()")
        for _ in 0..<4 {
            replica.clock.advance(by: 30_000)
            try await Task.sleep(for: .milliseconds(50))
        }
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started])
        await server.stop()
    }
}

/// Time spent without a network path is not time the server was
/// reachable: with the scheduler, no health check runs offline to say so.
@Suite struct OfflineHealthTests {
    @Test func waitingWithoutANetworkPathIsNotBeingStuck() async throws {
        let server = try await TestServer("health-path-lost")
        let replica = try Replica("path-lost", server: server, clock: ManualClock(startingAt: wallClockMilliseconds()))
        let (monitor, scheduler) = await ScriptedConnectivity.started(replica)
        try await waitUntil { await scheduler.triggered.count == 1 }
        await scheduler.settle()
        #expect(await replica.engine.isOnline)
        monitor.continuation.yield(.unsatisfied)
        try await waitUntil { replica.clock.sleeperCount == 0 }  // the periodic timer is cancelled
        try await replica.store.create(type: "task", fields: ["n": 1])
        replica.clock.advance(by: 3_600_000)
        let health = try await replica.engine.health()
        #expect(!health.isOnline && !health.isStuck, "an hour without a network path: \(health)")
        await scheduler.stop()
        await server.stop()
    }
}

/// Connectivity reports a test sends through `continuation`.
struct ScriptedConnectivity: ConnectivityMonitor {
    let stream: AsyncStream<NetworkPath>
    let continuation: AsyncStream<NetworkPath>.Continuation

    init() { (stream, continuation) = AsyncStream.makeStream() }

    func paths() -> AsyncStream<NetworkPath> { stream }

    /// A scheduler of `replica`'s engine on a monitor of this kind, started,
    /// the monitor having reported a path (its sync may not have begun).
    static func started(_ replica: Replica) async -> (monitor: ScriptedConnectivity, scheduler: SyncScheduler) {
        let monitor = ScriptedConnectivity()
        let scheduler = SyncScheduler(engine: replica.engine, clock: replica.clock, monitor: monitor)
        await scheduler.start()
        monitor.continuation.yield(.satisfied)
        return (monitor, scheduler)
    }
}

/// Through the real server, but every push and pull is refused with
/// `status` (429 or 503) and `retryAfterSeconds` until `recover()`.
final class Refusing: SyncTransport {
    private let inner: HTTPTransport
    private let status: Int
    private let retryAfterSeconds: Int
    private let refusing = Mutex(true)

    init(_ server: TestServer, status: Int, retryAfterSeconds: Int) {
        inner = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        self.status = status
        self.retryAfterSeconds = retryAfterSeconds
    }

    func recover() { refusing.withLock { $0 = false } }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        try refuse("push")
        return try await inner.push(request)
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        try refuse("pull")
        return try await inner.pull(cursor: cursor, limit: limit, types: types)
    }

    private func refuse(_ path: String) throws(TransportError) {
        guard refusing.withLock({ $0 }) else { return }
        throw TransportError(.status(status, nil), "\(path): HTTP \(status)", retryAfterSeconds: retryAfterSeconds)
    }
}

/// Health through `inner`; every push and pull answered 429 with `retryAfterSeconds`.
struct RateLimited: SyncTransport {
    let inner: HTTPTransport
    let retryAfterSeconds: Int

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { throw limited("push") }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse { throw limited("pull") }

    private func limited(_ path: String) -> TransportError {
        TransportError(.status(429, nil), "\(path): HTTP 429", retryAfterSeconds: retryAfterSeconds)
    }
}
