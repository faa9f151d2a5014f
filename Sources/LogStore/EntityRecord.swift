import LogFormat

/// One entity's row in the `entities` database (`Format/storage.md`,
/// section 15, "Derived databases (projections)"): the state the server confirmed (base), the state the app
/// sees (visible = base with the pending intents applied in log order), and
/// the offsets of those pending intents.
///
/// A record whose base was deleted keeps its base version as a tombstone, so
/// an older pulled change cannot bring the entity back.
struct EntityRecord: Equatable {
    static let layoutVersion: UInt8 = 1

    /// The server version of `base`; 0 when the server never confirmed it.
    var baseVersion: UInt64 = 0
    /// nil when the server has no such entity (never had, or deleted it).
    var base: Fields?
    /// The greatest server version the server answered for an intent on this
    /// entity (0: none). The base version a push sends is at least this
    /// (`Format/sync-protocol.md` section 7, "The base_version a client
    /// sends"); unlike `baseVersion`, pulled changes never raise it.
    var ackedVersion: UInt64 = 0
    /// nil when the entity does not exist for the app.
    var visible: Fields?
    /// Offsets of un-acknowledged intents on this entity, ascending.
    var pending: [UInt64] = []

    /// Nothing worth keeping: no state, no pending intent, no tombstone.
    var isEmpty: Bool { baseVersion == 0 && base == nil && visible == nil && pending.isEmpty }

    /// Flag bits of the record's second byte.
    enum Flag {
        static let base: UInt8 = 0x01
        static let visible: UInt8 = 0x02
        /// Visible equals base and is stored once (the common case: nothing pending).
        static let shared: UInt8 = 0x04
        /// An acked version follows the base version.
        static let acked: UInt8 = 0x08
    }

    /// Layout (`Format/storage.md`, section 15): version, flags, base
    /// version, the acked version (when not 0), the pending offsets, then the visible fields and the base
    /// fields (one copy when they are equal), so a read of the visible state
    /// decodes one set of fields and stops.
    func encoded() -> [UInt8] { withEncoded { [UInt8]($0) } }

