import LMDB
import LogFormat

/// Reads log entries in order, a chunk per read transaction, so a scan of
/// any length holds at most one chunk (`EventLog.scanChunkCountMax` entries
/// or about `EventLog.scanChunkBytesMax` bytes) and never keeps one snapshot
/// open for long.
///
/// It checks what a reader must: every entry decodes (checksum included),
/// sits under its own offset, and follows the previous one with no gap.
///
/// ```swift
/// var scanner = log.entries(from: 1)
/// while let entry = try scanner.next() { ... }
/// ```
public struct EntryScanner {
    private let log: EventLog
    private let end: UInt64?
    /// The offset the next entry must have.
    public private(set) var nextOffset: UInt64
    private var chunk = Chunk()
    private var exhausted = false

    /// Entries as stored, one after another, copied out of one read
    /// transaction. `next()` decodes them one at a time, so the reader is
    /// done with an entry before the next one is made. Decoding a chunk
    /// ahead kept a thousand entries' allocations alive at once, which sent
    /// malloc down its slow paths: that took a third of a scan.
    private struct Chunk {
        var bytes: [UInt8] = []
        /// Where each entry ends in `bytes`, and its offset (its key).
        var ends: [Int] = []
        var offsets: [UInt64] = []
        /// The next entry to decode.
        var index = 0
        /// The compaction watermark as the chunk's transaction saw it.
        var compactedBelow: UInt64 = 0
        /// A key that is not an offset, met after the chunk's last entry:
        /// reported once the entries before it have been read.
        var badKey: LogStoreError?

        var isDone: Bool { index == offsets.count }

        mutating func empty() {
            bytes.removeAll(keepingCapacity: true)
            ends.removeAll(keepingCapacity: true)
            offsets.removeAll(keepingCapacity: true)
            index = 0
            badKey = nil
        }
    }

    init(log: EventLog, next: UInt64, end: UInt64?) {
        self.log = log
        self.nextOffset = next
        self.end = end
        if let end, end < next { exhausted = true }
    }

    /// The next entry, or nil at the end of the range.
    /// - Throws: `LogStoreError` `.corruptEntry` or `.gap`; the scanner stays
    ///   at the failing offset.
    public mutating func next() throws -> Entry? {
        if chunk.isDone {
            if let badKey = chunk.badKey { throw badKey }
            try refill()
            guard !chunk.isDone else { return nil }
        }
        let index = chunk.index
        let offset = chunk.offsets[index]
        let range = (index == 0 ? 0 : chunk.ends[index - 1])..<chunk.ends[index]
        let entry = try chunk.bytes.withUnsafeBytes { bytes in
            try withUnsafeBytes(of: offset.bigEndian) { key in
                try EventLog.decode(
                    key: key, value: UnsafeRawBufferPointer(rebasing: bytes[range]), following: &nextOffset,
                    compactedBelow: chunk.compactedBelow, path: log.path)
            }
        }
        chunk.index += 1
        // No offset follows the last there is (`nextOffset` wrapped to 0).
        if offset == .max { exhausted = true }
        return entry
    }

    /// Copies the next chunk out of one read transaction.
    private mutating func refill() throws {
        var chunk = Chunk()
        swap(&chunk, &self.chunk)
        chunk.empty()
        guard !exhausted else { return }
        let (log, end, first) = (self.log, self.end, nextOffset)
        // Set when the chunk ends early (full, or at a bad key) rather than
        // at the end of the log or of the range.
        var more = false
        try log.environment.read { txn in
            chunk.compactedBelow = try log.compactedBelow(txn)
            try txn.forEach(log.logDatabase, from: OffsetKey.seekKey(after: first - 1)) { key, value in
                guard let offset = OffsetKey.decode(key) else {
                    let error = OffsetKey.damaged(key, table: "log", path: log.path)
                    if chunk.offsets.isEmpty { throw error }
                    chunk.badKey = error
                    more = true
                    return false
                }
                if let end, offset > end { return false }
                chunk.bytes.append(contentsOf: value)
                chunk.ends.append(chunk.bytes.count)
                chunk.offsets.append(offset)
                more = chunk.offsets.count == EventLog.scanChunkCountMax || chunk.bytes.count >= EventLog.scanChunkBytesMax
                return !more
            }
        }
        self.chunk = chunk
        if !more { exhausted = true }
    }
}

extension EventLog {
    /// The whole log as one snapshot, in one read transaction: `start` gets
    /// its compaction watermark and last offset, then `visit` every entry in
    /// order, checked as `EntryScanner` checks them. A scan in chunks
    /// (`entries(from:)`) can see another process compact the log between
    /// two chunks, which reuses offsets below the watermark; a copy of the
    /// log (an export) must not.
    ///
    /// The snapshot pins the pages it reads, so the file may grow while
    /// others write during a long read. In this process a write that must
    /// grow the map waits for the snapshot to end, so `visit` must not wait
    /// for one.
    public func readSnapshot(
        start: (_ compactedBelow: UInt64, _ lastOffset: UInt64) throws -> Void, visit: (Entry) throws -> Void
    ) throws {
        try environment.read { txn in
            let compactedBelow = try compactedBelow(txn)
            try start(compactedBelow, try EventLog.lastPosition(txn, log: logDatabase, path: path).lastOffset)
            var expected: UInt64 = 1
            try txn.forEach(logDatabase) { key, value in
                try visit(
                    try EventLog.decode(
                        key: key, value: value, following: &expected, compactedBelow: compactedBelow, path: path))
                return true
            }
        }
    }
}
