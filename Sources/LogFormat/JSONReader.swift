/// A strict JSON reader (RFC 8259) that builds `JSONValue` trees straight
/// from UTF-8, for the wire messages whose fields hold `Value`s.
///
/// Why not `JSONDecoder` alone: `Codable` can only learn a value's kind by
/// trying one and catching the error, and those errors were most of the cost
/// of reading a pull page. This reader looks at the first byte instead.
/// Numbers are read by value, as `Format/sync-protocol.md` section 4 says: a
/// whole number within Int64 is an int whatever its form, and that int is
/// the exact value the text writes, not the double nearest to it.
public enum JSONValue: Equatable, Sendable {
    case null
    case bool(Bool)
    /// A number whose exact value is a whole number within Int64 (`2`,
    /// `2.0`, `1e2`, `0e-400`), but for zero written with a minus sign.
    case int(Int64)
    /// Zero written with a minus sign (`-0`, `-0.0`, `-0e-400`): a whole
    /// number, so the int 0 as a value, but negative zero inside
    /// `{"$double": ...}` (section 4), which is why it is kept apart.
    case negativeZero
    /// A whole number from 2^63 to 2^64 - 1, exactly: past Int64, so a
    /// double as a `Value` (section 4: `Value(json:)` reads it as the
    /// binary64 nearest to it, as `double` would hold it), but the full
    /// range of a `u64` field (`Format/README.md`: an export's offsets,
    /// versions and timestamps), which a double would round.
    case unsigned(UInt64)
    /// Any other number, as the binary64 nearest to its exact value: a
    /// number that is not whole (`1.5`; also `1.00000000000000001`, whose
    /// double is 1, and `1e-400`, whose double is zero), or a whole number
    /// below -2^63 or from 2^64 on.
    case double(Double)
    case string(String)
    case array([JSONValue])
    /// Members in document order (a repeated name is refused while reading).
    case object([(String, JSONValue)])
    /// Valid JSON that the reader does not build, and why: a number whose
    /// nearest binary64 is not finite, or arrays and objects nested deeper
    /// than `JSONReader.depthMax`. Only `parse(_:keepingUnreadableValues:)`
    /// makes it, so that a push can reject the one operation that holds it
    /// (`Format/sync-protocol.md` section 7) rather than the whole request.
    case unreadable(String)

    public static func == (lhs: JSONValue, rhs: JSONValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case (.bool(let a), .bool(let b)): a == b
        case (.int(let a), .int(let b)): a == b
        case (.negativeZero, .negativeZero): true
        case (.unsigned(let a), .unsigned(let b)): a == b
        case (.double(let a), .double(let b)): a.bitPattern == b.bitPattern
        case (.string(let a), .string(let b)): a == b
        case (.array(let a), .array(let b)): a == b
        case (.object(let a), .object(let b)): a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        case (.unreadable(let a), .unreadable(let b)): a == b
        default: false
        }
    }

    /// The member named `name` of an object.
    public subscript(name: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.0 == name }?.1
    }
}

/// Why a text is not the JSON expected, and where.
public struct JSONReadError: Error, Equatable, CustomStringConvertible {
    public var position: Int
    public var detail: String
    public var description: String { "JSON at byte \(position): \(detail)" }
}

public struct JSONReader {
    /// How deep arrays and objects may nest: a `Value` (32) inside a message.
    public static let depthMax = 64

    /// - Parameter keepingUnreadableValues: whether a number outside
    ///   binary64, or nesting deeper than `depthMax`, becomes
    ///   `JSONValue.unreadable` (its syntax still checked) rather than an
    ///   error for the whole text.
    public static func parse(_ bytes: some Collection<UInt8>, keepingUnreadableValues: Bool = false) throws(JSONReadError)
        -> JSONValue
    {
        let array = Array(bytes)
        return try array.withUnsafeBufferPointer { (buffer) throws(JSONReadError) -> JSONValue in
            var reader = JSONReader(bytes: buffer, keepsUnreadable: keepingUnreadableValues)
            reader.skipWhitespace()
            let value = try reader.value(depth: 0)
            reader.skipWhitespace()
            guard reader.index == buffer.count else { throw reader.error("text after the JSON value") }
            return value
        }
    }

    private let bytes: UnsafeBufferPointer<UInt8>
    private var index = 0
    private let keepsUnreadable: Bool

