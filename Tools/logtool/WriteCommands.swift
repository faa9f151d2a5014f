import ArgumentParser
import Foundation
import LMDB
import LogFormat
import LogStore

struct Tail: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the last entries; with --follow, keep printing entries as other processes append them.")

    /// How often --follow looks for new entries.
    static let pollInterval = Duration.milliseconds(100)

    @OptionGroup var store: StoreOptions
    @Option(name: [.customShort("n"), .customLong("count")], help: "How many of the last entries.") var count = 10
    @Flag(help: "Keep running and print new entries (until interrupted).") var follow = false
    @Option(help: "With --follow, stop after this many seconds (0: never).") var seconds = 0.0

    func validate() throws {
        guard count >= 0, seconds >= 0 else { throw ValidationError("--count and --seconds must be 0 or more") }
    }

    func run() async throws {
        let log = try store.openLog()
        defer { log.close() }
        let last = try log.lastOffset()
        var next = last >= UInt64(count) ? last - UInt64(count) + 1 : 1
        next = try printEntries(log, from: next)
        guard follow else { return }
        let deadline = seconds > 0 ? ContinuousClock.now + .seconds(seconds) : nil
        // Bounded by --seconds, or by the user's interrupt.
        while deadline.map({ ContinuousClock.now < $0 }) ?? true {
            try await Task.sleep(for: Tail.pollInterval)
            next = try printEntries(log, from: next)
        }
    }

    /// Prints the entries from `offset` on; returns the next offset to read.
    private func printEntries(_ log: EventLog, from offset: UInt64) throws -> UInt64 {
        var scanner = log.entries(from: offset)
        var next = offset
        while let entry = try scanner.next() {
            try printEntry(entry, json: store.json)
            next = entry.offset + 1
        }
        fflushStandardOutput()
        return next
    }
}

struct Compact: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Fold the log below an offset into snapshots, or write a compacted copy of the store.",
        discussion: """
            --below N folds entries below N in place (pending intents and everything from N on stay, offsets \
            unchanged); --dry-run says what would go. An LMDB file never shrinks in place: --copy DIR writes a \
            copy without free pages and reports both sizes. Writing in place needs the store's writer lock: it \
            is refused while another process has the store open for writing.
            """)

    @OptionGroup var store: StoreOptions
    @Option(help: "Fold the log below this offset.") var below: UInt64?
    @Flag(help: "With --below: report what would go, change nothing.") var dryRun = false
    @Option(help: "Write a compacted copy of the store into this new directory.") var copy: String?

    func validate() throws {
        guard (below == nil) != (copy == nil) else { throw ValidationError("give one of --below or --copy") }
        if dryRun, below == nil { throw ValidationError("--dry-run goes with --below") }
    }

    func run() async throws {
        if let copy { return try writeCopy(to: copy) }
        guard let below else { return }
        let opened = try Store(path: store.path, options: .init(durability: .full))
        defer { opened.close() }
        let report = try await opened.compact(below: below, dryRun: dryRun)
        if store.json { return try Output.line(["watermark": report.watermark, "entries_before": UInt64(report.entriesBefore), "entries_removed": UInt64(report.entriesRemoved), "snapshots_written": UInt64(report.snapshotsWritten), "entries_kept": UInt64(report.entriesKept)]) }
        let verb = dryRun ? "would remove" : "removed"
        print("below #\(report.watermark): \(report.entriesBefore) entries; \(verb) \(report.entriesRemoved), wrote \(report.snapshotsWritten) snapshots, kept \(report.entriesKept)")
    }

    private func writeCopy(to destination: String) throws {
        guard !FileManager.default.fileExists(atPath: destination) else {
            throw LogToolError("\(destination) exists; --copy writes a new directory")
        }
        try FileManager.default.createDirectory(atPath: destination, withIntermediateDirectories: false)
        let log = try store.openLog()
        defer { log.close() }
        try log.copy(to: destination, compact: true)
        let size = { (directory: String) in
            (try? FileManager.default.attributesOfItem(atPath: directory + "/data.mdb")[.size] as? Int) ?? 0
        }
        let before = size(log.path)
        let after = size(destination)
        if store.json { return try Output.line(["bytes_before": before, "bytes_after": after]) }
        print("copied to \(destination): data.mdb \(before) bytes -> \(after) bytes")
    }
}

/// Flushes buffered output (all streams), so a pipe sees each entry at once.
func fflushStandardOutput() { fflush(nil) }
