import LogFormat
import LogTesting
import Testing

@Suite struct EntryCodecTests {
    static let fields: Fields = [
        "name": "Write spec", "count": 3, "ratio": 0.25, "done": false, "note": nil,
        "blob": .bytes([0, 1, 255]), "at": .timestamp(1_795_335_371_613_000),
        "tags": ["a", 1, [true]], "nested": ["k": ["deeper": "é"]],
    ]

    static let bodies: [EntryBody] = [
        .intent(Intent(.create, idempotencyKey: "key-1", entityType: "te", entityID: "te_1", fields: fields)),
        .intent(Intent(.update, idempotencyKey: "key-2", entityType: "te", entityID: "te_1", baseVersion: 7, fields: ["count": 4])),
        .intent(Intent(.delete, idempotencyKey: "key-3", entityType: "te", entityID: "te_1", baseVersion: 8)),
        .ack(Ack(intentOffset: 1, outcome: .applied, serverVersion: 9)),
        .ack(Ack(intentOffset: 2, outcome: .duplicate, serverVersion: 9)),
        .reject(Reject(intentOffset: 3, code: "VALIDATION_ERROR", message: "name is required")),
        .remote(Remote(cursor: "c-10", .upsert, entityType: "prj", entityID: "prj_9", serverVersion: 3, fields: fields)),
        .remote(Remote(cursor: "c-11", .delete, entityType: "prj", entityID: "prj_9", serverVersion: 4)),
        .conflict(
            Conflict(
                intentOffset: 2, entityType: "te", entityID: "te_1", serverVersion: 10, serverDeleted: false,
                serverFields: ["count": 5], resolution: .pending)),
        .conflict(
            Conflict(
                intentOffset: 2, entityType: "te", entityID: "te_1", serverVersion: 10, serverDeleted: true,
                serverFields: [:], resolution: .merged, resolvedFields: ["count": 9])),
        .resync(reason: "CURSOR_INVALID"),
        .snapshot(
            Snapshot(watermark: 100, cursor: "c-99", entityType: "te", entityID: "te_1", serverVersion: 12, fields: fields)),
    ]

    @Test("every kind round-trips", arguments: bodies)
    func roundTrip(body: EntryBody) throws {
        let entry = Entry(offset: 42, timestamp: HybridTimestamp(milliseconds: 1_795_335_371_613, logical: 2), body: body)
        let bytes = try EntryCodec.encode(entry)
        #expect(EntryCodec.encodedSize(body) == bytes.count)
        #expect(bytes[0] == EntryCodec.formatVersion)
        #expect(bytes[1] == body.kind.rawValue)
        let decoded = try EntryCodec.decode(bytes, expectedOffset: 42)
        #expect(decoded == entry)
        #expect(try EntryCodec.encode(decoded) == bytes)
    }

    @Test func everyKindIsCovered() {
        #expect(Set(Self.bodies.map(\.kind)) == Set(EntryKind.allCases))
    }

    @Test func randomEntriesRoundTrip() throws {
        let seed = SeededRandom.seed(default: 20_261_122)
        var generator = RandomEntries(seed: seed)
        for _ in 0..<2_000 {
            let entry = generator.entry()
            let bytes = try EntryCodec.encode(entry)
            // The writer is sized from this: a wrong count would only cost
            // time, so it is checked here.
            #expect(EntryCodec.encodedSize(entry.body) == bytes.count, "seed \(seed)")
            let decoded = try EntryCodec.decode(bytes)
            #expect(decoded == entry, "seed \(seed)")
            #expect(try EntryCodec.encode(decoded) == bytes, "seed \(seed)")
        }
    }

    @Test func offsetMismatchIsReported() throws {
        let bytes = try EntryCodec.encode(Entry(offset: 5, timestamp: .init(rawValue: 1), body: .resync(reason: "x")))
        #expect(throws: FormatError.self) { try EntryCodec.decode(bytes, expectedOffset: 6) }
        do {
            _ = try EntryCodec.decode(bytes, expectedOffset: 6)
        } catch {
            #expect(error.code == .offsetMismatch)
            #expect(error.offset == 6)
            #expect(error.description.contains("offset 6"))
        }
    }

    @Test func oversizedBodyIsRefusedOnEncode() {
        let big = Value.bytes([UInt8](repeating: 7, count: Limits.entryBodyBytesMax))
        let entry = Entry(
            offset: 1, timestamp: .init(rawValue: 1),
            body: .intent(Intent(.create, idempotencyKey: "k", entityType: "t", entityID: "i", fields: ["b": big])))
        #expect(throws: FormatError.self) { try EntryCodec.encode(entry) }
    }

