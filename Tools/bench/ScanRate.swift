import Foundation
import LogFormat
import LogStore

/// Section 4: reading the whole log back. `EntryScanner` decodes every
/// entry (CRC32C included) and checks offsets are dense; the raw LMDB walks
/// beside it split that cost into the cursor, the checksum and the decode.
enum ScanBenchmark {
    static let rateTarget = 5_000_000.0

    static func title(_ entries: Int) -> String {
        "4. Full-log scan (\(Report.grouped(entries)) entries from section 3)"
    }

    static func run(_ settings: Settings, _ workspace: Workspace, storeName: String) async throws -> ReportSection {
        let path = workspace.path(storeName)
        let expected = settings.entries
        let passes = settings.scanPasses
        progress("scan")
        let best = try await onDedicatedThread("bench scan") { try measureAll(path: path, expected: expected, passes: passes) }
        var section = ReportSection(title(expected))
        func rate(_ duration: Duration) -> Double { Double(expected) / duration.seconds }
        section.rows = [
            ResultRow(
                "EntryScanner.next (decode + CRC32C + gap check)", rate(best.scanner), "entries/s",
                target: .atLeast(rateTarget, "entries/s")),
            ResultRow("raw LMDB cursor walk, no decode", rate(best.walk), "entries/s"),
            ResultRow("raw walk + CRC32C of each entry", rate(best.checksum), "entries/s"),
            ResultRow("raw walk + EntryCodec.decode", rate(best.decode), "entries/s"),
        ]
        section.notes = [
            "best of \(passes) pass(es) each, page cache warm (the log was just written); "
                + "each pass opens the store afresh (EventLog, or LMDB read-only).",
            String(
                format: "per entry: scanner %.0f ns = walk %.0f + CRC %.0f + rest of decode %.0f + scanner %.0f",
                nanosecondsPerEntry(best.scanner, expected), nanosecondsPerEntry(best.walk, expected),
                nanosecondsPerEntry(best.checksum - best.walk, expected),
                nanosecondsPerEntry(best.decode - best.checksum, expected),
                nanosecondsPerEntry(best.scanner - best.decode, expected)),
        ]
        return section
    }

    private static func nanosecondsPerEntry(_ duration: Duration, _ count: Int) -> Double {
        Double(duration.nanoseconds) / Double(count)
    }

    struct Best: Sendable {
        var scanner: Duration = .seconds(Int64.max)
        var walk: Duration = .seconds(Int64.max)
        var checksum: Duration = .seconds(Int64.max)
        var decode: Duration = .seconds(Int64.max)
    }

    private static func measureAll(path: String, expected: Int, passes: Int) throws -> Best {
        var best = Best()
        for _ in 0..<passes {
            best.scanner = min(best.scanner, try scanWithScanner(path: path, expected: expected))
            let raw = try RawLMDBLog(path: path, readOnly: true)
            defer { raw.close() }
            var bytes = 0
            best.walk = min(best.walk, try timedWalk(raw, expected: expected) { _, value in bytes &+= value.count })
            var crc: UInt32 = 0
            best.checksum = min(
                best.checksum, try timedWalk(raw, expected: expected) { _, value in crc ^= EntryCodec.checksum(of: value) })
            var offsets: UInt64 = 0
            best.decode = min(
                best.decode,
                try timedWalk(raw, expected: expected) { key, value in
                    let offset = UInt64(bigEndian: key.loadUnaligned(as: UInt64.self))
                    offsets &+= try EntryCodec.decode(value, expectedOffset: offset).offset
                })
            // Using the accumulated values keeps the optimizer from dropping the work.
            guard bytes > 0, offsets == UInt64(expected) * UInt64(expected + 1) / 2 else {
                throw BenchError("raw walk read \(bytes) bytes, offset sum \(offsets) (crc \(crc))")
            }
        }
        return best
    }

    private static func scanWithScanner(path: String, expected: Int) throws -> Duration {
        let log = try EventLog(path: path, options: .inspecting)
        defer { log.close() }
        var count = 0
        var offsets: UInt64 = 0
        let elapsed = try timed {
            var scanner = log.entries(from: 1)
            while let entry = try scanner.next() {
                count += 1
                offsets &+= entry.offset
            }
        }
        guard count == expected, offsets == UInt64(expected) * UInt64(expected + 1) / 2 else {
            throw BenchError("EntryScanner read \(count) entries, expected \(expected)")
        }
        return elapsed
    }

    private static func timedWalk(
        _ raw: RawLMDBLog, expected: Int, _ visit: (UnsafeRawBufferPointer, UnsafeRawBufferPointer) throws -> Void
    ) throws -> Duration {
        var count = 0
        let elapsed = try timed { count = try raw.walk(visit) }
        guard count == expected else { throw BenchError("raw walk read \(count) entries, expected \(expected)") }
        return elapsed
    }
}
