import LogFormat
import LogServer
import LogStore
@testable import LogSync
import LogSyncHTTP
import LogTesting
import Testing

/// Timing at the edges: delays and deadlines near the end of UInt64, and a
/// scheduler that must stay stopped.
@Suite struct TimingTests {
    /// `Retry-After` is the server's number (any integer the header holds):
    /// one too large for milliseconds waits as long as a clock can, and
    /// never traps.
    @Test func aHugeRetryAfterSaturatesTheDelays() {
        var random = SeededRandom(seed: 1)
        let policy = RetryPolicy()
        let first = policy.delay(beforeRetry: 1, retryAfterSeconds: Int.max, random: &random)
        #expect(first == .max)
        let third = policy.delay(beforeRetry: 3, retryAfterSeconds: Int(UInt64.max / 1_000) + 1, random: &random)
        #expect(third == .max)
        var breaker = CircuitBreaker()
        var opened: [Bool] = []
        for _ in 0..<3 { opened.append(breaker.recordRateLimited(retryAfterSeconds: Int.max, at: 1_795_000_000_000)) }
        #expect(opened == [false, false, true])
        #expect(breaker.openUntil == .max && breaker.isOpen(at: .max - 1))
    }

    /// The engine with a server that answers every push and pull with a 429
    /// and an enormous `Retry-After`: the intent waits, the breaker opens.
    @Test func anEngineToldToWaitForeverWaits() async throws {
        let server = try await TestServer("retry-after-huge")
        let transport = RateLimited(
            inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), retryAfterSeconds: Int.max)
        let a = try Replica("a", server: server, transport: transport)
        try await a.store.create(type: "task", fields: ["n": 1])
        #expect(await a.sync().outcome != .completed)
        #expect(try await a.engine.health().nextAttemptAt == .max)
        #expect(await a.sync().outcome != .completed)
        #expect(await a.sync().outcome == .rateLimited)
        #expect(await a.engine.breakerOpenUntil == .max)
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
        let monitor = ScriptedConnectivity()
        let scheduler = SyncScheduler(engine: replica.engine, clock: replica.clock, monitor: monitor)
        await scheduler.start()
        monitor.continuation.yield(true)
        try await replica.clock.waitForSleepers(1)  // the periodic timer
        await scheduler.settle()
        for _ in 0..<50 {
            monitor.continuation.yield(false)
            monitor.continuation.yield(true)
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
        let monitor = ScriptedConnectivity()
        let scheduler = SyncScheduler(engine: replica.engine, clock: replica.clock, monitor: monitor)
        await scheduler.start()
        monitor.continuation.yield(true)
        try await waitUntil { await scheduler.triggered.count == 1 }
        await scheduler.settle()
        #expect(await replica.engine.isOnline)
        monitor.continuation.yield(false)
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
    let stream: AsyncStream<Bool>
    let continuation: AsyncStream<Bool>.Continuation

    init() { (stream, continuation) = AsyncStream.makeStream() }

    func paths() -> AsyncStream<Bool> { stream }
}

/// Health through `inner`; every push and pull answered 429 with `retryAfterSeconds`.
struct RateLimited: SyncTransport {
    let inner: HTTPTransport
    let retryAfterSeconds: Int

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { throw limited("push") }
    func pull(cursor: String?, limit: Int) async throws(TransportError) -> PullResponse { throw limited("pull") }

    private func limited(_ path: String) -> TransportError {
        TransportError(.status(429, nil), "\(path): HTTP 429", retryAfterSeconds: retryAfterSeconds)
    }
}
