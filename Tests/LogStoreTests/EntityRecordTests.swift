import LogFormat
@testable import LogStore
import Testing

@Suite struct EntityRecordTests {
    private func roundTrip(_ record: EntityRecord) throws -> EntityRecord {
        try record.encoded().withUnsafeBytes { try EntityRecord(decoding: $0) }
    }

    @Test func recordsRoundTripWithTheBaseStoredOnceWhenShared() throws {
        var record = EntityRecord()
        record.baseVersion = 3
        record.base = ["done": false]
        record.visible = ["done": false]
        let shared = record.encoded()
        #expect(shared[1] == 0x07)
        #expect(try roundTrip(record) == record)
        record.visible = ["done": true]
        record.pending = [9]
        let separate = record.encoded()
        #expect(separate[1] == 0x03)
        #expect(separate.count > shared.count)
        #expect(try roundTrip(record) == record)
        // The worked example of Format/storage.md, section 15.
        #expect(separate == [
            0x01, 0x03, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9,
            0, 0, 0, 1, 0, 0, 0, 4, 0x64, 0x6f, 0x6e, 0x65, 0x02,
            0, 0, 0, 1, 0, 0, 0, 4, 0x64, 0x6f, 0x6e, 0x65, 0x01,
        ])
        let state = try separate.withUnsafeBytes { try EntityRecord.visibleState(decoding: $0) }
        #expect(state.visible == ["done": true] && state.baseVersion == 3 && state.pendingCount == 1)
    }

    @Test func tombstonesAndPendingOnlyRecordsRoundTrip() throws {
        var tombstone = EntityRecord()
        tombstone.baseVersion = 6
        #expect(try roundTrip(tombstone) == tombstone)
        var pendingOnly = EntityRecord()
        pendingOnly.visible = ["a": 1]
        pendingOnly.pending = [1, 4]
        #expect(try roundTrip(pendingOnly) == pendingOnly)
        var acked = pendingOnly
        acked.ackedVersion = 7
        let bytes = acked.encoded()
        #expect(bytes.count == pendingOnly.encoded().count + 8)
        #expect(bytes[1] & 0x08 != 0)
        #expect(try roundTrip(acked) == acked)
    }

    /// The other two examples of storage.md section 15: the record above
    /// with an acked version of 3 (flags `0b`, the acked version at 10 and
    /// everything after it 8 bytes further on, 56 bytes), and the entity once
    /// its update is acknowledged at 4 (flags `07`, 27 bytes).
    @Test func theWorkedExamplesWithAnAckedVersionAndSettled() throws {
        var record = EntityRecord()
        record.baseVersion = 3
        record.base = ["done": false]
        record.visible = ["done": true]
        record.pending = [9]
        let plain = record.encoded()
        record.ackedVersion = 3
        let acked = record.encoded()
        #expect(acked.count == 56)
        #expect(Array(acked[0..<18]) == [0x01, 0x0b, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 3])
        #expect(Array(acked[18...]) == Array(plain[10...]))
        #expect(try roundTrip(record) == record)

        var settled = EntityRecord()
        settled.baseVersion = 4
        settled.base = ["done": true]
        settled.visible = ["done": true]
        #expect(settled.encoded() == [
            0x01, 0x07, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0,
            0, 0, 0, 1, 0, 0, 0, 4, 0x64, 0x6f, 0x6e, 0x65, 0x02,
        ])
    }

    @Test func damagedRecordsAreRefused() {
        for (bytes, code, position) in [
            ([2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], .unsupportedVersion, 0),
            ([1, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], .invalidFlags, 1),  // shared without base and visible
            ([1, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], .invalidFlags, 1),
            ([1, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], .invalidFlags, 1),  // acked version 0
            ([1, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], .truncated, nil),
            ([1, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9], .lengthOutOfRange, nil),
            ([1, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7], .trailingBytes, nil),
            // Pending offsets 9 then 9, 9 then 8, and 0: not ascending (at 22).
            ([1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2] + [0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 9], .invalidField, 22),
            ([1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2] + [0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 8], .invalidField, 22),
            ([1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1] + [0, 0, 0, 0, 0, 0, 0, 0], .invalidField, 14),
        ] as [([UInt8], FormatError.Code, Int?)] {
            do {
                _ = try bytes.withUnsafeBytes { try EntityRecord(decoding: $0) }
                Issue.record("decoded \(bytes)")
            } catch let error as FormatError {
                #expect(error.code == code, "\(bytes)")
                if let position { #expect(error.position == position, "\(bytes)") }
            } catch {
                Issue.record("unexpected \(error)")
            }
        }
    }
}
