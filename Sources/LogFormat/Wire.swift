import Foundation

/// The messages of the sync protocol, version 1 (`Format/sync-protocol.md`),
/// as plain Codable values shared by the client and the server. JSON keys are
/// snake_case, as on the wire.
public enum Wire {
    public static let protocolVersion = 1
    /// Header every response carries.
    public static let versionHeader = "Sync-Protocol-Version"

    /// Whether `text` is a number in ASCII digits only: not empty, no sign,
    /// space or fraction (a pull's `limit`, a `Retry-After` in seconds).
    public static func isDigits(_ text: some StringProtocol) -> Bool {
        !text.isEmpty && text.utf8.allSatisfy { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }
    }

    /// The most operations in one push.
    public static let pushOperationCountMax = 500
    /// The largest request body; a larger one is refused before parsing.
    public static let requestBodyBytesMax = 4 * 1024 * 1024
    /// The most changes one pull page may ask for, and the default.
    public static let pullPageCountMax = 1000
    public static let pullPageCountDefault = 100
    /// The most entity types one pull may name (`types`, section 8).
    public static let pullTypesCountMax = 64
    /// The longest a pull may ask to wait for a change (`wait`, section 8),
    /// in seconds.
    public static let pullWaitSecondsMax = 60

    /// The entity types a pull's `types` parameter names (`task,note`), or
    /// why it names none the protocol allows (section 8): an empty item, a
    /// name the rules refuse, more than `pullTypesCountMax`.
    public static func pullTypes(_ text: Substring) -> Result<Set<String>, PullTypesProblem> {
        pullList(text, "types", "entity types", countMax: pullTypesCountMax, NameRules.entityTypeProblem)
    }

    /// The scopes a pull's `scopes` parameter names (`p-1,p-2`), or why it
    /// names none the protocol allows (section 8): an empty item, a value
    /// `scopeProblem` refuses, more than `pullScopesCountMax`.
    public static func pullScopes(_ text: Substring) -> Result<Set<String>, PullTypesProblem> {
        pullList(text, "scopes", "scopes", countMax: pullScopesCountMax, scopeProblem)
    }

    private static func pullList(
        _ text: Substring, _ parameter: String, _ what: String, countMax: Int, _ problem: (String) -> String?
    ) -> Result<Set<String>, PullTypesProblem> {
        var items = Set<String>()
        for item in text.split(separator: ",", omittingEmptySubsequences: false) {
            if let problem = problem(String(item)) { return .failure(PullTypesProblem(description: "\(parameter): \(problem)")) }
            items.insert(String(item))
        }
        guard items.count <= countMax else {
            return .failure(PullTypesProblem(description: "\(parameter) names \(items.count) \(what); at most \(countMax)"))
        }
        return .success(items)
    }

    /// Why a pull's `types` or `scopes` is refused.
    public struct PullTypesProblem: Error, Equatable, CustomStringConvertible {
        public let description: String
    }

    /// The `types` value for `types` (and the `scopes` value for scopes):
    /// sorted, comma-separated.
    public static func pullTypesValue(_ types: Set<String>) -> String { types.sorted().joined(separator: ",") }

    /// The most scopes one pull may name (`scopes`, section 8).
    public static let pullScopesCountMax = 64
    /// The longest scope, in bytes.
    public static let scopeBytesMax = 128

    /// Why `scope` cannot be one (section 7, "Scopes"), or nil: a scope is
    /// 1 to `scopeBytesMax` of the characters a URL carries as they are
    /// (A-Z a-z 0-9 - . _ ~), so a pull names it in `scopes` unescaped,
    /// and no comma can split it.
    public static func scopeProblem(_ scope: String) -> String? {
        let allowed = { (byte: UInt8) -> Bool in
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                true
            default: false
            }
        }
        guard (1...scopeBytesMax).contains(scope.utf8.count), scope.utf8.allSatisfy(allowed) else {
            return "scope \"\(scope.prefix(80))\": use 1 to \(scopeBytesMax) of A-Z a-z 0-9 - . _ ~"
        }
        return nil
    }

    /// The longest cursor a server accepts (longer ones are not its own).
    public static let cursorBytesMax = 1024

    /// Why `cursor` is not one the protocol allows (section 8: 1 to
    /// `cursorBytesMax` bytes, each a printable ASCII character from `!` to
    /// `~`); nil when it is. Inlinable, so each caller gets it for its own
    /// collection: as a generic across the module boundary, it stepped
    /// through a `String.UTF8View` by witness calls, about 2% of the CPU of
    /// an initial pull, which checks every change's cursor.
    @inlinable
    public static func cursorProblem(_ cursor: some Collection<UInt8>) -> String? {
        guard !cursor.isEmpty else { return "is empty" }
        guard cursor.count <= cursorBytesMax else { return "is \(cursor.count) bytes, over cursorBytesMax (\(cursorBytesMax))" }
        guard cursor.allSatisfy({ (0x21...0x7E).contains($0) }) else { return "holds a byte that is not printable ASCII (! to ~)" }
        return nil
    }
    /// The largest an entity's encoded fields may become, so every state
    /// fits in one entry of a client's log with room for its header.
    public static let entityFieldsBytesMax = 4_192_256

    public static func makeEncoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }
}

