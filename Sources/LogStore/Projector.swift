import Foundation
import LMDB
import LogFormat

/// Applies log entries to the derived databases. The incremental path (each
/// write) and replay (rebuilding from the log) both go through `apply`, so
/// they cannot drift apart; the model tests check it anyway.
struct Projector: Sendable {
    let log: Database
    let meta: Database
    let entities: Database
    let outbox: Database
    let idempotency: Database
    let counts: Database
    let conflicts: Database
    /// Not derived, and one for both sets (`AwaitedFeed.swift`); nil in a
    /// store opened read-only before it had one.
    let awaitedFeed: Database?
    let path: String
    /// The `meta` key of the pull cursor these tables go with: `cursor` for
    /// the tables in use, `rebuild-cursor` for those a rebuild fills.
    var cursorKey = MetaKey.cursor
    /// Set only on the copy a replay chunk uses (see `ProjectionCache`).
    var cache: ProjectionCache?

    /// The five databases, in the order of `Store.derivedDatabaseNames`.
    var databases: [Database] { [entities, outbox, idempotency, counts, conflicts] }

    /// The outbox value of an intent just written: pending, never tried.
    static let newOutboxState = OutboxState().encoded()

    /// Applies one entry. With `live` set (a write happening now), the types
    /// it changed and events for the app are collected in `effects`; replay
    /// leaves them out because they were delivered when the entries were
    /// first written (a rebuild names its types once, as it ends).
    func apply(_ entry: Entry, _ txn: borrowing Transaction, _ effects: inout CommitEffects, live: Bool) throws {
        switch entry.body {
        case .intent(let intent):
            try update(intent.entityType, intent.entityID, txn) { record in
                Projector.apply(intent, to: &record.visible)
                record.pending.append(entry.offset)
                return true
            }
            if let cache {
                if !cache.canStage(entry.offset) { try cache.flush(self, txn) }
                cache.stageOutbox(entry.offset)
            } else {
                try txn.put(outbox, key: OffsetKey.encode(entry.offset), value: Projector.newOutboxState)
            }
            try putIdempotencyKey(intent.idempotencyKey, offset: entry.offset, txn)
            if live {
                effects.touchedTypes.insert(intent.entityType)
                effects.wroteIntents = true
            }
        case .ack(let ack):
            var aheadOfFeed = false
            let intent = try settle(ack.intentOffset, txn) { record, intent in
                let before = record.confirmed
                // A base at this version or past it came from the feed (no
                // earlier answer has a later version): the feed showed it.
                aheadOfFeed = ack.serverVersion > before.version
                record.confirmed = before.applying(ack: intent, version: ack.serverVersion)
                record.ackedVersion = max(record.ackedVersion, ack.serverVersion)
                // `applying(ack:)` either keeps the base or applies the intent to it.
                return record.confirmed != before
            }
            if live, let intent {
                effects.touchedTypes.insert(intent.entityType)
                if aheadOfFeed {
                    try awaitFeed(intent, version: ack.serverVersion, ackOffset: entry.offset, txn)
                }
            }
        case .reject(let reject):
            let intent = try settle(reject.intentOffset, txn) { _, _ in false }
            if live, let intent {
                effects.touchedTypes.insert(intent.entityType)
                effects.events.append(
                    .rejected(
                        RejectedIntent(
                            intentOffset: reject.intentOffset, operation: intent.operation,
                            entityType: intent.entityType, entityID: intent.entityID, code: reject.code,
                            message: reject.message)))
            }
        case .remote(let remote):
            let changed = try confirm(
                remote.entityType, remote.entityID, version: remote.serverVersion,
                state: remote.operation == .upsert ? remote.fields : nil, txn)
            // `applyPulledPage` tells `awaited-feed`: the change's
            // idempotency key comes with the page, not in the entry.
            if live, changed { effects.touchedTypes.insert(remote.entityType) }
            try setCursor(remote.cursor, txn)
        case .snapshot(let snapshot):
            if !snapshot.entityType.isEmpty {
                let changed = try confirm(
                    snapshot.entityType, snapshot.entityID, version: snapshot.serverVersion,
                    state: snapshot.deleted ? nil : snapshot.fields, txn)
                if live {
                    if changed { effects.touchedTypes.insert(snapshot.entityType) }
                    try sawInFeed(
                        snapshot.entityType, snapshot.entityID, version: snapshot.serverVersion, idempotencyKey: nil, txn)
                }
            }
            try setCursor(snapshot.cursor, txn)
        case .resync:
            // The reset walks the database itself, so it must see everything.
            try cache?.flush(self, txn)
            // `awaited-feed` stays: the pull from the start shows every
            // entity the server has, and a change it ends without is one the
            // server lost (a 410 or a forced resync after a restore, say).
            // Damaged rows go.
            try resetBase(txn, &effects)
            if live { try dropDamagedAwaited(txn) }
        case .conflict(let conflict):
            // The `conflicts` database lists those waiting for the app; a
            // later entry with a resolution takes its intent off the list.
            let key = OffsetKey.encode(conflict.intentOffset)
            if conflict.resolution == .pending {
                try txn.put(conflicts, key: key, value: OffsetKey.encode(entry.offset))
            } else {
                try txn.delete(conflicts, key: key)
            }
            if live { effects.events.append(.conflict(offset: entry.offset, conflict)) }
        }
    }

