import LogStore

/// What the engine is doing, as `Format/sync-protocol.md` section 10 and the
/// state machine of the design draw it:
///
///     idle -> pushing -> pulling -> idle
///     pushing -> rateLimited | error;  pulling -> rateLimited | error
///     rateLimited, error -> (next sync) -> pushing ...
///     error -> error (a run that failed before pushing, as the last did)
public enum SyncState: Sendable, Equatable, CustomStringConvertible {
    /// Not syncing; ready for the next run.
    case idle
    /// Pushing pending intents: `synced` of `total` answered so far.
    /// `total` counts the intents due as the push began (not one waiting
    /// for its retry time, nor those held behind it on its entity), and
    /// grows if the run pushes more (a conflict's resolution).
    case pushing(synced: Int, total: Int)
    /// Pulling server changes, a page at a time.
    case pulling
    /// The circuit breaker is open: no request for `retryAfter` seconds;
    /// `pending` intents wait.
    case rateLimited(retryAfter: Double, pending: Int)
    /// The last run failed; the next run starts over, once the scheduler's
    /// backoff has passed (`SyncEngine.nextRunAt`).
    case error(String)

    public var description: String {
        switch self {
        case .idle: "idle"
        case .pushing(let synced, let total): "pushing \(synced)/\(total)"
        case .pulling: "pulling"
        case .rateLimited(let retryAfter, let pending): "rate limited: retry in \(Int(retryAfter.rounded(.up))) s, \(pending) pending"
        case .error(let message): "error: \(message)"
        }
    }
}

/// How a sync run ended.
public enum SyncOutcome: Sendable, Equatable {
    /// Pushed and pulled to the end of the feed.
    case completed
    /// The health check failed (no real connectivity): nothing was tried,
    /// and nothing counts as a failure.
    case offline
    /// The device's network path is expensive or constrained, and
    /// `SyncConfiguration.network` syncs over no such path: no request was
    /// made, or, when the path changed during the run (the device left
    /// Wi-Fi), none after the change (what was recorded and applied
    /// stays). Nothing counts as a failure. The scheduler syncs once the
    /// path allows it.
    case pathNotAllowed
    /// Stopped by cancellation before a push request or a pulled page;
    /// what was recorded and applied stays, and it does not count as a
    /// failure. A run cancelled before it started (a background run's
    /// budget already spent) made no request at all, not even the health
    /// check.
    case cancelled
    /// The circuit breaker is open.
    case rateLimited
    /// A background run (`SyncScheduler.runBackground`) made no request:
    /// the backoff after failed runs lasts past its budget. `nextRunAt` is
    /// when it ends (`SyncEngine.nextRunAt`, Unix ms as the wall clock read
    /// then). Nothing counts as a failure.
    case deferred(nextRunAt: UInt64)
    /// A failure ended the run; the state says which.
    case failed(String)
}

/// What one run did.
public struct SyncReport: Sendable, Equatable {
    public var outcome: SyncOutcome
    /// Intents answered applied or duplicate.
    public var acknowledged = 0
    /// Intents rejected (conflicts included).
    public var rejected = 0
    /// Intents whose conflict was recorded.
    public var conflicts = 0
    /// Conflicts whose strategy decided something the store refuses (a
    /// `custom` rule's invalid fields, or a resolution intent over the
    /// entry limit): each waits for the app instead, as with `askApp`, and
    /// the run goes on.
    public var refusedDecisions: [RefusedDecision] = []
    /// Intents scheduled for another attempt or marked failed.
    public var retried = 0
    /// Pulled pages applied, and the changes in them.
    public var pages = 0
    public var changes = 0
    /// Full resyncs: started by the server (410, `force_resync`), or by a
    /// feed that ended without changes the server acknowledged.
    public var resyncs = 0
    /// Changes the server acknowledged and then lost (its store was put
    /// back from a backup): the pull's feed ended without them, and the run
    /// resynced to the server's state, so they are gone on both sides. An
    /// app may tell its user which entities lost a change. Only changes no
    /// pull had shown yet, one per entity (its latest), and not one whose
    /// version the restored server gave another client's change first
    /// (`Format/sync-protocol.md`, section 10, step 5).
    public var lostChanges: [AwaitedChange] = []
    /// The compaction the run ended with (`SyncConfiguration.compactAfterOffsets`),
    /// or nil when it made none.
    public var compaction: CompactionReport?

    public init(outcome: SyncOutcome) { self.outcome = outcome }
}
