import LogFormat
import LogServer
import LogStore
@testable import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// The wall clock set back or forward (by an administrator, or by NTP after
/// a boot with a wrong clock) neither lengthens nor cuts short a wait: the
/// run backoff, the circuit breaker, an intent's retry and a background
/// run's budget are measured on the clock's monotonic reading, and the
/// times the engine shows move with the wall clock.
@Suite struct ClockStepTests {
    static let hour: Int64 = 3_600_000

    /// A replica whose first pull failed with `pulls`, its scheduler started
    /// with the periodic timer (2 h) out of the way.
    static func startFailing(_ name: String, _ server: TestServer, _ pulls: FailingPulls) async throws -> (Replica, SyncScheduler) {
        try await RunBackoffTests.startFailing(name, server, pulls, periodMilliseconds: 7_200_000)
    }

    /// A pull refused with `Retry-After: 100`, then the wall clock set back
    /// an hour: the scheduler retries 100 s later, not an hour and 100 s.
    @Test func aWallClockSetBackDoesNotLengthenTheRunBackoff() async throws {
        let server = try await TestServer("clock-back-run-backoff")
        let pulls = FailingPulls(server, retryAfterSeconds: 100)
        let (replica, scheduler) = try await Self.startFailing("back-run", server, pulls)
        #expect(await replica.engine.nextRunAt == replica.clock.nowMilliseconds + 100_000)
        replica.clock.stepWallClock(by: -Self.hour)
        #expect(await replica.engine.nextRunAt == replica.clock.nowMilliseconds + 100_000, "shown on the wall clock as it reads now")
        pulls.recover()
        replica.clock.advance(by: 100_000)
        try await waitUntil { await scheduler.triggered == [.started, .retry] }
        await scheduler.settle()
        #expect(pulls.count == 2)
        #expect(await replica.engine.nextRunAt == nil)
        await scheduler.stop()
        await server.stop()
    }

