import LogFormat
import LogStore
@testable import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// A `SyncCancellation` stops the run it was given to, and no other: the
/// run's task is shared by the callers that join it, and each caller's
/// handler on it is dropped as the caller returns.
@Suite struct CancellationTests {
    /// Cancellations fired after their run ended (its caller's, and a
    /// joiner's) do not stop the next run, and one passed to many syncs
    /// and never cancelled stops none.
    @Test func aCancellationFiredAfterItsRunDoesNotStopTheNext() async throws {
        let server = try await TestServer("cancel-after-run")
        let pushes = HeldRequests(HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback))
        let a = try Replica("a", server: server, transport: pushes)
        let (first, joiner) = (SyncCancellation(), SyncCancellation())
        try await a.store.create(type: "task", fields: ["n": 1])
        let gate = pushes.holdPush()
        let started = Task { await a.engine.sync(cancellation: first) }
        try await gate.waitUntilHeld()
        let joined = Task { await a.engine.sync(cancellation: joiner) }
        try await waitUntil { await a.engine.callersOfRunningSync == 2 }
        gate.release()
        #expect([await started.value.outcome, await joined.value.outcome] == [.completed, .completed])

        try await a.store.create(type: "task", fields: ["n": 2])
        let next = pushes.holdPush()
        let run = Task { await a.engine.sync() }
        try await next.waitUntilHeld()
        first.cancel()
        joiner.cancel()
        next.release()
        let report = await run.value
        #expect(report.outcome == .completed && report.acknowledged == 1, "\(report)")

        let kept = SyncCancellation()
        for n in 3...5 {
            try await a.store.create(type: "task", fields: ["n": .int(Int64(n))])
            #expect(await a.engine.sync(cancellation: kept).acknowledged == 1)
        }
        await server.stop()
    }

    /// A push whose answer came before the run was cancelled has its
    /// answer recorded: the run ends cancelled with the intent acknowledged,
    /// and the next run has nothing to push.
    @Test func aPushAnsweredAsTheRunIsCancelledIsRecorded() async throws {
        let server = try await TestServer("cancel-after-answer")
        let stop = SyncCancellation()
        let pushes = HeldRequests(HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), answered: stop.cancel)
        let a = try Replica("a", server: server, transport: pushes)
        try await a.store.create(type: "task", fields: ["title": "kept"])
        let report = await a.engine.sync(cancellation: stop)
        #expect(report.outcome == .cancelled && report.acknowledged == 1, "\(report)")
        #expect(try a.store.outboxCount() == 0)
        let next = await a.sync()
        #expect(next.outcome == .completed && next.acknowledged == 0 && next.retried == 0, "\(next)")
        await server.stop()
    }

    /// A deadline's timer ends with the sync: none sleeps on after it. A
    /// deadline already past stops the run before it sends anything that
    /// counts (the intent stays pending, unattempted), and the next run
    /// pushes it.
    @Test func aDeadlinesTimerEndsWithItsSync() async throws {
        let server = try await TestServer("cancel-deadline-timer")
        let a = try Replica("a", server: server)
        try await a.store.create(type: "task", fields: ["title": "kept"])
        let now = a.clock.monotonicMilliseconds
        let past = await a.engine.sync(cancellation: SyncCancellation(deadlineMilliseconds: now, clock: a.clock))
        #expect(past.outcome == .cancelled && past.acknowledged == 0, "\(past)")
        #expect(try a.store.outbox().map(\.state.attempts) == [0])
        #expect(a.clock.sleeperCount == 0)
        let far = await a.engine.sync(cancellation: SyncCancellation(deadlineMilliseconds: now + 3_600_000, clock: a.clock))
        #expect(far.outcome == .completed && far.acknowledged == 1, "\(far)")
        #expect(a.clock.sleeperCount == 0, "the hour's timer is cancelled")
        await server.stop()
    }

    /// A request the cancellation abandons may end in a network error (its
    /// connection torn down under it) rather than in no answer: either way
    /// nothing was answered. The run ends cancelled, not offline or failed,
    /// with no backoff set and no error kept, and an abandoned push's
    /// intent stays pending with no attempt counted.
    @Test(arguments: ["health", "push", "pull"])
    func aRequestAbandonedWithANetworkErrorIsNoFailure(_ request: String) async throws {
        let server = try await TestServer("cancel-torn-down-\(request)")
        let transport = TornDownWhenCancelled(HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), holding: request)
        let a = try Replica("a", server: server, transport: transport)
        try await a.store.create(type: "task", fields: ["title": "kept"])
        let stop = SyncCancellation()
        let run = Task { await a.engine.sync(cancellation: stop) }
        try await waitUntil { transport.isHolding }
        stop.cancel()
        let report = await run.value
        #expect(report.outcome == .cancelled, "\(report)")
        #expect(await a.engine.nextRunAt == nil)
        #expect(await a.engine.lastError == nil)
        #expect(try await a.engine.health().offlineReason == nil)
        #expect(try a.store.outbox().map(\.state.attempts) == (request == "pull" ? [] : [0]))
        await server.stop()
    }
}

