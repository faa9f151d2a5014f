import Foundation
import LogFormat
import LogServer
import LogStore
@testable import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
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

    /// Stopped and started again (an app restarting its scheduler), the
    /// rules wait for the first connectivity report, as at the first start:
    /// the connectivity heard before the stop may be stale, so a nudge or a
    /// write before the report starts nothing, a run's backoff arms no
    /// timer, and an offline report leaves none armed.
    @Test func aRestartWaitsForItsFirstConnectivityReport() {
        var core = SchedulerCore()
        #expect(core.handle(.started(online: true), at: 0) == [.sync(.started), .setTimer(.periodic, at: 30_000)])
        #expect(
            core.handle(.stopped, at: 1_000)
                == [.cancelTimer(.networkRegained), .cancelTimer(.localWrite), .cancelTimer(.periodic), .cancelTimer(.retry)])
        #expect(core.handle(.nudge, at: 2_000).isEmpty)
        #expect(core.handle(.localWrite, at: 2_100).isEmpty)
        #expect(core.handle(.syncEnded(nextRunAt: 10_000), at: 2_200).isEmpty)
        #expect(core.handle(.started(online: false), at: 2_300).isEmpty)
        #expect(core.handle(.connectivity(true), at: 3_000) == [.setTimer(.networkRegained, at: 5_500)])
        #expect(core.handle(.timerFired(.networkRegained), at: 5_500) == [.setTimer(.retry, at: 10_000), .setTimer(.periodic, at: 35_500)])
    }

    /// Offline, a timer that fires starts nothing and sets nothing: a loss
    /// cancels every timer, but a driver of the core other than
    /// `SyncScheduler` (which drops a cancelled timer's fire) may deliver
    /// one whose sleep ended as the loss came. The network's timer "fires
    /// only if the connection is still up", and the others wait for a gain.
    @Test func aTimerThatFiresOfflineStartsNothing() {
        var core = SchedulerCore()
        #expect(core.handle(.started(online: true), at: 0) == [.sync(.started), .setTimer(.periodic, at: 30_000)])
        #expect(core.handle(.localWrite, at: 100) == [.setTimer(.localWrite, at: 1_100)])
        #expect(core.handle(.connectivity(false), at: 200).contains(.cancelTimer(.localWrite)))
        for timer in [SchedulerCore.Timer.periodic, .localWrite, .networkRegained, .retry] {
            #expect(core.handle(.timerFired(timer), at: 1_100).isEmpty, "\(timer)")
        }
    }

    /// An app may set a timer longer than it will ever wait for (`.max`, to
    /// turn periodic syncs off): its deadline is never reached, rather than
    /// past UInt64, which trapped.
    @Test func timersOfAnyLengthAreSetNeverReached() {
        var core = SchedulerCore()
        core.periodMilliseconds = .max
        core.localWriteDebounceMilliseconds = .max
        core.networkDebounceMilliseconds = .max
        #expect(core.handle(.started(online: true), at: 1_000) == [.sync(.started), .setTimer(.periodic, at: .max)])
        #expect(core.handle(.localWrite, at: 2_000) == [.setTimer(.localWrite, at: .max)])
        _ = core.handle(.connectivity(false), at: 4_000)
        #expect(core.handle(.connectivity(true), at: 5_000) == [.setTimer(.networkRegained, at: .max)])
        #expect(core.handle(.timerFired(.networkRegained), at: 6_000) == [.sync(.networkRegained), .setTimer(.periodic, at: .max)])
        #expect(core.handle(.timerFired(.periodic), at: 7_000) == [.sync(.periodic), .setTimer(.periodic, at: .max)])
    }

    /// Triggers that come while a run is under way start none then, and
    /// one run together as it ends; when the run failed, the retry at its
    /// backoff's end is that run.
    @Test func triggersDuringARunMakeOneRunAsItEnds() {
        var core = SchedulerCore()
        #expect(core.handle(.started(online: true), at: 0) == [.sync(.started), .setTimer(.periodic, at: 30_000)])
        #expect(core.handle(.syncRunning, at: 10).isEmpty)
        #expect(core.handle(.localWrite, at: 100) == [.setTimer(.localWrite, at: 1_100)])
        #expect(core.handle(.timerFired(.localWrite), at: 1_100).isEmpty)
        #expect(core.handle(.nudge, at: 1_200).isEmpty)
        #expect(core.handle(.syncEnded(nextRunAt: nil), at: 2_000) == [.cancelTimer(.retry), .sync(.localWrite)])
        #expect(core.handle(.syncRunning, at: 2_010).isEmpty)
        #expect(core.handle(.syncEnded(nextRunAt: nil), at: 2_500) == [.cancelTimer(.retry)], "one run, not one per trigger")
        #expect(core.handle(.syncRunning, at: 3_000).isEmpty)
        #expect(core.handle(.nudge, at: 3_100).isEmpty)
        #expect(core.handle(.syncEnded(nextRunAt: 5_000), at: 3_200) == [.setTimer(.retry, at: 5_000)])
        #expect(core.handle(.timerFired(.retry), at: 5_000) == [.sync(.retry)])
    }

    /// A run that was cancelled (a background run's budget spent) starts no
    /// run for the triggers held during it: the next trigger syncs. The
    /// backoff of an earlier failed run still ends in its retry.
    @Test func triggersDuringACancelledRunStartNoRunAsItEnds() {
        var core = SchedulerCore()
        #expect(core.handle(.started(online: true), at: 0) == [.sync(.started), .setTimer(.periodic, at: 30_000)])
        #expect(core.handle(.syncRunning, at: 10).isEmpty)
        #expect(core.handle(.nudge, at: 100).isEmpty)
        #expect(core.handle(.syncEnded(nextRunAt: nil, cancelled: true), at: 200) == [.cancelTimer(.retry)])
        #expect(core.heldReason == nil)
        #expect(core.handle(.nudge, at: 300) == [.sync(.nudge)], "the next trigger syncs")
        #expect(core.handle(.syncRunning, at: 310).isEmpty)
        #expect(core.handle(.nudge, at: 400).isEmpty)
        #expect(core.handle(.syncEnded(nextRunAt: 5_000, cancelled: true), at: 500) == [.setTimer(.retry, at: 5_000)])
        #expect(core.handle(.timerFired(.retry), at: 5_000) == [.sync(.retry)])
    }

    /// A background run's end starts no run for the triggers held during
    /// it, however it ended, and cancels the debounce of a write made
    /// during it, due after its end; a failed one's backoff still ends in
    /// its retry.
    @Test func triggersDuringABackgroundRunStartNoRunAsItEnds() {
        var core = SchedulerCore()
        #expect(core.handle(.started(online: true), at: 0) == [.sync(.started), .setTimer(.periodic, at: 30_000)])
        #expect(core.handle(.syncRunning, at: 10).isEmpty)
        #expect(core.handle(.nudge, at: 100).isEmpty)
        #expect(core.handle(.localWrite, at: 150) == [.setTimer(.localWrite, at: 1_150)])
        #expect(
            core.handle(.syncEnded(nextRunAt: nil, background: true), at: 200)
                == [.cancelTimer(.retry)] + Self.quietAfterABackgroundRun(at: 200))
        #expect(core.heldReason == nil)
        #expect(core.handle(.nudge, at: 300) == [.sync(.nudge)], "the next trigger syncs")
        #expect(core.handle(.syncRunning, at: 310).isEmpty)
        #expect(core.handle(.nudge, at: 400).isEmpty)
        #expect(
            core.handle(.syncEnded(nextRunAt: 5_000, background: true), at: 500)
                == Self.quietAfterABackgroundRun(at: 500) + [.setTimer(.retry, at: 5_000)])
        #expect(core.handle(.timerFired(.retry), at: 5_000) == [.sync(.retry)])
    }

    /// What a background run's end at `now` does to the timers, online:
    /// the debounce of a write and the network's timer, due soon after,
    /// are cancelled, and the periodic timer starts its period again.
    static func quietAfterABackgroundRun(at now: UInt64) -> [SchedulerCore.Action] {
        [.cancelTimer(.localWrite), .cancelTimer(.networkRegained), .setTimer(.periodic, at: now + 30_000)]
    }

    /// The network lost and regained during a background run arms the
    /// 2.5 s timer, due after the run's end: it would start a run with no
    /// budget, in the moments before the OS suspends the app. The run's
    /// end cancels it, and sets the periodic timer it would have set. Before,
    /// the timer stayed armed and fired a run 2.5 s after the gain.
    @Test func aNetworkRegainedDuringABackgroundRunStartsNoRunPastItsEnd() {
        var core = SchedulerCore()
        #expect(core.handle(.started(online: true), at: 0) == [.sync(.started), .setTimer(.periodic, at: 30_000)])
        #expect(core.handle(.syncRunning, at: 10).isEmpty)
        #expect(core.handle(.connectivity(false), at: 100).contains(.cancelTimer(.periodic)))
        #expect(core.handle(.connectivity(true), at: 200) == [.setTimer(.networkRegained, at: 2_700)])
        let ended = core.handle(.syncEnded(nextRunAt: nil, background: true), at: 300)
        #expect(ended.contains(.cancelTimer(.networkRegained)), "\(ended)")
        #expect(ended.contains(.setTimer(.periodic, at: 30_300)), "\(ended)")
        #expect(!ended.contains { if case .sync = $0 { true } else { false } })
        #expect(core.handle(.timerFired(.periodic), at: 30_300) == [.sync(.periodic), .setTimer(.periodic, at: 60_300)])
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
        // One commit, so one write event: with five, a late event would move
        // the debounce past the clock's advance below.
        var batch = WriteBatch()
        for n in 0..<5 { try batch.create(type: "task", fields: ["n": .int(Int64(n))]) }
        try await replica.store.write(batch)
        try await replica.clock.waitForSleepers(2)  // periodic + write debounce
        replica.clock.advance(by: 1_000)
        try await waitUntil { await scheduler.triggered.count == 2 }
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started, .localWrite])
        #expect(try await server.pullAll().count == 5)
        await scheduler.stop()
    }

    /// Starting a started scheduler again (an app that starts it on every
    /// launch of a screen) changes nothing: no second started run, and a
    /// write is still pushed once, after its debounce.
    @Test func aSecondStartChangesNothing() async throws {
        let server = try await TestServer("scheduler-second-start")
        let replica = try Replica("second-start", server: server)
        let scheduler = SyncScheduler(engine: replica.engine, clock: replica.clock, monitor: FixedConnectivity(online: true))
        await scheduler.start()
        try await scheduler.settle(afterSyncs: 1)
        await scheduler.start()
        try await replica.store.create(type: "task", fields: ["n": 1])
        try await replica.clock.waitForSleepers(2)  // periodic + write debounce
        replica.clock.advance(by: 1_000)
        try await scheduler.settle(afterSyncs: 2)
        #expect(await scheduler.triggered == [.started, .localWrite])
        #expect(try await server.pullAll().count == 1)
        await scheduler.stop()
        await server.stop()
    }

    /// A nudge after a restart, before the restart's first connectivity
    /// report, starts no run: the stop forgot the connectivity heard before
    /// it, which may be stale by the restart (here the monitor reports
    /// nothing more).
    @Test func aNudgeBeforeARestartsFirstReportStartsNoRun() async throws {
        let server = try await TestServer("scheduler-restart")
        let replica = try Replica("restart", server: server)
        let (_, scheduler) = await ScriptedConnectivity.started(replica)
        try await waitUntil { await scheduler.triggered.count == 1 }
        await scheduler.settle()
        await scheduler.stop()
        await scheduler.start()
        await scheduler.nudge()
        #expect(await scheduler.triggered == [.started])
        await scheduler.stop()
        await scheduler.settle()
        await server.stop()
    }

    /// A scheduler released without `stop()` cancels its timers as it goes:
    /// the periodic timer's task would otherwise sleep on the clock, and
    /// its listeners run on, for as long as the app.
    @Test func aReleasedSchedulerCancelsItsTimers() async throws {
        let server = try await TestServer("scheduler-released")
        let replica = try Replica("released", server: server)
        var scheduler: SyncScheduler? = SyncScheduler(
            engine: replica.engine, clock: replica.clock, monitor: FixedConnectivity(online: true))
        await scheduler?.start()
        try await replica.clock.waitForSleepers(1)  // the periodic timer
        await scheduler?.settle()
        scheduler = nil
        try await waitUntil { replica.clock.sleeperCount == 0 }
        await server.stop()
    }

    /// A scheduler lives as long as the app: the syncs it started are let
    /// go once they end, not kept (a periodic sync every 30 s would pile up
    /// a task for each).
    @Test func finishedSyncsAreNotKept() async throws {
        let server = try await TestServer("scheduler-finished")
        let replica = try Replica("scheduled-finished", server: server)
        let scheduler = SyncScheduler(engine: replica.engine, clock: replica.clock, monitor: FixedConnectivity(online: true))
        await scheduler.start()
        try await waitUntil { await scheduler.triggered.count == 1 }
        for nudge in 0..<5 {
            await scheduler.nudge()
            // A nudge heard before the scheduler hears the last run's end
            // waits for it: the next one waits for this one's sync.
            try await waitUntil { await scheduler.triggered.count == nudge + 2 }
            try await waitUntil { await replica.engine.callersOfRunningSync == 0 }
        }
        #expect(await scheduler.triggered.count == 6)
        try await waitUntil { await scheduler.heldSyncCount == 0 }
        await scheduler.stop()
        await server.stop()
    }

    /// A local write made while a run pulls (past its push): the write's
    /// debounced trigger comes during the run, and the scheduler starts one
    /// more run when it ends, which pushes the write. Periodic syncs are off,
    /// so nothing else would. Before, the trigger joined the running sync and
    /// the write waited for the next periodic sync (here, for ever).
    @Test func aWriteDuringARunIsPushedByARunRightAfterIt() async throws {
        let server = try await TestServer("scheduler-rerun")
        let (gate, reader) = try await Self.serverWithPages(server, pages: 1, slow: 0)
        let scheduler = SyncScheduler.online(reader.engine, clock: reader.clock, periodMilliseconds: .max)
        await scheduler.start()
        try await gate.waitUntilHeld()
        try await waitUntil { await scheduler.isSyncRunning }
        try await reader.store.create(type: "task", fields: ["title": "written while pulling"])
        try await reader.clock.waitForSleepers(2)  // periodic (never) + write debounce
        reader.clock.advance(by: 1_000)
        // The trigger is held for the run's end: no sync starts while it runs.
        try await waitUntil { reader.clock.sleeperCount == 1 }
        #expect(await scheduler.triggered == [.started])
        gate.release()
        try await waitUntil { try reader.store.outboxCount() == 0 }
        #expect(await scheduler.triggered == [.started, .localWrite])
        #expect(try await server.pullAll().count == 6)
        await scheduler.stop()
        await scheduler.settle()
        await server.stop()
    }

    /// A scheduler started while a run pulls, past its push (the user's
    /// "sync now"), with a monitor that reports at once, as
    /// `LinuxConnectivityMonitor` does: the start's trigger comes during the
    /// run, and is held for one more run as it ends, which pushes a write
    /// made after the run's push, before the start (so not heard as a
    /// write). Before, the first report's `.started` was handled before the
    /// engine's state, which the other listener hears, said a run was
    /// under way (every time, in 40 tries): the start joined the run, and
    /// the write waited for the next trigger (here, none).
    @Test func aSchedulerStartedDuringARunHoldsItsStartForTheRunsEnd() async throws {
        let server = try await TestServer("scheduler-start-during-run")
        let clock = ManualClock()
        let gate = PullGate(holdFirst: true)
        let transport = SlowPulls(
            inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), clock: clock, milliseconds: 0, gate: gate)
        let replica = try Replica("start-during-run", server: server, clock: clock, transport: transport)
        let syncNow = Task { await replica.engine.sync() }
        try await gate.waitUntilHeld()
        try await replica.store.create(type: "task", fields: ["title": "written after the run's push"])
        let scheduler = SyncScheduler.online(replica.engine, clock: clock, periodMilliseconds: .max)
        await scheduler.start()
        try await clock.waitForSleepers(1)  // the periodic timer (never due): the start was heard
        #expect(await scheduler.isSyncRunning)
        #expect(await scheduler.triggered.isEmpty, "the start joined the run under way")
        gate.release()
        #expect(await syncNow.value.outcome == .completed)
        try await waitUntil { await scheduler.triggered == [.started] }
        await scheduler.settle()
        #expect(try replica.store.outboxCount() == 0)
        await scheduler.stop()
        await server.stop()
    }

    /// `triggered` keeps the newest `triggeredCountMax` reasons: a
    /// scheduler lives as long as the app, and a sync every 30 s would
    /// otherwise grow it by an entry each time, for ever. Before, it kept
    /// every one. The server answers health with a 503, so each run ends at
    /// once, offline, and each nudge starts one.
    @Test func triggeredKeepsTheNewestReasonsOnly() async throws {
        let server = try ScriptedServer { _ in .answer(status: 503, headers: [:], body: Data()) }
        defer { server.stop() }
        let replica = try Replica("scheduled-triggered", url: server.url)
        let scheduler = SyncScheduler(engine: replica.engine, clock: replica.clock, monitor: FixedConnectivity(online: true))
        await scheduler.start()
        try await waitUntil { await scheduler.triggered.count == 1 }
        for _ in 0..<SyncScheduler.triggeredCountMax { await scheduler.nudge() }
        let triggered = await scheduler.triggered
        #expect(triggered.count == SyncScheduler.triggeredCountMax)
        #expect(triggered.allSatisfy { $0 == .nudge }, "the oldest, .started, went first")
        await scheduler.stop()
        await scheduler.settle()
    }

    /// "App backgrounded": a background run with a budget of 1 s, on a
    /// network where each page takes 400 ms, applies three pages (the
    /// budget is checked before each) and stops cleanly; the next sync
    /// pulls the rest.
    @Test func aBackgroundRunStopsAtAPageBoundaryOnceItsBudgetIsSpent() async throws {
        let server = try await TestServer("background")
        let (_, reader) = try await Self.serverWithPages(server, pages: 10, slow: 400)
        let scheduler = SyncScheduler(engine: reader.engine, clock: reader.clock, monitor: FixedConnectivity(online: false))
        let report = await scheduler.runBackground(budgetMilliseconds: 1_000)
        #expect(report.outcome == .cancelled)
        #expect(report.pages == 3)
        #expect(try reader.store.count(type: "item") == 15)
        #expect(await reader.engine.lastError == nil)
        let rest = await reader.sync()
        #expect(rest.outcome == .completed && rest.changes == 35)
        await server.stop()
    }

    /// "App backgrounded" after a long time offline: the outbox takes many
    /// push requests, each 400 ms, and a budget of 1 s stops the run at a
    /// request boundary, as it does between pulled pages (the budget is
    /// checked before each request, so three are sent). The answers of
    /// those sent are recorded, the run is no failure, and the next sync
    /// pushes the rest. Before, the push ignored the budget and sent all.
    @Test func aBackgroundRunStopsBetweenPushRequestsOnceItsBudgetIsSpent() async throws {
        let server = try await TestServer("background-push")
        var configuration = SyncConfiguration()
        configuration.pushBatchCountMax = 2
        let clock = ManualClock()
        let transport = SlowPushes(
            inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), clock: clock, milliseconds: 400)
        let writer = try Replica("background-push", server: server, clock: clock, configuration: configuration, transport: transport)
        var batch = WriteBatch()
        for n in 0..<10 { try batch.create(type: "task", fields: ["n": .int(Int64(n))]) }
        try await writer.store.write(batch)
        let scheduler = SyncScheduler(engine: writer.engine, clock: clock, monitor: FixedConnectivity(online: false))
        let report = await scheduler.runBackground(budgetMilliseconds: 1_000)
        #expect(report.outcome == .cancelled)
        #expect(report.acknowledged == 6, "three requests of two")
        #expect(try writer.store.outboxCount() == 4)
        #expect(try await server.pullAll().count == 6)
        #expect(await writer.engine.lastError == nil)
        #expect(await writer.engine.nextRunAt == nil)
        #expect(await writer.engine.state == .idle)
        let rest = await writer.sync()
        #expect(rest.outcome == .completed && rest.acknowledged == 4)
        await server.stop()
    }

    /// A background run whose budget is already spent (0: the OS's window
    /// is over) asks the transport for nothing, not even the health check,
    /// and ends as `.cancelled` with nothing done; the intent stays
    /// pending, unattempted, and the next sync pushes it. Before, the run
    /// started as any other, sent the health check, and only then found
    /// itself cancelled.
    @Test func aSpentBudgetMakesNoRequest() async throws {
        let server = try await TestServer("background-spent")
        let transport = CountedRequests(inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback))
        let writer = try Replica("background-spent", server: server, transport: transport)
        try await writer.store.create(type: "task", fields: ["title": "kept for the next sync"])
        let scheduler = SyncScheduler(engine: writer.engine, clock: writer.clock, monitor: FixedConnectivity(online: false))
        let report = await scheduler.runBackground(budgetMilliseconds: 0)
        #expect(report == SyncReport(outcome: .cancelled))
        #expect(transport.count == 0, "requests asked of the transport with the budget spent")
        #expect(try writer.store.outbox().map(\.state.attempts) == [0])
        #expect(await writer.engine.state == .idle)
        #expect(await writer.engine.lastError == nil)
        let next = await writer.sync()
        #expect(next.outcome == .completed && next.acknowledged == 1, "\(next)")
        await server.stop()
    }

    /// A background run that finds a sync running joins it, and its budget
    /// stops that sync too, abandoning the pull it waits for.
    @Test func aBackgroundRunStopsTheSyncItJoins() async throws {
        let server = try await TestServer("background-join")
        let (gate, reader) = try await Self.serverWithPages(server, pages: 10, slow: 0)
        let scheduler = SyncScheduler(engine: reader.engine, clock: reader.clock, monitor: FixedConnectivity(online: false))
        let foreground = Task { await reader.sync() }
        try await gate.waitUntilHeld()
        let background = Task { await scheduler.runBackground(budgetMilliseconds: 0) }
        // The background caller has joined once the engine lists its budget;
        // there is no other signal, so wait for the join to be visible.
        try await waitUntil { await reader.engine.callersOfRunningSync == 2 }
        gate.release()
        let reports = [await foreground.value, await background.value]
        #expect(reports.map(\.outcome) == [.cancelled, .cancelled])
        #expect(reports[0] == reports[1])
        #expect(reports[0].pages == 0)
        await server.stop()
    }

    /// A trigger that comes while a background run's budget stops it (here
    /// a nudge, held while the run pulls) starts no run as it ends: the
    /// OS's window is over, and a run started then would have no budget and
    /// go on past it. The next trigger syncs. Before, the held nudge started
    /// a run at once, which pulled every page.
    @Test func aTriggerHeldDuringARunItsBudgetStoppedStartsNoRun() async throws {
        let server = try await TestServer("background-held")
        let (gate, reader) = try await Self.serverWithPages(server, pages: 10, slow: 0)
        let scheduler = SyncScheduler.online(reader.engine, clock: reader.clock, periodMilliseconds: .max)
        await scheduler.start()
        // The start's run pulls, held at the gate; the background run joins it.
        try await gate.waitUntilHeld()
        try await waitUntil { await scheduler.isSyncRunning }
        let background = Task { await scheduler.runBackground(budgetMilliseconds: 0) }
        try await waitUntil { await reader.engine.callersOfRunningSync == 2 }
        await scheduler.nudge()
        gate.release()
        #expect(await background.value.outcome == .cancelled)
        try await waitUntil { await !scheduler.isSyncRunning }
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started], "the held nudge started no run")
        #expect(try reader.store.count(type: "item") == 0)
        // The next trigger runs, without a budget: the app is in the foreground again.
        await scheduler.nudge()
        try await waitUntil { await scheduler.triggered.count == 2 }
        await scheduler.settle()
        #expect(try reader.store.count(type: "item") == 50)
        await scheduler.stop()
        await server.stop()
    }

    /// A trigger that comes while a background run runs (here a nudge,
    /// held while it pulls) starts no run as it ends, also when the run
    /// completes within its budget: the app is in the OS's background
    /// window, which ends with the background task, and a run started then
    /// would have no budget (the OS suspends the app in its midst). The next
    /// trigger syncs. Before, only a cancelled run's held triggers started
    /// none: the held nudge started a run, unbounded, as the background one
    /// ended.
    @Test func aTriggerHeldDuringABackgroundRunStartsNoRunWhenItCompletes() async throws {
        let server = try await TestServer("background-held-completed")
        let (gate, _, scheduler, background) = try await Self.backgroundRunHeldInItsPull(server)
        await scheduler.nudge()
        gate.release()
        #expect(await background.value.outcome == .completed)
        try await waitUntil { await !scheduler.isSyncRunning }
        await scheduler.settle()
        let triggered = await scheduler.triggered
        #expect(triggered == [.started], "the nudge held during the background run started no run")
        // The next trigger runs, without a budget: the app is in the foreground again.
        await scheduler.nudge()
        try await waitUntil { await scheduler.triggered == triggered + [.nudge] }
        await scheduler.settle()
        await scheduler.stop()
        await server.stop()
    }

    /// A local write made while a background run pulls (by the app, or by a
    /// conflict's resolution) arms the write's debounce timer, which is due
    /// after the run completes: the run's end cancels it, as it drops the
    /// triggers held during the run. Fired, it would start a run with no
    /// budget in the moments between the background task's end and the OS
    /// suspending the app. The next trigger pushes the write. Before, the
    /// timer stayed armed past the run's end and, once the clock reached it,
    /// started a `.localWrite` run.
    @Test func aWriteDuringABackgroundRunArmsNoTimerPastItsEnd() async throws {
        let server = try await TestServer("background-write")
        // Past its push, and the app writes meanwhile.
        let (gate, reader, scheduler, background) = try await Self.backgroundRunHeldInItsPull(server)
        try await reader.store.create(type: "task", fields: ["title": "written in the background"])
        let debounceEnd = reader.clock.monotonicMilliseconds + SchedulerCore().localWriteDebounceMilliseconds
        try await waitUntil { reader.clock.sleeperDeadlines.contains(debounceEnd) }
        gate.release()
        #expect(await background.value.outcome == .completed)
        try await waitUntil { await !scheduler.isSyncRunning }
        #expect(try reader.store.outboxCount() == 1, "the background run was past its push")
        #expect(!reader.clock.sleeperDeadlines.contains(debounceEnd), "the write's debounce timer outlived the background run")
        reader.clock.advance(by: SchedulerCore().localWriteDebounceMilliseconds)
        await scheduler.settle()
        // The next trigger runs, without a budget: the app is in the foreground again.
        await scheduler.nudge()
        try await waitUntil { await scheduler.triggered.last == .nudge }
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started, .nudge])
        #expect(try reader.store.outboxCount() == 0)
        await scheduler.stop()
        await server.stop()
    }

    /// The scheduler hears how a run ended with its end, not by asking the
    /// engine later, when a run that started since (the app's "sync now")
    /// would answer for it. Here the scheduler's listener is held (its clock
    /// blocks) while a run with a nudge held for its end is cancelled and
    /// the app's own run completes: the cancelled run's end still says
    /// cancelled, so the nudge starts no run. Before, the scheduler read the
    /// engine's last run end once it got to the state, found the app's
    /// completed run, and started a run for the nudge.
    @Test func aRunsEndIsHeardAsItWasNotAsALaterRunEnded() async throws {
        let server = try await TestServer("scheduler-run-end")
        let gate = PullGate(holdFirst: true)
        let transport = HeldPushAnswers(inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), gate: gate)
        let replica = try Replica("run-end", server: server, transport: transport)
        try await replica.store.create(type: "task", fields: ["title": "pushed by the cancelled run"])
        let clock = BlockingClock(replica.clock)
        let scheduler = SyncScheduler.online(replica.engine, clock: clock, periodMilliseconds: .max)
        await scheduler.start()
        // The start's run has its push answered, held at the gate.
        try await gate.waitUntilHeld()
        try await waitUntil { await scheduler.isSyncRunning }
        await scheduler.nudge()
        let stop = SyncCancellation()
        let cancelled = Task { await replica.engine.sync(cancellation: stop) }
        try await waitUntil { await replica.engine.callersOfRunningSync == 2 }
        // The scheduler blocks as it hears the push's progress, next.
        clock.blockNextReading()
        stop.cancel()
        gate.release()
        #expect(await cancelled.value.outcome == .cancelled)
        try await clock.waitUntilBlocked()
        #expect(await replica.engine.sync().outcome == .completed, "the app's run, between the first's end and the scheduler hearing it")
        clock.unblock()
        try await waitUntil { await !scheduler.isSyncRunning }
        await scheduler.settle()
        let triggered = await scheduler.triggered
        #expect(triggered == [.started], "the nudge held during the cancelled run started no run")
        await scheduler.stop()
        await server.stop()
    }

    /// A timer whose sleep ended just as it was set again (a second write
    /// re-arming the write debounce; the old timer's task, past its sleep,
    /// is cancelled too late to stop) fires at its new deadline only: the
    /// old sleep's end is stale, and starts no sync.
    @Test func aTimerSetAgainAsItsSleepEndedFiresAtItsNewDeadlineOnly() async throws {
        let server = try await TestServer("scheduler-stale-timer")
        let replica = try Replica("stale-timer", server: server)
        let clock = HeldSleepClock(replica.clock)
        defer { clock.endAll() }  // the sleeps left, the periodic timer's among them
        let scheduler = SyncScheduler.online(replica.engine, clock: clock, periodMilliseconds: .max)
        await scheduler.start()
        try await scheduler.settle(afterSyncs: 1)
        let debounce = SchedulerCore().localWriteDebounceMilliseconds
        let firstDeadline = replica.clock.monotonicMilliseconds + debounce
        try await replica.store.create(type: "task", fields: ["n": 1])
        try await clock.waitForSleeper(until: firstDeadline)
        replica.clock.advance(by: debounce / 2)
        try await replica.store.create(type: "task", fields: ["n": 2])
        try await clock.waitForSleeper(until: firstDeadline + debounce / 2)
        clock.end(until: firstDeadline)
        try await waitUntil {
            let (stale, syncs) = (await scheduler.staleTimerFireCount, await scheduler.triggered.count)
            return stale == 1 || syncs > 1
        }
        #expect(await scheduler.staleTimerFireCount == 1)
        #expect(await scheduler.triggered == [.started], "the first write's deadline started a sync")
        replica.clock.advance(by: debounce / 2)
        clock.end(until: firstDeadline + debounce / 2)
        try await scheduler.settle(afterSyncs: 2)
        #expect(await scheduler.triggered == [.started, .localWrite])
        #expect(try await server.pullAll().count == 2)
        await scheduler.stop()
        await server.stop()
    }

    /// The seeds' background task stops its sync by cancelling the task
    /// that awaits it (`task.expirationHandler = { syncTask.cancel() }`):
    /// that stops the run, as a cancelled `SyncCancellation` does,
    /// abandoning the pull it waits for (held at the gate here), and a
    /// later run pulls every page. Before, the run ignored it and pulled
    /// every page.
    ///
    /// An answer that came first is recorded, by design: on loopback the
    /// held pull may finish all the same (it did, about once in a dozen
    /// runs), and with `answered` it always does (its request runs apart
    /// from the cancelled task). Either way the run ends cancelled, pulls no
    /// page after the cancellation, only the one in flight, keeps what it
    /// applied, and a later run pulls the rest.
    @Test(arguments: [false, true])
    func cancellingTheTaskThatAwaitsASyncStopsIt(answered: Bool) async throws {
        let server = try await TestServer("task-cancel-\(answered)")
        let (gate, reader) = try await Self.serverWithPages(server, pages: 10, slow: 0, answeringCancelledPulls: answered)
        let sync = Task { await reader.sync() }
        try await gate.waitUntilHeld()
        sync.cancel()
        gate.release()
        let report = await sync.value
        #expect(report.outcome == .cancelled)
        #expect(report.pages <= 1, "no page pulled after the cancellation, only the one in flight")
        if answered { #expect(report.pages == 1, "the answer that came first is applied") }
        #expect(try reader.store.count(type: "item") == report.changes)
        #expect(report.changes == report.pages * 5)
        #expect(await reader.engine.lastError == nil)
        let rest = await reader.sync()
        #expect(rest.outcome == .completed && rest.changes == 50 - report.changes)
        #expect(try reader.store.count(type: "item") == 50)
        await server.stop()
    }

    /// 50 items on the server, and a reader of pages of 5 whose pulls each
    /// move its clock by `slow` ms; its first pull waits at the returned gate
    /// until released when `slow` is 0. With `answeringCancelledPulls`, a
    /// pull whose run is cancelled is answered all the same.
    /// A scheduler for a reader of `server` (no periodic timer) whose
    /// start's run, in the foreground, has pulled and ended; then the app
    /// in the background: a background task's run, held in its pull.
    private static func backgroundRunHeldInItsPull(_ server: TestServer) async throws
        -> (gate: PullGate, reader: Replica, scheduler: SyncScheduler, background: Task<SyncReport, Never>)
    {
        let (gate, reader) = try await Self.serverWithPages(server, pages: 2, slow: 0)
        let scheduler = SyncScheduler.online(reader.engine, clock: reader.clock, periodMilliseconds: .max)
        await scheduler.start()
        try await gate.waitUntilHeld()
        gate.release()
        try await waitUntil { try reader.store.count(type: "item") == 10 }
        try await waitUntil { await !scheduler.isSyncRunning }
        await scheduler.settle()
        gate.holdNext()
        let background = Task { await scheduler.runBackground(budgetMilliseconds: 60_000) }
        try await gate.waitUntilHeld()
        try await waitUntil { await scheduler.isSyncRunning }
        return (gate, reader, scheduler, background)
    }

    private static func serverWithPages(
        _ server: TestServer, pages: Int, slow: UInt64, answeringCancelledPulls: Bool = false
    ) async throws -> (PullGate, Replica) {
        var operations: [PushOperation] = []
        for n in 0..<(pages * 5) { operations.append(operation(.create, "it_\(n)", ["n": .int(Int64(n))], type: "item")) }
        _ = try await server.push(operations)
        var configuration = SyncConfiguration()
        configuration.pullPageCountMax = 5
        let clock = ManualClock()
        let gate = PullGate(holdFirst: slow == 0)
        let transport = SlowPulls(
            inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), clock: clock, milliseconds: slow, gate: gate,
            answeringCancelled: answeringCancelledPulls)
        return (gate, try Replica("reader", server: server, clock: clock, configuration: configuration, transport: transport))
    }
}

