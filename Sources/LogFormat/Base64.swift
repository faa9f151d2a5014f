/// Base64 as `{"$bytes": s}` carries bytes (`Format/sync-protocol.md`
/// section 4): RFC 4648's standard alphabet, padded with `=`, in its one
/// canonical form.
///
/// Why not `Data(base64Encoded:)`: it reads texts that are not canonical,
/// such as `QR==` (non-zero pad bits, read as `QQ==`), `AA=A` and `AAE==`, so
/// two texts would stand for the same bytes and a round trip through JSON
/// would not be exact. RFC 4648 section 3.5 lets a decoder refuse such text;
/// the protocol requires it. Encoding stays with Foundation, whose
/// `base64EncodedString()` (without options) writes exactly this form.
enum Base64 {
    /// Why a text is not canonical base64, for a `WireDecodingError` detail.
    struct Problem: Error, CustomStringConvertible {
        var description: String
    }

    /// The bytes `text` stands for.
    /// - Throws: `Problem` when `text` is not canonical padded standard base64.
    static func decode(_ text: String) throws(Problem) -> [UInt8] {
        let characters = Array(text.utf8)
        guard characters.count % 4 == 0 else {
            throw Problem(description: "is \(characters.count) bytes long, not a multiple of 4 (padded base64)")
        }
        // Padding ends the last group only: "xx==" (one byte) or "xxx=" (two).
        // An `=` anywhere else is refused below as outside the alphabet.
        var padding = 0
        while padding < 2, padding < characters.count, characters[characters.count - 1 - padding] == UInt8(ascii: "=") {
            padding += 1
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(characters.count / 4 * 3)
        for start in stride(from: 0, to: characters.count, by: 4) {
            let groupPadding = start + 4 == characters.count ? padding : 0
            var group: UInt32 = 0
            for position in start..<(start + 4 - groupPadding) {
                let character = characters[position]
                guard let value = sextet(character) else {
                    throw Problem(description: "has \(describe(character)) at byte \(position), \(misplaced(character))")
                }
                group = group << 6 | UInt32(value)
            }
            group <<= 6 * UInt32(groupPadding)
            let byteCount = 3 - groupPadding
            // The bits past the last byte (the pad bits) are zero in the one
            // canonical text; any other value would alias it.
            guard group & (0xFF_FFFF >> (8 * UInt32(byteCount))) == 0 else {
                let last = start + 3 - groupPadding
                throw Problem(description: "has non-zero pad bits in \(describe(characters[last])) at byte \(last)")
            }
            for index in 0..<byteCount { bytes.append(UInt8(truncatingIfNeeded: group >> (16 - 8 * UInt32(index)))) }
        }
        assert(bytes.count == characters.count / 4 * 3 - padding)
        return bytes
    }

    /// The value of a character of the standard alphabet (`A-Z a-z 0-9 + /`).
    private static func sextet(_ character: UInt8) -> UInt8? {
        switch character {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): character - UInt8(ascii: "A")
        case UInt8(ascii: "a")...UInt8(ascii: "z"): character - UInt8(ascii: "a") + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): character - UInt8(ascii: "0") + 52
        case UInt8(ascii: "+"): 62
        case UInt8(ascii: "/"): 63
        default: nil
        }
    }

    private static func describe(_ character: UInt8) -> String {
        (0x21..<0x7F).contains(character) ? "'\(Character(Unicode.Scalar(character)))'" : "byte 0x\(String(character, radix: 16))"
    }

    private static func misplaced(_ character: UInt8) -> String {
        switch character {
        case UInt8(ascii: "="): "padding before the end"
        case UInt8(ascii: "-"), UInt8(ascii: "_"): "the URL-safe alphabet, not the standard one"
        default: "outside the standard base64 alphabet"
        }
    }
}
