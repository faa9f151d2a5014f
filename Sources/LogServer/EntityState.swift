import LogFormat

/// The server's state of one entity: its version (kept through deletes, so
/// a tombstone still has one), whether it is deleted, when it last changed,
/// its fields, the version that created its current life, and for each
/// field the version that last set it, which is what conflict detection
/// needs (`Format/sync-protocol.md`, section 7, "Versions").
struct EntityState: Equatable {
    static let layoutVersion: UInt8 = 1

    var version: UInt64 = 0
    var deleted = false
    var updatedAt: Int64 = 0
    var createdVersion: UInt64 = 0
    var fields: Fields = [:]
    /// Per field: the version of the operation that last set it. Keyed by
    /// `String`, whose == takes canonically equivalent spellings for one
    /// name: the rules keep two of them out of one entity, and
    /// `lastChanged` checks the scalars of the name it finds.
    var fieldVersions: [String: UInt64] = [:]

    var exists: Bool { version > 0 && !deleted }

    /// Deleted for an entity that never existed too (a create ahead of
    /// the server conflicts with it).
    var serverState: ServerState { ServerState(serverVersion: version, deleted: !exists, data: fields) }

    /// The version that last set `field`; a field the entity lacks counts as
    /// set when the entity was created. Names are compared by their scalars
    /// (`Format/sync-protocol.md`, section 1): another spelling's version
    /// would make an update of a name never set a conflict.
    func lastChanged(_ field: String) -> UInt64 {
        guard let index = fieldVersions.index(forKey: field), Fields.same(fieldVersions[index].key, field) else {
            return createdVersion
        }
        return fieldVersions[index].value
    }

    func encoded() -> [UInt8] {
        let versions = Fields(fieldVersions.map { ($0.key, Value.int(Int64(bitPattern: $0.value))) })
        var writer = ByteWriter(capacity: 2 + 3 * 8 + fields.encodedSize + versions.encodedSize)
        writer.write(EntityState.layoutVersion)
        writer.write(deleted ? 1 : 0)
        writer.write(bigEndian: version)
        writer.write(bigEndian: updatedAt)
        writer.write(bigEndian: createdVersion)
        fields.encode(into: &writer)
        versions.encode(into: &writer)
        return writer.bytes
    }

    init() {}

    init(decoding bytes: UnsafeRawBufferPointer) throws(FormatError) {
        var reader = ByteReader(bytes)
        let layout = try reader.readByte("state version")
        guard layout == EntityState.layoutVersion else {
            throw reader.error(.unsupportedVersion, "entity state version \(layout)", at: 0)
        }
        deleted = try reader.readByte("deleted") == 1
        version = try reader.read(UInt64.self, "version")
        updatedAt = try reader.read(Int64.self, "updated at")
        createdVersion = try reader.read(UInt64.self, "created version")
        fields = try Fields.decode(from: &reader)
        for (name, value) in try Fields.decode(from: &reader) {
            guard case .int(let version) = value else { throw reader.error(.invalidField, "field version of \(name) is not an int") }
            fieldVersions[name] = UInt64(bitPattern: version)
        }
        guard reader.remaining == 0 else { throw reader.error(.trailingBytes, "\(reader.remaining) bytes after the state") }
    }
}
