import Foundation

/// Named values, kept sorted by the UTF-8 bytes of their names with no
/// repeats. The order is the canonical binary order, so encoding needs no
/// sort and decoding needs no hashing; lookups are binary searches.
public struct Fields: Hashable, Sendable, RandomAccessCollection, ExpressibleByDictionaryLiteral {
    public typealias Element = (name: String, value: Value)
    /// One name and its value. Stored as a struct rather than as `Element`
    /// (a tuple): an array of tuples is destroyed through the runtime's
    /// generic tuple witness, field by field: decoding the bench's entity
    /// fields and dropping them took 180 ns as tuples, 140 ns as structs.
    struct Field: Sendable {
        var name: String
        var value: Value
    }

    private var storage: [Field]

    /// The pairs in ascending name order.
    public var elements: [Element] { storage.map { ($0.name, $0.value) } }

    public init() { storage = [] }

    /// Builds the set from pairs in any order; a later pair with the same
    /// name replaces an earlier one.
    public init(_ pairs: some Sequence<(String, Value)>) {
        var sorted = pairs.map { Field(name: $0.0, value: $0.1) }
        // A stable sort keeps the pairs of a repeated name in input order, so
        // keeping the last of each run means "later wins".
        sorted.sort { Fields.precedes($0.name, $1.name) }
        var unique: [Field] = []
        unique.reserveCapacity(sorted.count)
        for element in sorted {
            if let last = unique.last, Fields.same(last.name, element.name) {
                unique[unique.count - 1] = element
            } else {
                unique.append(element)
            }
        }
        storage = unique
    }

    public init(dictionaryLiteral elements: (String, Value)...) { self.init(elements) }

    public init(_ dictionary: [String: Value]) { self.init(dictionary.map { ($0.key, $0.value) }) }

    /// Takes pairs that are already strictly ascending (the decoder checks).
    init(sorted fields: [Field]) { storage = fields }

    /// The canonical order: byte-wise on UTF-8, not Unicode collation.
    public static func precedes(_ lhs: String, _ rhs: String) -> Bool {
        compareUTF8(lhs, rhs) < 0
    }

    /// Names are the same when their UTF-8 bytes are (Swift's `==` would
    /// also equate canonically equivalent spellings, which the format keeps apart).
    public static func same(_ lhs: String, _ rhs: String) -> Bool {
        lhs.utf8.count == rhs.utf8.count && compareUTF8(lhs, rhs) == 0
    }

    /// memcmp order of the UTF-8 bytes, the shorter first on a common prefix.
    static func compareUTF8(_ lhs: String, _ rhs: String) -> Int {
        var lhs = lhs
        var rhs = rhs
        return lhs.withUTF8 { a in
            rhs.withUTF8 { b in ByteKey.compare(UnsafeRawBufferPointer(a), UnsafeRawBufferPointer(b)) }
        }
    }

    public var startIndex: Int { storage.startIndex }
    public var endIndex: Int { storage.endIndex }
    public subscript(position: Int) -> Element {
        let field = storage[position]
        return (field.name, field.value)
    }

    /// The value named `name`, or nil. Setting nil removes the name.
    public subscript(name: String) -> Value? {
        get {
            let index = insertionIndex(of: name)
            // Not `: nil`, which the ternary would take for `Value.null` (a
            // nil literal), so that a missing name read as a present null.
            guard index < storage.count, Fields.same(storage[index].name, name) else { return Optional.none }
            return storage[index].value
        }
        set {
            let index = insertionIndex(of: name)
            let present = index < storage.count && Fields.same(storage[index].name, name)
            switch (present, newValue) {
            case (true, let value?): storage[index].value = value
            case (true, nil): storage.remove(at: index)
            case (false, let value?): storage.insert(Field(name: name, value: value), at: index)
            case (false, nil): break
            }
        }
    }

    /// Applies `changes` over these fields: each changed name takes its new value.
    public func merging(_ changes: Fields) -> Fields {
        var merged = self
        merged.merge(changes)
        return merged
    }

    /// `merging(_:)` in place: with storage of its own, no copy.
    public mutating func merge(_ changes: Fields) {
        for change in changes.storage { self[change.name] = change.value }
    }

    private func insertionIndex(of name: String) -> Int {
        var low = 0
        var high = storage.count
        while low < high {
            let middle = (low + high) / 2
            if Fields.precedes(storage[middle].name, name) { low = middle + 1 } else { high = middle }
        }
        return low
    }

    public static func == (lhs: Fields, rhs: Fields) -> Bool {
        // Copies share their storage: a record whose visible state is its
        // base (the common case) compares in O(1).
        let shared = lhs.storage.withUnsafeBufferPointer { a in
            rhs.storage.withUnsafeBufferPointer { b in a.baseAddress == b.baseAddress && a.count == b.count }
        }
        if shared { return true }
        return lhs.storage.count == rhs.storage.count
            && zip(lhs.storage, rhs.storage).allSatisfy { Fields.same($0.name, $1.name) && $0.value == $1.value }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(storage.count)
        for element in storage {
            hasher.combine(Value.string(element.name))
            hasher.combine(element.value)
        }
    }
}

extension Fields {
    /// A u32 count, then each name (u32 length + UTF-8) and value, ascending.
    public func encode(into writer: inout ByteWriter) {
        writer.write(bigEndian: UInt32(clamping: storage.count))
        for element in storage {
            writer.write(lengthPrefixed: element.name)
            element.value.encode(into: &writer)
        }
    }

    public static func decode(from reader: inout ByteReader, depth: Int = 0) throws(FormatError) -> Fields {
        // Each field is at least a 4-byte name length and a 1-byte tag.
        let count = try reader.readCount("field count", minimumElementBytes: 5)
        var fields: [Field] = []
        fields.reserveCapacity(count)
        // Each name is read as a string (its UTF-8 checked) before its order
        // is checked, in the order of storage.md section 11, step 12: a name
        // both ill-formed and out of order is "invalid UTF-8". The order is
        // compared on the bytes as stored.
        var previous = UnsafeRawBufferPointer(start: nil, count: 0)
        for index in 0..<count {
            let namePosition = reader.position
            let raw = try reader.readLengthPrefixed("field name")
            let name = try ByteReader.string(raw, "field name", at: namePosition, reader)
            if index > 0, ByteKey.compare(previous, raw) >= 0 {
                let before = String(decoding: previous, as: UTF8.self)
                throw reader.error(.unsortedKeys, "field \"\(name)\" does not sort after \"\(before)\"", at: namePosition)
            }
            previous = raw
            fields.append(Field(name: name, value: try Value.decode(from: &reader, depth: depth)))
        }
        return Fields(sorted: fields)
    }
}

extension Fields: CustomStringConvertible {
    public var description: String {
        "[" + storage.map { "\(Value.printable($0.name)): \($0.value)" }.joined(separator: ", ") + "]"
    }
}

extension Fields {
    /// The size of the fields' binary form (`Format/storage.md`, section 8),
    /// counted without encoding them: `encode(into:)` writes exactly this.
    public var encodedSize: Int {
        storage.reduce(4) { size, element in size + 4 + element.name.utf8.count + element.value.encodedSize }
    }
}
