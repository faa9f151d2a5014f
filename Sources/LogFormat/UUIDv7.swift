import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A time-ordered 128-bit identifier (RFC 9562, version 7): 48 bits of Unix
/// milliseconds, the version and variant bits, and 74 bits that are a
/// counter and randomness. IDs made by one process strictly increase.
///
/// Text forms: the canonical UUID string (`0190f0c8-...`), the 26-character
/// ULID form in Crockford base32 (`01J3...`), and the ULID form behind an
/// entity-type prefix (`te_01J3...`), as `PrefixedID` renders it.
public struct UUIDv7: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The 16 bytes, most significant first; byte order is sort order.
    public let high: UInt64
    public let low: UInt64

    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == 16 else { return nil }
        var high: UInt64 = 0
        var low: UInt64 = 0
        for (index, byte) in bytes.enumerated() {
            if index < 8 { high = high << 8 | UInt64(byte) } else { low = low << 8 | UInt64(byte) }
        }
        self.init(high: high, low: low)
    }

    public var bytes: [UInt8] {
        var writer = ByteWriter(capacity: 16)
        writer.write(bigEndian: high)
        writer.write(bigEndian: low)
        return writer.bytes
    }

    /// Unix milliseconds when the ID was made.
    public var milliseconds: UInt64 { high >> 16 }
    public var version: Int { Int((high >> 12) & 0xF) }

    public static func < (lhs: Self, rhs: Self) -> Bool { (lhs.high, lhs.low) < (rhs.high, rhs.low) }

    /// The canonical 8-4-4-4-12 lowercase hex form.
    public var uuidString: String {
        let digits = Array("0123456789abcdef".utf8)
        return String(unsafeUninitializedCapacity: 36) { buffer in
            var position = 0
            for nibble in 0..<32 {
                if nibble == 8 || nibble == 12 || nibble == 16 || nibble == 20 {
                    buffer[position] = UInt8(ascii: "-")
                    position += 1
                }
                let word = nibble < 16 ? high : low
                buffer[position] = digits[Int((word >> (60 - 4 * UInt64(nibble % 16))) & 0xF)]
                position += 1
            }
            return position
        }
    }

    /// Parses exactly the 8-4-4-4-12 form (hex digits of either case).
    public init?(uuidString: String) {
        let characters = Array(uuidString.utf8)
        guard characters.count == 36 else { return nil }
        var nibbles: [UInt8] = []
        for (index, character) in characters.enumerated() {
            if [8, 13, 18, 23].contains(index) {
                guard character == UInt8(ascii: "-") else { return nil }
                continue
            }
            switch character {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): nibbles.append(character - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): nibbles.append(character - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): nibbles.append(character - UInt8(ascii: "A") + 10)
            default: return nil
            }
        }
        self.init(bytes: stride(from: 0, to: 32, by: 2).map { nibbles[$0] << 4 | nibbles[$0 + 1] })
    }

    /// The 26-character ULID form (Crockford base32, uppercase).
    public var ulidString: String { CrockfordBase32.encode(high: high, low: low) }

    public init?(ulidString: String) {
        guard let (high, low) = CrockfordBase32.decode(ulidString) else { return nil }
        self.init(high: high, low: low)
    }

    public var description: String { ulidString }
}

extension UUIDv7 {
    /// Makes time-ordered IDs. Within one millisecond the 12-bit `rand_a`
    /// field is a counter (RFC 9562, section 6.2, method 1) that starts at a
    /// random value below 2048; when it runs out, or the clock steps back,
    /// the timestamp is advanced by one millisecond so order still holds.
    public final class Generator: Sendable {
        private struct State {
            var milliseconds: UInt64 = 0
            var counter: UInt64 = 0
        }

        private let state = Mutex(State())
        private let clock: @Sendable () -> UInt64
        private let random: (@Sendable () -> UInt64)?
        /// Random words drawn ahead, so an ID does not cost a system call.
        private let pool = Mutex(RandomPool())

        private struct RandomPool {
            static let countMax = 64
            var words: [UInt64] = []
        }

        /// - Parameters:
        ///   - clock: Unix milliseconds (injected for tests).
        ///   - random: 64 random bits per call (injected for tests); by default
        ///     the operating system's randomness, drawn 64 words at a time.
        public init(
            clock: @escaping @Sendable () -> UInt64 = wallClockMilliseconds,
            random: (@Sendable () -> UInt64)? = nil
        ) {
            self.clock = clock
            self.random = random
        }

        /// The process-wide generator.
        public static let shared = Generator()

        private func nextRandom() -> UInt64 {
            pool.withLock { pool in
                if pool.words.isEmpty {
                    pool.words = random.map { random in (0..<RandomPool.countMax).map { _ in random() } }
                        ?? systemRandomWords(RandomPool.countMax)
                }
                return pool.words.removeLast()
            }
        }

        public func next() -> UUIDv7 {
            let now = clock()
            let randomBits = nextRandom()
            // A separate draw seeds the counter, so it shares no bits with rand_b.
            let counterStart = nextRandom() >> 53  // 11 bits: room to count up
            let (milliseconds, counter) = state.withLock { state -> (UInt64, UInt64) in
                if now > state.milliseconds {
                    state.milliseconds = now
                    state.counter = counterStart
                } else if state.counter < 0xFFF {
                    state.counter += 1
                } else {
                    state.milliseconds += 1
                    state.counter = 0
                }
                return (state.milliseconds, state.counter)
            }
            let high = (milliseconds & 0xFFFF_FFFF_FFFF) << 16 | 0x7000 | counter
            let low = 0x8000_0000_0000_0000 | (randomBits & 0x3FFF_FFFF_FFFF_FFFF)
            return UUIDv7(high: high, low: low)
        }
    }
}

/// The current wall clock in Unix milliseconds.
@Sendable public func wallClockMilliseconds() -> UInt64 {
    UInt64(max(0, (Date().timeIntervalSince1970 * 1000).rounded(.down)))
}

/// `count` words of the operating system's randomness in one call where the
/// system offers one (getentropy, arc4random_buf).
func systemRandomWords(_ count: Int) -> [UInt64] {
    var words = [UInt64](repeating: 0, count: count)
    #if canImport(Glibc)
        // getentropy takes at most 256 bytes a call.
        let filled = words.withUnsafeMutableBytes { buffer -> Bool in
            stride(from: 0, to: buffer.count, by: 256).allSatisfy { offset in
                getentropy(buffer.baseAddress! + offset, min(256, buffer.count - offset)) == 0
            }
        }
        if filled { return words }
    #elseif canImport(Darwin)
        words.withUnsafeMutableBytes { arc4random_buf($0.baseAddress!, $0.count) }
        return words
    #endif
    var generator = SystemRandomNumberGenerator()
    return (0..<count).map { _ in generator.next() }
}
