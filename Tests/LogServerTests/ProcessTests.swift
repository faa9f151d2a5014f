import Foundation
import LogFormat
import LogServer
import LogTesting
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The `syncserver` executable, run as a child process the way an operator
/// runs it.
@Suite struct SyncServerProcessTests {
    /// The built executable, beside the test bundle's build products.
    static var executable: URL {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        return URL(fileURLWithPath: ToolRun.builtProduct("syncserver", root: root))
    }

    @Test(arguments: [SIGTERM, SIGINT])
    func stopsCleanlyOnASignalAndKeepsItsData(signal: Int32) async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-signal")
        let server = try ChildProcess(
            executable: Self.executable.path,
            arguments: ["--data", directory.appending("data"), "--port", "0", "--token", "t:alice", "--durability", "full"])
        defer { server.kill() }

        let banner = await server.waitForLine(timeout: .seconds(60)) { SyncServerBanner.port(in: $0) != nil }
        let port = try #require(banner.flatMap(SyncServerBanner.port(in:)), "no banner: \(server.outputText)\(server.errorText)")
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/v1/push")!)
        request.httpMethod = "POST"
        request.setValue("Bearer t", forHTTPHeaderField: "Authorization")
        request.httpBody = try JSONEncoder().encode(PushRequest(operations: [operation(.create, "t1", ["n": 1], key: "k")]))
        let (_, response) = try await URLSession.shared.data(for: request)
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
        let server = try ChildProcess(
            executable: Self.executable.path, arguments: ["--data", directory.appending("data"), "--port", "0", "--tokens-file", tokens])
        defer { server.kill() }
        let banner = await server.waitForLine(timeout: .seconds(60)) { SyncServerBanner.port(in: $0) != nil }
        let port = try #require(banner.flatMap(SyncServerBanner.port(in:)), "no banner: \(server.outputText)\(server.errorText)")
        for token in ["t1", "t2"] {
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/v1/pull")!)
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
            let (_, response) = try await URLSession.shared.data(for: request)
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
        let executable = SyncServerProcessTests.executable
        try #require(FileManager.default.isExecutableFile(atPath: executable.path), "build the syncserver product first")
        let directory = try TemporaryDirectory("syncserver-forged-cursor")
        let server = try ChildProcess(
            executable: executable.path, arguments: ["--data", directory.appending("data"), "--port", "0", "--token", "t:alice"])
        defer { server.kill() }
        let banner = await server.waitForLine(timeout: .seconds(60)) { SyncServerBanner.port(in: $0) != nil }
        let port = try #require(banner.flatMap(SyncServerBanner.port(in:)), "no banner: \(server.outputText)\(server.errorText)")
        func send(_ path: String, body: Data? = nil) async throws -> (Int, Data) {
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)\(path)")!)
            request.setValue("Bearer t", forHTTPHeaderField: "Authorization")
            if let body {
                request.httpMethod = "POST"
                request.httpBody = body
            }
            let (data, response) = try await URLSession.shared.data(for: request)
            return ((response as? HTTPURLResponse)?.statusCode ?? 0, data)
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