/// Pulls through `inner`, each one moving a manual clock by `milliseconds`
/// (a slow network in test time), the first held at `gate` if it holds.
/// With `answeringCancelled`, each pull's request runs in a task of its
/// own, which the cancellation of the run does not reach: it is answered,
/// as a request the server answered before the cancellation is.
struct SlowPulls: SyncTransport {
    let inner: HTTPTransport
    let clock: ManualClock
    let milliseconds: UInt64
    let gate: PullGate
    var answeringCancelled = false

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { try await inner.push(request) }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        await gate.pass()
        let page: PullResponse
        if answeringCancelled {
            let inner = self.inner
            let answer = Task { () -> Result<PullResponse, TransportError> in
                do throws(TransportError) {
                    return .success(try await inner.pull(cursor: cursor, limit: limit, types: types))
                } catch {
                    return .failure(error)
                }
            }
            page = try await answer.value.get()
        } else {
            page = try await inner.pull(cursor: cursor, limit: limit, types: types)
        }
        clock.advance(by: milliseconds)
        return page
    }
}

/// Through `inner`, counting the requests the engine asks for (health
/// checks, pushes and pulls).
final class CountedRequests: SyncTransport {
    private let inner: HTTPTransport
    private let requests = Mutex(0)

    init(inner: HTTPTransport) { self.inner = inner }

