import LogFormat
import LogServer
import LogStore
@testable import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// Failed runs back off (`Format/sync-protocol.md` section 10, "Retry
/// timing"): a pull that fails has no intent to carry its retry time, so
/// the run carries it, and the scheduler keeps to it.
@Suite struct RunBackoffTests {
    /// A run whose pull fails with a 503 and `Retry-After: 100`: neither a
    /// nudge nor the periodic timer starts another run before the 100 s
    /// have passed; then the scheduler retries, and the success ends the
    /// backoff.
    @Test func aFailedPullWaitsForRetryAfterBeforeTheNextRun() async throws {
        let server = try await TestServer("run-backoff-retry-after")
        let pulls = FailingPulls(server, retryAfterSeconds: 100)
        let (replica, scheduler) = try await Self.startFailing("retry-after", server, pulls)
        #expect(try await replica.engine.health().nextRunAt == replica.clock.nowMilliseconds + 100_000)

        await scheduler.nudge()
        await scheduler.settle()
        try await replica.clock.waitForSleepers(2)
        #expect(pulls.count == 1, "a nudge 0 s after a pull told to wait 100 s")
        replica.clock.advance(by: 60_000)
        try await replica.clock.waitForSleepers(2)  // the periodic timer fired and is set again
        await scheduler.settle()
        #expect(pulls.count == 1, "the periodic timer 60 s after a pull told to wait 100 s")
        #expect(await scheduler.triggered == [.started])

        pulls.recover()
        replica.clock.advance(by: 40_000)
        try await waitUntil { await scheduler.triggered.count == 2 }
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started, .retry])
        #expect(pulls.count == 2)
        try await waitUntil { replica.clock.sleeperCount == 1 }  // the periodic timer alone: no retry is due
        let health = try await replica.engine.health()
        #expect(health.nextRunAt == nil && health.lastError == nil && health.state == .idle)
        await scheduler.stop()
        await server.stop()
    }

    /// A user's "sync now" (the app's own `engine.sync()`) runs at once
    /// while the scheduler backs off; its success ends the backoff, so a
    /// nudge syncs at once again.
    @Test func anAppsSyncRunsDuringTheBackoffAndEndsIt() async throws {
        let server = try await TestServer("run-backoff-app-sync")
        let pulls = FailingPulls(server, retryAfterSeconds: 100)
        let (replica, scheduler) = try await Self.startFailing("app-sync", server, pulls)
        pulls.recover()
        #expect(await replica.sync().outcome == .completed)
        #expect(pulls.count == 2)
        try await waitUntil { replica.clock.sleeperCount == 1 }  // the scheduler cancelled its retry
        await scheduler.nudge()
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started, .nudge])
        #expect(pulls.count == 3)
        await scheduler.stop()
        await server.stop()
    }

    /// A background task (`runBackground`) keeps to a failed run's backoff,
    /// as the scheduler does (the server asked for 100 s): with a budget of
    /// 30 s it makes no request and says why, and with 150 s it waits the
    /// backoff out, then runs. Before, it pulled at once either way. One
    /// whose task is cancelled as it waits (the OS's expiration handler, as
    /// the README says to stop it) ends at once, with no request.
    @Test func aBackgroundRunKeepsToTheBackoffWithinItsBudget() async throws {
        let server = try await TestServer("run-backoff-background")
        let pulls = FailingPulls(server, retryAfterSeconds: 100)
        let replica = try Replica("background", server: server, transport: pulls)
        guard case .failed = await replica.sync().outcome else { Issue.record("the first run should fail"); return }
        let nextRunAt = try #require(await replica.engine.nextRunAt)
        let scheduler = SyncScheduler(engine: replica.engine, clock: replica.clock, monitor: FixedConnectivity(online: false))
        pulls.recover()
        let skipped = await scheduler.runBackground(budgetMilliseconds: 30_000)
        #expect(skipped.outcome == .deferred(nextRunAt: nextRunAt))
        #expect(pulls.count == 1, "a background run 0 s after a pull told to wait 100 s")
        #expect(await replica.engine.nextRunAt == nextRunAt)

        let expired = Task { await scheduler.runBackground(budgetMilliseconds: 150_000) }
        try await replica.clock.waitForSleepers(1)
        expired.cancel()
        #expect(await expired.value.outcome == .cancelled)
        #expect(replica.clock.sleeperCount == 0)
        #expect(pulls.count == 1, "a request after the expiration")
        #expect(await replica.engine.nextRunAt == nextRunAt)

        let background = Task { await scheduler.runBackground(budgetMilliseconds: 150_000) }
        try await replica.clock.waitForSleepers(1)
        #expect(pulls.count == 1)
        replica.clock.advance(by: 100_000)
        #expect(await background.value.outcome == .completed)
        #expect(pulls.count == 2)
        #expect(await replica.engine.nextRunAt == nil)
        await server.stop()
    }

    /// A backoff that ends just as a background task's budget does leaves
    /// the run no time: it is deferred, with no wait and no request, rather
    /// than started at the budget's end only to be cancelled.
    @Test func aBackoffEndingWithTheBudgetDefersTheBackgroundRun() async throws {
        let server = try await TestServer("run-backoff-budget-edge")
        let pulls = FailingPulls(server, retryAfterSeconds: 100)
        let replica = try Replica("background-edge", server: server, transport: pulls)
        guard case .failed = await replica.sync().outcome else { Issue.record("the first run should fail"); return }
        let backoffEnd = try #require(await replica.engine.nextRunDeadline)
        let nextRunAt = try #require(await replica.engine.nextRunAt)
        let scheduler = SyncScheduler(engine: replica.engine, clock: replica.clock, monitor: FixedConnectivity(online: false))
        pulls.recover()
        let budget = backoffEnd - replica.clock.monotonicMilliseconds
        let ended = Atomic<Bool>(false)
        let run = Task {
            defer { ended.store(true, ordering: .relaxed) }
            return await scheduler.runBackground(budgetMilliseconds: budget)
        }
        try await waitUntil { ended.load(ordering: .relaxed) || replica.clock.sleeperCount > 0 }
        let waited = replica.clock.sleeperCount > 0
        // Let a run that waits go on, to the end of its budget.
        if waited { replica.clock.advance(by: budget) }
        #expect(!waited, "it waited for a backoff that ends with its budget")
        #expect(await run.value.outcome == .deferred(nextRunAt: nextRunAt))
        #expect(pulls.count == 1)
        await server.stop()
    }

    /// Failed runs in a row wait about 1 s, 2 s, 4 s, ... 300 s (the retry
    /// policy's delays, with jitter); an explicit `sync()` runs all the
    /// same, and a completed run starts the count again.
    @Test func failedRunsBackOffExponentiallyUntilOneCompletes() async throws {
        let server = try await TestServer("run-backoff-exponential")
        let pulls = FailingPulls(server, retryAfterSeconds: nil)
        let replica = try Replica("exponential", server: server, transport: pulls)
        for failed in 1...11 {
            guard case .failed = await replica.sync().outcome else { Issue.record("run \(failed) should fail"); return }
            #expect(pulls.count == failed)
            let backoff = min(UInt64(1_000) << (failed - 1), 300_000)
            let wait = try #require(await replica.engine.nextRunAt) - replica.clock.nowMilliseconds
            #expect((backoff * 8 / 10...backoff * 12 / 10).contains(wait), "failed run \(failed): \(wait) ms")
        }
        pulls.recover()
        #expect(await replica.sync().outcome == .completed)
        #expect(await replica.engine.nextRunAt == nil)
        pulls.fail()
        _ = await replica.sync()
        let wait = try #require(try await replica.engine.health().nextRunAt) - replica.clock.nowMilliseconds
        #expect((800...1_200).contains(wait), "the first failure after a success: \(wait) ms")
        await server.stop()
    }

    /// A run whose push failed (a 500) backs off until its intents are due
    /// again, so the retry run the scheduler starts at `nextRunAt` pushes
    /// them all. The intents' retry times and the run's backoff were drawn
    /// apart, each with its own jitter: the retry run often came before
    /// them, pushed nothing, completed, and so ended the backoff; the
    /// intents then waited for the periodic timer (30 s), not their 1 s.
    @Test func theRetryRunAfterAFailedPushFindsItsIntentsDue() async throws {
        let server = try await TestServer("run-backoff-push-due")
        let replica = try Replica("push-due", server: server)
        var batch = WriteBatch()
        for index in 0..<50 { _ = try batch.create(type: "task", fields: ["n": .int(Int64(index))]) }
        try await replica.store.write(batch)
        try await server.faults(FaultSettings(failNext: 1, status: 500))
        guard case .failed = await replica.sync().outcome else { Issue.record("the push should fail"); return }
        let nextRunAt = try #require(await replica.engine.nextRunAt)
        let dueAt = try #require(try await replica.engine.health().nextAttemptAt)
        #expect(nextRunAt >= dueAt, "the retry run at \(nextRunAt) comes before the intents are due at \(dueAt)")
        replica.clock.advance(by: nextRunAt - replica.clock.nowMilliseconds)
        let report = await replica.sync()
        #expect(report.outcome == .completed && report.acknowledged == 50, "\(report)")
        await server.stop()
    }

    /// An intent retried for its own answer (a code this client does not
    /// know) has a retry time of its own, which grows with its attempts. A
    /// run that then fails in its pull (a 500) backs off by its failed runs,
    /// about 1 s, not until that intent's retry, about 64 s here: the wait
    /// for a failed push request's intents is not for those. Before
    /// (`retryScheduledAt` set by every retry), the run waited for it.
    @Test func aRunFailedInItsPullDoesNotWaitForAnIntentRetriedAlone() async throws {
        let server = try await TestServer("retried-alone-pull-fails")
        let failPulls = Atomic<Bool>(false)
        let unknownCode = RewritingTransport.retryingTheFirstIntent(server)
        let transport = PullsFailingOnDemand(inner: unknownCode) { failPulls.load(ordering: .relaxed) }
        let a = try Replica("retried-alone", server: server, transport: transport)
        try await a.store.create(type: "task", fields: ["n": 1])
        for _ in 0..<6 {
            #expect(await a.sync().retried == 1)
            a.clock.advance(by: 600_000)
        }
        #expect(try a.store.outbox().first?.state.attempts == 6)
        failPulls.store(true, ordering: .relaxed)
        let failed = await a.sync()
        guard case .failed = failed.outcome else {
            Issue.record("the pull should fail: \(failed)")
            return
        }
        let nextRunAt = try #require(await a.engine.nextRunAt)
        let dueAt = try #require(try await a.engine.health().nextAttemptAt)
        #expect(dueAt - a.clock.nowMilliseconds > 20_000, "the intent's 7th attempt waits 64 s, give or take 20%")
        #expect(nextRunAt - a.clock.nowMilliseconds <= 1_200, "the run after one failed run waits about 1 s, not \(nextRunAt - a.clock.nowMilliseconds) ms")
        await server.stop()
    }

    /// An intent retried for its own answer (a code this client does not
    /// know) in a run that completed is pushed again when its retry time
    /// comes: the run's end sets the retry timer for it. Before, the run's
    /// end cancelled that timer, and nothing but the periodic timer (here
    /// turned off) or another trigger would push the intent again.
    @Test func anIntentRetriedAloneIsPushedWhenItsRetryIsDue() async throws {
        let server = try await TestServer("retried-alone-due")
        let refusing = Atomic<Bool>(true)
        let transport = RewritingTransport.retryingTheFirstIntent(server) { refusing.load(ordering: .relaxed) }
        let replica = try Replica("retried-alone-due", server: server, transport: transport)
        try await replica.store.create(type: "task", fields: ["n": 1])
        let scheduler = SyncScheduler.online(replica.engine, clock: replica.clock, periodMilliseconds: .max)
        await scheduler.start()
        try await waitUntil { await scheduler.triggered == [.started] }
        await scheduler.settle()
        #expect(try replica.store.outbox().first?.state.attempts == 1)
        refusing.store(false, ordering: .relaxed)
        let dueAt = try #require(try await replica.engine.health().nextAttemptAt)
        try await replica.clock.waitForSleepers(2)  // the periodic timer (never due) and the retry timer
        replica.clock.advance(by: dueAt - replica.clock.nowMilliseconds)
        try await waitUntil { await scheduler.triggered == [.started, .retry] }
        await scheduler.settle()
        #expect(try replica.store.outboxCount() == 0)
        try await waitUntil { replica.clock.sleeperCount == 1 }  // nothing waits for a retry now
        await scheduler.stop()
        await server.stop()
    }

    /// A pull's 429 is a failed run that waits at least its `Retry-After`;
    /// the third opens the breaker, and the next run waits for it.
    @Test func aRateLimitedPullWaitsForRetryAfterAndTheBreaker() async throws {
        let server = try await TestServer("run-backoff-429")
        let transport = RateLimited(
            inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), retryAfterSeconds: 50)
        let a = try Replica("rate-limited", server: server, transport: transport)
        for _ in 0..<2 {
            guard case .failed = await a.sync().outcome else { Issue.record("a 429 below the breaker fails the run"); return }
            #expect(await a.engine.nextRunAt == a.clock.nowMilliseconds + 50_000)
        }
        a.clock.advance(by: 50_000)
        #expect(await a.sync().outcome == .rateLimited)
        let breaker = try #require(await a.engine.breakerOpenUntil)
        #expect(await a.engine.nextRunAt == breaker)
        await server.stop()
    }

    /// A failure the server answered as the run was cancelled (a 503
    /// with `Retry-After`, come in the instant the budget ran out) is an
    /// answer, not a request abandoned: the run records it as any, and
    /// fails with its backoff. Before, the run ended `.cancelled` and the
    /// answer was dropped: no backoff, so the next run came at once, not
    /// after the 600 s the server asked for, and the push's intents had no
    /// attempt counted.
    @Test(arguments: ["push", "pull"])
    func aFailureAnsweredAsTheRunIsCancelledIsRecorded(_ request: String) async throws {
        let server = try await TestServer("run-backoff-answered-as-cancelled-\(request)")
        let stop = SyncCancellation()
        let transport = AnsweredAsCancelled(server, cancel: stop.cancel)
        let a = try Replica("answered-as-cancelled", server: server, transport: transport)
        if request == "push" { try await a.store.create(type: "task", fields: ["title": "kept"]) }
        let report = await a.engine.sync(cancellation: stop)
        #expect(report.outcome == .failed("\(request): HTTP 503"), "\(report)")
        #expect(await a.engine.nextRunAt == a.clock.nowMilliseconds + 600_000)
        #expect(try a.store.outbox().allSatisfy { $0.state.attempts == 1 })
        await server.stop()
    }

    /// A `Retry-After` belongs to the request that carried it: a push too
    /// large for the server (413, which may say when to come back) is split
    /// and the run goes on, so when the run fails later for another reason
    /// (the server keeps refusing the pull cursor), its backoff is the
    /// policy's first delay, not the 413's hour.
    @Test func aSplitPushsRetryAfterDoesNotOutliveIt() async throws {
        let server = try await TestServer("run-backoff-split")
        let transport = SplitThenRefusedCursor(server, retryAfterSeconds: 3_600)
        let replica = try Replica("split", server: server, transport: transport)
        for n in 0..<2 { try await replica.store.create(type: "task", fields: ["n": .int(Int64(n))]) }
        let report = await replica.sync()
        #expect(report.acknowledged == 2, "the halves of the split batch were pushed")
        guard case .failed = report.outcome else { Issue.record("the refused cursor fails the run: \(report.outcome)"); return }
        let wait = try #require(await replica.engine.nextRunAt) - replica.clock.nowMilliseconds
        #expect((800...1_200).contains(wait), "the first failed run waits about 1 s, not \(wait) ms")
        await server.stop()
    }

    /// The core: after a failed run only the retry timer starts one, however
    /// the other triggers come; a connectivity loss cancels it and a gain
    /// sets it again; a run that need not wait clears the backoff.
    /// A scheduler started after a run failed (the app synced first, or
    /// restarted the scheduler) keeps to that run's backoff: its start
    /// does not sync at once.
    @Test func aSchedulerStartedDuringABackoffWaitsForIt() async throws {
        let server = try await TestServer("run-backoff-late-start")
        let pulls = FailingPulls(server, retryAfterSeconds: 100)
        let replica = try Replica("late-start", server: server, transport: pulls)
        guard case .failed = await replica.sync().outcome else { Issue.record("the first run should fail"); return }
        let scheduler = SyncScheduler.online(replica.engine, clock: replica.clock, periodMilliseconds: 60_000)
        await scheduler.start()
        try await replica.clock.waitForSleepers(2)  // the periodic and the retry timers
        await scheduler.settle()
        #expect(await scheduler.triggered.isEmpty)
        #expect(pulls.count == 1)
        pulls.recover()
        replica.clock.advance(by: 60_000)
        try await replica.clock.waitForSleepers(2)  // the periodic timer fired and is set again
        await scheduler.settle()
        #expect(await scheduler.triggered.isEmpty, "the periodic timer 60 s into a 100 s backoff")
        replica.clock.advance(by: 40_000)
        try await waitUntil { await scheduler.triggered == [.retry] }
        await scheduler.settle()
        #expect(pulls.count == 2)
        await scheduler.stop()
        await server.stop()
    }

    /// A scheduler started while a run is under way after a failed one (the
    /// user's "sync now" during the backoff): a trigger that comes during the
    /// run (here the start's own, and a write's) is held for one more run as
    /// it ends, which pushes the write. Before, the backoff the start read
    /// from the engine was heard as a run's end: the rules took no run to be
    /// under way, the triggers only armed the retry timer, and the run's
    /// completion (which ends the backoff) cancelled it, so the write waited
    /// for the next periodic sync (here, never).
    @Test func aSchedulerStartedDuringARunHoldsTheTriggersForItsEnd() async throws {
        let server = try await TestServer("run-backoff-start-during-run")
        let pulls = FailingPulls(server, retryAfterSeconds: 100)
        let gate = PullGate(holdFirst: false)
        let replica = try Replica("start-during-run", server: server, transport: HeldPulls(inner: pulls, gate: gate))
        guard case .failed = await replica.sync().outcome else { Issue.record("the first run should fail"); return }
        pulls.recover()
        gate.holdNext()
        let syncNow = Task { await replica.engine.sync() }
        try await gate.waitUntilHeld()
        var core = SchedulerCore()
        core.periodMilliseconds = .max
        let monitor = ScriptedConnectivity()
        let scheduler = SyncScheduler(engine: replica.engine, clock: replica.clock, monitor: monitor, core: core)
        await scheduler.start()
        try await waitUntil { await scheduler.isSyncRunning }
        monitor.continuation.yield(.satisfied)
        try await replica.clock.waitForSleepers(1)  // the periodic timer (never due): the start was heard
        #expect(await scheduler.isSyncRunning, "the run is still under way")
        try await replica.store.create(type: "task", fields: ["title": "written during the run"])
        gate.release()
        #expect(await syncNow.value.outcome == .completed)
        try await waitUntil { await scheduler.triggered.count == 1 }
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started])
        #expect(try replica.store.outboxCount() == 0)
        await scheduler.stop()
        await server.stop()
    }

    /// A scheduler given no clock keeps its timers, and a background run's
    /// budget, on the engine's clock, which the engine's deadlines (a failed
    /// run's backoff, `nextRunAt`) are read on. Before, it took the system
    /// clock whatever the engine's: the retry timer of an engine on another
    /// clock (here a manual one, the backoff about 1 s on it) fired at once,
    /// and the failing server got run after run with no wait.
    @Test func aSchedulerGivenNoClockKeepsToTheEngines() async throws {
        let server = try await TestServer("run-backoff-engine-clock")
        let pulls = FailingPulls(server, retryAfterSeconds: nil)
        let replica = try Replica("engine-clock", server: server, transport: pulls)
        let scheduler = SyncScheduler(engine: replica.engine, monitor: FixedConnectivity(online: true))
        await scheduler.start()
        try await replica.clock.waitForSleepers(2)  // the periodic and the retry timers, on the engine's clock
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started])
        #expect(pulls.count == 1, "one request per backoff")
        await scheduler.stop()
        await server.stop()
    }

    /// A background run that waits for a failed run's backoff starts once a
    /// completed run (the user's "sync now") ends the wait, not at the
    /// backoff's old end: its budget is the OS's window, which waiting on
    /// spends for nothing. Before, it slept on to the backoff's end (here
    /// 100 s, on a clock the test does not move).
    @Test func aBackgroundRunWaitingForABackoffStartsWhenACompletedRunEndsIt() async throws {
        let server = try await TestServer("run-backoff-background-wake")
        let pulls = FailingPulls(server, retryAfterSeconds: 100)
        let replica = try Replica("background-wake", server: server, transport: pulls)
        guard case .failed = await replica.sync().outcome else { Issue.record("the first run should fail"); return }
        let scheduler = SyncScheduler(engine: replica.engine, monitor: FixedConnectivity(online: false))
        let background = Task { await scheduler.runBackground(budgetMilliseconds: 200_000) }
        try await replica.clock.waitForSleepers(1)  // the background run waits for the backoff
        pulls.recover()
        #expect(await replica.sync().outcome == .completed)
        // Bounded: before, the background run never pulled, and waits on.
        try await waitUntil { pulls.count == 3 }
        #expect(await background.value.outcome == .completed)
        await server.stop()
    }

    /// Runs that fail alike before they push (here the store is closed,
    /// so reading the outbox fails) each tell the scheduler their backoff:
    /// the second one's state equals the first's, and must be published
    /// all the same, or the scheduler keeps the first's, long past.
    @Test func eachFailedRunIsHeardEvenInTheSameState() async throws {
        let server = try await TestServer("run-backoff-same-state")
        let replica = try Replica("same-state", server: server)
        replica.store.close()
        let scheduler = SyncScheduler.online(replica.engine, clock: replica.clock, periodMilliseconds: 600_000)
        await scheduler.start()
        try await waitUntil { await scheduler.triggered == [.started] }
        try await waitUntil { await replica.engine.nextRunAt != nil && replica.clock.sleeperCount == 2 }
        await scheduler.settle()
        let first = try #require(await replica.engine.nextRunAt)
        replica.clock.advance(by: first - replica.clock.nowMilliseconds)
        try await waitUntil { await scheduler.triggered == [.started, .retry] }
        await scheduler.settle()  // the retry's run has ended
        #expect((await replica.engine.nextRunAt ?? 0) > first)
        // Heard, the run's end sets the retry timer beside the periodic one;
        // not heard, nothing does, and the wait fails.
        try await waitUntil { replica.clock.sleeperCount == 2 }
        await scheduler.nudge()
        await scheduler.settle()
        #expect(await scheduler.triggered == [.started, .retry], "a nudge during the second failed run's backoff")
        await scheduler.stop()
        await server.stop()
    }

    @Test func afterAFailedRunOnlyTheRetryTimerStartsARun() {
        var core = SchedulerCore()
        #expect(core.handle(.started(online: true), at: 0) == [.sync(.started), .setTimer(.periodic, at: 30_000)])
        #expect(core.handle(.syncEnded(nextRunAt: 100_000), at: 1_000) == [.setTimer(.retry, at: 100_000)])
        #expect(core.handle(.nudge, at: 2_000) == [.setTimer(.retry, at: 100_000)])
        #expect(core.handle(.timerFired(.localWrite), at: 3_000) == [.setTimer(.retry, at: 100_000)])
        #expect(core.handle(.timerFired(.periodic), at: 30_000) == [.setTimer(.retry, at: 100_000), .setTimer(.periodic, at: 60_000)])
        #expect(core.handle(.connectivity(false), at: 40_000).contains(.cancelTimer(.retry)))
        #expect(core.handle(.syncEnded(nextRunAt: 100_000), at: 41_000).isEmpty, "offline, no timer")
        #expect(core.handle(.connectivity(true), at: 50_000) == [.setTimer(.networkRegained, at: 52_500)])
        #expect(
            core.handle(.timerFired(.networkRegained), at: 52_500) == [.setTimer(.retry, at: 100_000), .setTimer(.periodic, at: 82_500)])
        #expect(core.handle(.timerFired(.retry), at: 100_000) == [.sync(.retry)])
        // The retry ended offline: the backoff is over, and nothing is retried.
        #expect(core.handle(.syncEnded(nextRunAt: 100_000), at: 100_500) == [.cancelTimer(.retry)])
        #expect(core.handle(.nudge, at: 101_000) == [.sync(.nudge)])
        #expect(core.handle(.syncEnded(nextRunAt: 103_000), at: 102_000) == [.setTimer(.retry, at: 103_000)])
        #expect(core.handle(.syncEnded(nextRunAt: nil), at: 102_500) == [.cancelTimer(.retry)])
        #expect(core.handle(.timerFired(.localWrite), at: 102_600) == [.sync(.localWrite)])
    }

    /// The core: a completed run that left intents waiting for their retry
    /// time sets the retry timer for the earliest, which other triggers do
    /// not wait for; a failed run's backoff takes its place, and a
    /// cancelled or background run, or a time already past, sets none.
    @Test func aCompletedRunSetsTheRetryTimerForItsWaitingIntents() {
        var core = SchedulerCore()
        #expect(core.handle(.started(online: true), at: 0) == [.sync(.started), .setTimer(.periodic, at: 30_000)])
        #expect(core.handle(.syncEnded(nextRunAt: nil, intentRetryAt: 8_000), at: 1_000) == [.setTimer(.retry, at: 8_000)])
        #expect(core.handle(.nudge, at: 2_000) == [.sync(.nudge)])
        #expect(core.handle(.syncEnded(nextRunAt: 4_000, intentRetryAt: 8_000), at: 2_500) == [.setTimer(.retry, at: 4_000)])
        #expect(core.handle(.timerFired(.retry), at: 4_000) == [.sync(.retry)])
        #expect(core.handle(.syncEnded(nextRunAt: nil, intentRetryAt: 8_000), at: 4_500) == [.setTimer(.retry, at: 8_000)])
        #expect(core.handle(.timerFired(.retry), at: 8_000) == [.sync(.retry)])
        #expect(core.handle(.syncEnded(nextRunAt: nil, intentRetryAt: 7_000), at: 8_500) == [.cancelTimer(.retry)])
        #expect(
            core.handle(.syncEnded(nextRunAt: nil, intentRetryAt: 20_000, cancelled: true), at: 9_000) == [.cancelTimer(.retry)])
        #expect(
            core.handle(.syncEnded(nextRunAt: nil, intentRetryAt: 20_000, background: true), at: 9_500)
                == [.cancelTimer(.retry), .cancelTimer(.localWrite), .cancelTimer(.networkRegained), .setTimer(.periodic, at: 39_500)])
        #expect(core.handle(.connectivity(false), at: 10_000).contains(.cancelTimer(.retry)))
        #expect(core.handle(.syncEnded(nextRunAt: nil, intentRetryAt: 20_000), at: 10_500) == [.cancelTimer(.retry)], "offline")
    }

    /// A replica whose scheduler has started, and whose first run failed in
    /// its pull; the periodic timer (`periodMilliseconds`) and the retry
    /// timer are set.
    static func startFailing(
        _ name: String, _ server: TestServer, _ pulls: FailingPulls, periodMilliseconds: UInt64 = 60_000
    ) async throws -> (Replica, SyncScheduler) {
        let replica = try Replica(name, server: server, transport: pulls)
        let scheduler = SyncScheduler.online(replica.engine, clock: replica.clock, periodMilliseconds: periodMilliseconds)
        await scheduler.start()
        try await waitUntil { await scheduler.triggered.count == 1 }
        await scheduler.settle()
        try await replica.clock.waitForSleepers(2)
        #expect(pulls.count == 1)
        #expect(await replica.engine.lastError != nil)
        return (replica, scheduler)
    }
}

