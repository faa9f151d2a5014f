import Foundation
import LMDB
import LogFormat
import Synchronization

/// What an app embeds: entities written offline and read back at once, with
/// the log as the single source of truth.
///
/// Every write is one `intent` entry plus its projection update, committed
/// together. Reads come from the projections: the server-confirmed state
/// with the pending intents applied in log order.
///
/// Caveats:
/// - Open a store at most once per process, and never use it after `fork()`.
/// - A write returns after its commit; with `.full` durability it is on disk.
///   Cancelling the task that awaits a write does not cancel the write: it
///   commits or fails, and the call returns that outcome, never
///   `CancellationError` (so a returned call always means committed).
/// - A slow reader of `changes(type:)` gets the latest change only; one of
///   `events()` gets the first `eventBufferCountMax` events it has not read,
///   then `.missed(count:)` for those the stream dropped.
/// - Each read call sees the store as of its own commit; `read(_:)` gives
///   several reads one commit's state, and pins its pages until it returns.
public final class Store: Sendable {
    /// The layout of the derived databases. A store whose derived databases
    /// have another version is rebuilt from the log when opened writable.
    public static let projectionVersion: UInt32 = 4
    /// Log entries applied per transaction while replaying.
    public static let replayChunkCountMax = 20_000
    /// Entity records a resync reads and rewrites at a time: it holds one
    /// batch in memory, not the whole table.
    public static let resetBatchCountMax = 1_024
    /// The most entities `all(type:after:limit:)` returns at once.
    public static let pageCountMax = 10_000
    /// The most unread events an `events()` stream holds for its reader;
    /// past it, the stream counts the events it drops (`StoreEvent.missed`).
    /// A reader that is this far behind reads the store instead; the bound
    /// keeps one that never reads from holding every event (a conflict
    /// carries the server's state, up to an entry's size) while the app runs.
    public static let eventBufferCountMax = 1_024

    /// The derived databases of set 0; set 1 has the same names with `.1`
    /// appended (`derivedDatabaseNames(set:)`).
    package static let derivedDatabaseNames = ["entities", "outbox", "idempotency", "counts", "conflicts"]
    /// Sets of derived databases: the one in use, and one a rebuild fills
    /// (`Format/storage.md`, section 15, "Replay").
    static let projectionSetCount = 2

    /// The names of the derived databases of `set` (0 or 1), in the order
    /// `derivedDatabaseNames` lists them.
    package static func derivedDatabaseNames(set: Int) -> [String] {
        precondition((0..<projectionSetCount).contains(set), "no projection set \(set)")
        return derivedDatabaseNames.map { set == 0 ? $0 : "\($0).\(set)" }
    }

    public let log: EventLog
    /// The derived databases of each set; nil for a set a read-only store
    /// did not find. `projector(_:)` picks the one in use.
    let projectors: [Projector?]
    /// The set in use as of the snapshot a read last looked it up in: that
    /// snapshot's id shifted left by one, the set in the low bit (`.max`:
    /// none yet). Reads of the same snapshot see the same set, so most skip
    /// the lookup (`activeSet`).
    let activeSetCache = Atomic<UInt64>(.max)
    /// Not private: tests count their subscribers.
    let changeFeed: Broadcast<StoreChange>
    let eventFeed: Broadcast<StoreEvent>
    let intentFeed: Broadcast<UInt64>
    /// Ends the three streams (see `init`).
    private let finishStreams: @Sendable () -> Void

    public var path: String { log.path }

