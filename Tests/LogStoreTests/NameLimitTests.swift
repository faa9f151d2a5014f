import LogFormat
import LogStore
import LogTesting
import Testing

/// The name limits of `Format/limits.md` at their exact bounds: the
/// largest name passes, one byte more is refused with "invalid argument"
/// and nothing is written. Lengths count UTF-8 bytes, not characters.
@Suite struct NameLimitTests {
    /// A 64-byte type.
    static let typeAtLimit = "t" + String(repeating: "a", count: Limits.entityTypeBytesMax - 1)
    /// A 256-byte ID of 128 characters of two bytes each.
    static let idAtLimit = String(repeating: "\u{E9}", count: Limits.entityIDBytesMax / 2)

    /// The store's API: an entity type of 64 bytes and an entity ID of 256
    /// bytes are taken, 65 and 257 are refused, in a create and in a
    /// pulled page, where one bad change keeps the page's good one out too.
    @Test func namesAtTheirLimitPassAndOneByteMoreIsRefused() async throws {
        var fixture = try StoreFixture("name-limits")
        let store = fixture.store
        try await store.create(type: Self.typeAtLimit, id: Self.idAtLimit, fields: ["n": 1])
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "te", entityID: Self.idAtLimit, serverVersion: 1)],
            cursor: "c1")
        let written = try store.log.lastOffset()
        #expect(written == 2)

        let tooLong = [(Self.typeAtLimit + "a", "x"), ("te", Self.idAtLimit + "a")]
        for (type, id) in tooLong {
            let created = await #expect(throws: LogStoreError.self) { try await store.create(type: type, id: id, fields: [:]) }
            #expect(created?.code == .invalidArgument, "\(type.utf8.count)/\(id.utf8.count): \(String(describing: created))")
            let page = [
                PulledChange(.upsert, entityType: "te", entityID: "good", serverVersion: 1),
                PulledChange(.upsert, entityType: type, entityID: id, serverVersion: 1),
            ]
            let pulled = await #expect(throws: LogStoreError.self) { try await store.applyPulledPage(page, cursor: "c2") }
            #expect(pulled?.code == .invalidArgument, "\(type.utf8.count)/\(id.utf8.count): \(String(describing: pulled))")
        }
        #expect(try store.log.lastOffset() == written)
        #expect(try store.get(type: "te", id: "good") == nil)
        try fixture.reopen()
        #expect(try fixture.store.get(type: Self.typeAtLimit, id: Self.idAtLimit)?.fields == ["n": 1])
    }

    /// limits.md: an entity created without an ID gets `type_ULID` when the
    /// type is also a valid ID prefix (1 to 16 lowercase letters and digits,
    /// starting with a letter), and the bare 26-character ULID otherwise.
    @Test func aMadeIDIsPrefixedOnlyWhenTheTypeIsAValidPrefix() async throws {
        let fixture = try StoreFixture("made-ids")
        let store = fixture.store
        let sixteen = String(repeating: "p", count: PrefixedID.prefixCountMax)
        for type in ["te", "t2", sixteen] {
            let id = try await store.create(type: type, fields: [:])
            #expect(PrefixedID(id)?.prefix == type, "\(type): \(id)")
        }
        for type in [sixteen + "p", "t.x", "t-x", "t_x"] {
            let id = try await store.create(type: type, fields: [:])
            #expect(id.utf8.count == 26 && UUIDv7(ulidString: id) != nil, "\(type): \(id)")
        }
    }

    /// Appends straight through `EventLog` are held to the same rules
    /// (`limits.md`, and `storage.md` section 13): an idempotency key of
    /// 256 bytes is taken; 257 bytes, or none, is refused before anything
    /// is written.
    @Test func anIdempotencyKeyAtTheLimitPassesAndOneByteMoreIsRefused() async throws {
        let directory = try TemporaryDirectory("idempotency-key-limit")
        defer { directory.remove() }
        let log = try EventLog(path: directory.path)
        defer { log.close() }
        func intent(key: String) -> EntryBody {
            .intent(Intent(.create, idempotencyKey: key, entityType: "te", entityID: "x", fields: [:]))
        }
        let keyAtLimit = String(repeating: "\u{E9}", count: Limits.idempotencyKeyBytesMax / 2)
        #expect(try await log.append(intent(key: keyAtLimit)) == 1)
        for key in [keyAtLimit + "a", ""] {
            let error = await #expect(throws: LogStoreError.self) { try await log.append(intent(key: key)) }
            #expect(error?.code == .invalidArgument, "\(key.utf8.count) bytes: \(String(describing: error))")
        }
        #expect(try log.lastOffset() == 1)
    }
}
