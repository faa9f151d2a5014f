import LMDB
import LogFormat

/// Reads log entries in order, a chunk per read transaction, so a scan of
/// any length holds at most `EventLog.scanChunkCountMax` decoded entries and
/// never keeps one snapshot open for long.
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
    /// The current chunk in reverse order, so `next()` moves each entry out
    /// with `popLast()` instead of copying it (and its references).
    private var buffer: [Entry] = []
    private var exhausted = false

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
        if buffer.isEmpty { try refill() }
        return buffer.popLast()
    }

    private mutating func refill() throws {
        guard !exhausted else { return }
        var chunk: [Entry] = []
        chunk.reserveCapacity(EventLog.scanChunkCountMax)
        var expected = nextOffset
        var reachedEnd = false
        let end = self.end
        let log = self.log
        try log.environment.read { txn in
            (expected, reachedEnd) = try log.readEntries(from: expected, through: end, txn) { entry in
                chunk.append(entry)
                return chunk.count < EventLog.scanChunkCountMax
            }
        }
        chunk.reverse()
        buffer = chunk
        nextOffset = expected
        if reachedEnd || end.map({ expected > $0 }) == true { exhausted = true }
    }
}

extension EventLog {
    /// Reads the entries of `txn` from offset `expected` on, each decoded
    /// and checked to follow the one before it (no hole above the
    /// compaction watermark), handing each to `take` until it returns false
    /// or the log (or `end`) is reached.
    /// - Returns: the offset the next entry must have, and whether the log
    ///   or `end` was reached.
    @inline(__always)
    func readEntries(
        from expected: UInt64, through end: UInt64?, _ txn: borrowing Transaction, _ take: (consuming Entry) throws -> Bool
    ) throws -> (expected: UInt64, reachedEnd: Bool) {
        // Inlined, with `take` consuming each entry, so the scanner's loop
        // (the hot path of every scan) does not copy the entries it keeps:
        // a plain closure taking a borrowed entry made scans about 10% slower.
        let compactedBelow = try compactedBelow(txn)
        var expected = expected
        return try txn.withCursor(logDatabase) { cursor in
            var item = try cursor.seek(atLeast: OffsetKey.encode(expected))
            while let (key, value) = item {
                let entry = try EventLog.decode(key: key, value: value, path: path)
                if let end, entry.offset > end { return (expected, true) }
                try EventLog.checkDensity(expected: expected, found: entry.offset, compactedBelow: compactedBelow, path: path)
                expected = entry.offset + 1
                guard try take(entry) else { return (expected, false) }
                item = try cursor.next()
            }
            return (expected, true)
        }
    }

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
            try start(try compactedBelow(txn), try EventLog.lastPosition(txn, log: logDatabase, path: path).lastOffset)
            _ = try readEntries(from: 1, through: nil, txn) { entry in
                try visit(entry)
                return true
            }
        }
    }
}
