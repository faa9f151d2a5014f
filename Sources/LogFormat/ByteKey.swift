import Foundation

/// A key of bytes (an LMDB key, say) as a dictionary or set key: hashed and
/// compared as a whole buffer, where an array of bytes would hash one byte
/// at a time.
public struct ByteKey: Hashable, Comparable, Sendable {
    public let bytes: [UInt8]

    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    // Inlinable: replay hashes, compares and sorts tens of thousands of
    // these per chunk, from another module.

    @inlinable
    public func hash(into hasher: inout Hasher) {
        bytes.withUnsafeBytes { hasher.combine(bytes: $0) }
    }

    @inlinable
    public static func == (lhs: ByteKey, rhs: ByteKey) -> Bool { lhs.bytes == rhs.bytes }

    /// LMDB's order.
    @inlinable
    public static func < (lhs: ByteKey, rhs: ByteKey) -> Bool {
        lhs.bytes.withUnsafeBytes { a in rhs.bytes.withUnsafeBytes { b in ByteKey.compare(a, b) < 0 } }
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
