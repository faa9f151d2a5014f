import LogFormat
import LogServer
import LogStore
import LogSync
import LogTesting
import Synchronization
import Testing

/// Three replicas of one user edit offline at random (creates, field
/// updates, deletes, on the same entities), sync through the real server
/// while it fails requests, drops answers after applying pushes and forces
/// resyncs, and restart and compact their logs now and then. Once everything has synced until
/// quiet, every replica and the server hold the same entities, and every
/// intent any replica wrote was acknowledged or rejected with an event.
///
/// `SEED=n swift test --filter ConvergenceTests` replays one seed's run as
/// seed 0 does (the run of seed `s` uses `SEED + s`).
@Suite struct ConvergenceTests {
    static let seedCount = 50
    static let baseSeed = SeededRandom.seed(default: 5_000)

    @Test(arguments: 0..<seedCount)
    func replicasConvergeUnderFaults(seed: Int) async throws {
        let seed = ConvergenceTests.baseSeed + UInt64(seed)
        var run = try await ConvergenceRun(seed: seed)
        try await run.editAndSyncUnderFaults(rounds: 6)
        try await run.syncUntilQuiet()
        try await run.checkConverged()
        // The server lost nothing, so no pull may have found it did.
        for replica in run.replicas {
            #expect(replica.lostChanges.isEmpty, "seed \(seed): \(replica.lostChanges.prefix(3))")
        }
        try await run.checkEveryIntentSettled()
        await run.server.stop()
    }

    static let restoreSeedCount = 20

    /// As above, but midway the operator stops the server, puts back the
    /// backup it took earlier in the run, and serves it again; the replicas
    /// go on editing and syncing, through the same faults.
    ///
    /// What the protocol promises then (sections 8 to 10): the restored
    /// store has the server's ID, so a cursor it still holds the change of
    /// goes on, and any other (past its feed's end, or at a place where it
    /// now holds another change) is answered 410, after which the client
    /// forgets its confirmed state and cursor, keeps its pending intents and
    /// pulls the whole feed again. An intent still pending is pushed again
    /// with its key, which the restored store may have forgotten, and is
    /// applied once more. A change acknowledged before the restore and lost
    /// with it is lost: `applied` promises a change survives a crash, not an
    /// operator putting back an older store, and no client pushes an
    /// acknowledged intent again. So once quiet, every replica holds exactly
    /// the server's state (an acknowledged change the server lost included:
    /// no replica may keep it), every run completes, and every intent has
    /// exactly one answer.
    @Test(arguments: 0..<restoreSeedCount)
    func replicasConvergeAfterServerRestore(seed: Int) async throws {
        let seed = ConvergenceTests.baseSeed + 100_000 + UInt64(seed)
        var run = try await ConvergenceRun(seed: seed)
        let backup = run.server.directory.appending("backup")
        try await run.editAndSyncUnderFaults(rounds: 2)
        try await run.server.backUp(to: backup)
        try run.reconnect()
        try await run.editAndSyncUnderFaults(rounds: 3)
        try await run.server.restore(from: backup)
        try run.reconnect()
        try await run.editAndSyncUnderFaults(rounds: 3)
        try await run.syncUntilQuiet()
        try await run.checkConverged()
        try await run.checkEveryIntentSettled()
        await run.server.stop()
    }
}

/// The entity types of the run, one per conflict strategy; `memo`
/// conflicts wait for the app, which the run plays.
private let strategies: [String: ConflictStrategy] = [
    "task": .keepLocal, "note": .keepRemote, "tag": .fieldMerge(prefer: .local), "card": .fieldMerge(prefer: .remote),
    "doc": .newerWins(field: "stamp"), "memo": .askApp,
]
private let types = strategies.keys.sorted()

/// Collects a store's events from the moment it opens until it closes.
private final class EventCollector: Sendable {
    private let rejected = Mutex<Set<UInt64>>([])
    private let drains = Mutex<[Task<Void, Never>]>([])

    func attach(_ store: Store) {
        let events = store.events()
        let drain = Task {
            for await event in events {
                if case .rejected(let intent) = event { _ = self.rejected.withLock { $0.insert(intent.intentOffset) } }
            }
        }
        drains.withLock { $0.append(drain) }
    }

    /// The rejected intents heard of; call after the store closed.
    func rejectedOffsets() async -> Set<UInt64> {
        for drain in drains.withLock({ $0 }) { await drain.value }
        return rejected.withLock { $0 }
    }
}

