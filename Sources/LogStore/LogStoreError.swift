import LMDB
import LogFormat

/// An error of the log store that is not LMDB's own: what is wrong with the
/// store and where (its path, and the offset when one is involved).
public struct LogStoreError: Error, Equatable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        init(_ name: String) { self.name = name }
        public var description: String { name }

        /// The directory is not a sync store (no format marker).
        public static let notAStore = Code("not a sync store")
        /// The store was written by a newer (or unknown) format version.
        public static let unsupportedFormat = Code("unsupported format")
        /// An entry failed to decode; `formatError` says how.
        public static let corruptEntry = Code("corrupt entry")
        /// Offsets are not dense: an entry is missing.
        public static let gap = Code("gap in the log")
        /// The store is closed.
        public static let closed = Code("store closed")
        /// Another process has the store open for writing.
        public static let writerActive = Code("writer active")
        /// An argument breaks a documented rule (names, sizes, values).
        public static let invalidArgument = Code("invalid argument")
        /// No visible entity has that type and id.
        public static let notFound = Code("not found")
        /// A visible entity already has that type and id.
        public static let alreadyExists = Code("already exists")
        /// The derived databases are missing or from another version, and
        /// the store is open read-only so they cannot be rebuilt.
        public static let projectionsStale = Code("projections stale")
        /// The log's last entry has the last offset, 2^64 - 1, or the last
        /// timestamp: there is no offset, or no later timestamp, left for
        /// another entry.
        public static let logFull = Code("log full")
        /// A page of `data.mdb` is damaged (`EventLog.Options.checkPagesOnOpen`
        /// found it); the detail names the table and the page.
        public static let damagedPages = Code("damaged pages")
    }

    public var code: Code
    public var path: String
    public var offset: UInt64?
    public var detail: String
    /// The decoding error behind `.corruptEntry`.
    public var formatError: FormatError?

    public init(_ code: Code, path: String, offset: UInt64? = nil, _ detail: String, formatError: FormatError? = nil) {
        self.code = code
        self.path = path
        self.offset = offset
        self.detail = detail
        self.formatError = formatError
    }

    static func gap(expected: UInt64, found: UInt64, path: String) -> LogStoreError {
        LogStoreError(.gap, path: path, offset: expected, "expected offset \(expected), found \(found)")
    }

    static func corrupt(_ error: FormatError, path: String) -> LogStoreError {
        LogStoreError(.corruptEntry, path: path, offset: error.offset, error.description, formatError: error)
    }

    public var description: String {
        let place = offset.map { path.isEmpty ? "offset \($0)" : "\(path) at offset \($0)" } ?? path
        return place.isEmpty ? "\(code): \(detail)" : "\(place): \(code): \(detail)"
    }
}
