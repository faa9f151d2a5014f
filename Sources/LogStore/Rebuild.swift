import LMDB
import LogFormat

/// Where a replay writes: a set of derived databases (with the `meta` key
/// of its cursor) and the `meta` key of its watermark.
struct ReplayTarget {
    var projector: Projector
    var watermarkKey: [UInt8]
}

// MARK: - The set in use

extension Store {
    /// The set of derived databases that readers and writers use, as `txn`
    /// sees it: the `meta` key `projection-set`, 0 when absent.
    /// - Throws: `LogStoreError.corruptEntry` for a value that names no set.
    func activeSet(_ txn: borrowing Transaction) throws -> Int {
        // A lookup costs a `get` about a tenth of its time; the cached set
        // is right for every read of the snapshot it was read in.
        guard let snapshot = txn.snapshotID, snapshot < 1 << 63 else { return try storedActiveSet(txn) }
        let cached = activeSetCache.load(ordering: .relaxed)
        if cached != .max, cached >> 1 == snapshot { return Int(cached & 1) }
        let set = try storedActiveSet(txn)
        activeSetCache.store(snapshot << 1 | UInt64(set), ordering: .relaxed)
        return set
    }

    private func storedActiveSet(_ txn: borrowing Transaction) throws -> Int {
        try MetaKey.projectionSet.withUnsafeBytes { key in
            try txn.withValue(log.metaDatabase, key: key) { raw -> Int in
                guard raw.count == 1, Int(raw[0]) < Store.projectionSetCount else {
                    throw LogStoreError(
                        .corruptEntry, path: path, "projection-set (\(raw.count) bytes) names no set of derived databases")
                }
                return Int(raw[0])
            }
        } ?? 0
    }

    /// The derived databases in use, as `txn` sees them. Every read and
    /// write finds them here, in its own transaction: the last chunk of a
    /// rebuild switches them, and a transaction sees them before the switch
    /// or after it, never half way.
    /// - Throws: what `activeSet` throws; `LogStoreError.projectionsStale`
    ///   in a store opened read-only before that set was made.
    func projector(_ txn: borrowing Transaction) throws -> Projector {
        try projector(set: activeSet(txn))
    }

    private func projector(set: Int) throws -> Projector {
        guard let projector = projectors[set] else { throw staleProjections() }
        return projector
    }

    /// The `entities` database in use, as `txn` sees it: what a read of
    /// entities needs, without the copy of a whole `Projector` (a retain and
    /// a release of its path and cursor key on every `get`).
    /// - Throws: as `projector(_:)`.
    func entitiesDatabase(_ txn: borrowing Transaction) throws -> Database {
        guard let entities = projectors[try activeSet(txn)]?.entities else { throw staleProjections() }
        return entities
    }

    private func staleProjections() -> LogStoreError {
        LogStoreError(
            .projectionsStale, path: path, "the derived databases in use were made after this store was opened; open it again")
    }

    /// The set a rebuild fills: the one not in use.
    private func rebuildSet(_ txn: borrowing Transaction) throws -> Int {
        Store.projectionSetCount - 1 - (try activeSet(txn))
    }

    /// The set in use, with the watermark its rows reflect.
    private func liveTarget(_ txn: borrowing Transaction) throws -> ReplayTarget {
        ReplayTarget(projector: try projector(txn), watermarkKey: MetaKey.watermark)
    }
}

// MARK: - Rebuilding

