/// Appends big-endian integers, lengths and strings to a byte buffer it
/// owns. The writer never fails: limits are checked by the encoders that
/// use it.
///
/// Each write stores into capacity the writer already holds (growing it
/// by doubling when short), with none of an array's per-append checks:
/// encoding the bench's entity fields took 250 ns through an array, 135 ns
/// this way. It cannot be copied, as a copy would share the buffer; `bytes`
/// copies the result out once.
public struct ByteWriter: ~Copyable {
    // Internal rather than private so that the small writes can be
    // inlinable: other modules (records, outbox states) then get them
    // specialized instead of calling the generic code.
    @usableFromInline var base: UnsafeMutableRawPointer
    @usableFromInline var used = 0
    @usableFromInline var capacity: Int

    /// - Parameter capacity: the bytes to hold before growing; an encoder
    ///   that knows its size asks for exactly that.
    public init(capacity: Int = 0) {
        self.capacity = Swift.max(capacity, 16)
        base = .allocate(byteCount: self.capacity, alignment: 1)
    }

    deinit { base.deallocate() }

    /// What was written, as a new array.
    public var bytes: [UInt8] { withUnsafeBytes { [UInt8]($0) } }

    /// How many bytes were written.
    public var count: Int { used }

    /// Calls `body` with what was written, without a copy. The buffer is
    /// valid only inside `body`.
    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: base, count: used))
    }

    /// Room for `byteCount` more bytes, counted as written: the caller
    /// fills all of it.
    @inlinable @inline(__always)
    mutating func claim(_ byteCount: Int) -> UnsafeMutableRawPointer {
        if byteCount > capacity - used { grow(toFit: byteCount) }
        let start = base + used
        used += byteCount
        return start
    }

    @usableFromInline
    mutating func grow(toFit byteCount: Int) {
        let (needed, overflow) = used.addingReportingOverflow(byteCount)
        precondition(!overflow, "a byte writer past Int.max bytes")
        let newCapacity = Swift.max(needed, capacity <= Int.max / 2 ? capacity * 2 : Int.max)
        let newBase = UnsafeMutableRawPointer.allocate(byteCount: newCapacity, alignment: 1)
        newBase.copyMemory(from: base, byteCount: used)
        base.deallocate()
        base = newBase
        capacity = newCapacity
    }

    @inlinable
    public mutating func write(_ value: UInt8) { claim(1).storeBytes(of: value, as: UInt8.self) }

    @inlinable @inline(__always)
    public mutating func write<T: FixedWidthInteger>(bigEndian value: T) {
        // Raw stores need no alignment (SE-0349).
        claim(MemoryLayout<T>.size).storeBytes(of: value.bigEndian, as: T.self)
    }

    /// The bytes of `raw`, as they are.
    @inlinable
    public mutating func write(raw: UnsafeRawBufferPointer) {
        guard let source = raw.baseAddress, !raw.isEmpty else { return }
        claim(raw.count).copyMemory(from: source, byteCount: raw.count)
    }

    public mutating func write(bytes other: [UInt8]) { other.withUnsafeBytes { write(raw: $0) } }

    /// A u32 length followed by the UTF-8 bytes of `string`. A length past
    /// u32 is clamped: such a body is far over `Limits.entryBodyBytesMax`, and
    /// the encoder refuses it before anything is written.
    public mutating func write(lengthPrefixed string: String) {
        // Borrowed where the string is contiguous (native strings are): a
        // copy to call `withUTF8` on cost a retain and a release per string.
        if string.utf8.withContiguousStorageIfAvailable({ write(lengthPrefixedUTF8: $0) }) != nil { return }
        var string = string
        string.withUTF8 { write(lengthPrefixedUTF8: $0) }
    }

    private mutating func write(lengthPrefixedUTF8 utf8: UnsafeBufferPointer<UInt8>) {
        write(bigEndian: UInt32(clamping: utf8.count))
        write(raw: UnsafeRawBufferPointer(utf8))
    }

    /// A u32 length followed by `data`.
    public mutating func write(lengthPrefixed data: [UInt8]) {
        write(bigEndian: UInt32(clamping: data.count))
        write(bytes: data)
    }

    /// Overwrites four bytes at `index` with a big-endian u32 (used to patch
    /// a checksum or a length once it is known).
    public mutating func patch(bigEndian value: UInt32, at index: Int) {
        precondition(index >= 0 && index <= used - 4, "patch past the end")
        (base + index).storeBytes(of: value.bigEndian, as: UInt32.self)
    }
}

/// Reads big-endian fields from a borrowed buffer. Every read checks the
/// remaining length first and throws `FormatError.truncated` rather than
/// reading past the end; lengths are checked against what remains before
/// anything is allocated.
/// The buffer must outlive the reader; readers live inside one decode call.
public struct ByteReader {
    @usableFromInline let buffer: UnsafeRawBufferPointer
    /// The position of the next byte to read, from the start of the buffer.
    public var position: Int { cursor }
    @usableFromInline var cursor: Int
    /// The log offset of the entry being read, quoted in errors.
    let offset: UInt64?

    public init(_ buffer: UnsafeRawBufferPointer, position: Int = 0, offset: UInt64? = nil) {
        self.buffer = buffer
        self.cursor = position
        self.offset = offset
    }

    public var remaining: Int { buffer.count - cursor }

    public func error(_ code: FormatError.Code, _ detail: String, at position: Int? = nil) -> FormatError {
        FormatError(code, position: position ?? self.position, detail, offset: offset)
    }

