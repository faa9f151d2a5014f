import Foundation
import LMDB
import LogFormat

/// Who is calling: the user a bearer token maps to.
public struct Identity: Sendable, Equatable {
    /// The longest user name in UTF-8 bytes: a name is a key of the
    /// server's store (its `users` table), and LMDB caps keys at 511 bytes.
    public static let userBytesMax = 511

    /// At most `userBytesMax` bytes.
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
    /// The methods for an `Allow` header (405).
    public var allow: String?

    public init(_ code: WireErrorCode, _ message: String, retryAfter: Int? = nil, allow: String? = nil) {
        self.code = code
        self.message = message
        self.retryAfter = retryAfter
        self.allow = allow
    }

    public var description: String { "\(code): \(message)" }

    /// A pull that names scopes, on a server without a scope field.
    static let noScopeField = ServiceError(
        .validationError, "this server has no scope field (section 7, \"Scopes\"); pull without scopes")

    /// The store is closed, or failed after an unsuccessful commit, and
    /// serves nothing until the server reopens it or is restarted
    /// (section 5: 503, with `Retry-After`, in seconds).
    static func storageUnavailable(_ problem: LMDBError, retryAfter: Int = 30) -> ServiceError {
        ServiceError(.serviceUnavailable, "the server's storage is unavailable (\(problem)); try again later", retryAfter: retryAfter)
    }
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

    /// Applies the operations in one transaction, each on its own and in
    /// order (`Format/sync-protocol.md`, section 7, "How the server evaluates
    /// one operation"), and answers once it has committed: one result per
    /// operation, in order.
    func push(_ request: ReceivedPush, as identity: Identity) async throws -> PushResponse {
        guard (1...Wire.pushOperationCountMax).contains(request.operations.count) else {
            throw ServiceError(
                .validationError, "a push carries 1 to \(Wire.pushOperationCountMax) operations, not \(request.operations.count)")
        }
        // Step 1 refuses every operation of a read-only user, so nothing
        // is written: not even the user's number, which a write transaction
        // (a durable commit) would otherwise assign to no purpose.
        if identity.readOnly {
            let message = "user \(identity.user) may not change data"
            return PushResponse(results: request.operations.map { .rejected($0.idempotencyKey, .permissionDenied, message) })
        }
        let checked = request.operations.map { received -> (key: String, operation: PushOperation?, problem: String?) in
            guard let operation = received.operation else { return (received.idempotencyKey, nil, received.problem) }
            return (operation.idempotencyKey, operation, received.problem ?? SyncService.problem(with: operation))
        }
        let now = clock()
        let results = try await storage.write { txn in
            let user = try self.storage.userNumberCreating(identity.user, txn)
            // Step 4: the versions this request's earlier operations produced, per entity.
            var produced: [ByteKey: UInt64] = [:]
            // The fields of the conflicts' states so far: 500 conflicts on
            // large entities would be gigabytes of answer, built in memory.
            var stateBytes = 0
            return try checked.map { key, operation, problem -> PushResult in
                guard let operation, problem == nil else {
                    return .rejected(key, .validationError, problem ?? "the operation is malformed")
                }
                let entityKey = ServerStorage.entityKey(user, operation.entityType, operation.entityID)
                let entity = ByteKey(entityKey)
                let result = try self.apply(operation, user: user, entityKey: entityKey, raisedBase: produced[entity], now: now, txn)
                if let version = result.serverVersion { produced[entity] = max(produced[entity] ?? 0, version) }
                stateBytes += result.serverState?.data.encodedSize ?? 0
                // Section 7, "Request-level failures": undone, and pushed
                // again in smaller requests. One state alone always fits.
                guard stateBytes <= Wire.entityFieldsBytesMax else {
                    throw ServiceError(
                        .payloadTooLarge,
                        "the conflicts' server states would be over \(Wire.entityFieldsBytesMax) bytes of fields; "
                            + "push fewer operations at a time")
                }
                return result
            }
        }
        return PushResponse(results: results)
    }

    /// What is wrong with an operation before it meets any state, or nil.
    static func problem(with operation: PushOperation) -> String? {
        let name = "operation \(SyncService.quoted(operation.idempotencyKey))"
        if let problem = NameRules.idempotencyKeyProblem(operation.idempotencyKey)
            ?? NameRules.entityTypeProblem(operation.entityType) ?? NameRules.entityIDProblem(operation.entityID)
        {
            return "\(name): \(problem)"
        }
        guard operation.baseVersion <= UInt64(Int64.max) else { return "\(name): base_version is over 2^63 - 1" }
        guard RFC3339.isValid(operation.clientTimestamp) else {
            return "\(name): client_timestamp \"\(operation.clientTimestamp.prefix(40))\" is not an RFC 3339 timestamp"
        }
        switch operation.intent {
        case .create, .update:
            guard let data = operation.data else { return "\(name): a \(operation.intent) needs data" }
            return NameRules.fieldsProblem(data).map { "\(name): \($0)" }
        case .delete:
            guard operation.data?.isEmpty ?? true else { return "\(name): a delete carries no data" }
            return nil
        }
    }