private struct ConvergenceRun {
    let seed: UInt64
    var random: SeededRandom
    let server: TestServer
    let replicas: [Replica]
    let collectors: [EventCollector]
    /// A counter for `doc`'s `stamp`, so newer-wins has an order to follow.
    var stamp: Int64 = 0

    init(seed: UInt64) async throws {
        self.seed = seed
        random = SeededRandom(seed: seed)
        server = try await TestServer("converge-\(seed)")
        var configuration = SyncConfiguration()
        configuration.conflictStrategies = strategies
        // Small batches and pages, so runs span several of each.
        configuration.pushBatchCountMax = 4
        configuration.pullPageCountMax = 5
        var replicas: [Replica] = []
        var collectors: [EventCollector] = []
        for name in ["a", "b", "c"] {
            let replica = try Replica("\(name)-\(seed)", server: server, configuration: configuration)
            let collector = EventCollector()
            collector.attach(replica.store)
            replicas.append(replica)
            collectors.append(collector)
        }
        self.replicas = replicas
        self.collectors = collectors
    }

    func failure(_ message: String) -> SyncTestError { SyncTestError("seed \(seed): \(message)") }

    // MARK: - Editing and faults

    mutating func editAndSyncUnderFaults(rounds: Int) async throws {
        for _ in 0..<rounds {
            for index in replicas.indices {
                for _ in 0..<Int.random(in: 0...6, using: &random) { try await edit(replicas[index]) }
            }
            try await injectFault()
            // Some replicas sync, in a random order; the others stay offline.
            for index in replicas.indices.shuffled(using: &random) where Bool.random(using: &random) {
                if Int.random(in: 0..<8, using: &random) == 0 { try restart(index) }
                if Int.random(in: 0..<6, using: &random) == 0 { try await compact(replicas[index]) }
                try await resolveWaitingConflicts(replicas[index])
                await replicas[index].sync()
                replicas[index].clock.advance(by: UInt64.random(in: 0...400_000, using: &random))
            }
        }
        try await server.faults(FaultSettings(failNext: 0, dropAfterPush: 0))
    }

    /// One random offline edit: a create, or an update or delete of an
    /// entity this replica sees (often one another replica also edits).
    mutating func edit(_ replica: Replica) async throws {
        let type = types.randomElement(using: &random)!
        let visible = try replica.store.all(type: type, limit: 50)
        let choice = Int.random(in: 0..<10, using: &random)
        if visible.isEmpty || choice < 3 {
            try await replica.store.create(type: type, fields: randomFields(all: true))
        } else if choice < 8 {
            let target = visible.randomElement(using: &random)!
            try await replica.store.update(type: type, id: target.id, changes: randomFields(all: false))
        } else {
            try await replica.store.delete(type: type, id: visible.randomElement(using: &random)!.id)
        }
    }

    mutating func randomFields(all: Bool) -> Fields {
        stamp += 1
        var fields: [(String, Value)] = [("stamp", .int(stamp))]
        let words = ["milk", "bread", "dentist", "mum", "bike", "tax"]
        if all || Bool.random(using: &random) { fields.append(("title", .string(words.randomElement(using: &random)!))) }
        if all || Bool.random(using: &random) { fields.append(("n", .int(Int64.random(in: -5...5, using: &random)))) }
        if Int.random(in: 0..<4, using: &random) == 0 { fields.append(("done", .bool(Bool.random(using: &random)))) }
        return Fields(fields)
    }

    /// Sets the server's faults for the coming syncs: mostly none, or
    /// failed requests (500, 503, 429), answers lost after applying, or a
    /// forced resync of every client.
    mutating func injectFault() async throws {
        switch Int.random(in: 0..<10, using: &random) {
        case 0, 1:
            let status = [500, 503, 429].randomElement(using: &random)!
            try await server.faults(FaultSettings(failNext: Int.random(in: 1...4, using: &random), status: status))
        case 2, 3: try await server.faults(FaultSettings(dropAfterPush: Int.random(in: 1...2, using: &random)))
        case 4: try await server.forceResync()
        default: try await server.faults(FaultSettings(failNext: 0, dropAfterPush: 0))
        }
    }

    /// Points every replica at the server, which serves on a new port.
    func reconnect() throws {
        for replica in replicas { try replica.connect(to: server) }
    }

    /// Closes the store and opens it again, as after a crash.
    func restart(_ index: Int) throws {
        try replicas[index].restart()
        collectors[index].attach(replicas[index].store)
    }

    /// Folds a random prefix of the log into snapshots.
    mutating func compact(_ replica: Replica) async throws {
        let last = try replica.store.log.lastOffset()
        guard last > 1 else { return }
        _ = try await replica.store.compact(below: UInt64.random(in: 1...last, using: &random))
    }

