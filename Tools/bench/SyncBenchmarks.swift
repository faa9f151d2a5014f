import Foundation
import LogFormat
import LogServer
import LogStore
import LogSync
import LogSyncHTTP
import Synchronization

/// What section 9 runs.
struct SyncBenchSettings: Codable, Sendable {
    /// Intents written to a store, then pushed by one `SyncEngine.sync()`.
    var intents: Int
    /// Entities on the server that one `sync()` pulls into an empty store.
    var entities: Int
}

/// Section 9: the sync engine end to end. A real `Store` (`.full`), the
/// real `SyncEngine` over `HTTPTransport`, and the reference server in this
/// process over loopback HTTP (`.full`), as an app would sync:
/// a. the flush of pending intents: one `sync()` pushes the outbox in
///    batches, records each answer, then pulls (its own changes come back);
/// b. the initial pull: one `sync()` of an empty store reads the whole feed.
/// Each runs with the engine's default sizes and with the largest the
/// protocol allows, bodies in gzip both ways (the defaults of client and
/// server), and with the default sizes once more without gzip, on a server
/// of its own, to show what gzip costs where bandwidth is free.
enum SyncBenchmark {
    static let target = 20_000.0
    static let clientDurability = Durability.full
    /// Creates per `WriteBatch` while filling the outbox (untimed).
    static let fillBatchCount = 1_000

    /// An engine configuration the section measures.
    struct Shape: Sendable {
        var name: String
        var configuration: SyncConfiguration
        /// Bodies in gzip both ways: pushes from the client, answers from the server.
        var gzip = true

        var label: String {
            "\(name) (batch \(configuration.pushBatchCountMax), page \(configuration.pullPageCountMax)\(gzip ? "" : ", no gzip"))"
        }
    }

    static let shapes: [Shape] = {
        var largest = SyncConfiguration()
        largest.pushBatchCountMax = Wire.pushOperationCountMax
        largest.pullPageCountMax = Wire.pullPageCountMax
        return [
            Shape(name: "default", configuration: SyncConfiguration()), Shape(name: "largest", configuration: largest),
            Shape(name: "default-plain", configuration: SyncConfiguration(), gzip: false),
        ]
    }()

    static func run(_ settings: Settings, _ workspace: Workspace) async throws -> ReportSection {
        var section = ReportSection(
            "9. Sync end to end: Store + SyncEngine + HTTPTransport + server over loopback (client .\(clientDurability), server .full)")
        var flushRows: [ResultRow] = []
        var pullRows: [ResultRow] = []
        for gzip in [true, false] {
            let (flushed, pulled) = try await run(
                settings.sync, shapes: shapes.filter { $0.gzip == gzip }, gzip: gzip, TimeEntryWorkload(), workspace)
            flushRows += flushed
            pullRows += pulled
        }
        section.rows = flushRows + pullRows
        section.notes = notes(TimeEntryWorkload())
        return section
    }

    /// Runs `shapes` on a server of their own, which answers in gzip or not.
    private static func run(
        _ counts: SyncBenchSettings, shapes: [Shape], gzip: Bool, _ workload: TimeEntryWorkload, _ workspace: Workspace
    ) async throws -> (flushes: [ResultRow], pulls: [ResultRow]) {
        let flushUsers = shapes.map { "flush-\($0.name)" }
        let pullUser = "pull"
        let name = gzip ? "sync-server" : "sync-server-plain"
        return try await LoopbackServer.serving(directory: workspace.path(name), users: flushUsers + [pullUser], gzipLevel: gzip ? 1 : 0) {
            server in
            var flushes: [ResultRow] = []
            for (shape, user) in zip(shapes, flushUsers) {
                progress("sync: flush \(Report.grouped(counts.intents)) intents (\(shape.label))")
                flushes.append(try await flush(counts.intents, shape, user: user, workload, server, workspace))
            }
            progress("sync: fill the server with \(Report.grouped(counts.entities)) entities")
            try await fill(counts.entities, user: pullUser, workload, server)
            var pulls: [ResultRow] = []
            for shape in shapes {
                progress("sync: initial pull of \(Report.grouped(counts.entities)) entities (\(shape.label))")
                pulls.append(try await initialPull(counts.entities, shape, user: pullUser, server, workspace))
            }
            return (flushes, pulls)
        }
    }

