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
        let pushes = HeldPushes(HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback))
        let a = try Replica("a", server: server, transport: pushes)
        let (first, joiner) = (SyncCancellation(), SyncCancellation())
        try await a.store.create(type: "task", fields: ["n": 1])
        let gate = pushes.hold()
        let started = Task { await a.engine.sync(cancellation: first) }
        try await gate.waitUntilHeld()
        let joined = Task { await a.engine.sync(cancellation: joiner) }
        try await waitUntil { await a.engine.callersOfRunningSync == 2 }
        gate.release()
        #expect([await started.value.outcome, await joined.value.outcome] == [.completed, .completed])

        try await a.store.create(type: "task", fields: ["n": 2])
        let next = pushes.hold()
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
        let pushes = HeldPushes(HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), answered: stop.cancel)
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
}

/// Through `inner`; a push waits at the gate `hold()` returned, if any,
/// and calls `answered` once its answer has come.
final class HeldPushes: SyncTransport {
    private let inner: HTTPTransport
    private let answered: @Sendable () -> Void
    private let gate = Mutex<PullGate?>(nil)

    init(_ inner: HTTPTransport, answered: @escaping @Sendable () -> Void = {}) {
        self.inner = inner
        self.answered = answered
    }

    /// Holds the next push until the gate's `release()`.
    func hold() -> PullGate {
        let next = PullGate(holdFirst: true)
        gate.withLock { $0 = next }
        return next
    }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        if let held = gate.withLock({ gate in defer { gate = nil }; return gate }) { await held.pass() }
        let response = try await inner.push(request)
        answered()
        return response
    }
    func pull(cursor: String?, limit: Int) async throws(TransportError) -> PullResponse {
        try await inner.pull(cursor: cursor, limit: limit)
    }
}
