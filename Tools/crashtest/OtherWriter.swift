import LogFormat
import LogTesting
import Synchronization

/// A second client of the sync workload's server: the harness itself,
/// pushing straight over HTTP while the worker runs, so that the worker's
/// pulls bring changes it did not make. It writes entities of its own type
/// only (creates, updates, deletes, and creates again after a delete), so
/// no conflict arises and it knows what the server must hold for each.
struct OtherWriter: Sendable {
    static let entityType = "ow"
    /// Entities it writes, again and again.
    static let entityCount = 5
    static let operationsPerPushMax = 2
    /// The longest pause before each push, in milliseconds.
    static let pauseMillisecondsMax = 30

    /// An entity as the server must hold it: its version, and its fields
    /// (nil once deleted).
    struct State: Sendable, Equatable {
        var version: UInt64
        var fields: Fields?
    }

    private(set) var entities: [String: State] = [:]
    /// Operations the server answered `applied`.
    private(set) var appliedCount = 0
    /// False once a push went unanswered or was not applied as expected:
    /// what the server holds is not known from then on.
    private(set) var knowsServer = true
    private var problems: [String] = []
    private var keyCount = 0

    /// What went wrong since the last call, for violations.
    mutating func takeProblems() -> [String] {
        defer { problems = [] }
        return problems
    }

    /// Pushes after a random pause each time until `stop` is set. A push is
    /// never cut off: each one waits for its answer.
    mutating func push(to client: ServerClient, seed: UInt64, until stop: StopFlag) async {
        var random = SeededRandom(seed: seed)
        for _ in 0..<Worker.writeCountMax {
            try? await Task.sleep(for: .milliseconds(Int.random(in: 1...OtherWriter.pauseMillisecondsMax, using: &random)))
            guard !stop.isSet, knowsServer else { return }
            await pushOnce(client, &random)
        }
    }

    private mutating func pushOnce(_ client: ServerClient, _ random: inout SeededRandom) async {
        let count = Int.random(in: 1...OtherWriter.operationsPerPushMax, using: &random)
        let ids = (0..<OtherWriter.entityCount).map { "ow_\($0)" }.shuffled(using: &random).prefix(count)
        let operations = ids.map { operation(on: $0, &random) }
        let results: [PushResult]
        do {
            results = try await client.push(operations)
        } catch {
            problems.append("the other writer's push to the sync server failed: \(error)")
            knowsServer = false
            return
        }
        for (operation, result) in zip(operations, results) {
            let version = (entities[operation.entityID]?.version ?? 0) + 1
            guard result.status == .applied, result.serverVersion == version else {
                problems.append(
                    "the other writer's \(operation.intent) of \(OtherWriter.entityType)/\(operation.entityID) answered \(ServerWorkload.describe(result)), not applied at version \(version)")
                knowsServer = false
                continue
            }
            entities[operation.entityID] = State(version: version, fields: operation.data)
            appliedCount += 1
        }
    }

    /// A create when the entity does not exist (or no longer does), else an
    /// update, or one time in four a delete.
    private mutating func operation(on id: String, _ random: inout SeededRandom) -> PushOperation {
        keyCount += 1
        let key = "ow-\(keyCount)"
        let state = entities[id]
        let intent: PushOperation.Intent =
            state?.fields == nil ? .create : Int.random(in: 0..<4, using: &random) == 0 ? .delete : .update
        return PushOperation(
            idempotencyKey: key, entityType: OtherWriter.entityType, entityID: id, intent: intent,
            data: intent == .delete ? nil : Payload.fields(key: key), clientTimestamp: "2026-01-01T00:00:00.000000Z",
            baseVersion: state?.version ?? 0)
    }

    /// The server's feed must have one change for each operation it applied
    /// (unless `compacted`: then only the latest of each entity is sure to
    /// be there), and leave each entity as the writer knows it.
    func check(_ feed: [PullChange], compacted: Bool, _ context: inout IterationContext) {
        guard knowsServer else { return }
        var last: [String: PullChange] = [:]
        var count = 0
        for change in feed where change.entityType == OtherWriter.entityType {
            count += 1
            last[change.entityID] = change
        }
        if !compacted, count != appliedCount {
            context.violation("the server's feed has \(count) changes of the other writer's entities, which had \(appliedCount) operations applied")
        }
        for (id, state) in entities.sorted(by: { $0.key < $1.key }) {
            let change = last[id]
            let fields = change?.operation == .upsert ? change?.data : nil
            if change?.serverVersion != state.version || fields != state.fields {
                let found = change.map { "\($0.operation) at version \($0.serverVersion)" } ?? "nothing"
                context.violation(
                    "\(OtherWriter.entityType)/\(id): the other writer left it \(state.fields == nil ? "deleted" : "written") at version \(state.version), the server's feed has \(found)\(change?.serverVersion == state.version ? " with other fields" : "")")
            }
        }
    }

    /// A writer pushing in a task of its own while the worker runs.
    struct Run {
        private let stopFlag = StopFlag()
        private let task: Task<OtherWriter, Never>

        init(_ writer: OtherWriter, to client: ServerClient, seed: UInt64) {
            let stopFlag = stopFlag
            task = Task {
                var writer = writer
                await writer.push(to: client, seed: seed, until: stopFlag)
                return writer
            }
        }

        /// Stops it after the push under way, and returns the writer with
        /// what it learned.
        func stop() async -> OtherWriter {
            stopFlag.set()
            return await task.value
        }
    }
}

/// A flag one task sets and another reads.
final class StopFlag: Sendable {
    private let flag = Mutex(false)

    func set() { flag.withLock { $0 = true } }
    var isSet: Bool { flag.withLock { $0 } }
}
