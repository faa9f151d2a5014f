import Foundation
import LogFormat
import LogStore
@testable import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// `SyncEngine.watchFeed`: a replica hears of another device's changes
/// through the server's long poll, against the real server over loopback.
@Suite struct FeedWatchTests {
    /// The watching replica syncs on its own when the writer's changes
    /// reach the server: it never calls `sync()`. Cancelling its task ends
    /// the watch, the wait in flight too.
    @Test func aWatchingReplicaHearsAnotherDevicesChanges() async throws {
        let server = try await TestServer("feed-watch")
        defer { Task { await server.stop() } }
        let writer = try Replica("feed-watch-writer", server: server)
        let watcher = try Replica("feed-watch-watcher", server: server)
        let watch = watcher.watching()
        _ = try await writer.store.create(type: "task", id: "t1", fields: ["n": 1])
        try await writer.syncUntilQuiet()
        try await waitUntil { try watcher.entities("task") == ["t1": ["n": 1]] }
        _ = try await writer.store.update(type: "task", id: "t1", changes: ["n": 2])
        try await writer.syncUntilQuiet()
        try await waitUntil { try watcher.entities("task") == ["t1": ["n": 2]] }
        try await watch.end()
    }

    /// A replica that pulls one scope waits with the server in that
    /// scope's feed (its cursor goes with that feed alone): a change of
    /// another scope does not end the server's wait, and the scope's next
    /// change comes with no sync called.
    @Test func aWatchWaitsInTheScopesItPulls() async throws {
        let server = try await TestServer("feed-watch-scopes", scopeField: "project")
        defer { Task { await server.stop() } }
        let writer = try Replica("feed-watch-scopes-writer", server: server)
        var configuration = SyncConfiguration()
        configuration.pulledScopes = PulledScopes(field: "project", scopes: ["p1"])
        let watcher = try Replica("feed-watch-scopes-watcher", server: server, configuration: configuration)
        _ = try await writer.store.create(type: "task", id: "a", fields: ["project": "p1"])
        try await writer.syncUntilQuiet()
        try await watcher.syncUntilQuiet()
        let watch = watcher.watching()
        _ = try await writer.store.create(type: "task", id: "b", fields: ["project": "p2"])
        try await writer.syncUntilQuiet()
        _ = try await writer.store.create(type: "task", id: "c", fields: ["project": "p1"])
        try await writer.syncUntilQuiet()
        try await waitUntil { try watcher.entities("task").keys.sorted() == ["a", "c"] }
        #expect(try watcher.entries(.resync).isEmpty)
        try await watch.end()
    }

    /// Two replicas that both watch, each writing and syncing while the
    /// other's watch syncs too (the engine's single flight joins runs):
    /// each ends with every task of both, as the server has them.
    @Test func twoWatchingReplicasHearEachOther() async throws {
        let server = try await TestServer("feed-watch-both")
        defer { Task { await server.stop() } }
        let replicas = [try Replica("feed-watch-both-a", server: server), try Replica("feed-watch-both-b", server: server)]
        let watches = replicas.map { $0.watching() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (index, replica) in replicas.enumerated() {
                group.addTask {
                    for n in 0..<10 {
                        _ = try await replica.store.create(type: "task", id: "r\(index)-\(n)", fields: ["n": .int(Int64(n))])
                        _ = await replica.sync()
                    }
                }
            }
            try await group.waitForAll()
        }
        let expected = Dictionary(uniqueKeysWithValues: (0..<2).flatMap { index in
            (0..<10).map { n in ("r\(index)-\(n)", ["n": Value.int(Int64(n))] as Fields) }
        })
        for replica in replicas {
            try await waitUntil { try replica.entities("task") == expected && replica.store.outboxCount() == 0 }
            #expect(replica.lostChanges.isEmpty)
        }
        for watch in watches { try await watch.end() }
    }

