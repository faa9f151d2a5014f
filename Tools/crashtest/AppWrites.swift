import LogFormat
import LogStore
import LogTesting

/// One operation of an app batch, as reported: `c:ID:SEQ` (create),
/// `u:ID:SEQ` (update) or `d:ID:SEQ` (delete). SEQ counts the operations
/// of one writer task, so an entity's operations have rising numbers.
struct AppOperation: Hashable, Sendable {
    enum Kind: String, Sendable {
        case create = "c", update = "u", delete = "d"
    }

    static let entityType = "te"

    var kind: Kind
    var id: String
    var sequence: Int

    init(_ kind: Kind, id: String, sequence: Int) {
        self.kind = kind
        self.id = id
        self.sequence = sequence
    }

    init?(word: String) {
        let parts = word.split(separator: ":").map(String.init)
        guard parts.count == 3, let kind = Kind(rawValue: parts[0]), let sequence = Int(parts[2]) else { return nil }
        self.init(kind, id: parts[1], sequence: sequence)
    }

    var word: String { "\(kind.rawValue):\(id):\(sequence)" }

    /// What the parent finds the operation's intent by: the `key` field a
    /// create or update writes, or the id for a delete (an entity is
    /// deleted at most once).
    var identity: String { kind == .delete ? "\(id)#delete" : "\(id)#\(sequence)" }

    static func identity(of intent: Intent) -> String? {
        if intent.operation == .delete { return "\(intent.entityID)#delete" }
        guard case .string(let key)? = intent.fields["key"] else { return nil }
        return key
    }

    /// The sequence number in a create's or update's identity (`ID#SEQ`);
    /// nil for a delete's.
    static func sequence(ofIdentity identity: String) -> Int? {
        identity.split(separator: "#").last.flatMap { Int($0) }
    }

    /// The fields the operation writes (for an update, the changes).
    var fields: Fields {
        switch kind {
        case .create: Payload.fields(key: identity)
        case .update: ["key": .string(identity), "update": .int(Int64(sequence))]
        case .delete: [:]
        }
    }

    var intentOperation: Intent.Operation {
        switch kind {
        case .create: .create
        case .update: .update
        case .delete: .delete
        }
    }

    /// The entity's fields after this operation, as the app must see them.
    func applied(to state: Fields?) -> Fields? {
        switch kind {
        case .create: fields
        case .update: state?.merging(fields)
        case .delete: nil
        }
    }
}

/// One writer task of app-style writes: each `writeBatch` commits one
/// `WriteBatch` of creates, updates and deletes on entities only this task
/// writes (each entity at most once per batch), reporting `try BATCH OP...`
/// before the call and `ack BATCH` after it returned.
struct AppWriter {
    /// Entities a writer keeps to update and delete; past this it only
    /// updates and deletes.
    static let aliveCountMax = 4

    let task: Int
    let tag: String
    /// Only creates (for workloads that settle or compact what they write).
    let createsOnly: Bool
    /// The most operations in one batch.
    let operationsMax: Int
    /// The id and operations of the batch last tried.
    private(set) var lastBatch: (id: String, operations: [AppOperation]) = ("", [])
    private var random: SeededRandom
    private var alive: [String] = []
    /// `alive` before the last batch was planned.
    private var aliveBeforeLastBatch: [String] = []
    private var created = 0
    private var batches = 0
    private var sequence = 0

    init(task: Int, worker: Worker, createsOnly: Bool = false, operationsMax: Int = 3) {
        self.task = task
        tag = worker.tag
        self.createsOnly = createsOnly
        self.operationsMax = operationsMax
        random = SeededRandom(seed: worker.seed &+ UInt64(task) &* 0x9E37)
    }

    /// A worker loop that writes batches until the worker ends, pausing
    /// up to `pauseMillisecondsMax` after each.
    static func loop(task: Int, _ store: Store, _ worker: Worker, createsOnly: Bool = false, pauseMillisecondsMax: Int = 0) -> Worker.Loop {
        {
            var writer = AppWriter(task: task, worker: worker, createsOnly: createsOnly)
            var pauses = SeededRandom(seed: ~worker.seed &+ UInt64(task))
            for _ in 0..<worker.writesMax {
                try await writer.writeBatch(store, worker)
                if pauseMillisecondsMax > 0 {
                    try await Task.sleep(for: .milliseconds(Int.random(in: 0...pauseMillisecondsMax, using: &pauses)))
                }
            }
        }
    }

    mutating func writeBatch(_ store: Store, _ worker: Worker) async throws {
        let count = Int.random(in: 1...operationsMax, using: &random)
        aliveBeforeLastBatch = alive
        var operations: [AppOperation] = []
        for _ in 0..<count { operations.append(nextOperation(avoiding: Set(operations.map(\.id)))) }
        let id = "\(tag)-\(task)-\(batches)"
        batches += 1
        lastBatch = (id, operations)
        worker.reporter.send("try", [id] + operations.map(\.word))
        // The lie: a batch acknowledged that was never written.
        if worker.reporter.lie("ack", [id]) { return }
        var batch = WriteBatch()
        for operation in operations {
            switch operation.kind {
            case .create: try batch.create(type: AppOperation.entityType, id: operation.id, fields: operation.fields)
            case .update: try batch.update(type: AppOperation.entityType, id: operation.id, changes: operation.fields)
            case .delete: try batch.delete(type: AppOperation.entityType, id: operation.id)
            }
        }
        try await store.write(batch)
        worker.reporter.send("ack", [id])
    }

    /// Leaves the entities of the last batch, which failed, alone from now
    /// on: what it created does not exist, and a later delete of one it
    /// deleted would be taken for its own (a delete is known by its
    /// entity alone).
    mutating func forgetLastBatch() {
        let touched = Set(lastBatch.operations.map(\.id))
        alive = aliveBeforeLastBatch.filter { !touched.contains($0) }
    }

    /// A create, or an update or delete of a living entity not in `taken`.
    private mutating func nextOperation(avoiding taken: Set<String>) -> AppOperation {
        sequence += 1
        let candidates = alive.filter { !taken.contains($0) }
        let roll = Int.random(in: 0..<4, using: &random)
        if createsOnly || candidates.isEmpty || (roll == 0 && alive.count < AppWriter.aliveCountMax) {
            let id = "te_\(tag)_\(task)_\(created)"
            created += 1
            alive.append(id)
            return AppOperation(.create, id: id, sequence: sequence)
        }
        let id = candidates[Int.random(in: 0..<candidates.count, using: &random)]
        if roll == 3 {
            alive.removeAll { $0 == id }
            return AppOperation(.delete, id: id, sequence: sequence)
        }
        return AppOperation(.update, id: id, sequence: sequence)
    }
}
