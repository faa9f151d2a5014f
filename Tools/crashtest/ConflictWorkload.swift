import LogFormat
import LogStore
import LogTesting

/// Conflicts settled by the app while the worker is killed: each round
/// pulls an entity, updates it locally, records the server's refusal of
/// that update as a conflict left for the app (`.askApp`), and settles it
/// with `Store.resolveConflict`, a decision drawn from the seed: four
/// commits. A worker first settles the conflicts an earlier kill left
/// waiting, so kills land in resolutions of conflicts recorded by another
/// process too.
///
/// Reports, for each commit: `try STEP` before, `ack STEP` after it
/// returned, `fail STEP` when it threw; STEP is `pull:ID`, `update:ID`,
/// `record:INTENT` or, for a resolution of the conflict of the intent at
/// offset INTENT, `INTENT`. With `--count`, `seen STEP WHAT` for each read
/// that still answered after a failed commit and showed something of it.
enum ConflictWorkload: StoreWorkload {
    static let name = "conflicts"
    static let summary = "conflicts recorded for the app and settled with resolveConflict, each decision one commit"
    static let entityType = "cf"
    /// The commits of one round.
    static let roundCommitCount = 4

    static func work(_ worker: Worker) async throws {
        let store = try worker.openStore()
        var random = SeededRandom(seed: worker.seed)
        if let count = worker.count { return try await roundsOneByOne(count / roundCommitCount, store, worker, &random) }
        // Bounded by the conflicts earlier workers left.
        for waiting in try store.conflicts() {
            try await resolve(waiting.conflict.intentOffset, store, worker, &random, watching: false)
        }
        for number in 0..<worker.writesMax {
            try await round(number, store, worker, &random, watching: false)
        }
    }

    static func entityID(_ worker: Worker, _ number: Int) -> String { "cf_\(worker.tag)_\(number)" }

    /// One round on a new entity.
    /// - Parameter watching: read what the app sees before each commit,
    ///   and report what a failed one left visible (`seen`).
    private static func round(_ number: Int, _ store: Store, _ worker: Worker, _ random: inout SeededRandom, watching: Bool) async throws {
        let id = entityID(worker, number)
        let watched = watching ? (store, id) : nil
        try await step("pull:\(id)", worker, watched) {
            try await store.applyPulledPage(
                [PulledChange(.upsert, entityType: entityType, entityID: id, serverVersion: 1, fields: ["key": .string(id)])],
                cursor: "cf-\(worker.tag)-\(number)")
        }
        try await step("update:\(id)", worker, watched) {
            try await store.update(type: entityType, id: id, changes: ["local": .int(Int64(number))])
        }
        guard let intent = try store.outbox().last(where: { $0.intent.entityID == id }) else {
            preconditionFailure("the update of \(id) is not in the outbox")
        }
        let server = ServerState(serverVersion: 2, deleted: number % 5 == 0, data: ["key": .string(id), "server": true])
        try await step("record:\(intent.offset)", worker, watched) {
            try await store.record([(intent.offset, .conflict(server, message: "refused"))]) { _ in .askApp }
        }
        try await resolve(intent.offset, store, worker, &random, watching: watching, id: id)
    }

    /// Settles the conflict of the intent at `offset` with a decision drawn
    /// from `random`.
    private static func resolve(
        _ offset: UInt64, _ store: Store, _ worker: Worker, _ random: inout SeededRandom, watching: Bool, id: String = ""
    ) async throws {
        let decisions: [ConflictDecision] = [
            .keepLocal, .keepRemote, .merged(["key": .string("merged-\(offset)")]), .custom(["key": .string("custom-\(offset)")]), .custom(nil),
        ]
        let decision = decisions[Int.random(in: 0..<decisions.count, using: &random)]
        // The lie: a resolution acknowledged that was never made.
        try await step(String(offset), worker, watching ? (store, id) : nil, mayLie: true) {
            try await store.resolveConflict(intentOffset: offset, decision)
        }
    }

    /// One commit, reported `try` before, then `ack` or `fail`; `watched`,
    /// a store and the round's entity, also `seen` for what the reads
    /// show of a failed commit.
    private static func step(
        _ name: String, _ worker: Worker, _ watched: (store: Store, id: String)?, mayLie: Bool = false, _ body: () async throws -> Void
    ) async throws {
        worker.reporter.send("try", [name])
        if mayLie, worker.reporter.lie("ack", [name]) { return }
        let before = try watched.map { try ConflictView($0.store, id: $0.id) }
        do {
            try await body()
        } catch {
            worker.reporter.send("fail", [name])
            if let before, let watched {
                for difference in before.differences(watched.store, id: watched.id) { worker.reporter.send("seen", [name, difference]) }
            }
            throw error
        }
        worker.reporter.send("ack", [name])
    }

