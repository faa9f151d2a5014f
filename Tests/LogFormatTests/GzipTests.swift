import Foundation
import LogFormat
import LogTesting
import Testing

/// `Gzip` against the system's `gzip` tool, and at its limits.
@Suite struct GzipTests {
    static let text = Data((0..<2_000).map { "entry \($0): a task, not done\n" }.joined().utf8)

    @Test func whatItCompressesTheGzipToolInflates() throws {
        for level: Int32 in [-1, 1, 9] {
            let gzipped = try #require(Gzip.compress(Self.text, level: level))
            #expect(try GzipTool.decompress(gzipped) == Self.text, "level \(level)")
            #expect(gzipped.count * 5 < Self.text.count, "level \(level): \(gzipped.count) of \(Self.text.count) bytes")
            #expect(try Gzip.decompress(gzipped, bytesMax: Self.text.count) == Self.text)
        }
        let empty = try #require(Gzip.compress(Data()))
        #expect(try GzipTool.decompress(empty).isEmpty && Gzip.decompress(empty, bytesMax: 0).isEmpty)
    }

    /// Exactly `bytesMax` inflates; one byte more is `.tooLarge`, however
    /// little it takes in gzip.
    @Test func theLimitIsExact() throws {
        let gzipped = try #require(Gzip.compress(Self.text))
        #expect(try Gzip.decompress(gzipped, bytesMax: Self.text.count).count == Self.text.count)
        #expect(throws: Gzip.Failure.tooLarge) { try Gzip.decompress(gzipped, bytesMax: Self.text.count - 1) }
        let zeros = try #require(Gzip.compress(Data(count: 64 << 20)))
        #expect(zeros.count < 100_000)
        #expect(throws: Gzip.Failure.tooLarge) { try Gzip.decompress(zeros, bytesMax: 4 << 20) }
    }

    /// Anything but one whole stream is refused: empty, cut short at any
    /// length, a changed byte (its checksum), bytes after the end, not gzip.
    @Test func onlyOneWholeStreamInflates() throws {
        let gzipped = try #require(Gzip.compress(Self.text))
        var refused: [Data] = [Data(), Self.text, gzipped + Data([0]), gzipped + gzipped]
        refused += stride(from: 0, to: gzipped.count, by: max(1, gzipped.count / 40)).map { gzipped.prefix($0) }
        var changed = gzipped
        changed[changed.count - 6] ^= 0x01  // the CRC-32 in the trailer
        refused.append(changed)
        for data in refused {
            #expect(throws: Gzip.Failure.self, "\(data.count) bytes") { try Gzip.decompress(data, bytesMax: 1 << 20) }
        }
    }
}