    /// Opens the store at `path`, creating it if allowed, and brings its
    /// projections up to date with the log (the rest of a rebuild stopped
    /// part way, a rebuild when their version differs, otherwise the entries
    /// after their watermark).
    /// - Throws: what `EventLog.init` throws; `LogStoreError.projectionsStale`
    ///   for a read-only store whose projections are missing or out of date.
    public init(path: String, options: EventLog.Options = .init()) throws {
        let changeFeed = Broadcast<StoreChange>()
        let eventFeed = Broadcast<StoreEvent>()
        let intentFeed = Broadcast<UInt64>()
        self.changeFeed = changeFeed
        self.eventFeed = eventFeed
        self.intentFeed = intentFeed
        // After the log's last commit, which may come after `close()`
        // returned (one called on the writer's own thread), also when the
        // log is closed without the store, and in `deinit`.
        let finishStreams: @Sendable () -> Void = {
            changeFeed.finish()
            eventFeed.finish()
            intentFeed.finish()
        }
        self.finishStreams = finishStreams
        let sets = (0..<Store.projectionSetCount).map { Store.derivedDatabaseNames(set: $0) }
        let log = try EventLog(
            path: path, options: options, derivedDatabases: sets.flatMap { $0 } + [Projector.awaitedFeedName],
            onCommit: { effects in
                for type in effects.touchedTypes.sorted() {
                    changeFeed.publish(StoreChange(entityType: type, offset: effects.offset))
                }
                for event in effects.events { eventFeed.publish(event) }
                if effects.wroteIntents { intentFeed.publish(effects.offset) }
            },
            onClose: finishStreams)
        self.log = log
        projectors = sets.map { names in
            let derived = names.compactMap { log.derivedDatabases[$0] ?? nil }
            guard derived.count == names.count else { return nil }
            return Projector(
                log: log.logDatabase, meta: log.metaDatabase, entities: derived[0], outbox: derived[1],
                idempotency: derived[2], counts: derived[3], conflicts: derived[4],
                awaitedFeed: log.derivedDatabases[Projector.awaitedFeedName] ?? nil, path: log.path)
        }
        if options.readOnly {
            // One snapshot: read apart, another process's commit between
            // the two reads would make current projections look stale.
            let (version, watermark, last, active) = try log.environment.read { txn in
                let (version, watermark) = try projectionState(txn)
                let last = try EventLog.lastPosition(txn, log: log.logDatabase, path: log.path).lastOffset
                return (version, watermark, last, try activeSet(txn))
            }
            guard projectors[active] != nil else {
                throw LogStoreError(.projectionsStale, path: log.path, "the store has no projections; open it writable once")
            }
            guard version == Store.projectionVersion, watermark == last else {
                throw LogStoreError(
                    .projectionsStale, path: log.path,
                    "projections are version \(version.map(String.init) ?? "none") at offset \(watermark); open the store writable to rebuild them")
            }
        } else {
            try bringProjectionsUpToDate()
        }
    }

    /// Finishes queued writes, ends the change and event streams, and closes.
    public func close() {
        // The log ends the streams as it closes (its `onClose`).
        log.close()
    }

    /// A store released without `close()`: its log closes in its own
    /// `deinit` (or stays open, held elsewhere through `log`), so the streams
    /// end here rather than wait forever. Only the streams: waiting for the
    /// writer, as `close()` does, would never end should this run on the
    /// writer's own threads; the log's `deinit` knows not to wait there.
    deinit { finishStreams() }

    // Each of the streams below is one reader's: every call makes a stream
    // of its own. Iterated from two tasks at once, a stream traps, as an
    // `AsyncStream` does; two readers call twice.

    /// A value after each commit that touched entities of `type`, and after
    /// the commit that ends `rebuildProjections()` when `type` has entities
    /// visible in the tables before it or after it: the stream says that
    /// something changed, and the store has what. It holds one value, the
    /// latest: a reader that falls behind skips to it.
    public func changes(type: String) -> AsyncStream<StoreChange> {
        changeFeed.subscribe(bufferingNewest: 1) { $0.entityType == type }
    }

    /// Rejections, conflicts and exhausted retries, as they are committed.
    /// The stream holds up to `eventBufferCountMax` events its reader has
    /// not read; it drops the ones after them and yields
    /// `.missed(count:)` in their place (see `StoreEvent`).
    public func events() -> BoundedStream<StoreEvent> {
        eventFeed.subscribe(keepingFirst: Store.eventBufferCountMax, missed: StoreEvent.missed)
    }

    /// The last offset of a commit that wrote intents: the outbox has
    /// something new to push (the scheduler's "local write" trigger). It
    /// holds one value, the latest.
    public func intentCommits() -> AsyncStream<UInt64> { intentFeed.subscribe(bufferingNewest: 1) }
}

