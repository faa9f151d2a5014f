import LogSync
import LogTesting
import Testing

/// `SchedulerCore` driven by long random runs of events at increasing
/// times, its timers firing when due as a real timer set would, with the
/// scheduling rules checked after every step: the rules come from the
/// design (periodic sync, local writes debounced 1 s, network regained
/// debounced 2.5 s and only on a gain or a freed path (one no longer
/// expensive, where intents waited for that), nudges at once, and a trigger that
/// comes while a run is under way held for one run as it ends, unless the
/// run was cancelled or a background run) and
/// `Format/sync-protocol.md` section 10 ("Retry timing": after a failed
/// run the next run starts no sooner than its backoff; after a completed
/// run that left an intent waiting for its own retry time, a run by then).
///
/// `SEED=n swift test --filter SchedulerModelTests` replays seed n as run 0
/// (run `r` uses `SEED + r`); a failure prints its seed and event trace.
@Suite struct SchedulerModelTests {
    static let runCount = 2_000
    static let eventCountPerRun = 200
    static let baseSeed = SeededRandom.seed(default: 20_000)

    @Test func randomRunsKeepTheSchedulingRules() {
        for run in 0..<Self.runCount {
            var model = SchedulerModel(seed: Self.baseSeed + UInt64(run))
            model.run(eventCount: Self.eventCountPerRun)
            if let failure = model.failure {
                Issue.record("\(failure)")
                return
            }
        }
    }
}

/// A sync the rules owe: for a local write, a nudge held back by the
/// backoff, or an intent's retry. `due` is when it must have started at the
/// latest (or at the backoff's end, if later); nil while offline, as only a
/// gain can start it.
private struct Owed {
    var due: UInt64?
}

private enum Trigger: Hashable, CustomStringConvertible {
    case localWrite, nudge, intentRetry, pathFreed

    var description: String {
        switch self {
        case .localWrite: "local write"
        case .pathFreed: "freed path"
        case .nudge: "nudge"
        case .intentRetry: "intent's retry"
        }
    }
}

/// One random run: the core, the timers it armed and what the rules say
/// must hold, decided from the events alone.
private struct SchedulerModel {
    let seed: UInt64
    var random: SeededRandom
    var core = SchedulerCore()
    /// The armed timers and their deadlines: a set replaces, a cancel removes.
    var timers: [SchedulerCore.Timer: UInt64] = [:]
    var now: UInt64 = 0
    var started = false
    var online = false
    /// The last failed run's backoff: no sync before it.
    var backoffUntil: UInt64?
    /// The retry time of the intents the last run left waiting, when its
    /// end set the retry timer for them: until the timer fires or goes.
    var intentRetryAt: UInt64?
    /// A run is under way (`.syncRunning` until `.syncEnded`), and a
    /// trigger came meanwhile, online and not backing off.
    var running = false
    var held = false
    var owed: [Trigger: Owed] = [:]
    /// The steps so far, formatted only for a failure.
    var trace: [(time: UInt64, event: SchedulerCore.Event, actions: [SchedulerCore.Action])] = []
    var failure: String?

    /// A bound on the timers one advance may fire (each fire sets at most
    /// one timer later than now, so a long quiet stretch fires a few each period).
    static let firesPerAdvanceMax = 1_000
    /// The quiet stretch that ends a run: longer than the longest backoff.
    static let quietMilliseconds: UInt64 = 400_000

    init(seed: UInt64) {
        self.seed = seed
        random = SeededRandom(seed: seed)
    }

    mutating func run(eventCount: Int) {
        var startAt = Int.random(in: 0..<4, using: &random)
        for index in 0..<eventCount where failure == nil {
            // A timer due at the event's time fires before or after it, as it happens.
            advance(to: now + nextGap(), including: Bool.random(using: &random))
            guard failure == nil else { return }
            if started && Int.random(in: 0..<100, using: &random) == 0 {
                restart()
                startAt = index + Int.random(in: 0..<3, using: &random)
            }
            step(index == startAt ? .started(online: Int.random(in: 0..<4, using: &random) > 0) : nextEvent())
        }
        guard failure == nil else { return }
        // A quiet end, online, the run under way ended: everything owed is synced by then.
        if running { step(.syncEnded(nextRunAt: nextRunAt(), intentRetryAt: nil, cancelled: false, background: false)) }
        if !started {
            step(.started(online: true))
        } else if !online {
            step(.connectivity(true))
        }
        advance(to: now + Self.quietMilliseconds, including: true)
        for (trigger, owing) in owed where failure == nil {
            fail("a \(trigger) is still owed a sync (due \(owing.due.map(String.init) ?? "online")) at the quiet end \(now)")
        }
    }

