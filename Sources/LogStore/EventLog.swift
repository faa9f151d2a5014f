import Foundation
import LMDB
import LogFormat
import Synchronization

/// Storage durability, as `Environment.Durability` documents it.
public typealias Durability = Environment.Durability

/// The append-only log of a store: dense offsets from 1, each entry an
/// immutable, checksummed record (`Format/storage.md`).
///
/// Caveats:
/// - Open a store at most once per process, and never use it after `fork()`.
/// - Appends return only after their transaction commits; with `.full`
///   durability that includes the fsync. Concurrent appends share commits.
///   Cancelling an append's task does not cancel the append: the call
///   returns its outcome, committed or failed.
/// - Reads see the log as of their own snapshot and never block appends.
public final class EventLog: Sendable {
    public struct Options: Sendable {
        public var durability = Durability.full
        /// Open without write access; appends are refused.
        public var readOnly = false
        /// Create the store when the directory has none (no data file, or
        /// an LMDB environment with no databases yet).
        public var createIfMissing = true
        /// The initial LMDB map size in bytes; it grows as needed. Not
        /// negative (0: LMDB's default).
        public var initialMapSize = 64 << 20
        /// Check every page of `data.mdb` (`Environment.checkPages`) before
        /// any table is read: damage inside a page, which LMDB follows
        /// through its map unchecked and can crash on, then fails the open
        /// with `.damagedPages`, naming the table and the page. It reads the
        /// whole file (bench section 6 gives its rate), so it is off unless
        /// an app that has reason to doubt its storage asks for it.
        /// (`syncserver --check-pages` does the same for a server's store.)
        public var checkPagesOnOpen = false

        public init(durability: Durability = .full, readOnly: Bool = false) {
            self.durability = durability
            self.readOnly = readOnly
        }

        /// Read-only, and refusing a directory that holds no store: how
        /// tools open a store they inspect or verify.
        public static var inspecting: Options {
            var options = Options(readOnly: true)
            options.createIfMissing = false
            return options
        }
    }

    /// The store layout version this build reads and writes (the `meta`
    /// marker; `Format/storage.md`, section 3).
    public static var storeFormatVersion: UInt32 { StoreFormat.storeVersion }

    /// Entries read per read transaction by `EntryScanner`; bounds both the
    /// memory a scan holds and how long it pins a snapshot.
    public static let scanChunkCountMax = 1024
    /// Bytes of entries `EntryScanner` copies per read transaction, past
    /// which it ends the chunk (big entries, fewer of them).
    public static let scanChunkBytesMax = 4 << 20

    public let path: String
    let environment: Environment
    let logDatabase: Database
    let metaDatabase: Database
    /// Databases derived from the log, by name; nil where a read-only store
    /// does not have one yet.
    let derivedDatabases: [String: Database?]
    private let committer: GroupCommitter?
    /// Held while open for writing: one writing process per store.
    private let writerLock: ProcessLock?
    /// The writer's position; `.empty` in a read-only log, which reads the
    /// log's end when asked.
    private let position: CommittedPosition
    /// The owner's teardown once the log is closed: see `init`.
    private let onClose: (@Sendable () -> Void)?

    /// Opens the store in the directory at `path`, creating it if allowed.
    /// - Throws: `LogStoreError` `.notAStore` (an LMDB environment or a
    ///   directory that is not a store, when not creating; a `data.mdb`
    ///   that is not LMDB's),
    ///   `.unsupportedFormat`, `.corruptEntry` (the last entry is damaged;
    ///   a read-only open leaves that to the first read that needs it),
    ///   `.invalidArgument` (a negative `initialMapSize`);
    ///   `LMDBError` for `Environment.init`'s reasons, and for a
    ///   `writer.lock` that cannot be opened.
    public convenience init(path: String, options: Options = Options()) throws {
        try self.init(path: path, options: options, derivedDatabases: [], onCommit: nil, onClose: nil)
    }

