/// Crockford's base32 for 128-bit values, as ULIDs use it: 26 characters,
/// the first carrying only 3 bits. Decoding accepts lowercase and the
/// documented aliases (I and L for 1, O for 0).
enum CrockfordBase32 {
    static let alphabet: [UInt8] = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)

    static func encode(high: UInt64, low: UInt64) -> String {
        var characters = [UInt8](repeating: 0, count: 26)
        var high = high
        var low = low
        // Peel off five bits at a time from the least significant end.
        for index in stride(from: 25, through: 0, by: -1) {
            characters[index] = alphabet[Int(low & 0x1F)]
            low = (low >> 5) | ((high & 0x1F) << 59)
            high >>= 5
        }
        return String(decoding: characters, as: UTF8.self)
    }

    static func decode(_ text: String) -> (high: UInt64, low: UInt64)? {
        let utf8 = Array(text.utf8)
        guard utf8.count == 26 else { return nil }
        var high: UInt64 = 0
        var low: UInt64 = 0
        for (index, character) in utf8.enumerated() {
            guard let digit = value(of: character) else { return nil }
            // The first character holds the top 3 bits of 128; larger overflows.
            if index == 0 && digit > 7 { return nil }
            high = (high << 5) | (low >> 59)
            low = (low << 5) | UInt64(digit)
        }
        return (high, low)
    }

    private static func value(of character: UInt8) -> UInt8? {
        switch character {
        case UInt8(ascii: "0"), UInt8(ascii: "O"), UInt8(ascii: "o"): return 0
        case UInt8(ascii: "1"), UInt8(ascii: "I"), UInt8(ascii: "i"), UInt8(ascii: "L"), UInt8(ascii: "l"): return 1
        default:
            let upper = character >= UInt8(ascii: "a") && character <= UInt8(ascii: "z") ? character - 32 : character
            return alphabet.firstIndex(of: upper).map { UInt8($0) }
        }
    }
}