    /// Calls `body` with the encoded record, valid only inside it: a write
    /// puts it straight into LMDB, with no array in between.
    func withEncoded<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        let shared = base != nil && base == visible
        let fieldsSize = (visible?.encodedSize ?? 0) + (shared ? 0 : base?.encodedSize ?? 0)
        var writer = ByteWriter(capacity: 2 + 8 + (ackedVersion != 0 ? 8 : 0) + 4 + 8 * pending.count + fieldsSize)
        writer.write(EntityRecord.layoutVersion)
        writer.write(
            (base != nil ? Flag.base : 0) | (visible != nil ? Flag.visible : 0) | (shared ? Flag.shared : 0)
                | (ackedVersion != 0 ? Flag.acked : 0))
        writer.write(bigEndian: baseVersion)
        if ackedVersion != 0 { writer.write(bigEndian: ackedVersion) }
        writer.write(bigEndian: UInt32(pending.count))
        for offset in pending { writer.write(bigEndian: offset) }
        visible?.encode(into: &writer)
        if !shared { base?.encode(into: &writer) }
        return try writer.withUnsafeBytes(body)
    }

    init() {}

    init(decoding bytes: UnsafeRawBufferPointer) throws(FormatError) {
        var reader = ByteReader(bytes)
        let head = try EntityRecord.readHead(&reader)
        baseVersion = head.baseVersion
        ackedVersion = head.ackedVersion
        pending = []
        pending.reserveCapacity(head.pendingCount)
        for _ in 0..<head.pendingCount {
            let position = reader.position
            let offset = try reader.read(UInt64.self, "pending offset")
            // Ascending, as the intents were written: the fold applies them
            // in this order, so any other is damage, not a different state.
            guard offset > (pending.last ?? 0) else {
                throw reader.error(
                    .invalidField, "pending offset \(offset) after \(pending.last.map(String.init) ?? "none"): not ascending",
                    at: position)
            }
            pending.append(offset)
        }
        if head.flags & Flag.visible != 0 { visible = try Fields.decode(from: &reader) }
        if head.flags & Flag.shared != 0 {
            base = visible
        } else if head.flags & Flag.base != 0 {
            base = try Fields.decode(from: &reader)
        }
        guard reader.remaining == 0 else { throw reader.error(.trailingBytes, "\(reader.remaining) bytes after the record") }
    }

    /// What a read of the entity needs, without decoding the base: the
    /// visible fields (nil when absent), the base version and how many
    /// intents are pending.
    static func visibleState(decoding bytes: UnsafeRawBufferPointer) throws(FormatError)
        -> (visible: Fields?, baseVersion: UInt64, pendingCount: Int)
    {
        var reader = ByteReader(bytes)
        let head = try readHead(&reader)
        try reader.skip(head.pendingCount * 8, "pending offsets")
        let visible = head.flags & Flag.visible != 0 ? try Fields.decode(from: &reader) : nil
        return (visible, head.baseVersion, head.pendingCount)
    }

    /// The acked version alone, from the record's head (what a push batch
    /// needs of every entity it sends).
    static func ackedVersion(decoding bytes: UnsafeRawBufferPointer) throws(FormatError) -> UInt64 {
        var reader = ByteReader(bytes)
        return try readHead(&reader).ackedVersion
    }

    private static func readHead(_ reader: inout ByteReader) throws(FormatError)
        -> (flags: UInt8, baseVersion: UInt64, ackedVersion: UInt64, pendingCount: Int)
    {
        let version = try reader.readByte("record version")
        guard version == EntityRecord.layoutVersion else {
            throw reader.error(.unsupportedVersion, "entity record version \(version)", at: 0)
        }
        let flags = try reader.readByte("record flags")
        let known = Flag.base | Flag.visible | Flag.shared | Flag.acked
        let sharedNeedsBoth = flags & Flag.shared == 0 || flags & (Flag.base | Flag.visible) == Flag.base | Flag.visible
        guard flags & ~known == 0, sharedNeedsBoth else {
            throw reader.error(.invalidFlags, "record flags \(flags)", at: 1)
        }
        let baseVersion = try reader.read(UInt64.self, "base version")
        let ackedVersion = flags & Flag.acked != 0 ? try reader.read(UInt64.self, "acked version") : 0
        guard flags & Flag.acked == 0 || ackedVersion != 0 else {
            throw reader.error(.invalidFlags, "record flags \(flags) with an acked version of 0", at: 1)
        }
        let count = try reader.readCount("pending count", minimumElementBytes: 8)
        return (flags, baseVersion, ackedVersion, count)
    }
}

/// What the server confirmed about one entity, and the two rules that move
/// it forward. Projections and compaction both use these rules.
struct Confirmed: Equatable {
    /// 0 when the server never confirmed anything.
    var version: UInt64 = 0
    /// nil when the server has no such entity (never had, or deleted it).
    var fields: Fields?

    /// A server change (pulled, or in a snapshot) at `version`: the server's
    /// own state at that version, so it replaces the base unless the base is
    /// newer. It wins at an equal version too, over a base that an `ack`
    /// produced by applying the intent locally: when the server merged that
    /// intent over changes the client had not pulled yet, only the pulled
    /// state is right (`storage.md` section 15). An older version is stale.
    func applying(version: UInt64, state: Fields?) -> Confirmed {
        Confirmed.serverChangeApplies(version: version, over: self.version) ? Confirmed(version: version, fields: state) : self
    }

    /// Whether a server change at `version` replaces a base of `baseVersion`.
    static func serverChangeApplies(version: UInt64, over baseVersion: UInt64) -> Bool {
        version >= baseVersion && version > 0
    }