    private init(bytes: UnsafeBufferPointer<UInt8>, keepsUnreadable: Bool) {
        self.bytes = bytes
        self.keepsUnreadable = keepsUnreadable
    }

    private func error(_ detail: String) -> JSONReadError { JSONReadError(position: index, detail: detail) }

    private mutating func skipWhitespace() {
        while index < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[index]) { index += 1 }
    }

    private mutating func value(depth: Int) throws(JSONReadError) -> JSONValue {
        guard index < bytes.count else { throw error("the text ends where a value should start") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try object(depth: depth)
        case UInt8(ascii: "["): return try array(depth: depth)
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): return try literal("true", .bool(true))
        case UInt8(ascii: "f"): return try literal("false", .bool(false))
        case UInt8(ascii: "n"): return try literal("null", .null)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
        default: throw error("unexpected byte 0x\(String(bytes[index], radix: 16))")
        }
    }

    private mutating func literal(_ word: StaticString, _ value: JSONValue) throws(JSONReadError) -> JSONValue {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count,
            (0..<count).allSatisfy({ bytes[index + $0] == word.utf8Start[$0] })
        else { throw error("expected \(word)") }
        index += count
        return value
    }

    private mutating func object(depth: Int) throws(JSONReadError) -> JSONValue {
        guard depth < JSONReader.depthMax else { return try tooDeep() }
        index += 1
        var members: [(String, JSONValue)] = []
        // Repeated names are found by a scan while the object is small (a
        // wire message or an entity's fields), and by a set past that:
        // hashing every name of every small object was a large part of
        // reading a pull page.
        var names: Set<String>?
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            return .object(members)
        }
        // Room for a wire message's members or an entity's fields without regrowing.
        members.reserveCapacity(8)
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw error("expected a member name") }
            let name = try string()
            guard JSONReader.isNew(name, in: members, &names) else {
                throw error("member \"\(name.prefix(40))\" appears twice")
            }
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw error("expected ':'") }
            index += 1
            skipWhitespace()
            members.append((name, try value(depth: depth + 1)))
            skipWhitespace()
            guard index < bytes.count else { throw error("the text ends inside an object") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "}") {
                index += 1
                return .object(members)
            } else {
                throw error("expected ',' or '}'")
            }
        }
    }

    /// Objects with up to this many members look for a repeated name by scanning.
    public static let memberScanCountMax = 16

    /// Whether no member of `members` has `name` (compared as `String`s, as
    /// a set compares them); `names` is the set, made once the object grows
    /// past `memberScanCountMax` members.
    private static func isNew(_ name: String, in members: [(String, JSONValue)], _ names: inout Set<String>?) -> Bool {
        if names == nil, members.count < memberScanCountMax {
            return !members.contains { $0.0 == name }
        }
        var set = names ?? Set(members.map(\.0))
        names = nil  // So the insert below owns the storage and does not copy it.
        let inserted = set.insert(name).inserted
        names = set
        return inserted
    }

    private mutating func array(depth: Int) throws(JSONReadError) -> JSONValue {
        guard depth < JSONReader.depthMax else { return try tooDeep() }
        index += 1
        var elements: [JSONValue] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            return .array(elements)
        }
        while true {
            skipWhitespace()
            elements.append(try value(depth: depth + 1))
            skipWhitespace()
            guard index < bytes.count else { throw error("the text ends inside an array") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
            } else if bytes[index] == UInt8(ascii: "]") {
                index += 1
                return .array(elements)
            } else {
                throw error("expected ',' or ']'")
            }
        }
    }

    /// An array or object at `depthMax`: an error, or, when unreadable
    /// values are kept, checked without recursion and kept as one.
    private mutating func tooDeep() throws(JSONReadError) -> JSONValue {
        let detail = "nested deeper than \(JSONReader.depthMax)"
        guard keepsUnreadable else { throw error(detail) }
        try skipNested()
        return .unreadable(detail)
    }

    /// Reads past the array or object that starts at `index`, checking its
    /// syntax as `value(depth:)` would, with a stack of the open brackets
    /// instead of recursion (so any depth fits). Repeated member names are
    /// not looked for: the value is refused anyway.
    private mutating func skipNested() throws(JSONReadError) {
        var closers: [UInt8] = []
        while true {
            // At the start of a value.
            guard index < bytes.count else { throw error("the text ends where a value should start") }
            let opener = bytes[index]
            if opener == UInt8(ascii: "{") || opener == UInt8(ascii: "[") {
                let closer = opener == UInt8(ascii: "{") ? UInt8(ascii: "}") : UInt8(ascii: "]")
                index += 1
                skipWhitespace()
                if index < bytes.count, bytes[index] == closer {
                    index += 1
                } else {
                    closers.append(closer)
                    if closer == UInt8(ascii: "}") { try memberName() }
                    continue
                }
            } else {
                _ = try value(depth: 0)  // A scalar: no recursion.
            }
            // After a value: close what ends here, then the next value.
            while true {
                guard let closer = closers.last else { return }
                skipWhitespace()
                guard index < bytes.count else { throw error("the text ends inside an array or object") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                    skipWhitespace()
                    if closer == UInt8(ascii: "}") { try memberName() }
                    break
                } else if bytes[index] == closer {
                    index += 1
                    closers.removeLast()
                } else {
                    throw error("expected ',' or '\(Character(Unicode.Scalar(closer)))'")
                }
            }
        }
    }

    /// A member's name and its colon, leaving `index` at its value.
    private mutating func memberName() throws(JSONReadError) {
        skipWhitespace()
        guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw error("expected a member name") }
        _ = try string()
        skipWhitespace()
        guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw error("expected ':'") }
        index += 1
        skipWhitespace()
    }

    private mutating func string() throws(JSONReadError) -> String {
        index += 1
        let start = index
        // Fast path: no escapes before the closing quote.
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let raw = UnsafeBufferPointer(rebasing: bytes[start..<index])
                index += 1
                // ASCII is valid UTF-8 as it stands: skip the general
                // validator (and its generic overhead), as `ByteReader` does.
                if ByteReader.isASCII(UnsafeRawBufferPointer(raw)) { return String(decoding: raw, as: UTF8.self) }
                guard let text = String(validating: raw, as: UTF8.self) else { throw error("a string is not valid UTF-8") }
                return text
            }
            if byte == UInt8(ascii: "\\") { break }
            guard byte >= 0x20 else { throw error("a control character inside a string") }
            index += 1
        }
        var scalars = [UInt8](bytes[start..<index])
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                guard let text = String(validating: scalars, as: UTF8.self) else { throw error("a string is not valid UTF-8") }
                return text
            case UInt8(ascii: "\\"):
                index += 1
                try escape(into: &scalars)
            case 0..<0x20:
                throw error("a control character inside a string")
            default:
                scalars.append(byte)
                index += 1
            }
        }
        throw error("the text ends inside a string")
    }

    private mutating func escape(into output: inout [UInt8]) throws(JSONReadError) {
        guard index < bytes.count else { throw error("the text ends inside an escape") }
        let byte = bytes[index]
        index += 1
        switch byte {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): output.append(byte)
        case UInt8(ascii: "b"): output.append(0x08)
        case UInt8(ascii: "f"): output.append(0x0C)
        case UInt8(ascii: "n"): output.append(0x0A)
        case UInt8(ascii: "r"): output.append(0x0D)
        case UInt8(ascii: "t"): output.append(0x09)
        case UInt8(ascii: "u"):
            var scalar = try hex4()
            if (0xD800..<0xDC00).contains(scalar) {
                guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u")
                else { throw error("a lone high surrogate") }
                index += 2
                let low = try hex4()
                guard (0xDC00..<0xE000).contains(low) else { throw error("a high surrogate without its low half") }
                scalar = 0x10000 + (scalar - 0xD800) << 10 + (low - 0xDC00)
            } else if (0xDC00..<0xE000).contains(scalar) {
                throw error("a lone low surrogate")
            }
            guard let unicode = Unicode.Scalar(scalar) else { throw error("not a Unicode scalar") }
            output.append(contentsOf: Array(String(Character(unicode)).utf8))
        default:
            throw error("unknown escape \\\(Character(Unicode.Scalar(byte)))")
        }
    }

    private mutating func hex4() throws(JSONReadError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw error("the text ends inside \\u") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt32
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(byte - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(byte - UInt8(ascii: "A") + 10)
            default: throw error("\\u needs four hex digits")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    /// RFC 8259's number grammar; the value decides int or double.
    private mutating func number() throws(JSONReadError) -> JSONValue {
        let start = index
        var isInteger = true
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) else {
            throw error("a number needs a digit")
        }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            let digits = index
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
            guard index > digits else { throw error("a fraction needs a digit") }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            let digits = index
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
            guard index > digits else { throw error("an exponent needs a digit") }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        // "-0" keeps its sign like "-0.0": inside {"$double": ...} it is
        // negative zero (JSONEncoder writes -0.0 that way).
        if isInteger, text == "-0" { return .negativeZero }
        if isInteger, let integer = Int64(text) { return .int(integer) }
        guard let double = Double(text), double.isFinite else {
            let detail = "the number \(text.prefix(40)) is outside binary64"
            if keepsUnreadable { return .unreadable(detail) }
            index = start
            throw error(detail)
        }
        // By value: a whole number within Int64 is an int (2.0, 1e2), read
        // from the digits, since the nearest double can be another integer
        // (9007199254740993.0) or whole when the number is not
        // (1.00000000000000001, and 1e-400, whose nearest double is zero).
        // So is one up to 2^64 - 1, kept as `unsigned`. A whole number
        // within -2^63 to 2^64 - 1 always has a whole nearest double within
        // ±2^64, so only those need the digits.
        if double.rounded() == double, double.magnitude <= 1.844_674_407_370_955_161_6e19,
            let whole = JSONReader.exactWhole(UnsafeBufferPointer(rebasing: bytes[start..<index]))
        {
            // Zero whose digits are all zero: the sign says whether it is "-0.0".
            if whole.magnitude == 0 { return double.sign == .minus ? .negativeZero : .int(0) }
            if !whole.negative, whole.magnitude > UInt64(Int64.max) { return .unsigned(whole.magnitude) }
            if whole.magnitude <= UInt64(Int64.max) + (whole.negative ? 1 : 0) {
                return .int(whole.negative ? Int64(truncatingIfNeeded: 0 &- whole.magnitude) : Int64(whole.magnitude))
            }
        }
        return .double(double)
    }

    /// The sign and magnitude of a number in RFC 8259's grammar when it is a
    /// whole number whose magnitude fits a UInt64, computed from its decimal
    /// digits; otherwise nil.
    static func exactWhole(_ text: UnsafeBufferPointer<UInt8>) -> (negative: Bool, magnitude: UInt64)? {
        var position = 0
        let negative = text[0] == UInt8(ascii: "-")
        if negative { position += 1 }
        // The significant digits (no leading zeros) and the power of ten
        // they are scaled by.
        var digits: [UInt8] = []
        var scale = 0
        var inFraction = false
        while position < text.count, text[position] != UInt8(ascii: "e"), text[position] != UInt8(ascii: "E") {
            let byte = text[position]
            position += 1
            if byte == UInt8(ascii: ".") {
                inFraction = true
                continue
            }
            if inFraction { scale -= 1 }
            if !digits.isEmpty || byte != UInt8(ascii: "0") { digits.append(byte - UInt8(ascii: "0")) }
        }
        if position < text.count {
            position += 1
            var exponentNegative = false
            if text[position] == UInt8(ascii: "+") || text[position] == UInt8(ascii: "-") {
                exponentNegative = text[position] == UInt8(ascii: "-")
                position += 1
            }
            // Clamped: past a billion, the number is zero or outside Int64 anyway.
            var exponent = 0
            while position < text.count {
                exponent = min(exponent * 10 + Int(text[position] - UInt8(ascii: "0")), 1_000_000_000)
                position += 1
            }
            scale += exponentNegative ? -exponent : exponent
        }
        while digits.last == 0 {
            digits.removeLast()
            scale += 1
        }
        guard !digits.isEmpty else { return (negative, 0) }
        // At most 20 digits (UInt64.max has 20), checked for overflow below.
        guard scale >= 0, digits.count + scale <= 20 else { return nil }
        var magnitude: UInt64 = 0
        // The digits, then `scale` zeros.
        for index in 0..<digits.count + scale {
            let (tens, overflow) = magnitude.multipliedReportingOverflow(by: 10)
            let (sum, carry) = tens.addingReportingOverflow(index < digits.count ? UInt64(digits[index]) : 0)
            guard !overflow, !carry else { return nil }
            magnitude = sum
        }
        return (negative, magnitude)
    }
}
