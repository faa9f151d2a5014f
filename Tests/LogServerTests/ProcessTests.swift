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
        let process = Process()
        process.executableURL = Self.executable
        process.arguments = ["--data", directory.appending("data"), "--port", "0", "--token", "t:alice", "--durability", "full"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        defer { if process.isRunning { process.terminate() } }

        let port = try await Self.readPort(from: output.fileHandleForReading)
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)/v1/push")!)
        request.httpMethod = "POST"
        request.setValue("Bearer t", forHTTPHeaderField: "Authorization")
        request.httpBody = try JSONEncoder().encode(PushRequest(operations: [operation(.create, "t1", ["n": 1], key: "k")]))
        let (_, response) = try await URLSession.shared.data(for: request)
        #expect((response as? HTTPURLResponse)?.statusCode == 200)

        kill(process.processIdentifier, signal)
        for _ in 0..<300 where process.isRunning { try await Task.sleep(for: .milliseconds(20)) }
        #expect(!process.isRunning, "still running 6 s after the signal")
        #expect(process.terminationReason == .exit && process.terminationStatus == 0)

        // The store opens cleanly and holds the acknowledged push.
        let reopened = try await TestServer("signal-reopen", dataDirectory: directory.appending("data"))
        let changes = try await reopened.pullAll()
        await reopened.stop()
        #expect(changes.map(\.entityID) == ["t1"])
    }

    /// Reads the banner line `... listening on http://127.0.0.1:PORT ...`.
    static func readPort(from handle: FileHandle) async throws -> Int {
        var text = ""
        for _ in 0..<500 {
            let data = handle.availableData
            if data.isEmpty { try await Task.sleep(for: .milliseconds(10)) }
            text += String(decoding: data, as: UTF8.self)
            if let range = text.range(of: #"127\.0\.0\.1:(\d+)"#, options: .regularExpression) {
                let port = text[range].split(separator: ":").last.flatMap { Int($0) }
                if let port { return port }
            }
        }
        throw CocoaError(.fileReadUnknown, userInfo: [NSLocalizedDescriptionKey: "no port in: \(text)"])
    }
}
