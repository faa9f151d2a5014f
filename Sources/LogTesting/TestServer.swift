import Foundation
import LogFormat
import LogServer
import LMDB
import Synchronization

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// A real sync server on a loopback port of its own, for one test, spoken
/// to over real HTTP. `stop()` shuts it down; `restart()` serves the same
/// data directory again.
///
/// What a restart changes (the configuration, the server, its port and the
/// task serving it) is held behind a lock, so that requests sent from any
/// task may run while another task restarts it: each reads the port of the
/// server before or after the restart, never a torn value. `stop()`,
/// `restart()`, `backUp(to:)` and `restore(from:)` are for one task at a
/// time: two restarts at once would open the data directory twice, which
/// the second server refuses.
public final class TestServer: Sendable {
    public static let tokens: [String: Identity] = [
        "alice-token": Identity(user: "alice"), "bob-token": Identity(user: "bob"),
        "reader-token": Identity(user: "carol", readOnly: true),
    ]

    public let directory: TemporaryDirectory
    public let session: URLSession
    private let state: Mutex<State>

    private struct State {
        var configuration: SyncServer.Configuration
        var server: SyncServer
        var port = 0
        var serving: SyncServer.Serving?
        /// The ports of stopped servers, held (`LoopbackSocket.hold`) until
        /// this test server ends: a client still sent to one finds nobody.
        var heldPorts: [Int32] = []
    }

    /// What the next `restart()`, `backUp(to:)` or `restore(from:)` serves
    /// with; a change applies then. `server.configuration.host = ...` reads
    /// it and writes it back as two steps, each under the lock: change it
    /// from one task at a time.
    public var configuration: SyncServer.Configuration {
        get { state.withLock { $0.configuration } }
        set { state.withLock { $0.configuration = newValue } }
    }
    /// The server serving now (or last, once stopped).
    public var server: SyncServer { state.withLock { $0.server } }
    /// The port it listens on.
    public var port: Int { state.withLock { $0.port } }

    /// - Parameters:
    ///   - dataDirectory: serve this store instead of a new one.
    ///   - scopeField: the server's scope field (`Configuration.scopeField`).
    public init(
        _ name: String, rateLimit: (Double, Int)? = nil, faultInjection: Bool = true, durability: LMDBDurability = .process,
        dataDirectory: String? = nil, scopeField: String? = nil
    ) async throws {
        directory = try TemporaryDirectory("server-\(name)")
        var configuration = SyncServer.Configuration(dataDirectory: dataDirectory ?? directory.appending("data"))
        configuration.port = 0
        configuration.tokens = TestServer.tokens
        configuration.adminToken = "admin-token"
        configuration.rateLimit = rateLimit
        configuration.faultInjection = faultInjection
        configuration.durability = durability
        configuration.scopeField = scopeField
        // Stopping a test server cancels its connections, which Hummingbird
        // logs as errors; they are expected here.
        configuration.logLevel = .critical
        let sessionConfiguration = URLSessionConfiguration.ephemeral
        sessionConfiguration.connectionProxyDictionary = [:]
        // Only a server that never answers takes this long: generous, as
        // the whole suite on two cores delays an answer by seconds.
        sessionConfiguration.timeoutIntervalForRequest = 60
        session = URLSession(configuration: sessionConfiguration)
        state = Mutex(State(configuration: configuration, server: try SyncServer(configuration: configuration)))
        try await start()
    }

    /// Serves until `stop()`; returns once listening, and throws why when
    /// the server ends before it listens (it cannot bind, say).
    private func start() async throws {
        let serving = try await server.serve()
        state.withLock { state in
            state.serving = serving
            state.port = serving.port
        }
    }

