import LogFormat
import LogStore

/// Syncs one store with its server: pushes the outbox, then pulls the change
/// feed, as `Format/sync-protocol.md` section 10 describes.
///
/// - One run at a time: a `sync()` while one runs joins it.
/// - A health check comes first; without real connectivity the run ends
///   quietly (`.offline`), with no error and no retry counted. A server
///   that answers in another protocol version is reachable, and no run can
///   sync with it: the run fails (`SyncHealth.serverProtocolVersion`).
///   So does one that answers with an error status (a 503 while its store
///   is unavailable), and the next run waits at least its `Retry-After`.
/// - Each intent's answer is recorded on its own; retryable failures are
///   retried with backoff and jitter, permanent ones are reported through
///   `Store.events()`; conflicts go to the entity type's strategy, and a
///   decision the store refuses leaves its conflict for the app
///   (`SyncReport.refusedDecisions`).
/// - Three consecutive 429s open the circuit breaker.
/// - A failed run backs off as a retry does: `nextRunAt` is when the
///   scheduler starts the next run, after the retry policy's delay for the
///   failed runs in a row and at least the failure's `Retry-After`; a
///   completed run resets it. A pull's failure has no intent to carry its
///   retry time, so the run carries it. An explicit `sync()` runs at once.
/// - Every pulled page is applied with its cursor in one transaction, and
///   only while the store's cursor is the one it was pulled from: a
///   `Store.resync` made while the page came is not undone by it, and the
///   pull goes on from the feed's start;
///   cancellation is checked between pages, and between push requests,
///   and abandons the request in flight.
/// - Every wait (an intent's retry, the run backoff, the breaker) is kept on
///   the clock's monotonic reading, so a step of the wall clock neither
///   lengthens nor shortens it; the times the engine shows are moved to the
///   wall clock as it reads when they are asked for.
///
/// Caveats: the engine never holds a store transaction across an `await`
/// (every store call is one synchronous transaction). Intents in flight are
/// not marked in the store: after a crash they are simply pushed again, and
/// the server answers `duplicate` for those it had applied.
public actor SyncEngine {
    public let store: Store
    let transport: any SyncTransport
    /// Every deadline of the engine is on this clock's monotonic reading:
    /// a `SyncScheduler` given no clock of its own keeps its timers on it.
    let clock: any SyncClock
    let configuration: SyncConfiguration
    var random: any RandomNumberGenerator & Sendable

    private var breaker: CircuitBreaker
    /// Failed runs since the last completed one, and when the next may
    /// start (a monotonic reading; `nextRunAt`).
    private var failedRuns: UInt32 = 0
    private var runBackoffUntil: UInt64 = 0
    /// The `Retry-After` of the running sync's last failed request.
    private var retryAfterSeconds: Int?
    /// The earliest retry time (a monotonic reading) the running sync gave
    /// the intents of a failed push request: a failed run backs off at
    /// least until then, so that the retry run finds them due (`finish`).
    private var retryScheduledAt: UInt64?
    private var running: Task<SyncReport, Never>?
    private let stateFeed = Broadcast(latest: SyncState.idle)
    private let changeFeed = Broadcast(latest: StateChange(state: .idle, nextRunAt: nil, cancelled: false, background: false))
    public private(set) var state = SyncState.idle
    /// Whether the last health check reached the server.
    public var isOnline: Bool { onlineSince != nil }
    /// When the health checks started reaching the server (nil while they
    /// fail): on the monotonic reading, which `isStuck`'s wait is measured
    /// on, and on the wall clock as it read then, which is comparable with
    /// the times the log's entries were written.
    private var onlineSince: (monotonic: UInt64, wall: UInt64)?
    public private(set) var lastSuccessAt: UInt64?
    public private(set) var lastError: String?
    /// Why the server counts as unreachable (`SyncHealth.offlineReason`).
    private var offlineReason: String?
    /// The protocol version the server answered in, when it was not this
    /// client's; cleared by a health check the server passes.
    public private(set) var serverProtocolVersion: String?

    public init(
        store: Store, transport: any SyncTransport, clock: any SyncClock = SystemClock(),
        configuration: SyncConfiguration = .init(), random: any RandomNumberGenerator & Sendable = SystemRandomNumberGenerator()
    ) throws(SyncConfigurationError) {
        try configuration.validate()
        if configuration.pulledScopes != nil, !(transport is any ScopedPulling) {
            throw SyncConfigurationError("pulledScopes needs a transport that can pull by scope (ScopedPulling), such as HTTPTransport")
        }
        self.store = store
        self.transport = transport
        self.clock = clock
        self.configuration = configuration
        self.random = random
        breaker = CircuitBreaker(retryAfterMaxMilliseconds: configuration.retry.retryAfterMaxMilliseconds)
    }

    /// The current state, then every change, and each failed run's `.error`
    /// even when it repeats the last one (every failed run sets a backoff).
    /// It holds the newest `stateBufferCountMax` states its reader has not
    /// read: a reader that falls further behind skips the oldest, and the
    /// last it reads is the current state. The stream ends when the engine
    /// is released.
    public nonisolated func states() -> AsyncStream<SyncState> {
        stateFeed.subscribe(bufferingNewest: SyncEngine.stateBufferCountMax)
    }

    /// The most unread states a `states()` stream holds: some runs' worth of
    /// history for a reader that is a little behind, not every state since
    /// the app started for one that never reads.
    public static let stateBufferCountMax = 64

    /// A state as the scheduler hears it: with a run's end, how that run
    /// ended, as it was then. Asked for once the scheduler gets to the
    /// state, the engine would answer for a run started since (an app's
    /// `sync()`), which may have ended too.
    struct StateChange: Sendable, Equatable {
        var state: SyncState
        /// `nextRunDeadline` as the state was published: when the next run
        /// may start (a monotonic reading), nil when it need not wait.
        var nextRunAt: UInt64?
        /// With a completed run's end: when the earliest intent it left
        /// waiting for its own retry time becomes due (a monotonic
        /// reading), nil when none waits.
        var intentRetryAt: UInt64?
        /// Whether the run that ended with this state was cancelled.
        var cancelled: Bool
        /// Whether a background task ran the run that ended with this
        /// state (`backgroundSync` started or joined it).
        var background: Bool
    }

    /// `states()` with what the scheduler must know of each run's end,
    /// buffered alike.
    nonisolated func stateChanges() -> AsyncStream<StateChange> {
        changeFeed.subscribe(bufferingNewest: SyncEngine.stateBufferCountMax)
    }

    /// Runs a sync, or joins the one running.
    ///
    /// This is the app's own "sync now": it runs at once, whatever a failed
    /// run's backoff (though it pushes only the intents whose own retry time
    /// has come, `SyncHealth.nextAttemptAt`), and it is no background run, since the engine cannot
    /// tell that the OS runs the app in a background window. A background
    /// task (a `BGAppRefreshTask`, the window a silent push wakes the app
    /// for) syncs with `SyncScheduler.runBackground(budgetMilliseconds:)`
    /// instead, which needs no `start()`: that run keeps to the backoff
    /// (`Format/sync-protocol.md` section 10), ends with its budget, and
    /// the scheduler starts no run for the triggers held during it. A
    /// `sync()` there that completes has the scheduler start one as it
    /// ends, with no budget, for the OS to suspend in its midst.
    /// - Parameter cancellation: checked between push requests and between
    ///   pulled pages, and it abandons the request the run waits for (a
    ///   slow server's answer would hold the run for up to the transport's
    ///   timeouts): the operations of an abandoned push stay pending, with
    ///   no attempt counted. An answer that came first is recorded, a
    ///   failure too (the run ends as that failure does). A caller that
    ///   joins a running sync adds its cancellation to that run's: either
    ///   stops it, and every caller gets the `.cancelled` report.
    ///   Cancelling the caller's task cancels it too. A run cancelled
    ///   before it starts (a deadline already past) makes no request, not
    ///   even the health check.
    @discardableResult
    public func sync(cancellation: SyncCancellation = SyncCancellation()) async -> SyncReport {
        await sync(cancellation, background: false)
    }

    /// `sync(cancellation:)`; `background` for a background task's
    /// (`backgroundSync`), which the run's end tells the scheduler.
    private func sync(_ cancellation: SyncCancellation, background: Bool) async -> SyncReport {
        // A deadline cancels at its time, as `cancel()` would (which
        // cancels the run, and so its request in flight); the timer goes
        // when this caller's wait ends.
        let deadline = cancellation.deadline.map { deadline in
            Task {
                try await deadline.clock.sleep(untilMilliseconds: deadline.milliseconds)
                cancellation.cancel()
            }
        }
        defer { deadline?.cancel() }
        return await withTaskCancellationHandler {
            cancellations.append(cancellation)
            if background { runIsBackground = true }
            if let running { return await join(running, cancellation) }
            // `finish` clears `running`, as it publishes the run's end: a
            // caller that asks after seeing that end gets a run of its own.
            let task = Task { await self.run() }
            running = task
            return await join(task, cancellation)
        } onCancel: {
            cancellation.cancel()
        }
    }

    /// Waits for the run `task`, which `cancellation` cancels: the
    /// transport's request in flight ends with it.
    private func join(_ task: Task<SyncReport, Never>, _ cancellation: SyncCancellation) async -> SyncReport {
        let key = cancellation.onCancel { task.cancel() }
        defer { cancellation.forget(key) }
        // A deadline already past cancels before the run's next request,
        // not whenever its timer runs.
        if cancellation.isCancelled { task.cancel() }
        return await task.value
    }

    /// A sync for a background task (`SyncScheduler.runBackground`), which
    /// ends at `deadline` on the monotonic reading. Unlike a user's "sync
    /// now", it keeps to the backoff after failed runs, as the scheduler
    /// does: that run's server failed, and may have asked for the wait
    /// (`Retry-After`). It waits the backoff out when that ends within the
    /// budget (or a completed run ends it first), and otherwise makes no
    /// request and reports `.deferred`. A running sync is joined, and an
    /// open circuit breaker ends it as `.rateLimited`, as `sync()` does.
    func backgroundSync(cancellation: SyncCancellation, deadline: UInt64) async -> SyncReport {
        // Again after each wait: a run may have failed meanwhile.
        while running == nil, !breaker.isOpen(at: monotonicNow), runBackoffUntil > monotonicNow {
            guard runBackoffUntil < deadline else { return SyncReport(outcome: .deferred(nextRunAt: wallClock(runBackoffUntil))) }
            guard await waitForBackoff() else { return SyncReport(outcome: .cancelled) }
        }
        return await sync(cancellation, background: true)
    }

    /// Background runs' waits for the backoff's end, which a completed run
    /// ends at once (`finish`).
    private var backoffWaits: Set<Task<Void, any Error>> = []

    /// Waits until the backoff's end, or until a completed run ends the
    /// backoff: slept on, the background task's budget would go by with
    /// nothing done.
    /// - Returns: false when the caller's task was cancelled.
    private func waitForBackoff() async -> Bool {
        let (clock, until) = (self.clock, runBackoffUntil)
        let wait = Task { try await clock.sleep(untilMilliseconds: until) }
        backoffWaits.insert(wait)
        await withTaskCancellationHandler {
            _ = await wait.result
        } onCancel: {
            wait.cancel()
        }
        backoffWaits.remove(wait)
        return !Task.isCancelled
    }

    /// The cancellations of the callers of the running sync.
    private var cancellations: [SyncCancellation] = []
    /// Whether a background task is among those callers: the scheduler
    /// starts no run for the triggers held during the run as it ends.
    private var runIsBackground = false
    private var isCancelled: Bool { cancellations.contains { $0.isCancelled } }
    /// How many callers wait for the running sync (0 when none runs).
    var callersOfRunningSync: Int { running == nil ? 0 : cancellations.count }

    /// The outbox and the engine's view of the server, now.
    public func health() throws -> SyncHealth {
        var summary = try store.outboxSummary(holdingTypes: heldTypes)
        // On the monotonic reading, as `pushBatch` compares it: a retry time
        // further off than any wait the policy sets is due now.
        let now = monotonicNow
        summary.nextAttemptAt = summary.nextAttemptAt.map { time in
            wallClock(OutboxState.dueAt(time, now: now, retryWaitMax: configuration.retry.delayLongestMilliseconds))
        }
        return SyncHealth(
            summary: summary, now: clock.nowMilliseconds,
            online: onlineSince.map { (duration: now - min(now, $0.monotonic), since: $0.wall) },
            stuckAfter: configuration.stuckAfterMilliseconds, lastSuccessAt: lastSuccessAt, lastError: lastError,
            offlineReason: offlineReason, breakerOpenUntil: breakerOpenUntil, nextRunAt: nextRunAt, state: state, serverProtocolVersion: serverProtocolVersion)
    }

    /// The device's network path, as the monitor last reported it
    /// (`networkPathChanged`); one that costs nothing until it reports.
    public private(set) var networkPath = NetworkPath.satisfied

    /// The device's network path changed. A `SyncScheduler` calls this with
    /// each of its monitor's reports; an app that runs the engine without
    /// one calls it with its own monitor's.
    ///
    /// Without a path, or on one `SyncConfiguration.network` syncs not
    /// over, the server counts as unreachable from now on, without a health
    /// check to find out: the wait from here is not counted toward
    /// `isStuck`, and `SyncHealth.offlineReason` says why. On an expensive
    /// or constrained path, the intents of the types the policy pushes only
    /// on free paths are not pushed (`SyncHealth.heldCount`).
    public func networkPathChanged(_ path: NetworkPath) {
        networkPath = path
        guard let reason = pathRefusal else {
            // What the last path kept from the server no longer does; the
            // next health check says whether it is reachable.
            if offlineReason == pathRefusalWas { offlineReason = nil }
            pathRefusalWas = nil
            return
        }
        onlineSince = nil
        offlineReason = reason
        pathRefusalWas = reason
    }

    /// The reason the last path gave for being offline, while it is
    /// `offlineReason`.
    private var pathRefusalWas: String?

    /// Why no run may sync over the current path; nil when one may.
    private var pathRefusal: String? {
        let path = networkPath
        if !path.isSatisfied { return "the device has no network path" }
        if configuration.network.allowsSync(over: path) { return nil }
        let cost = path.isExpensive && !configuration.network.syncsOnExpensivePaths ? "expensive" : "constrained"
        return "the network path is \(cost), and the configuration does not sync over such a path"
    }

    /// A path that the configuration syncs not over (one there is).
    var pathDisallowed: Bool { networkPath.isSatisfied && !configuration.network.allowsSync(over: networkPath) }

    /// The types whose intents wait for a path that costs nothing.
    private var heldTypes: Set<String> { configuration.network.heldTypes(on: networkPath) }

    /// Closes the circuit breaker, for an app whose user asked to retry now.
    /// A `.rateLimited` state that the last run left becomes `.idle`: a
    /// banner that shows it stops saying sync is paused, and the scheduler,
    /// which hears the change, no longer waits for the breaker's end.
    public func resetCircuitBreaker() {
        breaker = CircuitBreaker(retryAfterMaxMilliseconds: configuration.retry.retryAfterMaxMilliseconds)
        if running == nil, case .rateLimited = state { set(.idle) }
    }

    /// When the circuit breaker lets requests through again (Unix ms, as
    /// the wall clock reads now), if open.
    public var breakerOpenUntil: UInt64? { breaker.isOpen(at: monotonicNow) ? wallClock(breaker.openUntil) : nil }

    /// When the scheduler starts the next run (Unix ms, as the wall clock
    /// reads now) after failed ones: the end of their backoff or of the
    /// open circuit breaker, whichever is later; nil when neither waits.
    /// `sync()` itself does not wait for it.
    public var nextRunAt: UInt64? { nextRunDeadline.map(wallClock) }

    /// `nextRunAt` on the clock's monotonic reading, which the scheduler's
    /// timers keep to.
    var nextRunDeadline: UInt64? {
        let until = max(runBackoffUntil, breaker.openUntil)
        return until > monotonicNow ? until : nil
    }

    /// Now on the clock's monotonic reading, which every deadline of the
    /// engine is on.
    private var monotonicNow: UInt64 { clock.monotonicMilliseconds }

    /// A deadline on the monotonic reading, as the wall clock will read
    /// then if it is not set meanwhile.
    private func wallClock(_ deadline: UInt64) -> UInt64 {
        let (wall, monotonic) = (clock.nowMilliseconds, clock.monotonicMilliseconds)
        guard deadline < .max else { return .max }
        return wall >= monotonic ? deadline.addingSaturating(wall - monotonic) : deadline - min(deadline, monotonic - wall)
    }

    /// Publishes a change of state; with `always`, the same state again
    /// too: a failed run's end, which the scheduler must hear to keep to its
    /// backoff even when the run before failed alike. `cancelled` and
    /// `background` tell how the run it ends ran. The scheduler's feed
    /// carries `nextRunDeadline` as it is now: a run's end sets it first.
    private func set(
        _ newState: SyncState, always: Bool = false, intentRetryAt: UInt64? = nil, cancelled: Bool = false,
        background: Bool = false
    ) {
        guard always || newState != state else { return }
        state = newState
        stateFeed.publish(newState)
        changeFeed.publish(
            StateChange(
                state: newState, nextRunAt: nextRunDeadline, intentRetryAt: intentRetryAt, cancelled: cancelled,
                background: background))
    }

    private func run() async -> SyncReport {
        var report = SyncReport(outcome: .completed)
        retryAfterSeconds = nil
        retryScheduledAt = nil
        if let stop = rateLimitedStop() { return finish(&report, stop) }
        // Cancelled before it starts (a background run's budget already
        // spent, a caller's task cancelled), the run asks nothing of the
        // network, the health check included: whoever cancelled it wants
        // no request, and the OS's background window may be over.
        if isCancelled { return finish(&report, .cancelled) }
        // The monitor said there is no path: the health check below finds
        // out for itself, as a path is no proof of reaching the server. One
        // the configuration does not sync over gets no request at all.
        if pathDisallowed {
            onlineSince = nil
            offlineReason = pathRefusal
            return finish(&report, .pathNotAllowed)
        }
        do throws(TransportError) {
            _ = try await transport.health()
            if onlineSince == nil { onlineSince = (monotonicNow, clock.nowMilliseconds) }
            offlineReason = nil
            serverProtocolVersion = nil
        } catch {
            // The server answered: in another protocol version, which no
            // portal does (section 10 makes it permanent), or in this one
            // with an error status (a 503 while its store is unavailable,
            // with `Retry-After`). Quiet as offline, the app would show
            // "offline" for ever, with nothing to tell its user that an
            // update is needed, and the next trigger would ask again before
            // the server's `Retry-After` was over: a failed run keeps to it,
            // as after a push's or a pull's 503.
            switch error.kind {
            case .protocolVersion, .status:
                if onlineSince == nil { onlineSince = (monotonicNow, clock.nowMilliseconds) }
                offlineReason = nil
                return finish(&report, noteFailure(error) ?? .failed("health: \(error.message)"))
            case .noAnswer, .network, .responseTooLarge:
                break
            }
            if isCancelled { return finish(&report, .cancelled) }
            onlineSince = nil
            // Kept for the app: a run counted as offline says no more, and
            // a server URL no request can reach is offline for good.
            offlineReason = error.message
            return finish(&report, .offline)
        }
        do {
            if let stop = try await push(&report) { return finish(&report, stop) }
            let outcome = try await pull(&report)
            if outcome == .completed { try await compactIfDue(&report) }
            return finish(&report, outcome)
        } catch is CancellationError {
            // Between two steps of a long compaction: the steps before stand.
            return finish(&report, .cancelled)
        } catch {
            return finish(&report, .failed("store: \(error)"))
        }
    }

    /// Compacts the log below its last offset once
    /// `SyncConfiguration.compactAfterOffsets` offsets were written since
    /// its last compaction.
    private func compactIfDue(_ report: inout SyncReport) async throws {
        guard let every = configuration.compactAfterOffsets else { return }
        let last = try store.log.lastOffset()
        guard last - min(last, try store.compactedBelow()) >= every else { return }
        report.compaction = try await store.compact(below: last)
    }

    private func finish(_ report: inout SyncReport, _ outcome: SyncOutcome) -> SyncReport {
        report.outcome = outcome
        // Before the state it publishes: the run is over for whoever
        // sees that state (`sync()` after it starts a new run).
        running = nil
        cancellations = []
        let background = runIsBackground
        runIsBackground = false
        switch outcome {
        case .completed:
            lastSuccessAt = clock.nowMilliseconds
            lastError = nil
            failedRuns = 0
            runBackoffUntil = 0
            for wait in backoffWaits { wait.cancel() }
            // An intent retried for its own answer (or left from an earlier
            // run) waits for its retry time, which no failed run's backoff
            // carries: the scheduler sets its retry timer for it. Unread
            // (the store failed), the periodic timer pushes it.
            let intentRetryAt = try? store.nextRetry(
                after: monotonicNow, retryWaitMax: configuration.retry.delayLongestMilliseconds)
            set(.idle, intentRetryAt: intentRetryAt, background: background)
        case .offline, .pathNotAllowed, .deferred:
            set(.idle, background: background)
        case .cancelled:
            set(.idle, cancelled: true, background: background)
        case .rateLimited:
            let now = monotonicNow
            let wait = breaker.openUntil > now ? Double(breaker.openUntil - now) / 1000 : 0
            set(.rateLimited(retryAfter: wait, pending: (try? store.outboxSummary().pendingCount) ?? 0), background: background)
        case .failed(let message):
            lastError = message
            // Before the state changes: the scheduler hears `nextRunAt` with
            // the run's end.
            failedRuns = min(failedRuns, .max - 1) + 1
            let delay = configuration.retry.delay(beforeRetry: failedRuns, retryAfterSeconds: retryAfterSeconds, random: &random)
            // Drawn apart, with its own jitter, the run's wait often ended
            // before its intents' did: the retry run pushed nothing and
            // completed, which ended the backoff, and the intents waited
            // for the periodic timer rather than their own retry time.
            runBackoffUntil = max(monotonicNow.addingSaturating(delay), retryScheduledAt ?? 0)
            set(.error(message), always: true, background: background)
        }
        return report
    }

    /// Whether `error` ends a request the run's cancellation abandoned:
    /// one without a whole answer. A failure the server answered as the
    /// run was cancelled (a 429's or 503's `Retry-After`, a refusal) is
    /// recorded as any answer is, as a success is.
    private func abandoned(_ error: TransportError) -> Bool {
        isCancelled && (error.kind == .noAnswer || error.kind == .network)
    }

    private func rateLimitedStop() -> SyncOutcome? { breaker.isOpen(at: monotonicNow) ? .rateLimited : nil }

    /// Records a transport failure with the circuit breaker, and its
    /// `Retry-After` for the run's backoff. A request with no answer at all
    /// is not an answer: it leaves the breaker's count as it is.
    /// - Returns: `.rateLimited` when it opened the breaker.
    private func noteFailure(_ error: TransportError) -> SyncOutcome? {
        retryAfterSeconds = error.retryAfterSeconds
        if case .protocolVersion(let version) = error.kind { serverProtocolVersion = version }
        if error.isRateLimited {
            return breaker.recordRateLimited(retryAfterSeconds: error.retryAfterSeconds, at: monotonicNow) ? .rateLimited : nil
        }
        if error.kind != .noAnswer { breaker.recordAnswer(success: false) }
        return nil
    }

    // MARK: - Push

    /// Pushes due intents batch by batch until none is due.
    /// - Returns: an outcome that ends the run, or nil to go on to pull.
    private func push(_ report: inout SyncReport) async throws -> SyncOutcome? {
        // The intents due now, not every pending one: an intent waiting for
        // its retry time is not pushed, nor are the later ones on its entity.
        let total = try store.dueCount(
            now: monotonicNow, retryWaitMax: configuration.retry.delayLongestMilliseconds, holdingTypes: heldTypes)
        var synced = 0
        set(.pushing(synced: 0, total: total))
        // Each batch settles its intents or defers them, so the due set
        // shrinks; conflict resolutions may add a few intents. A batch too
        // large for the server halves the batch size for the rest of the run
        // (at most log2 of it times, so those are not counted).
        var limit = configuration.pushBatchCountMax
        var batches = 0
        while batches < 2 * (total / limit + 1) + 8 {
            // Between requests, as between pulled pages: the answers so far
            // are recorded, and the pull's first check ends the run as
            // cancelled. An outbox after days offline takes many requests,
            // more than a background task's budget may allow.
            if isCancelled { return nil }
            // The path may have changed since the last request (Wi-Fi left
            // for cellular): what it allows now goes.
            if pathDisallowed { return .pathNotAllowed }
            let batch = try store.pushBatch(
                limit: limit, now: monotonicNow, retryWaitMax: configuration.retry.delayLongestMilliseconds,
                holdingTypes: heldTypes)
            guard !batch.isEmpty else { return nil }
            switch try await pushBatch(batch, &report) {
            case .split:
                // Fetched again rather than sent in halves: the second half's
                // base versions and holds depend on the first half's answers.
                limit = batch.count / 2
                continue
            case .stop(let outcome):
                return outcome
            case .pushed:
                break
            }
            batches += 1
            synced += batch.count
            set(.pushing(synced: synced, total: max(total, synced)))
        }
        return nil
    }

    /// How one push request ended.
    private enum BatchResult {
        /// Every answer is recorded, or the intents wait for a retry.
        case pushed
        /// Too large for the server: push its intents in smaller requests.
        case split
        /// The run ends.
        case stop(SyncOutcome)
    }

    private func pushBatch(_ batch: [PendingIntent], _ report: inout SyncReport) async throws -> BatchResult {
        let response: PushResponse
        do {
            response = try await transport.push(PushRequest(operations: batch.map(PushDecisions.operation)))
            guard response.results.count == batch.count else {
                throw TransportError(.network, "\(response.results.count) results for \(batch.count) operations")
            }
            // Results answer the operations in order, each naming its
            // operation's key (section 7): one that does not would record an
            // answer against another intent.
            if let index = batch.indices.first(where: { batch[$0].intent.idempotencyKey != response.results[$0].idempotencyKey }) {
                throw TransportError(
                    .network,
                    "result \(index) answers idempotency key \(response.results[index].idempotencyKey.prefix(64)), "
                        + "not \(batch[index].intent.idempotencyKey)")
            }
        } catch let error as TransportError {
            // Abandoned: the server may have applied it, and answers the
            // operations duplicate when they are pushed again.
            if abandoned(error) { return .stop(.cancelled) }
            return try await pushFailed(batch, error, &report)
        }
        breaker.recordAnswer(success: true)
        var outcomes: [(offset: UInt64, outcome: PushOutcome)] = []
        var retries: [(PendingIntent, String)] = []
        // Entities (type, a zero byte, id: by bytes, as the store keys
        // them) with an intent of this batch to try again. Their later
        // intents' answers are not recorded: the store folds answers in
        // the order they come, so an ack recorded ahead of the earlier
        // intent would show the app a state the server never had. They stay
        // pending behind it, and pushed again are answered `duplicate`.
        var retrying: Set<[UInt8]> = []
        func entity(_ item: PendingIntent) -> [UInt8] {
            Array(item.intent.entityType.utf8) + [0] + Array(item.intent.entityID.utf8)
        }
        for (item, result) in zip(batch, response.results) {
            // Keys are built only once an answer is retried, which is rare.
            if !retrying.isEmpty, retrying.contains(entity(item)) { continue }
            switch PushDecisions.decide(result, baseVersion: item.intent.baseVersion) {
            case .record(let outcome): outcomes.append((item.offset, outcome))
            case .retry(let message):
                retries.append((item, message))
                retrying.insert(entity(item))
            }
        }
        let strategies = configuration
        let recorded = try await store.record(outcomes) { strategies.strategy(for: $0.intent.entityType).decide($0) }
        // Counted once recorded: a batch that fails to record answered nothing.
        let settled = Set(recorded.settled)
        for (offset, outcome) in outcomes where settled.contains(offset) {
            switch outcome {
            case .acknowledged: report.acknowledged += 1
            case .rejected: report.rejected += 1
            case .conflict:
                report.rejected += 1
                report.conflicts += 1
            }
        }
        report.refusedDecisions += recorded.refused
        for (item, message) in retries { try await scheduleRetry([item], message, retryAfterSeconds: nil, &report) }
        return .pushed
    }

    private func pushFailed(_ batch: [PendingIntent], _ error: TransportError, _ report: inout SyncReport) async throws -> BatchResult {
        let rateLimited = noteFailure(error)
        switch PushDecisions.decide(error, batchCount: batch.count) {
        case .split:
            // The run goes on: a `Retry-After` on the 413 is not the wait of
            // a failure that ends the run later.
            retryAfterSeconds = nil
            return .split
        case .retryAll:
            let earliest = try await scheduleRetry(batch, "push: \(error.message)", retryAfterSeconds: error.retryAfterSeconds, &report)
            // The run that failed here waits at least for them (`finish`).
            // Not for an intent retried for its own answer: a run that then
            // fails (a pull's network error) would wait for its long retry.
            // Set once: this failure ends the run.
            retryScheduledAt = earliest
            return .stop(rateLimited ?? .failed("push: \(error.message)"))
        case .failAll:
            try await store.markFailed(offsets: batch.map(\.offset), error: "push: \(error.message)")
            report.retried += batch.count
            return .stop(.failed("push: \(error.message)"))
        case .stop:
            return .stop(.failed("push: \(error.message)"))
        }
    }

    /// Schedules the next attempt of each intent by its own attempt count.
    /// The intents of one failure with the same count share one delay, one
    /// jitter: jitter spreads clients, not the operations of one request,
    /// and drawn for each, the retry run (at the earliest of them, `finish`)
    /// found only the first due.
    /// - Returns: the earliest retry time set (a monotonic reading).
    @discardableResult
    private func scheduleRetry(_ items: [PendingIntent], _ message: String, retryAfterSeconds: Int?, _ report: inout SyncReport)
        async throws -> UInt64
    {
        let now = monotonicNow
        let policy = configuration.retry
        var byTime: [UInt64: [UInt64]] = [:]
        var delays: [UInt32: UInt64] = [:]
        for item in items {
            // Saturating, as the store counts it: a count at its maximum
            // (damaged or forged; the store marks an intent failed long
            // before) must not trap.
            let retry = min(item.state.attempts, .max - 1) + 1
            let delay = delays[retry] ?? policy.delay(beforeRetry: retry, retryAfterSeconds: retryAfterSeconds, random: &random)
            delays[retry] = delay
            byTime[now.addingSaturating(delay), default: []].append(item.offset)
        }
        let times = byTime.sorted(by: { $0.key < $1.key })
        for (time, offsets) in times {
            try await store.scheduleRetry(offsets: offsets, error: message, at: time, attemptsMax: policy.attemptsMax)
        }
        report.retried += items.count
        return times.first?.key ?? now
    }

    // MARK: - Pull

    /// Pulls pages until the feed's end, a failure, or cancellation.
    private func pull(_ report: inout SyncReport) async throws -> SyncOutcome {
        set(.pulling)
        // A page too long for the transport to read halves the changes
        // asked for, for the rest of the run (at most log2 of it times): a
        // server may send pages of any size, but one change always fits.
        var limit = configuration.pullPageCountMax
        var feed = PullFeed()
        // Every change acknowledged by now is in the feed (section 8), or
        // a later change of its entity is: the pull must show it.
        let acknowledgedThrough = try store.log.lastOffset()
        for _ in 0..<SyncEngine.pullPagesPerRunMax {
            if isCancelled { return .cancelled }
            if pathDisallowed { return .pathNotAllowed }
            let sent: String?
            do {
                sent = try store.pullCursor()
            } catch let error as LogStoreError where error.code == .corruptEntry {
                // Damaged bytes, named in the resync's reason (the log keeps
                // it). Sent, the server would refuse them with a 410, which
                // says nothing of the damage; left, every run would fail.
                guard try await resync("the stored pull cursor is damaged: \(error.detail)", &feed, &report) else {
                    return .failed("pull: \(error)")
                }
                continue
            }
            let page: PullResponse
            do throws(TransportError) {
                if let scopes = configuration.pulledScopes?.scopes, let scoped = transport as? any ScopedPulling {
                    page = try await scoped.pull(cursor: sent, limit: limit, types: configuration.pulledTypes, scopes: scopes)
                } else {
                    page = try await transport.pull(cursor: sent, limit: limit, types: configuration.pulledTypes)
                }
            } catch {
                if abandoned(error) { return .cancelled }
                if error.kind == .responseTooLarge, limit > 1 {
                    breaker.recordAnswer(success: false)
                    limit /= 2
                    continue
                }
                if case .status(410, _) = error.kind {
                    breaker.recordAnswer(success: false)
                    guard try await resync("the server refused the pull cursor: \(error.message)", &feed, &report) else {
                        return .failed("pull: the server keeps refusing the cursor")
                    }
                    continue
                }
                return noteFailure(error) ?? .failed("pull: \(error.message)")
            }
            if let problem = Self.problem(with: page, pulledFrom: sent, &feed.progress) {
                breaker.recordAnswer(success: false)
                return .failed("pull: \(problem)")
            }
            breaker.recordAnswer(success: true)
            if page.forceResync {
                guard try await resync("the server forced a full resync", &feed, &report) else {
                    return .failed("pull: the server keeps forcing a resync")
                }
                continue
            }
            let changes = page.changes.map {
                PulledChange(
                    $0.operation == .upsert ? .upsert : .delete, entityType: $0.entityType, entityID: $0.entityID,
                    serverVersion: $0.serverVersion, fields: $0.data ?? [:], idempotencyKey: $0.idempotencyKey)
            }
            guard try await store.applyPulledPage(changes, cursor: page.cursor, pulledFrom: sent) else {
                // The cursor moved while the page came (the app's own
                // `Store.resync` forgot it): the page follows a cursor the
                // store no longer has. The pull goes on from the one it
                // has, a new chain of cursors.
                feed.progress.restart()
                continue
            }
            report.pages += 1
            report.changes += changes.count
            guard !page.hasMore else { continue }
            let lost = try await changesNotInFeed(through: acknowledgedThrough)
            guard let first = lost.first else { return .completed }
            // The server lost them: its store was put back from a backup.
            if feed.fromStart {
                // A resync (a 410, a forced one) already took the server's state.
                report.lostChanges += lost
                try await store.forgetAcknowledgedChanges(lost)
                return .completed
            }
            // This client's cursor is older than the backup, which no 410
            // shows. A resync takes the server's state, as the operator's
            // would (section 12).
            let resynced = try await resync(
                "the feed ended without \(lost.count) change(s) the server acknowledged (\(first.entityType)/"
                    + "\(first.entityID) at version \(first.serverVersion) first): the server lost them", &feed, &report)
            guard resynced else { return .failed("pull: the feed keeps ending without changes the server acknowledged") }
            report.lostChanges += lost
            // After the resync: a crash between the two leaves them to the
            // pull from the start, which finds them again.
            try await store.forgetAcknowledgedChanges(lost)
        }
        return .failed("pull: more than \(SyncEngine.pullPagesPerRunMax) pages in one run")
    }

    /// The changes the server acknowledged that its feed has not shown, of
    /// the types and scopes this engine pulls: the feed leaves out the
    /// others, so one of theirs never shows and is no loss; it is awaited
    /// no longer.
    private func changesNotInFeed(through offset: UInt64) async throws -> [AwaitedChange] {
        let awaited = try store.acknowledgedChangesNotInFeed(through: offset)
        guard configuration.pulledTypes != nil || configuration.pulledScopes != nil else { return awaited }
        var shown: [AwaitedChange] = []
        var left: [AwaitedChange] = []
        for change in awaited {
            if try feedShows(change) { shown.append(change) } else { left.append(change) }
        }
        if !left.isEmpty { try await store.forgetAcknowledgedChanges(left) }
        return shown
    }

    /// Whether the feed this engine pulls shows the entity of `change`: of
    /// a type it pulls and, with `pulledScopes`, one the store holds in
    /// those scopes or in none. A deleted entity's scope is not known
    /// here: its deletion is not awaited.
    private func feedShows(_ change: AwaitedChange) throws -> Bool {
        if let types = configuration.pulledTypes, !types.contains(change.entityType) { return false }
        guard let scopes = configuration.pulledScopes else { return true }
        guard let entity = try store.get(type: change.entityType, id: change.entityID) else { return false }
        return scopes.contain(entity.fields)
    }

    /// Where a run's pull is in the feed, across the resyncs it makes.
    private struct PullFeed {
        var resyncs = 0
        var progress = FeedProgress()
        /// Whether the pages since began at the feed's start with the
        /// confirmed state forgotten: a resync of this pull (no ack comes
        /// between). A change the feed ended without then is lost, and the
        /// confirmed state is the server's already, with no other resync.
        /// A pull without a cursor is not enough: an ack since the resync,
        /// or since the store began, gave its entity a base the server may
        /// not have, which only a resync takes out.
        var fromStart = false
    }

    /// A full resync, the pull then from the feed's start: false, doing
    /// nothing, once the run has had `resyncsPerRunMax`.
    private func resync(_ reason: String, _ feed: inout PullFeed, _ report: inout SyncReport) async throws -> Bool {
        guard feed.resyncs < configuration.resyncsPerRunMax else { return false }
        feed.resyncs += 1
        report.resyncs += 1
        try await store.resync(reason: reason)
        feed.fromStart = true
        feed.progress.restart()
        return true
    }

    /// Why `page`, pulled from `sent`, breaks the protocol in a way that
    /// ends the run before any of it is applied; nil when it does not. The
    /// cursor stays where it was, and what earlier pages applied stays.
    private static func problem(with page: PullResponse, pulledFrom sent: String?, _ progress: inout FeedProgress) -> String? {
        // An upsert carries the entity's full fields (section 8): one
        // without them is a body the protocol does not define, retryable as
        // a network error, and never applied as an entity emptied.
        if let index = page.changes.firstIndex(where: { $0.operation == .upsert && $0.data == nil }) {
            let change = page.changes[index]
            return "changes[\(index)] (\(change.entityType) \(change.entityID)) is an upsert without data"
        }
        guard page.hasMore, !page.forceResync else { return nil }
        // A server returns a change when more exist (section 8); without
        // one, or with a cursor it returned before, the next page would be
        // this one again, until the run's page bound.
        guard !page.changes.isEmpty else { return "an empty page with has_more" }
        guard !progress.isRepeated(page.cursor, pulledFrom: sent) else {
            return "the server answered cursor \(page.cursor.prefix(64)) again, with has_more: its feed makes no progress"
        }
        return nil
    }

    /// Pages one run pulls at most: a bound, far above any real feed.
    static let pullPagesPerRunMax = 10_000_000
}
