import Foundation

/// A key of bytes (an LMDB key, say) as a dictionary or set key, hashed and
/// compared as a whole, in LMDB's order.
///
/// Keys of up to `inlineCountMax` bytes (an entity key of a short type and a
/// ULID or UUID id) are held in four words, most significant byte first and
/// zero padded: making one allocates nothing, and comparing two compares
/// words. Replay makes, hashes and sorts tens of thousands of these per
/// chunk. Longer keys keep their bytes in an array as well.
public struct ByteKey: Hashable, Comparable, Sendable {
    /// The first 32 bytes, big-endian, zero padded.
    @usableFromInline let words: (UInt64, UInt64, UInt64, UInt64)
    @usableFromInline let count: Int
    /// Every byte, for keys longer than `inlineCountMax` only.
    @usableFromInline let long: [UInt8]?

    @usableFromInline
    static let inlineCountMax = 32

    public init(_ bytes: [UInt8]) {
        self = bytes.withUnsafeBytes { ByteKey($0) }
    }

    // Inlinable: replay makes, hashes, compares and sorts these from
    // another module.

    @inlinable
    public init(_ bytes: UnsafeRawBufferPointer) {
        count = bytes.count
        long = bytes.count > ByteKey.inlineCountMax ? [UInt8](bytes) : nil
        words = (
            ByteKey.word(bytes, at: 0), ByteKey.word(bytes, at: 8), ByteKey.word(bytes, at: 16),
            ByteKey.word(bytes, at: 24)
        )
    }

    /// Eight bytes from `start` as a big-endian word, zeros past the end.
    @inlinable
    static func word(_ bytes: UnsafeRawBufferPointer, at start: Int) -> UInt64 {
        if bytes.count - start >= 8 { return UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: start, as: UInt64.self)) }
        var word: UInt64 = 0
        var index = start
        while index < min(bytes.count, start + 8) {
            word |= UInt64(bytes[index]) << (8 * (7 - (index - start)))
            index += 1
        }
        return word
    }

    public var bytes: [UInt8] { withUnsafeBytes { [UInt8]($0) } }

    /// Calls `body` with the key's bytes (from the stack for a short key).
    @inlinable
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        if let long { return try long.withUnsafeBytes(body) }
        var stored = (words.0.bigEndian, words.1.bigEndian, words.2.bigEndian, words.3.bigEndian)
        return try Swift.withUnsafeBytes(of: &stored) { try body(UnsafeRawBufferPointer(rebasing: $0[..<count])) }
    }

    @inlinable
    public func hash(into hasher: inout Hasher) {
        if let long {
            long.withUnsafeBytes { hasher.combine(bytes: $0) }
        } else {
            hasher.combine(words.0)
            hasher.combine(words.1)
            hasher.combine(words.2)
            hasher.combine(words.3)
            hasher.combine(count)
        }
    }

    @inlinable
    public static func == (lhs: ByteKey, rhs: ByteKey) -> Bool {
        guard lhs.count == rhs.count, lhs.words == rhs.words else { return false }
        // Equal words and counts are equal keys unless both are long.
        return lhs.long == rhs.long
    }

    /// LMDB's order: the bytes as memcmp compares them, then the shorter
    /// first. Zero padding sorts like the end of a key, so equal words
    /// leave the order to the lengths unless both keys are long.
    @inlinable
    public static func < (lhs: ByteKey, rhs: ByteKey) -> Bool {
        if lhs.words != rhs.words {
            if lhs.words.0 != rhs.words.0 { return lhs.words.0 < rhs.words.0 }
            if lhs.words.1 != rhs.words.1 { return lhs.words.1 < rhs.words.1 }
            if lhs.words.2 != rhs.words.2 { return lhs.words.2 < rhs.words.2 }
            return lhs.words.3 < rhs.words.3
        }
        guard let left = lhs.long, let right = rhs.long else { return lhs.count < rhs.count }
        return left.withUnsafeBytes { a in right.withUnsafeBytes { b in ByteKey.compare(a, b) < 0 } }
    }

    /// LMDB's order of two byte strings (also the canonical order of field
    /// names): memcmp over the common length, then the shorter first.
    /// Negative, zero or positive, as for memcmp.
    @inlinable
    public static func compare(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Int {
        let common = min(a.count, b.count)
        // Field names mostly differ in their first bytes: a loop finds that
        // without a call. Long shared prefixes (the keys of one entity type)
        // go on to memcmp.
        let head = min(common, ByteKey.inlineCompareCountMax)
        var index = 0
        while index < head {
            let (x, y) = (a[index], b[index])
            if x != y { return Int(x) - Int(y) }
            index += 1
        }
        if common > head, let x = a.baseAddress, let y = b.baseAddress {
            let order = Int(memcmp(x + head, y + head, common - head))
            if order != 0 { return order }
        }
        return a.count - b.count
    }

    /// Bytes `compare` checks one at a time before it calls memcmp.
    @usableFromInline
    static let inlineCompareCountMax = 16
}
