/// A hybrid logical clock reading: milliseconds since the Unix epoch in the
/// high 48 bits and a logical counter in the low 16. Readings from one store
/// strictly increase even when the wall clock stalls or steps back.
public struct HybridTimestamp: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var rawValue: UInt64

    public init(rawValue: UInt64) { self.rawValue = rawValue }

    public init(milliseconds: UInt64, logical: UInt16) {
        precondition(milliseconds < 1 << 48, "milliseconds past the 48-bit range")
        rawValue = milliseconds << 16 | UInt64(logical)
    }

    /// Milliseconds since 1970-01-01T00:00:00Z.
    public var milliseconds: UInt64 { rawValue >> 16 }
    public var logical: UInt16 { UInt16(truncatingIfNeeded: rawValue) }

    /// The next reading after `self` given a wall clock reading in milliseconds:
    /// the wall clock if it moved ahead, otherwise one logical tick. At the
    /// end of the range (the year 10889, or a damaged entry) it stays there
    /// rather than wrap.
    public func next(wallClockMilliseconds: UInt64) -> HybridTimestamp {
        let candidate = HybridTimestamp(milliseconds: min(wallClockMilliseconds, (1 << 48) - 1), logical: 0)
        return candidate > self ? candidate : HybridTimestamp(rawValue: rawValue == .max ? .max : rawValue + 1)
    }

    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }

    public var description: String { "\(milliseconds).\(logical)" }
}
