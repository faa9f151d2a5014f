import LogFormat
import LogStore

/// Pulled pages applied with their cursors (`Store.applyPulledPage`), one
/// after another, as a sync client does: the worker goes on from the cursor
/// the store has. Page N is made from N alone (`page(_:)`), so the parent
/// knows what every page holds.
///
/// Reports: `try N` before page N is applied, `ack N` after. A worker has
/// one page in flight, but a page applied and not yet acknowledged at a
/// kill is where the next worker goes on from, so the cursor may be several
/// pages past the last acknowledgement: never past the last page tried.
enum PullWorkload: StoreWorkload {
    static let name = "pull"
    static let summary = "pulled pages applied with their cursors (Store.applyPulledPage), resuming from the stored cursor"

    static let entityType = "pl"
    /// Pages touch this many entities (a prime, so pages mix them well).
    static let entityCount = 61
    /// The most changes in one page.
    static let pageCountMax = 5

    static func cursor(_ page: Int) -> String { "c-\(page)" }

    /// The page number a cursor names (0 for none), or nil when the cursor
    /// is not one this workload writes.
    static func pageNumber(_ cursor: String?) -> Int? {
        guard let cursor else { return 0 }
        guard cursor.hasPrefix("c-"), let number = Int(cursor.dropFirst(2)), number > 0 else { return nil }
        return number
    }

    /// Page `number`: up to `pageCountMax` changes on distinct entities,
    /// with server versions that rise from page to page.
    static func page(_ number: Int) -> [PulledChange] {
        (0..<(1 + number % pageCountMax)).map { index in
            let id = "pl_\((number * 7 + index * 13) % entityCount)"
            let version = UInt64(number * 10 + index)
            guard (number + index) % 11 != 0 else {
                return PulledChange(.delete, entityType: entityType, entityID: id, serverVersion: version)
            }
            return PulledChange(
                .upsert, entityType: entityType, entityID: id, serverVersion: version,
                fields: Payload.fields(key: "page-\(number)-\(index)"))
        }
    }

    static func work(_ worker: Worker) async throws {
        let store = try worker.openStore()
        let stored = try store.pullCursor()
        guard let start = pageNumber(stored) else {
            throw HarnessError("the store's pull cursor \(stored ?? "") is not one the pull workload writes")
        }
        for number in (start + 1)...(start + worker.writesMax) {
            worker.reporter.send("try", [String(number)])
            // The lie: a page reported applied that never was.
            if worker.reporter.lie("ack", [String(number)]) { continue }
            try await store.applyPulledPage(page(number), cursor: cursor(number))
            worker.reporter.send("ack", [String(number)])
        }
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        let acknowledged = ledger.with("ack").compactMap { $0.words.first.flatMap { Int($0) } }
        let lastAcknowledged = acknowledged.max() ?? 0
        let lastTried = ledger.with("try").compactMap { $0.words.first.flatMap { Int($0) } }.max() ?? 0
        let cursor = try store.pullCursor()
        guard let applied = Self.pageNumber(cursor) else {
            context.violation("the pull cursor \(cursor ?? "") is not one the workload wrote")
            return acknowledged.count
        }
        if applied < lastAcknowledged {
            context.violation("the pull cursor is \(cursor ?? "none"), but page \(lastAcknowledged) was acknowledged (cursor \(Self.cursor(lastAcknowledged)))")
        } else if applied > lastTried {
            context.violation("the pull cursor \(cursor ?? "none") is past page \(lastTried), the last one a worker tried")
        }
        checkRemoteEntries(log, through: applied, &context)
        try checkEntities(store, through: applied, &context)
        return acknowledged.count
    }

    /// The log's `remote` entries must be exactly pages 1 through `last`, in
    /// order, each page whole.
    private static func checkRemoteEntries(_ log: [Entry], through last: Int, _ context: inout IterationContext) {
        let remotes = log.compactMap { entry -> (UInt64, Remote)? in
            guard case .remote(let remote) = entry.body else { return nil }
            return (entry.offset, remote)
        }
        var index = 0
        for number in 1..<(last + 1) {
            for change in Self.page(number) {
                let expected = Remote(
                    cursor: Self.cursor(number), change.operation, entityType: change.entityType, entityID: change.entityID,
                    serverVersion: change.serverVersion, fields: change.fields)
                guard index < remotes.count else {
                    return context.violation("log: page \(number) (cursor \(Self.cursor(number))) is missing or torn; the log ends before it")
                }
                let (offset, found) = remotes[index]
                guard found == expected else {
                    return context.violation(
                        "log at offset \(offset): page \(number)'s change on \(change.entityID) should be next, but the entry is \(found.cursor)'s change on \(found.entityID)\(found.cursor == expected.cursor && found.entityID == change.entityID ? ", damaged" : "")")
                }
                index += 1
            }
        }
        if index < remotes.count {
            context.violation("log at offset \(remotes[index].0): a remote entry after page \(last), the page of the cursor")
        }
    }

    /// Each entity must be as the last change to it in pages 1 through `last` left it.
    private static func checkEntities(_ store: Store, through last: Int, _ context: inout IterationContext) throws {
        var expected: [String: PulledChange] = [:]
        for number in 1..<(last + 1) {
            for change in Self.page(number) { expected[change.entityID] = change }
        }
        for (id, change) in expected.sorted(by: { $0.key < $1.key }) {
            let seen = try store.get(type: Self.entityType, id: id)
            let wanted = change.operation == .delete ? nil : change.fields
            if seen?.fields != wanted || (wanted != nil && seen?.serverVersion != change.serverVersion) {
                context.violation("\(Self.entityType)/\(id): the app sees \(seen.map { "version \($0.serverVersion)" } ?? "nothing"), page \(change.serverVersion / 10) left \(wanted == nil ? "it deleted" : "version \(change.serverVersion)")")
            }
        }
    }
}