/// The error codes of the protocol and what a client does with each.
public struct WireErrorCode: RawRepresentable, Hashable, Codable, Sendable, CustomStringConvertible {
    public let rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public static let validationError = WireErrorCode(rawValue: "VALIDATION_ERROR")
    public static let unauthorized = WireErrorCode(rawValue: "UNAUTHORIZED")
    public static let permissionDenied = WireErrorCode(rawValue: "PERMISSION_DENIED")
    public static let entityNotFound = WireErrorCode(rawValue: "ENTITY_NOT_FOUND")
    public static let conflict = WireErrorCode(rawValue: "CONFLICT")
    public static let notFound = WireErrorCode(rawValue: "NOT_FOUND")
    public static let methodNotAllowed = WireErrorCode(rawValue: "METHOD_NOT_ALLOWED")
    public static let cursorInvalid = WireErrorCode(rawValue: "CURSOR_INVALID")
    public static let payloadTooLarge = WireErrorCode(rawValue: "PAYLOAD_TOO_LARGE")
    public static let unsupportedMediaType = WireErrorCode(rawValue: "UNSUPPORTED_MEDIA_TYPE")
    public static let rateLimited = WireErrorCode(rawValue: "RATE_LIMITED")
    public static let internalError = WireErrorCode(rawValue: "INTERNAL_ERROR")
    public static let serviceUnavailable = WireErrorCode(rawValue: "SERVICE_UNAVAILABLE")

    /// Worth trying again later (with backoff); everything else is permanent.
    public var isRetryable: Bool {
        [.rateLimited, .internalError, .serviceUnavailable].contains(self)
    }

    /// The HTTP status a request-level error of this code answers with.
    public var httpStatus: Int {
        switch self {
        case .validationError: 400
        case .unauthorized: 401
        case .permissionDenied: 403
        case .notFound, .entityNotFound: 404
        case .methodNotAllowed: 405
        case .conflict: 409
        case .cursorInvalid: 410
        case .payloadTooLarge: 413
        case .unsupportedMediaType: 415
        case .rateLimited: 429
        case .serviceUnavailable: 503
        default: 500
        }
    }

    public init(from decoder: any Decoder) throws {
        rawValue = try decoder.singleValueContainer().decode(String.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }

    public var description: String { rawValue }
}

/// The body of every non-2xx answer.
public struct ErrorEnvelope: Codable, Sendable, Equatable {
    public struct Detail: Codable, Sendable, Equatable {
        public var code: WireErrorCode
        public var message: String
        public var retryable: Bool
    }

    public var error: Detail

    public init(_ code: WireErrorCode, _ message: String) {
        error = Detail(code: code, message: message, retryable: code.isRetryable)
    }
}

public struct HealthResponse: Codable, Sendable, Equatable {
    public var status: String
    public var protocolVersion: Int
    public var serverID: String
    /// The content codings the server undoes in request bodies (`gzip`);
    /// nil from a server that names none, which takes bodies as they are.
    public var requestCodings: [String]?

    public init(serverID: String, requestCodings: [String]? = nil) {
        status = "ok"
        protocolVersion = Wire.protocolVersion
        self.serverID = serverID
        self.requestCodings = requestCodings
    }

    enum CodingKeys: String, CodingKey {
        case status
        case protocolVersion = "protocol_version"
        case serverID = "server_id"
        case requestCodings = "request_codings"
    }
}

/// One intent pushed to the server.
public struct PushOperation: Codable, Sendable, Equatable {
    public enum Intent: String, Codable, Sendable {
        case create, update, delete
    }

    public var idempotencyKey: String
    public var entityType: String
    public var entityID: String
    public var intent: Intent
    public var data: Fields?
    /// RFC 3339 with microseconds.
    public var clientTimestamp: String
    /// The server version the change was made against (0: none).
    public var baseVersion: UInt64

    public init(
        idempotencyKey: String, entityType: String, entityID: String, intent: Intent, data: Fields?,
        clientTimestamp: String, baseVersion: UInt64
    ) {
        self.idempotencyKey = idempotencyKey
        self.entityType = entityType
        self.entityID = entityID
        self.intent = intent
        self.data = data
        self.clientTimestamp = clientTimestamp
        self.baseVersion = baseVersion
    }

