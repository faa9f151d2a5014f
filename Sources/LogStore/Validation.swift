import LogFormat

/// Checks on what the app passes in, so nothing enters the log that the
/// format, LMDB's key limit or JSON could not carry.
enum Validation {
    static func entityType(_ type: String) throws {
        if let problem = NameRules.entityTypeProblem(type) { throw invalid(problem) }
    }

    static func entityID(_ id: String) throws {
        if let problem = NameRules.entityIDProblem(id) { throw invalid(problem) }
    }

    static func fields(_ fields: Fields) throws {
        if let problem = NameRules.fieldsProblem(fields) { throw invalid(problem) }
    }

    /// An idempotency key: 1 to `Limits.idempotencyKeyBytesMax` bytes.
    static func idempotencyKey(_ key: String) throws {
        if let problem = NameRules.idempotencyKeyProblem(key) { throw invalid(problem) }
    }

    /// What every appended entry must satisfy, whoever appends it, so that
    /// the projections can always apply it: valid names and keys (they
    /// become LMDB keys), values JSON can carry, offsets and versions that
    /// can exist, and cursors a pull can send back.
    static func entry(_ body: EntryBody) throws {
        switch body {
        case .intent(let intent):
            try entityType(intent.entityType)
            try entityID(intent.entityID)
            try idempotencyKey(intent.idempotencyKey)
            try fields(intent.fields)
        case .ack(let ack):
            try offset(ack.intentOffset)
        case .reject(let reject):
            try offset(reject.intentOffset)
        case .remote(let remote):
            try entityType(remote.entityType)
            try entityID(remote.entityID)
            try fields(remote.fields)
            guard !remote.cursor.isEmpty, remote.serverVersion >= 1 else {
                throw invalid("a remote change needs a cursor and a server version of at least 1")
            }
            try cursor(remote.cursor, of: "a remote change")
        case .conflict(let conflict):
            try offset(conflict.intentOffset)
            try entityType(conflict.entityType)
            try entityID(conflict.entityID)
            try fields(conflict.serverFields)
            try fields(conflict.resolvedFields)
        case .snapshot(let snapshot):
            // An empty type is the cursor-only form (Format/storage.md, section 7).
            if !snapshot.entityType.isEmpty || !snapshot.entityID.isEmpty {
                try entityType(snapshot.entityType)
                try entityID(snapshot.entityID)
            }
            try fields(snapshot.fields)
            // An empty cursor is none (Format/storage.md, section 7).
            if !snapshot.cursor.isEmpty { try cursor(snapshot.cursor, of: "a snapshot") }
        case .resync:
            break
        }
    }

    /// A cursor the protocol allows (`Wire.cursorProblem`): the entry
    /// sets the pull cursor, and `Store.pullCursor` reads any other as damage.
    private static func cursor(_ cursor: String, of what: String) throws {
        if let problem = Wire.cursorProblem(cursor.utf8) { throw invalid("\(what)'s cursor \(problem)") }
    }

    private static func offset(_ offset: UInt64) throws {
        guard offset >= 1 else { throw invalid("offset 0 names no entry; offsets start at 1") }
    }

    static func invalid(_ detail: String) -> LogStoreError {
        LogStoreError(.invalidArgument, path: "", detail)
    }
}