extension Store {
    /// Rebuilds every derived database (projections, outbox, idempotency
    /// index, counts, cursor) from the log alone, a chunk of entries per
    /// transaction, into the set of derived databases not in use; the chunk
    /// that reaches the end of the log puts that set in use and empties the
    /// other. Until then reads and writes go on as before, on the tables in
    /// use: nobody sees a half-built table or loses the pull cursor.
    /// The outbox's attempt state, which the log does not hold, is carried
    /// over from the tables in use (when they have this version's layout;
    /// otherwise it starts over). A rebuild stopped part way (a close,
    /// a crash) is finished by the next writable open; one that fails is
    /// dropped, and the tables in use stay. So is one whose task is
    /// cancelled: it stops at the next chunk's end (a chunk, like every
    /// write, runs to its outcome once begun).
    /// - Throws: `CancellationError` when the task is cancelled before the
    ///   last chunk; `LogStoreError.closed` when the store closes part way;
    ///   `LogStoreError` `.corruptEntry` or `.gap` for a log that does not
    ///   read back; `LMDBError`.
    public func rebuildProjections() async throws {
        try await rebuildProjections(entriesPerTransaction: Store.replayChunkCountMax)
    }

    /// `rebuildProjections()` with another chunk size, so tests can put
    /// chunk boundaries anywhere, and `betweenChunks` run after each chunk
    /// that leaves entries to replay, so they can act at a boundary.
    package func rebuildProjections(
        entriesPerTransaction: Int, betweenChunks: () async throws -> Void = {}
    ) async throws {
        precondition(entriesPerTransaction > 0, "a replay chunk needs room for an entry")
        // Straight to the log's writer: `write` would project the entries
        // into the tables in use, which need nothing.
        let start = try await log.perform { txn, context in
            try self.startRebuild(txn)
            return context.position.lastOffset
        }
        do {
            // Each chunk replays entries or ends the rebuild: up to `start`,
            // start / entriesPerTransaction of them; past it, each one that
            // is not the last leaves half a chunk fewer entries to replay
            // (`rebuildChunk`). A compaction meanwhile starts them over.
            var left = UInt64.max
            while let leftBefore = try await log.perform({ [left] txn, context in
                try self.rebuildChunk(
                    txn, countMax: entriesPerTransaction, wholePast: start, lastOffset: context.position.lastOffset,
                    leftBeforePrevious: left, &context.effects)
            }) {
                left = leftBefore
                try await betweenChunks()
                try Task.checkCancellation()
            }
        } catch let error as LogStoreError where error.code == .closed {
            throw error
        } catch {
            // Left under way, it would be resumed by the next open (and a
            // failed one would fail it); the tables in use are whole. Best
            // effort: the error may be the store's failure too.
            try? await log.perform { txn, _ in try self.dropRebuild(txn) }
            throw error
        }
    }

    /// The names of the derived databases in use (those of set 0 or set 1).
    package func derivedDatabaseNamesInUse() throws -> [String] {
        try log.environment.read { txn in Store.derivedDatabaseNames(set: try activeSet(txn)) }
    }

    /// How far a rebuild under way has got (the last offset it replayed),
    /// or nil when none is.
    package func rebuildWatermark() throws -> UInt64? {
        try log.environment.read { txn in try rebuildState(txn).map { $0.watermark ?? 0 } }
    }

    /// Opening: resume a rebuild under way, or start one when the derived
    /// databases in use have another version; otherwise apply what the log
    /// has past their watermark. Nothing reads the store yet.
    func bringProjectionsUpToDate() throws {
        let (version, watermark, rebuild) = try log.environment.read { txn in
            let (version, watermark) = try projectionState(txn)
            return (version, watermark, try rebuildState(txn))
        }
        let last = try log.lastOffset()
        guard version == Store.projectionVersion, rebuild == nil else {
            // A rebuild resumes only where it can: of this version, over
            // tables in use of this version (a build of another version may
            // have written to its set since), and not past the log's end (a
            // copy cut short, `logtool replay --to`). Otherwise it starts
            // again: its set is scratch.
            let resumable =
                version == Store.projectionVersion && rebuild?.version == Store.projectionVersion
                && rebuild?.watermark.map { $0 <= last } == true
            if !resumable, last == 0 {
                // A new store: no entry to replay, so set 0 is made current
                // where it is.
                return try log.performBlocking { txn, _ in try self.resetEmpty(txn) }
            }
            if !resumable { try log.performBlocking { txn, _ in try self.startRebuild(txn) } }
            // Each chunk makes progress, so this runs at most last / chunk + 1 times.
            while try log.performBlocking({ txn, context in
                try self.rebuildChunk(
                    txn, countMax: Store.replayChunkCountMax, wholePast: .max, lastOffset: context.position.lastOffset,
                    leftBeforePrevious: .max, &context.effects)
            }) != nil {}
            return
        }
        if watermark == last { return }
        guard watermark < last else {
            // Entries appended from here would never be projected.
            throw LogStoreError(
                .corruptEntry, path: path,
                "the projection watermark \(watermark) is past the log's last offset \(last); rebuild the projections")
        }
        while try log.performBlocking({ txn, _ in
            var effects = CommitEffects()
            return try self.replayChunk(txn, into: self.liveTarget(txn), &effects, live: false)
        }) {}
    }

