import LogFormat

/// The server's state of one entity (`Format/sync-protocol.md`, "Reference
/// server storage"): its version, whether it is deleted, when it last
/// changed, its fields, and for each field the version and the replica that
/// last changed it, which is what conflict detection needs.
struct EntityState: Equatable {
    static let layoutVersion: UInt8 = 1

    var version: UInt64 = 0
    var deleted = false
    var updatedAt: Int64 = 0
    var fields: Fields = [:]
    /// Per field: the version that last changed it.
    var fieldVersions: [String: UInt64] = [:]
    /// Per field: the replica (`client_id`) that last changed it ("" unknown).
    var fieldClients: [String: String] = [:]
    /// The replica behind the latest change ("" unknown).
    var lastClient = ""

    var exists: Bool { version > 0 && !deleted }

    var serverState: ServerState { ServerState(serverVersion: version, deleted: deleted, data: fields) }

    func encoded() -> [UInt8] {
        var writer = ByteWriter(capacity: 64)
        writer.write(EntityState.layoutVersion)
        writer.write(deleted ? 1 : 0)
        writer.write(bigEndian: version)
        writer.write(bigEndian: updatedAt)
        writer.write(lengthPrefixed: lastClient)
        fields.encode(into: &writer)
        // Field history as one Fields map: name -> [version, client].
        Fields(fieldVersions.map { name, version in
            (name, Value.array([.int(Int64(bitPattern: version)), .string(fieldClients[name] ?? "")]))
        }).encode(into: &writer)
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
        lastClient = try reader.readString("last client")
        fields = try Fields.decode(from: &reader)
        for (name, value) in try Fields.decode(from: &reader) {
            guard case .array(let pair) = value, pair.count == 2, case .int(let version) = pair[0],
                case .string(let client) = pair[1]
            else { throw reader.error(.invalidField, "field history of \(name) is malformed") }
            fieldVersions[name] = UInt64(bitPattern: version)
            fieldClients[name] = client
        }
        guard reader.remaining == 0 else { throw reader.error(.trailingBytes, "\(reader.remaining) bytes after the state") }
    }
}
