import Foundation

/// A wire message that is JSON but not the message expected, and where.
public struct WireDecodingError: Error, Equatable, CustomStringConvertible {
    /// Where in the message, such as `changes[3].data.tags[0]`.
    public var path: String
    public var detail: String
    public var description: String { path.isEmpty ? detail : "\(path): \(detail)" }

    public init(_ path: String, _ detail: String) {
        self.path = path
        self.detail = detail
    }
}

/// Where a value's decoder is, made into text only for an error. Each
/// element's path used to be built up front, copying every ancestor's name:
/// a long field name over many elements or members made a decode quadratic
/// in the body (a 1.25 MB push took 5.8 s in a debug build, against 0.33 s
/// with a short name).
private struct ValuePath {
    enum Step {
        case member(String)
        case index(Int)
    }

    /// The path of the value being decoded, as the caller gave it.
    let prefix: String
    var steps: [Step] = []

    var text: String {
        steps.reduce(into: prefix) { text, step in
            switch step {
            case .member(let name): text = text.isEmpty ? name : text + "." + name
            case .index(let index): text += "[\(index)]"
            }
        }
    }

    func error(_ detail: String, then name: String? = nil) -> WireDecodingError {
        WireDecodingError(name.map { text + "." + $0 } ?? text, detail)
    }
}

extension Value {
    /// The value a JSON value stands for (`Format/sync-protocol.md` section 4,
    /// "Reading"), with `$double`, `$bytes` and `$timestamp` forms.
    /// - Throws: `WireDecodingError` naming the path of the problem.
    public init(json: JSONValue, path: String = "", depth: Int = 0) throws(WireDecodingError) {
        var trail = ValuePath(prefix: path)
        self = try Value.decode(json, &trail, depth: depth)
    }

    fileprivate static func decode(_ json: JSONValue, _ path: inout ValuePath, depth: Int) throws(WireDecodingError) -> Value {
        switch json {
        case .null: return .null
        case .bool(let flag): return .bool(flag)
        case .int(let number): return .int(number)
        // `-0` and `-0.0` are whole numbers, so the int 0 (section 4).
        case .negativeZero: return .int(0)
        case .double(let number): return .double(number)
        // Whole, but past Int64: the binary64 nearest to it (section 4).
        case .unsigned(let number): return .double(Double(number))
        case .string(let text): return .string(text)
        case .unreadable(let detail): throw path.error(detail)
        case .array(let elements):
            guard depth < Limits.valueDepthMax else { throw path.error("nests deeper than \(Limits.valueDepthMax)") }
            var values: [Value] = []
            values.reserveCapacity(elements.count)
            for (index, element) in elements.enumerated() {
                path.steps.append(.index(index))
                values.append(try decode(element, &path, depth: depth + 1))
                path.steps.removeLast()
            }
            return .array(values)
        case .object(let members):
            if members.count == 1, NameRules.isReserved(members[0].0) {
                return try special(members[0].0, members[0].1, path)
            }
            guard depth < Limits.valueDepthMax else { throw path.error("nests deeper than \(Limits.valueDepthMax)") }
            return .object(try Fields.decode(json, &path, depth: depth + 1))
        }
    }

    private static func special(_ name: String, _ json: JSONValue, _ path: ValuePath) throws(WireDecodingError) -> Value {
        switch (name, json) {
        case ("$double", .int(let number)): return .double(Double(number))
        case ("$double", .negativeZero): return .double(-0.0)
        case ("$double", .double(let number)): return .double(number)
        case ("$double", .unsigned(let number)): return .double(Double(number))
        case ("$timestamp", .int(let micros)): return .timestamp(micros)
        // `-0` and `-0.0`: whole numbers, read by value (section 4).
        case ("$timestamp", .negativeZero): return .timestamp(0)
        case ("$timestamp", .double), ("$timestamp", .unsigned):
            throw path.error("is not a whole number within the i64 range", then: "$timestamp")
        case ("$bytes", .string(let text)):
            do throws(Base64.Problem) {
                return .bytes(try Base64.decode(text))
            } catch {
                throw path.error("\(error)", then: "$bytes")
            }
        case ("$double", _), ("$timestamp", _), ("$bytes", _):
            throw path.error("has the wrong kind of value", then: name)
        default:
            throw path.error("names starting with $ are reserved", then: name)
        }
    }
}