    /// Maps the key to its intent's offset, from the string's and the
    /// offset's own bytes (no arrays: replay writes one per intent).
    private func putIdempotencyKey(_ key: String, offset: UInt64, _ txn: borrowing Transaction) throws {
        var key = key
        try key.withUTF8 { key in
            let key = UnsafeRawBufferPointer(key)
            let appending = cache?.appendsIdempotencyKey(key) ?? false
            try withUnsafeBytes(of: offset.bigEndian) { value in
                try txn.put(idempotency, key: key, value: value, flags: appending ? .append : [])
            }
        }
    }

    /// The state after `intent`: a create sets every field, an update merges
    /// its fields into an existing entity (and cannot bring back a missing
    /// one), a delete removes it.
    static func applying(_ intent: Intent, to state: Fields?) -> Fields? {
        var state = state
        apply(intent, to: &state)
        return state
    }

    /// `applying(_:to:)` in place (an update to fields of their own merges without a copy).
    static func apply(_ intent: Intent, to state: inout Fields?) {
        switch intent.operation {
        case .create: state = intent.fields
        case .update: state?.merge(intent.fields)
        case .delete: state = nil
        }
    }

    /// An empty cursor means none (the protocol's cursors are never empty).
    private func setCursor(_ cursor: String, _ txn: borrowing Transaction) throws {
        if let cache {
            cache.cursor = cursor
        } else {
            try storeCursor(cursor, txn)
        }
    }

    func storeCursor(_ cursor: String, _ txn: borrowing Transaction) throws {
        if cursor.isEmpty {
            try txn.delete(meta, key: cursorKey)
        } else {
            try txn.put(meta, key: cursorKey, value: Array(cursor.utf8))
        }
    }

    /// Takes the intent at `offset` out of the pending set (acked or
    /// rejected), lets `confirm` update the base (it returns true when it
    /// applied the intent to the base, false when it left the base as it
    /// was), and recomputes the visible state. An intent no longer pending
    /// (a repeated answer, perhaps to an intent compaction has since
    /// removed) changes nothing; the outbox holds exactly the pending
    /// intents, so it is asked first.
    /// - Returns: the intent, when it was pending (and is settled now).
    private func settle(
        _ offset: UInt64, _ txn: borrowing Transaction, confirm: (inout EntityRecord, Intent) -> Bool
    ) throws -> Intent? {
        let offsetKey = OffsetKey.encode(offset)
        let staged = cache?.stagedOutbox(offset)
        guard try staged ?? txn.contains(outbox, key: offsetKey) else { return nil }
        let intent = try readIntent(at: offset, txn)
        let settled = try update(intent.entityType, intent.entityID, txn) { record in
            guard let index = record.pending.firstIndex(of: offset) else { return false }
            record.pending.remove(at: index)
            let appliedToBase = confirm(&record, intent)
            // Only intents made before an answer need its version; once none is
            // pending, every later intent is made against a base that has it.
            if record.pending.isEmpty { record.ackedVersion = 0 }
            // The visible state is the base with the pending intents applied in
            // order. When the oldest pending intent moved into the base, the new
            // base with the rest applied is the visible state already: nothing
            // to read back from the log. Otherwise it is folded again (with
            // none pending, that is the base itself, sharing its storage).
            if index != 0 || !appliedToBase || record.pending.isEmpty {
                record.visible = try fold(record.base, record.pending, of: intent.entityType, intent.entityID, txn)
            }
            return true
        }
        guard settled else { return nil }
        if staged != nil {
            cache?.unstageOutbox(offset)
        } else {
            try txn.delete(outbox, key: offsetKey)
        }
        return intent
    }