    /// The longest part of an idempotency key a message quotes, in UTF-8
    /// bytes: the result echoes the whole key in `idempotency_key` already,
    /// and a key far over `Wire.idempotencyKeyBytesMax` (the body may hold
    /// megabytes of it) would otherwise be in the answer twice.
    static let quotedKeyBytesMax = 64

    /// `key` for a message: whole, or its first `quotedKeyBytesMax` bytes
    /// (whole scalars) and "…".
    static func quoted(_ key: String) -> String {
        guard key.utf8.count > quotedKeyBytesMax else { return key }
        var bytes = 0
        let kept = key.unicodeScalars.prefix { scalar in
            bytes += UTF8.width(scalar)
            return bytes <= quotedKeyBytesMax
        }
        return String(Substring(kept)) + "…"
    }

    private func apply(
        _ operation: PushOperation, user: UInt32, entityKey: [UInt8], raisedBase: UInt64?, now: Int64,
        _ txn: borrowing Transaction
    ) throws -> PushResult {
        let key = operation.idempotencyKey
        let idempotencyKey = ServerStorage.idempotencyKey(user, key)
        let stored: UInt64? = try ServerStorage.number(
            try txn.get(storage.idempotency, key: idempotencyKey), "the idempotency row of \(SyncService.quoted(key))")
        if let version = stored {
            return .applied(key, version: version, duplicate: true)
        }
        var effective = operation
        effective.baseVersion = max(operation.baseVersion, raisedBase ?? 0)
        let before = try loadState(entityKey, txn) ?? EntityState()
        // Only damage puts an entity at the last version there is: the next
        // would overflow, a trap that took every user's requests down.
        guard before.version < .max else {
            throw ServiceError(
                .internalError,
                "the server's storage is damaged: \(operation.entityType)/\(operation.entityID) is at version \(before.version), "
                    + "the last there is")
        }
        switch SyncService.decide(effective, before: before, now: now) {
        case .failure(let rejection):
            return rejection.result(key)
        case .success(let after):
            guard after.fields.encodedSize <= Wire.entityFieldsBytesMax else {
                return .rejected(key, .validationError, "the fields of \(operation.entityID) would be over \(Wire.entityFieldsBytesMax) bytes")
            }
            if let problem = scopeProblem(operation, before: before, after: after) {
                return .rejected(key, .validationError, problem)
            }
            try txn.put(storage.entities, key: entityKey, value: after.encoded())
            // A deletion is listed under the scope of the life it ends.
            try appendChange(operation, after, scope: storage.scopeIndexed(after.deleted ? before.fields : after.fields), user: user, txn)
            try txn.put(storage.idempotency, key: idempotencyKey, value: after.version.bigEndianBytes)
            return .applied(key, version: after.version)
        }
    }

    struct Rejection: Error {
        var code: WireErrorCode
        var message: String
        var state: ServerState?

        func result(_ key: String) -> PushResult { .rejected(key, code, message, state: state) }
    }

    /// The rules table of `Format/sync-protocol.md`, section 7: the new state,
    /// or why not, given the operation's effective base version b and the
    /// entity's version v.
    static func decide(_ operation: PushOperation, before: EntityState, now: Int64) -> Result<EntityState, Rejection> {
        let name = "\(operation.entityType)/\(operation.entityID)"
        let base = operation.baseVersion
        let conflict = { (why: String) in
            Result<EntityState, Rejection>.failure(Rejection(code: .conflict, message: "\(name): \(why)", state: before.serverState))
        }
        var after = before
        after.version = before.version + 1
        after.updatedAt = now
        let data = operation.data ?? [:]
        switch operation.intent {
        case .create:
            // Applied, it would answer a version not above the base, which
            // a client retries without end.
            guard base <= before.version else { return conflict("base version \(base) is ahead of the server's \(before.version)") }
            // Over a live entity, only a create made against its version
            // applies: it replaces the whole entity, as a client settling a
            // conflict over a state it never pulled pushes it.
            guard !before.exists || base == before.version else {
                return conflict("it already exists, at version \(before.version)")
            }
            after.deleted = false
            after.createdVersion = after.version
            after.fields = data
            after.fieldVersions = Dictionary(uniqueKeysWithValues: data.map { ($0.name, after.version) })
        case .update:
            guard before.exists else { return .failure(Rejection(code: .entityNotFound, message: "no \(name) to update")) }
            guard base <= before.version else { return conflict("base version \(base) is ahead of the server's \(before.version)") }
            let overlapping = data.map(\.name).filter { before.lastChanged($0) > base }
            guard overlapping.isEmpty else {
                return conflict("\(overlapping.joined(separator: ", ")) changed on the server after version \(base)")
            }
            // An entity holding both spellings would be written as one
            // object with two names that every Swift reader takes for one:
            // the client's reader refuses such a pull page, and the field
            // versions here would merge them.
            if let problem = NameRules.updateProblem(data, of: before.fields) {
                return .failure(Rejection(code: .validationError, message: "\(name): \(problem)"))
            }
            after.fields = before.fields.merging(data)
            for field in data { after.fieldVersions[field.name] = after.version }
        case .delete:
            guard before.exists else { return .failure(Rejection(code: .entityNotFound, message: "no \(name) to delete")) }
            guard base == before.version else {
                return conflict("the delete was made against version \(base), the server is at \(before.version)")
            }
            after.deleted = true
            after.fields = [:]
            after.fieldVersions = [:]
        }
        return .success(after)
    }

