import Foundation
import LMDB
import LogFormat
import LogServer
import LogTesting
import Synchronization
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The `syncserver` executable, run as a child process the way an operator
/// runs it.
@Suite struct SyncServerProcessTests {
    /// The built executable, beside the test bundle's build products.
    static var executable: URL { URL(fileURLWithPath: ToolRun.builtProduct("syncserver", root: root)) }

    /// The package's directory.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// Starts `syncserver` with `arguments` and waits for its banner.
    /// - Returns: the child, which the caller kills, and the port it
    ///   listens on. Without a banner the child is killed here.
    static func started(_ arguments: [String], holdingStdinOpen: Bool = false) async throws -> (server: ChildProcess, port: Int) {
        try #require(FileManager.default.isExecutableFile(atPath: executable.path), "build the syncserver product first")
        let server = try ChildProcess(executable: executable.path, arguments: arguments, holdingStdinOpen: holdingStdinOpen)
        let banner = await server.waitForLine(timeout: .seconds(60)) { SyncServerBanner.port(in: $0) != nil }
        let port = banner.flatMap(SyncServerBanner.port(in:))
        if port == nil { server.kill() }
        return (server, try #require(port, "no banner: \(server.outputText)\(server.errorText)"))
    }

    /// Sends one request to the server on `port` with token `t`: a POST
    /// of `body`, or a GET without one.
    /// - Returns: the status, the body and the `Retry-After` header.
    static func send(_ path: String, port: Int, body: Data? = nil) async throws -> (status: Int, body: Data, retryAfter: String?) {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        request.setValue("Bearer t", forHTTPHeaderField: "Authorization")
        if let body {
            request.httpMethod = "POST"
            request.httpBody = body
        }
        let (data, response) = try await URLSession.shared.dataIgnoringCancellation(for: request)
        let http = response as? HTTPURLResponse
        return (http?.statusCode ?? 0, data, http?.value(forHTTPHeaderField: "Retry-After"))
    }

    @Test(arguments: [SIGTERM, SIGINT])
    func stopsCleanlyOnASignalAndKeepsItsData(signal: Int32) async throws {
        let directory = try TemporaryDirectory("syncserver-signal")
        let (server, port) = try await Self.started(
            ["--data", directory.appending("data"), "--port", "0", "--token", "t:alice", "--durability", "full"])
        defer { server.kill() }
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/v1/push")!)
        request.httpMethod = "POST"
        request.setValue("Bearer t", forHTTPHeaderField: "Authorization")
        request.httpBody = try JSONEncoder().encode(PushRequest(operations: [operation(.create, "t1", ["n": 1], key: "k")]))
        let (_, response) = try await URLSession.shared.dataIgnoringCancellation(for: request)
        #expect((response as? HTTPURLResponse)?.statusCode == 200)

        server.kill(signal)
        #expect(await server.waitForExit(timeout: .seconds(6)), "still running 6 s after the signal")
        #expect(!server.isRunning && server.ending == .exit(0), "\(server.errorText)")

        // The store opens cleanly and holds the acknowledged push.
        let reopened = try await TestServer("signal-reopen", dataDirectory: directory.appending("data"))
        let changes = try await reopened.pullAll()
        await reopened.stop()
        #expect(changes.map(\.entityID) == ["t1"])
    }

    /// The banner names a data directory whose name holds `%` as it is:
    /// the banner was a format string with the directory in it, so each
    /// `%@` or `%s` there read an argument that was never passed: the
    /// banner named another directory, and with a few more, the server
    /// crashed (a bad pointer dereference) as it began to listen.
    @Test func aDataDirectoryWithPercentSignsIsNamedAsItIs() async throws {
        let directory = try TemporaryDirectory("syncserver-percent")
        defer { directory.remove() }
        let data = directory.appending("data %@ %s %d %% %s%s%s%s%s%s%s%s%s%s")
        let (server, _) = try await Self.started(["--data", data, "--port", "0", "--token", "t:alice"])
        defer { server.kill() }
        #expect(server.outputText.contains("(data \(data))"), "\(server.outputText)")
    }

    /// `--stop-at-stdin-end` with a stdin already at its end (/dev/null, a
    /// parent gone before the server listened) stops the server as SIGTERM
    /// does once it runs: cleanly, status 0. The watch sent SIGTERM before
    /// the server handled it, and the signal killed the process.
    @Test func stopsCleanlyWhenStdinIsAtItsEndFromTheStart() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-stdin-end")
        let server = try ChildProcess(
            executable: Self.executable.path,
            arguments: ["--data", directory.appending("data"), "--port", "0", "--token", "t:alice", "--stop-at-stdin-end"])
        defer { server.kill() }
        #expect(await server.waitForExit(timeout: .seconds(60)), "still running with its stdin at its end")
        #expect(server.ending == .exit(0), "\(server.ending): \(server.errorText)")
        #expect(server.outputText.contains("listening on"), "\(server.outputText)")
    }

    /// A tokens file written on Windows (CRLF line ends) reads as one with
    /// LF: "\r\n" is one `Character`, which a split on "\n" left whole, so
    /// two lines made one line of four words and the server refused to
    /// start. A token that is not one or more characters from `!` to `~`
    /// (section 3) is refused when the server starts, naming where.
    @Test func tokensFilesWithCRLFAndTokensOutsideASCIIGraphics() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-tokens")
        let tokens = directory.appending("tokens")
        try Data("# users\r\nt1 alice\r\nt2 bob read-only\r\n".utf8).write(to: URL(fileURLWithPath: tokens))
        let (server, port) = try await Self.started(["--data", directory.appending("data"), "--port", "0", "--tokens-file", tokens])
        defer { server.kill() }
        for token in ["t1", "t2"] {
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/v1/pull")!)
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
            let (_, response) = try await URLSession.shared.dataIgnoringCancellation(for: request)
            #expect((response as? HTTPURLResponse)?.statusCode == 200, "\(token)")
        }
        server.kill()

        for (arguments, place) in [
            (["--token", "k\u{00E9}y:alice"], "--token k\u{00E9}y:alice"), (["--admin-token", "\u{212A}ey"], "--admin-token"),
        ] {
            let refused = try ChildProcess(
                executable: Self.executable.path, arguments: ["--data", directory.appending("data"), "--port", "0"] + arguments)
            defer { refused.kill() }
            #expect(await refused.waitForExit(timeout: .seconds(60)))
            #expect(refused.ending != .exit(0))
            #expect(refused.errorText.contains(place) && refused.errorText.contains("from ! to ~"), "\(refused.errorText)")
        }
    }

    /// A token may hold `#` (section 3 allows `!` to `~`), and a tokens
    /// file can hold one: a `#` starts a comment only at a line's start or
    /// after a space or a tab. Any `#` started one, so a token with `#`
    /// was cut short and its line refused.
    @Test func aTokenInATokensFileMayHoldAHash() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-tokens-hash")
        let tokens = directory.appending("tokens")
        // And ":", which `--token TOKEN:USER` cannot give (it splits there).
        let text = "# users\n  # an indented comment\nab#c alice # the first\n#t2 bob\nt3 carol\t#after a tab\nt4 dave read-only #\ne:f erin\n"
        try Data(text.utf8).write(to: URL(fileURLWithPath: tokens))
        let (server, port) = try await Self.started(["--data", directory.appending("data"), "--port", "0", "--tokens-file", tokens])
        defer { server.kill() }
        for (token, status) in [("ab#c", 200), ("t3", 200), ("t4", 200), ("e:f", 200), ("ab", 401), ("#t2", 401), ("t2", 401), ("e", 401)] {
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/v1/pull")!)
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
            let (_, response) = try await URLSession.shared.dataIgnoringCancellation(for: request)
            #expect((response as? HTTPURLResponse)?.statusCode == status, "\(token)")
        }
    }

    /// An address it cannot listen on ends it with status 1 and a message
    /// naming the address (the error alone named neither).
    @Test func anAddressItCannotListenOnIsNamed() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-unlistenable")
        // TEST-NET-3 (RFC 5737): never an address of this host.
        let server = try ChildProcess(
            executable: Self.executable.path,
            arguments: ["--data", directory.appending("data"), "--host", "203.0.113.1", "--port", "0", "--token", "t:alice"])
        defer { server.kill() }
        #expect(await server.waitForExit(timeout: .seconds(60)))
        #expect(server.ending == .exit(1))
        #expect(server.errorText.contains("cannot listen on 203.0.113.1:0"), "\(server.errorText)")
        // It had made a new, empty store there before it tried to listen.
        #expect(!FileManager.default.fileExists(atPath: directory.appending("data")))
    }

    /// A port another server holds ends it with status 1, naming the
    /// address, and leaves its --data as it found it: a missing directory
    /// missing, an empty one empty. It had made a new store in both.
    @Test func aPortInUseIsNamedAndLeavesTheDataAsItWas() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let holder = try await TestServer("port-holder")
        defer { Task { await holder.stop() } }
        let directory = try TemporaryDirectory("syncserver-port-in-use")
        let empty = directory.appending("empty")
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: false)
        for data in [directory.appending("missing"), empty] {
            let run = try await ToolRun.running(
                Self.executable.path, ["--data", data, "--port", "\(holder.port)", "--token", "t:alice", "--stop-at-stdin-end"])
            #expect(run.status == 1, "\(data): \(run.status): \(run.output)\(run.errors)")
            #expect(run.errors.contains("cannot listen on 127.0.0.1:\(holder.port)"), "\(run.errors)")
        }
        #expect(!FileManager.default.fileExists(atPath: directory.appending("missing")))
        #expect(try FileManager.default.contentsOfDirectory(atPath: empty) == [])
    }
}

