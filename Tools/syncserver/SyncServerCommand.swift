import ArgumentParser
import Foundation
import Hummingbird
import LogFormat
import LogServer
import Synchronization
import ToolSupport

/// The reference sync server, from the shell.
@main
struct SyncServerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "syncserver",
        abstract: "Serve the sync protocol (Format/sync-protocol.md) over HTTP from a store directory.",
        discussion: """
            Tokens map to users, one per line in --tokens-file: TOKEN USER [read-only]; a '#' at a line's start or after \
            a space or a tab starts a comment (inside a token it is part of it). \
            The server listens on 127.0.0.1 unless --host says otherwise, and stops cleanly on SIGTERM or SIGINT.
            Exit status: 0 stopped (SIGTERM, SIGINT, or stdin's end with --stop-at-stdin-end), 1 it could not start \
            (an address it cannot listen on, a --data refused) or its store's data file was cut short under it, \
            64 usage (an option or a token refused).
            """)

    @Option(help: "Address to listen on.")
    var host = "127.0.0.1"

    @Option(parsing: .unconditional, help: "Port to listen on (0: any free port, printed at start).")
    var port = 8080

    @Option(help: ArgumentHelp("The server's store directory: created if missing; an existing one is empty or a server's store.", valueName: "dir"))
    var data: String

    @Option(help: ArgumentHelp("A file of bearer tokens: TOKEN USER [read-only] per line.", valueName: "file"))
    var tokensFile: String?

    @Option(
        help: ArgumentHelp(
            "A bearer token as TOKEN:USER (repeatable), split at the first ':': a token that holds ':' goes in --tokens-file.",
            valueName: "token:user"))
    var token: [String] = []

    @Option(help: ArgumentHelp("The bearer token for /v1/admin endpoints (none: disabled).", valueName: "token"))
    var adminToken: String?

    @Option(parsing: .unconditional, help: "Requests per second per user (token bucket); 0 for no limit.")
    var rateLimit: Double = 0

    @Option(parsing: .unconditional, help: "Burst size of the per-user token bucket.")
    var burst = 20

    @Flag(help: "Enable POST /v1/admin/faults (tests only; never in production).")
    var faultInjection = false

    @Option(
        help: """
            Durability of each commit: full (the default), metaAsync or process. Only full keeps the protocol's promise \
            that a push answered "applied" survives a power loss: under metaAsync a power loss may undo the last commit, \
            pushes already answered applied included; under process it may undo any of them and corrupt the store. Use \
            the other two only for tests and benchmarks.
            """)
    var durability = "full"

    @Flag(
        help: ArgumentHelp(
            "Check every page of the store's data.mdb before serving: a damaged one stops the start (status 1), named, "
                + "where a request that reached it could crash the server. It reads the whole file once."))
    var checkPages = false

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "Seconds a connection may send no part of a request, answer pending aside, before it is closed; 0 for never.",
            valueName: "seconds"))
    var idleTimeout = 300

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "Seconds a request may take to send its body, from its head on, before its connection is closed unanswered; 0 for never.",
            valueName: "seconds"))
    var bodyTimeout = 300

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "Seconds after a failed commit (a full disk, a refused sync) before the server reopens its store, and between "
                + "attempts that fail; 503 meanwhile. 0 for never: 503 until restarted.",
            valueName: "seconds"))
    var reopenAfter = 10

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "gzip level of answers of 1 KiB or more to clients that accept gzip: 1 the fastest, 9 the smallest, 0 for none.",
            valueName: "level"))
    var gzipLevel = 1

    @Option(
        help: ArgumentHelp(
            "The entity field whose string value is an entity's scope (a project, a team), fixed for its life: clients may "
                + "then pull some scopes only (GET /v1/pull?scopes=...). None: entities have no scope.",
            valueName: "field"))
    var scopeField: String?

    @Option(
        parsing: .unconditional,
        help: """
            MiB of push bodies held at once, being received or waiting for the store's one writer; a push that would go \
            over it while others are held is answered 503 SERVICE_UNAVAILABLE with Retry-After: 1, which clients retry. \
            A push alone is always taken.
            """)
    var pushBufferMib = 64

    @Option(
        parsing: .unconditional,
        help: ArgumentHelp(
            "Pulls of one user that wait for a change at once (GET /v1/pull?wait=N); the user's next answers at once. "
                + "0: none waits.",
            valueName: "count"))
    var waitingPullsPerUser = 16

    @Flag(help: "Stop (as on SIGTERM) when stdin reaches its end: a parent process that holds a pipe to it takes the server with it when it ends, even by SIGKILL.")
    var stopAtStdinEnd = false

    /// ArgumentParser's own `main`, but for the mistake behind a missing
    /// `--data` (`mistakeBehindMissingData`).
    static func main() async {
        MapFault.install(
            toolName: "syncserver", status: 1, hint: "Check the store with logtool verify before the server serves it again.")
        // A store growing past the file size limit (RLIMIT_FSIZE) fails its
        // commit, as a full disk does, and the server reopens it once there
        // is room (--reopen-after). The signal the kernel sends the writing
        // thread then (SIGXFSZ) would end the server wherever it is not
        // blocked (dispatch's threads block it).
        signal(SIGXFSZ, SIG_IGN)
        let arguments = Array(CommandLine.arguments.dropFirst())
        do {
            var command = try parseAsRoot(arguments)
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            exit(withError: mistakeBehindMissingData(error, in: arguments) ?? error)
        }
    }

    /// The mistake behind a missing `--data`: `--dta DIR` is named with the
    /// nearest option the parser knows; one word too many (`syncserver
    /// DIR`), with the option it most likely lacks.
    private static func mistakeBehindMissingData(_ error: any Error, in arguments: [String]) -> (any Error)? {
        guard let (mistake, name) = mistakeBehindMissingOption(error, in: arguments) else { return nil }
        let text = message(for: mistake)
        let unexpected = "Unexpected argument '"
        guard text.hasPrefix(unexpected), text.hasSuffix("'") else { return mistake }
        let word = text.dropFirst(unexpected.count).dropLast()
        return ValidationError("Unexpected argument '\(word)': is it the \(name) option's value? (\(name) \(word))")
    }

    func validate() throws {
        guard (0...65535).contains(port) else { throw ValidationError("--port must be 0...65535") }
        // Else it failed at start (status 1, not usage's 64) as "cannot listen on :8080: ... for host , port 8080".
        guard !host.isEmpty else { throw ValidationError("--host must name an address") }
        // `inf` parses as a Double, and passed here to fail at start (status 1, not usage's 64).
        guard rateLimit >= 0, rateLimit.isFinite else { throw ValidationError("--rate-limit must be a finite number >= 0") }
        guard burst > 0 else { throw ValidationError("--burst must be at least 1") }
        // Else it failed at start as "mkdir (): No such file or directory".
        guard !data.isEmpty else { throw ValidationError("--data must name a directory") }
        guard (0...86_400).contains(idleTimeout) else { throw ValidationError("--idle-timeout must be 0...86400 seconds") }
        guard (0...86_400).contains(bodyTimeout) else { throw ValidationError("--body-timeout must be 0...86400 seconds") }
        guard (0...86_400).contains(reopenAfter) else { throw ValidationError("--reopen-after must be 0...86400 seconds") }
        guard (0...9).contains(gzipLevel) else { throw ValidationError("--gzip-level must be 0...9") }
        guard (1...1_048_576).contains(pushBufferMib) else { throw ValidationError("--push-buffer-mib must be 1...1048576") }
        guard (0...1_000_000).contains(waitingPullsPerUser) else { throw ValidationError("--waiting-pulls-per-user must be 0...1000000") }
        guard ["full", "metaAsync", "process"].contains(durability) else {
            throw ValidationError("--durability must be full, metaAsync or process")
        }
        if faultInjection, adminToken == nil { throw ValidationError("--fault-injection needs --admin-token") }
        if let adminToken { try checkToken(adminToken, "--admin-token") }
        if let scopeField, let problem = NameRules.fieldsProblem([scopeField: .null]) {
            throw ValidationError("--scope-field: \(problem)")
        }
    }

    func run() async throws {
        var configuration = SyncServer.Configuration(dataDirectory: data)
        configuration.host = host
        configuration.port = port
        configuration.tokens = try loadTokens()
        configuration.adminToken = adminToken
        configuration.rateLimit = rateLimit > 0 ? (rateLimit, burst) : nil
        configuration.faultInjection = faultInjection
        configuration.idleTimeout = idleTimeout > 0 ? .seconds(idleTimeout) : nil
        configuration.bodyTimeout = bodyTimeout > 0 ? .seconds(bodyTimeout) : nil
        configuration.reopenInterval = reopenAfter > 0 ? .seconds(reopenAfter) : nil
        configuration.durability = .init(rawValue: durability) ?? .full
        configuration.checkPagesAtStart = checkPages
        configuration.pushBufferBytesMax = pushBufferMib << 20
        configuration.waitingPullsPerUserMax = waitingPullsPerUser
        configuration.gzipLevel = gzipLevel
        configuration.scopeField = scopeField
        let before = DataDirectoryBefore(data)
        try before.checkParentExists()
        MapFault.watch(storeAt: data)
        let server = try SyncServer(configuration: configuration)
        let serverID = server.serverID
        let (host, data) = (host, data)
        let listening = Mutex(false)
        let stopAtStdinEnd = self.stopAtStdinEnd
        let app = server.application { port in
            listening.withLock { $0 = true }
            // An IPv6 address goes in brackets (RFC 3986, section 3.2.2):
            // "http://::1:8080" is no URL a client can be given.
            let authority = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
            // Not a format string: the host and the directory are the operator's text.
            let banner = "syncserver \(serverID) listening on http://\(authority) (data \(data))\n"
            // Unbuffered, so a parent process reading the pipe learns the port at once.
            FileHandle.standardOutput.write(Data(banner.utf8))
            // Only now: `runService()` handles SIGTERM once it runs, and a
            // stdin already at its end (a parent gone, /dev/null) sent it
            // before then, which killed the server instead of stopping it.
            if stopAtStdinEnd { ParentWatch.onStdinEnd { kill(getpid(), SIGTERM) } }
        }
        do {
            try await app.runService()
        } catch where !listening.withLock({ $0 }) {
            before.removeStoreFiles()
            server.close()
            before.removeLockAndDirectory()
            // Hummingbird's error names the system call, not the address.
            throw StartError(description: "cannot listen on \(host):\(port): \(error)")
        } catch {
            server.close()
            throw error
        }
        server.close()
    }

    /// Why the server never listened.
    struct StartError: Error, CustomStringConvertible {
        let description: String
    }

    private func loadTokens() throws -> [String: Identity] {
        var tokens: [String: Identity] = [:]
        // Where each token was given: one given to a second user (a line
        // copied, its user changed and its token not) is refused, naming
        // both places, where the last one won and its client saw the
        // other user's data. A tokens file's place is its line, so the
        // secret in it is not printed.
        var places: [String: String] = [:]
        func add(_ token: String, _ identity: Identity, _ place: String) throws {
            if let earlier = tokens[token], earlier != identity, let first = places[token] {
                let name = { (identity: Identity) in identity.user + (identity.readOnly ? " (read-only)" : "") }
                throw ValidationError("\(place): the token given to \(name(earlier)) at \(first) is given to \(name(identity)) too; a token names one user")
            }
            tokens[token] = identity
            places[token] = place
        }
        if let tokensFile {
            let text = try TokensFile.text(of: tokensFile)
            // Any line ending: "\r\n" is one Character, which a split on
            // "\n" leaves whole (and its user would end in "\r\n"). Empty
            // lines are kept, so that each line's number is its place.
            for (number, line) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated() {
                let place = "\(tokensFile):\(number + 1)"
                let words = TokensFile.words(of: line)
                guard !words.isEmpty else { continue }
                guard words.count == 2 || (words.count == 3 && words[2] == "read-only") else {
                    throw ValidationError("\(place): expected TOKEN USER [read-only]")
                }
                try checkToken(String(words[0]), place)
                try checkUser(String(words[1]), place)
                try add(String(words[0]), Identity(user: String(words[1]), readOnly: words.count == 3), place)
            }
        }
        for pair in token {
            let parts = pair.split(separator: ":", maxSplits: 1)
            guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else {
                throw ValidationError("--token \(pair): expected TOKEN:USER")
            }
            try checkToken(String(parts[0]), "--token \(pair)")
            try checkUser(String(parts[1]), "--token \(pair)")
            try add(String(parts[0]), Identity(user: String(parts[1])), "--token \(pair)")
        }
        // The admin token names no user (every push and pull with it is
        // 401), so a user given it could never sync: refused, as a user
        // name too long for the store is.
        if let adminToken, let user = tokens[adminToken]?.user, let place = places[adminToken] {
            throw ValidationError("\(place): the token given to \(user) is the --admin-token, which names no user: every push and pull of \(user) would be refused (401)")
        }
        return tokens
    }

    /// A longer name would make every push of its user fail (a 500).
    private func checkUser(_ user: String, _ place: String) throws {
        guard user.utf8.count <= Identity.userBytesMax else {
            throw ValidationError("\(place): a user name is at most \(Identity.userBytesMax) bytes of UTF-8, not \(user.utf8.count)")
        }
    }

    private func checkToken(_ token: String, _ place: String) throws {
        guard SyncServer.isToken(token) else {
            throw ValidationError("\(place): a token is one or more characters from ! to ~ (ASCII, no spaces)")
        }
    }
}
