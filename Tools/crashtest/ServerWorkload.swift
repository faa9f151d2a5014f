import Foundation
import LogFormat
import LogStore
import LogTesting

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The reference server killed with SIGKILL while clients push to it and
/// its operator compacts its feed: the parent is the client (over HTTP),
/// `syncserver` the process killed. After a restart, every push answered
/// `applied` must be in the feed, intact, once, pushing it again must
/// answer `duplicate`, and each type's pull must hold that type's changes,
/// and each scope's pull that scope's and those of entities in none.
///
/// Every pushed key creates an entity of its own (`te_KEY`), so the feed
/// holds exactly one change per key applied. Beside them an updater keeps
/// changing a few entities of type `tu`, whose superseded changes the
/// compactions drop: after a last compaction, each is in the feed once, at
/// a version its pushes made.
struct ServerWorkload: Workload {
    static let name = "server"
    static let summary = "syncserver killed during concurrent pushes and compactions; no applied push lost, none applied twice"

    /// Concurrent pushing clients.
    static let pusherCount = 4
    /// The most operations in one push.
    static let operationsPerPushMax = 20
    /// Keys acknowledged in earlier iterations that are pushed again after
    /// each restart (with all of this iteration's).
    static let repushSampleMax = 200

    let directory: String
    private var server: ServerProcess?
    /// Every key the server acknowledged as applied, in order.
    private var acknowledged: [String] = []

    init(directory: String) { self.directory = directory }

    static func operation(key: String) -> PushOperation {
        PushOperation(
            idempotencyKey: key, entityType: entityType(key: key), entityID: "te_\(key)", intent: .create,
            data: data(key: key), clientTimestamp: "2026-01-01T00:00:00.000000Z", baseVersion: 0)
    }

    /// The fields the operation `key` creates: its payload, and for two
    /// keys in three a scope (`scopes`) in the server's scope field.
    static func data(key: String) -> Fields {
        var fields = Payload.fields(key: key)
        if let scope = scope(key: key) { fields[ServerProcess.scopeField] = .string(scope) }
        return fields
    }

    /// The scopes the pushes put entities in, so that the pulls of one
    /// scope, which read the feed's index by scope, are checked against
    /// the feed.
    static let scopes = ["pa", "pb"]

    /// The scope of the operation `key`: one of `scopes`, or none.
    private static func scope(key: String) -> String? {
        let pick = Int(Payload.fnv1a(key) % UInt64(scopes.count + 1))
        return pick < scopes.count ? scopes[pick] : nil
    }

    /// The two types the pushes make, so that the pulls of one type, which
    /// read the feed's index by type, are checked against the feed.
    static let entityTypes = ["te", "tn"]

    /// The type of the operation `key`: one of `entityTypes`, by its bytes.
    private static func entityType(key: String) -> String {
        entityTypes[Int(key.utf8.reduce(0, &+)) % entityTypes.count]
    }

    mutating func iterate(_ context: inout IterationContext) async throws {
        guard let server = try await running(&context) else { return }
        let tag = String(context.workerSeed(), radix: 36)
        let delay = context.randomDelay()
        let pushes = await Self.pushUntilKilled(server, tag: tag, delay: delay)
        self.server = nil
        guard await server.child.waitForExit(timeout: ServerProcess.stopWaitMax) else {
            throw HarnessError("syncserver pid \(server.child.pid) did not end within \(ServerProcess.stopWaitMax) of SIGKILL")
        }
        if server.child.ending == .signal(SIGKILL) {
            context.tally.kills += 1
        } else {
            context.violation("syncserver ended with \(server.child.ending) before its kill: \(server.child.errorText)")
        }
        var applied = pushes.flatMap(\.applied)
        for problem in pushes.flatMap(\.problems) { context.violation(problem) }
        if context.options.injectViolation { applied.append("\(tag)-lie") }  // The lie: never pushed.
        context.tally.acknowledged += applied.count
        guard let restarted = try await running(&context) else { return }
        do {
            try await check(restarted.client, applied: applied, unknown: pushes.flatMap(\.unknown), &context)
            let updated = pushes.reduce(into: [String: ClosedRange<UInt64>]()) { $0.merge($1.updated) { $1 } }
            try await checkCompaction(restarted, updated: updated, &context)
        } catch {
            context.violation("the restarted syncserver failed: \(error)")
        }
    }

    mutating func finish() async {
        await server?.stop()
        server = nil
    }

    /// The server, started when none runs; nil (with a violation) when it
    /// does not come up on its data.
    private mutating func running(_ context: inout IterationContext) async throws -> ServerProcess? {
        if let server { return server }
        server = try await ServerProcess.start(data: directory, &context)
        return server
    }