    /// A failed wait is asked again after 1 s, then 2, then 4 (each with
    /// jitter down to half); once the server answers, the watch goes on.
    @Test func aFailedWaitIsAskedAgainAfterAGrowingPause() async throws {
        let server = try await TestServer("feed-watch-failing")
        defer { Task { await server.stop() } }
        let waits = FailingWaits(server)
        let watcher = try Replica("feed-watch-failing", server: server, transport: waits)
        let watch = watcher.watching()
        for (attempt, bound) in [(1, 1_000), (2, 2_000), (3, 4_000)] as [(Int, UInt64)] {
            try await watcher.clock.waitForSleepers(1)
            #expect(waits.count == attempt)
            let pause = try #require(watcher.clock.sleeperDeadlines.first) - watcher.clock.monotonicMilliseconds
            #expect((bound / 2...bound).contains(pause), "attempt \(attempt): \(pause) ms")
            if attempt == 3 { waits.recover() }
            watcher.clock.advance(by: pause)
        }
        try await anotherDeviceWritesATask(to: server, "feed-watch-failing-writer")
        try await waitUntil { try watcher.entities("task").keys.sorted() == ["t1"] }
        try await watch.end()
    }

    /// A wait the server refuses with a `Retry-After` longer than the
    /// backoff is asked again only after it.
    @Test func aFailedWaitKeepsToTheServersRetryAfter() async throws {
        let server = try await TestServer("feed-watch-retry-after")
        defer { Task { await server.stop() } }
        let waits = FailingWaits(server, failure: TransportError(.status(429, .rateLimited), "wait: HTTP 429", retryAfterSeconds: 30))
        let watcher = try Replica("feed-watch-retry-after", server: server, transport: waits)
        let watch = watcher.watching()
        try await watcher.clock.waitForSleepers(1)
        #expect(watcher.clock.sleeperDeadlines == [watcher.clock.monotonicMilliseconds + 30_000] && waits.count == 1)
        try await watch.end()
    }

    /// A server that ignores `wait` (the protocol ignores unknown
    /// parameters) answers at once: the watch asks it once a wait's time,
    /// not in a loop.
    @Test func aServerThatDoesNotWaitIsAskedOnceAWaitsTime() async throws {
        let server = try await TestServer("feed-watch-no-wait")
        defer { Task { await server.stop() } }
        let waits = FailingWaits(server, answersAtOnce: true)
        let watcher = try Replica("feed-watch-no-wait", server: server, transport: waits)
        let watch = watcher.watching()
        for asked in 1...3 {
            try await watcher.clock.waitForSleepers(1)
            #expect(watcher.clock.sleeperDeadlines == [watcher.clock.monotonicMilliseconds + 30_000] && waits.count == asked)
            watcher.clock.advance(by: 30_000)
        }
        try await watch.end()
    }

    /// A change heard while the run that would pull it fails is not asked
    /// about again until the failed run's backoff ends: the watch sleeps
    /// until then, and the run after it pulls the change.
    @Test func aWatchKeepsToAFailedRunsBackoff() async throws {
        let server = try await TestServer("feed-watch-backoff")
        defer { Task { await server.stop() } }
        let pulls = FailingPulls(server, retryAfterSeconds: nil)
        let waits = FailingWaits(server, pulls: pulls)
        waits.recover()
        let watcher = try Replica("feed-watch-backoff", server: server, transport: waits)
        let watch = watcher.watching()
        try await anotherDeviceWritesATask(to: server, "feed-watch-backoff-writer")
        try await watcher.clock.waitForSleepers(1)
        let backoff = try #require(await watcher.engine.nextRunAt)
        #expect(watcher.clock.sleeperDeadlines == [backoff - watcher.clock.nowMilliseconds + watcher.clock.monotonicMilliseconds])
        #expect(waits.count == 1 && pulls.count == 1)
        pulls.recover()
        watcher.clock.advance(by: backoff - watcher.clock.nowMilliseconds)
        try await waitUntil { try watcher.entities("task").keys.sorted() == ["t1"] }
        try await watch.end()
    }

