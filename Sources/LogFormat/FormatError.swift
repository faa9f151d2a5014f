/// A value that could not be decoded, or could not be encoded within the
/// format's limits. It names the problem, the log offset when known and the
/// byte position inside the entry, so a reader can say what and where.
public struct FormatError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What went wrong. Static values rather than one case per C-like code,
    /// so new codes do not break exhaustive switches in callers.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        init(_ name: String) { self.name = name }
        public var description: String { name }

        /// The bytes ended before a field did.
        public static let truncated = Code("truncated")
        /// The entry's format version is not one this reader knows.
        public static let unsupportedVersion = Code("unsupported version")
        /// The entry kind byte is not a known kind.
        public static let unknownKind = Code("unknown kind")
        /// Flag bits that this version does not define are set.
        public static let invalidFlags = Code("invalid flags")
        /// The stored CRC32C does not match the header and body.
        public static let badChecksum = Code("bad checksum")
        /// A length or count is larger than the bytes that remain or than a limit.
        public static let lengthOutOfRange = Code("length out of range")
        /// Bytes remain after the last field of the body.
        public static let trailingBytes = Code("trailing bytes")
        /// A string is not valid UTF-8.
        public static let invalidUTF8 = Code("invalid UTF-8")
        /// A value tag or an enumerated byte has no meaning in this version.
        public static let invalidTag = Code("invalid tag")
        /// Object keys are not in strictly ascending byte order (or repeat).
        public static let unsortedKeys = Code("unsorted keys")
        /// Values nest deeper than `Limits.valueDepthMax`.
        public static let depthExceeded = Code("nesting too deep")
        /// The offset stored in the entry is not the key it was read from.
        public static let offsetMismatch = Code("offset mismatch")
        /// A field breaks a rule of the format (an entry offset of 0).
        public static let invalidField = Code("invalid field")
    }

    public var code: Code
    /// The log offset of the entry, when the caller knows it.
    public var offset: UInt64?
    /// The byte position inside the entry where the problem was found.
    public var position: Int
    /// A sentence with the specifics (expected and found values).
    public var detail: String

    public init(_ code: Code, position: Int, _ detail: String, offset: UInt64? = nil) {
        self.code = code
        self.position = position
        self.detail = detail
        self.offset = offset
    }

    public var description: String {
        let location = offset.map { "entry at offset \($0)" } ?? "entry"
        return "\(location): \(code) at byte \(position): \(detail)"
    }
}