    /// `SyncScheduler.stop()` and `start()`: the timers go, the core stays,
    /// and until the first connectivity report it hears only writes, nudges
    /// and run ends, knowing no connectivity, as at the first start.
    mutating func restart() {
        timers = [:]
        step(.stopped)
    }

    // MARK: - Random events

    mutating func nextGap() -> UInt64 {
        switch Int.random(in: 0..<10, using: &random) {
        case 0: 0
        case 1...6: UInt64.random(in: 1...1_500, using: &random)
        case 7, 8: UInt64.random(in: 1...6_000, using: &random)
        default: UInt64.random(in: 1...45_000, using: &random)
        }
    }

    mutating func nextEvent() -> SchedulerCore.Event {
        let roll = Int.random(in: 0..<100, using: &random)
        if !started {
            // Before the first connectivity report, the scheduler hears writes, nudges and runs.
            return roll < 55 ? .localWrite : roll < 70 ? .nudge : roll < 80 ? .syncRunning : runEnded()
        }
        switch roll {
        case 0..<35: return .localWrite
        case 35..<45: return .nudge
        case 45..<55: return .connectivity(!online)
        case 55..<58: return .connectivity(online)
        case 58..<60: return .pathFreed
        case 60..<75: return .syncRunning
        default: return runEnded()
        }
    }

    /// A run's end, one in five of them cancelled (a background budget
    /// spent), one in five a background run's; one in two leaves an intent
    /// waiting for its retry time.
    mutating func runEnded() -> SchedulerCore.Event {
        .syncEnded(
            nextRunAt: nextRunAt(), intentRetryAt: nextIntentRetryAt(), cancelled: Int.random(in: 0..<5, using: &random) == 0,
            background: Int.random(in: 0..<5, using: &random) == 0)
    }

    /// A run's `SyncEngine.nextRunAt`: none, already past, a short backoff or a long one.
    mutating func nextRunAt() -> UInt64? { time(noneInTen: 4) }

    /// The intents' retry time a run's end reports: none, already past, soon or late.
    mutating func nextIntentRetryAt() -> UInt64? { time(noneInTen: 5) }

    /// None (`none` times in ten), already past, within 8 s, or within 300 s.
    mutating func time(noneInTen none: Int) -> UInt64? {
        let roll = Int.random(in: 0..<10, using: &random)
        if roll < none { return nil }
        if roll == none { return now - min(now, UInt64.random(in: 0...5_000, using: &random)) }
        return now + UInt64.random(in: 1...(roll < 9 ? 8_000 : 300_000), using: &random)
    }

    // MARK: - Time

    /// Fires the timers due before `time` (or at it, if `including`), in
    /// deadline order, each at its deadline.
    mutating func advance(to time: UInt64, including: Bool) {
        for _ in 0..<Self.firesPerAdvanceMax {
            guard failure == nil else { return }
            let due = timers.filter { $0.value < time || (including && $0.value == time) }
            guard let (timer, deadline) = due.min(by: { ($0.value, order($0.key)) < ($1.value, order($1.key)) }) else {
                now = time
                checkOwed()
                return
            }
            precondition(deadline >= now, "a timer set in the past")
            now = deadline
            checkOwed()
            timers[timer] = nil
            step(.timerFired(timer))
        }
        fail("more than \(Self.firesPerAdvanceMax) timers fired before \(time)")
    }

    private func order(_ timer: SchedulerCore.Timer) -> Int {
        switch timer {
        case .periodic: 0
        case .localWrite: 1
        case .networkRegained: 2
        case .retry: 3
        }
    }

    mutating func checkOwed() {
        // While a run is under way, what is owed waits for its end.
        guard !running else { return }
        for (trigger, owing) in owed where failure == nil {
            guard let due = owing.due else { continue }
            let latest = max(due, backoffUntil ?? 0)
            if now > latest { fail("a \(trigger) was owed a sync by \(latest), none started by \(now)") }
        }
    }

    mutating func fail(_ message: String) {
        guard failure == nil else { return }
        let lines = trace.suffix(40).map { "t=\($0.time) \($0.event) -> \($0.actions)" }.joined(separator: "\n  ")
        failure = "seed \(seed) (replay: SEED=\(seed) swift test --filter SchedulerModelTests): \(message)\n  ...\n  \(lines)"
    }
}

