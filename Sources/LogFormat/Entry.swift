/// The kinds of log entry. The raw value is the kind byte of the header.
public enum EntryKind: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    /// A local create, update or delete the app asked for.
    case intent = 1
    /// The server accepted an intent (applied now, or already applied earlier).
    case ack = 2
    /// The server refused an intent for good.
    case reject = 3
    /// A change pulled from the server and applied locally.
    case remote = 4
    /// An intent met a newer server state; what was decided about it.
    case conflict = 5
    /// The base state was reset and is pulled again from the start.
    case resync = 6
    /// One entity's confirmed state, written by compaction in place of the
    /// entries it folds.
    case snapshot = 7

    public var description: String {
        switch self {
        case .intent: "intent"
        case .ack: "ack"
        case .reject: "reject"
        case .remote: "remote"
        case .conflict: "conflict"
        case .resync: "resync"
        case .snapshot: "snapshot"
        }
    }

    public init?(name: String) {
        guard let kind = EntryKind.allCases.first(where: { $0.description == name }) else { return nil }
        self = kind
    }
}

/// A local intent: the app asked to create, update or delete an entity.
public struct Intent: Hashable, Sendable {
    public enum Operation: UInt8, Sendable, CaseIterable {
        case create = 1, update = 2, delete = 3
    }

    public var operation: Operation
    /// Unique per intent; the server answers a repeat with `duplicate`.
    public var idempotencyKey: String
    public var entityType: String
    public var entityID: String
    /// The server version the change was made against; 0 when the entity has
    /// never been confirmed by the server.
    public var baseVersion: UInt64
    /// For a create, every field; for an update, only the changed ones; for a
    /// delete, none.
    public var fields: Fields

    public init(
        _ operation: Operation, idempotencyKey: String, entityType: String, entityID: String,
        baseVersion: UInt64 = 0, fields: Fields = [:]
    ) {
        self.operation = operation
        self.idempotencyKey = idempotencyKey
        self.entityType = entityType
        self.entityID = entityID
        self.baseVersion = baseVersion
        self.fields = fields
    }
}

/// The server accepted the intent at `intentOffset`.
public struct Ack: Hashable, Sendable {
    public enum Outcome: UInt8, Sendable, CaseIterable {
        /// Applied by this push.
        case applied = 1
        /// The idempotency key was seen before; the earlier result stands.
        case duplicate = 2
    }

    public var intentOffset: UInt64
    public var outcome: Outcome
    /// The entity's server version after the intent.
    public var serverVersion: UInt64

    public init(intentOffset: UInt64, outcome: Outcome, serverVersion: UInt64) {
        self.intentOffset = intentOffset
        self.outcome = outcome
        self.serverVersion = serverVersion
    }
}

/// The server refused the intent at `intentOffset` with a permanent error.
public struct Reject: Hashable, Sendable {
    public var intentOffset: UInt64
    /// The protocol's error code, such as `VALIDATION_ERROR`.
    public var code: String
    public var message: String

    public init(intentOffset: UInt64, code: String, message: String) {
        self.intentOffset = intentOffset
        self.code = code
        self.message = message
    }
}

/// A change pulled from the server: the entity's full server state after it.
public struct Remote: Hashable, Sendable {
    public enum Operation: UInt8, Sendable, CaseIterable {
        case upsert = 1, delete = 2
    }

    /// The opaque pull cursor of the page this change came in.
    public var cursor: String
    public var operation: Operation
    public var entityType: String
    public var entityID: String
    public var serverVersion: UInt64
    /// The entity's fields after the change (empty for a delete).
    public var fields: Fields

    public init(
        cursor: String, _ operation: Operation, entityType: String, entityID: String,
        serverVersion: UInt64, fields: Fields = [:]
    ) {
        self.cursor = cursor
        self.operation = operation
        self.entityType = entityType
        self.entityID = entityID
        self.serverVersion = serverVersion
        self.fields = fields
    }
}

