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
            let compactedBelow = try log.compactedBelow(txn)
            try txn.withCursor(log.logDatabase) { cursor in
                var item = try cursor.seek(atLeast: OffsetKey.encode(expected))
                while let (key, value) = item, chunk.count < EventLog.scanChunkCountMax {
                    let entry = try EventLog.decode(key: key, value: value, path: log.path)
                    if let end, entry.offset > end {
                        reachedEnd = true
                        return
                    }
                    try EventLog.checkDensity(
                        expected: expected, found: entry.offset, compactedBelow: compactedBelow, path: log.path)
                    chunk.append(entry)
                    expected = entry.offset + 1
                    item = try cursor.next()
                }
                if item == nil { reachedEnd = true }
            }
        }
        chunk.reverse()
        buffer = chunk
        nextOffset = expected
        if reachedEnd || end.map({ expected > $0 }) == true { exhausted = true }
    }
}
