/// A deterministic random number generator (SplitMix64) for seeded tests:
/// the same seed gives the same sequence on every platform, so a failing
/// seed printed by a test replays exactly.
public struct SeededRandom: RandomNumberGenerator, Sendable {
    public private(set) var state: UInt64
    public let seed: UInt64

    public init(seed: UInt64) {
        self.seed = seed
        state = seed
    }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A seed from the environment variable `name` if set (to replay a
    /// failure), otherwise `fallback`.
    public static func seed(fromEnvironment name: String = "SEED", default fallback: UInt64) -> UInt64 {
        guard let text = getenvString(name), let seed = UInt64(text) else { return fallback }
        return seed
    }
}

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

private func getenvString(_ name: String) -> String? {
    guard let value = getenv(name) else { return nil }
    return String(cString: value)
}
