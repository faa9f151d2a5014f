import Foundation
import LogFormat
import LogServer
import LogStore
@testable import LogSync
import LogTesting
import Synchronization
import Testing

/// `SyncEngine.health()`: what an app can show about its sync, and the
/// `stuck` flag that only waiting while the server is reachable raises.
@Suite struct HealthTests {
    /// The store stamps entries with the wall clock; the engine's manual
    /// clock starts there so ages are real differences.
    private static func replica(_ name: String, _ server: TestServer, stuckAfter: UInt64 = 600_000) throws -> Replica {
        var configuration = SyncConfiguration()
        configuration.stuckAfterMilliseconds = stuckAfter
        return try Replica(name, server: server, clock: ManualClock(startingAt: wallClockMilliseconds()), configuration: configuration)
    }

    @Test func aFreshEngineIsHealthyAndOffline() async throws {
        let server = try await TestServer("health-fresh")
        let a = try Self.replica("a", server)
        let health = try await a.engine.health()
        #expect(health.pendingCount == 0 && health.failedCount == 0)
        #expect(health.oldestPendingAgeMilliseconds == nil && health.lastSuccessAt == nil && health.lastError == nil)
        #expect(!health.isOnline && !health.isStuck)
        #expect(health.state == .idle)
        await server.stop()
    }

