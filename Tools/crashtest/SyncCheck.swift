import LogFormat
import LogStore
import LogSync

/// The sync workload's checks of a client store against its server: after
/// every kill, and after syncing the store to quiet.
struct SyncCheck {
    /// Sync runs allowed to bring a store to quiet: the first pushes and
    /// pulls everything, the second finds nothing new.
    static let quietRunsMax = 4
    /// Acknowledged intents pushed again after a quiet sync, to see the
    /// server answer `duplicate`.
    static let repushSampleMax = 50

    let server: ServerClient
    let ledger: Ledger
    let other: OtherWriter
    /// Whether the server's feed was compacted: it then shows each entity's
    /// latest change, not every change, and a cursor below its horizon is
    /// answered 410.
    let feedCompacted: Bool

    /// Reopens the store and checks it against the server's feed; when
    /// `toQuiet`, then syncs it to quiet, checks that client and server
    /// agree, and verifies the store again.
    func run(store directory: String, toQuiet: Bool, _ context: inout IterationContext) async {
        let store: Store
        do {
            store = try Store(path: directory, options: .init(durability: context.options.durability))
        } catch {
            return context.violation("the store at \(directory) does not reopen for the sync checks: \(error)")
        }
        do {
            try await againstFeed(store, quiet: false, &context)
            if toQuiet, try await syncToQuiet(store, &context) {
                try await againstFeed(store, quiet: true, &context)
            }
        } catch {
            context.violation("checking the store at \(directory) against the sync server failed: \(error)")
        }
        store.close()
        if toQuiet { await StoreCheck.verify(directory, &context) }
    }

    /// After a kill (or, with `quiet`, after syncing to quiet): the pulled
    /// changes are the feed's up to the cursor, the cursor is where they
    /// end, the server applied no intent twice and lost none it
    /// acknowledged, and the other writer's changes are all there; after a
    /// kill, in a compacted log, the app writes' promises hold too. With
    /// `quiet`, also: the client pulled the whole feed, the server applied
    /// every intent exactly once, and client and server agree on every
    /// entity. A compacted feed shows only what compaction kept: the checks
    /// of pulled changes against it are left out, and so are those of the
    /// cursor when the server answers it 410.
    private func againstFeed(_ store: Store, quiet: Bool, _ context: inout IterationContext) async throws {
        let log = try StoreCheck.readLog(store)
        let compactedBelow = try store.compactedBelow()
        let compacted = compactedBelow > 0
        let view = FeedView(log: log, feed: try await server.pullAll())
        let position = try await checkCursor(store, view, compactedBelow: compactedBelow, &context)
        if let position, !feedCompacted { view.checkPulledChanges(through: position, compactedBelow: compactedBelow, &context) }
        // In a log never compacted, the app writes' promises were checked
        // with the store's (`SyncWorkload.check`); in a compacted one they
        // need the intents the feed shows were folded away.
        let promises = compacted ? AppPromises(ledger.reports, &context) : nil
        let folded = view.checkApplied(
            quiet: quiet, compacted: compacted, feedCompacted: feedCompacted, wasTried: { promises?.wasTried($0) ?? false }, &context)
        view.checkLatestAtOrPastAcknowledged(&context)
        other.check(view.feed, compacted: feedCompacted, &context)
        if let promises, !quiet { try SyncWorkload.checkPromises(promises, ledger, store, log: log, folded: folded, &context) }
        guard quiet else { return }
        if position != view.feed.count {
            context.violation("synced to quiet, the client's cursor is after change \(position.map(String.init) ?? "?") of the feed's \(view.feed.count)")
        }
        try view.checkEntities(store, &context)
        try await repushSample(view, &context)
    }