    /// `rounds` rounds, one commit at a time, for a fault run: a failed
    /// commit ends the worker, after one more commit shows whether the
    /// store now refuses writes, as it must. Conflicts earlier runs left
    /// are left waiting, so that a run makes a known number of commits.
    private static func roundsOneByOne(_ rounds: Int, _ store: Store, _ worker: Worker, _ random: inout SeededRandom) async throws {
        for number in 0..<rounds {
            let id = entityID(worker, number)
            do {
                try await round(number, store, worker, &random, watching: true)
            } catch {
                throw await CommitFailure.after("round \(number) on \(id)", failed: error) {
                    try await round(rounds, store, worker, &random, watching: false)
                    return "succeeded"
                }
            }
        }
    }

    /// Every acknowledged resolution is in the log and its conflict waits
    /// no more; every other tried one is in the log with its conflict gone,
    /// or not there with its conflict waiting; `conflicts()` lists exactly
    /// the conflicts the log leaves waiting (`Store.verify` then compares
    /// every table with a replay); and no failed commit is in the log.
    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        var recorded = Set<UInt64>()
        var resolved = Set<UInt64>()
        var written = Set<String>()
        for entry in log {
            switch entry.body {
            case .conflict(let conflict):
                if conflict.resolution == .pending { recorded.insert(conflict.intentOffset) } else { resolved.insert(conflict.intentOffset) }
            case .intent(let intent): written.insert("update:\(intent.entityID)")
            case .remote(let remote): written.insert("pull:\(remote.entityID)")
            default: break
            }
        }
        let waiting = Set(try store.conflicts().map(\.conflict.intentOffset))
        let expected = recorded.subtracting(resolved)
        for offset in expected.subtracting(waiting).sorted().prefix(StoreCheck.differencesShownMax) {
            context.violation("conflicts(): the conflict of intent \(offset) waits in the log but is not listed")
        }
        for offset in waiting.subtracting(expected).sorted().prefix(StoreCheck.differencesShownMax) {
            context.violation("conflicts(): the conflict of intent \(offset) is listed, but the log \(resolved.contains(offset) ? "resolves it" : "has none")")
        }
        let steps = { (verb: String) in ledger.reports.filter { $0.verb == verb }.compactMap(\.words.first) }
        let acknowledged = steps("ack").compactMap(UInt64.init)
        for offset in acknowledged where !resolved.contains(offset) {
            context.violation("the acknowledged resolution of the conflict of intent \(offset) is not in the log")
        }
        for offset in steps("try").compactMap(UInt64.init) where !recorded.contains(offset) {
            context.violation("a resolution was tried for intent \(offset), whose conflict the log never recorded")
        }
        for failed in steps("fail") {
            let inLog =
                UInt64(failed).map(resolved.contains) ?? (failed.hasPrefix("record:") ? UInt64(failed.dropFirst(7)).map(recorded.contains) ?? false : written.contains(failed))
            if inLog { context.violation("the failed commit \(failed) is in the log") }
        }
        return steps("ack").count
    }
}

/// What the app sees of one round's entity and of the conflicts, read
/// before a commit, so that a failed commit can be shown to have left no
/// trace in any read.
struct ConflictView {
    var fields: Fields?
    var conflicts: [UInt64]
    var outboxCount: Int
    var cursor: String?

    init(_ store: Store, id: String) throws {
        fields = try store.get(type: ConflictWorkload.entityType, id: id)?.fields
        conflicts = try store.conflicts().map(\.conflict.intentOffset)
        outboxCount = try store.outboxCount()
        cursor = try store.pullCursor()
    }

    /// What the reads show now that differs, one word each. A read that
    /// throws shows nothing (a read after a failed commit opens the store
    /// again first, and fails when that does).
    func differences(_ store: Store, id: String) -> [String] {
        guard let now = try? ConflictView(store, id: id) else { return [] }
        var found: [String] = []
        if now.fields != fields { found.append("get") }
        if now.conflicts != conflicts { found.append("conflicts") }
        if now.outboxCount != outboxCount { found.append("outbox") }
        if now.cursor != cursor { found.append("cursor") }
        return found
    }
}