    private static func notes(_ workload: TimeEntryWorkload) -> [String] {
        [
            "durability: the client store .full (2 fsyncs per commit, the app default) and the server .full; both share this process and its two cores, and other builds may run beside the bench.",
            "each intent and entity is a time entry (\"te\", four fields, about \(workload.meanEncodedFieldBytes) bytes encoded); the rate counts intents or entities per second of one sync() call, health check included.",
            "a flush's sync() also pulls: the server's feed returns the client's own changes, which it applies as remote entries; 'push phase' in the detail is the time until the first pull.",
            "each push batch costs two durable commits (the server's, then the client's acks: four fsyncs) and each pulled page one (the client's); the larger sizes mostly save those.",
            "transport time is inside HTTPTransport (JSON encoding and decoding, HTTP over loopback, the server's work and commit); engine + store is the rest (outbox reads, ack and remote entries committed with their projections).",
            "gzip: pushes and answers of 1 KiB or more go in gzip at level 1 (the client's and the server's defaults); the no-gzip rows run on a second server with gzip off, and a client that sends none. Over loopback the bytes cost nothing, so those rows show gzip's CPU cost alone; section 8 gives the bytes it saves.",
            "no SQLite comparison: there is no SQLite sync engine to run beside it.",
        ]
    }

    // MARK: - a. Flush

    private static func flush(
        _ count: Int, _ shape: Shape, user: String, _ workload: TimeEntryWorkload, _ server: LoopbackServer, _ workspace: Workspace
    ) async throws -> ResultRow {
        try await withClientStore("sync-flush-\(shape.name)", workspace) { store in
            try await flush(count, into: store, shape, user: user, workload, server)
        }
    }

    private static func flush(
        _ count: Int, into store: Store, _ shape: Shape, user: String, _ workload: TimeEntryWorkload, _ server: LoopbackServer
    ) async throws -> ResultRow {
        var ids = Set<String>()
        for first in stride(from: 0, to: count, by: fillBatchCount) {
            var batch = WriteBatch()
            for index in first..<min(first + fillBatchCount, count) {
                ids.insert(try batch.create(type: TimeEntryWorkload.entityType, fields: workload.fields(index)))
            }
            try await store.write(batch)
        }
        guard try store.outboxSummary().pendingCount == count else { throw BenchError("the outbox does not hold \(count) intents") }

        let (report, timing) = try await timedSync(store, shape, user: user, server)
        guard case .completed = report.outcome, report.acknowledged == count, report.rejected == 0 else {
            throw BenchError("flush: \(report.outcome), \(report.acknowledged) of \(count) acknowledged, \(report.rejected) rejected")
        }
        guard try store.outboxSummary().pendingCount == 0 else { throw BenchError("flush: the outbox is not empty") }
        try await checkServerHolds(ids, user: user, server)
        return ResultRow(
            "a. flush \(Report.grouped(count)) intents, \(shape.label)", Double(count) / timing.total.seconds, "intents/s",
            target: .atLeast(target, "intents/s"),
            detail: timing.breakdown() + "; \(report.changes) changes pulled back")
    }

    /// Checks that the server's feed for `user` holds exactly the entities `ids`.
    private static func checkServerHolds(_ ids: Set<String>, user: String, _ server: LoopbackServer) async throws {
        var found = Set<String>()
        let client = BenchClient(port: server.port, token: user)
        _ = try await client.pullAll(page: Wire.pullPageCountMax) { changes in
            for change in changes where change.operation == .upsert { found.insert(change.entityID) }
        }
        guard found == ids else {
            throw BenchError("the server holds \(found.count) entities for \(user), \(found.intersection(ids).count) of the \(ids.count) pushed")
        }
    }

    // MARK: - b. Initial pull

    /// Creates `count` entities on the server for `user` with direct pushes.
    private static func fill(_ count: Int, user: String, _ workload: TimeEntryWorkload, _ server: LoopbackServer) async throws {
        var random = SplitMix64(seed: 0x5_F111)
        let base = wallClockMilliseconds()
        let ids = (0..<count).map { TimeEntryWorkload.entityID(sequence: $0, base: base, random: &random) }
        let client = BenchClient(port: server.port, token: user)
        _ = try await client.pushCreates(0..<count, batch: Wire.pushOperationCountMax) { index in
            PushOperation(
                idempotencyKey: "fill-\(index)", entityType: TimeEntryWorkload.entityType, entityID: ids[index], intent: .create,
                data: workload.fields(index), clientTimestamp: "2026-11-22T08:00:00.000000Z", baseVersion: 0)
        }
    }

    private static func initialPull(
        _ count: Int, _ shape: Shape, user: String, _ server: LoopbackServer, _ workspace: Workspace
    ) async throws -> ResultRow {
        try await withClientStore("sync-pull-\(shape.name)", workspace) { store in
            let (report, timing) = try await timedSync(store, shape, user: user, server)
            guard case .completed = report.outcome, report.changes == count else {
                throw BenchError("initial pull: \(report.outcome), \(report.changes) of \(count) changes")
            }
            let held = try store.count(type: TimeEntryWorkload.entityType)
            guard held == count else { throw BenchError("initial pull: the store holds \(held) entities, not \(count)") }
            return ResultRow(
                "b. initial pull of \(Report.grouped(count)) entities, \(shape.label)", Double(count) / timing.total.seconds,
                "entities/s", target: .atLeast(target, "entities/s"),
                detail: timing.breakdown() + "; \(report.pages) pages")
        }
    }

