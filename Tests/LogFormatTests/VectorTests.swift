import Foundation
import LogFormat
import Testing

/// The test vectors of the format specification (`Format/vectors/entries.json`,
/// described in `Format/README.md`). Every valid vector decodes to the entry its
/// JSON form describes and re-encodes to the same bytes; every invalid vector
/// is refused with the error code and byte position `Format/storage.md` gives.
@Suite struct VectorTests {
    @Test func vectorFileLoadsAndCoversEveryKind() throws {
        let file = try VectorFile.loaded.get()
        #expect(Set(file.valid.map(\.entry.kind)) == Set(EntryKind.allCases))
        #expect(!file.invalid.isEmpty)
    }

    @Test func crc32cCheckValue() {
        #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
        let head = CRC32C.checksum(Array("12345".utf8))
        #expect(CRC32C.checksum(Array("6789".utf8), continuing: head) == 0xE306_9283)
    }

    /// Equality of `Entry` compares doubles by bit pattern (`Value.==`), so
    /// the NaN and negative-zero vectors compare exactly; the byte comparisons
    /// would catch a lost bit pattern as well.
    @Test(arguments: VectorFile.valid)
    func validVectorDecodesAndReencodes(_ vector: ValidVector) throws {
        let decoded = try EntryCodec.decode(vector.bytes, expectedOffset: vector.entry.offset)
        #expect(decoded == vector.entry)
        #expect(try EntryCodec.encode(vector.entry) == vector.bytes)
        #expect(try EntryCodec.encode(decoded) == vector.bytes)
    }

    @Test(arguments: VectorFile.invalid)
    func invalidVectorIsRefused(_ vector: InvalidVector) {
        do throws(FormatError) {
            let entry = try EntryCodec.decode(vector.bytes, expectedOffset: vector.expectedOffset)
            Issue.record("decoded \(entry), expected \(vector.error) at byte \(vector.position)")
        } catch {
            #expect(error.code.name == vector.error)
            #expect(error.position == vector.position)
        }
    }

    /// A torn or short value never decodes: a prefix shorter than the header
    /// is truncated, and a longer one disagrees with its body length.
    @Test(arguments: VectorFile.valid)
    func everyPrefixIsRefused(_ vector: ValidVector) {
        for count in 0..<vector.bytes.count {
            let expected = count < EntryCodec.headerBytes ? ("truncated", 0) : ("length out of range", 4)
            do throws(FormatError) {
                _ = try EntryCodec.decode(Array(vector.bytes[..<count]), expectedOffset: vector.entry.offset)
                Issue.record("a prefix of \(count) bytes decoded")
            } catch {
                #expect(error.code.name == expected.0, "prefix of \(count) bytes")
                #expect(error.position == expected.1, "prefix of \(count) bytes")
            }
        }
    }

    /// CRC-32C detects every single-bit error, and the header checks catch the
    /// flips that come before the checksum is verified.
    @Test(arguments: VectorFile.valid)
    func everyBitFlipIsRefused(_ vector: ValidVector) {
        var bytes = vector.bytes
        for index in bytes.indices {
            for bit in 0..<8 {
                bytes[index] ^= 1 << bit
                do throws(FormatError) {
                    _ = try EntryCodec.decode(bytes, expectedOffset: vector.entry.offset)
                    Issue.record("flipping bit \(bit) of byte \(index) went unnoticed")
                } catch {}
                bytes[index] ^= 1 << bit
            }
        }
    }

    /// The examples of `Format/storage.md`, section 14.
    @Test func identifierTextFormsMatchTheSpecification() throws {
        let id = try #require(UUIDv7(uuidString: "017f22e2-79b0-7cc3-98c4-dc0c0c07398f"))
        #expect(id.version == 7)
        #expect(id.milliseconds == 0x017F_22E2_79B0)
        #expect(id.ulidString == "01FWHE4YDGFK1SHH6W1G60EECF")
        #expect(UUIDv7(ulidString: "01fwhe4ydgfk1shh6w1g60eecf") == id)
        #expect(UUIDv7(ulidString: "81FWHE4YDGFK1SHH6W1G60EECF") == nil)
        let prefixed = try #require(PrefixedID(prefix: "te", id: id))
        #expect(prefixed.description == "te_01FWHE4YDGFK1SHH6W1G60EECF")
        #expect(PrefixedID("te_01FWHE4YDGFK1SHH6W1G60EECF") == prefixed)
        #expect(PrefixedID(prefix: "Te", id: id) == nil)
        #expect(PrefixedID(prefix: "1te", id: id) == nil)
        #expect(PrefixedID(prefix: String(repeating: "a", count: 17), id: id) == nil)
    }
}

// MARK: - Reading the vector file

struct ValidVector: Sendable, CustomTestStringConvertible {
    let name: String
    let bytes: [UInt8]
    let entry: Entry
    var testDescription: String { name }
}

