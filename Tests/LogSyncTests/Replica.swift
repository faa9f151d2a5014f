import Foundation
import LogFormat
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization

/// One client of a test server: a store of its own, an engine over real
/// HTTP, and a manual clock, so retries and breakers run without waiting.
final class Replica: @unchecked Sendable {
    let directory: TemporaryDirectory
    private(set) var store: Store
    private(set) var engine: SyncEngine
    let clock: ManualClock
    private var transport: any SyncTransport
    private let configuration: SyncConfiguration

    convenience init(
        _ name: String, server: TestServer, token: String = "alice-token", clock: ManualClock = ManualClock(),
        configuration: SyncConfiguration = .init(), transport: (any SyncTransport)? = nil
    ) throws {
        try self.init(name, url: server.url, token: token, clock: clock, configuration: configuration, transport: transport)
    }

    /// A client of the server at `url` (a `ScriptedServer`, say).
    init(
        _ name: String, url: URL, token: String = "alice-token", clock: ManualClock = ManualClock(),
        configuration: SyncConfiguration = .init(), transport: (any SyncTransport)? = nil
    ) throws {
        directory = try TemporaryDirectory("replica-\(name)")
        self.clock = clock
        self.configuration = configuration
        self.transport = transport ?? HTTPTransport(baseURL: url, token: token, options: loopback)
        store = try Store(path: directory.path, options: .init(durability: .process))
        engine = try SyncEngine(store: store, transport: self.transport, clock: clock, configuration: configuration)
    }

    /// Closes the store and opens it again with a new engine, as after a crash or restart.
    func restart() throws {
        store.close()
        store = try Store(path: directory.path, options: .init(durability: .process))
        engine = try SyncEngine(store: store, transport: transport, clock: clock, configuration: configuration)
    }

    /// Talks to `server` from now on (it may have moved to another port),
    /// through `transport` when given (one of `server`'s, then).
    func connect(to server: TestServer, token: String = "alice-token", transport: (any SyncTransport)? = nil) throws {
        self.transport = transport ?? HTTPTransport(baseURL: server.url, token: token, options: loopback)
        engine = try SyncEngine(store: store, transport: self.transport, clock: clock, configuration: configuration)
    }

    /// Its engine's watch (`SyncEngine.watchFeed`, waits of 30 s) in a
    /// task of its own; `end()` it.
    func watching() -> Task<Void, any Error> {
        let engine = self.engine
        return Task { try await engine.watchFeed(waitSeconds: 30) }
    }

    @discardableResult
    func sync() async -> SyncReport {
        let report = await engine.sync()
        lost.withLock { $0 += report.lostChanges }
        resyncCount.withLock { $0 += report.resyncs }
        return report
    }

    /// The full resyncs of all its syncs.
    var resyncs: Int { resyncCount.withLock { $0 } }
    private let resyncCount = Mutex(0)

    /// Every change the engine found the server lost, over all its syncs.
    var lostChanges: [AwaitedChange] { lost.withLock { $0 } }
    private let lost = Mutex<[AwaitedChange]>([])

    /// Syncs until nothing is pending or due, moving the clock past every retry.
    func syncUntilQuiet(roundsMax: Int = 40) async throws {
        for _ in 0..<roundsMax {
            let report = await sync()
            let summary = try store.outboxSummary()
            if case .completed = report.outcome, summary.pendingCount == 0 { return }
            clock.advance(by: 301_000)
        }
        throw SyncTestError("\(directory.path): still not quiet after \(roundsMax) rounds: \(await engine.state)")
    }

    /// Every visible entity of `type`, by id.
    func entities(_ type: String) throws -> [String: Fields] {
        var all: [String: Fields] = [:]
        var after: String?
        while true {
            let page = try store.all(type: type, after: after, limit: 1_000)
            for entity in page { all[entity.id] = entity.fields }
            guard let last = page.last, page.count == 1_000 else { return all }
            after = last.id
        }
    }

    func entries(_ kind: EntryKind) throws -> [Entry] {
        var scanner = store.log.entries(from: 1)
        var found: [Entry] = []
        while let entry = try scanner.next() {
            if entry.kind == kind { found.append(entry) }
        }
        return found
    }
}

struct SyncTestError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

extension Task where Success == Void, Failure == any Error {
    /// Cancels the task and waits for its end (a watch's: `Replica.watching()`).
    func end() async throws {
        cancel()
        try await value
    }
}