extension SyncServerProcessTests {
    /// A `--data` that holds another program's LMDB environment (a client's
    /// sync store, a path mistyped) is refused at start, naming the
    /// directory, and left as it was. The server served it: it wrote its
    /// identity into the store's `meta`, added its databases, and would
    /// have written pushes into the store's own `entities` table.
    @Test func aDataDirectoryHoldingAClientStoreIsRefusedAndLeftAlone() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-client-store")
        let client = directory.appending("client")
        let made = try await ToolRun.running(
            ToolRun.builtProduct("demo", root: Self.root), ["--path", client, "--writers", "1", "--entries-per-writer", "1"])
        #expect(made.status == 0, "\(made.errors)")
        let dataFile = URL(fileURLWithPath: client).appendingPathComponent("data.mdb")
        let before = try Data(contentsOf: dataFile)
        // Its stdin at its end: a server that starts stops at once, status 0.
        let server = try ChildProcess(
            executable: Self.executable.path,
            arguments: ["--data", client, "--port", "0", "--token", "t:alice", "--stop-at-stdin-end"])
        defer { server.kill() }
        #expect(await server.waitForExit(timeout: .seconds(60)))
        #expect(server.ending == .exit(1), "\(server.ending): \(server.outputText)")
        #expect(server.errorText.contains("\(client) holds an LMDB environment that is not a sync server's store"), "\(server.errorText)")
        #expect(try Data(contentsOf: dataFile) == before, "the client's store was written")
    }
}

extension SyncServerProcessTests {
    /// A value that passed the option checks and failed at start (status
    /// 1) is a usage error (status 64, naming the option): `--rate-limit
    /// inf`, as `nan` and negative rates are, and an empty `--host` (an
    /// unset variable), as an empty `--data` is, which failed as "cannot
    /// listen on :0: ... for host , port 0".
    @Test(arguments: [("--rate-limit", "inf", "--rate-limit must be a finite number"), ("--host", "", "--host must name an address")])
    func aValueThatCouldNotServeIsAUsageError(option: String, value: String, message: String) async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-usage-value")
        let run = try await ToolRun.running(
            Self.executable.path, ["--data", directory.appending("data"), "--port", "0", "--token", "t:alice", option, value])
        #expect(run.status == 64, "\(run.status): \(run.errors)")
        #expect(run.errors.contains(message), "\(run.errors)")
        #expect(!FileManager.default.fileExists(atPath: directory.appending("data")))
    }
}

extension SyncServerProcessTests {
    /// A negative number for a numeric option is named as out of range
    /// (status 64): the parser took "-1" for an option name and said
    /// "Missing value for '--port <port>'", of a value the user had given.
    @Test func aNegativeNumberIsNamedAsOutOfRange() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-negative")
        let cases = [
            (["--port", "-1"], "--port must be 0...65535"), (["--idle-timeout", "-5"], "--idle-timeout must be 0...86400"),
            (["--rate-limit", "-1"], "--rate-limit must be a finite number >= 0"), (["--push-buffer-mib", "-2"], "--push-buffer-mib must be"),
            (["--gzip-level", "-1"], "--gzip-level must be 0...9"), (["--gzip-level", "10"], "--gzip-level must be 0...9"),
        ]
        for (arguments, message) in cases {
            let run = try await ToolRun.running(Self.executable.path, ["--data", directory.appending("data"), "--token", "t:alice", "--stop-at-stdin-end"] + arguments)
            #expect(run.status == 64, "\(arguments): \(run.status): \(run.errors)")
            #expect(run.errors.contains(message) && !run.errors.contains("Missing value"), "\(arguments): \(run.errors)")
        }
        #expect(!FileManager.default.fileExists(atPath: directory.appending("data")))
    }
}

extension SyncServerProcessTests {
    /// A `--tokens-file` that is a directory is named as one (status 64):
    /// the message was Foundation's "(NSCocoaErrorDomain error 256.)".
    @Test func aTokensFileThatIsADirectoryIsNamedAsOne() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-tokens-directory")
        let run = try await ToolRun.running(
            Self.executable.path, ["--data", directory.appending("data"), "--tokens-file", directory.path, "--stop-at-stdin-end"])
        #expect(run.status == 64, "\(run.status): \(run.errors)")
        #expect(run.errors.contains("cannot read --tokens-file \(directory.path): it is a directory"), "\(run.errors)")
    }

    /// A `--tokens-file` that is a pipe (`--tokens-file <(...)`, which keeps
    /// the tokens off the disk) is read to its end and served: it was
    /// refused as "You don't have permission", to root too, as Foundation
    /// reads a file by its size.
    @Test func aTokensFileThatIsAPipeIsRead() async throws {
        let directory = try TemporaryDirectory("syncserver-tokens-pipe")
        let tokens = directory.appending("tokens")
        try #require(mkfifo(tokens, 0o600) == 0)
        // Its open waits for the server's: on a thread of its own.
        Thread { try? "t alice\n".write(toFile: tokens, atomically: false, encoding: .utf8) }.start()
        let (server, port) = try await Self.started(["--data", directory.appending("data"), "--port", "0", "--tokens-file", tokens])
        defer { server.kill() }
        #expect(try await Self.send("/v1/pull", port: port).status == 200)
    }

    /// A `--tokens-file` that is not UTF-8 is named with where its first
    /// byte outside UTF-8 is (status 64): the message was Foundation's "The
    /// file isn't in the correct format", which named no place. Its line
    /// is counted by every line ending, as the file's lines are: it was
    /// counted by LF alone.
    @Test func aTokensFileThatIsNotUTF8IsNamedWithItsFirstBadByte() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-tokens-not-utf8")
        let tokens = directory.appending("tokens")
        // A byte UTF-8 never uses, then a sequence cut short by the file's end.
        let cases: [([UInt8], String)] = [
            (Array("t1 alice\nt2 b".utf8) + [0xFF] + Array("ob\n".utf8), "the byte at offset 13 (line 2), 0xFF,"),
            (Array("t1 caf".utf8) + [0xC3], "the byte at offset 6 (line 1), 0xC3,"),
            // Lines ended by CR alone, as the file's lines are numbered.
            (Array("t1 alice\rt2 bob\r\nt3 c".utf8) + [0xFE], "the byte at offset 21 (line 3), 0xFE,"),
        ]
        for (bytes, place) in cases {
            try Data(bytes).write(to: URL(fileURLWithPath: tokens))
            let run = try await ToolRun.running(
                Self.executable.path, ["--data", directory.appending("data"), "--tokens-file", tokens, "--stop-at-stdin-end"])
            #expect(run.status == 64, "\(run.status): \(run.errors)")
            let message = "cannot read --tokens-file \(tokens): it is not UTF-8 text: \(place) begins no valid UTF-8 sequence"
            #expect(run.errors.contains(message), "\(run.errors)")
        }
        #expect(!FileManager.default.fileExists(atPath: directory.appending("data")))
    }
}

extension SyncServerProcessTests {
    /// A misspelled option is named, with the one meant, and a directory
    /// given without --data with that option: the parser reported the
    /// required --data missing first ("Missing expected argument '--data
    /// <data>'"), of a user who had typed it.
    @Test func aMisspelledOptionIsNamedWithTheOneMeant() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-misspelled")
        let run = try await ToolRun.running(Self.executable.path, ["--dta", directory.appending("data"), "--stop-at-stdin-end"])
        #expect(run.status == 64, "\(run.status): \(run.errors)")
        #expect(run.errors.contains("Unknown option '--dta'. Did you mean '--data'?"), "\(run.errors)")
        #expect(!run.errors.contains("Missing"), "\(run.errors)")
        // The directory without its option is named with the option.
        let bare = try await ToolRun.running(Self.executable.path, [directory.appending("data"), "--stop-at-stdin-end"])
        #expect(bare.status == 64, "\(bare.status): \(bare.errors)")
        #expect(bare.errors.contains("Unexpected argument '\(directory.appending("data"))': is it the --data option's value? (--data \(directory.appending("data")))"), "\(bare.errors)")
        // With --data given, a misspelling was already named.
        let other = try await ToolRun.running(Self.executable.path, ["--data", directory.appending("data"), "--prot", "1", "--stop-at-stdin-end"])
        #expect(other.status == 64 && other.errors.contains("Unknown option '--prot'. Did you mean '--port'?"), "\(other.errors)")
        #expect(!FileManager.default.fileExists(atPath: directory.appending("data")))
    }
}