    /// The log's environment at `path`, opened as `options` say, with
    /// what it throws named for a store: a missing directory or data file,
    /// or a file that is not LMDB's, is `.notAStore`.
    static func openEnvironment(path: String, options: Options) throws -> Environment {
        // Checked here to name the option the caller set: the environment
        // refuses it too, as its own `mapSize`.
        guard options.initialMapSize >= 0 else {
            throw LogStoreError(.invalidArgument, path: path, "initialMapSize \(options.initialMapSize) is negative")
        }
        var environmentOptions = Environment.Options()
        environmentOptions.durability = options.durability
        environmentOptions.readOnly = options.readOnly
        environmentOptions.createIfMissing = options.createIfMissing
        environmentOptions.mapSize = options.initialMapSize
        if options.readOnly || !options.createIfMissing {
            // A missing path, or a directory with no data file, is not a
            // store; say so rather than let LMDB create one or fail with a
            // bare ENOENT. Only ENOENT means there is none: a data file
            // that cannot be looked at (a directory without search
            // permission) is the environment's to name, with the reason.
            // (A path that is not a directory is the environment's to refuse.)
            let dataFile = (path as NSString).appendingPathComponent("data.mdb")
            var isDirectory: ObjCBool = false
            var status = stat()
            if lstat(path, &status) != 0, errno == ENOENT {
                throw LogStoreError(.notAStore, path: path, "no such directory")
            }
            if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue,
                lstat(dataFile, &status) != 0, errno == ENOENT
            {
                throw LogStoreError(.notAStore, path: path, "no data.mdb in the directory")
            }
        }
        let environment: Environment
        do {
            environment = try Environment(path: path, options: environmentOptions)
        } catch let error as LMDBError where error.code == .invalid {
            throw LogStoreError(.notAStore, path: error.path ?? path, error.detail ?? "data.mdb is not an LMDB file")
        }
        if options.checkPagesOnOpen {
            do {
                if let problems = try environment.pageProblemsInBrief() {
                    throw LogStoreError(.damagedPages, path: environment.path, problems + " (logtool verify lists them all)")
                }
            } catch {
                environment.close()
                throw error
            }
        }
        return environment
    }

    /// Opens the log and, in the same setup transaction, the derived
    /// databases a `Store` keeps beside it. `onCommit` runs on the writer
    /// thread after every commit that had effects. `onClose` runs once the
    /// log is closed, however that came about (a `Store`'s `close()`, the
    /// log's own, a `deinit`): on the writer thread after the last commit,
    /// or, read-only, in each `close()`.
    init(
        path: String, options: Options, derivedDatabases: [String],
        onCommit: (@Sendable (CommitEffects) -> Void)?, onClose: (@Sendable () -> Void)?
    ) throws {
        let environment = try EventLog.openEnvironment(path: path, options: options)
        let databases: (log: Database, meta: Database)
        let writerLock: ProcessLock?
        var derived: [String: Database?] = [:]
        let initial: WriteContext.Position
        // A refused open leaves nothing behind: the environment closed, the
        // writer lock released (it would otherwise stay held, by a leaked
        // descriptor, until this process ends), and no lock file in a
        // directory that turned out not to be a store.
        do {
            databases = try EventLog.openDatabases(environment, create: !options.readOnly && options.createIfMissing)
            writerLock = options.readOnly ? nil : try WriterLock.take(directory: environment.path)
            do {
                for name in derivedDatabases {
                    derived[name] = try environment.openDatabase(name, create: !options.readOnly)
                }
                // Only a writer needs the last entry at open: it appends
                // after it, with a later timestamp, so it refuses a damaged
                // one. A reader reads the log's end when asked
                // (`lastOffset()`), and a damaged last entry is an error
                // there, or a problem `verifyEntries()` lists.
                initial =
                    options.readOnly
                    ? .empty
                    : try environment.read { txn in
                        try EventLog.lastPosition(txn, log: databases.log, path: environment.path)
                    }
            } catch {
                writerLock?.release()
                throw error
            }
        } catch {
            environment.close()
            throw error
        }
        self.writerLock = writerLock
        self.environment = environment
        if !options.readOnly {
            // After a failed commit (a full disk, an I/O error) the next
            // read or write opens the environment again: the app goes on
            // once the disk has room, with what was committed.
            var named = derived.compactMapValues { $0 }
            named["log"] = databases.log
            named["meta"] = databases.meta
            environment.reopensAfterFailure(keeping: named)
        }
        self.path = environment.path
        let log = databases.log
        logDatabase = log
        metaDatabase = databases.meta
        self.derivedDatabases = derived
        let position = CommittedPosition(initial)
        self.position = position
        self.onClose = onClose
        committer =
            options.readOnly
            ? nil
            : GroupCommitter(
                environment: environment, log: log, position: initial,
                onCommit: { committed, jobs, effects in
                    position.record(committed, jobs: jobs, entries: effects.entries)
                    if !effects.isEmpty { onCommit?(effects) }
                },
                onStop: {
                    // The reverse of opening: a reopen in this process that
                    // comes in between is refused as `.alreadyOpen` (the
                    // environment's, a wait), never as `.writerActive` naming
                    // this very process.
                    writerLock?.release()
                    environment.close()
                    onClose?()
                })
    }