/// Health and pushes through the real server; every pull fails with
/// `failure` until `recover()` (and again from `fail()`). Counts the pulls.
final class FailingPulls: SyncTransport {
    private let inner: HTTPTransport
    private let failure: TransportError
    private let state = Mutex((failing: true, count: 0))

    init(_ server: TestServer, failure: TransportError) {
        inner = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        self.failure = failure
    }

    /// Pulls that fail with a 503 and `retryAfterSeconds`, or, without
    /// one, with a network error.
    convenience init(_ server: TestServer, retryAfterSeconds: Int?) {
        let failure =
            retryAfterSeconds.map { TransportError(.status(503, .serviceUnavailable), "pull: HTTP 503", retryAfterSeconds: $0) }
            ?? TransportError(.network, "pull: connection reset")
        self.init(server, failure: failure)
    }

    var count: Int { state.withLock { $0.count } }

    func recover() { state.withLock { $0.failing = false } }

    func fail() { state.withLock { $0.failing = true } }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { try await inner.push(request) }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        let failing = state.withLock { state in
            state.count += 1
            return state.failing
        }
        guard failing else { return try await inner.pull(cursor: cursor, limit: limit, types: types) }
        throw failure
    }
}

/// `inner`, with each pull waiting at `gate` first.
struct HeldPulls: SyncTransport {
    let inner: FailingPulls
    let gate: PullGate

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { try await inner.push(request) }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        await gate.pass()
        return try await inner.pull(cursor: cursor, limit: limit, types: types)
    }
}