extension SyncServerProcessTests {
    /// Each option refused names itself (status 64): `--burst 0` said
    /// "--rate-limit must be a finite number >= 0 and --burst > 0", of a
    /// user who had given no --rate-limit, and an empty `--data` failed at
    /// start (status 1) with "mkdir (): No such file or directory [2]".
    @Test func anOptionRefusedIsNamedAlone() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-option-refused")
        let cases = [
            (["--data", directory.appending("data"), "--burst", "0"], "Error: --burst must be at least 1\n"),
            (["--data", ""], "Error: --data must name a directory\n"),
        ]
        for (arguments, message) in cases {
            let run = try await ToolRun.running(Self.executable.path, arguments + ["--stop-at-stdin-end"])
            #expect(run.status == 64, "\(arguments): \(run.status): \(run.errors)")
            #expect(run.errors.hasPrefix(message), "\(arguments): \(run.errors)")
        }
        #expect(!FileManager.default.fileExists(atPath: directory.appending("data")))
    }

    /// A --data whose parent directory is missing (a path mistyped) is
    /// named as that (status 1): it said "mkdir (DIR): No such file or
    /// directory [2]", naming neither the option nor the missing parent.
    @Test func aDataDirectoryWhoseParentIsMissingIsNamed() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-no-parent")
        let data = directory.appending("missing/data")
        let run = try await ToolRun.running(Self.executable.path, ["--data", data, "--port", "0", "--stop-at-stdin-end"])
        #expect(run.status == 1, "\(run.status): \(run.errors)")
        #expect(
            run.errors.contains("cannot make --data \(data): \(directory.appending("missing")) does not exist; only the store's own directory is made"),
            "\(run.errors)")
        #expect(!FileManager.default.fileExists(atPath: directory.appending("missing")))
    }
}

/// `sync-protocol.md` section 9, "Durable acknowledgment", with
/// `--durability full`: a push is answered only after its commit reached
/// the disk. `syncserver` runs under `strace`, which records each
/// `fdatasync` and each answer written to a socket, in time order: every
/// push's 200 follows an `fdatasync` made after the answer before it. (A
/// SIGKILL test shows the commit; only a sync shows it would survive a
/// power loss.) With `--durability process` there is no sync to see.
@Suite struct DurableAnswerProcessTests {
    static var straceInstalled: Bool { ToolRun.onPath("strace") != nil }

    /// What the trace of `pushes` pushes, one at a time, shows: for each
    /// answer, whether an `fdatasync` ended between it and the one before.
    static func syncedAnswers(durability: String, pushes: Int) async throws -> [Bool] {
        let directory = try TemporaryDirectory("syncserver-durable-\(durability)")
        let trace = directory.appending("trace")
        let strace = try #require(ToolRun.onPath("strace"))
        let server = try ChildProcess(
            "strace", executable: strace,
            arguments: [
                "-f", "-qq", "-ttt", "-o", trace, "-e", "trace=fdatasync,write,writev,sendmsg",
                SyncServerProcessTests.executable.path, "--data", directory.appending("data"), "--port", "0",
                "--token", "t:alice", "--durability", durability,
            ], ownProcessGroup: true)
        defer { server.kill() }
        let banner = await server.waitForLine(timeout: .seconds(60)) { SyncServerBanner.port(in: $0) != nil }
        let port = try #require(banner.flatMap(SyncServerBanner.port(in:)), "no banner: \(server.errorText)")
        for n in 0..<pushes {
            _ = try await KilledMidPushProcessTests.push([operation(.create, "t\(n)", ["n": 1], key: "k\(n)")], port: port, session: .shared)
        }
        // Stopped by a signal it handles, strace writes out its whole trace.
        server.kill(SIGTERM)
        #expect(await server.waitForExit(timeout: .seconds(30)))
        let lines = try String(contentsOfFile: trace, encoding: .utf8).split(separator: "\n")
        // "PID SECONDS.MICROS call(...) = result", ordered by the time each
        // line was written: an unfinished call is written when it resumes.
        let events = lines.compactMap { line -> (time: Double, isSync: Bool)? in
            let words = line.split(separator: " ", maxSplits: 2)
            guard words.count == 3, let time = Double(words[1]) else { return nil }
            let call = words[2]
            if call.hasPrefix("fdatasync(") || call.hasPrefix("<... fdatasync resumed>") {
                return call.hasSuffix("= 0") ? (time, true) : nil
            }
            return call.contains("\"HTTP/1.1 200") ? (time, false) : nil
        }.sorted { $0.time < $1.time }
        var answers: [Bool] = []
        var synced = false
        for event in events {
            if event.isSync {
                synced = true
            } else {
                answers.append(synced)
                synced = false
            }
        }
        return answers
    }

    @Test(.enabled(if: straceInstalled, "strace is not installed"))
    func everyPushIsSyncedBeforeItsAnswer() async throws {
        #expect(try await Self.syncedAnswers(durability: "full", pushes: 5) == Array(repeating: true, count: 5))
        // The trace tells a sync from none: without them, no answer follows one.
        #expect(try await Self.syncedAnswers(durability: "process", pushes: 5) == Array(repeating: false, count: 5))
    }
}

/// A commit the disk refuses (`fdatasync` failing with ENOSPC or EIO,
/// made to by strace): the push it was for is not acknowledged but failed
/// with `500 INTERNAL_ERROR` (`sync-protocol.md` section 7, "Durability of
/// \"applied\""), the log names the cause, and the server, whose store
/// LMDB has failed, answers 503 until it is restarted (`--reopen-after 0`:
/// it does not reopen the store itself). Restarted, it has
/// every push it acknowledged and nothing of the failed one, whose key it
/// does not remember: pushed again, it is applied.
@Suite struct FailedCommitProcessTests {
    /// A push of one create of `id`, with `id` as its key.
    static func push(_ id: String) throws -> Data {
        try JSONEncoder().encode(PushRequest(operations: [operation(.create, id, ["n": 1], key: id)]))
    }

    /// The ids of the changes a pull from the start gives, page by page.
    static func pulledIDs(_ port: Int) async throws -> [String] {
        var ids: [String] = []
        var cursor = ""
        while true {
            let query = cursor.isEmpty ? "" : "?cursor=\(cursor)"
            let page = try JSONDecoder().decode(
                PullResponse.self, from: try await SyncServerProcessTests.send("/v1/pull\(query)", port: port).body)
            ids += page.changes.map(\.entityID)
            cursor = page.cursor
            if !page.hasMore { return ids }
        }
    }

    /// The server's arguments for the store at `data` (`.full`, user
    /// alice with token `t`), reopening it `reopenAfter` seconds after a
    /// failed commit (0: never).
    static func arguments(_ data: String, reopenAfter: Int) -> [String] {
        ["--data", data, "--port", "0", "--token", "t:alice", "--durability", "full", "--reopen-after", String(reopenAfter)]
    }

    /// Makes the store with one push, `kept`, acknowledged, and stops its
    /// server: gone, with its lock on the data directory, when this returns.
    static func makeStoreWithOnePush(_ arguments: [String]) async throws {
        let (server, port) = try await SyncServerProcessTests.started(arguments)
        defer { server.kill() }
        #expect(try await SyncServerProcessTests.send("/v1/push", port: port, body: push("kept")).status == 200)
        server.kill()
        #expect(await server.waitForExit(timeout: .seconds(30)))
    }

    /// Makes the store (`makeStoreWithOnePush`); then starts the server
    /// again under strace, which fails every `fdatasync` it makes with
    /// `error`.
    /// - Returns: the server (strace and it, a group of their own: the
    ///   pipes close when the server ends) and its port.
    static func startedFailingSyncs(_ arguments: [String], error: String) async throws -> (ChildProcess, Int) {
        try await makeStoreWithOnePush(arguments)
        let strace = try #require(ToolRun.onPath("strace"))
        let server = try ChildProcess(
            "strace", executable: strace,
            arguments: ["-f", "-qq", "-o", "/dev/null", "-e", "trace=fdatasync", "-e", "inject=fdatasync:error=\(error)"]
                + [SyncServerProcessTests.executable.path] + arguments,
            ownProcessGroup: true)
        return (server, try await port(of: server))
    }

