/// The rules on names and values that every writer applies before anything
/// enters a log (`Format/storage.md`, "What a writer never appends"): names
/// become LMDB keys, values must have a JSON form. Each check returns a
/// sentence describing the problem, or nil; the store and the server wrap
/// it in their own error.
public enum NameRules {
    /// 1 to `Limits.entityTypeBytesMax` bytes: a lowercase ASCII letter, then
    /// lowercase letters, digits, `_`, `-` or `.`.
    public static func entityTypeProblem(_ type: String) -> String? {
        // The UTF-8 view as it stands: every write checks a type, and a
        // copy of the bytes into an array cost an allocation each time.
        let bytes = type.utf8
        let isLower = { (byte: UInt8) in (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) }
        let allowed = { (byte: UInt8) -> Bool in
            isLower(byte) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
                || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".")
        }
        guard (1...Limits.entityTypeBytesMax).contains(bytes.count), let first = bytes.first, isLower(first),
            bytes.allSatisfy(allowed)
        else {
            return "entity type \"\(type.prefix(80))\": use 1 to \(Limits.entityTypeBytesMax) of a-z, 0-9, _ - . starting with a letter"
        }
        return nil
    }

    /// 1 to `Limits.entityIDBytesMax` bytes of UTF-8.
    public static func entityIDProblem(_ id: String) -> String? {
        (1...Limits.entityIDBytesMax).contains(id.utf8.count)
            ? nil : "entity id must be 1 to \(Limits.entityIDBytesMax) bytes, \"\(id.prefix(40))\" is \(id.utf8.count)"
    }

    /// 1 to `Limits.idempotencyKeyBytesMax` bytes of UTF-8.
    public static func idempotencyKeyProblem(_ key: String) -> String? {
        (1...Limits.idempotencyKeyBytesMax).contains(key.utf8.count)
            ? nil : "idempotency key must be 1 to \(Limits.idempotencyKeyBytesMax) bytes, is \(key.utf8.count)"
    }

    /// Field names are non-empty and do not start with `$` (reserved for the
    /// JSON forms of bytes, timestamps and doubles), and no two in one object
    /// differ only by Unicode normalization; doubles are finite; values nest
    /// at most `Limits.valueDepthMax` deep.
    public static func fieldsProblem(_ fields: Fields, depth: Int = 0) -> String? {
        for (name, value) in fields {
            guard !name.isEmpty, !isReserved(name) else {
                return "field name \"\(name)\": names are non-empty and do not start with $"
            }
            if let problem = valueProblem(value, name: name, depth: depth) { return problem }
        }
        if let (first, second) = equivalentNames(fields) {
            return "fields \(scalars(first)) and \(scalars(second)) differ only by Unicode normalization: the sync protocol "
                + "cannot carry both in one object (sync-protocol.md, section 16, point 17)"
        }
        return nil
    }

    /// Why an update setting `changes` cannot apply to an entity holding
    /// `fields`: it adds a name that `fields` has in another spelling, and
    /// the entity would hold both (`equivalentNames`). Nil when it can.
    public static func updateProblem(_ changes: Fields, of fields: Fields) -> String? {
        // Only a name new to the entity (looked up by its bytes) can be
        // another spelling of one it has; `String`'s == compares by
        // canonical equivalence. Most updates name only existing fields.
        for (name, _) in changes where fields[name] == nil {
            if let existing = fields.first(where: { $0.name == name })?.name {
                return "field \(scalars(name)) differs from the field \(scalars(existing)) only by Unicode normalization; "
                    + "the two cannot be in one object (sync-protocol.md, section 16, point 17)"
            }
        }
        return nil
    }

    /// A name's Unicode scalars (`U+E9`), which its text shows the same in
    /// two spellings.
    private static func scalars(_ name: String) -> [String] {
        name.unicodeScalars.map { "U+" + String($0.value, radix: 16, uppercase: true) }
    }

    /// Two names of `fields` that differ in bytes (the format keeps them
    /// apart) but that Swift's `String`, and so every JSON reader built on
    /// it, takes for one: a push carrying both would be refused whole, as a
    /// body with a repeated member.
    private static func equivalentNames(_ fields: Fields) -> (String, String)? {
        // ASCII names are their own normal form: two of them are one name
        // only when their bytes are equal, which `Fields` never holds.
        guard fields.count > 1, fields.contains(where: { !$0.name.utf8.allSatisfy { $0 < 0x80 } }) else { return nil }
        // Keyed by `String`, whose hashing and == follow canonical equivalence.
        var seen: [String: String] = [:]
        for (name, _) in fields {
            if let earlier = seen.updateValue(name, forKey: name) { return (earlier, name) }
        }
        return nil
    }

    /// Whether `name` starts with `$`, reserved for the JSON forms of
    /// values: its first byte (so its first scalar) is `$`. Not `hasPrefix`,
    /// which compares characters: `$` and a combining mark after it make one
    /// character that is not `$`.
    public static func isReserved(_ name: String) -> Bool { name.utf8.first == UInt8(ascii: "$") }

    private static func valueProblem(_ value: Value, name: String, depth: Int) -> String? {
        switch value {
        case .double(let number) where !number.isFinite:
            return "field \"\(name)\" is \(number); only finite doubles are stored"
        case .array(let elements):
            guard depth < Limits.valueDepthMax else { return "field \"\(name)\" nests deeper than \(Limits.valueDepthMax)" }
            // A plain loop: each element is checked once. (A lazy map's
            // `first` runs its closure twice on a hit, which doubled the work
            // at every level of nesting.)
            for element in elements {
                if let problem = valueProblem(element, name: name, depth: depth + 1) { return problem }
            }
            return nil
        case .object(let nested):
            guard depth < Limits.valueDepthMax else { return "field \"\(name)\" nests deeper than \(Limits.valueDepthMax)" }
            return fieldsProblem(nested, depth: depth + 1)
        default:
            return nil
        }
    }
}
