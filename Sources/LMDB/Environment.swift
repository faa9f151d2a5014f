import CLMDB
import Foundation
import Synchronization

/// An LMDB environment: one directory holding `data.mdb` and `lock.mdb`.
///
/// Caveats:
/// - Open a directory at most once per process (LMDB's file locks are per
///   process; a second open is refused with `.alreadyOpen`).
/// - Never use an open environment in a child after `fork()`; spawn children
///   with exec.
/// - A long read transaction pins the pages it sees, and the file grows while
///   it lasts. Keep `read` closures short.
/// - Transactions live inside one synchronous closure. Never `await` inside
///   one: a task may resume on another thread.
/// - The write closure may run more than once (the map grows and the write is
///   retried), so it must have no effects outside the transaction.
public final class Environment: @unchecked Sendable {
    public enum Durability: String, Sendable, CaseIterable {
        /// fsync on every commit (data, then meta page): survives power loss.
        case full
        /// One sync per commit (`MDB_NOMETASYNC`): a power loss may undo the
        /// last commit, never corrupt the file.
        case metaAsync
        /// No sync (`MDB_NOSYNC`): survives any crash of the process, since
        /// the page cache does, but a power loss or OS crash can corrupt the file.
        case process
    }

    public struct Options: Sendable {
        /// The initial map size in bytes; the map grows on demand.
        /// Not negative (0: LMDB's default).
        public var mapSize = 64 << 20
        /// The map never grows past this (1 TiB by default).
        public var mapSizeMax = 1 << 40
        /// At most `UInt32.max`, as LMDB takes it.
        public var maxDatabases = 64
        /// 1 to `UInt32.max`, as LMDB takes it.
        public var maxReaders = 126
        public var durability = Durability.full
        /// Open without write access (`MDB_RDONLY`).
        public var readOnly = false
        /// Create the directory when it does not exist, and the environment
        /// when its data file is missing or empty (never when read-only).
        public var createIfMissing = true

        public init() {}
    }

    /// How many times one write may grow the map and retry before giving up.
    static let mapGrowthAttemptsMax = 40
    /// How many reset read transactions `readPool` keeps for reuse (besides
    /// the one in `spareRead`).
    static let readPoolCountMax = 16

    /// LMDB's environment. Replaced only by `reopenIfFailed`, which holds
    /// the resize lock exclusively; every other use holds it shared.
    private(set) var handle: OpaquePointer
    public let path: String
    public let options: Options
    /// LMDB's page size for this file, read at open: `mdb_env_stat` reads
    /// it from a meta page through the map, which `checkDataFileWhole`
    /// must not touch.
    private var pageSize: Int
    private let resizeLock = ReadWriteLock()
    private let state: Mutex<State>
    private let openDatabaseLock = Mutex(())
    /// False once the environment is closed or has failed (`state` says
    /// which), so a read can check it without taking the lock.
    private let usable = Atomic<Bool>(true)
    /// One reset read transaction (its address; 0 when empty), taken and
    /// given back without a lock. A thread that reads alone always finds
    /// its transaction here; concurrent readers fall back to `readPool`.
    private let spareRead = Atomic<UInt>(0)

    /// A reset read transaction. `MDB_NOTLS` lets any thread renew it.
    private struct PooledTransaction: @unchecked Sendable { let handle: OpaquePointer }

    private struct State {
        var closed = false
        var failed: LMDBError?
        var readPool: [PooledTransaction] = []
        /// What `info()` reports once the environment is closed (its handle
        /// is freed then), or has lost its map (`setMapSize`).
        var closedInfo: Info?
        /// The databases a reopening opens again, ascending by handle; nil
        /// when a failed environment stays failed (`reopensAfterFailure`).
        var reopenDatabases: [(name: String, database: Database)]?
        /// `handle` is closed: a reopening closed it and could not open
        /// the environment again.
        var detached = false
        /// How many times the environment was opened again after failing.
        var reopens = 0
    }

    /// The directories open in this process, by their resolved path.
    private static let openPaths = Mutex(Set<String>())

