import Foundation
import LMDB
import LogFormat

/// Who is calling: the user a bearer token maps to.
public struct Identity: Sendable, Equatable {
    public var user: String
    /// A read-only user may pull but every pushed operation is refused.
    public var readOnly: Bool

    public init(user: String, readOnly: Bool = false) {
        self.user = user
        self.readOnly = readOnly
    }
}

/// A request-level failure, answered with the error envelope.
public struct ServiceError: Error, Equatable, CustomStringConvertible {
    public var code: WireErrorCode
    public var message: String
    /// Seconds for a `Retry-After` header (429, 503).
    public var retryAfter: Int?

    public init(_ code: WireErrorCode, _ message: String, retryAfter: Int? = nil) {
        self.code = code
        self.message = message
        self.retryAfter = retryAfter
    }

    public var description: String { "\(code): \(message)" }
}

/// The protocol's semantics over `ServerStorage`, with no HTTP in it: push
/// applies each operation on its own, pull pages the caller's change feed.
final class SyncService: Sendable {
    let storage: ServerStorage
    /// Microseconds since the Unix epoch (injected for tests).
    let clock: @Sendable () -> Int64

    init(storage: ServerStorage, clock: @escaping @Sendable () -> Int64) {
        self.storage = storage
        self.clock = clock
    }

    var serverID: String { storage.serverID.ulidString }

    // MARK: Push

    /// Applies the operations in one transaction, each on its own, and
    /// answers once it has committed: one result per operation, in order.
    func push(_ request: ReceivedPush, as identity: Identity) async throws -> PushResponse {
        guard (1...Wire.pushOperationCountMax).contains(request.operations.count) else {
            throw ServiceError(
                .validationError, "a push carries 1 to \(Wire.pushOperationCountMax) operations, not \(request.operations.count)")
        }
        let checked = request.operations.map { received -> (key: String, operation: PushOperation?, problem: String?) in
            guard let operation = received.operation else { return (received.idempotencyKey, nil, received.problem) }
            return (operation.idempotencyKey, operation, SyncService.problem(with: operation))
        }
        let now = clock()
        let clientID = request.clientID
        let results = try await storage.write { txn in
            let user = try self.storage.userNumberCreating(identity.user, txn)
            return try checked.map { key, operation, problem -> PushResult in
                if identity.readOnly { return .rejected(key, .permissionDenied, "user \(identity.user) may not change data") }
                guard let operation, problem == nil else {
                    return .rejected(key, .validationError, problem ?? "the operation is malformed")
                }
                return try self.apply(operation, user: user, clientID: clientID, now: now, txn)
            }
        }
        return PushResponse(results: results)
    }

    /// What is wrong with an operation before it meets any state, or nil.
    static func problem(with operation: PushOperation) -> String? {
        if let problem = NameRules.idempotencyKeyProblem(operation.idempotencyKey)
            ?? NameRules.entityTypeProblem(operation.entityType) ?? NameRules.entityIDProblem(operation.entityID)
        {
            return problem
        }
        switch operation.intent {
        case .create, .update:
            guard let data = operation.data else { return "\(operation.intent) of \(operation.entityID) has no data" }
            return NameRules.fieldsProblem(data)
        case .delete:
            return nil
        }
    }

    private func apply(
        _ operation: PushOperation, user: UInt32, clientID: String?, now: Int64, _ txn: borrowing Transaction
    ) throws -> PushResult {
        let key = operation.idempotencyKey
        let idempotencyKey = ServerStorage.idempotencyKey(user, key)
        if let version = try txn.get(storage.idempotency, key: idempotencyKey).flatMap(ServerStorage.u64) {
            return .applied(key, version: version, duplicate: true)
        }
        let entityKey = ServerStorage.entityKey(user, operation.entityType, operation.entityID)
        let before = try loadState(entityKey, txn) ?? EntityState()
        let outcome = SyncService.decide(operation, before: before, clientID: clientID, now: now)
        guard case .success(let after) = outcome else {
            if case .failure(let rejection) = outcome { return rejection.result(key) }
            preconditionFailure("a decision is a state or a rejection")
        }
        try txn.put(storage.entities, key: entityKey, value: after.encoded())
        try appendChange(operation, after, user: user, txn)
        try txn.put(storage.idempotency, key: idempotencyKey, value: ServerStorage.bytes(after.version))
        return .applied(key, version: after.version)
    }

    struct Rejection: Error {
        var code: WireErrorCode
        var message: String
        var state: ServerState?

        func result(_ key: String) -> PushResult { .rejected(key, code, message, state: state) }
    }