    /// What one pushing client saw before the server died.
    struct Pushes: Sendable {
        /// Keys answered `applied`.
        var applied: [String] = []
        /// Keys of pushes without an answer: they may or may not be applied.
        var unknown: [String] = []
        /// The updater's entities: for each, the versions its latest change
        /// may have, from the last acknowledged to the last tried.
        var updated: [String: ClosedRange<UInt64>] = [:]
        var problems: [String] = []
    }

    /// The type of the entities the updater changes.
    static let updatedType = "tu"
    /// Entities the updater of one iteration changes, in turn.
    static let updatedEntityCount = 3

    /// Pushes from `pusherCount` clients until the server, killed after
    /// `delay`, stops answering.
    static func pushUntilKilled(_ server: ServerProcess, tag: String, delay: Duration) async -> [Pushes] {
        await withTaskGroup(of: Pushes?.self) { group in
            for client in 0..<pusherCount {
                group.addTask { await pushLoop(server.client, name: "\(tag)-\(client)") }
            }
            group.addTask {
                try? await Task.sleep(for: delay)
                server.child.kill()
                return nil
            }
            group.addTask { await updateLoop(server.client, tag: tag) }
            // Compactions meanwhile, so that kills land in them too.
            group.addTask {
                while (try? await server.admin.compact()) != nil {
                    try? await Task.sleep(for: .milliseconds(20))
                }
                return nil
            }
            var all: [Pushes] = []
            for await pushes in group { if let pushes { all.append(pushes) } }
            return all
        }
    }

    private static func pushLoop(_ client: ServerClient, name: String) async -> Pushes {
        var pushes = Pushes()
        var random = SeededRandom(seed: Payload.fnv1a(name))
        for number in 0..<Worker.writeCountMax {
            let keys = (0..<Int.random(in: 1...operationsPerPushMax, using: &random)).map { "\(name)-\(number)-\($0)" }
            let results: [PushResult]
            do {
                results = try await client.push(keys.map(operation(key:)))
            } catch {
                pushes.unknown += keys
                return pushes
            }
            for result in results {
                if result.status == .applied && result.serverVersion == 1 {
                    pushes.applied.append(result.idempotencyKey)
                } else {
                    pushes.problems.append("the first push of \(result.idempotencyKey) answered \(describe(result))")
                }
            }
        }
        return pushes
    }

    /// Creates `updatedEntityCount` entities and updates them in turn, one
    /// push each, until the server stops answering.
    private static func updateLoop(_ client: ServerClient, tag: String) async -> Pushes {
        var pushes = Pushes()
        var acked: [String: UInt64] = [:]
        for round in 0..<Worker.writeCountMax {
            let id = "tu_\(tag)_\(round % updatedEntityCount)"
            let version = acked[id] ?? 0
            let operation = PushOperation(
                idempotencyKey: "\(tag)-u\(round)", entityType: updatedType, entityID: id, intent: version == 0 ? .create : .update,
                data: ["round": .int(Int64(round))], clientTimestamp: "2026-01-01T00:00:00.000000Z", baseVersion: version)
            pushes.updated[id] = version...(version + 1)
            guard let result = try? await client.push([operation]).first else { return pushes }
            guard result.status == .applied, result.serverVersion == version + 1 else {
                pushes.problems.append("the update \(operation.idempotencyKey) of \(id) at version \(version) answered \(describe(result))")
                return pushes
            }
            acked[id] = version + 1
            pushes.updated[id] = (version + 1)...(version + 1)
        }
        return pushes
    }

    static func describe(_ result: PushResult) -> String {
        "\(result.status) (version \(result.serverVersion.map(String.init) ?? "none")\(result.errorCode.map { ", \($0): \(result.errorMessage ?? "")" } ?? ""))"
    }
}

// MARK: - Checks after a restart

extension ServerWorkload {
    /// Settles the pushes that had no answer, then checks the feed against
    /// every acknowledged key, then pushes acknowledged keys again.
    private mutating func check(_ client: ServerClient, applied: [String], unknown: [String], _ context: inout IterationContext) async throws {
        // A push without an answer may have been applied; pushing it again
        // says which (applied now, or duplicate), and either is an answer.
        for chunk in Self.chunks(unknown) {
            for result in try await client.push(chunk.map(Self.operation(key:))) {
                if result.status == .rejected || result.serverVersion != 1 {
                    context.violation("the repeated push of \(result.idempotencyKey), unanswered at the kill, answered \(Self.describe(result))")
                }
            }
        }
        let earlier = acknowledged
        acknowledged += applied + unknown
        context.tally.checks += acknowledged.count
        try await checkFeed(client, &context)
        var sample = earlier
        if earlier.count > Self.repushSampleMax {
            sample = (0..<Self.repushSampleMax).map { _ in earlier[Int.random(in: 0..<earlier.count, using: &context.random)] }
        }
        for chunk in Self.chunks(applied + sample) {
            for result in try await client.push(chunk.map(Self.operation(key:))) where result.status != .duplicate || result.serverVersion != 1 {
                let twice = result.status == .applied ? " (so it was applied twice)" : ""
                context.violation("the repeated push of \(result.idempotencyKey), acknowledged as applied, answered \(Self.describe(result))\(twice)")
            }
        }
    }