    /// Opens (or creates) the environment in the directory at `path`.
    /// - Throws: `LMDBError` with `.alreadyOpen`, `.noSuchFile` (the
    ///   directory or its data file missing and not to be created),
    ///   `.notADirectory`, `.permissionDenied` or `.readOnlyFileSystem`
    ///   (cannot write there; `detail` names the file, `lock.mdb` or
    ///   `data.mdb`, that the process may not open as it must), `.invalid` (the directory holds a file that
    ///   is not an LMDB environment, or, not to be created, an empty one),
    ///   `.truncated` (the data file lacks pages in use, or its second meta
    ///   page), `.metaPageDamaged` (one meta page sound, the other not), `.versionMismatch`,
    ///   `.noSpace` (no room for a new lock file), `.invalidArgument` (a
    ///   count of databases or readers that LMDB cannot take).
    public init(path: String, options: Options = Options()) throws {
        self.options = options
        try Environment.checkSizes(options, path: path)
        let resolved = try Environment.prepareDirectory(path, options: options)
        self.path = resolved
        var env: OpaquePointer?
        var pageSize = 0
        try check(mdb_env_create(&env), "mdb_env_create", path: resolved)
        guard let env else { preconditionFailure("mdb_env_create returned no environment") }
        do {
            try Environment.configure(env, options, mapSize: options.mapSize, path: resolved)
            try Environment.checkDataFileExists(resolved, options: options)
            try Environment.register(resolved)
            let lockFile = resolved + "/lock.mdb"
            let hadLockFile = access(lockFile, F_OK) == 0
            if options.createIfMissing && !options.readOnly { UnfinishedCreation.discard(directory: resolved) }
            do {
                if !hadLockFile && !options.readOnly {
                    try LockFileSpace.allocate(directory: resolved, maxReaders: options.maxReaders)
                }
                pageSize = try Environment.open(env, options, path: resolved)
            } catch {
                // LMDB makes the lock file before it reads the data file. A
                // data file that is not LMDB's, lacks pages or has a damaged
                // meta page is no
                // environment that anyone can be using, so the lock file made
                // for it is ours to take back: a refused directory is left
                // as it was found.
                if error.code == .invalid || error.code == .truncated || error.code == .metaPageDamaged, !hadLockFile { unlink(lockFile) }
                Environment.unregister(resolved)
                throw error
            }
        } catch {
            mdb_env_close(env)
            throw error
        }
        handle = env
        self.pageSize = pageSize
        state = Mutex(State())
        clearDeadReaders()
    }

    deinit { close() }

    /// Sets what LMDB needs before it opens the environment.
    private static func configure(_ env: OpaquePointer, _ options: Options, mapSize: Int, path: String) throws(LMDBError) {
        try check(mdb_env_set_mapsize(env, mapSize), "mdb_env_set_mapsize", path: path)
        try check(mdb_env_set_maxdbs(env, MDB_dbi(options.maxDatabases)), "mdb_env_set_maxdbs", path: path)
        try check(mdb_env_set_maxreaders(env, UInt32(options.maxReaders)), "mdb_env_set_maxreaders", path: path)
    }

    /// Opens `env` on the directory at `path` and checks its data file
    /// holds every page in use.
    /// - Returns: LMDB's page size.
    private static func open(_ env: OpaquePointer, _ options: Options, path: String) throws(LMDBError) -> Int {
        let opened = mdb_env_open(env, path, Environment.flags(options), 0o644)
        try OpenFailure.check(opened, directory: path, readOnly: options.readOnly)
        return try Environment.checkDataFileSize(env, path: path)
    }

    private static func flags(_ options: Options) -> UInt32 {
        var flags = UInt32(MDB_NOTLS)
        switch options.durability {
        case .full: break
        case .metaAsync: flags |= UInt32(MDB_NOMETASYNC)
        case .process: flags |= UInt32(MDB_NOSYNC)
        }
        if options.readOnly { flags |= UInt32(MDB_RDONLY) }
        return flags
    }

    /// LMDB takes the counts of databases and readers as `UInt32`: one
    /// that does not fit would trap converting it. (LMDB refuses 0 readers
    /// itself, but only after the directory is made.) A negative map size
    /// became a `size_t` past any memory, and the open failed as "Cannot
    /// allocate memory", naming no option.
    /// - Throws: `LMDBError` `.invalidArgument` naming the option.
    private static func checkSizes(_ options: Options, path: String) throws(LMDBError) {
        let sizes = [
            ("maxDatabases", options.maxDatabases, 0, Int(UInt32.max)), ("maxReaders", options.maxReaders, 1, Int(UInt32.max)),
            ("mapSize", options.mapSize, 0, Int.max),
        ]
        for (name, value, least, most) in sizes where !(least...most).contains(value) {
            throw LMDBError(
                code: .invalidArgument, operation: "Environment.init", path: path, detail: "\(name) \(value) is outside \(least)...\(most)")
        }
    }

    /// What a file given for an environment is, with the directory to give
    /// instead when the file is one of an environment's own (its data file
    /// named for the store is the likely mistake).
    private static func notADirectoryDetail(_ path: String) -> String {
        let detail = "an environment is a directory holding data.mdb, not a file"
        guard path.hasSuffix("/data.mdb") || path.hasSuffix("/lock.mdb"), let directory = parentDirectory(of: path) else {
            return detail
        }
        return detail + "; give the directory it is in, \(directory)"
    }

