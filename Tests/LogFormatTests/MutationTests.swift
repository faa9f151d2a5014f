import LogFormat
import LogTesting
import Testing

/// Damaged bytes must decode to a value or a thrown `FormatError`, never a
/// crash: bit flips, truncation, extension, and rewritten length fields.
@Suite struct MutationTests {
    static let mutationCount = 12_000

    @Test func seededMutationsNeverCrash() throws {
        let seed = SeededRandom.seed(default: 7_700_417)
        var generator = RandomEntries(seed: seed)
        var outcomes = (decoded: 0, rejected: 0)
        var codes: Set<String> = []
        for round in 0..<Self.mutationCount {
            let entry = generator.entry(offset: UInt64(round + 1))
            var bytes = try EntryCodec.encode(entry)
            mutate(&bytes, using: &generator.random, largeLength: UInt32(Limits.entryBodyBytesMax + 1))
            do {
                let decoded = try EntryCodec.decode(bytes)
                // Anything that decodes must be a canonical encoding.
                #expect(try EntryCodec.encode(decoded) == bytes, "seed \(seed) round \(round)")
                outcomes.decoded += 1
            } catch {
                #expect(error.position >= 0 && error.position <= bytes.count, "seed \(seed) round \(round)")
                codes.insert(error.code.name)
                outcomes.rejected += 1
            }
        }
        #expect(outcomes.decoded + outcomes.rejected == Self.mutationCount)
        // The checksum catches nearly everything; the point is that nothing traps.
        #expect(codes.contains("bad checksum"))
        #expect(codes.contains("truncated"))
    }

    /// Mutations with the checksum recomputed afterwards, so the body parser
    /// itself meets hostile lengths, tags and counts.
    @Test func mutationsBehindAValidChecksumNeverCrash() throws {
        let seed = SeededRandom.seed(default: 4_242)
        var generator = RandomEntries(seed: seed)
        var codes: Set<String> = []
        for round in 0..<Self.mutationCount {
            let entry = generator.entry(offset: UInt64(round + 1))
            var bytes = try EntryCodec.encode(entry)
            mutate(&bytes, using: &generator.random, largeLength: UInt32(Limits.entryBodyBytesMax + 1))
            if bytes.count >= EntryCodec.headerBytes {
                let bodyCount = UInt32(bytes.count - EntryCodec.headerBytes)
                if generator.int(0...3) > 0 { patch(&bytes, bodyCount, at: 4) }
                let checksum = bytes.withUnsafeBytes { EntryCodec.checksum(of: $0) }
                patch(&bytes, checksum, at: 24)
            }
            do {
                let decoded = try EntryCodec.decode(bytes)
                #expect(try EntryCodec.encode(decoded) == bytes, "seed \(seed) round \(round)")
            } catch {
                codes.insert(error.code.name)
            }
        }
        #expect(codes.count >= 4, "only \(codes) seen")
    }

    private func patch(_ bytes: inout [UInt8], _ value: UInt32, at index: Int) {
        for i in 0..<4 { bytes[index + i] = UInt8(truncatingIfNeeded: value >> (24 - 8 * UInt32(i))) }
    }
}