    /// The port in `server`'s banner; without one, the server is killed.
    static func port(of server: ChildProcess) async throws -> Int {
        let banner = await server.waitForLine(timeout: .seconds(60)) { SyncServerBanner.port(in: $0) != nil }
        let port = banner.flatMap(SyncServerBanner.port(in:))
        if port == nil { server.kill() }
        return try #require(port, "no banner: \(server.errorText)")
    }

    static var prlimitInstalled: Bool { ToolRun.onPath("prlimit") != nil }

    /// Makes the store (`makeStoreWithOnePush`); then starts the server
    /// again with a file size limit (`RLIMIT_FSIZE`, set by util-linux's
    /// `prlimit`, which then runs the server in its place) 64 KiB over its
    /// data file: a commit that grows the file past it fails part way
    /// through writing its pages, as on a full disk, until `makeRoom`.
    static func startedWithLittleRoom(_ arguments: [String], data: String) async throws -> (ChildProcess, Int) {
        try await makeStoreWithOnePush(arguments)
        let size = try #require(try FileManager.default.attributesOfItem(atPath: data + "/data.mdb")[.size] as? Int)
        let prlimit = try #require(ToolRun.onPath("prlimit"))
        let server = try ChildProcess(
            "syncserver", executable: prlimit,
            arguments: ["--fsize=\(size + 65_536):unlimited", "--", SyncServerProcessTests.executable.path] + arguments)
        return (server, try await port(of: server))
    }

    /// Lifts the file size limit of the server `startedWithLittleRoom`
    /// started (its process ID), as a disk that was full gets room again.
    static func makeRoom(_ pid: Int32) async throws {
        let prlimit = try #require(ToolRun.onPath("prlimit"))
        let run = try await ToolRun.running(prlimit, ["--pid", String(pid), "--fsize=unlimited:unlimited"])
        #expect(run.status == 0, "\(run.errors)")
    }

    /// Makes room (`makeRoom`) for the first caller only.
    actor RoomMaker {
        let pid: Int32
        private var made = false

        init(pid: Int32) { self.pid = pid }

        func makeRoomOnce() async throws {
            guard !made else { return }
            made = true
            try await FailedCommitProcessTests.makeRoom(pid)
        }
    }

    /// Pushes `p0`, `p1`, ... one at a time until one is not answered 200
    /// (at most 2,000).
    /// - Returns: the keys applied, and the one that was not (nil when
    ///   none failed) with its status.
    static func pushUntilAFailure(_ port: Int) async throws -> (applied: [String], failed: String?, status: Int) {
        var applied: [String] = []
        for number in 0..<2_000 {
            let key = "p\(number)"
            let status = try await SyncServerProcessTests.send("/v1/push", port: port, body: push(key)).status
            guard status == 200 else { return (applied, key, status) }
            applied.append(key)
        }
        return (applied, nil, 200)
    }

    /// Requests health every 100 ms until it is 200, for at most 30 s.
    /// - Returns: its last status.
    static func healthOnceReopened(_ port: Int) async throws -> Int {
        var health = 503
        for _ in 0..<300 where health != 200 {
            try await Task.sleep(for: .milliseconds(100))
            health = try await SyncServerProcessTests.send("/v1/health", port: port).status
        }
        return health
    }

    @Test(.enabled(if: DurableAnswerProcessTests.straceInstalled, "strace is not installed"), arguments: [
        ("ENOSPC", "No space left on device"), ("EIO", "Input/output error"),
    ])
    func aPushWhoseCommitFailsIsNotAcknowledgedAndLosesNothing(error: String, message: String) async throws {
        let directory = try TemporaryDirectory("syncserver-failed-commit")
        let data = directory.appending("data")
        let arguments = Self.arguments(data, reopenAfter: 0)
        let push = Self.push
        do {
            let (server, port) = try await Self.startedFailingSyncs(arguments, error: error)
            defer { server.kill() }
            let failed = try await SyncServerProcessTests.send("/v1/push", port: port, body: push("failed"))
            let reply = try JSONDecoder().decode(ErrorEnvelope.self, from: failed.body).error
            #expect(failed.status == 500 && reply.code == .internalError && reply.retryable, "\(reply)")
            for (path, body) in [("/v1/health", nil), ("/v1/pull", nil), ("/v1/push", try push("after"))] {
                let answer = try await SyncServerProcessTests.send(path, port: port, body: body)
                #expect(answer.status == 503, "\(path): \(String(decoding: answer.body, as: UTF8.self))")
                #expect(answer.retryAfter == "30", "\(path): no reopening to wait for")
            }
            // Not reopened later either (0 is never, not at once).
            try await Task.sleep(for: .milliseconds(1_500))
            #expect(try await SyncServerProcessTests.send("/v1/health", port: port).status == 503)
            // strace and the server both (a group of their own): the pipes
            // close when the server ends.
            server.kill()
            #expect(await server.waitForExit(timeout: .seconds(30)))
            #expect(server.errorText.contains("request failed: mdb_txn_commit (\(data)): \(message)"), "\(server.errorText)")
        }
        let (server, port) = try await SyncServerProcessTests.started(arguments)
        defer { server.kill() }
        #expect(try await Self.pulledIDs(port) == ["kept"])
        let again = try JSONDecoder().decode(PushResponse.self, from: try await SyncServerProcessTests.send("/v1/push", port: port, body: push("failed")).body)
        #expect(again.results.map(\.status) == [.applied])
        #expect(try await Self.pulledIDs(port) == ["kept", "failed"])
    }
}

extension FailedCommitProcessTests {
    /// After a failed commit (here a data file that cannot grow: a file
    /// size limit, as a full disk) the server reopens its store by itself
    /// (`--reopen-after`), as a restart would: 503 until then, with the
    /// time left in `Retry-After`. Reopened while the file still cannot
    /// grow, its next commit fails too, and it reopens again. Once there
    /// is room it serves again, with every push it acknowledged and
    /// nothing of the failed ones, which pushed again are applied, and
    /// what it applies after the reopening is in the store when it next
    /// starts. (Before, the server answered 503 until an operator
    /// restarted it.)
    @Test(.enabled(if: FailedCommitProcessTests.prlimitInstalled, "prlimit is not installed"))
    func aServerWhoseCommitFailedReopensItsStoreAndServesAgain() async throws {
        let directory = try TemporaryDirectory("syncserver-reopen")
        let data = directory.appending("data")
        let arguments = Self.arguments(data, reopenAfter: 3)
        let pushed: [String]
        do {
            let (server, port) = try await Self.startedWithLittleRoom(arguments, data: data)
            defer { server.kill() }
            let (applied, failed, status) = try await Self.pushUntilAFailure(port)
            let failedKey = try #require(failed, "2,000 pushes and none failed")
            #expect(status == 500)
            // 503 until the reopening, with the time left to it (the
            // server's answer comes within the 3 s, unless the host stalls).
            let waiting = try await SyncServerProcessTests.send("/v1/health", port: port)
            #expect(waiting.status == 503 && (1...3).contains(waiting.retryAfter.flatMap { Int($0) } ?? 0), "\(waiting)")
            var health = try await Self.healthOnceReopened(port)
            #expect(health == 200, "still \(health) after 30 s: \(server.errorText)")
            #expect(try await SyncServerProcessTests.send("/v1/push", port: port, body: Self.push("still-full")).status == 500)
            try await Self.makeRoom(server.pid)
            health = try await Self.healthOnceReopened(port)
            #expect(health == 200, "still \(health) after 30 s: \(server.errorText)")
            for key in [failedKey, "still-full"] {
                let again = try JSONDecoder().decode(
                    PushResponse.self, from: try await SyncServerProcessTests.send("/v1/push", port: port, body: Self.push(key)).body)
                #expect(again.results.map(\.status) == [.applied], "\(key)")
            }
            #expect(try await SyncServerProcessTests.send("/v1/push", port: port, body: Self.push("after")).status == 200)
            pushed = ["kept"] + applied + [failedKey, "still-full", "after"]
            server.kill()
            #expect(await server.waitForExit(timeout: .seconds(30)))
            let log = server.errorText
            let seen = log.range(of: "the store failed; reopening it in 3")
            let reopened = log.range(of: "reopened the store at \(data)")
            #expect(seen != nil && reopened != nil && seen!.lowerBound < reopened!.lowerBound, "\(log)")
        }
        let (server, port) = try await SyncServerProcessTests.started(arguments)
        defer { server.kill() }
        #expect(try await Self.pulledIDs(port) == pushed)
    }
}

