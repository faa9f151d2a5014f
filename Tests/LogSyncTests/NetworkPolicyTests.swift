import Foundation
import LogFormat
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// `SyncConfiguration.network` against the real server: a user's "sync
/// over cellular: off" and "attachments on Wi-Fi only".
@Suite struct NetworkPolicyTests {
    static let expensive = NetworkPath(isSatisfied: true, isExpensive: true)
    static let constrained = NetworkPath(isSatisfied: true, isConstrained: true)

    /// A replica with `policy`, and its transport, which counts its requests.
    static func replica(_ name: String, _ server: TestServer, _ policy: NetworkPolicy) throws -> (Replica, CountedRequests) {
        var configuration = SyncConfiguration()
        configuration.network = policy
        configuration.stuckAfterMilliseconds = 60_000
        let requests = CountedRequests(inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback))
        let replica = try Replica(
            name, server: server, clock: ManualClock(startingAt: wallClockMilliseconds()), configuration: configuration, transport: requests)
        return (replica, requests)
    }

    /// The IDs of `type` the server's feed holds, pulled by a new replica.
    static func pulledIDs(_ type: String, from server: TestServer, _ name: String) async throws -> Set<String> {
        let reader = try Replica(name, server: server)
        #expect(await reader.sync().outcome == .completed)
        return Set(try reader.entities(type).keys)
    }

    /// Over a path the policy syncs not over, a run makes no request (not
    /// even the health check) and ends as `.pathNotAllowed`, not failed;
    /// health says why. On a path that costs nothing it syncs what waited.
    @Test(arguments: [(expensive, "expensive"), (constrained, "constrained")])
    func aPathThePolicySyncsNotOverGetsNoRequest(path: NetworkPath, cost: String) async throws {
        let server = try await TestServer("policy-not-over-\(cost)")
        var policy = NetworkPolicy()
        policy.syncsOnExpensivePaths = false
        policy.syncsOnConstrainedPaths = false
        let (a, requests) = try Self.replica("a", server, policy)
        let id = try await a.store.create(type: "task", fields: ["title": "on the train"])
        await a.engine.networkPathChanged(path)
        let report = await a.sync()
        #expect(report.outcome == .pathNotAllowed)
        #expect(requests.count == 0, "a request went over the \(cost) path")
        let health = try await a.engine.health()
        #expect(!health.isOnline && health.lastError == nil && health.nextRunAt == nil)
        #expect(health.offlineReason == "the network path is \(cost), and the configuration does not sync over such a path")
        #expect(await a.engine.state == .idle)
        #expect(try await Self.pulledIDs("task", from: server, "reader-before").isEmpty)

        await a.engine.networkPathChanged(.satisfied)
        #expect(try await a.engine.health().offlineReason == nil, "the expensive path's reason outlived it")
        #expect(await a.sync().outcome == .completed)
        #expect(try await Self.pulledIDs("task", from: server, "reader-after") == [id])
        await server.stop()
    }

    /// The default policy syncs over any path, as before it existed.
    @Test func theDefaultPolicySyncsOverAnExpensivePath() async throws {
        let server = try await TestServer("policy-default")
        let (a, _) = try Self.replica("a", server, NetworkPolicy())
        let id = try await a.store.create(type: "attachment", fields: ["bytes": .bytes([1, 2, 3])])
        await a.engine.networkPathChanged(NetworkPath(isSatisfied: true, isExpensive: true, isConstrained: true))
        #expect(await a.sync().acknowledged == 1)
        #expect(try await Self.pulledIDs("attachment", from: server, "reader") == [id])
        await server.stop()
    }

    /// On an expensive path the types pushed only on free paths wait in
    /// the outbox, with no attempt counted, while the rest is pushed and
    /// the feed pulled; health counts them as held, and a wait for them is
    /// not being stuck. On a free path they go.
    @Test func heldTypesWaitForAFreePath() async throws {
        let server = try await TestServer("policy-held")
        var policy = NetworkPolicy()
        policy.typesPushedOnlyOnFreePaths = ["attachment"]
        let (a, _) = try Self.replica("a", server, policy)
        let b = try Replica("b", server: server)
        let fromB = try await b.store.create(type: "task", fields: ["title": "from b"])
        #expect(await b.sync().acknowledged == 1)

        await a.engine.networkPathChanged(Self.expensive)
        let photo = try await a.store.create(type: "attachment", fields: ["bytes": .bytes(Array(repeating: 7, count: 4_096))])
        let note = try await a.store.create(type: "task", fields: ["title": "see photo"])
        try await a.store.update(type: "attachment", id: photo, changes: ["caption": "the view"])
        let report = await a.sync()
        #expect(report.outcome == .completed && report.acknowledged == 1 && report.retried == 0)
        #expect(try a.store.get(type: "task", id: fromB) != nil, "the feed was not pulled")
        let outbox = try a.store.outbox()
        #expect(outbox.map(\.intent.entityType) == ["attachment", "attachment"])
        #expect(outbox.allSatisfy { $0.state.attempts == 0 && $0.state.status == .pending })
        // What the push progress counts as due (`SyncState.pushing`'s total).
        let now = a.clock.monotonicMilliseconds
        #expect(try a.store.dueCount(now: now, holdingTypes: ["attachment"]) == 0)
        #expect(try a.store.dueCount(now: now) == 2)

        a.clock.advance(by: 3_600_000)
        #expect(await a.sync().acknowledged == 0)
        var health = try await a.engine.health()
        #expect(health.pendingCount == 2 && health.heldCount == 2)
        #expect(health.isOnline && !health.isStuck, "an hour held for a free path: \(health)")
        // The intents' times are the wall clock's; the age is about an hour.
        #expect(health.description.hasPrefix("2 pending (oldest 3"))
        #expect(health.description.contains(" s, 2 held for a free path), 0 failed, online, "), "\(health)")
        #expect(try await Self.pulledIDs("task", from: server, "reader-held") == [fromB, note])
        #expect(try await Self.pulledIDs("attachment", from: server, "reader-held-attachments").isEmpty)

        // Held on a constrained path too; counted only while held.
        await a.engine.networkPathChanged(Self.constrained)
        #expect(await a.sync().acknowledged == 0)
        await a.engine.networkPathChanged(.satisfied)
        health = try await a.engine.health()
        #expect(health.heldCount == 0 && health.isStuck, "an hour pending on a free path, online: \(health)")
        #expect(await a.sync().acknowledged == 2)
        #expect(try a.store.outbox().isEmpty)
        #expect(try await Self.pulledIDs("attachment", from: server, "reader-free") == [photo])
        await server.stop()
    }

    /// The scheduler starts no run over a path the policy syncs not over,
    /// whatever triggers come; once the path costs nothing, the network
    /// timer's run syncs what waited.
    @Test func theSchedulerWaitsForAPathThePolicySyncsOver() async throws {
        let server = try await TestServer("policy-scheduler")
        var policy = NetworkPolicy()
        policy.syncsOnExpensivePaths = false
        let (a, requests) = try Self.replica("a", server, policy)
        let monitor = ScriptedConnectivity()
        let scheduler = SyncScheduler(engine: a.engine, clock: a.clock, monitor: monitor)
        await scheduler.start()
        monitor.continuation.yield(Self.expensive)
        try await waitUntil { await a.engine.networkPath == Self.expensive }
        let id = try await a.store.create(type: "task", fields: ["title": "offline by choice"])
        await scheduler.nudge()
        for _ in 0..<4 {
            a.clock.advance(by: 30_000)
            try await Task.sleep(for: .milliseconds(20))
        }
        await scheduler.settle()
        #expect(await scheduler.triggered.isEmpty)
        #expect(requests.count == 0)

        monitor.continuation.yield(.satisfied)
        try await a.clock.waitForSleepers(1)  // the network timer: offline, no other was set
        a.clock.advance(by: SchedulerCore().networkDebounceMilliseconds)
        try await waitUntil { await scheduler.triggered == [.networkRegained] }
        await scheduler.settle()
        #expect(try await Self.pulledIDs("task", from: server, "reader") == [id])
        await scheduler.stop()
        await server.stop()
    }

    /// On an expensive path the policy syncs over, a held type's intents
    /// wait; when the path becomes free, the scheduler syncs them after the
    /// network debounce, with no other trigger.
    @Test func theSchedulerPushesHeldIntentsOnceThePathIsFree() async throws {
        let server = try await TestServer("policy-scheduler-held")
        var policy = NetworkPolicy()
        policy.typesPushedOnlyOnFreePaths = ["attachment"]
        let (a, _) = try Self.replica("a", server, policy)
        let photo = try await a.store.create(type: "attachment", fields: ["bytes": .bytes([9])])
        let monitor = ScriptedConnectivity()
        var core = SchedulerCore()
        core.periodMilliseconds = .max
        let scheduler = SyncScheduler(engine: a.engine, clock: a.clock, monitor: monitor, core: core)
        await scheduler.start()
        monitor.continuation.yield(Self.expensive)
        try await waitUntil { await scheduler.triggered == [.started] }
        await scheduler.settle()
        #expect(try a.store.outbox().count == 1, "the attachment went over the expensive path")

        monitor.continuation.yield(.satisfied)
        try await waitUntil { await a.engine.networkPath == .satisfied }
        try await a.clock.waitForSleepers(1)
        a.clock.advance(by: SchedulerCore().networkDebounceMilliseconds)
        try await waitUntil { await scheduler.triggered == [.started, .networkRegained] }
        await scheduler.settle()
        #expect(try a.store.outbox().isEmpty)
        #expect(try await Self.pulledIDs("attachment", from: server, "reader") == [photo])
        await scheduler.stop()
        await server.stop()
    }

    /// A path that changes during a run, to one the policy syncs not over
    /// (the phone left Wi-Fi), stops the run before its next request: the
    /// answers recorded stay, the rest waits for a free path.
    @Test func aRunStopsWhenThePathStopsAllowingIt() async throws {
        let server = try await TestServer("policy-mid-run")
        var configuration = SyncConfiguration()
        configuration.network.syncsOnExpensivePaths = false
        configuration.pushBatchCountMax = 1
        let transport = AfterFirstAnswer(inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback))
        let a = try Replica("a", server: server, configuration: configuration, transport: transport)
        transport.then { await a.engine.networkPathChanged(Self.expensive) }
        for n in 0..<3 { try await a.store.create(type: "task", fields: ["n": .int(Int64(n))]) }
        let report = await a.sync()
        #expect(report.outcome == .pathNotAllowed && report.acknowledged == 1 && report.pages == 0, "\(report)")
        #expect(try a.store.outboxCount() == 2)
        #expect(await a.engine.state == .idle)
        await a.engine.networkPathChanged(.satisfied)
        #expect(await a.sync().acknowledged == 2)

        // Between pulled pages alike.
        configuration.pullPageCountMax = 1
        let pulling = AfterFirstAnswer(inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), afterPull: true)
        let b = try Replica("b", server: server, configuration: configuration, transport: pulling)
        pulling.then { await b.engine.networkPathChanged(Self.expensive) }
        let pulled = await b.sync()
        #expect(pulled.outcome == .pathNotAllowed && pulled.pages == 1, "\(pulled)")
        #expect(try b.store.count(type: "task") == 1)
        await b.engine.networkPathChanged(.satisfied)
        #expect(await b.sync().outcome == .completed)
        #expect(try b.store.count(type: "task") == 3)
        await server.stop()
    }
}

/// Through `inner`; after the first push's answer (or the first pull's,
/// with `afterPull`), and before the engine gets it, runs what `then` set.
final class AfterFirstAnswer: SyncTransport {
    private let inner: HTTPTransport
    private let afterPull: Bool
    private let action = Mutex<(@Sendable () async -> Void)?>(nil)

    init(inner: HTTPTransport, afterPull: Bool = false) {
        self.inner = inner
        self.afterPull = afterPull
    }

    private func runAction() async {
        if let body = action.withLock({ action in defer { action = nil }; return action }) { await body() }
    }

    func then(_ body: @escaping @Sendable () async -> Void) { action.withLock { $0 = body } }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        let response = try await inner.push(request)
        if !afterPull { await runAction() }
        return response
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        let page = try await inner.pull(cursor: cursor, limit: limit, types: types)
        if afterPull { await runAction() }
        return page
    }
}