// MARK: - Writing

extension Store {
    /// Creates an entity and returns its id: `id` if given, otherwise a new
    /// time-ordered one (`te_01J...` when the type is a valid prefix).
    /// - Throws: `LogStoreError` `.invalidArgument`, `.alreadyExists`.
    @discardableResult
    public func create(type: String, id: String? = nil, fields: Fields) async throws -> String {
        var batch = WriteBatch()
        let id = try batch.create(type: type, id: id, fields: fields)
        try await write(batch)
        return id
    }

    /// Changes the named fields of an existing entity (a `.null` value sets
    /// the field to null; other fields are untouched).
    /// - Throws: `LogStoreError` `.invalidArgument`, `.notFound`.
    public func update(type: String, id: String, changes: Fields) async throws {
        var batch = WriteBatch()
        try batch.update(type: type, id: id, changes: changes)
        try await write(batch)
    }

    /// Deletes an existing entity.
    /// - Throws: `LogStoreError` `.invalidArgument`, `.notFound`.
    public func delete(type: String, id: String) async throws {
        var batch = WriteBatch()
        try batch.delete(type: type, id: id)
        try await write(batch)
    }

    /// Commits every operation of `batch` in one transaction, or none.
    /// - Throws: the first operation's error (`.notFound`, `.alreadyExists`,
    ///   `.invalidArgument` for one too big for a log entry).
    public func write(_ batch: WriteBatch) async throws {
        guard !batch.operations.isEmpty else { return }
        // Keys made per call, not per batch: a batch written twice is two
        // changes, and the server answers a key it has seen `duplicate`,
        // dropping the second. Made before the job, so a rerun of the
        // transaction writes the same intents.
        let operations = batch.operations.map { (operation: $0, key: WriteBatch.newKey()) }
        try await write { txn, context, store in
            // Looked up once: nothing in the batch switches the set in use.
            let projector = try store.projector(txn)
            // An app's write makes no conflict wait, so one look serves the
            // batch; few stores have a conflict waiting.
            let conflictsWait = try txn.count(projector.conflicts) > 0
            for (operation, key) in operations {
                try store.stage(operation, key: key, projector, txn, &context)
                if conflictsWait, operation.replacesState {
                    try store.settleWaitingConflicts(of: operation.type, operation.id, projector, txn, &context)
                }
            }
        }
    }

    /// Runs `body` as one job of the writer, then records the projection
    /// watermark, all in the job's transaction. Entries appended to the log
    /// directly (through `log`) since the last store write are projected
    /// first, so the watermark never passes an entry the tables lack.
    func write<Value: Sendable>(
        _ body: @escaping @Sendable (borrowing Transaction, inout WriteContext, Store) throws -> Value
    ) async throws -> Value {
        try await log.perform { txn, context in
            try self.catchUp(through: context.position.lastOffset, txn, &context.effects)
            let value = try body(txn, &context, self)
            try self.markWatermark(context.position.lastOffset, txn)
            return value
        }
    }

    /// Appends an entry and applies it to the projections.
    func append(_ body: EntryBody, _ txn: borrowing Transaction, _ context: inout WriteContext) throws {
        try append(body, projector(txn), txn, &context)
    }

    /// `append` into the derived databases of `projector`, the set in use.
    /// - Throws: `LogStoreError.invalidArgument`, naming the entity, for an
    ///   entry the format cannot hold (over `Limits.entryBodyBytesMax`):
    ///   its values came from the caller, the app or a server that breaks
    ///   the protocol's `entityFieldsBytesMax`.
    private func append(
        _ body: EntryBody, _ projector: Projector, _ txn: borrowing Transaction, _ context: inout WriteContext
    ) throws {
        let entry: Entry
        do {
            entry = try context.appendEntry(body, in: txn)
        } catch let error as FormatError {
            let subject = body.entityName.map { "\(body.kind) entry of \($0)" } ?? "\(body.kind) entry"
            throw LogStoreError(
                .invalidArgument, path: path, "the \(subject) cannot be written: \(error.code): \(error.detail)",
                formatError: error)
        }
        try projector.apply(entry, txn, &context.effects, live: true)
    }