struct InvalidVector: Sendable, CustomTestStringConvertible {
    let name: String
    let bytes: [UInt8]
    let expectedOffset: UInt64?
    /// A `FormatError.Code` name, such as "bad checksum".
    let error: String
    let position: Int
    var testDescription: String { name }
}

struct VectorError: Error, CustomStringConvertible {
    let description: String
}

struct VectorFile: Sendable {
    let valid: [ValidVector]
    let invalid: [InvalidVector]

    /// `Format/vectors/entries.json`, found from this file's path: the package
    /// root is two directories above `Tests/LogFormatTests`.
    static let url = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent()
        .deletingLastPathComponent()
        .deletingLastPathComponent()
        .appendingPathComponent("Format/vectors/entries.json")

    /// Read once. A failure leaves the parameterized tests without arguments
    /// and fails `vectorFileLoadsAndCoversEveryKind`, which reports it.
    static let loaded = Result { () throws -> VectorFile in try load() }

    static var valid: [ValidVector] { (try? loaded.get())?.valid ?? [] }
    static var invalid: [InvalidVector] { (try? loaded.get())?.invalid ?? [] }

    static func load() throws -> VectorFile {
        let data = try Data(contentsOf: url)
        guard let root = try JSONSerialization.jsonObject(with: data) as? [String: Any],
            let valid = root["valid"] as? [[String: Any]],
            let invalid = root["invalid"] as? [[String: Any]]
        else { throw VectorError(description: "\(url.path) lacks the valid and invalid arrays") }
        return VectorFile(valid: try valid.map(validVector), invalid: try invalid.map(invalidVector))
    }

    static func validVector(_ json: [String: Any]) throws -> ValidVector {
        let name = json["name"] as? String ?? "(unnamed)"
        guard let hex = json["hex"] as? String, let bytes = [UInt8](hex: hex),
            let entry = json["entry"] as? [String: Any]
        else { throw VectorError(description: "\(name): needs hex and entry") }
        return ValidVector(name: name, bytes: bytes, entry: try JSONEntry(entry, vector: name).entry())
    }

    static func invalidVector(_ json: [String: Any]) throws -> InvalidVector {
        let name = json["name"] as? String ?? "(unnamed)"
        guard let hex = json["hex"] as? String, let bytes = [UInt8](hex: hex),
            let error = json["error"] as? String, let position = json["position"] as? Int,
            let expected = json["expected_offset"]
        else { throw VectorError(description: "\(name): needs hex, expected_offset, error and position") }
        let expectedOffset: UInt64?
        if expected is NSNull {
            expectedOffset = nil
        } else if let offset = expected as? UInt64 {
            expectedOffset = offset
        } else {
            throw VectorError(description: "\(name): expected_offset is neither null nor a u64")
        }
        return InvalidVector(
            name: name, bytes: bytes, expectedOffset: expectedOffset, error: error, position: position)
    }
}

// MARK: - The decoded JSON form

/// The decoded form of an entry in the vector file, turned into an `Entry`.
/// Field names are the snake_case names of `Format/storage.md`, section 7.
struct JSONEntry {
    let object: [String: Any]
    let vector: String

    init(_ object: [String: Any], vector: String) {
        self.object = object
        self.vector = vector
    }

    static let keys: [EntryKind: Set<String>] = [
        .intent: ["operation", "idempotency_key", "entity_type", "entity_id", "base_version", "fields"],
        .ack: ["intent_offset", "outcome", "server_version"],
        .reject: ["intent_offset", "code", "message"],
        .remote: ["cursor", "operation", "entity_type", "entity_id", "server_version", "fields"],
        .conflict: [
            "intent_offset", "entity_type", "entity_id", "server_version", "server_deleted", "server_fields",
            "resolution", "resolved_fields",
        ],
        .resync: ["reason"],
        .snapshot: ["watermark", "cursor", "entity_type", "entity_id", "server_version", "deleted", "fields"],
    ]

    func entry() throws -> Entry {
        guard let kind = EntryKind(name: try string("kind")) else { throw problem("unknown kind") }
        let bodyKeys = Set(object.keys).subtracting(["offset", "timestamp", "kind"])
        guard bodyKeys == JSONEntry.keys[kind] else { throw problem("\(kind) has keys \(bodyKeys.sorted())") }
        return Entry(
            offset: try u64("offset"), timestamp: HybridTimestamp(rawValue: try u64("timestamp")),
            body: try body(kind))
    }

