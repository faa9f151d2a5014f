import ArgumentParser

extension ParsableCommand {
    /// ArgumentParser reports a required option missing before an unknown
    /// option or a word too many: `logtool bundle STORE --ouput DIR` and
    /// `syncserver --dta DIR` said "Missing expected argument '--output
    /// <dir>'" (or `--data`) of a user who had given it, misspelled or
    /// without its name. The arguments are parsed again with each missing
    /// option given (a placeholder value); when that fails on an unknown
    /// option or an unexpected argument, that is the mistake.
    /// - Returns: that error, with the last option given in the reparse;
    ///   nil when `error` is not a missing option or there is no such mistake.
    public static func mistakeBehindMissingOption(_ error: any Error, in arguments: [String])
        -> (mistake: any Error, missing: String)?
    {
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
                return (error, String(name))
            }
        }
        return nil
    }
}

/// More required options than any command has.
private let requiredOptionCountMax = 4
