import Foundation
import LogFormat
import LogTesting
import Testing

@Suite struct FieldsTests {
    @Test func sortedByUTF8BytesWithLaterPairsWinning() {
        let fields = Fields([("é", 1), ("a", 2), ("Z", 3), ("a", 4)])
        #expect(fields.map(\.name) == ["Z", "a", "é"])
        #expect(fields["a"] == 4)
    }

    @Test func subscriptInsertsReplacesAndRemoves() {
        var fields: Fields = ["b": 1]
        fields["a"] = "x"
        fields["b"] = 2
        fields["c"] = nil
        #expect(fields.map(\.name) == ["a", "b"])
        fields["a"] = nil
        #expect(fields == ["b": 2])
    }

    /// A name the fields lack reads as nil, not as the value null (which
    /// `Value` also spells `nil`): "absent" and "present and null" differ,
    /// as `ConflictStrategy` and conflict resolution rely on.
    @Test func aMissingNameIsNilNotNull() {
        let fields: Fields = ["a": 1, "n": .null]
        #expect(fields["missing"] == Optional<Value>.none)
        #expect(fields["n"] == Optional<Value>.some(.null))
        #expect((fields["missing"] ?? 7) == 7)
    }

    /// `ByteKey.compare` checks the first bytes in a loop and the rest with
    /// memcmp: both parts, and the bytes past 0x7F, must keep LMDB's order.
    @Test func byteOrderMatchesLexicographicOrder() {
        var random = SeededRandom(seed: 0xB17E)
        // A shared prefix of every length around the loop's end, then
        // bytes from a small alphabet so equal runs and prefixes are common.
        for _ in 0..<20_000 {
            let shared = (0..<Int.random(in: 0...40, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            let alphabet: [UInt8] = [0x00, 0x61, 0x7F, 0x80, 0xFF]
            let tail = { (random: inout SeededRandom) -> [UInt8] in
                (0..<Int.random(in: 0...3, using: &random)).map { _ in alphabet[Int.random(in: 0..<alphabet.count, using: &random)] }
            }
            let a: [UInt8] = shared + tail(&random)
            let b: [UInt8] = shared + tail(&random)
            let expected = a.lexicographicallyPrecedes(b) ? -1 : (a == b ? 0 : 1)
            let order = a.withUnsafeBytes { x in b.withUnsafeBytes { y in ByteKey.compare(x, y) } }
            #expect(order.signum() == expected, "\(a) against \(b)")
            #expect((ByteKey(a) < ByteKey(b)) == (expected < 0))
            #expect((ByteKey(b) < ByteKey(a)) == (expected > 0))
            #expect((ByteKey(a) == ByteKey(b)) == (expected == 0))
            #expect(ByteKey(a).bytes == a)
            if expected == 0 { #expect(ByteKey(a).hashValue == ByteKey(b).hashValue) }
        }
    }

    /// Keys of up to 32 bytes are kept in words, longer ones in an array:
    /// sets and sorts must not tell the two apart from the bytes.
    @Test func byteKeysAreSetAndSortedByTheirBytesAtEveryLength() {
        var random = SeededRandom(seed: 0xB17F)
        var keys: [[UInt8]] = []
        for length in 0...70 {
            for _ in 0..<4 {
                // A small alphabet with zero bytes, so padding-like tails occur.
                keys.append((0..<length).map { _ in [0x00, 0x01, 0x61, 0xFF][Int.random(in: 0..<4, using: &random)] })
            }
            keys.append([UInt8](repeating: 0, count: length))
        }
        let unique = Set(keys.map(ByteKey.init))
        #expect(Set(unique.map(\.bytes)) == Set(keys))
        #expect(unique.count == Set(keys).count)
        let sorted = unique.sorted().map(\.bytes)
        #expect(sorted == Set(keys).sorted { $0.lexicographicallyPrecedes($1) })
        for key in keys {
            key.withUnsafeBytes { raw in #expect(ByteKey(raw) == ByteKey(key)) }
            ByteKey(key).withUnsafeBytes { raw in #expect([UInt8](raw) == key) }
        }
    }

    /// storage.md section 11, step 12: a name is read as a string (UTF-8
    /// checked) before its order is, so the bytes `61 ff` ("a" and a stray
    /// 0xff) after "b", ill-formed and out of order, are "invalid UTF-8" at
    /// the name's length field, not "unsorted keys" (the vector
    /// `invalid-utf8-in-unsorted-field-name` checks the same in an entry).
    @Test func aFieldNameIsCheckedAsUTF8BeforeItsOrder() {
        let bytes: [UInt8] = [0, 0, 0, 2] + [0, 0, 0, 1, 0x62, 0] + [0, 0, 0, 2, 0x61, 0xFF, 0]
        let secondName = 10
        bytes.withUnsafeBytes { raw in
            var reader = ByteReader(raw)
            do throws(FormatError) {
                let fields = try Fields.decode(from: &reader)
                Issue.record("decoded \(fields)")
            } catch {
                #expect(error.code == .invalidUTF8, "got \(error.code) at \(error.position)")
                #expect(error.position == secondName)
            }
        }
    }

    @Test func mergingAppliesChanges() {
        let base: Fields = ["a": 1, "b": 2]
        #expect(base.merging(["b": 3, "c": 4]) == ["a": 1, "b": 3, "c": 4])
    }

    @Test func hybridTimestampsStrictlyIncrease() {
        var clock = HybridTimestamp(milliseconds: 1000, logical: 0)
        let next = clock.next(wallClockMilliseconds: 999)
        #expect(next > clock && next.milliseconds == 1000 && next.logical == 1)
        clock = next.next(wallClockMilliseconds: 2000)
        #expect(clock == HybridTimestamp(milliseconds: 2000, logical: 0))
    }
}

@Suite struct SummaryTests {
    @Test func timestampsRenderAsISO8601() {
        #expect(Value.iso8601(microseconds: 0) == "1970-01-01T00:00:00.000000Z")
        #expect(Value.iso8601(microseconds: 1_795_335_611_301_476) == "2026-11-22T08:20:11.301476Z")
        #expect(Value.iso8601(microseconds: 951_782_400_000_001) == "2000-02-29T00:00:00.000001Z")
        #expect(Value.iso8601(microseconds: -1) == "1969-12-31T23:59:59.999999Z")
    }

    /// Far outside the years 0 to 9999, as the first (string-built)
    /// rendering wrote them; a negative year keeps its odd padding.
    @Test func extremeTimestampsRenderAsBefore() {
        #expect(Value.iso8601(microseconds: .min) == "-290308-12-21T19:59:05.224192Z")
        #expect(Value.iso8601(microseconds: .max) == "294247-01-10T04:00:54.775807Z")
        #expect(Value.iso8601(microseconds: -62_135_596_800_000_000) == "0001-01-01T00:00:00.000000Z")
        #expect(Value.iso8601(microseconds: -62_135_596_800_000_001) == "0000-12-31T23:59:59.999999Z")
        #expect(Value.iso8601(microseconds: -62_198_755_200_000_000) == "00-1-01-01T00:00:00.000000Z")
        #expect(Value.iso8601(microseconds: 253_402_300_800_000_000) == "10000-01-01T00:00:00.000000Z")
    }

    /// Random instants from 1970 to 9999 agree with Foundation's calendar.
    @Test func timestampsAgreeWithFoundation() throws {
        var random = SeededRandom(seed: SeededRandom.seed(default: 8601))
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = try #require(TimeZone(identifier: "UTC"))
        for _ in 0..<2_000 {
            let micros = Int64(random.next() % 253_402_300_800_000_000)
            let (seconds, fraction) = micros.quotientAndRemainder(dividingBy: 1_000_000)
            let parts = calendar.dateComponents(
                [.year, .month, .day, .hour, .minute, .second], from: Date(timeIntervalSince1970: TimeInterval(seconds)))
            let expected = String(
                format: "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", parts.year ?? 0, parts.month ?? 0, parts.day ?? 0, parts.hour ?? 0,
                parts.minute ?? 0, parts.second ?? 0, Int(fraction))
            #expect(Value.iso8601(microseconds: micros) == expected, "\(micros)")
        }
    }

    @Test func entriesRenderOnOneLine() {
        let entry = Entry(
            offset: 3, timestamp: .init(rawValue: 1),
            body: .intent(Intent(.update, idempotencyKey: "k", entityType: "te", entityID: "te_1", baseVersion: 2, fields: ["minutes": 30])))
        #expect(entry.description == "#3 intent update te/te_1 base v2 [minutes: 30]")
        #expect(Entry(offset: 4, timestamp: .init(rawValue: 1), body: .ack(Ack(intentOffset: 3, outcome: .applied, serverVersion: 3))).description == "#4 ack #3 applied v3")
    }
}

@Suite struct ChecksumTests {
    @Test func hardwareAndSoftwareAgree() {
        var random = SeededRandom(seed: 5)
        for length in 0..<300 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &random) }
            let start = UInt32.random(in: 0...UInt32.max, using: &random)
            bytes.withUnsafeBytes { raw in
                #expect(CRC32C.checksum(raw, continuing: start) == CRC32C.software(raw, continuing: start), "length \(length)")
            }
        }
        Array("123456789".utf8).withUnsafeBytes { #expect(CRC32C.software($0) == 0xE306_9283) }
    }
}

@Suite struct NameRulesTests {
    /// Checking a value costs time in proportion to its size: a value nested
    /// past the limit is refused at once (it once took 2^depth steps).
    @Test func deepValuesAreRefusedQuickly() {
        var value = Value.string("bottom")
        for _ in 0..<(Limits.valueDepthMax + 1) { value = .array([value]) }
        #expect(NameRules.fieldsProblem(["deep": value])?.contains("nests deeper") == true)
        #expect(NameRules.fieldsProblem(["ok": .array([.double(.nan)])]) != nil)
        #expect(NameRules.fieldsProblem(["$x": 1]) != nil && NameRules.fieldsProblem(["": 1]) != nil)
        #expect(NameRules.entityTypeProblem("te") == nil && NameRules.entityTypeProblem("Te") != nil)
    }

    /// Names that differ only by Unicode normalization are two fields to the
    /// format, but one member name to every JSON reader built on Swift's
    /// `String` (ours too): the client's push body would be refused whole
    /// (section 16, point 17). The store took such fields, and each push
    /// carrying them failed its whole request, for every operation in it.
    @Test func namesThatDifferOnlyByNormalizationAreRefused() throws {
        // Two fields each (the format compares bytes), the last one nested.
        let pairs: [Fields] = [["\u{E9}": 1, "e\u{301}": 2], ["K-name": 1, "\u{212A}-name": 2], ["a": .object(["\u{C5}": 1, "A\u{30A}": 2])]]
        for fields in pairs {
            #expect(NameRules.fieldsProblem(fields)?.contains("differ only by Unicode normalization") == true, "\(fields)")
            // What the writer makes of them, the reader refuses.
            var writer = JSONWriter()
            try fields.writeJSON(to: &writer)
            #expect(throws: JSONReadError.self) { try JSONReader.parse(writer.bytes) }
        }
        for fields: Fields in [["\u{E9}": 1, "f": 2], ["a": 1, "b": .object(["a": 1])], ["\u{E9}": .object(["e\u{301}": 1])]] {
            #expect(NameRules.fieldsProblem(fields) == nil, "\(fields)")
            var writer = JSONWriter()
            try fields.writeJSON(to: &writer)
            #expect(try Fields(json: JSONReader.parse(writer.bytes)) == fields)
        }
    }

    /// `Format/limits.md`: entity types are 1 to 64 bytes, entity ids and
    /// idempotency keys 1 to 256, in UTF-8: each at its limit is allowed,
    /// one byte more or empty is refused.
    @Test func namesAreAllowedUpToTheirLimitInBytesAndNotPastIt() {
        let type = "t" + String(repeating: "a", count: Limits.entityTypeBytesMax - 1)
        #expect(NameRules.entityTypeProblem(type) == nil)
        #expect(NameRules.entityTypeProblem(type + "a") != nil)
        #expect(NameRules.entityTypeProblem("") != nil)
        // "é" is two bytes: the limits count bytes, not characters.
        let id = String(repeating: "\u{E9}", count: Limits.entityIDBytesMax / 2)
        #expect(NameRules.entityIDProblem(id) == nil)
        #expect(NameRules.entityIDProblem(id + "x") != nil)
        #expect(NameRules.entityIDProblem("") != nil)
        let key = String(repeating: "k", count: Limits.idempotencyKeyBytesMax)
        #expect(NameRules.idempotencyKeyProblem(key) == nil)
        #expect(NameRules.idempotencyKeyProblem(key + "k") != nil)
        #expect(NameRules.idempotencyKeyProblem("") != nil)
    }
}
