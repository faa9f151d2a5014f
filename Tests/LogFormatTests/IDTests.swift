import LogFormat
import LogTesting
import Synchronization
import Testing

@Suite struct IDTests {
    @Test func versionVariantAndTime() {
        let id = UUIDv7.Generator(clock: { 1_795_335_371_613 }).next()
        #expect(id.version == 7)
        #expect(id.low >> 62 == 0b10)
        #expect(id.milliseconds == 1_795_335_371_613)
    }

    @Test func monotonicWithinAMillisecondAndWhenTheClockStepsBack() {
        let times = Mutex<[UInt64]>([1000, 1000, 999, 1000] + Array(repeating: 1000, count: 5000))
        let generator = UUIDv7.Generator(clock: { times.withLock { $0.isEmpty ? 1000 : $0.removeFirst() } })
        var previous = generator.next()
        for _ in 0..<5000 {
            let next = generator.next()
            #expect(previous < next)
            previous = next
        }
        // 5000 IDs in one millisecond overflow the 12-bit counter: time moves on.
        #expect(previous.milliseconds > 1000)
    }

    @Test func monotonicAcrossThreads() async {
        let generator = UUIDv7.Generator()
        let batches = await withTaskGroup(of: [UUIDv7].self) { group in
            for _ in 0..<8 { group.addTask { (0..<2000).map { _ in generator.next() } } }
            var all: [[UUIDv7]] = []
            for await batch in group { all.append(batch) }
            return all
        }
        for batch in batches { #expect(batch == batch.sorted()) }
        #expect(Set(batches.joined()).count == 16_000)
    }

    @Test func textForms() throws {
        let id = UUIDv7(high: 0x0190_F0C8_A1B2_7C3D, low: 0x8E4F_5061_7283_9405)
        #expect(id.uuidString == "0190f0c8-a1b2-7c3d-8e4f-506172839405")
        #expect(UUIDv7(uuidString: id.uuidString) == id)
        #expect(id.ulidString.count == 26)
        #expect(UUIDv7(ulidString: id.ulidString) == id)
        #expect(UUIDv7(ulidString: id.ulidString.lowercased()) == id)
        #expect(UUIDv7(ulidString: "8ZZZZZZZZZZZZZZZZZZZZZZZZZ") == nil)  // over 128 bits
        #expect(UUIDv7(ulidString: "0123") == nil)
        #expect(UUIDv7(ulidString: "01J3Q4UUUUUUUUUUUUUUUUUUU!") == nil)
        // Known ULID: all ones after the top 3 bits.
        #expect(UUIDv7(ulidString: "7ZZZZZZZZZZZZZZZZZZZZZZZZZ") == UUIDv7(high: .max, low: .max))
        #expect(UUIDv7(high: 0, low: 0).ulidString == "00000000000000000000000000")
    }

    /// storage.md section 14: readers take lowercase, read I, i, L and l
    /// as 1 and O and o as 0, and refuse U, any other character, and a
    /// first character above 7.
    @Test func ulidReadersTakeCrockfordsAliases() {
        let canonical = UUIDv7(ulidString: "01J3Q4ZZ0000000000000000A1")
        #expect(canonical != nil)
        for alias in ["OIJ3Q4ZZ0000000000000000A1", "oij3q4zz000000000000000oa1", "0LJ3Q4ZZ0000000000000000AL", "0lJ3Q4ZZ0000000000000000Ai"] {
            #expect(UUIDv7(ulidString: alias) == canonical, "\(alias)")
        }
        #expect(UUIDv7(ulidString: "01J3Q4ZZ0000000000000000U1") == nil)
        #expect(UUIDv7(ulidString: "01J3Q4ZZ0000000000000000u1") == nil)
        #expect(UUIDv7(ulidString: "81J3Q4ZZ0000000000000000A1") == nil)
        #expect(UUIDv7(ulidString: "01J3Q4ZZ0000000000000000A") == nil)
    }

    @Test func ulidOrderMatchesIDOrder() {
        var random = SeededRandom(seed: 99)
        for _ in 0..<1000 {
            let a = UUIDv7(high: random.next(), low: random.next())
            let b = UUIDv7(high: random.next(), low: random.next())
            #expect((a < b) == (a.ulidString < b.ulidString))
        }
    }

    @Test func prefixedIDs() throws {
        let id = UUIDv7.Generator.shared.next()
        let prefixed = try #require(PrefixedID(prefix: "te", id: id))
        #expect(prefixed.description == "te_\(id.ulidString)")
        #expect(PrefixedID(prefixed.description) == prefixed)
        #expect(PrefixedID(prefix: "Te", id: id) == nil)
        #expect(PrefixedID(prefix: "", id: id) == nil)
        #expect(PrefixedID(prefix: "1te", id: id) == nil)
        #expect(PrefixedID("te_notanid") == nil)
        #expect(PrefixedID("no-separator") == nil)
    }
}

@Suite struct StrictParsingTests {
    @Test func uuidStringsMustBeCanonical() {
        #expect(UUIDv7(uuidString: "0190F0C8-A1B2-7C3D-8E4F-506172839405") != nil)
        #expect(UUIDv7(uuidString: "0190f0c8a1b2-7c3d-8e4f-506172839405-") == nil)
        #expect(UUIDv7(uuidString: "0190f0c8-a1b2-7c3d-8e4f-5061728394+5") == nil)
        #expect(UUIDv7(uuidString: "0190f0c8-a1b2-7c3d-8e4f-50617283940g") == nil)
    }

    @Test func canonicallyEquivalentNamesStayApart() {
        let composed = "\u{E9}"
        let decomposed = "e\u{301}"
        #expect(composed == decomposed)  // Swift's String equality
        #expect(Value.string(composed) != Value.string(decomposed))
        let fields = Fields([(composed, Value.int(1)), (decomposed, Value.int(2))])
        #expect(fields.count == 2)
        #expect(fields[composed] == 1 && fields[decomposed] == 2)
        #expect(Fields([(composed, Value.int(1))]) != Fields([(decomposed, Value.int(1))]))
    }

    /// storage.md section 10: the wall clock with a counter of 0 when that
    /// is greater, otherwise the previous timestamp plus 1, which carries
    /// from a counter of 0xFFFF into the milliseconds.
    @Test func theHybridClockTicksAsSection10Says() {
        let previous = HybridTimestamp(milliseconds: 1_000, logical: 7)
        #expect(previous.next(wallClockMilliseconds: 1_001) == HybridTimestamp(milliseconds: 1_001, logical: 0))
        #expect(previous.next(wallClockMilliseconds: 1_000) == HybridTimestamp(milliseconds: 1_000, logical: 8))
        #expect(previous.next(wallClockMilliseconds: 5) == HybridTimestamp(milliseconds: 1_000, logical: 8))
        let full = HybridTimestamp(milliseconds: 1_000, logical: 0xFFFF)
        #expect(full.next(wallClockMilliseconds: 1_000) == HybridTimestamp(milliseconds: 1_001, logical: 0))
        #expect(full.next(wallClockMilliseconds: 999) == HybridTimestamp(milliseconds: 1_001, logical: 0))
    }

    @Test func theHybridClockSaturatesInsteadOfTrapping() {
        #expect(HybridTimestamp(rawValue: .max).next(wallClockMilliseconds: 0) == HybridTimestamp(rawValue: .max))
    }
}
