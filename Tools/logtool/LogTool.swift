import ArgumentParser
import Foundation
import LogFormat
import LogStore
import ToolSupport

/// Looks inside a store from a shell. Every command but `replay` (in place)
/// and `compact --below` only reads: it opens the store read-only and works
/// while another process writes to it.
///
/// Exit codes: 0 all well, 1 problems found (`verify`), 2 usage or I/O error.
@main
struct LogTool: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "logtool",
        abstract: "Inspect and verify a sync store's log, projections and outbox.",
        discussion: """
            Exit status: 0 ok, 1 problems found, 2 usage or I/O error (a data file cut short as it is read, too). \
            --json prints one JSON object per line.
            """,
        subcommands: [
            Stat.self, Dump.self, Show.self, Tail.self, Entities.self, Outbox.self, Cursors.self, Conflicts.self, Verify.self,
            Replay.self,
            Diff.self, Compact.self, Export.self, Import.self, Bundle.self,
        ])

    /// ArgumentParser's own usage failures exit 64; this tool promises 2.
    static func main() async {
        MapFault.install(toolName: "logtool", status: 2, hint: "logtool verify checks a store.")
        let arguments = Array(CommandLine.arguments.dropFirst())
        do {
            try checkCommandName(arguments)
            var command = try parseAsRoot(arguments)
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
            checkStandardOutput()
        } catch let code as ExitCode {
            checkStandardOutput()
            Foundation.exit(code.rawValue)
        } catch {
            let error = mistakeBehindMissingOption(error, in: arguments)?.mistake ?? error
            if let hint = outputOptionHint(error, in: arguments) ?? importOptionHint(error, in: arguments) {
                FileHandle.standardError.write(Data("Error: \(hint)\n  See 'logtool \(arguments[0]) --help' for more information.\n".utf8))
                Foundation.exit(2)
            }
            let code = exitCode(for: error)
            if code == .success {
                exit(withError: error)
            }
            if code == .validationFailure || error is ValidationError {
                FileHandle.standardError.write(Data((fullMessage(for: error) + "\n").utf8))
                Foundation.exit(2)
            }
            FileHandle.standardError.write(Data("logtool: \(error)\n".utf8))
            Foundation.exit(2)
        }
    }

    /// Exits 2 when what the command printed did not all reach standard
    /// output (a full disk, a file too large): `print` ignores a failed
    /// write, and `dump --json > file` must not exit 0 with the file cut short.
    ///
    /// It flushes every stream, as Swift 6 refuses `ferror(stdout)`
    /// (`stdout` is a mutable C global). Output still buffered fails here
    /// as it did before: a full disk stays full. What this cannot see is a
    /// write that failed earlier when nothing is left to flush.
    private static func checkStandardOutput() {
        errno = 0
        guard fflush(nil) != 0 else { return }
        let reason = String(cString: strerror(errno))
        FileHandle.standardError.write(Data("logtool: cannot write standard output: \(reason)\n".utf8))
        Foundation.exit(2)
    }
}

/// The store a command reads, and how it prints.
struct StoreOptions: ParsableArguments {
    @Argument(help: "The store directory.")
    var path: String

    @Flag(help: "Print one JSON object per line.")
    var json = false

    func validate() throws { try checkPathGiven(path) }

    /// The log, opened read-only.
    func openLog() throws -> EventLog {
        MapFault.watch(storeAt: path)
        return try EventLog(path: path, options: .inspecting)
    }

    /// The store with its projections, opened read-only.
    func openStore() throws -> Store { try StoreOptions.open(path) }

    /// The store at `path` with its projections, opened read-only.
    static func open(_ path: String) throws -> Store {
        MapFault.watch(storeAt: path)
        return try Store(path: path, options: .inspecting)
    }

    /// The store at `path` opened for writing (full durability), refused as
    /// the read-only opens are when there is no store there: a mistyped
    /// path must not become a new, empty store.
    static func openWritable(_ path: String) throws -> Store {
        var options = EventLog.Options(durability: .full)
        options.createIfMissing = false
        MapFault.watch(storeAt: path)
        return try Store(path: path, options: options)
    }
}

/// Refuses an empty path (an unset variable: `logtool stat "$STORE"`),
/// which a store's open named as "not a sync store: no such directory",
/// naming no path.
func checkPathGiven(_ path: String, _ name: String = "the store") throws {
    guard !path.isEmpty else { throw ValidationError("\(name)'s path is empty") }
}

/// The device and inode of the file at `path`, a link followed: the same
/// for every path to one file. Nil when there is none.
func fileIdentity(of path: String) -> [UInt64]? {
    var status = stat()
    guard stat(path, &status) == 0 else { return nil }
    return [UInt64(status.st_dev), UInt64(status.st_ino)]
}

extension EventLog {
    /// Where the log ends, in words for a message: "the log ends at N", or
    /// "the store has no entries", which a range said as "1...0".
    func endInWords() throws -> String {
        let last = try lastOffset()
        return last == 0 ? "the store has no entries" : "the log ends at \(last)"
    }

    /// The offset to read from for the last `count` entries (1 when the log
    /// holds fewer); nil when `count` is 0 and the log ends at the last
    /// offset there is, 2^64 - 1, after which no entry can come.
    func startOfLast(_ count: Int) throws -> UInt64? {
        precondition(count >= 0, "a negative count passed validate()")
        let last = try lastOffset()
        guard UInt64(count) <= last else { return 1 }
        // last - count + 1 overflows only for count 0 at the last offset.
        let (start, overflow) = (last - UInt64(count)).addingReportingOverflow(1)
        if overflow { return nil }
        // Offsets are dense from the compaction watermark on (storage.md,
        // section 4); below it compaction leaves holes, which hold no
        // entry to count: the entries still wanted come from below it.
        let compactedBelow = try compactedBelow()
        guard start < compactedBelow else { return start }
        // A watermark past the end (only damage sets one: compaction's is
        // in 1...last) leaves no offset above it.
        let above = compactedBelow <= last ? last - compactedBelow + 1 : 0
        let wanted = Int(clamping: UInt64(count) - above)
        // Bounded by the entries below the watermark.
        var below: [UInt64] = []
        var scanner = entries(from: 1, through: compactedBelow - 1)
        while let entry = try scanner.next() { below.append(entry.offset) }
        return below.count > wanted ? below[below.count - wanted] : 1
    }
}

/// Prints values as JSON lines.
enum Output {
    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }()

    static func line(_ value: some Encodable) throws {
        print(String(decoding: try encoder.encode(value), as: UTF8.self))
    }
}