    /// The wall clock set forward an hour does not end the backoff early:
    /// a nudge still waits, and the retry comes 100 s after the failure.
    @Test func aWallClockSetForwardDoesNotCutTheRunBackoffShort() async throws {
        let server = try await TestServer("clock-forward-run-backoff")
        let pulls = FailingPulls(server, retryAfterSeconds: 100)
        let (replica, scheduler) = try await Self.startFailing("forward-run", server, pulls)
        #expect(await replica.engine.nextRunAt == replica.clock.nowMilliseconds + 100_000)
        replica.clock.stepWallClock(by: Self.hour)
        await scheduler.nudge()
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started], "a nudge 0 s after a pull told to wait 100 s")
        #expect(pulls.count == 1)
        pulls.recover()
        replica.clock.advance(by: 100_000)
        try await waitUntil { await scheduler.triggered == [.started, .retry] }
        await scheduler.settle()
        #expect(pulls.count == 2)
        await scheduler.stop()
        await server.stop()
    }

    /// The breaker opened by three 429s stays open 30 s whichever way the
    /// wall clock is set meanwhile.
    @Test func aWallClockStepDoesNotMoveTheBreakersEnd() async throws {
        let server = try await TestServer("clock-step-breaker")
        for (name, step) in [("back", -Self.hour), ("forward", Self.hour)] {
            let replica = try Replica(name, server: server)
            try await server.faults(FaultSettings(failNext: 3, status: 429))
            for _ in 0..<2 { _ = await replica.sync() }
            #expect(await replica.sync().outcome == .rateLimited)
            replica.clock.stepWallClock(by: step)
            #expect(await replica.engine.breakerOpenUntil == replica.clock.nowMilliseconds + 30_000, "\(name)")
            #expect(await replica.sync().outcome == .rateLimited, "\(name): the breaker is open for 30 s")
            replica.clock.advance(by: 30_000)
            #expect(await replica.sync().outcome == .completed, "\(name): the breaker closed 30 s after it opened")
        }
        await server.stop()
    }

    /// A push refused with a 503 (`Retry-After: 1`) retries its intent
    /// about a second later, even with the wall clock set back an hour.
    @Test func aWallClockSetBackDoesNotLengthenAnIntentsRetry() async throws {
        let server = try await TestServer("clock-back-intent")
        let replica = try Replica("back-intent", server: server)
        try await replica.store.create(type: "task", fields: ["n": 1])
        try await server.faults(FaultSettings(failNext: 1, status: 503))
        guard case .failed = await replica.sync().outcome else { Issue.record("the 503 fails the run"); return }
        replica.clock.stepWallClock(by: -Self.hour)
        let retryAt = try #require(try await replica.engine.health().nextAttemptAt)
        let now = replica.clock.nowMilliseconds
        #expect((now + 1_000...now + 1_200).contains(retryAt), "the retry, shown on the wall clock as it reads now (\(now)): \(retryAt)")
        replica.clock.advance(by: 1_200)
        let report = await replica.sync()
        #expect(report.outcome == .completed && report.acknowledged == 1, "\(report)")
        await server.stop()
    }

    /// A background run's budget is time that passes, not a wall-clock
    /// reading: a step forward does not end it at the first page, and a
    /// step back does not let it run past its budget: the pull in which
    /// the budget passes is abandoned, or applied if its answer came before
    /// the budget's timer ran.
    @Test func aWallClockStepDoesNotMoveABackgroundRunsBudget() async throws {
        let server = try await TestServer("clock-step-background")
        let writer = try Replica("writer", server: server)
        for n in 0..<3 { try await writer.store.create(type: "task", fields: ["n": .int(Int64(n))]) }
        try await writer.syncUntilQuiet()
        var configuration = SyncConfiguration()
        configuration.pullPageCountMax = 1
        func run(step: Int64, passing advance: UInt64) async throws -> SyncReport {
            let clock = ManualClock()
            let transport = SteppingPulls(server, clock: clock, step: step, advance: advance)
            let reader = try Replica("reader", server: server, clock: clock, configuration: configuration, transport: transport)
            let scheduler = SyncScheduler(engine: reader.engine, clock: clock, monitor: FixedConnectivity(online: false))
            return await scheduler.runBackground(budgetMilliseconds: 60_000)
        }
        let forward = try await run(step: Self.hour, passing: 0)
        #expect(forward.outcome == .completed && forward.changes == 3, "set forward an hour in the first pull: \(forward)")
        let back = try await run(step: -Self.hour, passing: 61_000)
        #expect(back.outcome == .cancelled && back.pages <= 1, "set back an hour as 61 s pass in the first pull: \(back)")
        await server.stop()
    }

    /// `SystemClock`'s monotonic reading reads as Unix milliseconds (the
    /// wall clock at the process's start, advanced since), never goes back,
    /// and a sleep on it ends at its deadline or later.
    @Test func theSystemClocksMonotonicReadingIsUnixTimeThatNeverGoesBack() async throws {
        let clock = SystemClock()
        var last = clock.monotonicMilliseconds
        #expect(last.distance(to: clock.nowMilliseconds).magnitude < 3_600_000, "no step of an hour during the tests")
        for _ in 0..<10_000 {
            let next = clock.monotonicMilliseconds
            #expect(next >= last)
            last = next
        }
        let deadline = clock.monotonicMilliseconds + 20
        try await clock.sleep(untilMilliseconds: deadline)
        #expect(clock.monotonicMilliseconds >= deadline)
    }
}

/// Through the real server; the first pull steps `clock`'s wall clock by
/// `step` and lets `advance` milliseconds pass, as if it took that long.
final class SteppingPulls: SyncTransport {
    private let inner: HTTPTransport
    private let clock: ManualClock
    private let step: Int64
    private let advance: UInt64
    private let pulls = Mutex(0)

    init(_ server: TestServer, clock: ManualClock, step: Int64, advance: UInt64) {
        inner = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        self.clock = clock
        self.step = step
        self.advance = advance
    }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { try await inner.push(request) }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        let first = pulls.withLock { count in
            count += 1
            return count == 1
        }
        if first {
            clock.stepWallClock(by: step)
            clock.advance(by: advance)
        }
        return try await inner.pull(cursor: cursor, limit: limit, types: types)
    }
}