    /// Finishes queued appends and closes the store. Later calls throw.
    /// Concurrent calls each return once the store is closed.
    public func close() {
        // The writer closes the environment and releases the lock as it
        // stops, after the last queued append: a close() that cannot wait
        // for it (in a `deinit` on the writer's own threads) still closes.
        guard let committer else {
            environment.close()
            onClose?()
            return
        }
        committer.close()
    }

    /// A log released without `close()` closes here, on whatever thread
    /// dropped the last reference, the writer's own ones included (see
    /// `GroupCommitter.close()`).
    deinit { close() }

    /// Finds (or, when allowed, creates) the `log` and `meta` databases and
    /// checks the format marker.
    private static func openDatabases(_ environment: Environment, create: Bool) throws -> (Database, Database) {
        let path = environment.path
        guard create else {
            // Handles opened in a read transaction live on only if it commits,
            // which `Environment.openDatabase` does.
            guard let meta = try environment.openDatabase("meta", create: false) else {
                throw LogStoreError(.notAStore, path: path, "an LMDB environment without a sync store's meta database")
            }
            try environment.read { txn in try checkMarker(txn, meta: meta, path: path) }
            guard let log = try environment.openDatabase("log", create: false) else {
                throw LogStoreError(.notAStore, path: path, "the log database is missing")
            }
            return (log, meta)
        }
        return try environment.write { txn in
            if let meta = try txn.openDatabase("meta", create: false) {
                try checkMarker(txn, meta: meta, path: path)
                guard let log = try txn.openDatabase("log", create: false) else {
                    throw LogStoreError(.notAStore, path: path, "the log database is missing")
                }
                return (log, meta)
            }
            guard let main = try txn.openDatabase(nil, create: false), try txn.count(main) == 0 else {
                throw LogStoreError(.notAStore, path: path, "an LMDB environment without a sync store's meta database")
            }
            guard let meta = try txn.openDatabase("meta", create: true),
                let log = try txn.openDatabase("log", create: true)
            else { preconditionFailure("mdb_dbi_open with MDB_CREATE returned no database") }
            try txn.put(meta, key: StoreFormat.markerKey, value: StoreFormat.marker)
            try txn.put(meta, key: StoreFormat.storeIDKey, value: UUIDv7.Generator.shared.next().bytes)
            return (log, meta)
        }
    }

    private static func checkMarker(_ txn: borrowing Transaction, meta: Database, path: String) throws {
        guard let marker = try txn.get(meta, key: StoreFormat.markerKey),
            let version = StoreFormat.version(ofMarker: marker)
        else {
            guard try txn.get(meta, key: StoreFormat.serverIDKey) != nil else {
                throw LogStoreError(.notAStore, path: path, "the meta database has no format marker")
            }
            throw LogStoreError(
                .notAStore, path: path,
                "the meta database has no format marker but a server id: a sync server's data directory (syncserver --data), not a client's store")
        }
        guard version == StoreFormat.storeVersion else {
            throw LogStoreError(
                .unsupportedFormat, path: path,
                "store version \(version); this build reads version \(StoreFormat.storeVersion)")
        }
    }

    /// The last offset and timestamp in the log, from its last entry.
    static func lastPosition(_ txn: borrowing Transaction, log: Database, path: String) throws
        -> WriteContext.Position
    {
        try txn.withCursor(log) { cursor in
            guard let (key, value) = try cursor.last() else { return .empty }
            let entry = try decode(key: key, value: value, path: path)
            return WriteContext.Position(lastOffset: entry.offset, lastTimestamp: entry.timestamp)
        }
    }

    static func decode(key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, path: String) throws
        -> Entry
    {
        try decode(value, offset: try offset(ofKey: key, path: path), path: path)
    }

    /// The offset a log key names.
    /// - Throws: `LogStoreError.corruptEntry` naming the key when it is not 8 bytes.
    private static func offset(ofKey key: UnsafeRawBufferPointer, path: String) throws -> UInt64 {
        try OffsetKey.decode(key, table: "log", path: path)
    }

