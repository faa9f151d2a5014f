import ArgumentParser

/// Usage mistakes the parser names poorly, named with what to type instead.
/// ArgumentParser reports the first problem it meets in its own order (a
/// required option missing before an unknown one) and knows nothing of the
/// commands' relations (`export STORE FILE` mirrors `import FILE STORE`).
extension LogTool {
    /// Refuses a first word (or the word after `help`) that names no
    /// command, with the nearest one: the parser says only "2 unexpected
    /// arguments: 'dmup', 'STORE'".
    static func checkCommandName(_ arguments: [String]) throws {
        // `help dmup` printed the tool's own help, status 0: the word after
        // `help` names a command too.
        let words = arguments.first == "help" ? arguments.dropFirst() : arguments[...]
        guard let word = words.first, !word.hasPrefix("-") else { return }
        let names = ["help"] + configuration.subcommands.map { $0._commandName }
        guard !names.contains(word) else { return }
        let nearest = names.map { ($0, editDistance($0, word)) }.min { $0.1 < $1.1 }
        if let (name, distance) = nearest, distance <= 2 {
            throw ValidationError("Unknown command '\(word)'. Did you mean '\(name)'?")
        }
        throw ValidationError("Unknown command '\(word)'; the commands are \(names.dropFirst().joined(separator: ", "))")
    }

    /// The option each command that writes a file or a directory takes it
    /// by, and where it writes. `import FILE STORE` takes its paths by
    /// position, so `export STORE FILE` is a likely mistake (its file is
    /// not taken there: a second store's path given by mistake would be
    /// overwritten).
    static let outputOptions = [
        "export": ("--output", "export writes to --output FILE or to standard output"),
        "bundle": ("--output", "bundle writes to --output DIR"),
        "replay": ("--to OFFSET --output", "replay writes a new directory only with --to OFFSET --output DIR"),
    ]

    /// `export STORE FILE` said only "Unexpected argument 'FILE'": for a
    /// command in `outputOptions` given no --output and one unexpected
    /// word, what to type instead, the word given its option. Nil for any
    /// other error.
    static func outputOptionHint(_ error: any Error, in arguments: [String]) -> String? {
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
    static func importOptionHint(_ error: any Error, in arguments: [String]) -> String? {
        guard arguments.first == "import" else { return nil }
        let text = message(for: error)
        let options = ["--output", "-o", "--input", "-i"]
        guard let option = options.first(where: { text.hasPrefix("Unknown option '\($0)'") }) else { return nil }
        let corrected = arguments.filter { $0 != option }
        return "Unknown option '\(option)': import takes the export file, then the new store, by position: logtool \(corrected.joined(separator: " "))"
    }

    /// The Levenshtein distance of two words, by characters.
    static func editDistance(_ a: String, _ b: String) -> Int {
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
}