    private func stage(
        _ operation: WriteBatch.Operation, key: String, _ projector: Projector, _ txn: borrowing Transaction,
        _ context: inout WriteContext
    ) throws {
        let record = try projector.load(operation.type, operation.id, txn)
        let exists = record?.visible != nil
        let intent: Intent
        switch operation.kind {
        case .create(let fields):
            guard !exists else { throw LogStoreError(.alreadyExists, path: path, "\(operation.type)/\(operation.id) exists") }
            intent = Intent(.create, idempotencyKey: key, entityType: operation.type, entityID: operation.id, baseVersion: record?.baseVersion ?? 0, fields: fields)
        case .update(let changes):
            guard let visible = record?.visible else {
                throw LogStoreError(.notFound, path: path, "no \(operation.type)/\(operation.id) to update")
            }
            // The server refuses it so: refused here, the app hears it from
            // its own call, and no push carries the entity with both names.
            if let problem = NameRules.updateProblem(changes, of: visible) {
                throw LogStoreError(.invalidArgument, path: path, "\(operation.type)/\(operation.id): \(problem)")
            }
            intent = Intent(.update, idempotencyKey: key, entityType: operation.type, entityID: operation.id, baseVersion: record?.baseVersion ?? 0, fields: changes)
        case .delete:
            guard exists else { throw LogStoreError(.notFound, path: path, "no \(operation.type)/\(operation.id) to delete") }
            intent = Intent(.delete, idempotencyKey: key, entityType: operation.type, entityID: operation.id, baseVersion: record?.baseVersion ?? 0)
        }
        try append(.intent(intent), projector, txn, &context)
    }

    func markWatermark(_ offset: UInt64, _ txn: borrowing Transaction) throws {
        try txn.put(log.metaDatabase, key: MetaKey.watermark, value: offset.bigEndianBytes)
    }
}

/// Operations to commit together with `Store.write(_:)`. Arguments are
/// checked as they are added; existence is checked at commit. A batch may
/// be written more than once: each write is new changes, pushed and
/// applied again (a create with a given or returned id then finds it exists).
public struct WriteBatch: Sendable {
    struct Operation: Sendable {
        enum Kind: Sendable {
            case create(Fields)
            case update(Fields)
            case delete
        }

        var kind: Kind
        var type: String
        var id: String

        /// A create or a delete: the whole state the app sees is replaced.
        var replacesState: Bool {
            if case .update = kind { return false }
            return true
        }
    }

    private(set) var operations: [Operation] = []

    public init() {}

    /// Adds a create and returns the entity's id (given or new).
    @discardableResult
    public mutating func create(type: String, id: String? = nil, fields: Fields) throws -> String {
        try Validation.entityType(type)
        try Validation.fields(fields)
        let id = id ?? WriteBatch.newID(type: type)
        try Validation.entityID(id)
        operations.append(Operation(kind: .create(fields), type: type, id: id))
        return id
    }

    public mutating func update(type: String, id: String, changes: Fields) throws {
        try Validation.entityType(type)
        try Validation.entityID(id)
        try Validation.fields(changes)
        operations.append(Operation(kind: .update(changes), type: type, id: id))
    }

    public mutating func delete(type: String, id: String) throws {
        try Validation.entityType(type)
        try Validation.entityID(id)
        operations.append(Operation(kind: .delete, type: type, id: id))
    }

    /// `te_01J...` for a type that is a valid ID prefix, else the bare ULID.
    static func newID(type: String) -> String {
        let id = UUIDv7.Generator.shared.next()
        return PrefixedID(prefix: type, id: id)?.description ?? id.ulidString
    }

    static func newKey() -> String { UUIDv7.Generator.shared.next().uuidString }
}

// MARK: - Reading

/// An entity as the app sees it.
public struct Entity: Sendable, Equatable {
    public var type: String
    public var id: String
    public var fields: Fields
    /// The server version of the confirmed state under it (0: never confirmed).
    public var serverVersion: UInt64
    /// Intents on it that the server has not yet answered.
    public var pendingIntentCount: Int

    public var hasPendingChanges: Bool { pendingIntentCount > 0 }
}