    enum CodingKeys: String, CodingKey {
        case idempotencyKey = "idempotency_key"
        case entityType = "entity_type"
        case entityID = "entity_id"
        case intent, data
        case clientTimestamp = "client_timestamp"
        case baseVersion = "base_version"
    }
}

extension PushOperation {
    /// The operation that pushes a log intent: its idempotency key, entity,
    /// fields (none for a delete) and base version, stamped `clientTimestamp`.
    public init(_ intent: LogFormat.Intent, clientTimestamp: String) {
        let kind: PushOperation.Intent =
            switch intent.operation {
            case .create: .create
            case .update: .update
            case .delete: .delete
            }
        self.init(
            idempotencyKey: intent.idempotencyKey, entityType: intent.entityType, entityID: intent.entityID, intent: kind,
            data: intent.operation == .delete ? nil : intent.fields, clientTimestamp: clientTimestamp, baseVersion: intent.baseVersion)
    }
}

public struct PushRequest: Codable, Sendable, Equatable {
    public var operations: [PushOperation]
    public init(operations: [PushOperation]) { self.operations = operations }
}

/// The server's state of an entity, sent with a CONFLICT.
public struct ServerState: Codable, Sendable, Equatable {
    public var serverVersion: UInt64
    public var deleted: Bool
    public var data: Fields

    public init(serverVersion: UInt64, deleted: Bool, data: Fields) {
        self.serverVersion = serverVersion
        self.deleted = deleted
        self.data = data
    }

    enum CodingKeys: String, CodingKey {
        case serverVersion = "server_version"
        case deleted, data
    }
}

public struct PushResult: Codable, Sendable, Equatable {
    public enum Status: String, Codable, Sendable {
        case applied, duplicate, rejected
    }

    public var idempotencyKey: String
    public var status: Status
    public var serverVersion: UInt64?
    public var errorCode: WireErrorCode?
    public var errorMessage: String?
    public var serverState: ServerState?

    public static func applied(_ key: String, version: UInt64, duplicate: Bool = false) -> PushResult {
        PushResult(idempotencyKey: key, status: duplicate ? .duplicate : .applied, serverVersion: version)
    }

    public static func rejected(_ key: String, _ code: WireErrorCode, _ message: String, state: ServerState? = nil)
        -> PushResult
    {
        PushResult(idempotencyKey: key, status: .rejected, errorCode: code, errorMessage: message, serverState: state)
    }

    public init(
        idempotencyKey: String, status: Status, serverVersion: UInt64? = nil, errorCode: WireErrorCode? = nil,
        errorMessage: String? = nil, serverState: ServerState? = nil
    ) {
        self.idempotencyKey = idempotencyKey
        self.status = status
        self.serverVersion = serverVersion
        self.errorCode = errorCode
        self.errorMessage = errorMessage
        self.serverState = serverState
    }

    enum CodingKeys: String, CodingKey {
        case idempotencyKey = "idempotency_key"
        case status
        case serverVersion = "server_version"
        case errorCode = "error_code"
        case errorMessage = "error_message"
        case serverState = "server_state"
    }
}

public struct PushResponse: Codable, Sendable, Equatable {
    public var results: [PushResult]
    public init(results: [PushResult]) { self.results = results }
}

/// One change in a pull page: the entity's full state after it.
public struct PullChange: Codable, Sendable, Equatable {
    public enum Operation: String, Codable, Sendable {
        case upsert, delete
    }

    public var entityType: String
    public var entityID: String
    public var operation: Operation
    /// nil for a delete.
    public var data: Fields?
    public var serverVersion: UInt64
    public var updatedAt: String
    /// The idempotency key of the pushed operation that made the change;
    /// nil when the server does not say (`Format/sync-protocol.md`, section 8).
    public var idempotencyKey: String?

    public init(
        entityType: String, entityID: String, operation: Operation, data: Fields?, serverVersion: UInt64,
        updatedAt: String, idempotencyKey: String? = nil
    ) {
        self.entityType = entityType
        self.entityID = entityID
        self.operation = operation
        self.data = data
        self.serverVersion = serverVersion
        self.updatedAt = updatedAt
        self.idempotencyKey = idempotencyKey
    }

    enum CodingKeys: String, CodingKey {
        case entityType = "entity_type"
        case entityID = "entity_id"
        case operation, data
        case serverVersion = "server_version"
        case updatedAt = "updated_at"
        case idempotencyKey = "idempotency_key"
    }

    /// Encodes `data` as JSON null for a delete, as the protocol shows it.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(entityType, forKey: .entityType)
        try container.encode(entityID, forKey: .entityID)
        try container.encode(operation, forKey: .operation)
        try container.encode(data, forKey: .data)
        try container.encode(serverVersion, forKey: .serverVersion)
        try container.encode(updatedAt, forKey: .updatedAt)
        try container.encodeIfPresent(idempotencyKey, forKey: .idempotencyKey)
    }
}

public struct PullResponse: Codable, Sendable, Equatable {
    public var changes: [PullChange]
    public var cursor: String
    public var hasMore: Bool
    public var forceResync: Bool

    public init(changes: [PullChange], cursor: String, hasMore: Bool, forceResync: Bool = false) {
        self.changes = changes
        self.cursor = cursor
        self.hasMore = hasMore
        self.forceResync = forceResync
    }

    enum CodingKeys: String, CodingKey {
        case changes, cursor
        case hasMore = "has_more"
        case forceResync = "force_resync"
    }
}

extension Value {
    /// RFC 3339 UTC with microseconds, as the protocol writes timestamps.
    public static func rfc3339(microseconds: Int64) -> String { iso8601(microseconds: microseconds) }
}
