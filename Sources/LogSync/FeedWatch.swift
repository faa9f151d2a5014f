import LogFormat
import LogStore

/// A transport that can wait with the server for the feed to change
/// (`Format/sync-protocol.md` section 8, `wait`): what
/// `SyncEngine.watchFeed` waits with.
public protocol FeedWaiting: Sendable {
    /// Waits up to `seconds` for a change after `cursor` (nil: the feed's
    /// beginning) in the feed of `types` (nil: every type) and `scopes`
    /// (nil: every scope).
    /// - Returns: whether a pull from `cursor` has something to apply now
    ///   (a change, or a forced resync); false when the wait ended without.
    /// - Throws: `TransportError`, as `SyncTransport.pull` does.
    func waitForChange(after cursor: String?, types: Set<String>?, scopes: Set<String>?, seconds: Int) async throws(TransportError)
        -> Bool
}

extension SyncEngine {
    /// Hears of other devices' changes as they are made, until the calling
    /// task is cancelled: it waits with the server, `waitSeconds` at a time
    /// (a long poll), for a change past the store's pull cursor, of the
    /// types the engine pulls, and then syncs (as `sync()` does), and waits
    /// again from the cursor that run left. On Linux it stands in for a
    /// server's push notification: a `SyncScheduler` syncs on local writes
    /// and timers, this on the server's changes; the engine's single flight
    /// joins their runs.
    ///
    /// It keeps to the engine's waits: while a failed run's backoff or the
    /// open circuit breaker holds runs off, it waits for their end before it
    /// asks the server again, and while the network path is one the
    /// `NetworkPolicy` syncs not over (`networkPathChanged`), it asks
    /// nothing, looking again every 5 s. A wait that fails (offline, the
    /// server down) is tried again after 1 s, then 2, 4, ... up to 60 s,
    /// each with jitter (a restarted server is not asked by every client at
    /// once), or after the server's `Retry-After` when that is longer (up
    /// to `RetryPolicy.retryAfterMaxMilliseconds`); the first that
    /// succeeds starts over at 1 s. A run that leaves the cursor where it
    /// was is followed by its backoff, or by a pause of 1 s when it set
    /// none, and a wait that ends without a change before half its time (a
    /// server that ignores `wait`) by the rest of its time, so that nothing
    /// makes it ask in a loop. Cancelling the task does not cancel a run
    /// the watch started: the watch ends once it has.
    /// - Parameter waitSeconds: how long one request waits, 1 to
    ///   `Wire.pullWaitSecondsMax` (outside, the nearest).
    /// - Throws: `SyncConfigurationError` when the engine's transport
    ///   cannot wait (it is not `FeedWaiting`).
    public func watchFeed(waitSeconds: Int = 25) async throws(SyncConfigurationError) {
        let waiting = try feedWaiting()
        let seconds = min(max(waitSeconds, 1), Wire.pullWaitSecondsMax)
        var failures = 0
        while !Task.isCancelled {
            if let deadline = nextRunDeadline {
                guard (try? await clock.sleep(untilMilliseconds: deadline)) != nil else { return }
                continue
            }
            if pathDisallowed {
                guard (try? await clock.sleep(milliseconds: SyncEngine.watchPathPollMilliseconds)) != nil else { return }
                continue
            }
            // A damaged cursor is the run's to mend (it resyncs).
            let cursor = try? store.pullCursor()
            let changed: Bool
            let asked = clock.monotonicMilliseconds
            do throws(TransportError) {
                changed = try await waiting.waitForChange(
                    after: cursor, types: configuration.pulledTypes, scopes: configuration.pulledScopes?.scopes, seconds: seconds)
                failures = 0
            } catch {
                // A refused cursor is the run's to mend too.
                if case .status(410, _) = error.kind {
                    changed = true
                } else {
                    failures += 1
                    let pause = max(
                        watchRetryMilliseconds(afterFailures: failures),
                        configuration.retry.retryAfterMilliseconds(error.retryAfterSeconds))
                    guard (try? await clock.sleep(milliseconds: pause)) != nil else { return }
                    continue
                }
            }
            guard changed else {
                // A server that ignores `wait` (one that predates it: the
                // protocol ignores unknown parameters) answers at once: it
                // is asked once a wait's time, not in a loop.
                let waitEnd = asked.addingSaturating(UInt64(seconds) * 1_000)
                if clock.monotonicMilliseconds < waitEnd / 2 + asked / 2 {
                    guard (try? await clock.sleep(untilMilliseconds: waitEnd)) != nil else { return }
                }
                continue
            }
            guard !Task.isCancelled else { continue }
            // In a task of its own: a watch that stops does not cancel the
            // run, which others may have joined (a scheduler's stop lets a
            // running sync finish too).
            _ = await Task { await self.sync() }.value
            // The cursor where it was, and no backoff to wait for (the run
            // was cancelled, or found the path not allowed just now): a
            // wait from it would find the same change at once.
            if (try? store.pullCursor()) == cursor, nextRunDeadline == nil {
                guard (try? await clock.sleep(milliseconds: SyncEngine.watchRetryMillisecondsMin)) != nil else { return }
            }
        }
    }

    /// The transport, as one that can wait for changes.
    /// - Throws: `SyncConfigurationError` when it cannot (a watch needs it).
    nonisolated func feedWaiting() throws(SyncConfigurationError) -> any FeedWaiting {
        guard let waiting = transport as? any FeedWaiting else {
            throw SyncConfigurationError("watchFeed needs a transport that can wait for changes (FeedWaiting), such as HTTPTransport")
        }
        return waiting
    }

    /// The wait before asking again after `failures` failed waits in a
    /// row: 1 s doubled for each after the first, at most 60 s, then
    /// between half of that and all of it.
    private func watchRetryMilliseconds(afterFailures failures: Int) -> UInt64 {
        let doubled = SyncEngine.watchRetryMillisecondsMin << UInt64(min(failures - 1, 16))
        let bound = min(doubled, SyncEngine.watchRetryMillisecondsMax)
        return bound / 2 + UInt64.random(in: 0...(bound / 2), using: &random)
    }

    /// How often a watch looks again whether the network path is one the
    /// policy syncs over, while it is not.
    static let watchPathPollMilliseconds: UInt64 = 5_000
    static let watchRetryMillisecondsMin: UInt64 = 1_000
    static let watchRetryMillisecondsMax: UInt64 = 60_000
}
