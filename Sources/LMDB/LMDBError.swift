import CLMDB

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// An error from LMDB or from the operating system beneath it, with the call
/// that failed and the environment's path, so the message says what and where.
public struct LMDBError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The LMDB return code (negative, `MDB_*`) or an errno value (positive).
    /// Named statics cover the codes callers act on; any other code still
    /// carries its number and LMDB's own message.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }

        public static let keyExists = Code(rawValue: MDB_KEYEXIST)
        public static let notFound = Code(rawValue: MDB_NOTFOUND)
        public static let corrupted = Code(rawValue: MDB_CORRUPTED)
        public static let panic = Code(rawValue: MDB_PANIC)
        public static let versionMismatch = Code(rawValue: MDB_VERSION_MISMATCH)
        /// The file is not an LMDB environment.
        public static let invalid = Code(rawValue: MDB_INVALID)
        public static let mapFull = Code(rawValue: MDB_MAP_FULL)
        public static let databasesFull = Code(rawValue: MDB_DBS_FULL)
        public static let readersFull = Code(rawValue: MDB_READERS_FULL)
        public static let transactionFull = Code(rawValue: MDB_TXN_FULL)
        public static let mapResized = Code(rawValue: MDB_MAP_RESIZED)
        public static let badValueSize = Code(rawValue: MDB_BAD_VALSIZE)
        public static let ioError = Code(rawValue: EIO)
        public static let invalidArgument = Code(rawValue: EINVAL)
        public static let noSpace = Code(rawValue: ENOSPC)
        public static let permissionDenied = Code(rawValue: EACCES)
        public static let noSuchFile = Code(rawValue: ENOENT)
        public static let notADirectory = Code(rawValue: ENOTDIR)
        public static let readOnlyFileSystem = Code(rawValue: EROFS)
        /// The same environment is already open in this process (LMDB forbids
        /// it: closing either copy would drop the other's file locks).
        public static let alreadyOpen = Code(rawValue: -40_001)
        /// A commit (or a growth of the map) failed earlier; the environment
        /// must be closed and reopened before it is trusted again.
        public static let environmentFailed = Code(rawValue: -40_002)
        /// The environment was closed.
        public static let closed = Code(rawValue: -40_003)
        /// The data file is shorter than the pages its metadata says are in
        /// use: reading the missing ones would kill the process (SIGBUS).
        public static let truncated = Code(rawValue: -40_004)
        /// One of the data file's two meta pages is damaged while the other
        /// is sound: LMDB opens a file only when both are.
        public static let metaPageDamaged = Code(rawValue: -40_005)

        public var description: String {
            switch self {
            case .alreadyOpen: "environment already open in this process"
            case .environmentFailed: "environment failed after an unsuccessful commit or map growth; reopen it"
            case .closed: "environment is closed"
            case .truncated: "data file truncated"
            case .metaPageDamaged: "a meta page of the data file is damaged"
            default: String(cString: mdb_strerror(rawValue))
            }
        }
    }

    public var code: Code
    /// The C function (or wrapper step) that failed, such as `mdb_put`.
    public var operation: String
    /// The environment's directory, when known.
    public var path: String?
    /// What the code alone does not say, such as the sizes of a truncated
    /// data file.
    public var detail: String?

    public init(code: Code, operation: String, path: String? = nil, detail: String? = nil) {
        self.code = code
        self.operation = operation
        self.path = path
        self.detail = detail
    }

    public var description: String {
        let place = path.map { " (\($0))" } ?? ""
        return "\(operation)\(place): \(code) [\(code.rawValue)]" + (detail.map { ": \($0)" } ?? "")
    }
}

/// The one helper every C call goes through: a non-zero result becomes an
/// `LMDBError` naming the call. (No `detail` here: an autoclosure for one
/// cost every `get` on the read path a few nanoseconds; the rare call that
/// has one throws its own error.)
@inline(__always)
func check(_ result: Int32, _ operation: StaticString, path: String? = nil) throws(LMDBError) {
    if result != 0 {
        throw LMDBError(code: LMDBError.Code(rawValue: result), operation: "\(operation)", path: path)
    }
}