/// Through `inner`; the next push (or pull) waits at the gate
/// `holdPush()` (or `holdPull()`) returned, if any, and `answered` is
/// called once each push's answer has come.
final class HeldRequests: SyncTransport {
    private let inner: HTTPTransport
    private let answered: @Sendable () -> Void
    private let pushGate = Mutex<PullGate?>(nil)
    private let pullGate = Mutex<PullGate?>(nil)

    init(_ inner: HTTPTransport, answered: @escaping @Sendable () -> Void = {}) {
        self.inner = inner
        self.answered = answered
    }

    /// Holds the next push, before it is sent, until the gate's `release()`.
    func holdPush() -> PullGate { Self.hold(pushGate) }

    /// Holds the next pull, before it is sent, until the gate's `release()`.
    func holdPull() -> PullGate { Self.hold(pullGate) }

    private static func hold(_ gate: borrowing Mutex<PullGate?>) -> PullGate {
        let next = PullGate(holdFirst: true)
        gate.withLock { $0 = next }
        return next
    }

    /// Waits at the gate set, once: the next request passes freely.
    private static func pass(_ gate: borrowing Mutex<PullGate?>) async {
        if let held = gate.withLock({ gate in defer { gate = nil }; return gate }) { await held.pass() }
    }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        await Self.pass(pushGate)
        let response = try await inner.push(request)
        answered()
        return response
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        await Self.pass(pullGate)
        return try await inner.pull(cursor: cursor, limit: limit, types: types)
    }
}

/// `inner`, except that each `holding` request ("push" or "pull") waits
/// for its task's cancellation, then fails as a connection torn down does.
final class TornDownWhenCancelled: SyncTransport {
    private let inner: HTTPTransport
    private let holding: String
    private let held = Atomic<Bool>(false)

    init(_ inner: HTTPTransport, holding: String) {
        self.inner = inner
        self.holding = holding
    }

    /// Whether a held request waits (or waited) for its cancellation.
    var isHolding: Bool { held.load(ordering: .relaxed) }

    private func tornDown(_ path: String) async throws(TransportError) -> Never {
        held.store(true, ordering: .relaxed)
        try? await Task.sleep(for: .seconds(600))
        throw TransportError(.network, "\(path): connection reset")
    }

    func health() async throws(TransportError) -> HealthResponse {
        if holding == "health" { try await tornDown("GET /v1/health") }
        return try await inner.health()
    }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        if holding == "push" { try await tornDown("POST /v1/push") }
        return try await inner.push(request)
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        if holding == "pull" { try await tornDown("GET /v1/pull") }
        return try await inner.pull(cursor: cursor, limit: limit, types: types)
    }
}
