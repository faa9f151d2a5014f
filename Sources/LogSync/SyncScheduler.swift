import LogStore

/// Runs `SchedulerCore`'s rules: it listens to the store's intent commits,
/// the connectivity monitor and server nudges, keeps the timers on the
/// engine's clock, and starts syncs (the engine's single flight merges
/// overlapping ones). Also runs time-boxed background syncs. It hands each
/// of the monitor's paths to the engine (`SyncEngine.networkPathChanged`);
/// a path the engine's `NetworkPolicy` syncs not over is no path to its
/// rules, and one that stops being expensive or constrained, when the
/// policy pushes some types only on free paths, arms the network timer as
/// a gain does.
///
/// A trigger that comes while a run pushes or pulls starts one more run
/// as it ends, for all such triggers together: joined, the run could have
/// been past what the trigger was for. A run that was cancelled (a
/// background run's budget spent), or that a background run ran (however
/// it ended: the OS's window ends with the background task), starts none
/// as it ends: the next trigger syncs. A background run's end also
/// cancels the timers that would start a run soon after, with no budget (a
/// local write's debounce, the network-regained timer), and starts the
/// periodic timer's period again.
///
/// After a failed run it starts none until `SyncEngine.nextRunAt` (the
/// backoff, at least the server's `Retry-After`, or the open circuit
/// breaker), then retries once; it learns of every run's end from the
/// engine's states, so an app's own `engine.sync()` (a user's "sync now",
/// which runs at once all the same) sets or clears that wait too.
///
/// Its rules and timers run on the clock's monotonic reading, as the
/// engine's deadlines do: a step of the wall clock moves no timer.
public actor SyncScheduler {
    private let engine: SyncEngine
    private let clock: any SyncClock
    private let monitor: any ConnectivityMonitor
    private var core: SchedulerCore
    private var timers: [SchedulerCore.Timer: (generation: UInt64, task: Task<Void, Never>)] = [:]
    private var generation: UInt64 = 0
    private var listeners: [Task<Void, Never>] = []
    /// Counts `start()`s: a listener's event counts only while the start
    /// that made it is current. Cancelling a listener does not stop it at
    /// once; it still hands on the reports already buffered in its stream.
    private var epoch: UInt64 = 0
    /// The syncs started and not yet ended, by number: each removes itself
    /// when it ends, so a long-lived scheduler holds none of the past ones.
    private var syncs: [UInt64: Task<Void, Never>] = [:]
    private var syncNumber: UInt64 = 0
    /// The length of each wait of the watch the scheduler keeps
    /// (`watchFeed(waitSeconds:)`), nil when it keeps none; and the watch
    /// while it runs.
    private var watchSeconds: Int?
    private var watch: Task<Void, Never>?
    /// Why each sync was started, in order, the newest
    /// `triggeredCountMax` of them (for tests and diagnostics).
    public private(set) var triggered: [SchedulerCore.Reason] = []
    /// The most reasons `triggered` keeps: a scheduler lives as long as the
    /// app, and with a sync every 30 s it would otherwise grow for ever.
    public static let triggeredCountMax = 100

    /// - Parameters:
    ///   - clock: the engine's when nil. The engine's deadlines (a failed
    ///     run's backoff, `nextRunAt`) are readings of its clock: timers
    ///     and budgets on another clock would end at other times.
    public init(engine: SyncEngine, clock: (any SyncClock)? = nil, monitor: any ConnectivityMonitor, core: SchedulerCore = .init()) {
        self.engine = engine
        self.clock = clock ?? engine.clock
        self.monitor = monitor
        self.core = core
    }

    /// Starts listening; the first connectivity report starts the rules.
    public func start() {
        guard listeners.isEmpty else { return }
        epoch += 1
        let epoch = self.epoch
        let engine = self.engine
        let store = engine.store
        let monitor = self.monitor
        // Finished once the states listener has handed on the engine's
        // state (its stream's first value is the latest state): the first
        // report starts the rules only then. A run under way holds the start's
        // trigger for one more run as it ends, and a failed run's backoff
        // holds it until the backoff's end. Handled first (it was, with a
        // monitor that reports at once), the start joined the run under
        // way, which may be past its push.
        let (engineStateHeard, heard) = AsyncStream<Void>.makeStream()
        let policy = engine.configuration.network
        listeners.append(Task { [weak self] in
            var last: NetworkPath?
            for await path in monitor.paths() {
                await engine.networkPathChanged(path)
                // A path the policy syncs not over is no path to the rules:
                // leaving it for one it syncs over is a gain.
                let online = policy.allowsSync(over: path)
                let event: SchedulerCore.Event
                if let last {
                    let wasOnline = policy.allowsSync(over: last)
                    let freed = online && wasOnline && !policy.heldTypes(on: last).isEmpty && policy.heldTypes(on: path).isEmpty
                    event = freed ? .pathFreed : .connectivity(online)
                } else {
                    for await _ in engineStateHeard {}
                    event = .started(online: online)
                }
                await self?.listened(event, epoch)
                last = path
            }
        })
        listeners.append(Task { [weak self] in
            for await _ in store.intentCommits() { await self?.listened(.localWrite, epoch) }
        })
        listeners.append(Task { [weak self] in
            // Every run ends in one of the other states. How it ended comes
            // with its end: read from the engine once this listener gets to
            // it, it would be a later run's, which may have started (and
            // ended) meanwhile.
            for await change in engine.stateChanges() {
                switch change.state {
                case .pushing, .pulling: await self?.listened(.syncRunning, epoch)
                case .idle, .rateLimited, .error:
                    await self?.listened(
                        .syncEnded(
                            nextRunAt: change.nextRunAt, intentRetryAt: change.intentRetryAt, cancelled: change.cancelled,
                            background: change.background), epoch)
                }
                heard.finish()
            }
            heard.finish()
        })
    }

    /// Stops listening and cancels the timers and the watch; a running
    /// sync finishes.
    public func stop() {
        // The core forgets the connectivity: a restart's first report starts the rules again.
        handle(.stopped)
        for task in listeners + timers.values.map(\.task) { task.cancel() }
        listeners = []
        timers = [:]
        updateWatch()
    }

    /// Keeps `SyncEngine.watchFeed(waitSeconds:)` running while the
    /// scheduler is started and its monitor reports a path the network
    /// policy syncs over: it syncs as other devices' changes reach the
    /// server, where the scheduler's own triggers are local writes, the
    /// network and timers. Offline, or stopped, the watch stops; it starts
    /// again with the path, so it asks the server at once rather than after
    /// the pause its failed waits grew to. Call it before or after
    /// `start()`; a second call changes the length of the waits of the
    /// next watch it starts.
    /// - Throws: `SyncConfigurationError` when the engine's transport
    ///   cannot wait (it is not `FeedWaiting`).
    public func watchFeed(waitSeconds: Int = 25) throws(SyncConfigurationError) {
        _ = try engine.feedWaiting()
        watchSeconds = waitSeconds
        updateWatch()
    }

    /// Starts or stops the watch as the scheduler's state wants it.
    private func updateWatch() {
        let wanted = watchSeconds != nil && !listeners.isEmpty && core.online
        if wanted, watch == nil, let seconds = watchSeconds {
            let engine = self.engine
            watch = Task { try? await engine.watchFeed(waitSeconds: seconds) }
        } else if !wanted, let running = watch {
            running.cancel()
            watch = nil
        }
    }

    /// Whether the scheduler's watch runs (tests).
    var isWatching: Bool { watch != nil }

    /// A scheduler released without `stop()` stops listening too: its
    /// listeners and timers would otherwise run on, holding the engine (and
    /// so its `states()` streams open), for as long as the monitor's stream
    /// and the clock last, which is for ever for most.
    deinit {
        for task in listeners + timers.values.map(\.task) { task.cancel() }
        watch?.cancel()
    }

    /// A server nudge (a push notification, a websocket message): sync now.
    /// Without a notification service, `watchFeed(waitSeconds:)` hears of
    /// the server's changes itself, by a long poll.
    /// A push that woke the app in the background syncs with
    /// `runBackground(budgetMilliseconds:)` instead: the run a nudge starts
    /// has no budget.
    public func nudge() { handle(.nudge) }

    /// A sync that must end within `budgetMilliseconds` (an OS background
    /// window): once the budget has passed on the scheduler's clock it
    /// stops, abandoning the request it waits for, and keeping what it
    /// recorded and applied. A budget already spent (0) makes no request,
    /// not even the health check: it ends at once, as `.cancelled` (or as
    /// `.deferred` or `.rateLimited`, below).
    /// A sync already running is joined, and stopped by the budget all the
    /// same.
    /// Cancelling the caller's task (the OS's expiration handler) stops it
    /// too. The scheduler need not be started.
    /// Unlike the app's own `engine.sync()`, it keeps to a failed run's
    /// backoff (`SyncEngine.nextRunAt`), as the scheduler's own runs do: it
    /// waits for the backoff's end (or a completed run's, which ends it)
    /// within the budget, and when the backoff lasts longer it makes no
    /// request and ends as `.deferred`, with the time the backoff ends. An
    /// open circuit breaker ends it at once as `.rateLimited`.
    ///
    /// The triggers that come while it runs (or while the run it joined
    /// runs) start no run as it ends, even when it completes within the
    /// budget: a run started then would have none, and the OS suspends the
    /// app once its background task ends. Nor does a timer armed as it
    /// ends, a local write's debounce (a write made during it) or the
    /// network-regained timer (the network came back during it): its end
    /// cancels them, and starts the periodic timer's period again. The
    /// next trigger syncs.
    public func runBackground(budgetMilliseconds: UInt64) async -> SyncReport {
        let deadline = clock.monotonicMilliseconds.addingSaturating(budgetMilliseconds)
        return await engine.backgroundSync(cancellation: SyncCancellation(deadlineMilliseconds: deadline, clock: clock), deadline: deadline)
    }

    /// Whether the rules know of a run under way (tests).
    var isSyncRunning: Bool { core.syncRunning }

    /// How many started syncs the scheduler still holds (tests).
    var heldSyncCount: Int { syncs.count }

    /// How many timers' sleeps ended after the timer was set again or
    /// cancelled, and were ignored (tests).
    private(set) var staleTimerFireCount = 0

    /// Waits for the syncs started so far (tests).
    public func settle() async {
        let running = syncs
        syncs = [:]
        for task in running.values { await task.value }
    }

    private func handle(_ event: SchedulerCore.Event) {
        defer { updateWatch() }
        for action in core.handle(event, at: clock.monotonicMilliseconds) {
            switch action {
            case .sync(let reason):
                if triggered.count == Self.triggeredCountMax { triggered.removeFirst() }
                triggered.append(reason)
                let engine = self.engine
                syncNumber += 1
                let number = syncNumber
                syncs[number] = Task { [weak self] in
                    await engine.sync()
                    await self?.syncEnded(number)
                }
            case .setTimer(let timer, let deadline):
                timers[timer]?.task.cancel()
                let clock = self.clock
                generation += 1
                let current = generation
                timers[timer] = (current, Task { [weak self] in
                    guard (try? await clock.sleep(untilMilliseconds: deadline)) != nil else { return }
                    await self?.fire(timer, current)
                })
            case .cancelTimer(let timer):
                timers.removeValue(forKey: timer)?.task.cancel()
            }
        }
    }

    /// An event from a listener of the start `epoch`: ignored once stopped.
    private func listened(_ event: SchedulerCore.Event, _ epoch: UInt64) {
        guard epoch == self.epoch, !listeners.isEmpty else { return }
        handle(event)
    }

    private func syncEnded(_ number: UInt64) { syncs[number] = nil }

    /// A timer's sleep ended; it counts only if it was not replaced or cancelled since.
    private func fire(_ timer: SchedulerCore.Timer, _ generation: UInt64) {
        guard timers[timer]?.generation == generation else {
            staleTimerFireCount += 1
            return
        }
        timers[timer] = nil
        handle(.timerFired(timer))
    }
}