    var count: Int { requests.withLock { $0 } }

    func health() async throws(TransportError) -> HealthResponse {
        requests.withLock { $0 += 1 }
        return try await inner.health()
    }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        requests.withLock { $0 += 1 }
        return try await inner.push(request)
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        requests.withLock { $0 += 1 }
        return try await inner.pull(cursor: cursor, limit: limit, types: types)
    }
}

/// Pushes through `inner`; the first answer waits at `gate` before the
/// engine gets it (a cancellation meanwhile does not abandon it).
struct HeldPushAnswers: SyncTransport {
    let inner: HTTPTransport
    let gate: PullGate

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        let response = try await inner.push(request)
        await gate.pass()
        return response
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse { try await inner.pull(cursor: cursor, limit: limit, types: types) }
}

/// `inner`'s time, whose monotonic reading can be made to block the
/// caller's thread once (`blockNextReading()`) until `unblock()`: a test
/// holds the scheduler's actor, and so its listener of the engine's states,
/// where it reads the time. The thread is one of the few of the
/// cooperative pool, which every test of the process shares, and others
/// block theirs too (a child process awaited, a store write): it blocks
/// for `blockSecondsMax` at most, so that the pool is never held for long.
/// A test whose block ran out (a starved run) checks less than it means
/// to, and fails for no such reason.
final class BlockingClock: SyncClock {
    private let inner: ManualClock
    private let state = Mutex((armed: false, blocked: false))
    private let released = DispatchSemaphore(value: 0)