    package func projectionState() throws -> (version: UInt32?, watermark: UInt64) {
        try log.environment.read { txn in try projectionState(txn) }
    }

    func projectionState(_ txn: borrowing Transaction) throws -> (version: UInt32?, watermark: UInt64) {
        let version = try txn.get(log.metaDatabase, key: MetaKey.projectionVersion).flatMap { UInt32(bigEndianBytes: $0) }
        return (version, try watermark(txn))
    }

    /// The version and watermark of a rebuild under way (each nil when its
    /// value does not decode), or nil when none is.
    private func rebuildState(_ txn: borrowing Transaction) throws -> (version: UInt32?, watermark: UInt64?)? {
        guard let version = try txn.get(log.metaDatabase, key: MetaKey.rebuildVersion) else { return nil }
        return (UInt32(bigEndianBytes: version), try log.metaNumber(MetaKey.rebuildWatermark, txn))
    }

    /// Empties the set not in use and records a rebuild into it, from the
    /// first entry.
    private func startRebuild(_ txn: borrowing Transaction) throws {
        let target = try projector(set: rebuildSet(txn))
        for database in target.databases { try txn.removeAll(database) }
        let meta = log.metaDatabase
        try txn.delete(meta, key: MetaKey.rebuildCursor)
        try txn.put(meta, key: MetaKey.rebuildVersion, value: Store.projectionVersion.bigEndianBytes)
        try txn.put(meta, key: MetaKey.rebuildWatermark, value: UInt64(0).bigEndianBytes)
    }

    /// Empty derived databases of this version in set 0, for an empty log.
    private func resetEmpty(_ txn: borrowing Transaction) throws {
        for projector in projectors {
            for database in projector?.databases ?? [] { try txn.removeAll(database) }
        }
        let meta = log.metaDatabase
        for key in [MetaKey.cursor, MetaKey.projectionSet] + MetaKey.rebuildKeys {
            try txn.delete(meta, key: key)
        }
        try txn.put(meta, key: MetaKey.projectionVersion, value: Store.projectionVersion.bigEndianBytes)
        try markWatermark(0, txn)
    }

    /// Ends a rebuild under way without putting its set in use, and empties
    /// that set; nothing when none is.
    private func dropRebuild(_ txn: borrowing Transaction) throws {
        let meta = log.metaDatabase
        guard try txn.contains(meta, key: MetaKey.rebuildVersion) else { return }
        let target = try projector(set: rebuildSet(txn))
        for database in target.databases { try txn.removeAll(database) }
        for key in MetaKey.rebuildKeys { try txn.delete(meta, key: key) }
    }

    /// Starts a rebuild under way from the first entry again, in `txn`
    /// (which rewrote entries it may have replayed); nothing when none is.
    func restartRebuild(_ txn: borrowing Transaction) throws {
        guard try txn.contains(log.metaDatabase, key: MetaKey.rebuildVersion) else { return }
        try startRebuild(txn)
    }