extension Fields {
    /// Fields from a JSON object; names starting with `$` are refused.
    public init(json: JSONValue, path: String = "", depth: Int = 0) throws(WireDecodingError) {
        var trail = ValuePath(prefix: path)
        self = try Fields.decode(json, &trail, depth: depth)
    }

    fileprivate static func decode(_ json: JSONValue, _ path: inout ValuePath, depth: Int) throws(WireDecodingError) -> Fields {
        if case .unreadable(let detail) = json { throw path.error(detail) }
        guard case .object(let members) = json else { throw path.error("is not an object") }
        var pairs: [(String, Value)] = []
        pairs.reserveCapacity(members.count)
        for (name, value) in members {
            path.steps.append(.member(name))
            guard !NameRules.isReserved(name) else { throw path.error("names starting with $ are reserved") }
            pairs.append((name, try Value.decode(value, &path, depth: depth)))
            path.steps.removeLast()
        }
        return Fields(pairs)
    }
}

extension PullResponse {
    /// Reads a pull page with `JSONReader`, several times faster than
    /// `JSONDecoder` for pages of entity data.
    /// - Throws: `JSONReadError` or `WireDecodingError`.
    public static func decode(json bytes: some Collection<UInt8>) throws -> PullResponse {
        let root = try JSONReader.parse(bytes)
        guard case .array(let list)? = root["changes"] else { throw WireDecodingError("changes", "is missing or not an array") }
        var changes: [PullChange] = []
        changes.reserveCapacity(list.count)
        for (index, item) in list.enumerated() {
            changes.append(try PullChange(json: item, path: "changes[\(index)]"))
        }
        let cursor = try root.string("cursor")
        let forceResync = try root.bool("force_resync")
        // A client writes the cursor into the `remote` entry of every change
        // of the page: one past the protocol's bound would multiply the
        // log's growth by the page's changes. With `force_resync` the
        // cursor is empty, and ignored.
        if !forceResync, let problem = Wire.cursorProblem(cursor.utf8) { throw WireDecodingError("cursor", problem) }
        return PullResponse(changes: changes, cursor: cursor, hasMore: try root.bool("has_more"), forceResync: forceResync)
    }

}

extension PushResponse {
    /// Reads a push answer with `JSONReader`, so that a conflict's
    /// `server_state` keeps its number forms (`2.0` stays a double).
    /// - Throws: `JSONReadError` or `WireDecodingError`.
    public static func decode(json bytes: some Collection<UInt8>) throws -> PushResponse {
        let root = try JSONReader.parse(bytes)
        guard case .array(let list)? = root["results"] else { throw WireDecodingError("results", "is missing or not an array") }
        return PushResponse(results: try list.enumerated().map { try PushResult(json: $1, path: "results[\($0)]") })
    }
}

extension PushResult {
    init(json: JSONValue, path: String) throws {
        let statusText = try json.string("status", path)
        guard let status = Status(rawValue: statusText) else { throw WireDecodingError("\(path).status", "is \(statusText)") }
        let version = json.version("server_version")
        var code: WireErrorCode?
        if case .string(let text)? = json["error_code"] { code = WireErrorCode(rawValue: text) }
        var message: String?
        if case .string(let text)? = json["error_message"] { message = text }
        var state: ServerState?
        if let value = json["server_state"], value != .null {
            guard let stateVersion = value.version("server_version") else {
                throw WireDecodingError("\(path).server_state.server_version", "is missing or not a version")
            }
            guard let data = value["data"] else { throw WireDecodingError("\(path).server_state.data", "is missing") }
            state = ServerState(
                serverVersion: stateVersion, deleted: try value.bool("deleted", "\(path).server_state"),
                data: try Fields(json: data, path: "\(path).server_state.data"))
        }
        switch status {
        case .applied, .duplicate:
            guard version != nil else { throw WireDecodingError("\(path).server_version", "is missing or not a version") }
        case .rejected:
            guard code != nil else { throw WireDecodingError("\(path).error_code", "is missing or not a string") }
        }
        self.init(
            idempotencyKey: try json.string("idempotency_key", path), status: status, serverVersion: version, errorCode: code,
            errorMessage: message, serverState: state)
    }
}

