import ArgumentParser
import Foundation
import LMDB
import LogFormat
import LogStore
import ToolSupport

struct Tail: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the last entries; with --follow, keep printing entries as other processes append them.")

    /// How often --follow looks for new entries.
    static let pollInterval = Duration.milliseconds(100)
    /// The longest --seconds (about 31 years): a `Duration` holds at most
    /// about 1.7e20 s, and a deadline past it trapped. 0 is for "never".
    static let secondsMax = 1e9

    @OptionGroup var store: StoreOptions
    @Option(name: [.customShort("n"), .customLong("count")], parsing: .unconditional, help: "How many of the last entries.") var count = 10
    @Flag(help: "Keep running and print new entries (until interrupted).") var follow = false
    /// Nil when not given, so that one given without --follow, which it
    /// would not bound, is refused, not ignored.
    @Option(parsing: .unconditional, help: "With --follow, stop after this many seconds (0: never).") var seconds: Double?

    func validate() throws {
        guard count >= 0 else { throw ValidationError("--count must be 0 or more") }
        guard let seconds else { return }
        guard follow else { throw ValidationError("--seconds goes with --follow") }
        guard seconds >= 0, seconds <= Tail.secondsMax else {
            throw ValidationError("--seconds must be from 0 (never stop) to \(Int(Tail.secondsMax))")
        }
    }

    func run() async throws {
        let log = try store.openLog()
        defer { log.close() }
        // -n 0 at the last offset there is: nothing to print, nothing to follow.
        guard let first = try log.startOfLast(count) else { return }
        var following = try printEntries(log, from: first)
        guard follow else { return }
        // The file at the path is the one followed: a store removed or made
        // anew there (an app that resets its store) ends the follow, where
        // the removed file was followed on, silently, for good.
        let dataFile = log.path + "/data.mdb"
        let followed = fileIdentity(of: dataFile)
        let deadline = seconds.flatMap { $0 > 0 ? ContinuousClock.now + .seconds($0) : nil }
        // Bounded by --seconds, or by the user's interrupt.
        while deadline.map({ ContinuousClock.now < $0 }) ?? true {
            guard let next = following else { return }
            try await Task.sleep(for: Tail.pollInterval)
            // A reader gone (`tail --follow | head -1` once head has ended)
            // ends it as the next write would, by SIGPIPE: with no entry
            // coming, it polled on for good, and held up the shell's pipeline.
            if Tail.standardOutputReaderIsGone() {
                signal(SIGPIPE, SIG_DFL)
                raise(SIGPIPE)
            }
            // A file cut short in place (a truncate, a restore over it) is
            // named before a read meets the cut in the map, as SIGBUS.
            try log.checkDataFileWhole()
            following = try printEntries(log, from: next)
            guard fileIdentity(of: dataFile) == followed else {
                throw LogToolError("\(dataFile) was removed or replaced while it was followed")
            }
        }
    }

    /// True when standard output is a pipe whose read end is closed: Linux
    /// reports `POLLERR` on the write end then (a terminal hung up, `POLLHUP`).
    static func standardOutputReaderIsGone() -> Bool {
        var output = pollfd(fd: STDOUT_FILENO, events: 0, revents: 0)
        return poll(&output, 1, 0) == 1 && output.revents & Int16(POLLERR | POLLHUP) != 0
    }

    /// Prints the entries from `offset` on; returns the next offset to read,
    /// nil after the last offset there is (2^64 - 1: nothing can follow it).
    private func printEntries(_ log: EventLog, from offset: UInt64) throws -> UInt64? {
        var scanner = log.entries(from: offset)
        var next: UInt64? = offset
        while let entry = try scanner.next() {
            try printEntry(entry, json: store.json)
            next = entry.offset < .max ? entry.offset + 1 : nil
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
            unchanged; snapshots an earlier compaction wrote stay while they still hold, so compacting again \
            writes snapshots only for what changed); --dry-run says what would go, reading the store as the read \
            commands do. An LMDB file \
            never shrinks in place: --copy DIR writes a copy without free pages and reports both sizes. Writing \
            in place needs the store's writer lock: it is refused while another process has the store open for \
            writing.
            """)

    @OptionGroup var store: StoreOptions
    @Option(parsing: .unconditional, help: "Fold the log below this offset.") var below: UInt64?
    @Flag(help: "With --below: report what would go, change nothing.") var dryRun = false
    @Option(help: ArgumentHelp("Write a compacted copy of the store into this new directory.", valueName: "dir")) var copy: String?

    func validate() throws {
        if below != nil, copy != nil { throw ValidationError("--below and --copy go apart: give one of them") }
        if dryRun, below == nil { throw ValidationError("--dry-run goes with --below") }
        guard below != nil || copy != nil else { throw ValidationError("give one of --below N or --copy DIR") }
    }

    func run() async throws {
        if let copy { return try await intoNewDirectory(copy, option: "--copy") { try writeCopy(to: copy) } }
        guard let below else { return }
        // A dry run writes nothing: it needs no writer lock.
        let opened = try dryRun ? store.openStore() : StoreOptions.openWritable(store.path)
        defer { opened.close() }
        let report: CompactionReport
        do {
            report = try await opened.compact(below: below, dryRun: dryRun)
        } catch let error as LogStoreError where error.code == .invalidArgument {
            // The store names the value its watermark; the user gave it as --below.
            throw LogToolError("\(store.path): --below \(below): \(error.detail)")
        }
        if store.json { return try Output.line(["watermark": report.watermark, "entries_before": UInt64(report.entriesBefore), "entries_removed": UInt64(report.entriesRemoved), "snapshots_written": UInt64(report.snapshotsWritten), "entries_kept": UInt64(report.entriesKept)]) }
        let (remove, write, keep) = dryRun ? ("would remove", "would write", "would keep") : ("removed", "wrote", "kept")
        print("below #\(report.watermark): \(report.entriesBefore) entries; \(remove) \(report.entriesRemoved), \(write) \(report.snapshotsWritten) snapshots, \(keep) \(report.entriesKept)")
    }

    private func writeCopy(to destination: String) throws {
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

struct Replay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Rebuild every derived table from the log; with --to, the state as of an offset, into a new directory.",
        discussion: """
            In place it needs the store's writer lock (refused while another process has the store open for \
            writing). --to OFFSET --output DIR copies the store, drops the entries after OFFSET from the copy, \
            and rebuilds it there: the store itself is only read. OFFSET must be at or past the compaction watermark: \
            below it the log keeps only snapshots.
            """)

    @OptionGroup var store: StoreOptions
    @Option(parsing: .unconditional, help: "Rebuild the state as of this offset (needs --output).") var to: UInt64?
    @Option(help: ArgumentHelp("The new directory for --to.", valueName: "dir")) var output: String?

    func validate() throws {
        guard (to == nil) == (output == nil) else { throw ValidationError("--to and --output go together") }
    }

    func run() async throws {
        guard let to, let output else { return try await replay(store.path) }
        try await intoNewDirectory(output, option: "--output") {
            try timeTravelCopy(to: to, into: output)
            try await replay(output)
        }
    }

    /// What `replay --json` prints: numbers as JSON numbers.
    private struct Report: Encodable {
        var path: String
        var watermark: UInt64
        var seconds: Double
    }

    /// Rebuilds the derived tables of the store at `path`, with progress.
    private func replay(_ path: String) async throws {
        let opened = try StoreOptions.openWritable(path)
        defer { opened.close() }
        let total = try opened.log.lastOffset()
        let started = ContinuousClock.now
        let progress = Task { try await Replay.reportProgress(opened, total: total) }
        try await opened.rebuildProjections()
        progress.cancel()
        let elapsed = ContinuousClock.now - started
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let (_, watermark) = try opened.projectionState()
        if store.json { return try Output.line(Report(path: path, watermark: watermark, seconds: seconds)) }
        print("replayed \(path) through offset \(watermark) in \(String(format: "%.2f", seconds)) s")
    }

    /// Fills the new directory `output` with a copy of the store holding
    /// only the entries up to `offset`.
    private func timeTravelCopy(to offset: UInt64, into output: String) throws {
        do {
            let log = try store.openLog()
            defer { log.close() }
            let last = try log.lastOffset()
            guard offset >= 1, offset <= last else {
                // An empty log has no range to name: "1...0" said it poorly.
                let bounds = last == 0 ? try log.endInWords() : "1...\(last)"
                throw LogToolError("--to \(offset) is outside the log (\(bounds))")
            }
            // Below the watermark the log holds snapshots of the state there,
            // not the entries that made it: no earlier state can be rebuilt.
            let compactedBelow = try log.compactedBelow()
            guard offset >= compactedBelow else {
                throw LogToolError(
                    "--to \(offset) is below the compaction watermark \(compactedBelow): the entries before it are folded into snapshots, so the state as of \(offset) is gone")
            }
            try log.copy(to: output, compact: true)
        }
        MapFault.watch(storeAt: output)
        let environment = try Environment(path: output)
        defer { environment.close() }
        guard let entries = try environment.openDatabase("log", create: false) else { throw LogToolError("the copy has no log") }
        let key = (offset &+ 1).bigEndianBytes
        // The tail goes in chunks, each its own transaction: bounded by the
        // log's length. At the last offset there is (where `key` wraps to 0),
        // nothing follows.
        while offset < .max {
            let removed = try environment.write { txn -> Int in
                var keys: [[UInt8]] = []
                try txn.forEach(entries, from: key) { key, _ in
                    keys.append([UInt8](key))
                    return keys.count < 10_000
                }
                for key in keys { try txn.delete(entries, key: key) }
                return keys.count
            }
            if removed == 0 { break }
        }
        // The copy's tables are rebuilt next; until then they claim no entry
        // past its new end (a watermark past the log's end is damage).
        guard let meta = try environment.openDatabase("meta", create: false) else { throw LogToolError("the copy has no meta table") }
        try environment.write { txn in try txn.put(meta, key: MetaKey.watermark, value: offset.bigEndianBytes) }
    }

    /// A progress bar on a terminal, a plain line a second otherwise.
    private static func reportProgress(_ store: Store, total: UInt64) async throws {
        let terminal = isatty(STDERR_FILENO) == 1
        while !Task.isCancelled {
            try await Task.sleep(for: .seconds(1))
            // The rebuild's own watermark: the tables in use stay current throughout.
            let watermark = try store.rebuildWatermark() ?? store.projectionState().watermark
            let fraction = total == 0 ? 1 : Double(watermark) / Double(total)
            let line = terminal
                ? "\r[" + String(repeating: "#", count: Int(fraction * 30)) + String(repeating: " ", count: 30 - Int(fraction * 30)) + "] \(watermark)/\(total)"
                : "replayed \(watermark) of \(total)\n"
            FileHandle.standardError.write(Data(line.utf8))
        }
    }
}

struct Diff: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Compare the entity tables of two stores (what the app sees); exit 1 if they differ.")

    @Argument(help: "The first store.") var first: String
    @Argument(help: "The second store.") var second: String
    @Flag(help: "Print one JSON object per line.") var json = false

    func validate() throws {
        try checkPathGiven(first, "the first store")
        try checkPathGiven(second, "the second store")
    }

    func run() throws {
        // One process cannot open a store twice; a store equals itself.
        // Told apart as `Environment` tells open stores apart, by real path
        // (Foundation's `resolvingSymlinksInPath` left a link as it was).
        let real = { (path: String) in
            realpath(path, nil).map { resolved in
                defer { free(resolved) }
                return String(cString: resolved)
            } ?? path
        }
        if real(first) == real(second) {
            _ = try StoreOptions.open(first).close()
            FileHandle.standardError.write(Data("logtool diff: the same store, 0 differ\n".utf8))
            return
        }
        let a = try StoreOptions.open(first)
        defer { a.close() }
        let b = try StoreOptions.open(second)
        defer { b.close() }
        let left = try Diff.visible(a)
        let right = try Diff.visible(b)
        var differences = 0
        for key in Set(left.keys).union(right.keys).sorted() {
            let (x, y) = (left[key], right[key])
            guard x != y else { continue }
            differences += 1
            let what = x == nil ? "only in \(second)" : y == nil ? "only in \(first)" : "differs"
            if json {
                try Output.line(["entity": key.text, "difference": what])
            } else {
                print("\(key): \(what)" + (x != nil && y != nil ? "\n  \(x!)\n  \(y!)" : ""))
            }
        }
        FileHandle.standardError.write(Data("logtool diff: \(left.count) and \(right.count) entities, \(differences) differ\n".utf8))
        if differences > 0 { throw ExitCode(1) }
    }

    /// type/id -> the fields the app sees, all from one snapshot (an app
    /// writing meanwhile cannot make the comparison mix two commits).
    static func visible(_ store: Store) throws -> [EntityName: Fields] {
        try store.read { snapshot in
            var result: [EntityName: Fields] = [:]
            for type in try snapshot.entityTypes() {
                for entity in try Entities.all(type, in: snapshot) { result[EntityName(type: type, id: entity.id)] = entity.fields }
            }
            return result
        }
    }
}