    // MARK: - The client

    /// Runs `body` with a new client store named `name`, closed and removed after.
    private static func withClientStore<Value>(
        _ name: String, _ workspace: Workspace, _ body: (Store) async throws -> Value
    ) async throws -> Value {
        let store = try Store(path: workspace.path(name), options: EventLog.Options(durability: clientDurability))
        defer {
            store.close()
            workspace.remove(name)
        }
        return try await body(store)
    }

    // MARK: - Timing

    /// Runs one `sync()` of `store` as `user` and times it.
    private static func timedSync(_ store: Store, _ shape: Shape, user: String, _ server: LoopbackServer) async throws
        -> (SyncReport, SyncTiming)
    {
        var options = HTTPTransport.Options()
        options.ignoreProxies = true
        options.gzipsPushes = shape.gzip
        let transport = TimedTransport(HTTPTransport(baseURL: server.url, token: user, options: options))
        let engine = try SyncEngine(store: store, transport: transport, configuration: shape.configuration)
        let clock = ContinuousClock()
        let cpuBefore = processCPUSeconds()
        let started = clock.now
        let report = await engine.sync()
        let total = clock.now - started
        var timing = transport.timing(total: total, started: started)
        timing.cpuSeconds = processCPUSeconds() - cpuBefore
        return (report, timing)
    }

    /// User plus system CPU time of this process so far: with client and
    /// server in one process, how much of the wall time was work (up to two
    /// cores' worth) rather than waiting for fsync or for other processes.
    private static func processCPUSeconds() -> Double {
        var usage = rusage()
        #if canImport(Glibc)
            let who = __rusage_who_t(RUSAGE_SELF.rawValue)
        #else
            let who = RUSAGE_SELF
        #endif
        guard getrusage(who, &usage) == 0 else { return 0 }
        let seconds = { (time: timeval) in Double(time.tv_sec) + Double(time.tv_usec) / 1e6 }
        return seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }
}

/// Where one sync's time went.
struct SyncTiming: Sendable {
    var total: Duration
    /// From the start to the first pull request (health check and push).
    var pushPhase: Duration
    var pushRequests: Int
    var pushTransport: Duration
    var pullRequests: Int
    var pullTransport: Duration
    var healthTransport: Duration
    /// The process's CPU time during the sync (client and server together).
    var cpuSeconds = 0.0

    /// The totals in one line, for a row's detail.
    func breakdown() -> String {
        let transport = pushTransport + pullTransport + healthTransport
        return String(
            format: "total %.3f s (CPU %.3f s) = transport %.3f s + engine and store %.3f s; push phase %.3f s (%d requests, "
                + "%.3f s in them), pull phase %.3f s (%d requests, %.3f s in them)",
            total.seconds, cpuSeconds, transport.seconds, (total - transport).seconds, pushPhase.seconds, pushRequests,
            pushTransport.seconds, (total - pushPhase).seconds, pullRequests, pullTransport.seconds)
    }
}

/// A transport that times each call of the one it wraps, so a sync's time
/// splits into the transport's (encoding, HTTP, the server, decoding) and
/// the engine's and store's.
final class TimedTransport: SyncTransport {
    private struct Totals {
        var health = Duration.zero
        var push = Duration.zero
        var pull = Duration.zero
        var pushCount = 0
        var pullCount = 0
        var firstPullAt: ContinuousClock.Instant?
    }

    private let base: any SyncTransport
    private let clock = ContinuousClock()
    private let totals = Mutex(Totals())

    init(_ base: any SyncTransport) { self.base = base }

    func health() async throws(TransportError) -> HealthResponse {
        let started = clock.now
        defer { totals.withLock { $0.health += clock.now - started } }
        return try await base.health()
    }

    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        let started = clock.now
        defer {
            totals.withLock {
                $0.push += clock.now - started
                $0.pushCount += 1
            }
        }
        return try await base.push(request)
    }

    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        let started = clock.now
        defer {
            totals.withLock {
                $0.pull += clock.now - started
                $0.pullCount += 1
                if $0.firstPullAt == nil { $0.firstPullAt = started }
            }
        }
        return try await base.pull(cursor: cursor, limit: limit)
    }

    /// The totals of a sync that started at `started` and took `total`.
    func timing(total: Duration, started: ContinuousClock.Instant) -> SyncTiming {
        totals.withLock { totals in
            SyncTiming(
                total: total, pushPhase: (totals.firstPullAt ?? started + total) - started, pushRequests: totals.pushCount,
                pushTransport: totals.push, pullRequests: totals.pullCount, pullTransport: totals.pull, healthTransport: totals.health)
        }
    }
}