    /// Why the server's scope field (section 7, "Scopes") refuses the
    /// entity state `after`, or nil: a value it gives that is no scope, or
    /// a scope other than the one the entity has had since it was created
    /// (an entity's scope is fixed for its life: a client pulling only the
    /// old one would never hear that it left).
    private func scopeProblem(_ operation: PushOperation, before: EntityState, after: EntityState) -> String? {
        guard let field = storage.scopeField, !after.deleted else { return nil }
        let value = after.fields[field]
        // Unchanged, it is taken as it is: a value stored before the server
        // had this scope field is no scope, and lists its entity in every one.
        guard !before.exists || value != before.fields[field] else { return nil }
        let name = "\(operation.entityType)/\(operation.entityID)"
        guard let scope = ServerStorage.scope(value) else {
            guard case .string(let text)? = value else {
                return "\(name): \(field) is the server's scope field; it holds a string or null, not \(value.map { "\($0)" } ?? "")"
            }
            return "\(name): \(field) is the server's scope field: \(Wire.scopeProblem(text) ?? "")"
        }
        let fixed = storage.scopeIndexed(before.fields)
        guard before.exists, scope != fixed else { return nil }
        return "\(name): \(field) is the server's scope field, fixed for an entity's life: it is "
            + (fixed.isEmpty ? "unset" : "\"\(fixed)\"") + "; delete the entity and create it again to move it"
    }

    private func appendChange(
        _ operation: PushOperation, _ state: EntityState, scope: String, user: UInt32, _ txn: borrowing Transaction
    ) throws {
        let offset = try storage.nextOffset(user: user, txn)
        // A deletion's row keeps the scope it ends, so that compaction and
        // indexing find it from the row alone; a pull shows no data for it.
        var fields = state.fields
        if state.deleted, let field = storage.scopeField, !scope.isEmpty { fields = [field: .string(scope)] }
        let change = Remote(
            cursor: "", state.deleted ? .delete : .upsert, entityType: operation.entityType, entityID: operation.entityID,
            serverVersion: state.version, fields: fields)
        let milliseconds = UInt64(max(0, state.updatedAt / 1000))
        let entry = Entry(
            offset: offset, timestamp: HybridTimestamp(milliseconds: min(milliseconds, (1 << 48) - 1), logical: 0),
            body: .remote(change))
        try storage.appendChange(entry, change, scope: scope, idempotencyKey: operation.idempotencyKey, user: user, txn)
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

/// A push as received: operations that do not read become per-operation
/// validation errors (with what can be read of their key), so one malformed
/// operation never fails the batch. The body as a whole must still be JSON
/// with an `operations` array. Read with `JSONReader`, as every wire value
/// is, so the protocol's reading rules live in one place.
struct ReceivedPush: Sendable {
    var operations: [ReceivedOperation]

    /// - Throws: `ServiceError.validationError` for a body that is not JSON
    ///   or has no `operations` array.
    init(body: Data) throws {
        let root: JSONValue
        do {
            // A number outside binary64 or nesting past the reader's depth
            // is valid JSON: it fails only its operation (section 7).
            root = try JSONReader.parse(body, keepingUnreadableValues: true)
        } catch {
            throw ServiceError(.validationError, "the push body is not valid JSON: \(error)")
        }
        guard case .array(let list)? = root["operations"] else {
            throw ServiceError(.validationError, "the push body needs an operations array")
        }
        operations = list.enumerated().map { index, json in ReceivedOperation(json: json, path: "operations[\(index)]") }
    }
}

struct ReceivedOperation: Sendable {
    var operation: PushOperation?
    var idempotencyKey: String
    var problem: String?

    init(json: JSONValue, path: String) {
        if case .string(let key)? = json["idempotency_key"] { idempotencyKey = key } else { idempotencyKey = "" }
        let name = "operation \(idempotencyKey.isEmpty ? "without a key" : SyncService.quoted(idempotencyKey))"
        do {
            operation = try PushOperation(json: json, path: path)
            if json["data"] == .null { problem = "\(name): data is null; omit it or send an object" }
        } catch {
            problem = "\(name): \(error)"
        }
    }
}