// MARK: - One step and its checks

extension SchedulerModel {
    /// Hands `event` to the core at `now`, applies its actions to the timers
    /// and checks them and the state that follows against the rules.
    mutating func step(_ event: SchedulerCore.Event) {
        let wasOnline = online
        let wasHeld = held
        let actions = core.handle(event, at: now)
        trace.append((now, event, actions))
        update(for: event)
        for action in actions {
            switch action {
            case .sync: owed = [:]
            case .setTimer(let timer, let at): timers[timer] = at
            case .cancelTimer(let timer): timers[timer] = nil
            }
        }
        checkActions(actions, for: event, wasOnline: wasOnline, wasHeld: wasHeld)
        checkState(after: event)
    }

    /// What the event changes in the rules' view: connectivity, the backoff, the syncs owed.
    mutating func update(for event: SchedulerCore.Event) {
        switch event {
        case .started(let isOnline):
            started = true
            online = isOnline
            // Online, the start syncs at once (or at the backoff's end).
            for trigger in owed.keys { owed[trigger]?.due = isOnline ? now : nil }
        case .localWrite:
            // Each write re-arms the debounce; offline, it waits for a gain.
            owed[.localWrite] = Owed(due: online ? now + core.localWriteDebounceMilliseconds : nil)
        case .nudge:
            if online { owed[.nudge] = Owed(due: now) }
        case .pathFreed:
            // The intents held on the costly path are owed the network
            // timer's run; it is armed again, so what a gain left waiting
            // for it waits as long.
            guard online else { return }
            let due = now + core.networkDebounceMilliseconds
            for (trigger, owing) in owed where owing.due != nil && owing.due == timers[.networkRegained] { owed[trigger]?.due = due }
            owed[.pathFreed] = Owed(due: due)
        case .connectivity(let isOnline):
            guard isOnline != online else { return }
            online = isOnline
            // A loss cancels every timer; the gain's run pushes what is due.
            if !isOnline { intentRetryAt = nil }
            for trigger in owed.keys { owed[trigger]?.due = isOnline ? now + core.networkDebounceMilliseconds : nil }
        case .stopped:
            started = false
            online = false
            running = false
            held = false
            intentRetryAt = nil
            for trigger in owed.keys { owed[trigger]?.due = nil }
        case .timerFired(let timer):
            if timer == .retry { intentRetryAt = nil }
        case .syncRunning:
            running = true
        case .syncEnded(let nextRunAt, let retryAt, let cancelled, let background):
            backoffUntil = nextRunAt.flatMap { $0 > now ? $0 : nil }
            // The intents' retry is owed a run, online, not backing off (the
            // retry timer is then the backoff's), unless the run was
            // cancelled or a background run's: the next trigger's run pushes them.
            intentRetryAt = nil
            owed[.intentRetry] = nil
            if let retryAt, retryAt > now, backoffUntil == nil, online, !cancelled, !background {
                intentRetryAt = retryAt
                owed[.intentRetry] = Owed(due: retryAt)
            }
            // A run that ends with no wait took in the triggers due before
            // it was under way (the engine merges a sync asked for as one
            // starts); those held while it was sync as it ends (`checkActions`),
            // unless it was cancelled or a background run's: then the next
            // trigger syncs for them. So does it (or the retry) for those
            // due after a background run's end, whose timers it cancels (a
            // write's debounce, a regained network's).
            if backoffUntil == nil { owed = owed.filter { $0.value.due.map { $0 > now } ?? true } }
            if background { owed = owed.filter { $0.value.due.map { $0 <= now } ?? true } }
            running = false
            held = false
        }
    }