/// An intent met a newer server state; the entry records the server's side
/// and what was decided, so no conflict is ever resolved without a trace.
public struct Conflict: Hashable, Sendable {
    public enum Resolution: UInt8, Sendable, CaseIterable {
        /// Waiting for the app to decide.
        case pending = 0
        case keepLocal = 1
        case keepRemote = 2
        case merged = 3
        case custom = 4

        /// The resolution's name as the format spells it (`storage.md`
        /// section 7, and the decoded form of `Format/vectors`):
        /// "keep_local", not the case name `keepLocal`.
        public var name: String {
            switch self {
            case .pending: "pending"
            case .keepLocal: "keep_local"
            case .keepRemote: "keep_remote"
            case .merged: "merged"
            case .custom: "custom"
            }
        }
    }

    public var intentOffset: UInt64
    public var entityType: String
    public var entityID: String
    public var serverVersion: UInt64
    public var serverDeleted: Bool
    public var serverFields: Fields
    public var resolution: Resolution
    /// The fields the resolution settled on, for people reading the log:
    /// no projection rule reads them. While pending, what the app saw when
    /// the server had deleted the entity (the state a later `keepLocal`
    /// recreates, which the Swift store reads back), empty otherwise. Empty
    /// when they do not fit in the entry beside `serverFields` (an entity
    /// near the size limit has no room for two copies); the resolution
    /// intent written after the entry then says what changed
    /// (`Format/storage.md`, section 7).
    public var resolvedFields: Fields

    public init(
        intentOffset: UInt64, entityType: String, entityID: String, serverVersion: UInt64,
        serverDeleted: Bool = false, serverFields: Fields, resolution: Resolution, resolvedFields: Fields = [:]
    ) {
        self.intentOffset = intentOffset
        self.entityType = entityType
        self.entityID = entityID
        self.serverVersion = serverVersion
        self.serverDeleted = serverDeleted
        self.serverFields = serverFields
        self.resolution = resolution
        self.resolvedFields = resolvedFields
    }
}

/// The confirmed state of one entity as of compaction: it stands in for the
/// acked intents and remote changes below `watermark` that it folds. A
/// deleted entity keeps a snapshot (a tombstone) so that its version still
/// stops older server changes. A snapshot with an empty entity type carries
/// only the pull cursor.
public struct Snapshot: Hashable, Sendable {
    /// Every entry below this offset that touched the entity is folded here.
    public var watermark: UInt64
    /// The pull cursor in force at the watermark.
    public var cursor: String
    public var entityType: String
    public var entityID: String
    public var serverVersion: UInt64
    /// The server deleted the entity; `fields` is empty.
    public var deleted: Bool
    public var fields: Fields

    public init(
        watermark: UInt64, cursor: String, entityType: String, entityID: String, serverVersion: UInt64,
        deleted: Bool = false, fields: Fields
    ) {
        self.watermark = watermark
        self.cursor = cursor
        self.entityType = entityType
        self.entityID = entityID
        self.serverVersion = serverVersion
        self.deleted = deleted
        self.fields = fields
    }
}

/// What an entry says: one case per kind.
public enum EntryBody: Hashable, Sendable {
    case intent(Intent)
    case ack(Ack)
    case reject(Reject)
    case remote(Remote)
    case conflict(Conflict)
    /// Base state was reset; the reason is for people reading the log.
    case resync(reason: String)
    case snapshot(Snapshot)

    public var kind: EntryKind {
        switch self {
        case .intent: .intent
        case .ack: .ack
        case .reject: .reject
        case .remote: .remote
        case .conflict: .conflict
        case .resync: .resync
        case .snapshot: .snapshot
        }
    }
}

/// A decoded log entry: where it is, when it was written, and what it says.
public struct Entry: Hashable, Sendable {
    /// The entry's position in the log: dense, from 1.
    public var offset: UInt64
    /// When the entry was appended (see `HybridTimestamp`).
    public var timestamp: HybridTimestamp
    public var body: EntryBody

    public init(offset: UInt64, timestamp: HybridTimestamp, body: EntryBody) {
        self.offset = offset
        self.timestamp = timestamp
        self.body = body
    }

    public var kind: EntryKind { body.kind }
}