/// Through the real server, but the first push is refused as too large
/// (413, with `retryAfterSeconds`) and every pull's cursor is refused (410).
final class SplitThenRefusedCursor: SyncTransport {
    private let inner: HTTPTransport
    private let retryAfterSeconds: Int
    private let pushes = Mutex(0)

    init(_ server: TestServer, retryAfterSeconds: Int) {
        inner = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        self.retryAfterSeconds = retryAfterSeconds
    }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        let first = pushes.withLock { count in
            count += 1
            return count == 1
        }
        guard !first else {
            throw TransportError(.status(413, nil), "push: HTTP 413", retryAfterSeconds: retryAfterSeconds)
        }
        return try await inner.push(request)
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        throw TransportError(.status(410, nil), "pull: HTTP 410")
    }
}

/// Health through the real server; every push and pull calls `cancel` (the
/// run's cancellation fires) and then fails with the server's answer, a 503
/// with `Retry-After: 600`.
struct AnsweredAsCancelled: SyncTransport {
    private let inner: HTTPTransport
    private let cancel: @Sendable () -> Void

    init(_ server: TestServer, cancel: @escaping @Sendable () -> Void) {
        inner = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        self.cancel = cancel
    }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { throw answered() }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse { throw answered() }

    private func answered() -> TransportError {
        cancel()
        return TransportError(.status(503, .serviceUnavailable), "HTTP 503", retryAfterSeconds: 600)
    }
}

/// `inner`, but each pull fails as a 500 would while `failing()` says so.
private struct PullsFailingOnDemand: SyncTransport {
    let inner: any SyncTransport
    let failing: @Sendable () -> Bool

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { try await inner.push(request) }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        if failing() { throw TransportError(.status(500, .internalError), "GET /v1/pull: HTTP 500 (the test's)") }
        return try await inner.pull(cursor: cursor, limit: limit, types: types)
    }
}