    mutating func checkActions(_ actions: [SchedulerCore.Action], for event: SchedulerCore.Event, wasOnline: Bool, wasHeld: Bool) {
        let syncs = actions.compactMap { if case .sync(let reason) = $0 { reason } else { nil } }
        var set: [SchedulerCore.Timer: [UInt64]] = [:]
        var cancelled: Set<SchedulerCore.Timer> = []
        for action in actions {
            if case .setTimer(let timer, let at) = action { set[timer, default: []].append(at) }
            if case .cancelTimer(let timer) = action { cancelled.insert(timer) }
        }
        if syncs.count > 1 { fail("more than one sync in one step: \(actions)") }
        for (timer, deadlines) in set {
            if cancelled.contains(timer) { fail("\(timer) is both set and cancelled: \(actions)") }
            if deadlines.count > 1 { fail("\(timer) is set twice: \(actions)") }
            if deadlines.contains(where: { $0 <= now }) { fail("\(timer) is set for a time not after now: \(actions)") }
        }
        if !syncs.isEmpty && !online { fail("a sync while offline") }
        if !syncs.isEmpty && running { fail("a sync while a run is under way") }
        if case .syncEnded(_, _, let cancelled, let background) = event {
            // One run for every trigger held, online, not backing off, not
            // cancelled and not a background run's; none without one.
            let owedRun = wasHeld && online && backoffUntil == nil && !cancelled && !background
            if syncs.count != (owedRun ? 1 : 0) { fail("a run's end gives \(syncs), held: \(wasHeld)") }
        }
        if !syncs.isEmpty, let backoffUntil, now < backoffUntil { fail("a sync before the backoff's end \(backoffUntil)") }
        checkTriggerSyncs(syncs, for: event)
        if case .connectivity(let isOnline) = event {
            if isOnline && !wasOnline && set[.networkRegained] != [now + core.networkDebounceMilliseconds] {
                fail("a gain does not arm the network timer for \(now + core.networkDebounceMilliseconds)")
            }
            if isOnline == wasOnline && (!actions.isEmpty) { fail("no change of connectivity, yet \(actions)") }
            if !syncs.isEmpty { fail("a connectivity change syncs at once") }
        }
        if case .pathFreed = event {
            let expected: [SchedulerCore.Action] =
                online ? [.setTimer(.networkRegained, at: now + core.networkDebounceMilliseconds)] : []
            if actions != expected { fail("a freed path gives \(actions), not \(expected)") }
        }
    }

    /// A trigger while online and not backing off syncs, for its reason.
    mutating func checkTriggerSyncs(_ syncs: [SchedulerCore.Reason], for event: SchedulerCore.Event) {
        guard online else { return }
        let trigger: SchedulerCore.Reason? =
            switch event {
            case .started: .started
            case .nudge: .nudge
            case .timerFired(.periodic): .periodic
            case .timerFired(.localWrite): .localWrite
            case .timerFired(.networkRegained): .networkRegained
            case .timerFired(.retry): .retry
            case .localWrite, .connectivity, .pathFreed, .syncRunning, .syncEnded, .stopped: nil
            }
        // While a run is under way, a trigger is held for the run's end,
        // backing off or not: the run's end says whether it backs off.
        if running {
            if trigger != nil { held = true }
            return
        }
        guard backoffUntil.map({ now >= $0 }) ?? true else { return }
        if let trigger, syncs != [trigger] { fail("\(event) online after any backoff gives \(syncs), not a \(trigger) sync") }
        // A run's end syncs for the triggers held (`checkActions`).
        if case .syncEnded = event { return }
        if trigger == nil, !syncs.isEmpty { fail("\(event) syncs at once") }
    }

    mutating func checkState(after event: SchedulerCore.Event) {
        if !online {
            if !timers.isEmpty { fail("offline with timers armed: \(timers)") }
            return
        }
        let backingOff = backoffUntil.map { now < $0 } ?? false
        if timers[.periodic] == nil && timers[.networkRegained] == nil { fail("online with no periodic timer, nor a network timer to arm it") }
        if let periodic = timers[.periodic], periodic > now + core.periodMilliseconds { fail("the periodic timer is more than a period away") }
        // A retry due now, beside another timer due now, fires next: the
        // engine merges the two syncs into one run.
        if let retry = timers[.retry], retry != (backoffUntil ?? intentRetryAt) || retry < now {
            fail(
                "a retry timer at \(retry) with the backoff until \(backoffUntil.map(String.init) ?? "none") "
                    + "and intents due at \(intentRetryAt.map(String.init) ?? "none")")
        }
        if !backingOff, let intentRetryAt, timers[.retry] != intentRetryAt {
            fail("intents wait until \(intentRetryAt) online, the retry timer is at \(timers[.retry].map(String.init) ?? "none")")
        }
        // Right after a gain the network timer arms the retry when it fires:
        // a retry sooner would skip the network debounce.
        if backingOff && timers[.networkRegained] == nil && timers[.retry] != backoffUntil {
            fail("backing off until \(backoffUntil!) online, the retry timer is at \(timers[.retry].map(String.init) ?? "none")")
        }
    }
}