    /// The pull cursor is the last applied page's, the feed goes on from it
    /// with the changes after those the client applied, and it is at or
    /// past the cursor of the last sync run that completed (unless a resync
    /// came after it).
    /// - Returns: how many of the feed's changes come up to the cursor;
    ///   nil when the feed from it is not a part of the feed (a violation),
    ///   or the server answers it 410 (in a compacted feed).
    private func checkCursor(
        _ store: Store, _ view: FeedView, compactedBelow: UInt64, _ context: inout IterationContext
    ) async throws -> Int? {
        let cursor = try store.pullCursor()
        // Below a compaction's watermark, a snapshot after the last pulled change may carry a later cursor.
        let last = view.remotes.last.flatMap { $0.offset >= compactedBelow ? $0 : nil }
        if let last, cursor != last.remote.cursor {
            context.violation("the pull cursor is \(cursor ?? "none"), but the page of the last pulled change (offset \(last.offset)) has \(last.remote.cursor)")
        } else if view.remotes.isEmpty, compactedBelow == 0, let cursor {
            context.violation("the pull cursor is \(cursor), but the log has no pulled change")
        }
        guard let rest = try await pullAll(after: cursor, view.feed, &context) else { return nil }
        let position = view.feed.count - rest.count
        guard position >= 0, rest == Array(view.feed[position...]) else {
            context.violation("pulling from the store's cursor gives \(rest.count) changes, which are not the last of the feed's \(view.feed.count)")
            return nil
        }
        if let promised = SyncWorkload.lastSyncedCursor(ledger), !view.resynced,
            let after = try await pullAll(after: promised, view.feed, &context)
        {
            let synced = view.feed.count - after.count
            if synced > position {
                context.violation(
                    "a sync run that completed left the pull cursor after change \(synced) of the feed, but the store's cursor is after change \(position)")
            }
        }
        return position
    }

    /// The feed after `cursor` (the whole `feed` for none); nil when the
    /// server answers 410, which only a compacted feed may (a violation
    /// otherwise).
    private func pullAll(after cursor: String?, _ feed: [PullChange], _ context: inout IterationContext) async throws -> [PullChange]? {
        guard let cursor else { return feed }
        if let rest = try await server.pullAllUnlessGone(after: cursor) { return rest }
        if !feedCompacted { context.violation("the server answers the cursor \(cursor) 410, but its feed was never compacted") }
        return nil
    }

    /// Syncs as the restarted app would, until a run completes with nothing
    /// left to push and nothing new to pull.
    /// - Returns: whether it got there (a violation says why not).
    private func syncToQuiet(_ store: Store, _ context: inout IterationContext) async throws -> Bool {
        let engine = try SyncWorkload.engine(store, server: server.base)
        for _ in 0..<SyncCheck.quietRunsMax {
            let report = await engine.sync()
            guard report.outcome == .completed else {
                context.violation("syncing the store to quiet: a run ended \(report.outcome)")
                return false
            }
            // The server is never killed here, and loses nothing: a change
            // the feed ends without is a row a kill left that no pull cleared.
            if let lost = report.lostChanges.first {
                context.violation(
                    "syncing the store to quiet: the run found \(report.lostChanges.count) acknowledged change(s) lost by a server "
                        + "that lost none (\(lost.entityType)/\(lost.entityID) at version \(lost.serverVersion), ack \(lost.ackOffset))")
            }
            if try store.outboxCount() == 0, report.changes == 0 { return true }
        }
        let first = try store.outbox(limit: 1).first.map { " (the first at offset \($0.offset): \($0.state.lastError))" } ?? ""
        context.violation("the store is not quiet after \(SyncCheck.quietRunsMax) sync runs: \(try store.outboxCount()) intents wait\(first)")
        return false
    }

    /// Pushes acknowledged intents again, with their idempotency keys: the
    /// server must answer each `duplicate` at the acknowledged version,
    /// and apply none a second time.
    private func repushSample(_ view: FeedView, _ context: inout IterationContext) async throws {
        let acknowledged = view.intents.compactMap { item in view.acks[item.offset].map { (intent: item.intent, ack: $0) } }
        let sample = acknowledged.shuffled(using: &context.random).prefix(SyncCheck.repushSampleMax)
        guard !sample.isEmpty else { return }
        let results = try await server.push(sample.map { PushOperation($0.intent, clientTimestamp: "2026-01-01T00:00:00.000000Z") })
        for (item, result) in zip(sample, results) where result.status != .duplicate || result.serverVersion != item.ack.serverVersion {
            context.violation(
                "pushing the acknowledged intent \(item.intent.idempotencyKey) on \(item.intent.entityType)/\(item.intent.entityID) again answered \(ServerWorkload.describe(result)), not duplicate at version \(item.ack.serverVersion)\(result.status == .applied ? " (so the server applied it twice)" : "")")
        }
    }
}