    /// The server acknowledged `intent` at `version`. A base already at or
    /// past that version includes the intent (it was pulled before the ack
    /// arrived), so it is applied only over older bases. An update over no
    /// base (after a resync forgot it) says nothing about the whole entity:
    /// the base stays unknown until the entity is pulled again, rather than
    /// turning into a tombstone that would make that pull look stale.
    func applying(ack intent: Intent, version: UInt64) -> Confirmed {
        guard Confirmed.ackApplies(version: version, intent.operation, over: self.version, basePresent: fields != nil)
        else { return self }
        return Confirmed(version: version, fields: Projector.applying(intent, to: fields))
    }

    /// Whether an ack at `version` of an intent doing `operation` applies it
    /// over a base of `baseVersion`, present or absent.
    static func ackApplies(version: UInt64, _ operation: Intent.Operation, over baseVersion: UInt64, basePresent: Bool) -> Bool {
        version > baseVersion && (operation != .update || basePresent)
    }
}

extension EntityRecord {
    /// Whether the app saw the entity before a change, and sees it after.
    typealias Visibility = (was: Bool, is: Bool)

    /// Runs `body`, which changes the record and returns whether it did.
    /// - Returns: the visibility before and after, nil when unchanged.
    mutating func change(_ body: (inout EntityRecord) throws -> Bool) rethrows -> Visibility? {
        let wasVisible = visible != nil
        return try body(&self) ? (wasVisible, visible != nil) : nil
    }

    var confirmed: Confirmed {
        get { Confirmed(version: baseVersion, fields: base) }
        set {
            baseVersion = newValue.version
            base = newValue.fields
        }
    }
}

/// Keys of the `entities` database: the type's UTF-8, a zero byte, the id's
/// UTF-8. Types never contain a zero byte, so each type is one key range.
enum EntityKey {
    static func encode(type: String, id: String) -> [UInt8] {
        let count = type.utf8.count + 1 + id.utf8.count
        return [UInt8](unsafeUninitializedCapacity: count) { key, initialized in
            fill(key, type: type, id: id)
            initialized = count
        }
    }

    /// Calls `body` with the key in a stack buffer (no allocation: the read
    /// path builds one key per `get`).
    static func withKey<R>(type: String, id: String, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try withUnsafeTemporaryAllocation(of: UInt8.self, capacity: type.utf8.count + 1 + id.utf8.count) { key in
            fill(key, type: type, id: id)
            return try body(UnsafeRawBufferPointer(key))
        }
    }

    /// The key as a dictionary key, built without an array.
    static func byteKey(type: String, id: String) -> ByteKey {
        withKey(type: type, id: id) { ByteKey($0) }
    }

    /// Writes the key into `key`, which has exactly its length.
    private static func fill(_ key: UnsafeMutableBufferPointer<UInt8>, type: String, id: String) {
        let typeCount = type.utf8.count
        copyUTF8(of: type, to: key, at: 0)
        key.initializeElement(at: typeCount, to: 0)
        copyUTF8(of: id, to: key, at: typeCount + 1)
    }

    /// Copies the string's UTF-8 into `buffer` from `start`: one copy from
    /// its storage (iterating the view retained and released the storage:
    /// about 7% of a `get` in perf).
    private static func copyUTF8(of string: String, to buffer: UnsafeMutableBufferPointer<UInt8>, at start: Int) {
        let destination = UnsafeMutableBufferPointer(rebasing: buffer[start...])
        let copied: Void? = string.utf8.withContiguousStorageIfAvailable { utf8 in
            UnsafeMutableRawBufferPointer(destination).copyMemory(from: UnsafeRawBufferPointer(utf8))
        }
        if copied == nil { _ = destination.initialize(from: string.utf8) }
    }

    static func prefix(type: String) -> [UInt8] { Array(type.utf8) + [0] }

    /// The id part of a key that starts with `prefix`.
    static func id(from key: UnsafeRawBufferPointer, prefixCount: Int) -> String {
        String(decoding: UnsafeRawBufferPointer(rebasing: key[prefixCount...]), as: UTF8.self)
    }
}