extension FailedCommitProcessTests {
    /// A store found damaged as the server reopens it after a failed commit
    /// (here its server ID, written by another process meanwhile) is one it
    /// would refuse at start: it is not served, the server says why and
    /// that it will not try again, and it does not (one attempt in the log,
    /// however many requests come after), answering 503 with `Retry-After:
    /// 30`. The damage is left as it was.
    @Test(.enabled(if: FailedCommitProcessTests.prlimitInstalled, "prlimit is not installed"))
    func aStoreDamagedWhileFailedIsNotReopenedAgainAndAgain() async throws {
        let directory = try TemporaryDirectory("syncserver-reopen-refused")
        let data = directory.appending("data")
        let arguments = Self.arguments(data, reopenAfter: 1)
        let (server, port) = try await Self.startedWithLittleRoom(arguments, data: data)
        defer { server.kill() }
        #expect(try await Self.pushUntilAFailure(port).status == 500)
        let damaged = [UInt8](repeating: 1, count: 5)
        do {
            let environment = try Environment(path: data)
            defer { environment.close() }
            let meta = try #require(try environment.openDatabase("meta", create: false))
            try environment.write { txn in try txn.put(meta, key: Array("server-id".utf8), value: damaged) }
        }
        // Requests for 3 s, past the first attempt (due 1 s after the
        // failure) and two more intervals.
        let end = ContinuousClock.now + .seconds(3)
        var last = try await SyncServerProcessTests.send("/v1/health", port: port)
        while ContinuousClock.now < end {
            try await Task.sleep(for: .milliseconds(100))
            last = try await SyncServerProcessTests.send("/v1/health", port: port)
        }
        #expect(last.status == 503 && last.retryAfter == "30", "\(last)")
        server.kill()
        #expect(await server.waitForExit(timeout: .seconds(30)))
        let log = server.errorText
        #expect(log.components(separatedBy: "the store cannot be served again").count == 2, "one attempt: \(log)")
        #expect(log.contains("server-id") && !log.contains("reopened the store"), "\(log)")
        let environment = try Environment(path: data)
        defer { environment.close() }
        let meta = try #require(try environment.openDatabase("meta", create: false))
        #expect(try environment.read { txn in try txn.get(meta, key: Array("server-id".utf8)) } == damaged)
    }