    // The small reads are inlinable, so decoders in other modules (records,
    // entries) get them specialized and inlined, and always inlined: left
    // to itself the optimizer kept them as calls in `Fields.decode`, where
    // inlining them made a scan of the log 12% faster and `Store.get` 5%.

    /// Moves past `count` bytes and returns where they start.
    @inlinable @inline(__always)
    mutating func advance(_ count: Int, for what: StaticString) throws(FormatError) -> Int {
        guard count <= buffer.count - cursor else { throw truncated(count, what) }
        defer { cursor += count }
        return cursor
    }

    @usableFromInline
    func truncated(_ count: Int, _ what: StaticString) -> FormatError {
        error(.truncated, "\(what) needs \(count) bytes, \(remaining) remain")
    }

    @inlinable @inline(__always)
    public mutating func readByte(_ what: StaticString) throws(FormatError) -> UInt8 {
        buffer[try advance(1, for: what)]
    }

    @inlinable @inline(__always)
    public mutating func read<T: FixedWidthInteger>(_: T.Type, _ what: StaticString) throws(FormatError) -> T {
        T(bigEndian: buffer.loadUnaligned(fromByteOffset: try advance(MemoryLayout<T>.size, for: what), as: T.self))
    }

    /// Moves past `count` bytes.
    @inlinable @inline(__always)
    public mutating func skip(_ count: Int, _ what: StaticString) throws(FormatError) {
        _ = try advance(count, for: what)
    }

    /// Reads a u32 count and checks that at least `count * minimumElementBytes`
    /// bytes remain, so a corrupt count cannot drive a huge allocation.
    @inlinable @inline(__always)
    public mutating func readCount(_ what: StaticString, minimumElementBytes: Int) throws(FormatError) -> Int {
        let start = cursor
        let count = Int(try read(UInt32.self, what))
        // A multiplication, not a division: this runs for every length read.
        let (needed, overflow) = count.multipliedReportingOverflow(by: max(minimumElementBytes, 1))
        guard !overflow, needed <= remaining else {
            throw countOutOfRange(count, what, at: start)
        }
        return count
    }

    @usableFromInline
    func countOutOfRange(_ count: Int, _ what: StaticString, at start: Int) -> FormatError {
        error(.lengthOutOfRange, "\(what) is \(count), only \(remaining) bytes remain", at: start)
    }

    /// Reads a u32 length and then that many bytes, as a borrowed slice.
    @inlinable @inline(__always)
    public mutating func readLengthPrefixed(_ what: StaticString) throws(FormatError) -> UnsafeRawBufferPointer {
        let count = try readCount(what, minimumElementBytes: 1)
        let start = try advance(count, for: what)
        return UnsafeRawBufferPointer(rebasing: buffer[start..<start + count])
    }

    public mutating func readString(_ what: StaticString) throws(FormatError) -> String {
        let start = position
        return try ByteReader.string(try readLengthPrefixed(what), what, at: start, self)
    }

    /// `raw` as a string, or an error (from `reader`, at `start`) when it is
    /// not valid UTF-8.
    static func string(
        _ raw: UnsafeRawBufferPointer, _ what: StaticString, at start: Int, _ reader: ByteReader
    ) throws(FormatError) -> String {
        let bytes = raw.assumingMemoryBound(to: UInt8.self)
        // Most names, ids and keys are ASCII, which is valid UTF-8 as it
        // stands: skip the general validator (and its generic overhead).
        if ByteReader.isASCII(raw) { return String(decoding: bytes, as: UTF8.self) }
        guard let string = String(validating: bytes, as: UTF8.self) else {
            throw reader.error(.invalidUTF8, "\(what) is not valid UTF-8", at: start)
        }
        return string
    }

    /// True when no byte has its high bit set, checked eight bytes at a time.
    static func isASCII(_ bytes: UnsafeRawBufferPointer) -> Bool {
        var index = 0
        var high: UInt64 = 0
        while bytes.count - index >= 8 {
            high |= bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self)
            index += 8
        }
        while index < bytes.count {
            high |= UInt64(bytes[index])
            index += 1
        }
        return high & 0x8080_8080_8080_8080 == 0
    }

    public mutating func readBytes(_ what: StaticString) throws(FormatError) -> [UInt8] {
        [UInt8](try readLengthPrefixed(what))
    }
}

extension FixedWidthInteger {
    /// The value's bytes, most significant first: the order of every integer
    /// in the format, and the order that makes LMDB keys sort numerically.
    ///
    /// These are inlinable so that the callers in other modules (every log
    /// key, every count) get them specialized: the generic code looked up
    /// type metadata on each call, about 6% of a scan.
    @inlinable
    public var bigEndianBytes: [UInt8] { withUnsafeBytes(of: bigEndian) { Array($0) } }

    /// Nil unless `bytes` is exactly this type's size.
    @inlinable
    public init?(bigEndianBytes bytes: UnsafeRawBufferPointer) {
        guard bytes.count == MemoryLayout<Self>.size else { return nil }
        self.init(bigEndian: bytes.loadUnaligned(as: Self.self))
    }

    /// Nil unless `bytes` is exactly this type's size.
    @inlinable
    public init?(bigEndianBytes bytes: [UInt8]) {
        guard let value = bytes.withUnsafeBytes({ Self(bigEndianBytes: $0) }) else { return nil }
        self = value
    }
}
