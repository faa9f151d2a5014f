import LogFormat

/// An entity named by its type and id, compared by their UTF-8 bytes, as
/// the store compares them (`Format/storage.md`, section 1). Swift's
/// `String` equality follows canonical equivalence, so "café" written with
/// U+00E9 and with U+0065 U+0301, two entities to the store, would be one
/// key of a `[String: ...]` or a `Set<String>`.
struct EntityName: Hashable, Comparable, CustomStringConvertible {
    /// The type's bytes, a `/`, then the id's. A type has no `/`
    /// (`NameRules.entityTypeProblem`), so the first one ends it.
    let bytes: [UInt8]

    init(type: String, id: String) { bytes = Array(type.utf8) + [UInt8(ascii: "/")] + Array(id.utf8) }

    /// In byte order.
    static func < (lhs: EntityName, rhs: EntityName) -> Bool { lhs.bytes.lexicographicallyPrecedes(rhs.bytes) }

    /// `type/id`, exactly (for JSON, which escapes what it must).
    var text: String { String(decoding: bytes, as: UTF8.self) }

    /// `type/id`, on one line (`Value.printable`).
    var description: String { Value.printable(text) }
}
