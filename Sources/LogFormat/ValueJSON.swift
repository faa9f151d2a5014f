import Foundation

/// The JSON form of values (`Format/sync-protocol.md`, "Values"): JSON's own
/// types where they fit, an integer literal for an int, and single-key
/// objects for what JSON lacks: `{"$double": 2}` for an integral double (so
/// it stays a double), `{"$bytes": "<base64>"}`, `{"$timestamp": <µs>}`.
/// Field names starting with `$` are reserved for these forms.
///
/// Decoding goes by a number's value, as `JSONReader` does, as far as the
/// decoder tells it: `Decoder` gives a number only as the types it converts
/// it to. A number `JSONDecoder` reads as an `Int64` but not as a `Double`
/// is not zero but nearer to zero than any binary64 (`1e-400`): by value a
/// double zero with the number's sign (`Format/sync-protocol.md`, section
/// 4), which neither conversion gives, so it is refused rather than read as
/// the int 0. `JSONReader`, which reads the digits, is exact for every text.
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
            try Value.checkInteger(number, asDouble: try? container.decode(Double.self), at: container.codingPath)
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
                let micros = try container.decode(Int64.self, forKey: key)
                try checkInteger(micros, asDouble: try? container.decode(Double.self, forKey: key), at: container.codingPath + [key])
                return .timestamp(micros)
            default:
                break
            }
        }
        return .object(try Fields(from: decoder))
    }

    /// Refuses a number that the decoder read as the Int64 `integer` but
    /// could not read as a Double: one too small for any binary64, which
    /// `JSONDecoder` reads as the int 0 (see the type's comment).
    private static func checkInteger(_ integer: Int64, asDouble double: Double?, at codingPath: [any CodingKey]) throws {
        guard double == nil else { return }
        throw DecodingError.dataCorrupted(
            .init(
                codingPath: codingPath,
                debugDescription: "a number read as the int \(integer) is not representable as a double: "
                    + "not zero, but nearer to zero than any binary64, so a double zero whose sign Codable cannot read"))
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