    /// `limits.md`, `entryBodyBytesMax`: a body of exactly 4,194,304 bytes
    /// is an entry of 4,194,332 bytes that encodes and decodes; one byte
    /// more is refused by the encoder with "length out of range" at 28, and
    /// by the decoder, checksum and all correct, at 4 (`storage.md` section
    /// 11, step 5).
    @Test func aBodyAtTheLimitRoundTripsAndOneByteMoreIsRefused() throws {
        func entry(blobBytes: Int) -> Entry {
            Entry(
                offset: 1, timestamp: .init(rawValue: 1),
                body: .intent(
                    Intent(
                        .create, idempotencyKey: "k", entityType: "t", entityID: "i",
                        fields: ["b": .bytes([UInt8](repeating: 7, count: blobBytes))])))
        }
        let overhead = try EntryCodec.encode(entry(blobBytes: 0)).count - EntryCodec.headerBytes
        let largest = entry(blobBytes: Limits.entryBodyBytesMax - overhead)
        let bytes = try EntryCodec.encode(largest)
        #expect(bytes.count == 4_194_332)
        #expect(try EntryCodec.decode(bytes, expectedOffset: 1) == largest)

        let error = #expect(throws: FormatError.self) { try EntryCodec.encode(entry(blobBytes: Limits.entryBodyBytesMax - overhead + 1)) }
        #expect(error?.code == .lengthOutOfRange && error?.position == 28, "\(String(describing: error))")

        // The same entry with one more byte in its last value, its length
        // and checksum made to match: only the limit is broken.
        func bigEndian(_ number: UInt32) -> ArraySlice<UInt8> { ArraySlice(withUnsafeBytes(of: number.bigEndian) { Array($0) }) }
        let blobBytes = Limits.entryBodyBytesMax - overhead + 1
        var longer = bytes + [7]
        longer[4..<8] = bigEndian(UInt32(Limits.entryBodyBytesMax + 1))
        // The blob is the body's last value: its length sits just before it.
        let blobStart = longer.count - blobBytes
        longer[(blobStart - 4)..<blobStart] = bigEndian(UInt32(blobBytes))
        longer[24..<28] = bigEndian(longer.withUnsafeBytes { EntryCodec.checksum(of: $0) })
        let decodeError = #expect(throws: FormatError.self) { try EntryCodec.decode(longer, expectedOffset: 1) }
        #expect(decodeError?.code == .lengthOutOfRange && decodeError?.position == 4, "\(String(describing: decodeError))")
    }

    @Test func nestingAtTheLimitRoundTripsAndPastItIsRefused() throws {
        func nested(_ depth: Int) -> Entry {
            var value = Value.null
            for level in 0..<depth { value = level % 2 == 0 ? .array([value]) : .object(["k": value]) }
            return Entry(
                offset: 1, timestamp: .init(rawValue: 1),
                body: .intent(Intent(.create, idempotencyKey: "k", entityType: "t", entityID: "i", fields: ["v": value])))
        }
        let deepest = nested(Limits.valueDepthMax)
        #expect(try EntryCodec.decode(EntryCodec.encode(deepest)) == deepest)
        let error = #expect(throws: FormatError.self) { try EntryCodec.encode(nested(Limits.valueDepthMax + 1)) }
        #expect(error?.code == .depthExceeded && error?.position == 28, "\(String(describing: error))")
    }

    /// A conflict carries two field sets, and the encoder bounds the depth
    /// of both (`storage.md` section 9, "Depth"): resolved fields nested past
    /// the limit are refused like server fields, so nothing is written that
    /// the decoder then refuses as "nesting too deep".
    @Test func aConflictsResolvedFieldsNestedPastTheLimitAreRefusedOnEncode() throws {
        var value = Value.null
        for _ in 0...Limits.valueDepthMax { value = .array([value]) }
        for (server, resolved) in [(["v": value], [:]), ([:], ["v": value])] as [(Fields, Fields)] {
            let entry = Entry(
                offset: 1, timestamp: .init(rawValue: 1),
                body: .conflict(
                    Conflict(
                        intentOffset: 1, entityType: "te", entityID: "te_1", serverVersion: 2, serverDeleted: false,
                        serverFields: server, resolution: .merged, resolvedFields: resolved)))
            let error = #expect(throws: FormatError.self) { try EntryCodec.encode(entry) }
            #expect(error?.code == .depthExceeded && error?.position == 28, "\(String(describing: error))")
        }
    }

    /// `count(ofEntryAt:)` is the header's 28 bytes plus its body length
    /// (`storage.md` section 5) when the bytes hold that many, exactly or
    /// with more after them; nil when they hold fewer.
    @Test func anEntrysCountIsItsHeaderPlusBodyLengthWhenTheBytesHoldIt() throws {
        let bytes = try EntryCodec.encode(Entry(offset: 3, timestamp: .init(rawValue: 1), body: .resync(reason: "why")))
        func count(_ bytes: [UInt8]) -> Int? { bytes.withUnsafeBytes { EntryCodec.count(ofEntryAt: $0) } }
        #expect(count(bytes) == bytes.count)
        #expect(count(bytes + [9, 9, 9]) == bytes.count)
        #expect(count(Array(bytes.dropLast())) == nil)
        #expect(count(Array(bytes.prefix(EntryCodec.headerBytes - 1))) == nil)
        #expect(count([]) == nil)
    }

    @Test func valueEqualityIsBitwise() {
        #expect(Value.double(.nan) == Value.double(.nan))
        #expect(Value.double(0.0) != Value.double(-0.0))
        #expect(Set([Value.double(.nan), .double(.nan)]).count == 1)
    }
}