    /// Four clients push at once, one create each time, while commits fail
    /// (the data file cannot grow: a file size limit, as a full disk, until
    /// the first client to see a push fail makes room) and the server
    /// reopens its store: the pushes in flight then are answered 500 or
    /// 503, and pushing goes on after the reopening. Every push answered
    /// `applied`, before the failure or after it, is in the store once when
    /// it next starts, and the store holds nothing that was not pushed.
    @Test(.enabled(if: FailedCommitProcessTests.prlimitInstalled, "prlimit is not installed"))
    func pushesFromManyClientsAcrossAReopeningLoseNothing() async throws {
        let directory = try TemporaryDirectory("syncserver-reopen-concurrent")
        let data = directory.appending("data")
        let arguments = Self.arguments(data, reopenAfter: 1)
        /// What one client's pushes were answered.
        struct Answers: Sendable {
            var applied: [String] = []
            /// Not answered `applied`: in the store once or not at all.
            var unknown: [String] = []
            /// Applied after a push that was not.
            var appliedAfterAFailure = 0
        }
        let answers: [Answers]
        do {
            let (server, port) = try await Self.startedWithLittleRoom(arguments, data: data)
            defer { server.kill() }
            let roomMaker = RoomMaker(pid: server.pid)
            answers = try await withThrowingTaskGroup(of: Answers.self) { group in
                for client in 0..<4 {
                    group.addTask {
                        var answers = Answers()
                        // Until five pushes applied after one that was not,
                        // or 30 s of pushing.
                        let end = ContinuousClock.now + .seconds(30)
                        var number = 0
                        while answers.appliedAfterAFailure < 5, ContinuousClock.now < end {
                            let key = "c\(client)-\(number)"
                            number += 1
                            // A connection cut is a push without an answer too.
                            var applied = false
                            if let reply = try? await SyncServerProcessTests.send("/v1/push", port: port, body: Self.push(key)),
                                reply.status == 200
                            {
                                applied = try JSONDecoder().decode(PushResponse.self, from: reply.body).results.map(\.status) == [.applied]
                            }
                            if applied {
                                answers.applied.append(key)
                                if !answers.unknown.isEmpty { answers.appliedAfterAFailure += 1 }
                            } else {
                                answers.unknown.append(key)
                                try await roomMaker.makeRoomOnce()
                                try await Task.sleep(for: .milliseconds(50))
                            }
                        }
                        return answers
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            server.kill()
            #expect(await server.waitForExit(timeout: .seconds(30)))
            #expect(server.errorText.contains("reopened the store at \(data)"), "\(server.errorText)")
        }
        #expect(answers.allSatisfy { $0.appliedAfterAFailure == 5 }, "a client pushed on for 30 s without 5 pushes applied after a failed one")
        let (server, port) = try await SyncServerProcessTests.started(arguments)
        defer { server.kill() }
        let stored = try await Self.pulledIDs(port)
        let applied = Set(answers.flatMap(\.applied))
        let pushed = applied.union(answers.flatMap(\.unknown)).union(["kept"])
        #expect(stored.count == Set(stored).count, "a change twice in the feed")
        #expect(applied.subtracting(stored).isEmpty, "applied but not stored: \(applied.subtracting(stored).sorted())")
        #expect(Set(stored).subtracting(pushed).isEmpty, "stored but never pushed: \(Set(stored).subtracting(pushed).sorted())")
        #expect(applied.count > 20, "\(applied.count) pushes applied")
    }
}

/// Cursors a hostile or confused client makes up, sent to the executable so
/// that a crash shows as a dead process rather than a dead test run.
@Suite struct ForgedCursorProcessTests {
    /// A cursor in the reference server's encoding (`Pull.swift`): the server
    /// ID, the resync generation and a feed offset, base64url.
    static func cursor(serverID: String, generation: UInt64, offset: UInt64) throws -> String {
        let id = try #require(UUIDv7(ulidString: serverID))
        let bytes = id.bytes + generation.bigEndianBytes + offset.bigEndianBytes
        return Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    @Test func cursorsTheServerNeverIssuedAreInvalidAndNeverCrashIt() async throws {
        let directory = try TemporaryDirectory("syncserver-forged-cursor")
        let (server, port) = try await SyncServerProcessTests.started(
            ["--data", directory.appending("data"), "--port", "0", "--token", "t:alice"])
        defer { server.kill() }
        func send(_ path: String, body: Data? = nil) async throws -> (Int, Data) {
            let answer = try await SyncServerProcessTests.send(path, port: port, body: body)
            return (answer.status, answer.body)
        }
        let push = try JSONEncoder().encode(PushRequest(operations: [operation(.create, "t1", ["n": 1], key: "k")]))
        #expect(try await send("/v1/push", body: push).0 == 200)
        let serverID = try JSONDecoder().decode(HealthResponse.self, from: try await send("/v1/health").1).serverID
        // The feed holds one change: offsets past it, and generations after
        // the current one (0), were never issued.
        let forged = [
            (generation: UInt64(0), offset: UInt64(2)), (0, 1 << 40), (1, 0), (7, 1), (0, UInt64.max),
        ]
        for (generation, offset) in forged {
            let cursor = try Self.cursor(serverID: serverID, generation: generation, offset: offset)
            let reply = try? await send("/v1/pull?cursor=\(cursor)")
            #expect(reply?.0 == 410, "generation \(generation), offset \(offset): \(reply.map { String(decoding: $0.1, as: UTF8.self) } ?? "no answer")")
            #expect(server.isRunning, "generation \(generation), offset \(offset): the server died: \(server.errorText.suffix(300))")
            if !server.isRunning { return }
        }
        // The cursors it did issue still work.
        let page = try JSONDecoder().decode(PullResponse.self, from: try await send("/v1/pull").1)
        #expect(page.changes.count == 1)
        #expect(try await send("/v1/pull?cursor=\(page.cursor)").0 == 200)
    }
}

/// `syncserver` killed with SIGKILL while several clients push: what it
/// answered before it died is kept (`sync-protocol.md` section 9,
/// "Durable acknowledgment"), and a push it did not answer was applied in
/// whole or not at all (one transaction), so pushing it again answers all
/// of it `duplicate` or all of it `applied`.
@Suite struct KilledMidPushProcessTests {
    static let writerCount = 4
    /// Answers, over all writers, after which the server is killed.
    static let answersBeforeKill = 40

    struct Sent: Sendable {
        var operations: [PushOperation]
        /// Nil: no answer came (the server died first).
        var results: [PushResult]?
    }

    final class Counter: Sendable {
        private let value = Atomic(0)
        func increment() -> Int { value.add(1, ordering: .sequentiallyConsistent).newValue }
    }

    static func start(_ data: String) async throws -> (ChildProcess, Int) {
        try await SyncServerProcessTests.started(
            ["--data", data, "--port", "0", "--token", "t:alice", "--durability", "full", "--stop-at-stdin-end"],
            holdingStdinOpen: true)
    }

    static func push(_ operations: [PushOperation], port: Int, session: URLSession) async throws -> [PushResult] {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/v1/push")!)
        request.httpMethod = "POST"
        request.setValue("Bearer t", forHTTPHeaderField: "Authorization")
        request.httpBody = try JSONEncoder().encode(PushRequest(operations: operations))
        let (data, response) = try await session.dataIgnoringCancellation(for: request)
        try #require((response as? HTTPURLResponse)?.statusCode == 200, "\(String(decoding: data, as: UTF8.self))")
        return try JSONDecoder().decode(PushResponse.self, from: data).results
    }

    @Test func aServerKilledMidPushKeepsEveryAnswerAndAppliesNoPushInPart() async throws {
        let directory = try TemporaryDirectory("syncserver-killed-mid-push")
        let data = directory.appending("data")
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = 60
        let session = URLSession(configuration: configuration)
        let (server, port) = try await Self.start(data)
        defer { server.kill() }
        _ = try await Self.push([operation(.create, "shared", [:], key: "shared")], port: port, session: session)
        let answers = Counter()
        // Each writer pushes until a push gets no answer: creates of its
        // own, and its own field of a shared entity, against the version
        // its last answer gave.
        let sent = await withTaskGroup(of: [Sent].self) { group in
            for writer in 0..<Self.writerCount {
                group.addTask {
                    var sent: [Sent] = []
                    var base: UInt64 = 1
                    for request in 0..<10_000 {
                        let operations = (0..<3).map { operation(.create, "w\(writer)-\(request)-\($0)", ["n": .int(Int64($0))]) }
                            + [operation(.update, "shared", ["w\(writer)": .int(Int64(request))], base: base)]
                        guard let results = try? await Self.push(operations, port: port, session: session) else {
                            sent.append(Sent(operations: operations, results: nil))
                            break
                        }
                        sent.append(Sent(operations: operations, results: results))
                        base = results.last?.serverVersion ?? base
                        if answers.increment() == Self.answersBeforeKill { server.kill(SIGKILL) }
                    }
                    return sent
                }
            }
            return await group.reduce(into: []) { $0 += $1 }
        }
        #expect(await server.waitForExit(timeout: .seconds(60)))
        #expect(server.ending == .signal(SIGKILL), "\(server.ending): \(server.errorText.suffix(300))")
        let answered = sent.filter { $0.results != nil }
        #expect(answered.count >= Self.answersBeforeKill)
        #expect(answered.allSatisfy { $0.results!.allSatisfy { $0.status == .applied } })

        let (restarted, again) = try await Self.start(data)
        defer { restarted.kill() }
        // Every answer survived: each key is remembered with its version.
        for push in answered {
            let repeated = try await Self.push(push.operations, port: again, session: session)
            #expect(repeated.map(\.status) == push.operations.map { _ in .duplicate })
            #expect(repeated.map(\.serverVersion) == push.results!.map(\.serverVersion))
        }
        // A push left unanswered is all there or not at all.
        for push in sent where push.results == nil {
            let statuses = Set(try await Self.push(push.operations, port: again, session: session).map(\.status))
            #expect(statuses == [.duplicate] || statuses == [.applied], "\(push.operations[0].entityID): \(statuses)")
        }
        // The feed holds each entity's versions once, in order, up to its
        // state, and nothing of a push in part.
        var versions: [String: UInt64] = [:]
        var cursor: String?
        for _ in 0..<10_000 {
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(again)/v1/pull?limit=1000\(cursor.map { "&cursor=\($0)" } ?? "")")!)
            request.setValue("Bearer t", forHTTPHeaderField: "Authorization")
            let page = try JSONDecoder().decode(PullResponse.self, from: try await session.dataIgnoringCancellation(for: request).0)
            for change in page.changes {
                #expect(change.serverVersion == (versions[change.entityID] ?? 0) + 1, "\(change.entityID) \(change.serverVersion)")
                versions[change.entityID] = change.serverVersion
            }
            cursor = page.cursor
            if !page.hasMore { break }
        }
        let writes = sent.count
        #expect(versions.count == 1 + 3 * writes)
        #expect(versions["shared"] == UInt64(1 + writes))
    }
}

/// A user's name is a key of the server's store, which LMDB caps at 511
/// bytes: a longer one was taken at start, and then every push of that
/// user was a retryable 500 (`mdb_put: MDB_BAD_VALSIZE`), which clients
/// retry for good. It is refused at start, naming where; 511 bytes serve.
@Suite struct UserNameProcessTests {
    @Test func aUserNameLongerThanTheStoreTakesIsRefusedAtStart() async throws {
        let executable = SyncServerProcessTests.executable
        try #require(FileManager.default.isExecutableFile(atPath: executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-user-names")
        let tokens = directory.appending("tokens")
        let long = String(repeating: "\u{E9}", count: 256)  // 512 bytes
        try Data("t1 alice\nt2 \(long)\n".utf8).write(to: URL(fileURLWithPath: tokens))
        for (arguments, place) in [(["--token", "t:\(long)"], "--token t:"), (["--tokens-file", tokens], "\(tokens):2")] {
            let refused = try ChildProcess(
                executable: executable.path, arguments: ["--data", directory.appending("data"), "--port", "0"] + arguments)
            defer { refused.kill() }
            let banner = await refused.waitForLine(timeout: .seconds(60)) { SyncServerBanner.port(in: $0) != nil }
            #expect(banner == nil, "it started with a user of 512 bytes")
            if banner != nil { continue }
            #expect(await refused.waitForExit(timeout: .seconds(60)))
            #expect(refused.ending != .exit(0))
            #expect(refused.errorText.contains(place) && refused.errorText.contains("511 bytes"), "\(refused.errorText)")
        }

        let (server, port) = try await SyncServerProcessTests.started(
            ["--data", directory.appending("data"), "--port", "0", "--token", "t:\(String(repeating: "u", count: 511))"])
        defer { server.kill() }
        let results = try await KilledMidPushProcessTests.push(
            [operation(.create, "t1", ["n": 1])], port: port, session: URLSession(configuration: .ephemeral))
        #expect(results.map(\.status) == [.applied])
    }
}

/// A user's keys start with a 4-byte number, given when the user first
/// writes (`ServerStorage`). Past the last one, the next user's push made
/// the number overflow, and the trap took the whole server down; it is a
/// 500 for that push, and the other users are served. The store's counter
/// is forged so that one number is left.
@Suite struct UserNumberProcessTests {
    @Test func aServerOutOfUserNumbersRefusesANewUserAndServesTheOthers() async throws {
        let directory = try TemporaryDirectory("syncserver-user-numbers")
        let data = directory.appending("data")
        do {
            let environment = try Environment(path: data)
            defer { environment.close() }
            let meta = try #require(try environment.openDatabase("meta", create: true))
            // A server's store, as its first start leaves it (the server
            // refuses a meta without its id), whose users took every number
            // but the last.
            try environment.write { txn in
                try txn.put(meta, key: Array("server-id".utf8), value: UUIDv7.Generator.shared.next().bytes)
                try txn.put(meta, key: Array("next-user".utf8), value: (UInt32.max - 1).bigEndianBytes)
            }
        }
        let (server, port) = try await SyncServerProcessTests.started(
            ["--data", data, "--port", "0", "--token", "a:alice", "--token", "b:bob"])
        defer { server.kill() }
        let session = URLSession(configuration: .ephemeral)
        func push(_ token: String, _ id: String) async -> (status: Int, body: String)? {
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/v1/push")!)
            request.httpMethod = "POST"
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
            request.httpBody = try? JSONEncoder().encode(PushRequest(operations: [operation(.create, id, ["n": 1])]))
            guard let (body, response) = try? await session.dataIgnoringCancellation(for: request) else { return nil }
            return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: body, as: UTF8.self))
        }
        // Alice takes the last number, 2^32 - 1.
        #expect(await push("a", "t1")?.status == 200)
        let refused = await push("b", "t1")
        #expect(refused?.status == 500, "\(refused.map { "\($0)" } ?? "no answer"): \(server.errorText.suffix(300))")
        #expect(refused?.body.contains("no user number left") == true)
        #expect(server.isRunning, "the server died: \(server.errorText.suffix(300))")
        #expect(await push("a", "t2")?.status == 200)
    }
}

/// One server per data directory: a second `syncserver` on a `--data` that
/// another one serves is refused at start (status 1), naming the directory
/// and the pid of the one serving it. Both served it: LMDB kept the bytes
/// consistent, but each process had its own rate limits, push buffer and
/// writer queue, and nothing told the operator. The lock dies with its
/// process: a server killed with SIGKILL leaves none that blocks a restart.
@Suite struct DataDirectoryLockProcessTests {
    @Test func aSecondServerOnTheSameDataIsRefusedAndAKilledOnesLockDoesNotBlock() async throws {
        let executable = SyncServerProcessTests.executable
        let directory = try TemporaryDirectory("syncserver-data-lock")
        let data = directory.appending("data")
        let (first, _) = try await SyncServerProcessTests.started(["--data", data, "--port", "0", "--token", "t:alice"])
        defer { first.kill() }

        // Its stdin at its end: a second server that started would stop at once, status 0.
        let second = try ChildProcess(
            executable: executable.path, arguments: ["--data", data, "--port", "0", "--token", "t:alice", "--stop-at-stdin-end"])
        defer { second.kill() }
        #expect(await second.waitForExit(timeout: .seconds(60)))
        #expect(second.ending == .exit(1), "\(second.ending): \(second.outputText)")
        #expect(!second.outputText.contains("listening on"), "\(second.outputText)")
        #expect(second.errorText.contains("dataDirectory \(data) is in use by another sync server (pid \(first.pid))"), "\(second.errorText)")
        #expect(first.isRunning)

        first.kill(SIGKILL)
        #expect(await first.waitForExit(timeout: .seconds(60)))
        let (restarted, _) = try await SyncServerProcessTests.started(["--data", data, "--port", "0", "--token", "t:alice"])
        restarted.kill()
    }
}

/// `--help` gives the exit statuses, as `logtool`'s and `crashtest`'s do:
/// it gave none, though a server that cannot start ends with 1 and a usage
/// mistake with 64.
@Suite struct SyncServerHelpTests {
    @Test func theHelpGivesTheExitStatuses() async throws {
        let help = try await ToolRun.running(SyncServerProcessTests.executable.path, ["--help"])
        #expect(help.status == 0)
        let text = help.output.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        // Each option's value is named for what it is, not for the option.
        for option in ["--data <dir>", "--tokens-file <file>", "--token <token:user>", "--admin-token <token>", "--idle-timeout <seconds>", "--body-timeout <seconds>"] {
            #expect(text.contains(option), "\(option): \(help.output)")
        }
        #expect(text.contains("Exit status: 0 stopped (SIGTERM, SIGINT, or stdin's end with --stop-at-stdin-end), 1 it could not start (an address it cannot listen on, a --data refused) or its store's data file was cut short under it, 64 usage (an option or a token refused)."), "\(help.output)")
    }
}

/// A `--data` that is a directory holding files but no store (notes, another
/// program's files, a path mistyped) is refused at start (status 1), naming
/// the directory and what it holds, and left as it was: the server made its
/// store among the files. An empty directory is served, as a missing one is.
@Suite struct DataDirectoryContentsProcessTests {
    @Test func aDirectoryHoldingFilesButNoStoreIsRefusedAndLeftAlone() async throws {
        let executable = SyncServerProcessTests.executable
        try #require(FileManager.default.isExecutableFile(atPath: executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-not-a-store")
        let data = directory.appending("notes")
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: false)
        try Data("keep me\n".utf8).write(to: URL(fileURLWithPath: data).appendingPathComponent("notes.txt"))
        // Its stdin at its end: a server that starts stops at once, status 0.
        let server = try ChildProcess(
            executable: executable.path, arguments: ["--data", data, "--port", "0", "--token", "t:alice", "--stop-at-stdin-end"])
        defer { server.kill() }
        #expect(await server.waitForExit(timeout: .seconds(60)))
        #expect(server.ending == .exit(1), "\(server.ending): \(server.outputText)")
        #expect(server.errorText.contains("dataDirectory \(data) holds no server store") && server.errorText.contains("notes.txt"), "\(server.errorText)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: data) == ["notes.txt"])

        let empty = directory.appending("empty")
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: false)
        let (served, _) = try await SyncServerProcessTests.started(["--data", empty, "--port", "0", "--token", "t:alice"])
        served.kill()
    }

