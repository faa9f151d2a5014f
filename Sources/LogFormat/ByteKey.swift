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

    /// LMDB's order: memcmp over the common length, then the shorter first.
    @inlinable
    public static func < (lhs: ByteKey, rhs: ByteKey) -> Bool {
        lhs.bytes.withUnsafeBytes { a in
            rhs.bytes.withUnsafeBytes { b in
                let common = min(a.count, b.count)
                let order = common == 0 ? 0 : memcmp(a.baseAddress!, b.baseAddress!, common)
                return order != 0 ? order < 0 : a.count < b.count
            }
        }
    }
}
