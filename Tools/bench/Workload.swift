import Foundation
import LogFormat

/// The entries every measurement writes, so each method moves the same bytes:
/// an `update` intent on a `task` entity whose only field, `payload`, holds
/// `payloadBytes` bytes. Keys and IDs come from a seeded generator, so runs
/// are repeatable and building them costs no system calls.
struct Workload: Sendable {
    /// Distinct payload contents; entries cycle through them.
    static let payloadVariantCount = 64
    /// Distinct entities the intents update, as an app's working set would.
    static let entityCount = 1024
    static let entityType = "task"
    static let fieldName = "payload"

    let payloadBytes: Int
    private let payloads: [[UInt8]]
    /// The same payloads as `Data`, for the SQLite row.
    let payloadData: [Data]
    private let entityIDs: [String]
    private let seed: UInt64
    /// The UUIDv7 millisecond stamp of every generated key (fixed, so keys
    /// depend only on the index).
    private let milliseconds: UInt64

    init(payloadBytes: Int, seed: UInt64 = 0x5EED_B0A7) {
        precondition(payloadBytes >= 0, "a payload cannot be negative")
        self.payloadBytes = payloadBytes
        self.seed = seed
        milliseconds = wallClockMilliseconds()
        var random = SplitMix64(seed: seed)
        payloads = (0..<Workload.payloadVariantCount).map { _ in
            (0..<payloadBytes).map { _ in UInt8(truncatingIfNeeded: random.next()) }
        }
        payloadData = payloads.map { Data($0) }
        let stamp = milliseconds
        entityIDs = (0..<Workload.entityCount).map { _ in
            let id = UUIDv7(high: stamp << 16 | 0x7000, low: 0x8000_0000_0000_0000 | random.next() >> 2)
            guard let prefixed = PrefixedID(prefix: Workload.entityType, id: id) else {
                preconditionFailure("\(Workload.entityType) is a valid ID prefix")
            }
            return prefixed.description
        }
    }

    /// The idempotency key of the entry with this index: a ULID, unique per index.
    func idempotencyKey(_ index: Int) -> String {
        var random = SplitMix64(seed: seed ^ UInt64(index) &* 0x9E37_79B9_7F4A_7C15)
        let high = (milliseconds + UInt64(index >> 12)) << 16 | 0x7000 | UInt64(index & 0xFFF)
        return UUIDv7(high: high, low: 0x8000_0000_0000_0000 | random.next() >> 2).ulidString
    }

    func entityID(_ index: Int) -> String { entityIDs[index % Workload.entityCount] }

    func payload(_ index: Int) -> [UInt8] { payloads[index % Workload.payloadVariantCount] }

    func body(_ index: Int) -> EntryBody {
        .intent(
            Intent(
                .update, idempotencyKey: idempotencyKey(index), entityType: Workload.entityType,
                entityID: entityID(index), baseVersion: UInt64(index),
                fields: [Workload.fieldName: .bytes(payload(index))]))
    }

    func bodies(_ range: Range<Int>) -> [EntryBody] { range.map(body) }

    /// The bytes the log stores for entry `index` at `offset`: the same codec,
    /// so the raw LMDB baseline writes values of exactly our size.
    func encodedEntry(index: Int, offset: UInt64) throws -> [UInt8] {
        try encode(body(index), offset: offset)
    }

    /// `EntryCodec.encode` of `body` at `offset`, as the log's writer does it.
    func encode(_ body: EntryBody, offset: UInt64) throws -> [UInt8] {
        let timestamp = HybridTimestamp(milliseconds: milliseconds, logical: UInt16(truncatingIfNeeded: offset))
        return try EntryCodec.encode(Entry(offset: offset, timestamp: timestamp, body: body))
    }

    /// Sizes for the report: the encoded body and the whole entry.
    func encodedSizes() throws -> (body: Int, entry: Int) {
        let entry = try encodedEntry(index: 0, offset: 1)
        return (entry.count - EntryCodec.headerBytes, entry.count)
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny seeded generator, good
/// enough for payload bytes and key bits.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var mixed = state
        mixed = (mixed ^ (mixed >> 30)) &* 0xBF58_476D_1CE4_E5B9
        mixed = (mixed ^ (mixed >> 27)) &* 0x94D0_49BB_1331_11EB
        return mixed ^ (mixed >> 31)
    }
}