    /// On a path the policy syncs not over (cellular, with sync over it
    /// off), the watch asks the server nothing, and looks again every 5 s;
    /// once the path is free, it waits with the server again.
    @Test func aWatchAsksNothingOverAPathThePolicyRefuses() async throws {
        let server = try await TestServer("feed-watch-path")
        defer { Task { await server.stop() } }
        let waits = FailingWaits(server)
        waits.recover()
        var configuration = SyncConfiguration()
        configuration.network.syncsOnExpensivePaths = false
        let watcher = try Replica("feed-watch-path", server: server, configuration: configuration, transport: waits)
        await watcher.engine.networkPathChanged(NetworkPath(isSatisfied: true, isExpensive: true))
        let watch = watcher.watching()
        for _ in 0..<3 {
            try await watcher.clock.waitForSleepers(1)
            #expect(watcher.clock.sleeperDeadlines == [watcher.clock.monotonicMilliseconds + 5_000] && waits.count == 0)
            watcher.clock.advance(by: 5_000)
        }
        try await watcher.clock.waitForSleepers(1)
        await watcher.engine.networkPathChanged(NetworkPath(isSatisfied: true))
        watcher.clock.advance(by: 5_000)
        try await anotherDeviceWritesATask(to: server, "feed-watch-path-writer")
        try await waitUntil { try watcher.entities("task").keys.sorted() == ["t1"] }
        #expect(waits.count >= 1)
        try await watch.end()
    }

    /// Another replica of the same user, `name`, creates task t1 and syncs it to `server`.
    private func anotherDeviceWritesATask(to server: TestServer, _ name: String) async throws {
        let writer = try Replica(name, server: server)
        _ = try await writer.store.create(type: "task", id: "t1", fields: [:])
        try await writer.syncUntilQuiet()
    }