    /// The server confirmed `state` (nil: deleted) at `version`; see
    /// `Confirmed.applying(version:state:)`.
    /// - Returns: whether that changed the entity's record.
    private func confirm(
        _ type: String, _ id: String, version: UInt64, state: Fields?, _ txn: borrowing Transaction
    ) throws -> Bool {
        try update(type, id, txn) { record in
            let confirmed = record.confirmed.applying(version: version, state: state)
            guard confirmed != record.confirmed else { return false }
            record.confirmed = confirmed
            record.visible = try fold(record.base, record.pending, of: type, id, txn)
            return true
        }
    }

    /// Full resync: forget everything the server confirmed (tombstones too)
    /// and the pull cursor; pending intents stay and are applied over nothing.
    private func resetBase(_ txn: borrowing Transaction, _ effects: inout CommitEffects) throws {
        var after: [UInt8]?
        while true {
            let batch = try keys(after: after, txn)
            guard let last = batch.last else { break }
            for key in batch {
                let (type, id) = EntityKey.split(key)
                try update(type, id, txn) { record in
                    record.base = nil
                    record.baseVersion = 0
                    // The server's versions may have started over (a new store).
                    record.ackedVersion = 0
                    record.visible = try fold(nil, record.pending, of: type, id, txn)
                    return true
                }
                effects.touchedTypes.insert(type)
            }
            // A replay's working set is written out with each batch, so it
            // does not grow with the table either.
            try cache?.flush(self, txn)
            after = last
        }
        try txn.delete(meta, key: cursorKey)
    }

    /// Up to `Store.resetBatchCountMax` keys of stored records in key
    /// order, after the key `after` (from the first when nil). They are read
    /// before any record is written: writing while a cursor walks the same
    /// database would move the cursor.
    private func keys(after: [UInt8]?, _ txn: borrowing Transaction) throws -> [[UInt8]] {
        var batch: [[UInt8]] = []
        try txn.forEach(entities, from: after) { key, _ in
            // The previous batch's last record, when it is still there.
            if let after, key.elementsEqual(after) { return true }
            batch.append([UInt8](key))
            return batch.count < Store.resetBatchCountMax
        }
        return batch
    }

    /// Base with the pending intents of the entity `type`/`id` applied in
    /// log order.
    /// - Throws: `LogStoreError.corruptEntry` naming the entity and the
    ///   offset when a pending offset is not an intent of that entity:
    ///   damage to its record that its layout cannot show, which would
    ///   otherwise apply another entity's intent to it, or be reported as
    ///   an answer naming an entry that is not an intent.
    func fold(
        _ base: Fields?, _ pending: [UInt64], of type: String, _ id: String, _ txn: borrowing Transaction
    ) throws -> Fields? {
        var state = base
        for offset in pending {
            let entry = try EventLog.entry(at: offset, in: log, path: path, txn)
            guard case .intent(let intent)? = entry?.body, Fields.same(intent.entityType, type), Fields.same(intent.entityID, id)
            else {
                let found =
                    switch entry?.body {
                    case .intent(let intent)?: "an intent of \(intent.entityType)/\(intent.entityID)"
                    case let body?: "a \(body.kind) entry"
                    case nil: "no entry"
                    }
                throw LogStoreError(
                    .corruptEntry, path: path, offset: offset,
                    "entity \(type)/\(id): its record lists offset \(offset) as one of its pending intents; the log has \(found) there")
            }
            state = Projector.applying(intent, to: state)
        }
        return state
    }

