import Foundation

/// The JSON form of values (`Format/sync-protocol.md`, "Values"): JSON's own
/// types where they fit, an integer literal for an int, and single-key
/// objects for what JSON lacks: `{"$double": 2}` for an integral double (so
/// it stays a double), `{"$bytes": "<base64>"}`, `{"$timestamp": <µs>}`.
/// Field names starting with `$` are reserved for these forms.
extension Value: Codable {
    public init(from decoder: any Decoder) throws {
        // Codable cannot ask a JSON value its kind, only try one and catch the
        // failure, which costs an error each time: the likeliest kinds of a
        // field go first.
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let text = try? container.decode(String.self) {
            self = .string(text)
        } else if let number = try? container.decode(Int64.self) {
            self = .int(number)
        } else if let flag = try? container.decode(Bool.self) {
            self = .bool(flag)
        } else if let number = try? container.decode(Double.self) {
            self = .double(number)
        } else if let elements = try? container.decode([Value].self) {
            self = .array(elements)
        } else {
            self = try Value.decodeObject(from: decoder)
        }
    }

    private static func decodeObject(from decoder: any Decoder) throws -> Value {
        let container = try decoder.container(keyedBy: FieldKey.self)
        let keys = container.allKeys
        if keys.count == 1, let key = keys.first, NameRules.isReserved(key.stringValue) {
            switch key.stringValue {
            case "$double":
                return .double(try container.decode(Double.self, forKey: key))
            case "$bytes":
                let text = try container.decode(String.self, forKey: key)
                do throws(Base64.Problem) {
                    return .bytes(try Base64.decode(text))
                } catch {
                    throw DecodingError.dataCorruptedError(forKey: key, in: container, debugDescription: "$bytes \(error)")
                }
            case "$timestamp":
                return .timestamp(try container.decode(Int64.self, forKey: key))
            default:
                break
            }
        }
        return .object(try Fields(from: decoder))
    }

    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .null:
            var container = encoder.singleValueContainer()
            try container.encodeNil()
        case .bool(let flag):
            var container = encoder.singleValueContainer()
            try container.encode(flag)
        case .int(let number):
            var container = encoder.singleValueContainer()
            try container.encode(number)
        case .double(let number):
            guard number.isFinite else {
                throw EncodingError.invalidValue(
                    number, .init(codingPath: encoder.codingPath, debugDescription: "JSON has no form for \(number)"))
            }
            if number.rounded() == number {
                var container = encoder.container(keyedBy: FieldKey.self)
                try container.encode(number, forKey: FieldKey("$double"))
            } else {
                var container = encoder.singleValueContainer()
                try container.encode(number)
            }
        case .string(let text):
            var container = encoder.singleValueContainer()
            try container.encode(text)
        case .bytes(let data):
            var container = encoder.container(keyedBy: FieldKey.self)
            try container.encode(Data(data).base64EncodedString(), forKey: FieldKey("$bytes"))
        case .timestamp(let micros):
            var container = encoder.container(keyedBy: FieldKey.self)
            try container.encode(micros, forKey: FieldKey("$timestamp"))
        case .array(let elements):
            var container = encoder.unkeyedContainer()
            for element in elements { try container.encode(element) }
        case .object(let fields):
            try fields.encode(to: encoder)
        }
    }
}

/// Fields as a JSON object. A name starting with `$` is refused: it would
/// read back as one of the special value forms.
extension Fields: Codable {
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: FieldKey.self)
        var pairs: [(String, Value)] = []
        for key in container.allKeys {
            guard !NameRules.isReserved(key.stringValue) else {
                throw DecodingError.dataCorruptedError(
                    forKey: key, in: container, debugDescription: "field names starting with $ are reserved")
            }
            pairs.append((key.stringValue, try container.decode(Value.self, forKey: key)))
        }
        self.init(pairs)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: FieldKey.self)
        for (name, value) in self {
            guard !NameRules.isReserved(name) else {
                throw EncodingError.invalidValue(
                    name, .init(codingPath: encoder.codingPath, debugDescription: "field names starting with $ are reserved"))
            }
            try container.encode(value, forKey: FieldKey(name))
        }
    }
}

/// A coding key made at run time: a field name.
struct FieldKey: CodingKey {
    let stringValue: String
    init(_ name: String) { stringValue = name }
    init?(stringValue: String) { self.stringValue = stringValue }
    var intValue: Int? { nil }
    init?(intValue: Int) { nil }
}
