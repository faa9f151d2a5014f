import Foundation
import LogFormat
import LogServer
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting
import Testing

/// The scheduler's debounce rules on the pure core, with test times, and
/// the scheduler itself on a manual clock against the real server.
@Suite struct SchedulerTests {
    /// Runs events at their times through the core, firing due timers in
    /// between, and returns the syncs started.
    private func run(_ events: [(UInt64, SchedulerCore.Event)], until end: UInt64) -> [SchedulerCore.Reason] {
        var core = SchedulerCore()
        var timers: [SchedulerCore.Timer: UInt64] = [:]
        var syncs: [SchedulerCore.Reason] = []
        var pending = events
        var now: UInt64 = 0
        func apply(_ actions: [SchedulerCore.Action]) {
            for action in actions {
                switch action {
                case .sync(let reason): syncs.append(reason)
                case .setTimer(let timer, let at): timers[timer] = at
                case .cancelTimer(let timer): timers[timer] = nil
                }
            }
        }
        while now <= end {
            while let (time, event) = pending.first, time <= now {
                pending.removeFirst()
                apply(core.handle(event, at: time))
            }
            for (timer, at) in timers where at <= now {
                timers[timer] = nil
                apply(core.handle(.timerFired(timer), at: now))
            }
            now += 50
        }
        return syncs
    }

    @Test func fiveWritesInOneSecondGiveOneSync() {
        let writes: [(UInt64, SchedulerCore.Event)] = [0, 250, 500, 750, 1_000].map { ($0 + 100, .localWrite) }
        let syncs = run([(0, .started(online: true))] + writes, until: 20_000)
        #expect(syncs == [.started, .localWrite])
    }

    @Test func connectThenDisconnectWithinTheDebounceGivesNone() {
        let syncs = run([(0, .started(online: false)), (1_000, .connectivity(true)), (2_000, .connectivity(false))], until: 60_000)
        #expect(syncs.isEmpty)
    }

    @Test func aGainSyncsAfterTheDebounceAndOnlyOnAGain() {
        let syncs = run(
            [(0, .started(online: false)), (1_000, .connectivity(true)), (2_000, .connectivity(true)), (3_000, .connectivity(true))],
            until: 4_000)
        #expect(syncs == [.networkRegained])
    }

    @Test func periodicWhileOnlineAndNudgesAtOnce() {
        let syncs = run([(0, .started(online: true)), (45_000, .nudge), (61_000, .connectivity(false)), (70_000, .nudge)], until: 200_000)
        #expect(syncs == [.started, .periodic, .nudge, .periodic])
    }

    /// The scheduler on a manual clock: a local write triggers one sync
    /// after the debounce, and the intent reaches the server.
    @Test func aLocalWriteIsPushedAfterTheDebounce() async throws {
        let server = try await TestServer("scheduler")
        let replica = try Replica("scheduled", server: server)
        let monitor = FixedConnectivity(online: true)
        let scheduler = SyncScheduler(engine: replica.engine, clock: replica.clock, monitor: monitor)
        await scheduler.start()
        try await replica.clock.waitForSleepers(1)  // the periodic timer
        await scheduler.settle()
        for n in 0..<5 { try await replica.store.create(type: "task", fields: ["n": .int(Int64(n))]) }
        try await replica.clock.waitForSleepers(2)  // periodic + write debounce
        replica.clock.advance(by: 1_000)
        try await waitUntil { await scheduler.triggered.count == 2 }
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started, .localWrite])
        #expect(try await server.pullAll().count == 5)
        await scheduler.stop()
    }
}

struct FixedConnectivity: ConnectivityMonitor {
    let online: Bool
    init(online: Bool) { self.online = online }
    func paths() -> AsyncStream<Bool> {
        let (stream, continuation) = AsyncStream<Bool>.makeStream()
        continuation.yield(online)
        return stream
    }
}

/// Polls a condition (really, briefly): for events that happen on other tasks.
func waitUntil(timeoutSeconds: Double = 10, _ condition: () async throws -> Bool) async throws {
    let deadline = Date().addingTimeInterval(timeoutSeconds)
    while try await !condition() {
        guard Date() < deadline else { throw SyncTestError("condition not met within \(timeoutSeconds) s") }
        try await Task.sleep(for: .milliseconds(5))
    }
}
