import LMDB
import LogFormat

/// The store as of one commit, for reads that must agree with each other: a
/// project and its time entries, a page and the count beside it. Writes that
/// commit meanwhile (from this process or another) are not seen, and every
/// read through it skips beginning a read transaction of its own.
///
/// It exists only inside `Store.read(_:)`, which ends it when its closure
/// returns: it cannot be copied, kept or carried across an `await`. Use it
/// from one thread at a time (an LMDB read transaction is not safe to use
/// from two at once), so it is not `Sendable`.
public struct StoreSnapshot: ~Copyable {
    private let store: Store
    private let txn: Transaction

    fileprivate init(_ store: Store, _ txn: borrowing Transaction) {
        self.store = store
        self.txn = Transaction(borrowing: txn)
    }

    /// The entity, or nil if it does not exist (or is deleted) for the app.
    /// - Throws: `LogStoreError.invalidArgument` for an empty type or one
    ///   with a zero byte (its key would name an entity of another type);
    ///   `.corruptEntry` naming the entity when its record does not decode.
    public func get(type: String, id: String) throws -> Entity? {
        let entities = try store.entitiesDatabase(txn)
        return try EntityKey.withKey(type: type, id: id) { key in
            // Not the writes' whole check of a type, which took a hot `get`
            // a twentieth of its time: only what makes the key name this
            // type, its first zero byte right after the type. No entity has
            // a type that fails the rest, so the lookup finds nothing.
            guard type.utf8.count > 0, key.firstIndex(of: 0) == type.utf8.count else {
                throw Validation.invalid("entity type \"\(type.prefix(80))\": a type is not empty and has no zero byte")
            }
            return try txn.withValue(entities, key: key) { value in try entity(type: type, id: id, key: key, record: value) } ?? nil
        }
    }

    /// Entities of `type` ordered by id, starting after `after` (exclusive),
    /// at most `limit` (up to `Store.pageCountMax`).
    /// - Throws: `LogStoreError.invalidArgument` for a negative `limit` or
    ///   a type as `get` does; `.corruptEntry` as `get` does.
    public func all(type: String, after: String? = nil, limit: Int = 100) throws -> [Entity] {
        try Validation.entityType(type)
        try store.checkLimit(limit)
        let limit = min(limit, Store.pageCountMax)
        var page: [Entity] = []
        guard limit > 0 else { return page }
        let prefix = EntityKey.prefix(type: type)
        let start = prefix + Array((after ?? "").utf8)
        try txn.forEach(store.entitiesDatabase(txn), from: start) { key, value in
            guard key.count >= prefix.count, key.starts(with: prefix) else { return false }
            // By bytes, as the keys are ordered: `String` equality would
            // also skip an id that is another spelling of the same text
            // (canonically equivalent Unicode), a different entity.
            if after != nil, key.elementsEqual(start) { return true }
            let id = EntityKey.id(from: key, prefixCount: prefix.count)
            if let entity = try entity(type: type, id: id, key: key, record: value) { page.append(entity) }
            return page.count < limit
        }
        return page
    }

    /// The entity the app sees in `record`, stored under `key`; nil when
    /// the record shows none (deleted, or only a tombstone).
    private func entity(type: String, id: String, key: UnsafeRawBufferPointer, record: UnsafeRawBufferPointer) throws
        -> Entity?
    {
        let state = try Projector.decodeVisible(record, key: key, path: store.path)
        return state.visible.map {
            Entity(type: type, id: id, fields: $0, serverVersion: state.baseVersion, pendingIntentCount: state.pendingCount)
        }
    }

    /// The entity types that have entities the app sees, in byte order.
    /// - Throws: `LogStoreError.corruptEntry` naming the `counts` key that
    ///   is not UTF-8: read as text, its damage became another type.
    public func entityTypes() throws -> [String] {
        var types: [String] = []
        try txn.forEach(store.projector(txn).counts) { key, _ in
            guard let type = String(validating: key, as: UTF8.self) else {
                throw LogStoreError(.corruptEntry, path: store.path, "counts: a key of \(damagedKey(key)), not an entity type in UTF-8")
            }
            types.append(type)
            return true
        }
        return types
    }

    /// How many entities of `type` exist for the app.
    /// - Throws: `LogStoreError.invalidArgument` for a type as `get` does;
    ///   `.corruptEntry` when the stored count is damaged.
    public func count(type: String) throws -> Int {
        try Validation.entityType(type)
        return try store.projector(txn).visibleCount(type, txn)
    }
}

@available(*, unavailable)
extension StoreSnapshot: Sendable {}

extension Store {
    /// Runs `body` with the store as of the last commit, and returns what it
    /// returns. Every read through the snapshot sees that commit.
    ///
    /// Caveats: keep `body` short (it cannot `await`). The snapshot pins the
    /// pages it sees until `body` returns, so the file grows while writes go
    /// on, and a write that has to grow the map waits for it to end: never
    /// wait in `body` for a write to commit, nor close the store in it
    /// (closing waits for every read to end).
    /// - Throws: what `body` throws; `LMDBError` `.closed` once the store
    ///   is closed, or LMDB's error when it cannot begin the read.
    public func read<R>(_ body: (borrowing StoreSnapshot) throws -> R) throws -> R {
        try log.environment.read { txn in try body(StoreSnapshot(self, txn)) }
    }
}
