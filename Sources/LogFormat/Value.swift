/// A field value of an entity: the small set of types an offline-first app
/// stores, closed so every reader can decode every entry.
public enum Value: Hashable, Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    /// Any IEEE 754 double. The store's API refuses NaN and infinities
    /// because they have no JSON form; the codec keeps any bit pattern.
    case double(Double)
    case string(String)
    case bytes([UInt8])
    /// Microseconds since 1970-01-01T00:00:00Z (negative before it).
    case timestamp(Int64)
    indirect case array([Value])
    indirect case object(Fields)

    /// Two values are equal when they would encode to the same bytes: doubles
    /// compare by bit pattern, so NaN equals itself (and `Hashable` stays
    /// lawful) and 0.0 differs from -0.0; strings compare by UTF-8 bytes, so
    /// "é" and "e" with a combining accent differ, as a store that keeps exact
    /// bytes must.
    public static func == (lhs: Value, rhs: Value) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case (.bool(let a), .bool(let b)): a == b
        case (.int(let a), .int(let b)): a == b
        case (.double(let a), .double(let b)): a.bitPattern == b.bitPattern
        case (.string(let a), .string(let b)): Fields.same(a, b)
        case (.bytes(let a), .bytes(let b)): a == b
        case (.timestamp(let a), .timestamp(let b)): a == b
        case (.array(let a), .array(let b)): a == b
        case (.object(let a), .object(let b)): a == b
        default: false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .null: hasher.combine(Tag.null.rawValue)
        case .bool(let flag): hasher.combine(flag)
        case .int(let number): hasher.combine(number)
        case .double(let number): hasher.combine(number.bitPattern)
        case .string(let text): hasher.combine(text.utf8.count); for byte in text.utf8 { hasher.combine(byte) }
        case .bytes(let data): hasher.combine(data)
        case .timestamp(let micros): hasher.combine(micros)
        case .array(let elements): hasher.combine(elements)
        case .object(let fields): hasher.combine(fields)
        }
    }

    /// The tag byte that starts the value's binary form (`Format/storage.md`).
    enum Tag: UInt8 {
        case null = 0, `false` = 1, `true` = 2, int = 3, double = 4
        case string = 5, bytes = 6, timestamp = 7, array = 8, object = 9
    }
}

extension Value: ExpressibleByNilLiteral, ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByFloatLiteral, ExpressibleByStringLiteral, ExpressibleByArrayLiteral,
    ExpressibleByDictionaryLiteral
{
    public init(nilLiteral: ()) { self = .null }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(stringLiteral value: String) { self = .string(value) }
    public init(arrayLiteral elements: Value...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, Value)...) {
        self = .object(Fields(elements))
    }
}

// MARK: - Binary form

extension Value {
    /// Appends the tagged binary form of the value.
    public func encode(into writer: inout ByteWriter) {
        switch self {
        case .null: writer.write(Tag.null.rawValue)
        case .bool(let flag): writer.write((flag ? Tag.true : Tag.false).rawValue)
        case .int(let number):
            writer.write(Tag.int.rawValue)
            writer.write(bigEndian: number)
        case .double(let number):
            writer.write(Tag.double.rawValue)
            writer.write(bigEndian: number.bitPattern)
        case .string(let text):
            writer.write(Tag.string.rawValue)
            writer.write(lengthPrefixed: text)
        case .bytes(let data):
            writer.write(Tag.bytes.rawValue)
            writer.write(lengthPrefixed: data)
        case .timestamp(let micros):
            writer.write(Tag.timestamp.rawValue)
            writer.write(bigEndian: micros)
        case .array(let elements):
            writer.write(Tag.array.rawValue)
            writer.write(bigEndian: UInt32(clamping: elements.count))
            for element in elements { element.encode(into: &writer) }
        case .object(let fields):
            writer.write(Tag.object.rawValue)
            fields.encode(into: &writer)
        }
    }

    /// The size of the tagged binary form: `encode(into:)` writes exactly this.
    public var encodedSize: Int {
        switch self {
        case .null, .bool: 1
        case .int, .double, .timestamp: 9
        case .string(let text): 5 + text.utf8.count
        case .bytes(let data): 5 + data.count
        case .array(let elements): elements.reduce(5) { $0 + $1.encodedSize }
        case .object(let fields): 1 + fields.encodedSize
        }
    }

    /// Reads one value; `depth` counts the arrays and objects around it.
    public static func decode(from reader: inout ByteReader, depth: Int = 0) throws(FormatError) -> Value {
        let start = reader.position
        let tagByte = try reader.readByte("value tag")
        guard let tag = Tag(rawValue: tagByte) else {
            throw reader.error(.invalidTag, "value tag \(tagByte) is not defined", at: start)
        }
        switch tag {
        case .null: return .null
        case .false: return .bool(false)
        case .true: return .bool(true)
        case .int: return .int(try reader.read(Int64.self, "int value"))
        case .double: return .double(Double(bitPattern: try reader.read(UInt64.self, "double value")))
        case .string: return .string(try reader.readString("string value"))
        case .bytes: return .bytes(try reader.readBytes("bytes value"))
        case .timestamp: return .timestamp(try reader.read(Int64.self, "timestamp value"))
        case .array:
            guard depth < Limits.valueDepthMax else {
                throw reader.error(.depthExceeded, "values nest deeper than \(Limits.valueDepthMax)", at: start)
            }
            let count = try reader.readCount("array count", minimumElementBytes: 1)
            var elements: [Value] = []
            elements.reserveCapacity(count)
            for _ in 0..<count { elements.append(try decode(from: &reader, depth: depth + 1)) }
            return .array(elements)
        case .object:
            guard depth < Limits.valueDepthMax else {
                throw reader.error(.depthExceeded, "values nest deeper than \(Limits.valueDepthMax)", at: start)
            }
            return .object(try Fields.decode(from: &reader, depth: depth + 1))
        }
    }
}