    /// The protocol's rules for one operation on an entity's state: the new
    /// state, or why not. A field conflicts when the server changed it after
    /// the operation's base version and the change came from another replica
    /// (an unnamed replica is another replica to everyone).
    static func decide(_ operation: PushOperation, before: EntityState, clientID: String?, now: Int64)
        -> Result<EntityState, Rejection>
    {
        let name = "\(operation.entityType)/\(operation.entityID)"
        let changedByOthers = { (field: String) -> Bool in
            (before.fieldVersions[field] ?? 0) > operation.baseVersion
                && (clientID == nil || before.fieldClients[field] != clientID)
        }
        var after = before
        after.version = before.version + 1
        after.updatedAt = now
        after.lastClient = clientID ?? ""
        let data = operation.data ?? [:]
        switch operation.intent {
        case .create:
            guard !before.exists else {
                return .failure(Rejection(code: .conflict, message: "\(name) already exists", state: before.serverState))
            }
            after.deleted = false
            after.fields = data
            after.fieldVersions = Dictionary(uniqueKeysWithValues: data.map { ($0.name, after.version) })
            after.fieldClients = Dictionary(uniqueKeysWithValues: data.map { ($0.name, clientID ?? "") })
        case .update:
            guard before.exists else { return .failure(Rejection(code: .entityNotFound, message: "no \(name) to update")) }
            let conflicting = data.map(\.name).filter(changedByOthers)
            guard conflicting.isEmpty else {
                return .failure(
                    Rejection(
                        code: .conflict,
                        message: "\(name): \(conflicting.joined(separator: ", ")) changed on the server after version \(operation.baseVersion)",
                        state: before.serverState))
            }
            after.fields = before.fields.merging(data)
            for field in data {
                after.fieldVersions[field.name] = after.version
                after.fieldClients[field.name] = clientID ?? ""
            }
        case .delete:
            guard before.exists else { return .failure(Rejection(code: .entityNotFound, message: "no \(name) to delete")) }
            let changed = before.fieldVersions.keys.filter(changedByOthers)
            let lastByOther = before.version > operation.baseVersion && (clientID == nil || before.lastClient != clientID)
            guard changed.isEmpty && !lastByOther else {
                return .failure(
                    Rejection(
                        code: .conflict, message: "\(name) changed on the server after version \(operation.baseVersion)",
                        state: before.serverState))
            }
            after.deleted = true
            after.fields = [:]
            after.fieldVersions = [:]
            after.fieldClients = [:]
        }
        return .success(after)
    }

    private func appendChange(_ operation: PushOperation, _ state: EntityState, user: UInt32, _ txn: borrowing Transaction) throws {
        let offset = try storage.takeOffset(txn)
        let change = Remote(
            cursor: "", state.deleted ? .delete : .upsert, entityType: operation.entityType, entityID: operation.entityID,
            serverVersion: state.version, fields: state.fields)
        let milliseconds = UInt64(max(0, state.updatedAt / 1000))
        let entry = Entry(
            offset: offset, timestamp: HybridTimestamp(milliseconds: min(milliseconds, (1 << 48) - 1), logical: 0),
            body: .remote(change))
        try txn.put(storage.changes, key: ServerStorage.changeKey(user, offset), value: try EntryCodec.encode(entry))
    }

    func loadState(_ key: [UInt8], _ txn: borrowing Transaction) throws -> EntityState? {
        try key.withUnsafeBytes { raw in
            try txn.withValue(storage.entities, key: raw) { value in
                do {
                    return try EntityState(decoding: value)
                } catch {
                    throw ServiceError(.internalError, "stored state of an entity is damaged: \(error)")
                }
            }
        }
    }
}

/// A push as received: operations that do not decode become per-operation
/// validation errors (with what can be read of their key), so one malformed
/// operation never fails the batch. The body as a whole must still be JSON
/// with an `operations` array.
struct ReceivedPush: Decodable, Sendable {
    var clientID: String?
    var operations: [ReceivedOperation]

    enum CodingKeys: String, CodingKey {
        case clientID = "client_id"
        case operations
    }
}

struct ReceivedOperation: Decodable, Sendable {
    var operation: PushOperation?
    var idempotencyKey: String
    var problem: String?

    init(from decoder: any Decoder) throws {
        do {
            let operation = try PushOperation(from: decoder)
            self.operation = operation
            idempotencyKey = operation.idempotencyKey
        } catch {
            let keyed = try? decoder.container(keyedBy: PushOperation.CodingKeys.self)
            idempotencyKey = (try? keyed?.decode(String.self, forKey: .idempotencyKey)) ?? ""
            problem = "operation \(idempotencyKey.isEmpty ? "without a key" : idempotencyKey): \(describeDecoding(error))"
        }
    }
}

/// A decoding error in a sentence that names where.
func describeDecoding(_ error: any Error) -> String {
    guard let error = error as? DecodingError else { return "\(error)" }
    let path = { (context: DecodingError.Context) in
        context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? ".\($0.stringValue)" }.joined()
    }
    switch error {
    case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context):
        return "\(path(context)): \(context.debugDescription)"
    case .keyNotFound(let key, let context):
        return "\(path(context)).\(key.stringValue) is missing"
    @unknown default:
        return "\(error)"
    }
}