extension Store {
    /// The entity, or nil if it does not exist (or is deleted) for the app.
    /// Each call reads the store as of its own commit: reads that must
    /// agree with each other go through one `read(_:)`.
    public func get(type: String, id: String) throws -> Entity? {
        try read { try $0.get(type: type, id: id) }
    }

    /// Entities of `type` ordered by id, starting after `after` (exclusive),
    /// at most `limit` (up to `pageCountMax`).
    /// - Throws: `LogStoreError.invalidArgument` for a negative `limit`.
    public func all(type: String, after: String? = nil, limit: Int = 100) throws -> [Entity] {
        try read { try $0.all(type: type, after: after, limit: limit) }
    }

    /// The entity types that have entities the app sees, in byte order.
    public func entityTypes() throws -> [String] {
        try read { try $0.entityTypes() }
    }

    /// How many entities of `type` exist for the app.
    public func count(type: String) throws -> Int {
        try read { try $0.count(type: type) }
    }

    /// The check every call that takes a `limit` makes first.
    func checkLimit(_ limit: Int) throws {
        guard limit >= 0 else { throw LogStoreError(.invalidArgument, path: path, "a limit of \(limit) is negative") }
    }

    /// The pull cursor of the last applied server change, or nil.
    /// - Throws: `LogStoreError.corruptEntry` naming the `meta` key `cursor`
    ///   when its bytes are not a cursor the protocol allows
    ///   (`Wire.cursorProblem`). Read as text, the damage went to the server,
    ///   whose 410 passed it off as a stale cursor. `resync` deletes the
    ///   key; the sync engine resyncs so itself.
    public func pullCursor() throws -> String? {
        try log.environment.read { txn in
            guard let bytes = try txn.get(log.metaDatabase, key: MetaKey.cursor) else { return nil }
            if let problem = Wire.cursorProblem(bytes) {
                throw LogStoreError(.corruptEntry, path: path, "meta: the pull cursor (key \"cursor\", \(bytes.count) bytes) \(problem)")
            }
            return String(decoding: bytes, as: UTF8.self)
        }
    }

    /// The offset of the intent with this idempotency key, if it is known.
    /// - Throws: `LogStoreError.invalidArgument` for a key the store's
    ///   writes refuse (empty, or over `Limits.idempotencyKeyBytesMax`);
    ///   `.corruptEntry` naming the key when its row is not an 8-byte
    ///   offset (read as unknown, the key of an intent in the log would
    ///   look new).
    public func intentOffset(idempotencyKey: String) throws -> UInt64? {
        try Validation.idempotencyKey(idempotencyKey)
        return try log.environment.read { txn in
            try Array(idempotencyKey.utf8).withUnsafeBytes { key in
                try txn.withValue(self.projector(txn).idempotency, key: key) { value in
                    guard let offset = UInt64(bigEndianBytes: value) else {
                        throw LogStoreError(
                            .corruptEntry, path: path,
                            "the idempotency row of \"\(Value.printable(idempotencyKey))\" is \(value.count) bytes, not an offset of 8")
                    }
                    return offset
                }
            }
        }
    }

    /// Reads an entry inside an open transaction.
    func entryInside(_ txn: borrowing Transaction, at offset: UInt64) throws -> Entry {
        guard let entry = try EventLog.entry(at: offset, in: log.logDatabase, path: path, txn) else {
            throw LogStoreError(.gap, path: path, offset: offset, "no entry at offset \(offset)")
        }
        return entry
    }
}

extension EntryBody {
    /// `type/id` of the entity the entry is about; nil for the kinds about
    /// none (acks and rejects name an intent, a resync all).
    fileprivate var entityName: String? {
        switch self {
        case .intent(let intent): "\(intent.entityType)/\(intent.entityID)"
        case .remote(let remote): "\(remote.entityType)/\(remote.entityID)"
        case .conflict(let conflict): "\(conflict.entityType)/\(conflict.entityID)"
        case .snapshot(let snapshot): "\(snapshot.entityType)/\(snapshot.entityID)"
        case .ack, .reject, .resync: nil
        }
    }
}
