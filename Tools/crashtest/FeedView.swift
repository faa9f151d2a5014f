import LogFormat
import LogStore

/// A sync client's log read beside its server's change feed.
///
/// The feed does not carry idempotency keys, so "applied exactly once" is
/// checked through what each change holds: every app intent writes a `key`
/// field naming its operation (`AppOperation.identity`, unique per intent,
/// and an entity is deleted at most once), and the server's change holds
/// the entity's fields after it, so an upsert in the feed names the intent
/// that made it and a delete names its entity. The server applies an
/// operation by appending exactly one change, so each intent must name
/// exactly one change of the feed: none before it is applied, two if it
/// were applied twice.
struct FeedView {
    let feed: [PullChange]
    /// The client's intents, in log order, and the answers to them by the
    /// intent's offset.
    private(set) var intents: [(offset: UInt64, intent: Intent)] = []
    private(set) var acks: [UInt64: Ack] = [:]
    private(set) var rejects: [UInt64: Reject] = [:]
    /// The pulled changes after the last resync, in log order.
    private(set) var remotes: [(offset: UInt64, remote: Remote)] = []
    /// The offset of the log's first resync, if it has one.
    private(set) var firstResync: UInt64?
    /// Whether the log has a resync.
    var resynced: Bool { firstResync != nil }

    init(log: [Entry], feed: [PullChange]) {
        self.feed = feed
        for entry in log {
            switch entry.body {
            case .intent(let intent): intents.append((entry.offset, intent))
            case .ack(let ack): acks[ack.intentOffset] = ack
            case .reject(let reject): rejects[reject.intentOffset] = reject
            case .remote(let remote): remotes.append((entry.offset, remote))
            case .resync:
                remotes = []
                firstResync = firstResync ?? entry.offset
            default: break
            }
        }
    }

    /// The log's pulled changes must be the feed's changes up to
    /// `position` (where the store's cursor is), in order, each once:
    /// every page applied whole, none lost, none twice. In a log never
    /// compacted (`compactedBelow` 0) they are the first `position` ones.
    /// In a compacted one, those at or above the watermark are the last of
    /// them, and those below it, which compaction kept (most it folds into
    /// snapshots), come before those, in the feed's order.
    func checkPulledChanges(through position: Int, compactedBelow: UInt64, _ context: inout IterationContext) {
        let kept = remotes.prefix { $0.offset < compactedBelow }
        let whole = remotes[kept.count...]
        guard whole.count <= position, compactedBelow > 0 || whole.count == position else {
            return context.violation(
                "the log has \(remotes.count) pulled changes, but the pull cursor is after change \(position) of the feed\(compactedBelow > 0 ? "" : " (and the log was never compacted)")")
        }
        var next = position - whole.count
        for (index, (offset, remote)) in whole.enumerated() where !Self.same(remote, feed[next + index]) {
            return context.violation(
                "log at offset \(offset): pulled change \(kept.count + index + 1) of \(remotes.count) is \(Self.describe(remote)), the feed's change \(next + index + 1) is \(Self.describe(feed[next + index]))")
        }
        // Those kept below the watermark: a subsequence of the feed before the rest.
        for (offset, remote) in kept.reversed() {
            guard let found = feed[..<next].lastIndex(where: { Self.same(remote, $0) }) else {
                return context.violation(
                    "log at offset \(offset), below the watermark \(compactedBelow): the pulled change \(Self.describe(remote)) is not in the feed before the \(position - next) changes after it")
            }
            next = found
        }
    }

    /// Whether the pulled change holds what the feed's change does.
    private static func same(_ remote: Remote, _ change: PullChange) -> Bool {
        let deleted = remote.operation == .delete
        return remote.entityType == change.entityType && remote.entityID == change.entityID
            && remote.serverVersion == change.serverVersion && deleted == (change.operation == .delete)
            && (deleted || remote.fields == change.data)
    }