    /// Stops serving (in-flight requests finish) and closes the store.
    /// The port stays held until this test server ends: a connection to
    /// it is refused, rather than answered by another test's server given
    /// the port, which once made a client of a stopped server sync.
    public func stop() async {
        let serving = state.withLock { state in
            defer { state.serving = nil }
            return state.serving
        }
        await serving?.stop()
        server.close()
        guard serving != nil else { return }
        do {
            let held = try LoopbackSocket.hold(port: port)
            state.withLock { $0.heldPorts.append(held) }
        } catch {
            // Not a failure of the test: only a rare later client could
            // reach another server, which a test expecting none would see.
            FileHandle.standardError.write(Data("TestServer: could not hold port \(port) after stopping: \(error)\n".utf8))
        }
    }

    deinit {
        for descriptor in state.withLock({ $0.heldPorts }) { close(descriptor) }
    }

    /// Serves the data directory again with a new server (the configuration
    /// as it is now) on a new port, once `stop()` has closed the old one.
    private func serveAgain() async throws {
        let server = try SyncServer(configuration: configuration)
        state.withLock { $0.server = server }
        try await start()
    }

    /// Stops, then serves the same directory again on a new port.
    public func restart() async throws {
        await stop()
        try await serveAgain()
    }

    /// Stops, copies the data directory to `backup`, as an operator backs
    /// up a stopped server, and serves the same directory again on a new port.
    public func backUp(to backup: String) async throws {
        await stop()
        try FileManager.default.copyItem(atPath: configuration.dataDirectory, toPath: backup)
        try await serveAgain()
    }

    /// Stops, replaces the data directory with a copy of `backup` (made by
    /// `backUp(to:)`), as an operator restores a backup, and serves it on a
    /// new port. The store keeps its server ID: to clients it is the same
    /// server, which lost the changes made since the backup.
    public func restore(from backup: String) async throws {
        await stop()
        let dataDirectory = configuration.dataDirectory
        try FileManager.default.removeItem(atPath: dataDirectory)
        try FileManager.default.copyItem(atPath: backup, toPath: dataDirectory)
        try await serveAgain()
    }

    public struct Reply: Sendable {
        public var status: Int
        public var headers: [String: String]
        public var body: Data

        public func decode<T: Decodable>(_: T.Type) throws -> T { try JSONDecoder().decode(T.self, from: body) }
        public var error: ErrorEnvelope? { try? decode(ErrorEnvelope.self) }
        public var json: Any? { try? JSONSerialization.jsonObject(with: body, options: [.fragmentsAllowed]) }
    }