    /// Checks the path is a directory (creating it if allowed) and returns its
    /// resolved form, so two spellings of one directory are one environment.
    private static func prepareDirectory(_ path: String, options: Options) throws(LMDBError) -> String {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else {
                throw LMDBError(code: .notADirectory, operation: "open", path: path, detail: notADirectoryDetail(path))
            }
        } else if options.createIfMissing && !options.readOnly {
            guard mkdir(path, 0o755) == 0 || errno == EEXIST else {
                throw LMDBError(code: LMDBError.Code(rawValue: errno), operation: "mkdir", path: path)
            }
        } else {
            throw LMDBError(code: .noSuchFile, operation: "open", path: path)
        }
        guard let resolved = realpath(path, nil) else {
            throw LMDBError(code: LMDBError.Code(rawValue: errno), operation: "realpath", path: path)
        }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// Refuses a missing or empty data file where no environment may be
    /// created: LMDB takes either for a new environment and writes one (a
    /// read-only open fails at that write with a bare EBADF). Where one may
    /// be, an empty file becomes a new environment as LMDB makes it: it
    /// holds nothing to lose, and LMDB leaves one behind when a process is
    /// killed while it creates an environment (and one holding a page of
    /// two when the disk fills meanwhile: `UnfinishedCreation` empties it).
    private static func checkDataFileExists(_ directory: String, options: Options) throws(LMDBError) {
        guard options.readOnly || !options.createIfMissing else { return }
        var file = stat()
        guard stat(directory + "/data.mdb", &file) == 0 else {
            throw LMDBError(code: LMDBError.Code(rawValue: errno), operation: "open", path: directory, detail: "data.mdb")
        }
        guard file.st_size > 0 else {
            throw LMDBError(code: .invalid, operation: "open", path: directory, detail: "data.mdb is empty (0 bytes)")
        }
    }

    /// Refuses a data file that lacks a page in use (a copy cut short, a
    /// truncate, a disk that filled during a copy). LMDB reads pages through
    /// a map of the file, and a read of a page past its end kills the
    /// process with SIGBUS; checked here, at open, it is an error instead.
    /// Damage inside a page the file does hold is beyond what this can show.
    /// - Returns: LMDB's page size.
    private static func checkDataFileSize(_ env: OpaquePointer, path: String) throws(LMDBError) -> Int {
        var info = MDB_envinfo()
        try check(mdb_env_info(env, &info), "mdb_env_info", path: path)
        let reader = try dataFileReader(env, path: path)
        try checkHoldsPages(
            through: UInt64(info.me_last_pgno), transactionID: UInt64(info.me_last_txnid), reader, operation: "open", path: path)
        return reader.pageSize
    }

    /// Throws `.truncated` when `data.mdb` no longer holds every page in
    /// use: a file cut short by another process while this one has it
    /// open, which the next read through the map would meet as SIGBUS. It
    /// reads the file with `pread` alone, never through the map (where
    /// LMDB reads even the meta pages). A process that reads for long,
    /// such as `logtool tail --follow`, checks before each read; a cut
    /// between the check and the read is still fatal.
    ///
    /// A cut found fails the environment, as a failed commit does: every
    /// later transaction throws this error rather than read the map, and
    /// `info()` gives the numbers of the newest meta page the file still
    /// held (zero when it held none). Reopening gives the open's own
    /// `.truncated`.
    /// - Throws: `.closed` once the environment is closed.
    public func checkDataFileWhole() throws(LMDBError) {
        try resizeLock.withShared { () throws(LMDBError) in
            try checkUsable("check data.mdb")
            var descriptor: mdb_filehandle_t = -1
            try check(mdb_env_get_fd(handle, &descriptor), "mdb_env_get_fd", path: path)
            // A commit between reading the newest meta page and reading
            // the free list it names writes over one of them: begin again.
            var attempts = 0
            while true {
                attempts += 1
                let before = try Self.dataFileReader(descriptor: descriptor, pageSize: pageSize, path: path)
                guard let meta = before.newestMeta() else {
                    throw failCut(
                        meta: nil, detail: "\(path)/data.mdb is \(before.fileSize) bytes: it no longer holds a sound meta page")
                }
                // Sized after the meta page is read: a writer writes the
                // pages a meta page counts before that page.
                let reader = try Self.dataFileReader(descriptor: descriptor, pageSize: pageSize, path: path)
                do throws(LMDBError) {
                    return try Self.checkHoldsPages(
                        through: meta.u64(DataFile.metaLastPage), transactionID: meta.u64(DataFile.metaTransactionID), reader,
                        operation: "read", path: path)
                } catch {
                    guard attempts < Self.pageCheckAttemptsMax, reader.newestMeta()?.bytes != meta.bytes else {
                        throw failCut(meta: meta, detail: error.detail ?? "")
                    }
                }
            }
        }
    }

    /// Fails the environment for a data file cut short, keeping for
    /// `info()` the numbers of `meta`, the newest meta page the file held.
    /// Needs the resize lock.
    /// - Returns: the error every later use throws.
    private func failCut(meta: DataFile.Bytes?, detail: String) -> LMDBError {
        let error = LMDBError(code: .truncated, operation: "read", path: path, detail: detail)
        let lastPage = meta.map { Int(truncatingIfNeeded: $0.u64(DataFile.metaLastPage)) }
        let info = Info(
            mapSize: meta.map { Int(truncatingIfNeeded: $0.u64(DataFile.metaMapSize)) } ?? 0,
            usedBytes: lastPage.map { ($0 &+ 1) &* pageSize } ?? 0, pageSize: pageSize, maxReaders: options.maxReaders,
            readersUsed: 0, lastTransactionID: meta.map { Int(truncatingIfNeeded: $0.u64(DataFile.metaTransactionID)) } ?? 0)
        state.withLock {
            if $0.failed == nil { $0.failed = error }
            if $0.closedInfo == nil { $0.closedInfo = info }
            usable.store(false, ordering: .releasing)
        }
        return error
    }