    /// The longest a reading blocks: a run or two on loopback take
    /// milliseconds; with the pool starved (the whole suite on two cores),
    /// longer, and then the block gives way.
    static let blockSecondsMax = 2.0

    init(_ inner: ManualClock) { self.inner = inner }

    var nowMilliseconds: UInt64 { inner.nowMilliseconds }
    var monotonicMilliseconds: UInt64 {
        let block = state.withLock { state in
            defer { state.armed = false }
            if state.armed { state.blocked = true }
            return state.armed
        }
        if block { _ = released.wait(timeout: .now() + Self.blockSecondsMax) }
        return inner.monotonicMilliseconds
    }
    func sleep(untilMilliseconds deadline: UInt64) async throws { try await inner.sleep(untilMilliseconds: deadline) }

    func blockNextReading() { state.withLock { $0.armed = true } }
    func waitUntilBlocked() async throws { try await waitUntil { self.state.withLock { $0.blocked } } }
    func unblock() { released.signal() }
}

/// `inner`'s time, whose sleeps end only when a test ends them
/// (`end(until:)`), cancelled or not: a sleep that ended just as its task
/// was cancelled, so the task goes on to what it slept for.
final class HeldSleepClock: SyncClock {
    private let inner: ManualClock
    private let sleepers = Mutex<[(deadline: UInt64, continuation: CheckedContinuation<Void, any Error>)]>([])