    /// The server applied no app intent twice, and none the client's log
    /// does not have (in a compacted log: none no worker tried); each
    /// acknowledged intent once, at its acknowledged version; none that
    /// was rejected. With `quiet`, every intent is answered, so each was
    /// applied exactly once.
    /// - Parameters:
    ///   - compacted: whether the log was compacted, so that intents the
    ///     server applied may be folded away.
    ///   - feedCompacted: whether the feed was compacted, so that the change
    ///     an acknowledged intent made may be gone, superseded.
    ///   - wasTried: whether a worker tried the operation of an identity.
    /// - Returns: the operations, by identity, that the server applied and
    ///   the compacted log no longer has (empty for a log never compacted).
    func checkApplied(
        quiet: Bool, compacted: Bool, feedCompacted: Bool, wasTried: (String) -> Bool, _ context: inout IterationContext
    ) -> Set<String> {
        let made = madeBy(&context)
        var byIdentity: [String: UInt64] = [:]
        for (offset, intent) in intents where intent.entityType == AppOperation.entityType {
            if let identity = AppOperation.identity(of: intent) { byIdentity[identity] = offset }
        }
        var folded = Set<String>()
        for (identity, changes) in made.sorted(by: { $0.key < $1.key }) {
            guard let offset = byIdentity[identity] else {
                if compacted, wasTried(identity) {
                    folded.insert(identity)
                } else {
                    context.violation(
                        "the server applied \(identity) (feed change \(changes[0] + 1)), which no intent in the client's log made\(compacted ? " and no worker tried" : "")")
                }
                if changes.count > 1 {
                    context.violation("the server applied \(identity) \(changes.count) times: feed changes \(changes.map { String($0 + 1) })")
                }
                continue
            }
            if changes.count > 1 {
                context.violation("the server applied the intent at offset \(offset) (\(identity)) \(changes.count) times: feed changes \(changes.map { String($0 + 1) })")
            }
        }
        for (offset, intent) in intents where intent.entityType == AppOperation.entityType {
            guard let identity = AppOperation.identity(of: intent) else { continue }  // `AppPromises` reports it.
            let changes = made[identity] ?? []
            let name = "the intent at offset \(offset) (\(identity))"
            if let reject = rejects[offset] {
                // Nothing conflicts with these writes: a reject is an error
                // of the engine (a wrong base version) or the server. But for
                // one: an intent made after a resync may have been made on a
                // state that the resync's pull, cut short, left behind the
                // server's (`AppPromises.checkVisible`), and conflict.
                let madeMidResync = feedCompacted && reject.code == WireErrorCode.conflict.rawValue && (firstResync ?? .max) < offset
                if !madeMidResync { context.violation("the server rejected \(name): \(reject.code): \(reject.message)") }
                if !changes.isEmpty { context.violation("\(name) was rejected, yet the server applied it") }
            } else if let ack = acks[offset] {
                if changes.isEmpty, !feedCompacted {
                    context.violation("\(name) was acknowledged (\(ack.outcome), version \(ack.serverVersion)), but the server's feed does not have it")
                } else if changes.count == 1, feed[changes[0]].serverVersion != ack.serverVersion {
                    context.violation("\(name) was acknowledged at version \(ack.serverVersion), the feed has it at version \(feed[changes[0]].serverVersion)")
                }
            } else if quiet {
                context.violation("synced to quiet, \(name) has no answer")
            }
        }
        return folded
    }

