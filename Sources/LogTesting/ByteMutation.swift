/// Damages `bytes` in one of the ways stored or sent bytes go wrong, chosen
/// by `random`: one to three bits flipped (twice as likely as the rest),
/// the end cut off, random bytes appended, a 4-byte big-endian number
/// somewhere rewritten with an extreme value (0, 1, 2^31 - 1, 2^32 - 1, the
/// bytes' own length, or `largeLength`: a length just past what a decoder
/// allows), or one byte replaced. `bytes` must not be empty.
public func mutate(_ bytes: inout [UInt8], using random: inout SeededRandom, largeLength: UInt32) {
    switch Int.random(in: 0...5, using: &random) {
    case 0, 1:
        for _ in 0..<Int.random(in: 1...3, using: &random) {
            let index = Int.random(in: 0..<bytes.count, using: &random)
            bytes[index] ^= UInt8(1) << UInt8.random(in: 0...7, using: &random)
        }
    case 2:
        bytes.removeLast(Int.random(in: 1...bytes.count, using: &random))
    case 3:
        bytes.append(contentsOf: (0..<Int.random(in: 1...8, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) })
    case 4:
        guard bytes.count >= 4 else { return }
        let index = Int.random(in: 0...(bytes.count - 4), using: &random)
        let extremes: [UInt32] = [0, 1, 0x7FFF_FFFF, 0xFFFF_FFFF, UInt32(bytes.count), largeLength]
        let value = extremes[Int.random(in: 0..<extremes.count, using: &random)]
        for byte in 0..<4 { bytes[index + byte] = UInt8(truncatingIfNeeded: value >> (24 - 8 * UInt32(byte))) }
    default:
        let index = Int.random(in: 0..<bytes.count, using: &random)
        bytes[index] = UInt8.random(in: 0...255, using: &random)
    }
}