    /// Throws `.truncated` unless the file `reader` reads holds pages
    /// 0...`lastPage`. It may end before the last of them when the pages
    /// past its end are free ones LMDB never wrote (the free list of
    /// transaction `transactionID`, `FreePages`): that file is whole.
    private static func checkHoldsPages(
        through lastPage: UInt64, transactionID: UInt64, _ reader: DataFile.PageReader, operation: String, path: String
    ) throws(LMDBError) {
        let (pageSize, size) = (reader.pageSize, reader.fileSize)
        // The metadata is not checksummed: a damaged page number must not
        // trap here either.
        let (pages, pagesOverflow) = lastPage.addingReportingOverflow(1)
        let (needed, neededOverflow) = pages.multipliedReportingOverflow(by: UInt64(pageSize))
        guard pagesOverflow || neededOverflow || UInt64(size) < needed else { return }
        // A page the file holds only in part is missing too.
        let firstMissing = UInt64(size / pageSize)
        if !pagesOverflow, !neededOverflow, let free = FreePages.read(reader, transactionID: transactionID),
            lastPage - firstMissing < UInt64(free.count), (firstMissing...lastPage).allSatisfy(free.contains)
        {
            return
        }
        let bytes = pagesOverflow || neededOverflow ? "" : " (\(needed) bytes)"
        throw LMDBError(
            code: .truncated, operation: operation, path: path,
            detail: "\(path)/data.mdb is \(size) bytes; its metadata says pages 0...\(lastPage) of \(pageSize) bytes are in use\(bytes)")
    }

    /// A reader of `env`'s data file as it is now: LMDB's descriptor, page
    /// size and the file's size.
    static func dataFileReader(_ env: OpaquePointer, path: String) throws(LMDBError) -> DataFile.PageReader {
        var statistics = MDB_stat()
        var descriptor: mdb_filehandle_t = -1
        try check(mdb_env_stat(env, &statistics), "mdb_env_stat", path: path)
        try check(mdb_env_get_fd(env, &descriptor), "mdb_env_get_fd", path: path)
        return try dataFileReader(descriptor: descriptor, pageSize: Int(statistics.ms_psize), path: path)
    }

    /// A reader of the data file at `descriptor`, LMDB's, with its size now.
    private static func dataFileReader(descriptor: mdb_filehandle_t, pageSize: Int, path: String) throws(LMDBError)
        -> DataFile.PageReader
    {
        var file = stat()
        guard fstat(descriptor, &file) == 0 else {
            throw LMDBError(code: LMDBError.Code(rawValue: errno), operation: "fstat", path: path, detail: "data.mdb")
        }
        return DataFile.PageReader(descriptor: descriptor, pageSize: pageSize, fileSize: Int(file.st_size))
    }

    private static func register(_ path: String) throws(LMDBError) {
        let inserted = openPaths.withLock { $0.insert(path).inserted }
        guard inserted else { throw LMDBError(code: .alreadyOpen, operation: "open", path: path) }
    }

    private static func unregister(_ path: String) {
        _ = openPaths.withLock { $0.remove(path) }
    }

    /// Closes the environment. Waits for running transactions to end; later
    /// calls throw `.closed`. Closing twice is harmless.
    public func close() {
        resizeLock.withExclusive {
            let pool = state.withLock { state -> [PooledTransaction]? in
                guard !state.closed else { return nil }
                state.closed = true
                usable.store(false, ordering: .releasing)
                defer { state.readPool = [] }
                return state.readPool
            }
            guard let pool else { return }
            // No read is running (they hold the resize lock shared), so the
            // spare cannot change under us.
            if let spare = OpaquePointer(bitPattern: spareRead.exchange(0, ordering: .acquiringAndReleasing)) {
                mdb_txn_abort(spare)
            }
            for txn in pool { mdb_txn_abort(txn.handle) }
            let last = state.withLock { $0.closedInfo } ?? currentInfo()
            let detached = state.withLock { state in
                state.closedInfo = last
                return state.detached
            }
            if !detached { mdb_env_close(handle) }
            Environment.unregister(path)
        }
    }

    /// Frees the reader slots of processes that ended inside a read (a
    /// tool killed mid-export): such a slot still names its snapshot, and
    /// LMDB reuses no page freed after it. LMDB frees them only when asked.
    /// Needs an open environment.
    /// - Returns: whether there were any.
    @discardableResult
    private func clearDeadReaders() -> Bool {
        var dead: Int32 = 0
        return mdb_reader_check(handle, &dead) == 0 && dead > 0
    }

