import LogFormat
import LogStore
import LogTesting

/// Conflicts settled by the app while the worker is killed: each round
/// pulls an entity, updates it locally, records the server's refusal of
/// that update as a conflict left for the app (`.askApp`), and settles it
/// with `Store.resolveConflict`, a decision drawn from the seed. A worker
/// first settles the conflicts an earlier kill left waiting, so kills land
/// in resolutions of conflicts recorded by another process too.
///
/// Reports: `try INTENT` before a resolution of the conflict of the
/// intent at offset INTENT, `ack INTENT` after it returned.
enum ConflictWorkload: StoreWorkload {
    static let name = "conflicts"
    static let summary = "conflicts recorded for the app and settled with resolveConflict, each decision one commit"
    static let entityType = "cf"

    static func work(_ worker: Worker) async throws {
        let store = try worker.openStore()
        var random = SeededRandom(seed: worker.seed)
        // Bounded by the conflicts earlier workers left.
        for waiting in try store.conflicts() {
            try await resolve(waiting.conflict.intentOffset, store, worker, &random)
        }
        for number in 0..<worker.writesMax {
            let id = "cf_\(worker.tag)_\(number)"
            try await store.applyPulledPage(
                [PulledChange(.upsert, entityType: entityType, entityID: id, serverVersion: 1, fields: ["key": .string(id)])],
                cursor: "cf-\(worker.tag)-\(number)")
            try await store.update(type: entityType, id: id, changes: ["local": .int(Int64(number))])
            guard let intent = try store.outbox().last(where: { $0.intent.entityID == id }) else {
                preconditionFailure("the update of \(id) is not in the outbox")
            }
            let server = ServerState(serverVersion: 2, deleted: number % 5 == 0, data: ["key": .string(id), "server": true])
            try await store.record([(intent.offset, .conflict(server, message: "refused"))]) { _ in .askApp }
            try await resolve(intent.offset, store, worker, &random)
        }
    }

    /// Settles the conflict of the intent at `offset` with a decision drawn
    /// from `random`, reporting `try` before and `ack` after.
    private static func resolve(_ offset: UInt64, _ store: Store, _ worker: Worker, _ random: inout SeededRandom) async throws {
        let decisions: [ConflictDecision] = [
            .keepLocal, .keepRemote, .merged(["key": .string("merged-\(offset)")]), .custom(["key": .string("custom-\(offset)")]), .custom(nil),
        ]
        let decision = decisions[Int.random(in: 0..<decisions.count, using: &random)]
        worker.reporter.send("try", [String(offset)])
        // The lie: a resolution acknowledged that was never made.
        if worker.reporter.lie("ack", [String(offset)]) { return }
        try await store.resolveConflict(intentOffset: offset, decision)
        worker.reporter.send("ack", [String(offset)])
    }

    /// Every acknowledged resolution is in the log and its conflict waits
    /// no more; every other tried one is in the log with its conflict gone,
    /// or not there with its conflict waiting; and `conflicts()` lists
    /// exactly the conflicts the log leaves waiting (`Store.verify` then
    /// compares every table with a replay).
    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        var recorded = Set<UInt64>()
        var resolved = Set<UInt64>()
        for entry in log {
            guard case .conflict(let conflict) = entry.body else { continue }
            if conflict.resolution == .pending { recorded.insert(conflict.intentOffset) } else { resolved.insert(conflict.intentOffset) }
        }
        let waiting = Set(try store.conflicts().map(\.conflict.intentOffset))
        let expected = recorded.subtracting(resolved)
        for offset in expected.subtracting(waiting).sorted().prefix(StoreCheck.differencesShownMax) {
            context.violation("conflicts(): the conflict of intent \(offset) waits in the log but is not listed")
        }
        for offset in waiting.subtracting(expected).sorted().prefix(StoreCheck.differencesShownMax) {
            context.violation("conflicts(): the conflict of intent \(offset) is listed, but the log \(resolved.contains(offset) ? "resolves it" : "has none")")
        }
        let acknowledged = ledger.reports.filter { $0.verb == "ack" }.compactMap { $0.words.first.flatMap(UInt64.init) }
        for offset in acknowledged where !resolved.contains(offset) {
            context.violation("the acknowledged resolution of the conflict of intent \(offset) is not in the log")
        }
        for offset in ledger.reports.filter({ $0.verb == "try" }).compactMap({ $0.words.first.flatMap(UInt64.init) })
        where !recorded.contains(offset) {
            context.violation("a resolution was tried for intent \(offset), whose conflict the log never recorded")
        }
        return acknowledged.count
    }
}