    func readIntent(at offset: UInt64, _ txn: borrowing Transaction) throws -> Intent {
        guard let entry = try EventLog.entry(at: offset, in: log, path: path, txn), case .intent(let intent) = entry.body
        else {
            throw LogStoreError(
                .corruptEntry, path: path, offset: offset, "an ack or reject names offset \(offset), which is not an intent")
        }
        return intent
    }

    func load(_ type: String, _ id: String, _ txn: borrowing Transaction) throws -> EntityRecord? {
        try EntityKey.withKey(type: type, id: id) { key in
            if let cached = cache?.record(ByteKey(key)) { return cached }
            return try loadStored(key, txn)
        }
    }

    /// The entity's acked version (0 without a record), without decoding its fields.
    func ackedVersion(_ type: String, _ id: String, _ txn: borrowing Transaction) throws -> UInt64 {
        try EntityKey.withKey(type: type, id: id) { key in
            if let cached = cache?.record(ByteKey(key)) { return cached?.ackedVersion ?? 0 }
            return try txn.withValue(entities, key: key) { value in
                try reportingDamage(key) { () throws(FormatError) in try EntityRecord.ackedVersion(decoding: value) }
            } ?? 0
        }
    }

    private func loadStored(_ key: UnsafeRawBufferPointer, _ txn: borrowing Transaction) throws -> EntityRecord? {
        try txn.withValue(entities, key: key) { value in
            try reportingDamage(key) { () throws(FormatError) in try EntityRecord(decoding: value) }
        }
    }

    /// The visible state of the record `value` stored under `key` (see
    /// `EntityRecord.visibleState(decoding:)`).
    /// - Throws: `LogStoreError.corruptEntry` naming the entity, with the
    ///   store at `path`, for a record that does not decode.
    static func decodeVisible(_ value: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, path: @autoclosure () -> String)
        throws -> (visible: Fields?, baseVersion: UInt64, pendingCount: Int)
    {
        try reportingDamage(key, path: path()) { () throws(FormatError) in try EntityRecord.visibleState(decoding: value) }
    }

    private func reportingDamage<R>(_ key: some Collection<UInt8>, _ decode: () throws(FormatError) -> R) throws -> R {
        try Projector.reportingDamage(key, path: path, decode)
    }

    /// A record that does not decode is damage, named by its entity. The
    /// path is read only then (a `get` that copied it would retain it).
    private static func reportingDamage<R>(
        _ key: some Collection<UInt8>, path: @autoclosure () -> String, _ decode: () throws(FormatError) -> R
    ) throws -> R {
        do {
            return try decode()
        } catch {
            let (type, id) = EntityKey.split([UInt8](key))
            throw LogStoreError(.corruptEntry, path: path(), "entity \(type)/\(id): \(error)", formatError: error)
        }
    }

    /// Lets `body` change the entity's record in place (an empty record
    /// when it has none), then saves it (removing an empty one) and keeps
    /// the per-type count of visible entities in step. `body` returns
    /// whether it changed the record; when it did not, nothing is saved.
    /// - Returns: what `body` returned.
    @discardableResult
    func update(
        _ type: String, _ id: String, _ txn: borrowing Transaction, _ body: (inout EntityRecord) throws -> Bool
    ) throws -> Bool {
        let visibility = try EntityKey.withKey(type: type, id: id) { key -> EntityRecord.Visibility? in
            if let cache { return try cache.update(ByteKey(key), load: { try loadStored(key, txn) }, body) }
            var record = try loadStored(key, txn) ?? EntityRecord()
            let visibility = try record.change(body)
            if visibility != nil { try storeRecord(record, key: key, txn) }
            return visibility
        }
        guard let visibility else { return false }
        if visibility.was != visibility.is {
            let stored = try visibleCount(type, txn)
            // Only a damaged count is this large; one more must not trap.
            let (count, overflow) = stored.addingReportingOverflow(visibility.is ? 1 : -1)
            guard !overflow else {
                throw LogStoreError(.corruptEntry, path: path, "counts: the row of \(type) holds \(stored), with no room for one more")
            }
            if let cache { cache.counts[type] = count } else { try storeCount(count, type, txn) }
        }
        return true
    }

