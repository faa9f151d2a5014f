import Foundation
import LogFormat

/// An entry as one JSON object: offset, timestamp, kind, and the body's
/// fields in snake_case (the same names as Format/vectors/entries.json).
struct EntryJSON: Encodable {
    let entry: Entry

    enum Key: String, CodingKey {
        case offset, timestamp, time, kind, operation, cursor, code, message, reason, watermark, deleted, fields, outcome
        case resolution
        case idempotencyKey = "idempotency_key", entityType = "entity_type", entityID = "entity_id"
        case baseVersion = "base_version", intentOffset = "intent_offset", serverVersion = "server_version"
        case serverDeleted = "server_deleted", serverFields = "server_fields", resolvedFields = "resolved_fields"
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Key.self)
        try c.encode(entry.offset, forKey: .offset)
        try c.encode(entry.timestamp.rawValue, forKey: .timestamp)
        try c.encode(Value.iso8601(microseconds: Int64(entry.timestamp.milliseconds) * 1000), forKey: .time)
        try c.encode(entry.kind.description, forKey: .kind)
        switch entry.body {
        case .intent(let intent):
            try c.encode("\(intent.operation)", forKey: .operation)
            try c.encode(intent.idempotencyKey, forKey: .idempotencyKey)
            try c.encode(intent.entityType, forKey: .entityType)
            try c.encode(intent.entityID, forKey: .entityID)
            try c.encode(intent.baseVersion, forKey: .baseVersion)
            try c.encode(intent.fields, forKey: .fields)
        case .ack(let ack):
            try c.encode(ack.intentOffset, forKey: .intentOffset)
            try c.encode("\(ack.outcome)", forKey: .outcome)
            try c.encode(ack.serverVersion, forKey: .serverVersion)
        case .reject(let reject):
            try c.encode(reject.intentOffset, forKey: .intentOffset)
            try c.encode(reject.code, forKey: .code)
            try c.encode(reject.message, forKey: .message)
        case .remote(let remote):
            try c.encode(remote.cursor, forKey: .cursor)
            try c.encode("\(remote.operation)", forKey: .operation)
            try c.encode(remote.entityType, forKey: .entityType)
            try c.encode(remote.entityID, forKey: .entityID)
            try c.encode(remote.serverVersion, forKey: .serverVersion)
            try c.encode(remote.fields, forKey: .fields)
        case .conflict(let conflict):
            try c.encode(conflict.intentOffset, forKey: .intentOffset)
            try c.encode(conflict.entityType, forKey: .entityType)
            try c.encode(conflict.entityID, forKey: .entityID)
            try c.encode(conflict.serverVersion, forKey: .serverVersion)
            try c.encode(conflict.serverDeleted, forKey: .serverDeleted)
            try c.encode(conflict.serverFields, forKey: .serverFields)
            try c.encode(conflict.resolution.name, forKey: .resolution)
            try c.encode(conflict.resolvedFields, forKey: .resolvedFields)
        case .resync(let reason):
            try c.encode(reason, forKey: .reason)
        case .snapshot(let snapshot):
            try c.encode(snapshot.watermark, forKey: .watermark)
            try c.encode(snapshot.cursor, forKey: .cursor)
            try c.encode(snapshot.entityType, forKey: .entityType)
            try c.encode(snapshot.entityID, forKey: .entityID)
            try c.encode(snapshot.serverVersion, forKey: .serverVersion)
            try c.encode(snapshot.deleted, forKey: .deleted)
            try c.encode(snapshot.fields, forKey: .fields)
        }
    }
}

extension Conflict.Resolution {
    /// The resolution `name` names: the format's name, or the Swift case
    /// name (`keepLocal`), which exports made before named it by.
    init?(exportedName name: String) {
        guard let found = Self.allCases.first(where: { $0.name == name || "\($0)" == name }) else { return nil }
        self = found
    }
}

extension Entry {
    /// The entity an entry is about, if any.
    var entity: (type: String, id: String)? {
        switch body {
        case .intent(let intent): (intent.entityType, intent.entityID)
        case .remote(let remote): (remote.entityType, remote.entityID)
        case .conflict(let conflict): (conflict.entityType, conflict.entityID)
        case .snapshot(let snapshot): snapshot.entityType.isEmpty ? nil : (snapshot.entityType, snapshot.entityID)
        case .ack, .reject, .resync: nil
        }
    }
}
