/// An entity ID with its type prefix, such as `te_01J3Q4...`: the prefix says
/// what kind of entity the ID names, the rest is a `UUIDv7` in ULID form.
public struct PrefixedID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The longest prefix in characters.
    public static let prefixCountMax = 16

    public let prefix: String
    public let id: UUIDv7

    /// - Returns: nil unless `prefix` is 1 to `prefixCountMax` characters of
    ///   lowercase ASCII letters and digits, starting with a letter.
    public init?(prefix: String, id: UUIDv7) {
        guard PrefixedID.isValid(prefix: prefix) else { return nil }
        self.prefix = prefix
        self.id = id
    }

    /// Parses `prefix_ULID`.
    public init?(_ text: String) {
        guard let separator = text.lastIndex(of: "_"),
            let id = UUIDv7(ulidString: String(text[text.index(after: separator)...]))
        else { return nil }
        self.init(prefix: String(text[..<separator]), id: id)
    }

    public static func isValid(prefix: String) -> Bool {
        let utf8 = Array(prefix.utf8)
        guard (1...prefixCountMax).contains(utf8.count), let first = utf8.first,
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(first)
        else { return false }
        return utf8.allSatisfy {
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains($0) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
        }
    }

    public var description: String { "\(prefix)_\(id.ulidString)" }

    /// IDs of one prefix sort by time; different prefixes sort by prefix.
    public static func < (lhs: Self, rhs: Self) -> Bool { (lhs.prefix, lhs.id) < (rhs.prefix, rhs.id) }
}