    /// Saves `record` under `key`, or removes the key when the record is
    /// nil or empty. `appending`: the key is past every stored one.
    func storeRecord(
        _ record: EntityRecord?, key: UnsafeRawBufferPointer, appending: Bool = false, _ txn: borrowing Transaction
    ) throws {
        if let record, !record.isEmpty {
            try record.withEncoded { value in
                try txn.put(entities, key: key, value: value, flags: appending ? .append : [])
            }
        } else {
            try txn.delete(entities, key: key)
        }
    }

    func storeCount(_ count: Int, _ type: String, _ txn: borrowing Transaction) throws {
        guard count >= 0 else {
            throw LogStoreError(.corruptEntry, path: path, "counts: the row of \(type) would fall below zero")
        }
        if count == 0 {
            try txn.delete(counts, key: Array(type.utf8))
        } else {
            try txn.put(counts, key: Array(type.utf8), value: UInt64(count).bigEndianBytes)
        }
    }

    func visibleCount(_ type: String, _ txn: borrowing Transaction) throws -> Int {
        if let count = cache?.counts[type] { return count }
        let key = Array(type.utf8)
        return try key.withUnsafeBytes { key in
            try txn.withValue(counts, key: key) { value in
                // Stored bytes: a value that is not 8 bytes, or too big for an
                // Int, is damage to report, not a count (nor a trap).
                guard let count = UInt64(bigEndianBytes: value).flatMap({ Int(exactly: $0) }) else {
                    throw LogStoreError(
                        .corruptEntry, path: path, "counts: the row of \(type) is damaged: \(value.count) bytes, not a u64 of 8 that fits an Int")
                }
                return count
            }
        } ?? 0
    }
}

/// Keys of the `meta` database besides the format marker.
package enum MetaKey {
    /// The pull cursor of the last applied server change.
    static let cursor = Array("cursor".utf8)
    /// u32: the layout of the derived databases; a different value rebuilds them.
    static let projectionVersion = Array("projection-version".utf8)
    /// u64: the last log offset the derived databases reflect.
    package static let watermark = Array("projection-watermark".utf8)
    /// u8: which of the two sets of derived databases is in use (absent: 0);
    /// the three keys above describe that set.
    static let projectionSet = Array("projection-set".utf8)
    /// u32: the projection version a rebuild under way fills the other set
    /// to; present exactly while one is under way.
    static let rebuildVersion = Array("rebuild-version".utf8)
    /// u64: the last log offset the set a rebuild fills reflects.
    static let rebuildWatermark = Array("rebuild-watermark".utf8)
    /// The pull cursor of the set a rebuild fills.
    static let rebuildCursor = Array("rebuild-cursor".utf8)
    /// The three keys of a rebuild under way, deleted together when it ends.
    static let rebuildKeys = [rebuildVersion, rebuildWatermark, rebuildCursor]
}

extension EntityKey {
    static func split(_ key: [UInt8]) -> (type: String, id: String) {
        guard let zero = key.firstIndex(of: 0) else { return (String(decoding: key, as: UTF8.self), "") }
        return (String(decoding: key[..<zero], as: UTF8.self), String(decoding: key[(zero + 1)...], as: UTF8.self))
    }
}