    /// A `--data` that names a file (a store path mistyped, the tokens
    /// file) is refused naming it as a file: the server said "open
    /// (FILE): Not a directory [20]", LMDB's call and its code.
    @Test func aFileIsRefusedAsOne() async throws {
        let directory = try TemporaryDirectory("syncserver-data-file")
        let file = directory.appending("tokens.txt")
        try Data("t alice\n".utf8).write(to: URL(fileURLWithPath: file))
        let server = try ChildProcess(
            executable: SyncServerProcessTests.executable.path, arguments: ["--data", file, "--port", "0", "--token", "t:alice", "--stop-at-stdin-end"])
        defer { server.kill() }
        #expect(await server.waitForExit(timeout: .seconds(60)))
        #expect(server.ending == .exit(1), "\(server.ending): \(server.outputText)")
        #expect(server.errorText.contains("dataDirectory \(file) is a file, not a directory; give a missing or empty directory, or a server's store"), "\(server.errorText)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "t alice\n")
    }

    /// A fresh file system's mount point holds only `lost+found`, which
    /// `mkfs` makes: it is served as an empty directory is, and the store
    /// is made beside it. Before, it was refused as holding files but no
    /// store, and an operator had to serve a subdirectory.
    @Test func aDirectoryHoldingOnlyLostAndFoundIsServed() async throws {
        let directory = try TemporaryDirectory("syncserver-mount-point")
        let data = directory.appending("mount")
        try FileManager.default.createDirectory(atPath: data + "/lost+found", withIntermediateDirectories: true)
        let (served, _) = try await SyncServerProcessTests.started(["--data", data, "--port", "0", "--token", "t:alice"])
        served.kill()
        #expect(try FileManager.default.contentsOfDirectory(atPath: data).contains("data.mdb"))
    }
}

/// A damaged server ID (the `meta` key `server-id` that is not a UUIDv7: of
/// another length, or 16 bytes without version 7's bits) is refused at start
/// (status 1), naming the key and the directory, and left as it was. It was
/// replaced with a new ID: every client resynced for no reason, and the
/// damage was never named.
@Suite struct DamagedServerIDProcessTests {
    @Test(arguments: [[UInt8](repeating: 1, count: 5), [UInt8](repeating: 0, count: 16)])
    func aDamagedServerIDIsRefusedAtStartAndKept(damaged: [UInt8]) async throws {
        let executable = SyncServerProcessTests.executable
        try #require(FileManager.default.isExecutableFile(atPath: executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-damaged-id")
        let data = directory.appending("data")
        func serverID() throws -> [UInt8]? {
            let environment = try Environment(path: data)
            defer { environment.close() }
            let meta = try #require(try environment.openDatabase("meta", create: true))
            return try environment.read { txn in try txn.get(meta, key: Array("server-id".utf8)) }
        }
        do {
            let environment = try Environment(path: data)
            defer { environment.close() }
            let meta = try #require(try environment.openDatabase("meta", create: true))
            try environment.write { txn in try txn.put(meta, key: Array("server-id".utf8), value: damaged) }
        }
        // Its stdin at its end: a server that starts stops at once, status 0.
        let server = try ChildProcess(
            executable: executable.path, arguments: ["--data", data, "--port", "0", "--token", "t:alice", "--stop-at-stdin-end"])
        defer { server.kill() }
        #expect(await server.waitForExit(timeout: .seconds(60)))
        #expect(server.ending == .exit(1), "\(server.ending): \(server.outputText)")
        #expect(server.errorText.contains("dataDirectory \(data)") && server.errorText.contains("server-id"), "\(server.errorText)")
        #expect(try serverID() == damaged)
    }
}