    /// Replays up to `countMax` entries into the set a rebuild fills, or
    /// every entry left when writes keep up with the rebuild; the chunk
    /// that reaches the end of the log puts that set in use.
    ///
    /// `wholePast` is the last offset when the rebuild started: what comes
    /// after it was written while the rebuild ran. Past it, chunks of
    /// `countMax` would never catch up with writes as fast as the replay,
    /// so a chunk that finds fewer than half a chunk's entries gone since
    /// the one before it (`leftBeforePrevious` entries were left then)
    /// takes every entry left. Otherwise chunks stay bounded, also when
    /// much was written while the rebuild ran (a bulk import) and nothing
    /// since.
    /// - Parameters:
    ///   - lastOffset: the log's last offset, in `txn`.
    ///   - effects: the commit's, where the chunk that ends the rebuild
    ///     names the types it may have changed for the app.
    /// - Returns: how many entries were left before this chunk, when some
    ///   remain after it; nil when the rebuild ended, or none is under way
    ///   (a concurrent call finished or dropped it).
    private func rebuildChunk(
        _ txn: borrowing Transaction, countMax: Int, wholePast: UInt64, lastOffset: UInt64, leftBeforePrevious: UInt64,
        _ effects: inout CommitEffects
    ) throws -> UInt64? {
        guard try txn.contains(log.metaDatabase, key: MetaKey.rebuildVersion) else { return nil }
        let set = try rebuildSet(txn)
        var projector = try projector(set: set)
        projector.cursorKey = MetaKey.rebuildCursor
        let target = ReplayTarget(projector: projector, watermarkKey: MetaKey.rebuildWatermark)
        let watermark = try watermark(txn, key: target.watermarkKey)
        // A watermark past the log's end (a copy cut short) is caught on open.
        let left = lastOffset - min(watermark, lastOffset)
        let gone = leftBeforePrevious >= left ? leftBeforePrevious - left : 0
        let whole = watermark >= wholePast && gone < (UInt64(countMax) + 1) / 2
        // Not live: the entries' events were delivered when they were written.
        var replayed = CommitEffects()
        let more = try replayChunk(txn, into: target, &replayed, live: false, countMax: whole ? .max : countMax)
        if !more { try finishRebuild(txn, set: set, &effects) }
        return more ? left : nil
    }

    /// Puts the set a rebuild filled in use, with its cursor, version and
    /// watermark, and empties the other set, all in `txn`: a reader sees
    /// the old tables or the new ones. Every type with entities visible in
    /// either set goes into `effects`: what the app sees of it may have
    /// changed (the rebuild repaired the tables, or a new version projects
    /// differently); the other types had none visible, and have none.
    private func finishRebuild(_ txn: borrowing Transaction, set: Int, _ effects: inout CommitEffects) throws {
        let meta = log.metaDatabase
        guard let version = try txn.get(meta, key: MetaKey.rebuildVersion),
            let watermark = try txn.get(meta, key: MetaKey.rebuildWatermark)
        else { preconditionFailure("a rebuild ends without its version and watermark") }
        if let cursor = try txn.get(meta, key: MetaKey.rebuildCursor) {
            try txn.put(meta, key: MetaKey.cursor, value: cursor)
        } else {
            try txn.delete(meta, key: MetaKey.cursor)
        }
        let old = try projector(txn)
        for counts in [old.counts, try projector(set: set).counts] {
            try txn.forEach(counts) { type, _ in
                effects.touchedTypes.insert(String(decoding: type, as: UTF8.self))
                return true
            }
        }
        if try txn.get(meta, key: MetaKey.projectionVersion) == version {
            try carryOutboxState(from: old, to: projector(set: set), txn)
        }
        try txn.put(meta, key: MetaKey.projectionVersion, value: version)
        try txn.put(meta, key: MetaKey.watermark, value: watermark)
        try txn.put(meta, key: MetaKey.projectionSet, value: [UInt8(set)])
        for key in MetaKey.rebuildKeys { try txn.delete(meta, key: key) }
        for database in old.databases { try txn.removeAll(database) }
    }
}

