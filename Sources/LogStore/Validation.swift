import LogFormat

/// Checks on what the app passes in, so nothing enters the log that the
/// format, LMDB's key limit or JSON could not carry.
enum Validation {
    /// 1 to `Limits.entityTypeBytesMax` bytes: a lowercase letter, then
    /// lowercase letters, digits, `_`, `-` or `.`.
    static func entityType(_ type: String) throws {
        let bytes = Array(type.utf8)
        let allowed = { (byte: UInt8) -> Bool in
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                || [UInt8(ascii: "_"), UInt8(ascii: "-"), UInt8(ascii: ".")].contains(byte)
        }
        guard (1...Limits.entityTypeBytesMax).contains(bytes.count),
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(bytes[0]), bytes.allSatisfy(allowed)
        else {
            throw invalid(
                "entity type \"\(type)\": use 1 to \(Limits.entityTypeBytesMax) of a-z, 0-9, _ - . starting with a letter")
        }
    }

    /// 1 to `Limits.entityIDBytesMax` bytes of UTF-8.
    static func entityID(_ id: String) throws {
        guard (1...Limits.entityIDBytesMax).contains(id.utf8.count) else {
            throw invalid("entity id must be 1 to \(Limits.entityIDBytesMax) bytes, \"\(id.prefix(40))\" is \(id.utf8.count)")
        }
    }

    /// Field names are non-empty and do not start with `$` (reserved for the
    /// JSON form of bytes, timestamps and doubles); doubles are finite; values
    /// nest at most `Limits.valueDepthMax` deep.
    static func fields(_ fields: Fields, depth: Int = 0) throws {
        for (name, value) in fields {
            guard !name.isEmpty, !name.hasPrefix("$") else {
                throw invalid("field name \"\(name)\": names are non-empty and do not start with $")
            }
            try self.value(value, name: name, depth: depth)
        }
    }

    private static func value(_ value: Value, name: String, depth: Int) throws {
        switch value {
        case .double(let number) where !number.isFinite:
            throw invalid("field \"\(name)\" is \(number); only finite doubles are stored")
        case .array(let elements):
            guard depth < Limits.valueDepthMax else { throw invalid("field \"\(name)\" nests deeper than \(Limits.valueDepthMax)") }
            for element in elements { try self.value(element, name: name, depth: depth + 1) }
        case .object(let nested):
            guard depth < Limits.valueDepthMax else { throw invalid("field \"\(name)\" nests deeper than \(Limits.valueDepthMax)") }
            try fields(nested, depth: depth + 1)
        default:
            break
        }
    }

    /// An idempotency key: 1 to `Limits.idempotencyKeyBytesMax` bytes.
    static func idempotencyKey(_ key: String) throws {
        guard (1...Limits.idempotencyKeyBytesMax).contains(key.utf8.count) else {
            throw invalid("idempotency key must be 1 to \(Limits.idempotencyKeyBytesMax) bytes, is \(key.utf8.count)")
        }
    }

    /// What every appended entry must satisfy, whoever appends it, so that
    /// the projections can always apply it: valid names and keys (they
    /// become LMDB keys), values JSON can carry, offsets and versions that
    /// can exist.
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
        case .resync:
            break
        }
    }

    private static func offset(_ offset: UInt64) throws {
        guard offset >= 1 else { throw invalid("offset 0 names no entry; offsets start at 1") }
    }

    static func invalid(_ detail: String) -> LogStoreError {
        LogStoreError(.invalidArgument, path: "", detail)
    }
}