    /// The entry stored under `offset`.
    /// - Throws: `LogStoreError.corruptEntry` when `value` does not decode.
    private static func decode(_ value: UnsafeRawBufferPointer, offset: UInt64, path: String) throws -> Entry {
        do {
            return try EntryCodec.decode(value, expectedOffset: offset)
        } catch {
            throw LogStoreError.corrupt(error, path: path)
        }
    }
}

// MARK: - Appending

extension EventLog {
    /// Appends one entry and returns its offset once it is committed.
    /// - Throws: `FormatError` (over a limit), `LMDBError`, `LogStoreError.closed`.
    public func append(_ body: EntryBody) async throws -> UInt64 {
        try await perform { txn, context in try context.append(body, in: txn) }
    }

    /// Appends the entries in one transaction, all or none, and returns the
    /// offsets they got (nil for an empty array).
    public func append(contentsOf bodies: [EntryBody]) async throws -> ClosedRange<UInt64>? {
        guard !bodies.isEmpty else { return nil }
        return try await perform { txn, context in try EventLog.appendAll(bodies, txn, &context) }
    }

    /// `append(_:)` for threads that are not in an async context: it blocks
    /// the calling thread until the commit.
    public func appendBlocking(_ body: EntryBody) throws -> UInt64 {
        try performBlocking { txn, context in try context.append(body, in: txn) }
    }

    /// `append(contentsOf:)` for threads, blocking until the commit.
    public func appendBlocking(contentsOf bodies: [EntryBody]) throws -> ClosedRange<UInt64>? {
        guard !bodies.isEmpty else { return nil }
        return try performBlocking { txn, context in try EventLog.appendAll(bodies, txn, &context) }
    }

    private static func appendAll(_ bodies: [EntryBody], _ txn: borrowing Transaction, _ context: inout WriteContext)
        throws -> ClosedRange<UInt64>
    {
        // By index: `for body in bodies` would copy each body out first.
        let first = try context.append(bodies[bodies.startIndex], in: txn)
        for index in bodies.indices.dropFirst() { _ = try context.append(bodies[index], in: txn) }
        return first...context.position.lastOffset
    }

    /// Runs `body` in the next group transaction and returns its value after
    /// the commit. The call cannot be cancelled once queued: the write may
    /// already be durable, and the caller must learn its outcome.
    func perform<Value: Sendable>(_ body: @escaping ValueJob<Value>.Body) async throws -> Value {
        guard let committer else { throw readOnlyError() }
        return try await withCheckedThrowingContinuation { continuation in
            let job = ValueJob(body) { continuation.resume(with: $0) }
            if !committer.submit(job) {
                continuation.resume(throwing: LogStoreError(.closed, path: path, "the store is closed"))
            }
        }
    }

    func performBlocking<Value: Sendable>(_ body: @escaping ValueJob<Value>.Body) throws -> Value {
        guard let committer else { throw readOnlyError() }
        let outcome = Mutex<Result<Value, any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        let job = ValueJob(body) { result in
            outcome.withLock { $0 = result }
            done.signal()
        }
        guard committer.submit(job) else { throw LogStoreError(.closed, path: path, "the store is closed") }
        done.wait()
        guard let result = outcome.withLock({ $0 }) else { preconditionFailure("job completed without a result") }
        return try result.get()
    }

    /// Opened read-only: every write throws.
    var isReadOnly: Bool { committer == nil }

    /// Writes queued for the writer and not yet in a transaction (tests).
    var queuedWriteCount: Int { committer?.queuedCount ?? 0 }

    /// Whether the log takes writes: false once `close()` is called, or
    /// when it was opened read-only (tests).
    var isOpenForWrites: Bool { committer.map { !$0.isClosing } ?? false }

    private func readOnlyError() -> LMDBError {
        LMDBError(code: .permissionDenied, operation: "append (store opened read-only)", path: path)
    }
}

// MARK: - Reading

extension EventLog {
    /// The last committed offset, 0 for an empty log. For a store opened
    /// read-only this reads the log, so it sees other processes' appends.
    public func lastOffset() throws -> UInt64 {
        if committer != nil { return position.current.lastOffset }
        return try environment.read { txn in try EventLog.lastPosition(txn, log: logDatabase, path: path).lastOffset }
    }

    /// The entry at `offset`, or nil if there is none.
    /// - Throws: `LogStoreError.corruptEntry` when its bytes do not decode.
    public func entry(at offset: UInt64) throws -> Entry? {
        try environment.read { txn in try EventLog.entry(at: offset, in: logDatabase, path: path, txn) }
    }

