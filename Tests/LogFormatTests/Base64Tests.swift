import Foundation
import LogFormat
import LogTesting
import Testing

/// `{"$bytes": s}` (`Format/sync-protocol.md` section 4): standard base64,
/// padded, in its one canonical form, so that a byte string has exactly one
/// spelling and a round trip through JSON is exact.
@Suite struct Base64Tests {
    /// The byte string `text` stands for in `{"raw": {"$bytes": text}}`, or
    /// the path of the error.
    private func read(_ text: String) -> Result<[UInt8], WireDecodingError> {
        do throws(WireDecodingError) {
            let fields = try Fields(json: .object([("raw", .object([("$bytes", .string(text))]))]))
            guard case .bytes(let bytes)? = fields["raw"] else { return .failure(WireDecodingError("", "not bytes")) }
            return .success(bytes)
        } catch {
            return .failure(error)
        }
    }

    @Test func canonicalTextsRead() throws {
        let alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        for (text, bytes) in [("", []), ("QQ==", [0x41]), ("AAE=", [0, 1]), ("AAEC", [0, 1, 2]), ("+/+/", [0xFB, 0xFF, 0xBF])]
            as [(String, [UInt8])]
        {
            #expect(try read(text).get() == bytes, "\(text)")
        }
        #expect(try read(alphabet).get() == [UInt8](Data(base64Encoded: alphabet)!))
    }

    /// RFC 4648 section 3.5 lets a decoder refuse non-zero pad bits; the
    /// protocol requires it, and refuses every other spelling too.
    @Test func everyOtherSpellingIsRefusedNamingItsMember() {
        let refused = [
            "QR==", "QQ=", "AAF=", "AAE", "QQ", "Q", "A===", "====", "AA=A", "AA==AA==", "AAE==", "AAECAAE",
            " AAEC", "AAEC\n", "AA\r\nEC", "AA-_", "AA_=", "AAé=", "AA\u{0}=",
        ]
        for text in refused {
            switch read(text) {
            case .success(let bytes): Issue.record("\(text.debugDescription) read as \(bytes)")
            case .failure(let error): #expect(error.path == "raw.$bytes", "\(text.debugDescription): \(error)")
            }
            // The `Codable` form refuses it as well.
            let json = Data(#"{"$bytes": \#(String(decoding: try! JSONEncoder().encode(text), as: UTF8.self))}"#.utf8)
            #expect(throws: DecodingError.self, "\(text.debugDescription)") { try JSONDecoder().decode(Value.self, from: json) }
        }
    }

    /// An error says what is wrong and where, for the per-operation message.
    @Test func problemsAreNamedWithTheirPosition() {
        let expected = [
            ("QR==", "raw.$bytes: has non-zero pad bits in 'R' at byte 1"),
            ("AAF=", "raw.$bytes: has non-zero pad bits in 'F' at byte 2"),
            ("QQ", "raw.$bytes: is 2 bytes long, not a multiple of 4 (padded base64)"),
            ("AA==AA==", "raw.$bytes: has '=' at byte 2, padding before the end"),
            ("A===", "raw.$bytes: has '=' at byte 1, padding before the end"),
            ("AA\nA", "raw.$bytes: has byte 0xa at byte 2, outside the standard base64 alphabet"),
            ("AA-_", "raw.$bytes: has '-' at byte 2, the URL-safe alphabet, not the standard one"),
        ]
        for (text, message) in expected {
            guard case .failure(let error) = read(text) else {
                Issue.record("\(text.debugDescription) was read")
                continue
            }
            #expect(error.description == message)
        }
    }

    /// The pad bits live in the last character before the padding: of the
    /// 64 characters that can stand there, exactly the ones whose pad bits
    /// are zero read, and they are the ones the encoder writes.
    @Test func eachByteStringHasExactlyOneSpelling() {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
        var readCount = [0, 0]
        for second in alphabet {
            for (index, text) in ["Q\(second)==", "AQ\(second)="].enumerated() {
                guard let bytes = try? read(text).get() else { continue }
                readCount[index] += 1
                #expect(Data(bytes).base64EncodedString() == text)
            }
        }
        // One byte leaves 4 pad bits (4 of 64 characters fit), two bytes leave 2 (16 of 64).
        #expect(readCount == [4, 16])
    }

    /// What the writers put in `$bytes` is canonical: it reads back, and the
    /// reader takes nothing else.
    @Test func writersWriteOnlyCanonicalBase64() throws {
        let seed = SeededRandom.seed(default: 64)
        var random = SeededRandom(seed: seed)
        for length in 0..<100 {
            let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &random) }
            var writer = JSONWriter()
            try Value.bytes(bytes).writeJSON(to: &writer)
            let written = try JSONReader.parse(writer.bytes)
            #expect(writer.bytes == Array(try Wire.makeEncoder().encode(Value.bytes(bytes))), "seed \(seed)")
            guard case .string(let text)? = written["$bytes"] else {
                Issue.record("seed \(seed): \(String(decoding: writer.bytes, as: UTF8.self))")
                continue
            }
            #expect(text.utf8.count == (length + 2) / 3 * 4, "seed \(seed) length \(length)")
            #expect(try read(text).get() == bytes, "seed \(seed) length \(length): \(text)")
        }
    }
}
