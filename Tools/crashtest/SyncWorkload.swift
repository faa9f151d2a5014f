import Foundation
import LogFormat
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting

/// A sync client killed with SIGKILL while it pushes and pulls. The worker
/// makes app writes through `Store` while a `SyncEngine` syncs them with a
/// real `syncserver` over HTTP, run after run; meanwhile the harness, as a
/// second client (`OtherWriter`), pushes changes of its own, so that pulls
/// bring changes the worker did not make. The server lives as long as the
/// store and is never killed here (the `server` workload kills it).
///
/// Stores take turns at what is compacted besides (`Compaction`): nothing;
/// the client's log, by the worker's engine after its sync runs
/// (`SyncConfiguration.compactAfterOffsets`, a random threshold per
/// worker), where the checks find the intents compaction folded away in
/// the server's feed and the pulled changes it folded into snapshots
/// before the store's cursor; or the server's feed, by the harness as the
/// operator (`POST /v1/admin/compact`) while the worker runs, so that the
/// worker's cursor falls below the feed's horizon, its pulls are answered
/// 410, and kills land in the full resyncs that follow. The checks then
/// hold the store to what a compacted feed still shows: each entity's
/// latest change. A kill part way through a resync's pull leaves older
/// server states in view, and an edit made on one may be refused as a
/// conflict: both are allowed after a resync (`AppPromises.checkVisible`,
/// `FeedView.checkApplied`), as the README says of `resync(reason:)`.
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

    /// What a store's iterations compact besides syncing, by turns.
    enum Compaction: CaseIterable {
        case none, clientLog, serverFeed

        init(iteration: Int) {
            self = Self.allCases[iteration / Harness.iterationsPerStoreMax % Self.allCases.count]
        }
    }

    /// The range of `--compact-after` thresholds, in offsets: a worker
    /// writes a few hundred before its kill.
    static let compactAfterOffsetsRange = 8...64
    /// The pause before each compaction of the server's feed, in
    /// milliseconds: a few per iteration, so that most resyncs they start
    /// end before the next one.
    static let feedCompactionPauseMilliseconds = 20...120

    mutating func iterate(_ context: inout IterationContext) async throws {
        guard let server = try await running(&context) else { return }
        let compaction = Compaction(iteration: context.iteration)
        let writing = OtherWriter.Run(other, to: server.client, seed: context.workerSeed())
        var arguments = ["--server", server.client.base]
        if compaction == .clientLog {
            arguments += ["--compact-after", String(Int.random(in: Self.compactAfterOffsetsRange, using: &context.random))]
        }
        let stopCompacting = StopFlag()
        let compacting = compaction == .serverFeed ? Self.compactFeeds(server, seed: context.workerSeed(), until: stopCompacting) : nil
        let reports: [Report]
        do {
            reports = try await WorkerRun.killed(Self.name, store: storeDirectory, more: arguments, &context)
        } catch {
            stopCompacting.set()
            _ = await compacting?.value
            _ = await writing.stop()
            throw error
        }
        stopCompacting.set()
        if let failure = await compacting?.value { context.violation("compacting the server's feed failed: \(failure)") }
        other = await writing.stop()
        for problem in other.takeProblems() { context.violation(problem) }
        ledger.append(reports)
        context.tally.acknowledged += Self.acknowledgedCount(reports)
        await StoreCheck.afterCrash(Self.self, directory: storeDirectory, ledger: ledger, &context)
        let lastOfStore = (context.iteration + 1) % Harness.iterationsPerStoreMax == 0 || context.iteration + 1 == context.options.iterations
        let toQuiet = lastOfStore || Bool.random(using: &context.random)
        await SyncCheck(server: server.client, ledger: ledger, other: other, feedCompacted: compaction == .serverFeed)
            .run(store: storeDirectory, toQuiet: toQuiet, &context)
    }

    /// Compacts the server's feeds after a random pause, again and again
    /// until `stop` is set (a compaction is never cut off).
    /// - Returns: the error of a compaction that failed, if one did.
    private static func compactFeeds(_ server: ServerProcess, seed: UInt64, until stop: StopFlag) -> Task<String?, Never> {
        Task {
            var random = SeededRandom(seed: seed)
            for _ in 0..<Worker.writeCountMax {
                try? await Task.sleep(for: .milliseconds(Int.random(in: feedCompactionPauseMilliseconds, using: &random)))
                guard !stop.isSet else { return nil }
                do {
                    _ = try await server.admin.compact()
                } catch {
                    return "\(error)"
                }
            }
            return nil
        }
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