    private func body(_ kind: EntryKind) throws -> EntryBody {
        switch kind {
        case .intent:
            .intent(
                Intent(
                    try choice("operation", ["create": .create, "update": .update, "delete": .delete]),
                    idempotencyKey: try string("idempotency_key"), entityType: try string("entity_type"),
                    entityID: try string("entity_id"), baseVersion: try u64("base_version"),
                    fields: try fields("fields")))
        case .ack:
            .ack(
                Ack(
                    intentOffset: try u64("intent_offset"),
                    outcome: try choice("outcome", ["applied": .applied, "duplicate": .duplicate]),
                    serverVersion: try u64("server_version")))
        case .reject:
            .reject(Reject(intentOffset: try u64("intent_offset"), code: try string("code"), message: try string("message")))
        case .remote:
            .remote(
                Remote(
                    cursor: try string("cursor"), try choice("operation", ["upsert": .upsert, "delete": .delete]),
                    entityType: try string("entity_type"), entityID: try string("entity_id"),
                    serverVersion: try u64("server_version"), fields: try fields("fields")))
        case .conflict:
            .conflict(try conflict())
        case .resync:
            .resync(reason: try string("reason"))
        case .snapshot:
            .snapshot(
                Snapshot(
                    watermark: try u64("watermark"), cursor: try string("cursor"),
                    entityType: try string("entity_type"), entityID: try string("entity_id"),
                    serverVersion: try u64("server_version"), deleted: try bool("deleted"),
                    fields: try fields("fields")))
        }
    }

    private func conflict() throws -> Conflict {
        let resolutions: [String: Conflict.Resolution] = [
            "pending": .pending, "keep_local": .keepLocal, "keep_remote": .keepRemote, "merged": .merged,
            "custom": .custom,
        ]
        let deleted = try bool("server_deleted")
        return Conflict(
            intentOffset: try u64("intent_offset"), entityType: try string("entity_type"),
            entityID: try string("entity_id"), serverVersion: try u64("server_version"), serverDeleted: deleted,
            serverFields: try fields("server_fields"), resolution: try choice("resolution", resolutions),
            resolvedFields: try fields("resolved_fields"))
    }

    private func problem(_ message: String) -> VectorError {
        VectorError(description: "\(vector): \(message)")
    }

    private func bool(_ key: String) throws -> Bool {
        guard let flag = object[key] as? Bool else { throw problem("\(key) is not a bool") }
        return flag
    }

    private func u64(_ key: String) throws -> UInt64 {
        guard let number = object[key] as? UInt64 else { throw problem("\(key) is not a u64") }
        return number
    }

    private func string(_ key: String) throws -> String {
        guard let text = object[key] as? String else { throw problem("\(key) is not a string") }
        return text
    }

    private func choice<Choice>(_ key: String, _ choices: [String: Choice]) throws -> Choice {
        guard let choice = choices[try string(key)] else { throw problem("\(key) is not one of \(choices.keys.sorted())") }
        return choice
    }

    private func fields(_ key: String) throws -> Fields {
        guard let object = object[key] as? [String: Any] else { throw problem("\(key) is not an object") }
        return try fields(object)
    }

    private func fields(_ object: [String: Any]) throws -> Fields {
        Fields(try object.map { name, typed in (name, try value(typed)) })
    }

    /// A typed value: `["null"]`, `["bool", true]`, `["int", "-1"]`,
    /// `["double", "7ff8000000000000"]`, `["string", "..."]`, `["bytes", "00ff"]`,
    /// `["timestamp", "-1"]`, `["array", [...]]` or `["object", {...}]`.
    private func value(_ json: Any) throws -> Value {
        guard let typed = json as? [Any], let type = typed.first as? String, typed.count <= 2 else {
            throw problem("\(json) is not a typed value")
        }
        let payload: Any? = typed.count == 2 ? typed[1] : nil
        switch (type, payload) {
        case ("null", nil):
            return .null
        case ("bool", let flag as Bool):
            return .bool(flag)
        case ("int", let text as String):
            if let number = Int64(text) { return .int(number) }
        case ("double", let text as String):
            if text.utf8.count == 16, let bits = UInt64(text, radix: 16) { return .double(Double(bitPattern: bits)) }
        case ("string", let text as String):
            return .string(text)
        case ("bytes", let hex as String):
            if let bytes = [UInt8](hex: hex) { return .bytes(bytes) }
        case ("timestamp", let text as String):
            if let micros = Int64(text) { return .timestamp(micros) }
        case ("array", let elements as [Any]):
            return .array(try elements.map { try value($0) })
        case ("object", let object as [String: Any]):
            return .object(try fields(object))
        default:
            break
        }
        throw problem("\(json) is not a typed value")
    }
}

extension [UInt8] {
    /// Bytes from an even number of hex digits; nil for anything else.
    fileprivate init?(hex: String) {
        let digits = Array(hex.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(digits.count / 2)
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let high = hexValue(digits[index]), let low = hexValue(digits[index + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        self = bytes
    }
}

private func hexValue(_ digit: UInt8) -> UInt8? {
    switch digit {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): digit - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): digit - UInt8(ascii: "A") + 10
    default: nil
    }
}
