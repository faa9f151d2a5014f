import LogFormat
import LogStore

/// How well a store is syncing, in one value an app can show or log
/// (`SyncEngine.health()`). Times are Unix milliseconds on the engine's
/// clock.
public struct SyncHealth: Sendable, Equatable {
    /// Intents waiting to be pushed (due or waiting for a retry).
    public var pendingCount: Int
    /// Pending intents that wait for a network path that is neither
    /// expensive nor constrained: those of the types
    /// `NetworkPolicy.typesPushedOnlyOnFreePaths` names, while the path is
    /// one of these. 0 on a free path.
    public var heldCount: Int
    /// Intents out of retries, waiting for the app (`Store.retryFailed`);
    /// `Store.outbox()` lists them with their last error.
    public var failedCount: Int
    /// How long the oldest pending intent has waited since it was written;
    /// nil when none is pending.
    public var oldestPendingAgeMilliseconds: UInt64?
    /// When the next intent waiting for a retry becomes due. The scheduler
    /// pushes it in its first run from then, and from `nextRunAt` at the
    /// earliest.
    public var nextAttemptAt: UInt64?
    /// When a run last completed (pushed and pulled to the feed's end).
    public var lastSuccessAt: UInt64?
    /// The message of the last failed run, cleared by a completed one.
    public var lastError: String?
    /// Whether the last health check reached the server.
    public var isOnline: Bool
    /// Why the server counts as unreachable, while it does: the last health
    /// check's failure (no answer, a refused connection, a server URL no
    /// request can go to), or the device's lost network path. Nil while
    /// online, and before the first health check.
    public var offlineReason: String?
    /// When the circuit breaker lets requests through again, if it is open.
    public var breakerOpenUntil: UInt64?
    /// After failed runs, when the scheduler starts the next one (the end of
    /// their backoff, or of the open breaker); nil when it need not wait.
    public var nextRunAt: UInt64?
    public var state: SyncState
    /// The protocol version the server answered in, when it is not this
    /// client's (`Wire.protocolVersion`): the server is reachable, and no
    /// run syncs until the app (or the server) is updated, which an app
    /// may tell its user. Nil once a health check finds the server's
    /// version this client's.
    public var serverProtocolVersion: String?
    /// The oldest pending intent has waited longer than
    /// `SyncConfiguration.stuckAfterMilliseconds` while the server was
    /// reachable: something other than connectivity keeps it from the
    /// server (a retry loop, an open breaker, a server that never answers).
    /// An intent held for a free path (`heldCount`) is not counted: the
    /// policy keeps it. The wait is measured on the clock's monotonic reading: a step of the
    /// wall clock neither raises the flag nor clears it.
    public var isStuck: Bool
}

extension SyncHealth {
    /// `isStuck` measures the wait while online on the clock's monotonic
    /// reading, as every wait of the engine is, so that a step of the wall
    /// clock neither raises it at once nor clears it. The intent's write
    /// time is known only on the wall clock (its entry's timestamp), so it
    /// counts only as how long after the server became reachable it was
    /// written, two wall-clock readings both taken before any later step.
    /// - Parameters:
    ///   - online: while the server is reachable (nil while offline): how
    ///     long it has been, on the monotonic reading, and since when, on
    ///     the wall clock as it read then. Waiting before it is not counted.
    init(
        summary: OutboxSummary, now: UInt64, online: (duration: UInt64, since: UInt64)?, stuckAfter: UInt64, lastSuccessAt: UInt64?,
        lastError: String?, offlineReason: String?, breakerOpenUntil: UInt64?, nextRunAt: UInt64?, state: SyncState,
        serverProtocolVersion: String?
    ) {
        pendingCount = summary.pendingCount
        heldCount = summary.heldCount
        failedCount = summary.failedCount
        oldestPendingAgeMilliseconds = summary.oldestPendingWrittenAt.map { now - min(now, $0) }
        nextAttemptAt = summary.nextAttemptAt
        self.lastSuccessAt = lastSuccessAt
        self.lastError = lastError
        isOnline = online != nil
        self.offlineReason = online == nil ? offlineReason : nil
        self.breakerOpenUntil = breakerOpenUntil
        self.nextRunAt = nextRunAt
        self.state = state
        self.serverProtocolVersion = serverProtocolVersion
        if let online, let written = summary.oldestUnheldPendingWrittenAt {
            let writtenAfter = written - min(written, online.since)
            isStuck = online.duration > writtenAfter && online.duration - writtenAfter > stuckAfter
        } else {
            isStuck = false
        }
    }
}

extension SyncHealth: CustomStringConvertible {
    /// One line, for logs: `2 pending (oldest 4 s), 0 failed, online, last
    /// success at 2026-11-22T14:05:09.120000Z, state idle`.
    public var description: String {
        func date(_ milliseconds: UInt64) -> String {
            Value.iso8601(microseconds: Int64(clamping: min(milliseconds, UInt64(Int64.max / 1_000))) * 1_000)
        }
        let details = [
            oldestPendingAgeMilliseconds.map { "oldest \($0 / 1_000) s" }, heldCount > 0 ? "\(heldCount) held for a free path" : nil,
        ].compactMap { $0 }
        var parts = ["\(pendingCount) pending" + (details.isEmpty ? "" : " (\(details.joined(separator: ", ")))")]
        parts.append("\(failedCount) failed")
        parts.append(isOnline ? "online" : "offline" + (offlineReason.map { " (\($0))" } ?? ""))
        if isStuck { parts.append("STUCK") }
        if let serverProtocolVersion { parts.append("server speaks protocol version \(serverProtocolVersion)") }
        if let breakerOpenUntil { parts.append("breaker open until \(date(breakerOpenUntil))") }
        if let nextRunAt { parts.append("next run at \(date(nextRunAt))") }
        parts.append(lastSuccessAt.map { "last success at \(date($0))" } ?? "never synced")
        if let lastError { parts.append("last error: \(lastError)") }
        parts.append("state \(state)")
        return parts.joined(separator: ", ")
    }
}