extension PullChange {
    /// One change of a pull page (`Format/sync-protocol.md`, section 8).
    /// What a client's store would refuse to apply (a type, id or field
    /// outside its rules, version 0) is refused here, naming the member, as is a
    /// delete carrying fields, which would be dropped unseen: a body the
    /// protocol does not define (section 10), not the store's error.
    init(json: JSONValue, path: String) throws {
        let operation = try json.string("operation", path)
        guard let kind = Operation(rawValue: operation) else { throw WireDecodingError("\(path).operation", "is \(operation)") }
        let entityType = try json.string("entity_type", path)
        if let problem = NameRules.entityTypeProblem(entityType) { throw WireDecodingError("\(path).entity_type", problem) }
        let entityID = try json.string("entity_id", path)
        if let problem = NameRules.entityIDProblem(entityID) { throw WireDecodingError("\(path).entity_id", problem) }
        var data: Fields?
        if let value = json["data"], value != .null { data = try Fields(json: value, path: "\(path).data") }
        if let fields = data, let problem = NameRules.fieldsProblem(fields) { throw WireDecodingError("\(path).data", problem) }
        if kind == .delete, let fields = data, !fields.isEmpty {
            throw WireDecodingError("\(path).data", "holds \(fields.count) field(s) in a delete, whose data is null")
        }
        // Versions start at 1 (section 7, "Versions").
        guard let version = json.version("server_version"), version >= 1 else {
            throw WireDecodingError("\(path).server_version", "is missing or not a version (1 or more)")
        }
        // Absent (or null) when the server does not say; another value is
        // a body the protocol does not define.
        var idempotencyKey: String?
        if let value = json["idempotency_key"], value != .null { idempotencyKey = try json.string("idempotency_key", path) }
        self.init(
            entityType: entityType, entityID: entityID, operation: kind, data: data, serverVersion: version,
            updatedAt: try json.string("updated_at", path),
            idempotencyKey: idempotencyKey)
    }
}

extension PushOperation {
    /// One pushed operation read from its JSON (`Format/sync-protocol.md`,
    /// section 7, "Request"). Absent `data` and `"data": null` both read as
    /// nil; the server tells them apart where the protocol does.
    /// - Throws: `WireDecodingError` naming the member at fault.
    public init(json: JSONValue, path: String = "") throws {
        guard case .object = json else { throw WireDecodingError(path, "is not an object") }
        let intentText = try json.string("intent", path)
        guard let intent = Intent(rawValue: intentText) else {
            throw WireDecodingError(path.isEmpty ? "intent" : "\(path).intent", "is \(intentText), not create, update or delete")
        }
        var data: Fields?
        if let value = json["data"], value != .null { data = try Fields(json: value, path: path.isEmpty ? "data" : "\(path).data") }
        guard let base = json.version("base_version") else {
            throw WireDecodingError(path.isEmpty ? "base_version" : "\(path).base_version", "is missing or not a version")
        }
        self.init(
            idempotencyKey: try json.string("idempotency_key", path), entityType: try json.string("entity_type", path),
            entityID: try json.string("entity_id", path), intent: intent, data: data,
            clientTimestamp: try json.string("client_timestamp", path), baseVersion: base)
    }
}

extension JSONValue {
    func string(_ name: String, _ path: String = "") throws(WireDecodingError) -> String {
        guard case .string(let text)? = self[name] else { throw WireDecodingError(join(path, name), "is missing or not a string") }
        return text
    }

    func bool(_ name: String, _ path: String = "") throws(WireDecodingError) -> Bool {
        guard case .bool(let flag)? = self[name] else { throw WireDecodingError(join(path, name), "is missing or not a boolean") }
        return flag
    }

    /// The member `name` as a version, read by value as every number is
    /// (section 4): a whole number from 0 to 2^63 - 1, `-0` and `-0.0`
    /// included; nil when it is absent or anything else.
    func version(_ name: String) -> UInt64? {
        switch self[name] {
        case .int(let value)? where value >= 0: UInt64(value)
        case .negativeZero?: 0
        default: nil
        }
    }

    private func join(_ path: String, _ name: String) -> String { path.isEmpty ? name : "\(path).\(name)" }
}
