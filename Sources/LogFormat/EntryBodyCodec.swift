/// Body layouts, one per kind (`Format/storage.md`, "Entry bodies"). Strings
/// and byte strings are a u32 length and the bytes; enumerations are one byte.
extension EntryCodec {
    static func encodeBody(_ body: EntryBody, into writer: inout ByteWriter) {
        switch body {
        case .intent(let intent):
            writer.write(intent.operation.rawValue)
            writer.write(lengthPrefixed: intent.idempotencyKey)
            writer.write(lengthPrefixed: intent.entityType)
            writer.write(lengthPrefixed: intent.entityID)
            writer.write(bigEndian: intent.baseVersion)
            intent.fields.encode(into: &writer)
        case .ack(let ack):
            writer.write(bigEndian: ack.intentOffset)
            writer.write(ack.outcome.rawValue)
            writer.write(bigEndian: ack.serverVersion)
        case .reject(let reject):
            writer.write(bigEndian: reject.intentOffset)
            writer.write(lengthPrefixed: reject.code)
            writer.write(lengthPrefixed: reject.message)
        case .remote(let remote):
            writer.write(lengthPrefixed: remote.cursor)
            writer.write(remote.operation.rawValue)
            writer.write(lengthPrefixed: remote.entityType)
            writer.write(lengthPrefixed: remote.entityID)
            writer.write(bigEndian: remote.serverVersion)
            remote.fields.encode(into: &writer)
        case .conflict(let conflict):
            writer.write(bigEndian: conflict.intentOffset)
            writer.write(lengthPrefixed: conflict.entityType)
            writer.write(lengthPrefixed: conflict.entityID)
            writer.write(bigEndian: conflict.serverVersion)
            writer.write(conflict.serverDeleted ? 1 : 0)
            conflict.serverFields.encode(into: &writer)
            writer.write(conflict.resolution.rawValue)
            conflict.resolvedFields.encode(into: &writer)
        case .resync(let reason):
            writer.write(lengthPrefixed: reason)
        case .snapshot(let snapshot):
            writer.write(bigEndian: snapshot.watermark)
            writer.write(lengthPrefixed: snapshot.cursor)
            writer.write(lengthPrefixed: snapshot.entityType)
            writer.write(lengthPrefixed: snapshot.entityID)
            writer.write(bigEndian: snapshot.serverVersion)
            writer.write(snapshot.deleted ? 1 : 0)
            snapshot.fields.encode(into: &writer)
        }
    }

    /// The size of an entry with this body, header included, counted
    /// without encoding it: `encode` writes exactly this many bytes.
    public static func encodedSize(_ body: EntryBody) -> Int { headerBytes + bodySize(body) }

    /// The size of the body `encodeBody` writes, counted without writing it.
    static func bodySize(_ body: EntryBody) -> Int {
        func text(_ string: String) -> Int { 4 + string.utf8.count }
        return switch body {
        case .intent(let intent):
            1 + text(intent.idempotencyKey) + text(intent.entityType) + text(intent.entityID) + 8
                + intent.fields.encodedSize
        case .ack: 8 + 1 + 8
        case .reject(let reject): 8 + text(reject.code) + text(reject.message)
        case .remote(let remote):
            text(remote.cursor) + 1 + text(remote.entityType) + text(remote.entityID) + 8 + remote.fields.encodedSize
        case .conflict(let conflict):
            8 + text(conflict.entityType) + text(conflict.entityID) + 8 + 1 + conflict.serverFields.encodedSize + 1
                + conflict.resolvedFields.encodedSize
        case .resync(let reason): text(reason)
        case .snapshot(let snapshot):
            8 + text(snapshot.cursor) + text(snapshot.entityType) + text(snapshot.entityID) + 8 + 1
                + snapshot.fields.encodedSize
        }
    }

    static func decodeBody(kind: EntryKind, from reader: inout ByteReader) throws(FormatError) -> EntryBody {
        switch kind {
        case .intent:
            let operation = try readEnum(Intent.Operation.self, "intent operation", &reader)
            let key = try reader.readString("idempotency key")
            let (type, id) = try readEntity(&reader)
            return .intent(
                Intent(
                    operation, idempotencyKey: key, entityType: type, entityID: id,
                    baseVersion: try reader.read(UInt64.self, "base version"),
                    fields: try Fields.decode(from: &reader)))
        case .ack:
            let intentOffset = try reader.read(UInt64.self, "intent offset")
            let outcome = try readEnum(Ack.Outcome.self, "ack outcome", &reader)
            return .ack(
                Ack(
                    intentOffset: intentOffset, outcome: outcome,
                    serverVersion: try reader.read(UInt64.self, "server version")))
        case .reject:
            let intentOffset = try reader.read(UInt64.self, "intent offset")
            let code = try reader.readString("error code")
            return .reject(Reject(intentOffset: intentOffset, code: code, message: try reader.readString("message")))
        case .remote:
            let cursor = try reader.readString("cursor")
            let operation = try readEnum(Remote.Operation.self, "remote operation", &reader)
            let (type, id) = try readEntity(&reader)
            return .remote(
                Remote(
                    cursor: cursor, operation, entityType: type, entityID: id,
                    serverVersion: try reader.read(UInt64.self, "server version"),
                    fields: try Fields.decode(from: &reader)))
        case .conflict:
            return .conflict(try decodeConflict(&reader))
        case .resync:
            return .resync(reason: try reader.readString("reason"))
        case .snapshot:
            let watermark = try reader.read(UInt64.self, "watermark")
            let cursor = try reader.readString("cursor")
            let (type, id) = try readEntity(&reader)
            let serverVersion = try reader.read(UInt64.self, "server version")
            return .snapshot(
                Snapshot(
                    watermark: watermark, cursor: cursor, entityType: type, entityID: id, serverVersion: serverVersion,
                    deleted: try readFlag("deleted", &reader), fields: try Fields.decode(from: &reader)))
        }
    }

    private static func decodeConflict(_ reader: inout ByteReader) throws(FormatError) -> Conflict {
        let intentOffset = try reader.read(UInt64.self, "intent offset")
        let (type, id) = try readEntity(&reader)
        let serverVersion = try reader.read(UInt64.self, "server version")
        let deleted = try readFlag("server deleted", &reader)
        let serverFields = try Fields.decode(from: &reader)
        let resolution = try readEnum(Conflict.Resolution.self, "conflict resolution", &reader)
        return Conflict(
            intentOffset: intentOffset, entityType: type, entityID: id, serverVersion: serverVersion,
            serverDeleted: deleted, serverFields: serverFields, resolution: resolution,
            resolvedFields: try Fields.decode(from: &reader))
    }

    private static func readEntity(_ reader: inout ByteReader) throws(FormatError) -> (String, String) {
        let type = try reader.readString("entity type")
        return (type, try reader.readString("entity id"))
    }

    /// A byte that must be 0 (false) or 1 (true).
    private static func readFlag(_ what: StaticString, _ reader: inout ByteReader) throws(FormatError) -> Bool {
        let position = reader.position
        let byte = try reader.readByte(what)
        guard byte <= 1 else { throw reader.error(.invalidTag, "\(what) is \(byte), must be 0 or 1", at: position) }
        return byte == 1
    }

    private static func readEnum<E: RawRepresentable<UInt8>>(
        _: E.Type, _ what: StaticString, _ reader: inout ByteReader
    ) throws(FormatError) -> E {
        let position = reader.position
        let byte = try reader.readByte(what)
        guard let value = E(rawValue: byte) else {
            throw reader.error(.invalidTag, "\(what) \(byte) is not defined", at: position)
        }
        return value
    }
}