    /// The server lost no change it acknowledged: the feed's latest change
    /// of each app entity is the one the last acknowledged intent on it
    /// made, or a later one (the worker's intents on an entity are pushed
    /// in the order they were made; it deletes an entity last). A
    /// compacted feed keeps each entity's latest change, so this holds of
    /// it too.
    func checkLatestAtOrPastAcknowledged(_ context: inout IterationContext) {
        var latest: [String: PullChange] = [:]
        for change in feed where change.entityType == AppOperation.entityType { latest[change.entityID] = change }
        var acknowledged: [String: (offset: UInt64, rank: Int)] = [:]
        for (offset, intent) in intents where intent.entityType == AppOperation.entityType && acks[offset] != nil {
            guard let rank = Self.rank(intent) else { continue }  // `AppPromises` reports it.
            if rank > acknowledged[intent.entityID]?.rank ?? -1 { acknowledged[intent.entityID] = (offset, rank) }
        }
        for (id, last) in acknowledged.sorted(by: { $0.key < $1.key }) {
            let change = latest[id]
            guard let change else {
                context.violation("te/\(id): the intent at offset \(last.offset) was acknowledged, but the feed has no change of it")
                continue
            }
            if (Self.rank(change) ?? -1) < last.rank {
                context.violation(
                    "te/\(id): the intent at offset \(last.offset) was acknowledged, but the feed's latest change of it (\(change.operation) at version \(change.serverVersion)) comes before it")
            }
        }
    }

    /// Where an app intent, or the change it made, comes among the intents
    /// on its entity: its operation's sequence number, or past them all for
    /// a delete; nil when it names no operation.
    private static func rank(_ intent: Intent) -> Int? {
        intent.operation == .delete ? Int.max : AppOperation.identity(of: intent).flatMap(AppOperation.sequence(ofIdentity:))
    }

    private static func rank(_ change: PullChange) -> Int? {
        guard change.operation == .upsert else { return Int.max }
        guard case .string(let key)? = change.data?["key"] else { return nil }
        return AppOperation.sequence(ofIdentity: key)
    }

    /// The feed changes of app entities, by the identity of the operation
    /// that made each (indexes into the feed).
    private func madeBy(_ context: inout IterationContext) -> [String: [Int]] {
        var made: [String: [Int]] = [:]
        for (index, change) in feed.enumerated() where change.entityType == AppOperation.entityType {
            if change.operation == .delete {
                made["\(change.entityID)#delete", default: []].append(index)
            } else if case .string(let key)? = change.data?["key"] {
                made[key, default: []].append(index)
            } else {
                context.violation("feed change \(index + 1), on \(change.entityType)/\(change.entityID), has no key field: no app intent made it")
            }
        }
        return made
    }

    /// Client and server agree: the client sees each entity the feed leaves
    /// in place with the same fields, at the same version, with nothing
    /// pending, and no entity the feed deleted or never had.
    func checkEntities(_ store: Store, _ context: inout IterationContext) throws {
        var last: [String: PullChange] = [:]
        for change in feed { last["\(change.entityType)/\(change.entityID)"] = change }
        for (name, change) in last.sorted(by: { $0.key < $1.key }) {
            let seen = try store.get(type: change.entityType, id: change.entityID)
            if change.operation == .delete {
                if let seen { context.violation("\(name): the server deleted it at version \(change.serverVersion), the client sees it at version \(seen.serverVersion)") }
            } else if seen?.fields != change.data || seen?.serverVersion != change.serverVersion || seen?.pendingIntentCount != 0 {
                let found = seen.map { "version \($0.serverVersion) with \($0.pendingIntentCount) pending\($0.fields == change.data ? "" : " and other fields")" }
                context.violation("\(name): the server has version \(change.serverVersion), the client sees \(found ?? "nothing")")
            }
        }
        for type in [AppOperation.entityType, OtherWriter.entityType] {
            for entity in try StoreCheck.entities(store, type: type) where last["\(type)/\(entity.id)"] == nil {
                context.violation("\(type)/\(entity.id): the client sees it, but the server's feed never had it")
            }
        }
    }

    static func describe(_ remote: Remote) -> String {
        "\(remote.operation) of \(remote.entityType)/\(remote.entityID) at version \(remote.serverVersion)"
    }

    static func describe(_ change: PullChange) -> String {
        "\(change.operation) of \(change.entityType)/\(change.entityID) at version \(change.serverVersion)"
    }
}
