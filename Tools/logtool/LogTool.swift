import ArgumentParser
import Foundation
import LogFormat
import LogStore

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
        discussion: "Exit status: 0 ok, 1 problems found, 2 usage or I/O error. --json prints one JSON object per line.",
        subcommands: [
            Stat.self, Dump.self, Show.self, Tail.self, Entities.self, Outbox.self, Cursors.self, Conflicts.self, Verify.self,
            Replay.self,
            Diff.self, Compact.self, Export.self, Import.self, Bundle.self,
        ])

    /// ArgumentParser's own usage failures exit 64; this tool promises 2.
    static func main() async {
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
            let error = mistakeBehindMissingOption(error, in: arguments) ?? error
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

    /// Refuses a first word that names no command, with the nearest one:
    /// the parser says only "2 unexpected arguments: 'dmup', 'STORE'".
    private static func checkCommandName(_ arguments: [String]) throws {
        guard let word = arguments.first, !word.hasPrefix("-") else { return }
        let names = ["help"] + configuration.subcommands.map { $0._commandName }
        guard !names.contains(word) else { return }
        let nearest = names.map { ($0, editDistance($0, word)) }.min { $0.1 < $1.1 }
        if let (name, distance) = nearest, distance <= 2 {
            throw ValidationError("Unknown command '\(word)'. Did you mean '\(name)'?")
        }
        throw ValidationError("Unknown command '\(word)'; the commands are \(names.dropFirst().joined(separator: ", "))")
    }

    /// The parser reports a required option missing before an unknown option
    /// or a word too many: `bundle STORE --ouput DIR` and `bundle STORE DIR`
    /// said "Missing expected argument '--output <output>'", of a user who
    /// had given it, misspelled or without its name. The arguments are
    /// parsed again with each missing option given; when that fails on an
    /// unknown option or an unexpected argument, that is the mistake.
    /// - Returns: that error, or nil when there is none.
    private static func mistakeBehindMissingOption(_ error: any Error, in arguments: [String]) -> (any Error)? {
        let prefix = "Missing expected argument '--"
        var (arguments, error) = (arguments, error)
        // Each round gives one more option; a command requires few.
        for _ in 0..<requiredOptionCountMax {
            let text = message(for: error)
            guard text.hasPrefix(prefix), let name = text.dropFirst(prefix.count - 2).split(separator: " ").first else { return nil }
            arguments += [String(name), "unused"]
            do {
                _ = try parseAsRoot(arguments)
                return nil
            } catch let next {
                error = next
            }
            let mistake = message(for: error)
            if mistake.hasPrefix("Unknown option") || mistake.hasPrefix("Unexpected argument") || mistake.contains("unexpected arguments") {
                return error
            }
        }
        return nil
    }

    /// The option each command that writes a file or a directory takes it
    /// by, and where it writes. `import FILE STORE` takes its paths by
    /// position, so `export STORE FILE` is a likely mistake (its file is
    /// not taken there: a second store's path given by mistake would be
    /// overwritten).
    private static let outputOptions = [
        "export": ("--output", "export writes to --output FILE or to standard output"),
        "bundle": ("--output", "bundle writes to --output DIR"),
        "replay": ("--to OFFSET --output", "replay writes a new directory only with --to OFFSET --output DIR"),
    ]

    /// `export STORE FILE` said only "Unexpected argument 'FILE'": for a
    /// command in `outputOptions` given no --output and one unexpected
    /// word, what to type instead, the word given its option. Nil for any
    /// other error.
    private static func outputOptionHint(_ error: any Error, in arguments: [String]) -> String? {
        let prefix = "Unexpected argument '"
        let text = message(for: error)
        guard let command = arguments.first, let (option, writes) = outputOptions[command], text.hasPrefix(prefix), text.hasSuffix("'")
        else { return nil }
        guard !arguments.contains(where: { $0 == "--output" || $0 == "-o" || $0.hasPrefix("--output=") }) else { return nil }
        let word = String(text.dropFirst(prefix.count).dropLast())
        guard let index = arguments.lastIndex(of: word) else { return nil }
        var corrected = arguments
        corrected[index] = "\(option) \(word)"
        return "Unexpected argument '\(word)': \(writes): logtool \(corrected.joined(separator: " "))"
    }

    /// `import FILE --output NEWSTORE`, export's form mirrored, said only
    /// "Unknown option '--output'": import takes both paths by position.
    /// For an --output or --input to import, the line without it. Nil for
    /// any other error.
    private static func importOptionHint(_ error: any Error, in arguments: [String]) -> String? {
        guard arguments.first == "import" else { return nil }
        let text = message(for: error)
        let options = ["--output", "-o", "--input", "-i"]
        guard let option = options.first(where: { text.hasPrefix("Unknown option '\($0)'") }) else { return nil }
        let corrected = arguments.filter { $0 != option }
        return "Unknown option '\(option)': import takes the export file, then the new store, by position: logtool \(corrected.joined(separator: " "))"
    }

    /// More required options than any command has.
    private static let requiredOptionCountMax = 4

    /// The Levenshtein distance of two words, by characters.
    private static func editDistance(_ a: String, _ b: String) -> Int {
        let (a, b) = (Array(a), Array(b))
        var previous = Array(0...b.count)
        for (i, x) in a.enumerated() {
            var row = [i + 1]
            for (j, y) in b.enumerated() {
                row.append(min(previous[j + 1] + 1, row[j] + 1, previous[j] + (x == y ? 0 : 1)))
            }
            previous = row
        }
        return previous[b.count]
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

    /// The log, opened read-only.
    func openLog() throws -> EventLog { try EventLog(path: path, options: .inspecting) }

    /// The store with its projections, opened read-only.
    func openStore() throws -> Store { try StoreOptions.open(path) }

    /// The store at `path` with its projections, opened read-only.
    static func open(_ path: String) throws -> Store { try Store(path: path, options: .inspecting) }

    /// The store at `path` opened for writing (full durability), refused as
    /// the read-only opens are when there is no store there: a mistyped
    /// path must not become a new, empty store.
    static func openWritable(_ path: String) throws -> Store {
        var options = EventLog.Options(durability: .full)
        options.createIfMissing = false
        return try Store(path: path, options: options)
    }
}

extension EventLog {
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
