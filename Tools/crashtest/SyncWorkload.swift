import Foundation
import LogFormat
import LogStore
import LogSync
import LogSyncHTTP

/// A sync client killed with SIGKILL while it pushes and pulls. The worker
/// makes app writes through `Store` while a `SyncEngine` syncs them with a
/// real `syncserver` over HTTP, run after run; meanwhile the harness, as a
/// second client (`OtherWriter`), pushes changes of its own, so that pulls
/// bring changes the worker did not make. The server lives as long as the
/// store and is never killed here (the `server` workload kills it).
///
/// On every other store the worker compacts its log after sync runs
/// (`SyncConfiguration.compactAfterOffsets`, a random threshold per
/// worker): the checks then find the intents compaction folded away in the
/// server's feed, and the pulled changes it folded into snapshots before
/// the store's cursor.
///
/// After every kill, besides the common checks (`StoreCheck`), `SyncCheck`
/// holds the store against the server's feed, and the app writes' promises
/// (`AppPromises`) against both. In one iteration of two, and the last of
/// each store, the harness then syncs the store to quiet, as the restarted
/// app would, and checks that the server applied each intent exactly once
/// and that client and server agree on every entity.
struct SyncWorkload: Workload {
    static let name = "sync"
    static let summary = "a sync client (Store and SyncEngine, HTTP to syncserver) killed during pushes and pulls, then synced to quiet"

    let directory: String
    private var server: ServerProcess?
    private var ledger = Ledger()
    private var other = OtherWriter()

    init(directory: String) { self.directory = directory }

    /// The client's store and the server's data, side by side.
    var storeDirectory: String { (directory as NSString).appendingPathComponent("client") }
    var serverDirectory: String { (directory as NSString).appendingPathComponent("server") }

    /// The range of `--compact-after` thresholds, in offsets: a worker
    /// writes a few hundred before its kill.
    static let compactAfterOffsetsRange = 8...64

    mutating func iterate(_ context: inout IterationContext) async throws {
        guard let server = try await running(&context) else { return }
        let writing = OtherWriter.Run(other, to: server.client, seed: context.workerSeed())
        var arguments = ["--server", server.client.base]
        if context.iteration / Harness.iterationsPerStoreMax % 2 == 1 {
            arguments += ["--compact-after", String(Int.random(in: Self.compactAfterOffsetsRange, using: &context.random))]
        }
        let reports: [Report]
        do {
            reports = try await WorkerRun.killed(Self.name, store: storeDirectory, more: arguments, &context)
        } catch {
            _ = await writing.stop()
            throw error
        }
        other = await writing.stop()
        for problem in other.takeProblems() { context.violation(problem) }
        ledger.append(reports)
        context.tally.acknowledged += Self.acknowledgedCount(reports)
        await StoreCheck.afterCrash(Self.self, directory: storeDirectory, ledger: ledger, &context)
        let lastOfStore = (context.iteration + 1) % Harness.iterationsPerStoreMax == 0 || context.iteration + 1 == context.options.iterations
        let toQuiet = lastOfStore || Bool.random(using: &context.random)
        await SyncCheck(server: server.client, ledger: ledger, other: other).run(store: storeDirectory, toQuiet: toQuiet, &context)
    }

    mutating func finish() async {
        await server?.stop()
        server = nil
    }

    /// The server, started when none runs; nil (with a violation) when it
    /// does not come up.
    private mutating func running(_ context: inout IterationContext) async throws -> ServerProcess? {
        if let server { return server }
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw HarnessError("cannot make \(directory): \(error.localizedDescription)")
        }
        server = try await ServerProcess.start(data: serverDirectory, &context)
        return server
    }

    /// An engine for `store` that syncs with the server at `server` (its
    /// base URL) over HTTP, on the system clock.
    /// - Throws: `HarnessError` when `server` is no URL.
    static func engine(_ store: Store, server: String, configuration: SyncConfiguration = .init()) throws -> SyncEngine {
        guard let url = URL(string: server) else { throw HarnessError("the sync server \(server) is no URL") }
        var options = HTTPTransport.Options()
        // Proxy settings from the environment must not catch loopback requests.
        options.ignoreProxies = true
        return try SyncEngine(
            store: store, transport: HTTPTransport(baseURL: url, token: ServerProcess.token, options: options), configuration: configuration)
    }
}
