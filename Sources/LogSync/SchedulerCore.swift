/// When to sync: the scheduler's rules as a pure state machine. Events go
/// in with the time they happened; actions (start a sync, set or cancel a
/// timer) come out. `SyncScheduler` carries them out with a clock (its
/// monotonic reading, which a step of the wall clock does not move); tests
/// drive this directly with times of their choosing.
///
/// - Periodic sync every `periodMilliseconds` while online.
/// - A local write arms a debounce timer (re-armed by each write), so a
///   burst of writes gives one sync.
/// - Connectivity regained arms a 2.5 s timer; it fires only if the
///   connection is still up (a loss cancels it), and only a gain (or a
///   freed path, below) arms it.
/// - The path stopped being expensive or constrained while online, and the
///   policy pushes some types only on free paths
///   (`NetworkPolicy.typesPushedOnlyOnFreePaths`): it arms the same 2.5 s
///   timer, for the intents of those types that may wait. (A path the
///   policy syncs not over is offline to these rules.)
/// - A server nudge syncs at once while online.
/// - Stopped, the scheduler forgets the connectivity: after a restart, the
///   rules wait for its first report, as they did at the first start.
/// - After a failed run (`.syncEnded` with a time: `SyncEngine.nextRunAt`,
///   on the monotonic reading)
///   none of the above starts a run before that time; a retry timer starts
///   one then (`Format/sync-protocol.md` section 10, "Retry timing"), so a
///   failing server sees one request per backoff, whatever triggers come.
/// - After a completed run that left intents waiting for their own retry
///   time (`.syncEnded` with `intentRetryAt`: an answer retried one intent
///   alone), the retry timer starts a run when the earliest is due; other
///   triggers still sync before it.
/// - While a run runs (from `.syncRunning` to `.syncEnded`), a trigger
///   starts none: joined, the run may be past its push, or its pull's
///   last page, and miss what the trigger was for (a write made after the
///   push read the outbox). The triggers that come meanwhile make one run
///   as it ends (or, when it failed, the retry at its backoff's end), unless
///   it was cancelled, or was a background run (however it ended): whoever
///   stopped it (a background run's budget, the OS's window, or the app)
///   wants no run now, and a background task's window ends with it, so a
///   run started as it ends would have no budget. For that window, a
///   background run's end also cancels the write debounce timer and the
///   network-regained timer, and starts the periodic timer's period again.
///   The next trigger syncs what they were for.
public struct SchedulerCore: Sendable, Equatable {
    public enum Timer: Hashable, Sendable { case periodic, localWrite, networkRegained, retry }

    public enum Reason: Hashable, Sendable { case started, periodic, localWrite, networkRegained, nudge, retry }

    public enum Event: Equatable, Sendable {
        case started(online: Bool)
        case localWrite
        case connectivity(Bool)
        /// Still online, the path stopped being expensive or constrained,
        /// and the policy pushes some types only on free paths.
        case pathFreed
        case nudge
        case timerFired(Timer)
        /// A run is under way (whoever started it): it pushes or pulls.
        case syncRunning
        /// A run ended (whoever started it); `nextRunAt` is when the next
        /// may start, nil when it need not wait; `intentRetryAt` when the
        /// earliest intent it left waiting for its own retry time is due,
        /// nil when none waits; `cancelled` when it was stopped
        /// (`SyncOutcome.cancelled`); `background` when a background task
        /// ran it (`SyncScheduler.runBackground` started or joined it),
        /// however it ended.
        case syncEnded(nextRunAt: UInt64?, intentRetryAt: UInt64? = nil, cancelled: Bool = false, background: Bool = false)
        /// The scheduler stopped listening; the next `.started` is its first report again.
        case stopped
    }

    public enum Action: Equatable, Sendable {
        case sync(Reason)
        case setTimer(Timer, at: UInt64)
        case cancelTimer(Timer)
    }

    /// The timers' lengths. Any length is allowed: a deadline past UInt64
    /// (a length of `.max`, to turn periodic syncs off) saturates, and its
    /// timer never fires.
    public var periodMilliseconds: UInt64 = 30_000
    public var localWriteDebounceMilliseconds: UInt64 = 1_000
    public var networkDebounceMilliseconds: UInt64 = 2_500
    public private(set) var online = false
    /// No run starts before this time (the last run failed), if set.
    public private(set) var backoffUntil: UInt64?
    /// Whether a run is under way: from `.syncRunning` to `.syncEnded`.
    public private(set) var syncRunning = false
    /// The first reason for a sync that came while a run was under way:
    /// the run that starts as it ends is for this.
    public private(set) var heldReason: Reason?