    /// The entry at `offset` of the `log` database, read in `txn`, or nil.
    /// - Throws: `LogStoreError.corruptEntry` when its bytes do not decode.
    static func entry(at offset: UInt64, in log: Database, path: String, _ txn: borrowing Transaction) throws -> Entry? {
        try OffsetKey.encode(offset).withUnsafeBytes { key in
            try txn.withValue(log, key: key) { value in try decode(key: key, value: value, path: path) }
        }
    }

    /// The compaction watermark read inside `txn` (0 if never compacted).
    /// - Throws: `LogStoreError.corruptEntry` for a stored value that is not
    ///   8 bytes. Read as 0, the holes compaction left below it would be
    ///   reported as entries missing from the log.
    func compactedBelow(_ txn: borrowing Transaction) throws -> UInt64 {
        try StoreFormat.compactedBelowKey.withUnsafeBytes { key in
            try txn.withValue(metaDatabase, key: key) { raw -> UInt64 in
                guard let watermark = UInt64(bigEndianBytes: raw) else {
                    throw LogStoreError(
                        .corruptEntry, path: path,
                        "the compaction watermark (meta compacted-below) is \(raw.count) bytes, not an offset of 8")
                }
                return watermark
            }
        } ?? 0
    }

    /// A u64 value of the `meta` database, read in `txn`; nil when the key
    /// is absent or its value is not 8 bytes.
    func metaNumber(_ key: [UInt8], _ txn: borrowing Transaction) throws -> UInt64? {
        try key.withUnsafeBytes { key in
            try txn.withValue(metaDatabase, key: key) { UInt64(bigEndianBytes: $0) } ?? nil
        }
    }

    /// Decodes the entry under `key` as the one after `expected - 1` in a
    /// read of the log in order: it must follow with no gap (see
    /// `checkDensity`). `expected` then names the offset after it; it stays
    /// as it was when this throws.
    ///
    /// The checks run in the order of storage.md section 4: the key, then
    /// that it may follow `expected`, then the value. A gap before a
    /// damaged entry is reported as the gap, where it begins.
    /// - Throws: `LogStoreError` `.corruptEntry` or `.gap`.
    static func decode(
        key: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer, following expected: inout UInt64,
        compactedBelow: UInt64, path: String
    ) throws -> Entry {
        let offset = try offset(ofKey: key, path: path)
        try checkDensity(expected: expected, found: offset, compactedBelow: compactedBelow, path: path)
        let entry = try decode(value, offset: offset, path: path)
        // Wraps only past the last offset, which no entry can follow.
        expected = offset &+ 1
        return entry
    }

    /// Checks that `found` may follow `expected`: equal, or a hole that lies
    /// wholly below the compaction watermark.
    static func checkDensity(expected: UInt64, found: UInt64, compactedBelow: UInt64, path: String) throws {
        guard found == expected || (found > expected && found <= compactedBelow) else {
            throw LogStoreError.gap(expected: expected, found: found, path: path)
        }
    }

    /// A lazy reader of the entries from `start` through `end` (inclusive;
    /// nil for the end of the log as it is when each chunk is read).
    public func entries(from start: UInt64 = 1, through end: UInt64? = nil) -> EntryScanner {
        EntryScanner(log: self, next: max(start, 1), end: end)
    }
}

/// The position of the last commit, written by the writer thread and read by
/// any thread, with counters of what the writer has done since open.
final class CommittedPosition: Sendable {
    private struct State {
        var position: WriteContext.Position
        var statistics = EventLog.Statistics()
    }

    private let state: Mutex<State>

    init(_ position: WriteContext.Position) { state = Mutex(State(position: position)) }

    var current: WriteContext.Position { state.withLock { $0.position } }
    var statistics: EventLog.Statistics { state.withLock { $0.statistics } }

    func record(_ position: WriteContext.Position, jobs: Int, entries: Int) {
        state.withLock { state in
            state.statistics.commits += 1
            state.statistics.writes += jobs
            state.statistics.entries += entries
            state.position = position
        }
    }
}

extension EventLog {
    /// What this process has written since it opened the store.
    public struct Statistics: Sendable, Equatable {
        /// Write transactions committed.
        public var commits = 0
        /// Append calls (or other write jobs) those commits carried: with
        /// concurrent writers, several per commit.
        public var writes = 0
        /// Entries appended.
        public var entries = 0
    }

    public var statistics: Statistics { position.statistics }
}