    /// The app's part for `memo`: each waiting conflict gets a decision.
    mutating func resolveWaitingConflicts(_ replica: Replica) async throws {
        for waiting in try replica.store.conflicts() {
            let decision: ConflictDecision = Bool.random(using: &random) ? .keepLocal : .keepRemote
            try await replica.store.resolveConflict(intentOffset: waiting.conflict.intentOffset, decision)
        }
    }

    // MARK: - Quiet and the checks

    /// Syncs every replica in turn until a whole pass pushed nothing and
    /// found nothing pending: then each pulled the server's final feed.
    mutating func syncUntilQuiet(passesMax: Int = 30) async throws {
        for _ in 0..<passesMax {
            var quiet = true
            for replica in replicas {
                try await resolveWaitingConflicts(replica)
                let report = await replica.sync()
                let summary = try replica.store.outboxSummary()
                let settled = report.acknowledged + report.rejected + report.retried
                if report.outcome != .completed || settled > 0 || summary.pendingCount + summary.failedCount > 0 {
                    quiet = false
                }
                // Past every retry and breaker wait.
                replica.clock.advance(by: 301_000)
            }
            if quiet { return }
        }
        throw failure("not quiet after \(passesMax) passes")
    }

    /// Every replica's entities of every type equal the server's latest
    /// state of each entity, fields and version, and nothing waits.
    func checkConverged() async throws {
        let feed = try await server.pullAll()
        var server: [String: [String: (Fields, UInt64)]] = [:]
        for change in feed {
            server[change.entityType, default: [:]][change.entityID] =
                change.operation == .upsert ? (change.data ?? [:], change.serverVersion) : nil
        }
        #expect(feed.count > 0, "seed \(seed): the run wrote nothing")
        for (replica, name) in zip(replicas, ["a", "b", "c"]) {
            #expect(try replica.store.conflicts().isEmpty, "seed \(seed): \(name) has conflicts waiting")
            for type in types {
                var entities: [String: (Fields, UInt64)] = [:]
                for entity in try replica.store.all(type: type, limit: 10_000) {
                    #expect(entity.pendingIntentCount == 0, "seed \(seed): \(name) \(type)/\(entity.id) still pending")
                    entities[entity.id] = (entity.fields, entity.serverVersion)
                }
                let expected = server[type] ?? [:]
                let mismatched = Set(entities.keys).union(expected.keys).sorted().filter { id in
                    entities[id]?.0 != expected[id]?.0 || entities[id]?.1 != expected[id]?.1
                }
                for id in mismatched.prefix(3) {
                    Issue.record(
                        "seed \(seed): \(name) \(type)/\(id) is \(String(describing: entities[id])), the server has \(String(describing: expected[id]))"
                    )
                }
            }
        }
    }

    /// Each intent in each replica's log has exactly one answer (an `ack`
    /// or a `reject`), and each reject was announced as a `.rejected` event.
    func checkEveryIntentSettled() async throws {
        for (index, name) in ["a", "b", "c"].enumerated() {
            let replica = replicas[index]
            let intents = Set(try replica.entries(.intent).map(\.offset))
            var answered: [UInt64: Int] = [:]
            var rejected: Set<UInt64> = []
            for entry in try replica.entries(.ack) + replica.entries(.reject) {
                switch entry.body {
                case .ack(let ack): answered[ack.intentOffset, default: 0] += 1
                case .reject(let reject):
                    answered[reject.intentOffset, default: 0] += 1
                    rejected.insert(reject.intentOffset)
                default: break
                }
            }
            let unanswered = intents.filter { answered[$0] == nil }.sorted()
            let twice = answered.filter { $0.value > 1 }.keys.sorted()
            // Compaction removes answered intents below its watermark, and
            // may keep an answer above it.
            let compactedBelow = try replica.store.compactedBelow()
            let strays = Set(answered.keys).subtracting(intents).filter { $0 >= compactedBelow }.sorted()
            #expect(unanswered.isEmpty, "seed \(seed): \(name)'s intents \(unanswered.prefix(5)) have no answer")
            #expect(twice.isEmpty, "seed \(seed): \(name)'s intents \(twice.prefix(5)) were answered twice")
            #expect(strays.isEmpty, "seed \(seed): \(name) answered offsets \(strays.prefix(5)) that are not intents")
            replica.store.close()
            let announced = await collectors[index].rejectedOffsets()
            let silent = rejected.subtracting(announced).sorted()
            #expect(silent.isEmpty, "seed \(seed): \(name)'s rejects of \(silent.prefix(5)) came with no event")
        }
    }
}