    public init() {}

    public mutating func handle(_ event: Event, at now: UInt64) -> [Action] {
        switch event {
        case .started(let isOnline):
            online = isOnline
            return online ? sync(.started, at: now) + [Self.set(.periodic, periodMilliseconds, after: now)] : []
        case .localWrite:
            // Offline, the write waits for the connection to come back.
            return online ? [Self.set(.localWrite, localWriteDebounceMilliseconds, after: now)] : []
        case .connectivity(let isOnline):
            defer { online = isOnline }
            if isOnline && !online { return [Self.set(.networkRegained, networkDebounceMilliseconds, after: now)] }
            return !isOnline && online ? Self.everyTimerCancelled : []
        case .pathFreed:
            return online ? [Self.set(.networkRegained, networkDebounceMilliseconds, after: now)] : []
        case .nudge:
            return online ? sync(.nudge, at: now) : []
        case .timerFired(let timer):
            guard online else { return [] }
            switch timer {
            case .periodic: return sync(.periodic, at: now) + [Self.set(.periodic, periodMilliseconds, after: now)]
            case .localWrite: return sync(.localWrite, at: now)
            case .networkRegained: return sync(.networkRegained, at: now) + [Self.set(.periodic, periodMilliseconds, after: now)]
            case .retry: return sync(.retry, at: now)
            }
        case .syncRunning:
            syncRunning = true
            return []
        case .syncEnded(let nextRunAt, let intentRetryAt, let cancelled, let background):
            syncRunning = false
            backoffUntil = nextRunAt.flatMap { $0 > now ? $0 : nil }
            // Offline, a gain syncs; backing off, the retry timer does;
            // cancelled or background, the next trigger does: a run now
            // would go on past the budget or the stop that ended this one,
            // or past the background window this one had.
            let held = online && !cancelled && !background ? heldReason : nil
            heldReason = nil
            // The timers due soon after a background run ends would start
            // a run with no budget, in the moments between the background
            // task's end and the OS suspending the app: a write's debounce
            // (a write of the app's, or of a conflict's resolution, during
            // the run) and a regained connection's timer (the network came
            // back during it) are cancelled, and the periodic timer starts
            // its period again (the network's timer would have set it).
            let quiet: [Action] =
                background
                ? [.cancelTimer(.localWrite), .cancelTimer(.networkRegained)]
                    + (online ? [Self.set(.periodic, periodMilliseconds, after: now)] : [])
                : []
            guard let backoffUntil else {
                // The retry timer is for the intents the run left waiting,
                // if any; after a cancelled or a background run, as the
                // triggers held during it, they wait for the next trigger.
                let retry: Action =
                    if let intentRetryAt, intentRetryAt > now, online, !cancelled, !background {
                        .setTimer(.retry, at: intentRetryAt)
                    } else {
                        .cancelTimer(.retry)
                    }
                return [retry] + quiet + (held.map { sync($0, at: now) } ?? [])
            }
            return quiet + (online ? [.setTimer(.retry, at: backoffUntil)] : [])
        case .stopped:
            // The connectivity heard before the stop may be stale by the
            // restart: kept, a nudge before the first report would sync, and
            // a write or a run's end would arm a timer that an offline start
            // leaves armed.
            online = false
            // A run's end is not heard while stopped: after a restart, the
            // engine's states say again whether one runs.
            syncRunning = false
            heldReason = nil
            return Self.everyTimerCancelled
        }
    }

    /// Sets `timer` to fire `milliseconds` after `now`, or never when that
    /// is past UInt64.
    private static func set(_ timer: Timer, _ milliseconds: UInt64, after now: UInt64) -> Action {
        .setTimer(timer, at: now.addingSaturating(milliseconds))
    }

    private static let everyTimerCancelled: [Action] = [
        .cancelTimer(.networkRegained), .cancelTimer(.localWrite), .cancelTimer(.periodic), .cancelTimer(.retry),
    ]

    /// A sync now, or while a run is under way, one as it ends; while
    /// failed runs back off, the retry timer at the backoff's end (set
    /// again, as a connectivity loss cancels it) instead.
    private mutating func sync(_ reason: Reason, at now: UInt64) -> [Action] {
        // Held whether or not failed runs back off: the run's end says
        // whether the next one waits.
        if syncRunning { heldReason = heldReason ?? reason }
        if let backoffUntil, now < backoffUntil { return [.setTimer(.retry, at: backoffUntil)] }
        return syncRunning ? [] : [.sync(reason)]
    }
}