    public func send(
        _ method: String, _ path: String, token: String? = "alice-token", query: [String: String] = [:], body: Data? = nil,
        headers: [String: String] = [:]
    ) async throws -> Reply {
        var components = URLComponents(string: "http://127.0.0.1:\(port)\(path)")!
        if !query.isEmpty { components.queryItems = query.sorted { $0.key < $1.key }.map { URLQueryItem(name: $0.key, value: $0.value) } }
        var request = URLRequest(url: components.url!)
        request.httpMethod = method
        if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        if let body {
            request.httpBody = body
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
        let (data, response) = try await session.dataIgnoringCancellation(for: request)
        guard let http = response as? HTTPURLResponse else { throw CocoaError(.fileReadUnknown) }
        var fields: [String: String] = [:]
        for (name, value) in http.allHeaderFields {
            if let name = name as? String, let value = value as? String { fields[name.lowercased()] = value }
        }
        return Reply(status: http.statusCode, headers: fields, body: data)
    }

    public func push(_ operations: [PushOperation], token: String = "alice-token") async throws
        -> Reply
    {
        try await send("POST", "/v1/push", token: token, body: try JSONEncoder().encode(PushRequest(operations: operations)))
    }

    public func pull(
        cursor: String? = nil, limit: Int? = nil, types: String? = nil, scopes: String? = nil, wait: Int? = nil,
        token: String = "alice-token"
    ) async throws -> Reply {
        var query: [String: String] = [:]
        if let cursor { query["cursor"] = cursor }
        if let limit { query["limit"] = String(limit) }
        if let types { query["types"] = types }
        if let scopes { query["scopes"] = scopes }
        if let wait { query["wait"] = String(wait) }
        return try await send("GET", "/v1/pull", token: token, query: query)
    }

    /// The server's base URL, `http://127.0.0.1:<port>`.
    public var url: URL { URL(string: "http://127.0.0.1:\(port)")! }

    /// Sets the injected faults (`POST /v1/admin/faults`).
    public func faults(_ settings: FaultSettings) async throws {
        let reply = try await send("POST", "/v1/admin/faults", token: "admin-token", body: try JSONEncoder().encode(settings))
        guard reply.status == 200 else { throw CocoaError(.fileWriteUnknown) }
    }

    /// Forces every client to resync (`POST /v1/admin/resync`).
    public func forceResync() async throws {
        let reply = try await send("POST", "/v1/admin/resync", token: "admin-token")
        guard reply.status == 200 else { throw CocoaError(.fileWriteUnknown) }
    }

    /// Compacts every user's feed (`POST /v1/admin/compact`) and returns
    /// the answer's JSON object.
    public func compact() async throws -> [String: Any] {
        let reply = try await send("POST", "/v1/admin/compact", token: "admin-token")
        guard reply.status == 200, let answer = reply.json as? [String: Any] else { throw CocoaError(.fileWriteUnknown) }
        return answer
    }

    /// Every change in the user's feed, page by page.
    public func pullAll(token: String = "alice-token", limit: Int = 1000) async throws -> [PullChange] {
        var changes: [PullChange] = []
        var cursor: String?
        for _ in 0..<10_000 {
            let page = try await pull(cursor: cursor, limit: limit, token: token).decode(PullResponse.self)
            changes += page.changes
            cursor = page.cursor
            if !page.hasMore { return changes }
        }
        throw CocoaError(.fileReadTooLarge)
    }
}

public typealias LMDBDurability = SyncServer.Configuration.Durability

/// A push operation with defaults for the fields a test does not care about.
public func operation(
    _ intent: PushOperation.Intent, _ id: String, _ data: Fields? = nil, key: String? = nil, base: UInt64 = 0,
    type: String = "te"
) -> PushOperation {
    PushOperation(
        idempotencyKey: key ?? UUIDv7.Generator.shared.next().uuidString, entityType: type, entityID: id, intent: intent,
        data: data ?? (intent == .delete ? nil : [:]), clientTimestamp: "2026-11-22T08:00:00.000000Z", baseVersion: base)
}

/// The line `syncserver` prints once it listens:
/// `syncserver ID listening on http://127.0.0.1:PORT (data DIR)`.
public enum SyncServerBanner {
    /// The port a loopback server's banner names, or nil for any other line.
    public static func port(in line: String) -> Int? {
        guard let start = line.range(of: " listening on http://127.0.0.1:")?.upperBound else { return nil }
        return Int(line[start...].prefix { $0.isNumber })
    }
}

extension URLSession {
    /// `data(for:)`, but a cancellation of the caller's task does not
    /// cancel the request: the caller waits for its answer. On Linux,
    /// `data(for:)` cancelled as its answer comes can deadlock
    /// (swift-corelibs-foundation issue 5412: the cancellation holds the
    /// task's lock while it waits for the session's queue, which resumes
    /// the task), and a test that failed with a request in flight, its
    /// other requests cancelled, then hung instead of failing. A loopback
    /// request ends soon.
    public func dataIgnoringCancellation(for request: URLRequest) async throws -> (Data, URLResponse) {
        try await withCheckedThrowingContinuation { continuation in
            dataTask(with: request) { data, response, error in
                if let error {
                    continuation.resume(throwing: error)
                } else if let response {
                    continuation.resume(returning: (data ?? Data(), response))
                } else {
                    continuation.resume(throwing: URLError(.badServerResponse))
                }
            }.resume()
        }
    }
}