    /// `HTTPTransport.waitForChange` asks for one change, with `wait`, and
    /// gives its request the wait on top of its timeouts: an answer 3 s
    /// late, past `requestTimeout` and `resourceTimeout` (1 s), is taken
    /// within a wait of 8 s, where a pull without one fails at 1 s.
    @Test func aWaitingRequestHasItsWaitOnTopOfItsTimeouts() async throws {
        let targets = Mutex<[String]>([])
        let page = try JSONEncoder().encode(
            PullResponse(changes: [HostileServerTests.change("t1", version: 1)], cursor: "c1", hasMore: false))
        let server = try ScriptedServer { request in
            targets.withLock { $0.append(request.target) }
            Thread.sleep(forTimeInterval: 3)
            return .answer(status: 200, headers: HostileServerTests.protocolHeaders, body: page)
        }
        defer { server.stop() }
        var options = loopback
        options.requestTimeout = 1
        options.resourceTimeout = 1
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: options)
        let timedOut = await #expect(throws: TransportError.self) { try await transport.pull(cursor: "c0", limit: 1) }
        #expect(timedOut?.message.contains("resourceTimeout") == true, "\(String(describing: timedOut))")
        #expect(try await transport.waitForChange(after: "c0", types: ["task"], scopes: nil, seconds: 8))
        let query = try #require(targets.withLock { $0.last }).split(separator: "?").last.map(String.init) ?? ""
        #expect(query == "limit=1&types=task&wait=8&cursor=c0", "\(query)")
    }

    /// A scheduler keeps its watch while started and online: it stops it
    /// when the path goes, and starts it again with the path, which finds
    /// at once the change made meanwhile (the scheduler's own network
    /// timer, on the manual clock, never fires here).
    @Test func aSchedulerKeepsItsWatchWhileOnline() async throws {
        let server = try await TestServer("feed-watch-scheduler")
        defer { Task { await server.stop() } }
        let waits = FailingWaits(server)
        waits.recover()
        let watcher = try Replica("feed-watch-scheduler", server: server, transport: waits)
        let (monitor, scheduler) = await ScriptedConnectivity.started(watcher)
        try await scheduler.watchFeed(waitSeconds: 30)
        try await waitUntil { await scheduler.isWatching && waits.count == 1 }
        // The start's sync is over: nothing but the watch pulls from here.
        await scheduler.settle()
        monitor.continuation.yield(.unsatisfied)
        try await waitUntil { await !scheduler.isWatching }
        try await anotherDeviceWritesATask(to: server, "feed-watch-scheduler-writer")
        #expect(try watcher.entities("task").isEmpty)
        monitor.continuation.yield(.satisfied)
        try await waitUntil { try watcher.entities("task").keys.sorted() == ["t1"] }
        #expect(waits.count >= 2 && watcher.clock.sleeperDeadlines.allSatisfy { $0 > watcher.clock.monotonicMilliseconds })
        await scheduler.stop()
        #expect(await !scheduler.isWatching)

        let other = try Replica("feed-watch-scheduler-cannot", server: server, transport: FailingPulls(server, retryAfterSeconds: nil))
        let cannot = SyncScheduler(engine: other.engine, clock: other.clock, monitor: ScriptedConnectivity())
        await #expect(throws: SyncConfigurationError.self) { try await cannot.watchFeed() }
    }

    /// A watch cancelled while its run is under way lets the run finish:
    /// the run pulls the change it was started for. (Cancelled with the
    /// watch, it abandoned its pull, and others that joined it got
    /// `.cancelled`.)
    @Test func aStoppedWatchLetsItsRunFinish() async throws {
        let server = try await TestServer("feed-watch-stopped")
        defer { Task { await server.stop() } }
        let held = HeldRequests(HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback))
        let waits = FailingWaits(server, pulls: held)
        waits.recover()
        let watcher = try Replica("feed-watch-stopped", server: server, transport: waits)
        let gate = held.holdPull()
        let watch = watcher.watching()
        try await anotherDeviceWritesATask(to: server, "feed-watch-stopped-writer")
        try await gate.waitUntilHeld()
        watch.cancel()
        gate.release()
        try await watch.value
        #expect(try watcher.entities("task").keys.sorted() == ["t1"])
    }

    /// An engine whose transport cannot wait says so.
    @Test func aTransportThatCannotWaitIsAConfigurationError() async throws {
        let server = try await TestServer("feed-watch-cannot")
        defer { Task { await server.stop() } }
        let replica = try Replica("feed-watch-cannot", server: server, transport: FailingPulls(server, retryAfterSeconds: nil))
        let error = await #expect(throws: SyncConfigurationError.self) { try await replica.engine.watchFeed() }
        #expect(error?.description.contains("FeedWaiting") == true)
    }
}

/// Through the real server (pulls through `pulls` when given); each wait
/// fails with `failure` (a network error) until `recover()`. Counts the waits.
final class FailingWaits: SyncTransport, FeedWaiting {
    private let inner: HTTPTransport
    private let pulls: (any SyncTransport)?
    private let failure: TransportError
    private let answersAtOnce: Bool
    private let state = Mutex((failing: true, count: 0))

    /// - Parameter answersAtOnce: once recovered, each wait answers "no
    ///   change" at once, as a server that ignores `wait` would.
    init(
        _ server: TestServer, pulls: (any SyncTransport)? = nil,
        failure: TransportError = TransportError(.network, "wait: connection refused"), answersAtOnce: Bool = false
    ) {
        inner = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        self.pulls = pulls
        self.failure = failure
        self.answersAtOnce = answersAtOnce
        if answersAtOnce { recover() }
    }

    var count: Int { state.withLock { $0.count } }

    func recover() { state.withLock { $0.failing = false } }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { try await inner.push(request) }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        try await (pulls ?? inner).pull(cursor: cursor, limit: limit, types: types)
    }
    func waitForChange(after cursor: String?, types: Set<String>?, scopes: Set<String>?, seconds: Int) async throws(TransportError) -> Bool {
        let failing = state.withLock { state in
            state.count += 1
            return state.failing
        }
        guard !failing else { throw failure }
        guard !answersAtOnce else { return false }
        return try await inner.waitForChange(after: cursor, types: types, scopes: scopes, seconds: seconds)
    }
}
