import LogFormat

/// The fields a workload writes, made from a key alone: the parent, told
/// only the key, knows every byte a write must have and so tells an intact
/// write from a damaged one.
enum Payload {
    /// The longest padding a payload carries; sizes vary so that entries
    /// straddle LMDB pages in many ways.
    static let paddingBytesMax = 700

    static func fields(key: String) -> Fields {
        let hash = fnv1a(key)
        let padding = String(repeating: Character(UnicodeScalar(UInt8(97 + hash % 26))), count: Int(hash % UInt64(paddingBytesMax)))
        return ["key": .string(key), "hash": .int(Int64(bitPattern: hash)), "padding": .string(padding)]
    }

    /// FNV-1a, 64 bits: the same in every process (Swift's `Hasher` is
    /// seeded per process, so it cannot be used across the pipe).
    static func fnv1a(_ text: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in text.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x100_0000_01b3
        }
        return hash
    }
}