    private func checkUsable(_ operation: StaticString) throws(LMDBError) {
        if let problem = problem(operation) { throw problem }
    }

    /// Why the environment can serve no transaction (closed, or failed
    /// after an unsuccessful commit or map growth), or nil when it can.
    public var problem: LMDBError? { problem("use") }

    private func problem(_ operation: StaticString) -> LMDBError? {
        state.withLock { state -> LMDBError? in
            if state.closed { return LMDBError(code: .closed, operation: "\(operation)", path: path) }
            return state.failed
        }
    }
}

// MARK: - Transactions

extension Environment {
    /// Runs `body` in a read transaction that sees one consistent snapshot.
    /// - Throws: what `body` throws, or `LMDBError`.
    @inlinable
    public func read<R>(_ body: (borrowing Transaction) throws -> R) throws -> R {
        // Inlinable, so that `body` is inlined into the caller rather than
        // called through a generic context: reads are the store's hot path.
        let txn = try beginRead()
        defer { endRead(txn) }
        // Bound to a local first: passing the initializer's result
        // straight to `body` crashes Swift 6.3.1's optimizer.
        let transaction = Transaction(handle: txn, isReadOnly: true, path: path)
        return try body(transaction)
    }

    /// Runs `body` in a write transaction: it commits when `body` returns
    /// and aborts when it throws. When the map is full the transaction is
    /// aborted, the map grows, and `body` runs again.
    /// - Throws: what `body` throws, or `LMDBError`; after a failed commit,
    ///   or a growth of the map that `mmap` refused (`ENOMEM`), the
    ///   environment answers `.environmentFailed` until it is reopened
    ///   (the next transaction does that, after `reopensAfterFailure`).
    public func write<R>(_ body: (borrowing Transaction) throws -> R) throws -> R {
        precondition(!options.readOnly, "write on a read-only environment")
        if !usable.load(ordering: .acquiring) { try reopenIfFailed() }
        for _ in 0..<Environment.mapGrowthAttemptsMax {
            do {
                return try resizeLock.withShared { try writeOnce(body) }
            } catch let error as LMDBError where error.code == .mapFull {
                try grow(after: error)
            } catch let error as LMDBError where error.code == .mapResized {
                try adoptResizedMap()
            }
        }
        throw LMDBError(code: .mapFull, operation: "write", path: path)
    }

    private func writeOnce<R>(_ body: (borrowing Transaction) throws -> R) throws -> R {
        try checkUsable("write")
        var txn: OpaquePointer?
        try check(mdb_txn_begin(handle, nil, 0, &txn), "mdb_txn_begin", path: path)
        guard let txn else { preconditionFailure("mdb_txn_begin returned no transaction") }
        let value: R
        do {
            let transaction = Transaction(handle: txn, isReadOnly: false, path: path)
            value = try body(transaction)
        } catch {
            mdb_txn_abort(txn)
            throw error
        }
        let result = mdb_txn_commit(txn)
        if result == MDB_MAP_FULL {
            // The commit found no room for its pages before writing any of
            // them (LMDB checks when it allocates): the map grows and the
            // write runs again, as for a full map inside the transaction.
            throw LMDBError(code: .mapFull, operation: "mdb_txn_commit", path: path)
        }
        if result != 0 {
            let error = LMDBError(code: LMDBError.Code(rawValue: result), operation: "mdb_txn_commit", path: path)
            // The commit may have written part of its pages; LMDB's own state
            // is not to be trusted now (DESIGN.md: "treat the environment as
            // failed and reopen it").
            state.withLock {
                $0.failed = LMDBError(code: .environmentFailed, operation: "mdb_txn_commit", path: path)
                usable.store(false, ordering: .releasing)
            }
            throw error
        }
        return value
    }

    /// Holds the resize lock shared and returns a read transaction, from the
    /// pool (renewed) or new; `endRead` gives both back. When another process
    /// grew the map, this one adopts the new size first.
    /// - Throws: `.closed`, the failure that ended the environment, or
    ///   `LMDBError` from LMDB.
    @usableFromInline
    func beginRead() throws(LMDBError) -> OpaquePointer {
        if !usable.load(ordering: .acquiring) { try reopenIfFailed() }
        for _ in 0..<Environment.mapGrowthAttemptsMax {
            resizeLock.lockShared()
            do {
                if let txn = try renewedOrNewRead() { return txn }
            } catch {
                resizeLock.unlock()
                throw error
            }
            resizeLock.unlock()
            try adoptResizedMap()
        }
        throw LMDBError(code: .mapResized, operation: "mdb_txn_begin", path: path)
    }

