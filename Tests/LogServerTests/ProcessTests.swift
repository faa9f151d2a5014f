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
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent(".build/debug/syncserver")
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
}
