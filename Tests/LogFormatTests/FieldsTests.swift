import LogFormat
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

    @Test func mergingAppliesChanges() {
        let base: Fields = ["a": 1, "b": 2]
        #expect(base.merging(["b": 3, "c": 4]) == ["a": 1, "b": 3, "c": 4])
    }

    @Test func crc32cCheckValue() {
        #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
        #expect(CRC32C.checksum([]) == 0)
        // Continuing a checksum equals checksumming the concatenation.
        let whole = CRC32C.checksum(Array("hello, world".utf8))
        let split = CRC32C.checksum(Array(", world".utf8), continuing: CRC32C.checksum(Array("hello".utf8)))
        #expect(whole == split)
    }

    @Test func hybridTimestampsStrictlyIncrease() {
        var clock = HybridTimestamp(milliseconds: 1000, logical: 0)
        let next = clock.next(wallClockMilliseconds: 999)
        #expect(next > clock && next.milliseconds == 1000 && next.logical == 1)
        clock = next.next(wallClockMilliseconds: 2000)
        #expect(clock == HybridTimestamp(milliseconds: 2000, logical: 0))
    }
}