    /// nil when the map was resized by another process.
    private func renewedOrNewRead() throws(LMDBError) -> OpaquePointer? {
        // The fast path, without a lock: reads are the store's hot path.
        if usable.load(ordering: .acquiring),
            let spare = OpaquePointer(bitPattern: spareRead.exchange(0, ordering: .acquiringAndReleasing))
        {
            return try renewed(spare)
        }
        // One lock both checks the environment is usable and takes a pooled
        // transaction.
        let pooledOrProblem = state.withLock { state -> Result<PooledTransaction?, LMDBError> in
            if state.closed { return .failure(LMDBError(code: .closed, operation: "read", path: path)) }
            if let failed = state.failed { return .failure(failed) }
            return .success(state.readPool.popLast())
        }
        if let pooled = try pooledOrProblem.get()?.handle { return try renewed(pooled) }
        var txn: OpaquePointer?
        let result = mdb_txn_begin(handle, nil, UInt32(MDB_RDONLY), &txn)
        if result == MDB_MAP_RESIZED { return nil }
        try check(result, "mdb_txn_begin", path: path)
        guard let txn else { preconditionFailure("mdb_txn_begin returned no transaction") }
        return txn
    }

    /// The pooled transaction renewed; nil when the map was resized by
    /// another process. It is aborted when it cannot be renewed.
    private func renewed(_ pooled: OpaquePointer) throws(LMDBError) -> OpaquePointer? {
        let result = mdb_txn_renew(pooled)
        if result == 0 { return pooled }
        mdb_txn_abort(pooled)
        if result == MDB_MAP_RESIZED { return nil }
        throw LMDBError(code: LMDBError.Code(rawValue: result), operation: "mdb_txn_renew", path: path)
    }

    /// Ends a transaction from `beginRead` (back to the pool, reset) and
    /// releases the resize lock.
    @usableFromInline
    func endRead(_ txn: OpaquePointer) {
        mdb_txn_reset(txn)
        if spareRead.compareExchange(expected: 0, desired: UInt(bitPattern: txn), ordering: .acquiringAndReleasing).exchanged {
            resizeLock.unlock()
            return
        }
        let kept = state.withLock { state -> Bool in
            guard state.readPool.count < Environment.readPoolCountMax else { return false }
            state.readPool.append(PooledTransaction(handle: txn))
            return true
        }
        if !kept { mdb_txn_abort(txn) }
        resizeLock.unlock()
    }

    /// Another process grew the map: take its size (`mdb_env_set_mapsize(0)`).
    /// - Throws: `.mapResized` on a thread inside a read, whose own hold
    ///   would keep the exclusive one out for good.
    private func adoptResizedMap() throws(LMDBError) {
        try checkNoReadHeld(.mapResized, "another process grew the map, and a read inside another cannot take the new size: end the outer read and read again")
        try resizeLock.withExclusive { () throws(LMDBError) in
            try checkUsable("mdb_env_set_mapsize")
            try setMapSize(0)
        }
    }

    /// Doubles the map (in 1 GiB steps past 1 GiB), up to `mapSizeMax`,
    /// unless freeing dead processes' reader slots made room.
    /// - Throws: `error` on a thread inside a read (see `checkNoReadHeld`).
    private func grow(after error: LMDBError) throws(LMDBError) {
        try checkNoReadHeld(error.code, "the map is full, and a write inside a read cannot grow it: write outside the read")
        try resizeLock.withExclusive { () throws(LMDBError) in
            try checkUsable("mdb_env_set_mapsize")
            // A dead process's slot keeps every page freed since its
            // snapshot, and a writer that stays open would otherwise grow
            // the map at each fill until some process opened the
            // environment: without it, the write runs again in this map.
            if clearDeadReaders() { return }
            let current = currentInfo().mapSize
            let step = min(current, 1 << 30)
            guard current < options.mapSizeMax else { throw error }
            let next = min(current + step, options.mapSizeMax)
            try setMapSize(next)
        }
    }

