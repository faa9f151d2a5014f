import LogFormat
@testable import LogStore
import Testing

/// The value of the `outbox` database, byte for byte (`Format/storage.md`,
/// section 15, "`outbox`").
@Suite struct OutboxStateTests {
    private func decode(_ bytes: [UInt8]) throws -> OutboxState {
        try bytes.withUnsafeBytes { try OutboxState(decoding: $0) }
    }

    /// The initial state is 17 bytes of zeros; the fields follow one another
    /// as the table lays them out: status, attempts, next attempt, last error.
    @Test func theLayoutIsTheSpecifiedOne() throws {
        #expect(OutboxState().encoded() == [UInt8](repeating: 0, count: 17))
        #expect(try decode([UInt8](repeating: 0, count: 17)) == OutboxState())
        var state = OutboxState()
        state.status = .failed
        state.attempts = 0x0A0B_0C0D
        state.nextAttemptAt = 0x0102_0304_0506_0708
        state.lastError = "\u{E9}"
        let bytes: [UInt8] = [0x01, 0x0A, 0x0B, 0x0C, 0x0D, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 2, 0xC3, 0xA9]
        #expect(state.encoded() == bytes)
        #expect(try decode(bytes) == state)
    }

    /// A damaged value is refused with the code and position the section
    /// names: a status other than 0 or 1 is "invalid tag" at 0, a value cut
    /// short "truncated", the last error is checked as a `string`, and bytes
    /// after it are "trailing bytes".
    @Test func aDamagedValueIsRefused() {
        let zeros = [UInt8](repeating: 0, count: 13)
        for (bytes, code, position) in [
            ([2] + [UInt8](repeating: 0, count: 16), .invalidTag, 0),
            ([UInt8](repeating: 0, count: 16), .truncated, 13),
            ([0, 0, 0, 0], .truncated, 1),
            (zeros + [0, 0, 0, 1], .lengthOutOfRange, 13),
            (zeros + [0, 0, 0, 1, 0xFF], .invalidUTF8, 13),
            ([UInt8](repeating: 0, count: 18), .trailingBytes, 17),
        ] as [([UInt8], FormatError.Code, Int)] {
            do {
                _ = try decode(bytes)
                Issue.record("decoded \(bytes)")
            } catch let error as FormatError {
                #expect(error.code == code && error.position == position, "\(bytes): \(error)")
            } catch {
                Issue.record("unexpected \(error)")
            }
        }
    }
}
