import LogFormat
import LogTesting
import Testing

@Suite struct ByteIOTests {
    /// Thousands of writes of every kind, from a writer that starts with no
    /// room, so it grows many times and writes land across every boundary:
    /// the bytes are those an array built one by one, and a reader gets the
    /// values back.
    @Test(arguments: [0, 1, 5, 64])
    func writesMatchTheirBytesAcrossGrowth(capacity: Int) throws {
        var random = SeededRandom(seed: 0xB17E + UInt64(capacity))
        var writer = ByteWriter(capacity: capacity)
        var expected: [UInt8] = []
        func bigEndian<T: FixedWidthInteger>(_ value: T) -> [UInt8] { withUnsafeBytes(of: value.bigEndian) { Array($0) } }
        enum Written { case byte(UInt8), u16(UInt16), u32(UInt32), u64(UInt64), string(String), data([UInt8]) }
        var written: [Written] = []
        for _ in 0..<5_000 {
            switch random.next() % 6 {
            case 0:
                let value = UInt8(truncatingIfNeeded: random.next())
                writer.write(value)
                expected.append(value)
                written.append(.byte(value))
            case 1:
                let value = UInt16(truncatingIfNeeded: random.next())
                writer.write(bigEndian: value)
                expected += bigEndian(value)
                written.append(.u16(value))
            case 2:
                let value = UInt32(truncatingIfNeeded: random.next())
                writer.write(bigEndian: value)
                expected += bigEndian(value)
                written.append(.u32(value))
            case 3:
                let value = random.next()
                writer.write(bigEndian: value)
                expected += bigEndian(value)
                written.append(.u64(value))
            case 4:
                let string = String(repeating: "é-", count: Int(random.next() % 40))
                writer.write(lengthPrefixed: string)
                expected += bigEndian(UInt32(string.utf8.count)) + Array(string.utf8)
                written.append(.string(string))
            default:
                let data = (0..<random.next() % 300).map { UInt8(truncatingIfNeeded: $0 &* 7) }
                writer.write(lengthPrefixed: data)
                expected += bigEndian(UInt32(data.count)) + data
                written.append(.data(data))
            }
        }
        #expect(writer.count == expected.count)
        #expect(writer.bytes == expected)
        #expect(writer.withUnsafeBytes { Array($0) } == expected)

        let bytes = writer.bytes
        try bytes.withUnsafeBytes { (buffer: UnsafeRawBufferPointer) throws in
            var reader = ByteReader(buffer)
            for value in written {
                switch value {
                case .byte(let byte): #expect(try reader.readByte("byte") == byte)
                case .u16(let number): #expect(try reader.read(UInt16.self, "u16") == number)
                case .u32(let number): #expect(try reader.read(UInt32.self, "u32") == number)
                case .u64(let number): #expect(try reader.read(UInt64.self, "u64") == number)
                case .string(let string): #expect(try reader.readString("string") == string)
                case .data(let data): #expect(try reader.readBytes("data") == data)
                }
            }
            #expect(reader.remaining == 0)
        }
    }

    /// A patch overwrites four bytes in place, at the start, in the middle
    /// and at the very end, and changes nothing else.
    @Test func patchOverwritesFourBytesInPlace() {
        var writer = ByteWriter()
        for byte in 0..<20 as Range<UInt8> { writer.write(byte) }
        writer.patch(bigEndian: 0xA1A2_A3A4, at: 0)
        writer.patch(bigEndian: 0xB1B2_B3B4, at: 9)
        writer.patch(bigEndian: 0xC1C2_C3C4, at: 16)
        var expected = Array(0..<20 as Range<UInt8>)
        expected.replaceSubrange(0..<4, with: [0xA1, 0xA2, 0xA3, 0xA4])
        expected.replaceSubrange(9..<13, with: [0xB1, 0xB2, 0xB3, 0xB4])
        expected.replaceSubrange(16..<20, with: [0xC1, 0xC2, 0xC3, 0xC4])
        #expect(writer.bytes == expected)
        #expect(writer.count == 20)
    }
}