    /// Maps the data file again at `size` bytes (0: the size another
    /// process set), holding the resize lock exclusively. LMDB unmaps the
    /// map before it maps it again, and is left with none when that fails
    /// (`mmap` refusing the size, `ENOMEM` where the address space is
    /// small, or limited): every later use of the environment, its close
    /// included, would read unmapped memory. It fails then, as after an
    /// unsuccessful commit, keeping the numbers `info()` had.
    /// - Throws: `LMDBError` from `mdb_env_set_mapsize`.
    private func setMapSize(_ size: Int) throws(LMDBError) {
        let before = currentInfo()
        let result = mdb_env_set_mapsize(handle, size)
        guard result != 0 else { return }
        state.withLock {
            $0.failed = LMDBError(
                code: .environmentFailed, operation: "mdb_env_set_mapsize", path: path,
                detail: "the map could not be mapped again at \(size == 0 ? "another process's size" : "\(size) bytes")")
            $0.closedInfo = before
            usable.store(false, ordering: .releasing)
        }
        throw LMDBError(code: LMDBError.Code(rawValue: result), operation: "mdb_env_set_mapsize", path: path)
    }

    /// The map can change size only while this process has no transaction
    /// open, so a thread that holds a read (of any environment: two threads
    /// each inside a read of the other's store could wait for each other)
    /// would wait for good for its own hold to end. It gets `code` instead.
    private func checkNoReadHeld(_ code: LMDBError.Code, _ why: String) throws(LMDBError) {
        guard ReadWriteLock.threadHoldsShared else { return }
        throw LMDBError(code: code, operation: "mdb_env_set_mapsize", path: path, detail: why)
    }
}

// MARK: - Reopening after a failure

extension Environment {
    /// Has a failed environment opened again, as a close and a new open
    /// would, by the next transaction that begins: a failed commit (a full
    /// disk, an I/O error) or map growth then fails the calls that met it,
    /// not every later one. `databases` are the handles to open again (all
    /// that the caller uses): a reopening that does not get the same
    /// handles for them leaves the environment failed.
    ///
    /// What the reopened environment holds is what LMDB's meta pages name:
    /// every commit that succeeded. A failed commit wrote no meta page
    /// that names it (or, when writing the meta page failed, wrote the
    /// page it replaced back), so it is not there; with `.full`, every
    /// commit before it was synced. The caller re-reads anything it
    /// derived from the environment (`reopenCount` tells it to).
    public func reopensAfterFailure(keeping databases: [String: Database]) {
        let ordered = databases.map { (name: $0.key, database: $0.value) }.sorted { $0.database.dbi < $1.database.dbi }
        state.withLock { $0.reopenDatabases = ordered }
    }

    /// How many times the environment has been opened again after failing.
    public var reopenCount: Int { state.withLock { $0.reopens } }

    /// Fails the environment as a failed commit does, at a moment a test
    /// chooses (with readers and writers running, say): a commit that
    /// fails on purpose needs a child process.
    package func failForTesting() {
        state.withLock {
            if $0.closed || $0.failed != nil { return }
            $0.failed = LMDBError(code: .environmentFailed, operation: "failForTesting", path: path)
            usable.store(false, ordering: .releasing)
        }
    }

    /// Opens the environment again when it has failed and is to reopen
    /// (`reopensAfterFailure`); nothing otherwise, and nothing on a thread
    /// inside a read, which would wait for its own hold (the transaction
    /// it begins then meets the failure).
    /// - Throws: `.environmentFailed` naming why it could not reopen; it
    ///   stays failed, and the next transaction tries again.
    private func reopenIfFailed() throws(LMDBError) {
        // Checked first without the exclusive hold, which would wait for
        // every transaction: a closed environment, or a failed one that
        // stays failed, is read (and refused) at full speed.
        let due = state.withLock { !$0.closed && $0.failed != nil && $0.reopenDatabases != nil }
        guard due, !ReadWriteLock.threadHoldsShared else { return }
        try resizeLock.withExclusive { () throws(LMDBError) in
            // Another thread may have reopened it while this one waited.
            let failure = state.withLock { state in
                state.closed ? nil : state.failed.flatMap { failed in state.reopenDatabases.map { (failed, $0, state.detached) } }
            }
            guard let (failed, databases, detached) = failure else { return }
            // No transaction is running (they hold the resize lock shared):
            // the pooled reads are this handle's, and go with it.
            if let spare = OpaquePointer(bitPattern: spareRead.exchange(0, ordering: .acquiringAndReleasing)) {
                mdb_txn_abort(spare)
            }
            for txn in state.withLock({ $0.readPool }) { mdb_txn_abort(txn.handle) }
            let last = state.withLock { $0.closedInfo } ?? currentInfo()
            state.withLock { state in
                state.readPool = []
                state.closedInfo = last
                state.detached = true
            }
            if !detached { mdb_env_close(handle) }
            do {
                let (env, pageSize) = try reopened(mapSize: last.mapSize, databases)
                handle = env
                self.pageSize = pageSize
                state.withLock { state in
                    state.failed = nil
                    state.closedInfo = nil
                    state.detached = false
                    state.reopens += 1
                }
                usable.store(true, ordering: .releasing)
            } catch {
                let stillFailed = LMDBError(
                    code: .environmentFailed, operation: "reopen", path: path,
                    detail: "it failed (\(failed)), and opening it again failed: \(error)")
                state.withLock { $0.failed = stillFailed }
                throw stillFailed
            }
        }
    }