    /// The log line gives times as dates, not as raw milliseconds.
    @Test func theDescriptionShowsDates() {
        let health = SyncHealth(
            pendingCount: 2, heldCount: 0, failedCount: 0, oldestPendingAgeMilliseconds: 4_000, nextAttemptAt: nil,
            lastSuccessAt: 1_795_356_309_120, lastError: nil, isOnline: true, breakerOpenUntil: 1_795_356_369_120,
            nextRunAt: nil, state: .idle, isStuck: false)
        #expect(
            health.description
                == "2 pending (oldest 4 s), 0 failed, online, breaker open until 2026-11-22T14:06:09.120000Z, "
                + "last success at 2026-11-22T14:05:09.120000Z, state idle")
    }

    /// Waiting offline is not being stuck; waiting as long while the
    /// server answers, with every push failing, is.
    @Test func stuckCountsOnlyTheWaitWhileOnline() async throws {
        let server = try await TestServer("health-stuck")
        let a = try Self.replica("a", server)
        try await a.store.create(type: "task", fields: ["n": 1])
        a.clock.advance(by: 5_000)
        var health = try await a.engine.health()
        #expect(health.pendingCount == 1)
        let age = try #require(health.oldestPendingAgeMilliseconds)
        #expect((4_000...65_000).contains(age), "the intent waited about 5 s, got \(age) ms")
        // Offline for an hour: never synced, so not stuck.
        a.clock.advance(by: 3_600_000)
        health = try await a.engine.health()
        #expect(!health.isOnline && !health.isStuck)
        #expect(try #require(health.oldestPendingAgeMilliseconds) >= 3_600_000)

        // Online now, and every push fails: the wait counts from here.
        try await server.faults(FaultSettings(failNext: 1_000, status: 500))
        guard case .failed(let message) = await a.sync().outcome else { Issue.record("the push should fail"); return }
        health = try await a.engine.health()
        #expect(health.isOnline && !health.isStuck)
        #expect(health.lastError == message)
        #expect(health.nextAttemptAt != nil && health.lastSuccessAt == nil)
        a.clock.advance(by: 599_000)
        #expect(try await a.engine.health().isStuck == false)
        a.clock.advance(by: 2_000)
        #expect(await a.sync().outcome != .completed)
        health = try await a.engine.health()
        #expect(health.isOnline && health.isStuck)
        #expect(health.pendingCount == 1)

        // The server recovers: nothing pending, nothing stuck, a success time.
        try await server.faults(FaultSettings(failNext: 0))
        a.clock.advance(by: 301_000)
        #expect(await a.sync().outcome == .completed)
        health = try await a.engine.health()
        #expect(health.pendingCount == 0 && health.oldestPendingAgeMilliseconds == nil)
        #expect(!health.isStuck && health.lastError == nil)
        #expect(health.lastSuccessAt == a.clock.nowMilliseconds)
        await server.stop()
    }

    /// The wait while online is time that passes, not a wall-clock
    /// difference: a wall clock set forward an hour (NTP after a boot with
    /// a wrong clock) does not make a store stuck at once, and one set back
    /// does not make a stuck store well again. Before, both ends of the
    /// wait were wall-clock readings, so either step moved it.
    @Test func aWallClockStepDoesNotMoveTheStuckWait() async throws {
        let server = try await TestServer("health-clock-step")
        let a = try Self.replica("a", server)
        try await a.store.create(type: "task", fields: ["n": 1])
        try await server.faults(FaultSettings(failNext: 1_000, status: 500))
        guard case .failed = await a.sync().outcome else { Issue.record("the push should fail"); return }
        a.clock.stepWallClock(by: 3_600_000)
        var health = try await a.engine.health()
        #expect(health.isOnline && !health.isStuck, "set forward an hour, 0 s online")
        a.clock.advance(by: 599_000)
        #expect(try await a.engine.health().isStuck == false, "599 s online")
        a.clock.advance(by: 2_000)
        #expect(try await a.engine.health().isStuck, "601 s online")
        a.clock.stepWallClock(by: -7_200_000)
        health = try await a.engine.health()
        #expect(health.isOnline && health.isStuck, "set back two hours, 601 s online")
        await server.stop()
    }

    /// Losing the server resets the online time: a later stretch online
    /// must be long enough on its own.
    @Test func goingOfflineRestartsTheOnlineWait() async throws {
        let server = try await TestServer("health-offline")
        let a = try Self.replica("a", server, stuckAfter: 60_000)
        try await server.faults(FaultSettings(failNext: 1_000, status: 503))
        try await a.store.create(type: "task", fields: ["n": 1])
        await a.sync()
        a.clock.advance(by: 50_000)
        await server.stop()
        #expect(await a.sync().outcome == .offline)
        a.clock.advance(by: 50_000)
        try await server.restart()
        try a.connect(to: server)
        try await server.faults(FaultSettings(failNext: 1_000, status: 503))
        await a.sync()
        a.clock.advance(by: 50_000)
        #expect(try await a.engine.health().isStuck == false, "100 s online in two stretches of 50 s is not 60 s")
        a.clock.advance(by: 20_000)
        #expect(try await a.engine.health().isStuck)
    }

    /// A run counted as offline says why in `health().offlineReason` (and
    /// the log line), until a health check reaches the server again. Before,
    /// nothing told an app why: `lastError` is a failed run's, and an
    /// offline run is no failure.
    @Test func anOfflineRunSaysWhy() async throws {
        let server = try await TestServer("health-offline-reason")
        let a = try Self.replica("a", server)
        #expect(try await a.engine.health().offlineReason == nil, "no health check yet")
        await server.stop()
        #expect(await a.sync().outcome == .offline)
        let offline = try await a.engine.health()
        let reason = try #require(offline.offlineReason)
        #expect(reason.hasPrefix("GET /v1/health: "), "\(reason)")
        #expect(offline.description.contains("offline (\(reason))"), "\(offline)")
        try await server.restart()
        try a.connect(to: server)
        #expect(await a.sync().outcome == .completed)
        #expect(try await a.engine.health().offlineReason == nil)
        await server.stop()
    }

    /// A server URL no request can go to (`URL(string: "localhost:8080")`
    /// parses, with "localhost" as its scheme and no host) is named in the
    /// offline reason, with the form it needs. Before, URLSession's
    /// "unsupported URL" was dropped, and the app was offline for good
    /// with nothing to say why.
    @Test func aServerURLWithoutAHostIsNamed() async throws {
        let a = try Replica("no-host", url: try #require(URL(string: "localhost:8080")))
        #expect(await a.sync().outcome == .offline)
        let reason = try await a.engine.health().offlineReason
        #expect(
            reason == "GET /v1/health: the server URL localhost:8080 is not http:// or https:// and a host, "
                + "such as http://127.0.0.1:8080; not sent", "\(String(describing: reason))")
    }

    /// An http URL without a host (`http:///`, or `http:8080`, a colon
    /// short of `http://`) is named as one without a scheme is: the
    /// scheme alone does not make a server URL.
    @Test(arguments: ["http:///", "http:8080"])
    func anHTTPURLWithoutAHostIsNamed(_ text: String) async throws {
        let a = try Replica("no-host-http", url: try #require(URL(string: text)))
        #expect(await a.sync().outcome == .offline)
        let reason = try #require(try await a.engine.health().offlineReason)
        #expect(reason.contains("is not http:// or https:// and a host") && reason.hasSuffix("not sent"), "\(text): \(reason)")
    }

    /// A server that speaks another protocol version answers the health
    /// check: it is reachable, and no run can sync with it until the app
    /// or the server is updated. The run ends in the error state, naming the
    /// version (`Format/sync-protocol.md` section 10, "Which failures are
    /// retried"), the server counts as reachable, and the next run backs
    /// off. Before, the run ended quietly as offline, as for a captive
    /// portal: the app showed "offline" for ever, with no error to tell its
    /// user to update. Once the server is upgraded, its health check
    /// passes and the version is forgotten, though the run fails later.
    @Test func aServerOfAnotherProtocolVersionIsAnErrorNotOffline() async throws {
        let body = Data(#"{"status": "ok", "protocol_version": 2, "server_id": "01KAQ3H2M4Z8X0V6T5R7P9N1B3"}"#.utf8)
        let upgraded = Atomic<Bool>(false)
        let server = try ScriptedServer { request in
            guard upgraded.load(ordering: .relaxed) else {
                return .answer(status: 200, headers: ["Sync-Protocol-Version": "2", "Content-Type": "application/json"], body: body)
            }
            let headers = RetryPolicyTests.protocolHeaders
            guard request.path == "/v1/health" else { return .answer(status: 503, headers: headers, body: Data()) }
            return .answer(status: 200, headers: headers, body: RetryPolicyTests.health)
        }
        defer { server.stop() }
        let a = try Replica("health-version", url: server.url)
        try await a.store.create(type: "task", fields: ["n": 1])
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("expected the run to fail, got \(report.outcome)")
            return
        }
        #expect(message.contains("protocol version 2"))
        #expect(await a.engine.state == .error(message))
        let health = try await a.engine.health()
        #expect(health.isOnline && health.lastError == message)
        #expect(health.serverProtocolVersion == "2")
        #expect(health.nextRunAt != nil, "the next run backs off")
        #expect(health.pendingCount == 1)

        upgraded.store(true, ordering: .relaxed)
        guard case .failed(let pushed) = await a.sync().outcome, pushed.hasPrefix("push:") else {
            Issue.record("the push should fail on the 503")
            return
        }
        #expect(try await a.engine.health().serverProtocolVersion == nil)
    }

    /// A server whose store is unavailable answers health `503` with
    /// `Retry-After: 30` (section 6). That is the server, speaking this
    /// protocol, asking for a wait, as its 503 to a push or pull would: the
    /// run fails, the server counts as reachable, and the next run waits at
    /// least the 30 s. Before, the run ended quietly as offline, with no
    /// backoff, and the scheduler's next trigger (a write, a nudge, the
    /// 30 s timer) asked again as soon as it came.
    @Test func aHealth503WithRetryAfterFailsTheRunAndIsWaitedFor() async throws {
        let server = try await TestServer("health-503")
        defer { Task { await server.stop() } }
        let a = try Self.replica("a", server)
        try await a.store.create(type: "task", fields: ["n": 1])
        server.server.close()
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("expected the run to fail, got \(report.outcome)")
            return
        }
        #expect(message.hasPrefix("health: ") && message.contains("503"), "\(message)")
        let health = try await a.engine.health()
        #expect(health.isOnline && health.lastError == message)
        let nextRunAt = try #require(health.nextRunAt)
        #expect(nextRunAt >= a.clock.nowMilliseconds + 30_000, "waits the Retry-After")
        #expect(health.pendingCount == 1)
    }

    /// Intents out of retries are counted as failed, not as pending, and do
    /// not make the store stuck: they wait for the app.
    @Test func failedIntentsAreCountedApart() async throws {
        let server = try await TestServer("health-failed")
        let a = try Self.replica("a", server)
        try await a.store.create(type: "task", fields: ["n": 1])
        try await server.faults(FaultSettings(failNext: 1_000, status: 500))
        for _ in 0..<10 {
            await a.sync()
            a.clock.advance(by: 400_000)
        }
        let health = try await a.engine.health()
        #expect(health.failedCount == 1 && health.pendingCount == 0)
        #expect(health.oldestPendingAgeMilliseconds == nil && !health.isStuck)
        await server.stop()
    }
}