extension SyncServerProcessTests {
    /// One token given to two users (a line copied and its user changed,
    /// the token not) is refused at start, naming both places (status 64):
    /// the last one won, silently, so the first user's client pulled the
    /// other's data and pushed into it. The same user twice is no conflict.
    @Test func aTokenGivenToTwoUsersIsRefusedAtStart() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-token-twice")
        let (twice, once) = (directory.appending("twice"), directory.appending("once"))
        try Data("shared alice\nother carol\nshared bob\n".utf8).write(to: URL(fileURLWithPath: twice))
        try Data("shared alice\nother carol\nother carol\nshared alice read-only\n".utf8).write(to: URL(fileURLWithPath: once))
        let cases: [([String], String)] = [
            (["--tokens-file", twice], "\(twice):3: the token given to alice at \(twice):1 is given to bob too; a token names one user"),
            (["--token", "t:alice", "--token", "t:bob"], "--token t:bob: the token given to alice at --token t:alice is given to bob too"),
            (["--tokens-file", once], "\(once):4: the token given to alice at \(once):1 is given to alice (read-only) too"),
        ]
        for (arguments, message) in cases {
            let run = try await ToolRun.running(Self.executable.path, ["--data", directory.appending("data"), "--port", "0", "--stop-at-stdin-end"] + arguments)
            #expect(run.status == 64 && run.errors.contains(message), "\(arguments): \(run.status): \(run.errors)")
        }
        #expect(!FileManager.default.fileExists(atPath: directory.appending("data")))
        // The same token for the same user twice, in the file and by --token, starts.
        try Data("shared alice\nother carol\nother carol\n".utf8).write(to: URL(fileURLWithPath: once))
        let same = try await ToolRun.running(
            Self.executable.path,
            ["--data", directory.appending("data"), "--port", "0", "--stop-at-stdin-end", "--tokens-file", once, "--token", "shared:alice"])
        #expect(same.status == 0, "\(same.errors)")
    }
}

extension SyncServerProcessTests {
    /// A user's token that is also the `--admin-token` is refused at start
    /// (status 64), naming where it was given: the admin token names no
    /// user (`theAdminTokenIsNoUserTokenEvenWhenAUserHasIt`), so the
    /// server started, and that user's every push and pull was 401.
    @Test func aUserTokenThatIsTheAdminTokenIsRefusedAtStart() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-admin-token-user")
        let tokens = directory.appending("tokens")
        try Data("user-token bob\nadmin alice\n".utf8).write(to: URL(fileURLWithPath: tokens))
        let cases: [([String], String)] = [
            (["--token", "admin:alice"], "--token admin:alice: the token given to alice is the --admin-token"),
            (["--tokens-file", tokens], "\(tokens):2: the token given to alice is the --admin-token"),
        ]
        for (arguments, message) in cases {
            let run = try await ToolRun.running(
                Self.executable.path, ["--data", directory.appending("data"), "--port", "0", "--stop-at-stdin-end", "--admin-token", "admin"] + arguments)
            #expect(run.status == 64 && run.errors.contains(message), "\(arguments): \(run.status): \(run.errors)")
        }
        #expect(!FileManager.default.fileExists(atPath: directory.appending("data")))
    }
}

extension SyncServerProcessTests {
    /// With --check-pages a store with damaged pages (here every page past
    /// the meta pages names another page in its header) stops the start
    /// with status 1, naming a page, before LMDB reads a table; a sound
    /// one serves as before, what it holds kept.
    @Test func checkPagesRefusesAStoreWithDamagedPagesAtStart() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-check-pages")
        let data = directory.appending("data")
        let arguments = ["--data", data, "--port", "0", "--token", "t:alice", "--check-pages"]
        let push = try JSONEncoder().encode(PushRequest(operations: [operation(.create, "kept", ["n": 1], key: "kept")]))
        for _ in 0..<2 {
            let (server, port) = try await Self.started(arguments)
            defer { server.kill() }
            #expect(try await Self.send("/v1/push", port: port, body: push).status == 200)
            server.kill()
            #expect(await server.waitForExit(timeout: .seconds(30)))
        }
        let file = data + "/data.mdb"
        let bytes = try damagePageHeaders(ofDataFile: file)
        let run = try await ToolRun.running(Self.executable.path, arguments + ["--stop-at-stdin-end"])
        #expect(run.status == 1, "\(run.status): \(run.errors)")
        #expect(run.errors.contains("\(data): damaged pages in data.mdb: "), "\(run.errors)")
        #expect(run.errors.contains(#/page \d+: its header says it is page 17216961135462248174/#), "\(run.errors)")
        #expect(FileManager.default.contents(atPath: file) == bytes)
    }

    /// A `data.mdb` cut short under the running server ends it at the
    /// first read that meets the cut, with status 1 and the file named:
    /// the read through LMDB's map raises SIGBUS, which killed the server
    /// with a backtrace (status 135) naming no file.
    @Test func aDataFileCutUnderTheServerEndsItNamingTheFile() async throws {
        let directory = try TemporaryDirectory("syncserver-cut")
        let data = directory.appending("data")
        let (server, port) = try await Self.started(["--data", data, "--port", "0", "--token", "t:alice"])
        defer { server.kill() }
        let operations = (0..<500).map { operation(.create, "t\($0)", ["n": .int(Int64($0))], key: "k\($0)") }
        #expect(try await Self.send("/v1/push", port: port, body: JSONEncoder().encode(PushRequest(operations: operations))).status == 200)
        #expect(truncate(data + "/data.mdb", off_t(2 * sysconf(Int32(_SC_PAGESIZE)))) == 0)
        _ = try? await Self.send("/v1/pull", port: port)
        #expect(await server.waitForExit(timeout: .seconds(30)), "still serving a store cut to its meta pages")
        #expect(server.ending == .exit(1), "\(server.ending): \(server.errorText)")
        #expect(
            server.errorText.hasSuffix(
                "syncserver: SIGBUS: a read through LMDB's memory map of \(data)/data.mdb failed: the data file was cut "
                    + "short under syncserver (truncated, or a shorter copy put in its place), a damaged page points past "
                    + "its end, or the disk failed a read of it. Check the store with logtool verify before the server "
                    + "serves it again.\n"),
            "\(server.errorText)")
    }
}

extension SyncServerProcessTests {
    /// The sync demo against a server it cannot reach stops after the first
    /// run, status 1, naming the server and why: an offline run passed as
    /// a good one, and the demo failed later at an update of a task the
    /// other replica had never pulled ("not found: no task/...").
    @Test func theSyncDemoNamesAServerItCannotReach() async throws {
        let demo = ToolRun.builtProduct("demo", root: Self.root)
        try #require(FileManager.default.isExecutableFile(atPath: demo), "build the demo product first")
        let directory = try TemporaryDirectory("demo-unreachable-server")
        let run = try await ToolRun.running(demo, ["--server", "not-a-url", "--path", directory.appending("replicas")])
        #expect(run.status == 1, "\(run.status): \(run.errors)")
        #expect(run.errors.contains("laptop: the server not-a-url is unreachable: "), "\(run.errors)")
        #expect(run.errors.contains("the server URL not-a-url is not http:// or https://"), "\(run.errors)")
        #expect(!run.output.contains("== Both edit"), "\(run.output)")
    }

    /// An empty `--path` (an unset variable) is a usage error naming the
    /// option: the demo failed as "mkdir (): No such file or directory".
    @Test func theDemoRefusesAnEmptyPath() async throws {
        let demo = ToolRun.builtProduct("demo", root: Self.root)
        try #require(FileManager.default.isExecutableFile(atPath: demo), "build the demo product first")
        for arguments in [["--path", ""], ["--path", "", "--server", "http://127.0.0.1:1"]] {
            let run = try await ToolRun.running(demo, arguments)
            #expect(run.status == 64 && run.errors.contains("--path must name a directory"), "\(arguments): \(run.status): \(run.errors)")
        }
    }
}

extension SyncServerProcessTests {
    /// The banner names an IPv6 host in brackets, as a URL must: it said
    /// `http://::1:PORT`, which no client can be given. Only where this
    /// host has an IPv6 loopback to listen on.
    @Test(.enabled(if: ipv6LoopbackAvailable(), "no IPv6 loopback (::1) here to listen on"))
    func theBannerBracketsAnIPv6Host() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-ipv6-banner")
        let server = try ChildProcess(
            executable: Self.executable.path,
            arguments: ["--data", directory.appending("data"), "--port", "0", "--host", "::1", "--token", "t:alice"])
        defer { server.kill() }
        let banner = try #require(
            await server.waitForLine(timeout: .seconds(60)) { $0.contains(" listening on ") }, "\(server.outputText)\(server.errorText)")
        let url = try #require(banner.firstMatch(of: #/listening on (\S+) /#).map { String($0.1) }, "\(banner)")
        #expect(url.hasPrefix("http://[::1]:"), "\(banner)")
        let components = try #require(URLComponents(string: url), "\(banner)")
        #expect(components.port != nil && components.port != 0, "\(banner)")
    }
}

/// Whether a socket can be bound to ::1 here: a container may have no IPv6.
private func ipv6LoopbackAvailable() -> Bool {
    #if canImport(Glibc)
        let descriptor = socket(AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
    #else
        let descriptor = socket(AF_INET6, SOCK_STREAM, 0)
    #endif
    guard descriptor >= 0 else { return false }
    defer { close(descriptor) }
    var address = sockaddr_in6()
    address.sin6_family = sa_family_t(AF_INET6)
    address.sin6_addr = in6addr_loopback
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) == 0 }
    }
}