    /// A new LMDB environment on this directory, mapped at `mapSize`, with
    /// `databases` opened again under the same handles.
    private func reopened(mapSize: Int, _ databases: [(name: String, database: Database)]) throws(LMDBError)
        -> (OpaquePointer, pageSize: Int)
    {
        var env: OpaquePointer?
        try check(mdb_env_create(&env), "mdb_env_create", path: path)
        guard let env else { preconditionFailure("mdb_env_create returned no environment") }
        do throws(LMDBError) {
            try Environment.configure(env, options, mapSize: mapSize, path: path)
            let pageSize = try Environment.open(env, options, path: path)
            // Handles opened in a read transaction stay open once it commits.
            var txn: OpaquePointer?
            try check(mdb_txn_begin(env, nil, UInt32(MDB_RDONLY), &txn), "mdb_txn_begin", path: path)
            do throws(LMDBError) {
                for (name, database) in databases {
                    var dbi = MDB_dbi()
                    try check(mdb_dbi_open(txn, name, 0, &dbi), "mdb_dbi_open", path: path)
                    guard dbi == database.dbi else {
                        throw LMDBError(
                            code: .invalid, operation: "mdb_dbi_open", path: path,
                            detail: "database \(name) opened as handle \(dbi), not \(database.dbi) as before")
                    }
                }
            } catch {
                mdb_txn_abort(txn)
                throw error
            }
            try check(mdb_txn_commit(txn), "mdb_txn_commit", path: path)
            return (env, pageSize)
        } catch {
            mdb_env_close(env)
            throw error
        }
    }
}

// MARK: - Databases, statistics, copies

extension Environment {
    /// Opens the named database, creating it if `create` is set.
    /// - Returns: nil when it does not exist and `create` is false.
    public func openDatabase(_ name: String, create: Bool = true) throws -> Database? {
        try openDatabaseLock.withLock { _ in
            if options.readOnly || !create {
                // A handle opened in a read transaction stays valid once that
                // transaction commits. Another process may have grown the map
                // since this one mapped it: the read takes the new size and
                // begins again, as every read does.
                for _ in 0..<Environment.mapGrowthAttemptsMax {
                    if let opened = try openExisting(name) { return opened }
                    try adoptResizedMap()
                }
                throw LMDBError(code: .mapResized, operation: "mdb_txn_begin", path: path)
            }
            return try write { txn in
                var dbi = MDB_dbi()
                try check(mdb_dbi_open(txn.handle, name, UInt32(MDB_CREATE), &dbi), "mdb_dbi_open", path: path)
                return Database(dbi: dbi)
            }
        }
    }

    /// Opens an existing database in a read transaction: `.some(nil)` when
    /// there is none by that name, nil when another process resized the map.
    private func openExisting(_ name: String) throws -> Database?? {
        try resizeLock.withShared { () throws -> Database?? in
            try checkUsable("mdb_dbi_open")
            var txn: OpaquePointer?
            let begun = mdb_txn_begin(handle, nil, UInt32(MDB_RDONLY), &txn)
            if begun == MDB_MAP_RESIZED { return nil }
            try check(begun, "mdb_txn_begin", path: path)
            var dbi = MDB_dbi()
            let result = mdb_dbi_open(txn, name, 0, &dbi)
            if result == MDB_NOTFOUND {
                mdb_txn_abort(txn)
                return .some(nil)
            }
            if result != 0 { mdb_txn_abort(txn) }
            try check(result, "mdb_dbi_open", path: path)
            try check(mdb_txn_commit(txn), "mdb_txn_commit", path: path)
            return Database(dbi: dbi)
        }
    }

    public struct Info: Sendable {
        /// The current map size in bytes.
        public var mapSize: Int
        /// Bytes of the map in use (pages up to the last one written).
        public var usedBytes: Int
        public var pageSize: Int
        public var maxReaders: Int
        public var readersUsed: Int
        /// The id of the last committed write transaction: how many commits
        /// the environment has had.
        public var lastTransactionID: Int
    }

    /// The environment's numbers now; after `close()`, as they were then.
    public func info() -> Info {
        // Shared: growing the map unmaps and maps it again (where the meta
        // pages `mdb_env_info` reads live), and closing frees the handle.
        resizeLock.withShared { state.withLock { $0.closedInfo } ?? currentInfo() }
    }

    /// Needs the resize lock (either way) and an open environment.
    private func currentInfo() -> Info {
        var envInfo = MDB_envinfo()
        var stat = MDB_stat()
        mdb_env_info(handle, &envInfo)
        mdb_env_stat(handle, &stat)
        return Info(
            mapSize: envInfo.me_mapsize, usedBytes: (envInfo.me_last_pgno + 1) * Int(stat.ms_psize),
            pageSize: Int(stat.ms_psize), maxReaders: Int(envInfo.me_maxreaders),
            readersUsed: Int(envInfo.me_numreaders), lastTransactionID: envInfo.me_last_txnid)
    }

    /// Writes a consistent copy of the environment into the empty directory
    /// `destination`; `compact` leaves out free pages (`MDB_CP_COMPACT`).
    /// - Throws: `LMDBError` naming this environment, which a failure is
    ///   most often about (a damaged page), with `destination` in its detail.
    public func copy(to destination: String, compact: Bool) throws {
        try resizeLock.withShared { () throws(LMDBError) in
            try checkUsable("mdb_env_copy2")
            let result = mdb_env_copy2(handle, destination, compact ? UInt32(MDB_CP_COMPACT) : 0)
            guard result == 0 else {
                throw LMDBError(
                    code: LMDBError.Code(rawValue: result), operation: "mdb_env_copy2", path: path,
                    detail: "copying into \(destination)")
            }
        }
    }
}