    init(_ inner: ManualClock) { self.inner = inner }

    var nowMilliseconds: UInt64 { inner.nowMilliseconds }
    var monotonicMilliseconds: UInt64 { inner.monotonicMilliseconds }
    func sleep(untilMilliseconds deadline: UInt64) async throws {
        try await withCheckedThrowingContinuation { continuation in
            sleepers.withLock { $0.append((deadline, continuation)) }
        }
    }

    /// Waits until a task sleeps until `deadline`.
    func waitForSleeper(until deadline: UInt64) async throws {
        try await waitUntil { self.sleepers.withLock { $0.contains { $0.deadline == deadline } } }
    }

    /// Ends the sleeps until `deadline`: their tasks go on.
    func end(until deadline: UInt64) {
        for sleeper in removeSleepers(where: { $0 == deadline }) { sleeper.continuation.resume() }
    }

    /// Ends every sleep left, as cancelled.
    func endAll() {
        for sleeper in removeSleepers(where: { _ in true }) { sleeper.continuation.resume(throwing: CancellationError()) }
    }

    /// Takes the sleepers whose deadline `matches` off the list.
    private func removeSleepers(where matches: (UInt64) -> Bool) -> [(deadline: UInt64, continuation: CheckedContinuation<Void, any Error>)] {
        sleepers.withLock { sleepers in
            defer { sleepers.removeAll { matches($0.deadline) } }
            return sleepers.filter { matches($0.deadline) }
        }
    }
}