extension Store {
    /// Gives the intents pending in both sets the attempt state (attempts,
    /// retry time, `failed`, last error) they have in the set in use: the
    /// one derived state the log does not hold, so a replay starts it over.
    /// Only for sets of the same version (the same outbox layout); most
    /// rows are in their first state, and are left as the replay made them.
    /// So is a row that does not decode: a rebuild is the repair for
    /// damaged derived tables, and carried over, the damage would leave
    /// the outbox unreadable (every push failing) after it too.
    private func carryOutboxState(from old: Projector, to new: Projector, _ txn: borrowing Transaction) throws {
        // A cursor on one database is not moved by writes to another; the
        // row is copied out first, as a put may spill the page it is on.
        try txn.forEach(old.outbox) { key, value in
            guard !value.elementsEqual(Projector.newOutboxState), (try? OutboxState(decoding: value)) != nil else { return true }
            let (key, value) = ([UInt8](key), [UInt8](value))
            if try txn.contains(new.outbox, key: key) { try txn.put(new.outbox, key: key, value: value) }
            return true
        }
    }
}

// MARK: - Replaying into a set

extension Store {
    /// Projects what the log has past the watermark of the tables in use,
    /// up to `last` (normally nothing: only entries appended without the
    /// store are missing).
    func catchUp(through last: UInt64, _ txn: borrowing Transaction, _ effects: inout CommitEffects) throws {
        // Bounded: each chunk applies entries or reports none remain.
        while try watermark(txn) < last, try replayChunk(txn, into: liveTarget(txn), &effects, live: true) {}
    }

    /// The stored watermark under `key` (the tables in use by default); 0
    /// when there is none. A value that is not 8 bytes is damage, an error:
    /// read as 0 it would apply the whole log again over the tables. (One
    /// past the log's end is caught on open.)
    func watermark(_ txn: borrowing Transaction, key: [UInt8] = MetaKey.watermark) throws -> UInt64 {
        try key.withUnsafeBytes { rawKey in
            try txn.withValue(log.metaDatabase, key: rawKey) { raw -> UInt64 in
                guard let watermark = UInt64(bigEndianBytes: raw) else {
                    let name = key == MetaKey.watermark ? "projection watermark" : "rebuild watermark"
                    throw LogStoreError(
                        .corruptEntry, path: path, "the \(name) (\(raw.count) bytes) is not an offset; rebuild the projections")
                }
                return watermark
            }
        } ?? 0
    }

    /// Applies up to `countMax` entries after the target's watermark to its
    /// tables, and moves its watermark past them.
    /// - Returns: whether entries remain.
    private func replayChunk(
        _ txn: borrowing Transaction, into target: ReplayTarget, _ effects: inout CommitEffects, live: Bool,
        countMax: Int = Store.replayChunkCountMax
    ) throws -> Bool {
        let watermark = try watermark(txn, key: target.watermarkKey)
        // The last offset there is is projected: no entry can follow it.
        guard watermark < .max else { return false }
        var expected = watermark + 1
        var projected = watermark
        var more = false
        var projector = target.projector
        // Room for a usual chunk; a whole last chunk of a rebuild grows it.
        let cache = try ProjectionCache(entryCount: min(countMax, Store.replayChunkCountMax), projector, txn)
        projector.cache = cache
        let path = self.path
        let compactedBelow = try log.compactedBelow(txn)
        var applied = 0
        try txn.forEach(log.logDatabase, from: OffsetKey.seekKey(after: watermark)) { key, value in
            guard applied < countMax else {
                more = true
                return false
            }
            let entry = try EventLog.decode(
                key: key, value: value, following: &expected, compactedBelow: compactedBelow, path: path)
            try projector.apply(entry, txn, &effects, live: live)
            projected = entry.offset
            applied += 1
            return true
        }
        try cache.flush(projector, txn)
        try txn.put(log.metaDatabase, key: target.watermarkKey, value: projected.bigEndianBytes)
        return more
    }
}
