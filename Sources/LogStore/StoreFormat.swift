import LMDB
import LogFormat

/// The marker that makes an LMDB environment a sync store, and the keys of
/// the `meta` database (`Format/storage.md`, "The meta database").
enum StoreFormat {
    /// `meta` key holding the marker: the 8 magic bytes then a u32 version.
    static let markerKey = Array("format".utf8)
    static let magic = Array("SYNCLOG\0".utf8)
    /// The store layout this code writes and reads. It changes when a named
    /// database or a key layout changes; the entry version is separate.
    static let storeVersion: UInt32 = 1
    /// `meta` key holding the store's 16-byte UUIDv7, made when it was created.
    static let storeIDKey = Array("store-id".utf8)
    /// `meta` key holding a u64: below this offset compaction may have left
    /// holes in the log; from it on, offsets are dense.
    static let compactedBelowKey = Array("compacted-below".utf8)
    /// `meta` key of a sync server's store (LogServer's `ServerStorage`),
    /// which a client's store never has: read only to name a server's data
    /// directory given where a store was meant.
    static let serverIDKey = Array("server-id".utf8)

    static var marker: [UInt8] {
        var writer = ByteWriter(capacity: 12)
        writer.write(bytes: magic)
        writer.write(bigEndian: storeVersion)
        return writer.bytes
    }

    /// The store version in a marker value, or nil if the value is not a marker.
    static func version(ofMarker bytes: [UInt8]) -> UInt32? {
        guard bytes.count == 12, Array(bytes[0..<8]) == magic else { return nil }
        return UInt32(bigEndianBytes: Array(bytes[8..<12]))
    }
}

/// Log offsets as LMDB keys: 8 bytes big-endian, so key order is log order.
enum OffsetKey {
    static func encode(_ offset: UInt64) -> [UInt8] { offset.bigEndianBytes }

    /// Where a read of the log that follows `offset` begins: just past its
    /// key (the key and a zero byte, the least key after it), or at the
    /// first key for 0. A read from the next offset's key instead would step
    /// over a key between the two that is not an offset, damage a read in
    /// one piece reports.
    static func seekKey(after offset: UInt64) -> [UInt8]? {
        offset == 0 ? nil : encode(offset) + [0]
    }

    /// Nil unless the key is exactly 8 bytes.
    static func decode(_ key: UnsafeRawBufferPointer) -> UInt64? { UInt64(bigEndianBytes: key) }

    /// The offset a key of the derived table `table` names. A key that is
    /// not 8 bytes is damage to report: skipped, it would hide its row.
    /// - Throws: `LogStoreError.corruptEntry` naming the table and the key
    ///   (its length, and its first 32 bytes in hex).
    static func decode(_ key: UnsafeRawBufferPointer, table: String, path: String) throws -> UInt64 {
        guard let offset = decode(key) else { throw damaged(key, table: table, path: path) }
        return offset
    }

    /// The error for a key of `table` (the log's too) that is not 8 bytes.
    static func damaged(_ key: UnsafeRawBufferPointer, table: String, path: String) -> LogStoreError {
        LogStoreError(.corruptEntry, path: path, "\(table): a key of \(damagedKey(key)), not an offset of 8")
    }
}

/// A damaged key as a message names it: its length, and its first 32
/// bytes in hex.
func damagedKey(_ key: UnsafeRawBufferPointer) -> String {
    let hex = key.prefix(32).map { ($0 < 0x10 ? "0" : "") + String($0, radix: 16) }.joined()
    return "\(key.count) bytes (\(hex)\(key.count > 32 ? "..." : ""))"
}
