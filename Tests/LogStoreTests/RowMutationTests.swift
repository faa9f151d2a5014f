import LogFormat
@testable import LogStore
import LogTesting
import Testing

/// The rows of the derived databases are bytes on disk, read back by
/// decoders the fuzzer (`Tools/fuzz`) cannot reach: it builds LogFormat
/// alone. Damaged rows, valid rows flipped, cut short, extended or with a
/// length rewritten, must decode to a value or throw `FormatError`, never
/// trap; what decodes must encode to a row that decodes to the same value.
@Suite struct RowMutationTests {
    static let mutationCount = 6_000

    @Test func damagedEntityRecordsDecodeOrThrow() throws {
        let seed = SeededRandom.seed(default: 15_485_863)
        var generator = RandomEntries(seed: seed)
        var outcomes = (decoded: 0, rejected: 0)
        for round in 0..<Self.mutationCount {
            var bytes = randomRecord(&generator).encoded()
            mutate(&bytes, using: &generator.random, largeLength: 0x2000_0000)
            let full = decode(bytes) { raw throws(FormatError) in try EntityRecord(decoding: raw) }
            // The partial reads of `get` and of a push batch decode less, so
            // they may pass where the full read does not; never the reverse.
            let visible = decode(bytes) { raw throws(FormatError) in try EntityRecord.visibleState(decoding: raw) }
            let acked = decode(bytes) { raw throws(FormatError) in try EntityRecord.ackedVersion(decoding: raw) }
            switch full {
            case .success(let record):
                outcomes.decoded += 1
                let again = try record.encoded().withUnsafeBytes { try EntityRecord(decoding: $0) }
                #expect(again == record, "seed \(seed) round \(round)")
                let state = try visible.get()
                #expect(state.visible == record.visible && state.baseVersion == record.baseVersion, "seed \(seed) round \(round)")
                let ackedVersion = try acked.get()
                #expect(state.pendingCount == record.pending.count && ackedVersion == record.ackedVersion, "seed \(seed) round \(round)")
            case .failure(let error):
                outcomes.rejected += 1
                #expect(error.position >= 0 && error.position <= bytes.count, "seed \(seed) round \(round): \(error)")
            }
        }
        #expect(outcomes.decoded > 0 && outcomes.rejected > 0, "\(outcomes)")
    }

    @Test func damagedOutboxStatesDecodeOrThrow() throws {
        let seed = SeededRandom.seed(default: 32_452_843)
        var generator = RandomEntries(seed: seed)
        var outcomes = (decoded: 0, rejected: 0)
        for round in 0..<Self.mutationCount {
            var state = OutboxState()
            state.status = generator.int(0...1) == 0 ? .pending : .failed
            state.attempts = UInt32.random(in: 0...UInt32.max, using: &generator.random)
            state.nextAttemptAt = generator.random.next()
            state.lastError = generator.string(maxLength: 40)
            var bytes = state.encoded()
            mutate(&bytes, using: &generator.random, largeLength: 0x2000_0000)
            switch decode(bytes, { raw throws(FormatError) in try OutboxState(decoding: raw) }) {
            case .success(let decoded):
                // The layout has one form per state: what decodes is canonical.
                #expect(decoded.encoded() == bytes, "seed \(seed) round \(round)")
                outcomes.decoded += 1
            case .failure(let error):
                #expect(error.position >= 0 && error.position <= bytes.count, "seed \(seed) round \(round): \(error)")
                outcomes.rejected += 1
            }
        }
        #expect(outcomes.decoded > 0 && outcomes.rejected > 0, "\(outcomes)")
    }

    private func decode<T>(_ bytes: [UInt8], _ body: (UnsafeRawBufferPointer) throws(FormatError) -> T) -> Result<T, FormatError> {
        bytes.withUnsafeBytes { raw in Result { () throws(FormatError) in try body(raw) } }
    }

    /// A record as the projections write them: a base or none (a tombstone
    /// keeps its version), visible fields or none, pending offsets ascending.
    private func randomRecord(_ generator: inout RandomEntries) -> EntityRecord {
        var record = EntityRecord()
        if generator.int(0...3) > 0 {
            record.baseVersion = UInt64(generator.int(1...1_000_000))
            if generator.int(0...3) > 0 { record.base = generator.fields(countMax: 3) }
        }
        var offset: UInt64 = 0
        for _ in 0..<generator.int(0...3) {
            offset += UInt64(generator.int(1...1_000))
            record.pending.append(offset)
        }
        if !record.pending.isEmpty, generator.int(0...1) == 1 { record.ackedVersion = UInt64(generator.int(1...1_000_000)) }
        record.visible = record.pending.isEmpty ? record.base : (generator.int(0...4) > 0 ? generator.fields(countMax: 3) : nil)
        return record
    }
}