/// Replay's working set for one chunk: the records it touched (each loaded
/// once and written once, in key order, at the end), the per-type counts,
/// the intents it added to the outbox and the pull cursor. It belongs to the
/// one writer job that made it.
///
/// It does not keep the intents it decoded: settling one reads it back from
/// the log. Keeping a chunk's intents alive made replay about 10% slower
/// (malloc's slow paths, and freeing them all at the end), more than the
/// reads cost.
final class ProjectionCache: @unchecked Sendable {
    /// The records the chunk touched, in the order it first touched them;
    /// nil for a record to delete.
    private var records: [(key: ByteKey, record: EntityRecord?)] = []
    /// Where each key's record is in `records`.
    private var positions: [ByteKey: Int] = [:]
    var counts: [String: Int] = [:]
    /// The pull cursor the chunk's last server change left, if it had one
    /// ("" for none).
    var cursor: String?
    /// The intents applied since the last flush that are still pending, one
    /// flag per offset from `outboxBase`. Most of those a chunk sees acked
    /// are acked within it, and then never reach the outbox database; the
    /// rest are appended to it in one ascending run.
    private var outboxBase: UInt64 = 0
    private var outboxPending: [Bool] = []
    /// No key stored in the `entities` database is greater than this (nil:
    /// it holds none). The database changes only when the chunk flushes,
    /// which keeps this up to date. A record past it is not stored, so
    /// loading it would search the tree for nothing, and writing it is an
    /// append, which also fills pages where inserts would split them in
    /// half. New entities' ids grow with time: most records a replay makes
    /// are past it.
    private var entitiesEnd: ByteKey?
    /// The same for the `idempotency` database, where intents' keys (made
    /// time-ordered, by `WriteBatch.newKey`) mostly go at the end.
    private var idempotencyEnd: [UInt8]?

    /// Where a flush hands the records it wrote, to be freed on another
    /// thread. Freeing a chunk's records (their fields, strings and keys,
    /// allocated long before and cold in the caches) took about a tenth of
    /// a replay; handed off, it overlaps the chunk's commit, whose syncs
    /// leave the core idle (a `.full` replay about 6% faster; without
    /// syncs, no faster). A flush waits for the previous hand-off first,
    /// so at most one chunk's records wait to be freed.
    private static let releaser = DispatchQueue(label: "SyncStore replay releases")
    private static let releasing = DispatchGroup()

    /// Sized for a chunk of `entryCount` entries, so the sets never grow
    /// (and rehash) as it runs, for the tables of `projector` as `txn`
    /// holds them.
    init(entryCount: Int, _ projector: Projector, _ txn: borrowing Transaction) throws {
        records.reserveCapacity(entryCount)
        positions.reserveCapacity(entryCount)
        outboxPending.reserveCapacity(entryCount)
        entitiesEnd = try ProjectionCache.lastKey(projector.entities, txn).map(ByteKey.init)
        idempotencyEnd = try ProjectionCache.lastKey(projector.idempotency, txn)
    }

    /// Whether `key` sorts after `end`, the last key of a table (nil: an
    /// empty table, which every key is past).
    private static func isPast(_ key: ByteKey, _ end: ByteKey?) -> Bool { end.map { $0 < key } ?? true }

    private static func lastKey(_ database: Database, _ txn: borrowing Transaction) throws -> [UInt8]? {
        try txn.withCursor(database) { cursor in try cursor.last().map { [UInt8]($0.key) } }
    }

    /// Whether `key` goes past every key in the `idempotency` database; it
    /// is the last one from here on, so the put that follows must store it.
    func appendsIdempotencyKey(_ key: UnsafeRawBufferPointer) -> Bool {
        if let end = idempotencyEnd, end.withUnsafeBytes({ ByteKey.compare(key, $0) <= 0 }) { return false }
        // Overwritten in place: its storage is reused for every key.
        var end = idempotencyEnd.take() ?? []
        end.replaceSubrange(end.indices, with: key)
        idempotencyEnd = end
        return true
    }

    /// The widest span of offsets the flags cover. A chunk's entries span
    /// no more than the chunk unless the log has holes (left by compaction,
    /// or in an imported log), which may be of any width: a flush steps
    /// over such a hole rather than flag every offset in it.
    static let stagedSpanMax: UInt64 = 1 << 20

    /// Whether `offset` can be staged without a flush first.
    func canStage(_ offset: UInt64) -> Bool {
        outboxPending.isEmpty || offset - outboxBase < ProjectionCache.stagedSpanMax
    }

    /// The intent at `offset` (past every one staged so far, and within
    /// `canStage`) is pending.
    func stageOutbox(_ offset: UInt64) {
        if outboxPending.isEmpty { outboxBase = offset }
        let index = Int(offset - outboxBase)
        outboxPending.append(contentsOf: repeatElement(false, count: index - outboxPending.count))
        outboxPending.append(true)
    }

