import Foundation

// The messages that carry entity data, written with `JSONWriter` rather than
// `JSONEncoder` (several times faster for a page of entities). The text is
// what `Wire.makeEncoder()` writes for the same message: compact, members
// in byte order of their names, absent optionals left out; `WireJSONTests`
// compares the two.

extension Value {
    /// Writes the value in its JSON form (`Format/sync-protocol.md` section 4,
    /// "Writing"): `$double` for an integral double, `$bytes`, `$timestamp`.
    /// - Throws: `EncodingError.invalidValue` for a non-finite double or a
    ///   field name starting with `$`, which JSON cannot carry.
    public func writeJSON(to writer: inout JSONWriter) throws {
        switch self {
        case .null: writer.null()
        case .bool(let flag): writer.bool(flag)
        case .int(let number): writer.int(number)
        case .double(let number):
            guard number.isFinite else {
                throw EncodingError.invalidValue(number, .init(codingPath: [], debugDescription: "JSON has no form for \(number)"))
            }
            if number.rounded() == number {
                Value.writeSpecial("$double", to: &writer) { $0.double(number) }
            } else {
                writer.double(number)
            }
        case .string(let text): writer.string(text)
        case .bytes(let data):
            Value.writeSpecial("$bytes", to: &writer) { $0.string(Data(data).base64EncodedString()) }
        case .timestamp(let micros):
            Value.writeSpecial("$timestamp", to: &writer) { $0.int(micros) }
        case .array(let elements):
            writer.beginArray()
            for element in elements { try element.writeJSON(to: &writer) }
            writer.endArray()
        case .object(let fields):
            try fields.writeJSON(to: &writer)
        }
    }

    private static func writeSpecial(_ name: String, to writer: inout JSONWriter, _ body: (inout JSONWriter) -> Void) {
        writer.beginObject()
        writer.name(name)
        body(&writer)
        writer.endObject()
    }
}

extension Fields {
    /// Writes the fields as a JSON object, in their canonical (byte) order.
    /// - Throws: as `Value.writeJSON(to:)`.
    public func writeJSON(to writer: inout JSONWriter) throws {
        writer.beginObject()
        for (name, value) in self {
            guard !NameRules.isReserved(name) else {
                throw EncodingError.invalidValue(name, .init(codingPath: [], debugDescription: "field names starting with $ are reserved"))
            }
            writer.name(name)
            try value.writeJSON(to: &writer)
        }
        writer.endObject()
    }
}

extension PushRequest {
    /// The request body as JSON.
    /// - Throws: as `Value.writeJSON(to:)`.
    public func encodeJSON() throws -> Data {
        try JSONWriter.message(list: "operations", operations, bytesEach: 256) { try $0.writeJSON(to: &$1) }
    }
}

extension JSONWriter {
    /// A message that is an object with a list first, `{"name":[...],...}`,
    /// then the members `rest` writes.
    /// - Parameter bytesEach: about how long an element's JSON is, to size the buffer.
    static func message<Element>(
        list name: String, _ elements: [Element], bytesEach: Int, _ write: (Element, inout JSONWriter) throws -> Void,
        rest: (inout JSONWriter) -> Void = { _ in }
    ) throws -> Data {
        var writer = JSONWriter(capacity: bytesEach * elements.count + 128)
        writer.beginObject()
        writer.name(name)
        writer.beginArray()
        for element in elements { try write(element, &writer) }
        writer.endArray()
        rest(&writer)
        writer.endObject()
        return Data(writer.bytes)
    }
}

extension PushOperation {
    func writeJSON(to writer: inout JSONWriter) throws {
        writer.beginObject()
        writer.member("base_version", baseVersion)
        writer.member("client_timestamp", clientTimestamp)
        if let data {
            writer.name("data")
            try data.writeJSON(to: &writer)
        }
        writer.member("entity_id", entityID)
        writer.member("entity_type", entityType)
        writer.member("idempotency_key", idempotencyKey)
        writer.member("intent", intent.rawValue)
        writer.endObject()
    }
}

extension PushResponse {
    /// The response body as JSON.
    /// - Throws: as `Value.writeJSON(to:)` (a conflict's server state).
    public func encodeJSON() throws -> Data {
        try JSONWriter.message(list: "results", results, bytesEach: 96) { try $0.writeJSON(to: &$1) }
    }
}

extension PushResult {
    func writeJSON(to writer: inout JSONWriter) throws {
        writer.beginObject()
        if let errorCode { writer.member("error_code", errorCode.rawValue) }
        if let errorMessage { writer.member("error_message", errorMessage) }
        writer.member("idempotency_key", idempotencyKey)
        if let serverState {
            writer.name("server_state")
            writer.beginObject()
            writer.name("data")
            try serverState.data.writeJSON(to: &writer)
            writer.member("deleted", serverState.deleted)
            writer.member("server_version", serverState.serverVersion)
            writer.endObject()
        }
        if let serverVersion { writer.member("server_version", serverVersion) }
        writer.member("status", status.rawValue)
        writer.endObject()
    }
}

extension PullResponse {
    /// The page as JSON.
    /// - Throws: as `Value.writeJSON(to:)`.
    public func encodeJSON() throws -> Data {
        try JSONWriter.message(list: "changes", changes, bytesEach: 320, { try $0.writeJSON(to: &$1) }) { writer in
            writer.member("cursor", cursor)
            writer.member("force_resync", forceResync)
            writer.member("has_more", hasMore)
        }
    }
}

extension PullChange {
    func writeJSON(to writer: inout JSONWriter) throws {
        writer.beginObject()
        writer.name("data")
        if let data { try data.writeJSON(to: &writer) } else { writer.null() }
        writer.member("entity_id", entityID)
        writer.member("entity_type", entityType)
        if let idempotencyKey { writer.member("idempotency_key", idempotencyKey) }
        writer.member("operation", operation.rawValue)
        writer.member("server_version", serverVersion)
        writer.member("updated_at", updatedAt)
        writer.endObject()
    }
}
