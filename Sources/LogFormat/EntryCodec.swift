/// The binary form of a log entry, version 1 (`Format/storage.md`):
///
/// ```
/// byte  0  u8   format version (1)
/// byte  1  u8   kind (EntryKind)
/// byte  2  u16  flags (none defined in v1; must be 0)
/// byte  4  u32  body length in bytes
/// byte  8  u64  offset (must equal the LMDB key)
/// byte 16  u64  timestamp (HybridTimestamp)
/// byte 24  u32  CRC32C of bytes 0..<24 followed by the body
/// byte 28       body
/// ```
///
/// All integers are big-endian. Decoding checks the checksum before it reads
/// the body, and every length against the bytes that remain.
public enum EntryCodec {
    public static let formatVersion: UInt8 = 1
    public static let headerBytes = 28
    static let checksumPosition = 24

    /// The complete bytes of `entry`.
    /// - Throws: `FormatError.lengthOutOfRange` when the body is larger than
    ///   `Limits.entryBodyBytesMax`, `.depthExceeded` when values nest deeper
    ///   than `Limits.valueDepthMax`: nothing is written that a reader refuses.
    public static func encode(_ entry: Entry) throws(FormatError) -> [UInt8] {
        try encode(offset: entry.offset, timestamp: entry.timestamp, body: entry.body)
    }

    /// The complete bytes of an entry with these parts (what `encode(_:)`
    /// writes, without making the `Entry`, which copies the body).
    public static func encode(offset: UInt64, timestamp: HybridTimestamp, body: borrowing EntryBody) throws(FormatError)
        -> [UInt8]
    {
        precondition(offset > 0, "log offsets start at 1")
        try checkDepth(body, offset: offset)
        let bodySize = bodySize(body)
        guard bodySize <= Limits.entryBodyBytesMax else { throw bodyTooLarge(bodySize, offset: offset) }
        // Sized exactly: growing the array as it filled took about a tenth
        // of a batched append.
        var writer = ByteWriter(capacity: headerBytes + bodySize)
        writer.write(formatVersion)
        writer.write(body.kind.rawValue)
        writer.write(bigEndian: UInt16(0))
        writer.write(bigEndian: UInt32(0))  // body length, patched below
        writer.write(bigEndian: offset)
        writer.write(bigEndian: timestamp.rawValue)
        writer.write(bigEndian: UInt32(0))  // checksum, patched below
        encodeBody(body, into: &writer)
        let bodyCount = writer.count - headerBytes
        guard bodyCount <= Limits.entryBodyBytesMax else { throw bodyTooLarge(bodyCount, offset: offset) }
        writer.patch(bigEndian: UInt32(bodyCount), at: 4)
        writer.patch(bigEndian: writer.withUnsafeBytes { checksum(of: $0) }, at: checksumPosition)
        return writer.bytes
    }

    /// How many of `bytes` the entry they start with takes, header and
    /// body, as its header says; nil when they are too few to hold it. For
    /// a container that stores bytes of its own after an entry; the entry's
    /// bytes still go to `decode`, which checks them.
    public static func count(ofEntryAt bytes: UnsafeRawBufferPointer) -> Int? {
        guard bytes.count >= headerBytes else { return nil }
        let bodyCount = bytes[4..<8].reduce(0) { $0 << 8 | Int($1) }
        return headerBytes + bodyCount <= bytes.count ? headerBytes + bodyCount : nil
    }

    private static func bodyTooLarge(_ count: Int, offset: UInt64) -> FormatError {
        FormatError(
            .lengthOutOfRange, position: headerBytes, "body is \(count) bytes, the limit is \(Limits.entryBodyBytesMax)",
            offset: offset)
    }

    /// Decodes one entry.
    /// - Parameters:
    ///   - bytes: exactly one entry's bytes.
    ///   - expectedOffset: the key the bytes were stored under, if known; a
    ///     different stored offset is `offsetMismatch`.
    /// - Throws: `FormatError` naming the problem and where it is; never traps.
    public static func decode(_ bytes: UnsafeRawBufferPointer, expectedOffset: UInt64? = nil) throws(FormatError)
        -> Entry
    {
        var reader = ByteReader(bytes, offset: expectedOffset)
        let header = try decodeHeader(&reader, expectedOffset: expectedOffset)
        let stored = header.checksum
        let computed = checksum(of: bytes)
        guard stored == computed else {
            throw reader.error(
                .badChecksum, "stored CRC32C \(hex(stored)), computed \(hex(computed))", at: checksumPosition)
        }
        let body = try decodeBody(kind: header.kind, from: &reader)
        guard reader.remaining == 0 else {
            throw reader.error(.trailingBytes, "\(reader.remaining) bytes follow the \(header.kind) body")
        }
        return Entry(offset: header.offset, timestamp: header.timestamp, body: body)
    }