    /// Whether the intent at `offset` is pending, when the chunk knows: an
    /// offset at or past the first one staged since the last flush was
    /// applied by this chunk (or is not an intent it has seen, so not
    /// pending). nil for an earlier offset: the outbox database knows.
    func stagedOutbox(_ offset: UInt64) -> Bool? {
        guard !outboxPending.isEmpty, offset >= outboxBase else { return nil }
        let index = offset - outboxBase
        return index < outboxPending.count && outboxPending[Int(index)]
    }

    func unstageOutbox(_ offset: UInt64) {
        outboxPending[Int(offset - outboxBase)] = false
    }

    /// The record as the chunk left it: nil when the chunk has not touched
    /// it, `.some(nil)` when it is to be deleted.
    func record(_ key: ByteKey) -> EntityRecord?? {
        positions[key].map { records[$0].record }
    }

    /// `Projector.update` on the chunk's copy of the record: loaded with
    /// `load` the first time the chunk touches it, changed in place after
    /// (so its fields and pending offsets are not copied on write).
    /// - Returns: as `EntityRecord.change`.
    func update(
        _ key: ByteKey, load: () throws -> EntityRecord?, _ body: (inout EntityRecord) throws -> Bool
    ) throws -> EntityRecord.Visibility? {
        if let position = positions[key] {
            // Taken out, so the one reference is the local one, and moved
            // back (a copy retained its fields and offsets, and released
            // them again). A throw leaves it out: the chunk's transaction
            // fails, and this cache goes with it.
            var record = records[position].record.take() ?? EntityRecord()
            let visibility = try record.change(body)
            if !record.isEmpty { records[position].record = consume record }
            return visibility
        }
        let stored = !ProjectionCache.isPast(key, entitiesEnd)
        var record = try (stored ? load() : nil) ?? EntityRecord()
        guard let visibility = try record.change(body) else { return nil }
        positions[key] = records.count
        records.append((key, record.isEmpty ? nil : consume record))
        return visibility
    }

    /// Writes what the chunk changed and empties the record and count sets.
    func flush(_ projector: Projector, _ txn: borrowing Transaction) throws {
        // Key order makes LMDB's inserts sequential. The order of first
        // touch is mostly key order already (new ids grow with time), which
        // the sort finds in runs: sorting the dictionary's (hash) order cost
        // a tenth of a replay. Sorted in place: sorting the indices copied a
        // record out (retaining its fields) for every comparison.
        // `positions` is stale from here on, and emptied below.
        records.sort { $0.key < $1.key }
        // In place: a copy of each (cold) record would retain and release
        // its key, fields and pending offsets. (Handing a record on to
        // `storeRecord` still copies it; moving it out and back instead
        // measured no faster: the encoder touches the same memory next.)
        var end = entitiesEnd
        try records.withUnsafeBufferPointer { records in
            for index in records.indices {
                let key = records[index].key
                let past = ProjectionCache.isPast(key, end)
                // Never stored: nothing to remove.
                if past, records[index].record?.isEmpty ?? true { continue }
                try key.withUnsafeBytes { key in
                    try projector.storeRecord(records[index].record, key: key, appending: past, txn)
                }
                if past { end = key }
            }
        }
        entitiesEnd = end
        for (type, count) in counts { try projector.storeCount(count, type, txn) }
        // Every staged offset is past the outbox's last key (they are past
        // the watermark), so each is an append at the end of its B-tree.
        for (index, pending) in outboxPending.enumerated() where pending {
            let key = OffsetKey.encode(outboxBase + UInt64(index))
            try txn.put(projector.outbox, key: key, value: Projector.newOutboxState, flags: .append)
        }
        if let cursor { try projector.storeCursor(cursor, txn) }
        let written = (records, positions)
        records = []
        positions = [:]
        ProjectionCache.releasing.wait()
        // The closure holds the last references: they go when it does.
        ProjectionCache.releaser.async(group: ProjectionCache.releasing) { withExtendedLifetime(written) {} }
        counts = [:]
        cursor = nil
        outboxPending.removeAll(keepingCapacity: true)
    }
}
