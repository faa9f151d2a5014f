import Foundation
import LogStore
import LogTesting

/// A `syncserver` child process on a data directory, and a client for it.
final class ServerProcess: Sendable {
    /// A debug server starts in about a second; this allows a slow machine.
    static let startWaitMax = Duration.seconds(60)
    static let stopWaitMax = Duration.seconds(60)
    static let token = "crashtest-token"
    static let user = "crashtest"
    static let adminToken = "crashtest-admin"
    /// The server's scope field (`--scope-field`): the server workload's
    /// entities have a scope there, so that its pulls of some scopes are
    /// checked.
    static let scopeField = "project"

    let child: ChildProcess
    let client: ServerClient
    /// The operator's client: `POST /v1/admin/compact`.
    let admin: ServerClient

    private init(child: ChildProcess, port: Int) {
        self.child = child
        client = ServerClient(port: port, token: ServerProcess.token)
        admin = ServerClient(port: port, token: ServerProcess.adminToken)
    }

    /// Starts the server and waits for its banner.
    /// - Returns: the server, or why it did not come up.
    static func start(executable: String, data: String, durability: Durability) async throws -> Result<ServerProcess, Failure> {
        // The default is the one beside crashtest, which a build of
        // crashtest alone does not make.
        guard FileManager.default.isExecutableFile(atPath: executable) else {
            throw HarnessError("no syncserver at \(executable): build it (swift build --product syncserver) or name one with --syncserver")
        }
        let child = try ChildProcess(
            "syncserver", executable: executable,
            arguments: [
                "--data", data, "--host", "127.0.0.1", "--port", "0", "--token", "\(token):\(user)", "--admin-token",
                adminToken, "--durability", durability.rawValue, "--scope-field", scopeField, "--stop-at-stdin-end",
            ], holdingStdinOpen: true)
        let banner = await child.waitForLine(timeout: startWaitMax) { SyncServerBanner.port(in: $0) != nil }
        guard let banner, let port = SyncServerBanner.port(in: banner) else {
            child.kill()
            _ = await child.waitForExit(timeout: stopWaitMax)
            return .failure(Failure(description: "syncserver on \(data) did not start: \(child.errorText)"))
        }
        return .success(ServerProcess(child: child, port: port))
    }

    /// Starts the server on `data` with the run's executable and
    /// durability.
    /// - Returns: the server, or nil when it did not come up (a violation
    ///   says why).
    static func start(data: String, _ context: inout IterationContext) async throws -> ServerProcess? {
        switch try await start(executable: context.options.syncserver, data: data, durability: context.options.durability) {
        case .success(let started):
            return started
        case .failure(let failure):
            context.violation(failure.description)
            return nil
        }
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// Stops it with SIGTERM, as an operator does, and waits.
    func stop() async {
        child.kill(SIGTERM)
        _ = await child.waitForExit(timeout: ServerProcess.stopWaitMax)
    }
}