/// Pushes through `inner`, each one moving a manual clock by
/// `milliseconds` (a slow network in test time).
struct SlowPushes: SyncTransport {
    let inner: HTTPTransport
    let clock: ManualClock
    let milliseconds: UInt64

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        let response = try await inner.push(request)
        clock.advance(by: milliseconds)
        return response
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse { try await inner.pull(cursor: cursor, limit: limit, types: types) }
}

/// Holds the first pull until `release()`, and tells when it is held.
final class PullGate: Sendable {
    private struct State {
        var holding: Bool
        var held = false
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let state: Mutex<State>

    init(holdFirst: Bool) { state = Mutex(State(holding: holdFirst)) }

    func pass() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let hold = state.withLock { state -> Bool in
                guard state.holding else { return false }
                state.holding = false
                state.held = true
                state.waiter = continuation
                return true
            }
            if !hold { continuation.resume() }
        }
    }

    func waitUntilHeld() async throws { try await waitUntil { self.state.withLock { $0.held } } }

    /// Holds the next pull, for a gate that let the earlier ones through.
    func holdNext() {
        state.withLock { state in
            state.holding = true
            state.held = false
        }
    }

    func release() {
        let waiter = state.withLock { state in
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }
}

extension SyncScheduler {
    /// Waits until the scheduler has started `count` syncs and knows of
    /// none running, then for those syncs to end.
    nonisolated func settle(afterSyncs count: Int) async throws {
        try await waitUntil { await self.triggered.count == count }
        try await waitUntil { await !self.isSyncRunning }
        await settle()
    }

    /// A scheduler of `engine` on `clock` that is always online, with a
    /// periodic sync every `periodMilliseconds` (`.max`: none).
    static func online(_ engine: SyncEngine, clock: any SyncClock, periodMilliseconds: UInt64) -> SyncScheduler {
        var core = SchedulerCore()
        core.periodMilliseconds = periodMilliseconds
        return SyncScheduler(engine: engine, clock: clock, monitor: FixedConnectivity(online: true), core: core)
    }
}

struct FixedConnectivity: ConnectivityMonitor {
    let path: NetworkPath
    init(path: NetworkPath) { self.path = path }
    init(online: Bool) { path = online ? .satisfied : .unsatisfied }
    func paths() -> AsyncStream<NetworkPath> {
        let (stream, continuation) = AsyncStream<NetworkPath>.makeStream()
        continuation.yield(path)
        return stream
    }
}