    public static func decode(_ bytes: [UInt8], expectedOffset: UInt64? = nil) throws(FormatError) -> Entry {
        try bytes.withUnsafeBytes { raw in
            Result { () throws(FormatError) in try decode(raw, expectedOffset: expectedOffset) }
        }.get()
    }

    /// The fixed header, read and checked before the body is trusted.
    struct Header: Sendable {
        var kind: EntryKind
        var bodyCount: Int
        var offset: UInt64
        var timestamp: HybridTimestamp
        var checksum: UInt32
    }

    /// Reads and checks the header: version, kind, flags, body length
    /// (against the limit and the bytes present) and offset. The reader must
    /// be at the start of the entry.
    static func decodeHeader(_ reader: inout ByteReader, expectedOffset: UInt64?) throws(FormatError)
        -> Header
    {
        precondition(reader.position == 0, "decodeHeader reads from the start of an entry")
        guard reader.remaining >= headerBytes else {
            throw reader.error(.truncated, "\(reader.remaining) bytes, a header needs \(headerBytes)")
        }
        let version = try reader.readByte("format version")
        guard version == formatVersion else {
            throw reader.error(
                .unsupportedVersion, "format version \(version); this reader knows \(formatVersion)", at: 0)
        }
        let kindByte = try reader.readByte("kind")
        guard let kind = EntryKind(rawValue: kindByte) else {
            throw reader.error(.unknownKind, "kind byte \(kindByte) is not defined", at: 1)
        }
        let flags = try reader.read(UInt16.self, "flags")
        guard flags == 0 else {
            throw reader.error(.invalidFlags, "flags 0x\(String(flags, radix: 16)) set; v1 defines none", at: 2)
        }
        let bodyCount = Int(try reader.read(UInt32.self, "body length"))
        let available = reader.remaining - (headerBytes - reader.position)
        guard bodyCount <= Limits.entryBodyBytesMax, bodyCount == available else {
            throw reader.error(
                .lengthOutOfRange,
                "body length \(bodyCount), \(available) bytes follow the header (limit \(Limits.entryBodyBytesMax))",
                at: 4)
        }
        let offset = try reader.read(UInt64.self, "offset")
        if let expectedOffset, offset != expectedOffset {
            throw reader.error(.offsetMismatch, "entry says offset \(offset), stored at \(expectedOffset)", at: 8)
        }
        guard offset > 0 else { throw reader.error(.invalidField, "offset 0; offsets start at 1", at: 8) }
        let timestamp = HybridTimestamp(rawValue: try reader.read(UInt64.self, "timestamp"))
        let checksum = try reader.read(UInt32.self, "checksum")
        return Header(kind: kind, bodyCount: bodyCount, offset: offset, timestamp: timestamp, checksum: checksum)
    }

    /// The CRC32C of an encoded entry: header bytes before the checksum
    /// field, then the body.
    public static func checksum(of bytes: UnsafeRawBufferPointer) -> UInt32 {
        let head = CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[0..<checksumPosition]))
        return CRC32C.checksum(UnsafeRawBufferPointer(rebasing: bytes[headerBytes...]), continuing: head)
    }

    private static func checkDepth(_ body: EntryBody, offset: UInt64) throws(FormatError) {
        // Every append runs this: no array of the field sets, no closures
        // (with them it took 8% of a batched append).
        let deepest =
            switch body {
            case .intent(let intent): nesting(of: intent.fields)
            case .remote(let remote): nesting(of: remote.fields)
            case .conflict(let conflict): max(nesting(of: conflict.serverFields), nesting(of: conflict.resolvedFields))
            case .snapshot(let snapshot): nesting(of: snapshot.fields)
            case .ack, .reject, .resync: 0
            }
        guard deepest <= Limits.valueDepthMax else {
            throw FormatError(
                .depthExceeded, position: headerBytes, "values nest deeper than \(Limits.valueDepthMax)", offset: offset)
        }
    }

    /// How many arrays and objects enclose the deepest value (0 for flat fields).
    private static func nesting(of fields: Fields) -> Int {
        var deepest = 0
        for field in fields { deepest = max(deepest, nesting(of: field.value)) }
        return deepest
    }

    private static func nesting(of value: Value) -> Int {
        switch value {
        case .array(let elements):
            var deepest = 0
            for index in elements.indices { deepest = max(deepest, nesting(of: elements[index])) }
            return 1 + deepest
        case .object(let fields): return 1 + nesting(of: fields)
        default: return 0
        }
    }

    static func hex(_ value: UInt32) -> String {
        let digits = String(value, radix: 16)
        return "0x" + String(repeating: "0", count: 8 - digits.count) + digits
    }
}