    /// After a compaction with nothing beside it, every updated entity is
    /// in the feed once (earlier iterations' too), and this iteration's at
    /// a version their pushes made: acknowledged, or tried at the kill (or
    /// not there at all when only its create was tried).
    private func checkCompaction(
        _ server: ServerProcess, updated: [String: ClosedRange<UInt64>], _ context: inout IterationContext
    ) async throws {
        _ = try await server.admin.compact()
        var versions: [String: [UInt64]] = [:]
        for change in try await server.client.pullAll() where change.entityType == Self.updatedType {
            versions[change.entityID, default: []].append(change.serverVersion)
        }
        for (id, found) in versions.sorted(by: { $0.key < $1.key }) where found.count != 1 {
            context.violation("after a compaction, the feed has \(id) \(found.count) times (versions \(found))")
        }
        for (id, range) in updated.sorted(by: { $0.key < $1.key }) {
            guard let found = versions[id]?.first else {
                if range.lowerBound > 0 { context.violation("after a compaction, the feed lacks \(id), acknowledged at version \(range.lowerBound)") }
                continue
            }
            if !range.contains(found) {
                context.violation("after a compaction, the feed has \(id) at version \(found), where its pushes made \(range)")
            }
        }
    }

    /// The feed holds one change per acknowledged key, with its data, and
    /// nothing else but the updated entities' changes; a pull of one type
    /// holds its changes, a pull of one scope those of its entities and of
    /// entities in none (the updated ones), and a pull of both what both
    /// allow, in the feed's order.
    private func checkFeed(_ client: ServerClient, _ context: inout IterationContext) async throws {
        let all = try await client.pullAll()
        func inScope(_ change: PullChange, _ scope: String) -> Bool {
            guard case .string(let its)? = change.data?[ServerProcess.scopeField] else { return true }
            return its == scope
        }
        for type in Self.entityTypes + [Self.updatedType] {
            let typed = try await client.pullAll(types: [type]).map(\.entityID)
            let expected = all.filter { $0.entityType == type }.map(\.entityID)
            if typed != expected {
                context.violation("the pull of type \(type) has \(typed.count) changes, the feed \(expected.count) of that type, or in another order")
            }
        }
        for scope in Self.scopes {
            let scoped = try await client.pullAll(scopes: [scope]).map(\.entityID)
            let expected = all.filter { inScope($0, scope) }.map(\.entityID)
            if scoped != expected {
                context.violation("the pull of scope \(scope) has \(scoped.count) changes, the feed \(expected.count) of that scope or none, or in another order")
            }
            let type = Self.entityTypes[0]
            let both = try await client.pullAll(types: [type], scopes: [scope]).map(\.entityID)
            if both != all.filter({ $0.entityType == type && inScope($0, scope) }).map(\.entityID) {
                context.violation("the pull of type \(type) in scope \(scope) has \(both.count) changes, not the feed's of both, in order")
            }
        }
        var feed: [String: PullChange] = [:]
        for change in all where change.entityType != Self.updatedType {
            if feed.updateValue(change, forKey: change.entityID) != nil {
                context.violation("the feed has \(change.entityID) twice")
            }
        }
        for key in acknowledged {
            guard let change = feed.removeValue(forKey: "te_\(key)") else {
                context.violation("the acknowledged push of \(key) is not in the server's feed")
                continue
            }
            if change.operation != .upsert || change.data != Self.data(key: key) || change.serverVersion != 1 {
                context.violation("the feed's change for \(key) is not what was pushed (version \(change.serverVersion))")
            }
        }
        for id in feed.keys.sorted().prefix(StoreCheck.differencesShownMax) {
            context.violation("the feed has \(id), which was never pushed")
        }
    }

    private static func chunks(_ keys: [String]) -> [[String]] {
        stride(from: 0, to: keys.count, by: Wire.pushOperationCountMax).map {
            Array(keys[$0..<min($0 + Wire.pushOperationCountMax, keys.count)])
        }
    }
}
