import Foundation
import LMDB
import LogFormat
import LogServer

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// What section 8 runs.
struct ServerBenchSettings: Codable, Sendable {
    /// Operations pushed and timed, in batches of `pushBatch`.
    var pushOperations: Int
    var pushBatch: Int
    /// Changes in the feed that the pull reads, in pages of `pullPage`.
    var pullChanges: Int
    var pullPage: Int
}

/// Section 8: the reference server over loopback HTTP, in this process,
/// with `.full` durability: pushes of creates in batches, then a pull of the
/// whole feed in pages. Each request is a real HTTP/1.1 exchange through
/// URLSession, JSON both ways.
enum ServerBenchmark {
    static let pullTarget = 50_000.0
    static let user = "bench"

    static func run(_ settings: Settings, _ workspace: Workspace) async throws -> ReportSection {
        let counts = settings.server
        let directory = workspace.path("server")
        // The same pushes as the timed ones, first to a server without a
        // scope field: what keeping the feed's index by scope (and checking
        // scopes) costs a push.
        progress("server: push \(counts.pushOperations) operations to a server without a scope field")
        let unscoped = try await LoopbackServer.serving(directory: workspace.path("server-unscoped"), users: [user]) { server in
            try await BenchClient(port: server.port, token: user).pushCreates(0..<counts.pushOperations, batch: counts.pushBatch, operation)
        }
        var section = try await LoopbackServer.serving(directory: directory, users: [user], scopeField: scopeField) { server in
            try await run(counts, server)
        }
        let rate = Double(counts.pushOperations) / unscoped.seconds
        section.rows.insert(
            ResultRow(
                "   the same pushes, to a server without a scope field", rate, "ops/s",
                detail: String(format: "the scope field's index and checks: the push above is %.2fx this", section.rows[0].value / rate)),
            at: 1)
        progress("server: open the store without its index by type")
        section.rows.append(try indexingOpen(directory, changes: counts.pullChanges))
        return section
    }

    /// Opens the server's store in `directory` (its feed of `changes`) as
    /// if made before the feed's index by type, which the open then makes,
    /// and again with the index whole.
    private static func indexingOpen(_ directory: String, changes: Int) throws -> ResultRow {
        do {
            let environment = try Environment(path: directory)
            defer { environment.close() }
            guard let index = try environment.openDatabase("type-changes", create: false) else {
                throw BenchError("the server's store has no type-changes database")
            }
            try environment.write { txn in try txn.removeAll(index) }
        }
        var configuration = SyncServer.Configuration(dataDirectory: directory)
        configuration.logLevel = .critical
        configuration.scopeField = scopeField
        let clock = ContinuousClock()
        var times: [Duration] = []
        for _ in 0..<2 {
            let started = clock.now
            let server = try SyncServer(configuration: configuration)
            times.append(clock.now - started)
            server.close()
        }
        return ResultRow(
            "open of a store made before the index by type (\(changes) changes)", times[0].seconds * 1000, "ms",
            detail: String(format: "indexing every change in one commit; the next open, with the index whole, %.1f ms", times[1].seconds * 1000))
    }

    private static func run(_ counts: ServerBenchSettings, _ server: LoopbackServer) async throws -> ReportSection {
        let client = BenchClient(port: server.port, token: user)

        progress("server: push \(counts.pushOperations) operations")
        let pushTime = try await client.pushCreates(0..<counts.pushOperations, batch: counts.pushBatch, operation)
        progress("server: fill the feed to \(counts.pullChanges) changes")
        if counts.pullChanges > counts.pushOperations {
            _ = try await client.pushCreates(counts.pushOperations..<counts.pullChanges, batch: counts.pushBatch, operation)
        }
        // The same feed twice: pages as they are, then in gzip (the
        // server's default level), as the Swift client asks for them.
        var pulls: [(encoding: String, pulled: Int, time: Duration, wireBytes: Int)] = []
        for encoding in ["identity", "gzip"] {
            progress("server: pull \(counts.pullChanges) changes (Accept-Encoding: \(encoding))")
            let (pulled, time, wireBytes, _, _) = try await client.pullAll(page: counts.pullPage, acceptEncoding: encoding) { _ in }
            guard pulled == counts.pullChanges else { throw BenchError("pulled \(pulled) changes, expected \(counts.pullChanges)") }
            pulls.append((encoding, pulled, time, wireBytes))
        }
        let (plain, gzip) = (pulls[0], pulls[1])
        // The rare type's changes alone, as a device that keeps the other
        // type off pulls them.
        // Pulls of some changes alone, as pages are: `query` names them,
        // and `expected` picks their operations out of the feed's.
        func pullAlone(_ query: String, types: String? = nil, scopes: String? = nil, expected: (Int) -> Bool) async throws -> ResultRow {
            progress("server: pull \(query) alone")
            let pull = try await client.pullAll(page: counts.pullPage, types: types, scopes: scopes, acceptEncoding: "identity") { _ in }
            let count = (0..<counts.pullChanges).count(where: expected)
            guard pull.pulled == count else { throw BenchError("pulled \(pull.pulled) changes of \(query), expected \(count)") }
            return ResultRow(
                "pull \(query): its \(pull.pulled) changes (1 in \(counts.pullChanges / max(count, 1))) of the \(counts.pullChanges)",
                pull.time.seconds * 1000, "ms",
                detail: String(
                    format: "%.3fx the time of the pull of every change (bodies as they are); requests: %d, the longest %.1f ms",
                    pull.time.seconds / plain.time.seconds, pull.requests, pull.longest.seconds * 1000))
        }
        let rare = try await pullAlone("types=\(rareType)", types: rareType) { entityType($0) == rareType }
        // One project's changes alone, as a device that syncs that project pulls them.
        let project = scope(rareScope)
        let scoped = try await pullAlone("scopes=\(project)", scopes: project) { scope($0) == project }
        progress("server: compact the feed (POST /v1/admin/compact)")
        let admin = BenchClient(port: server.port, token: LoopbackServer.adminToken)
        let compactionStart = ContinuousClock.now
        let compaction = try JSONSerialization.jsonObject(with: try await admin.send("POST", "/v1/admin/compact", body: nil)) as? [String: Int]
        let compactionTime = ContinuousClock.now - compactionStart
        guard let compaction, compaction["kept"] == counts.pullChanges, compaction["removed"] == 0 else {
            throw BenchError("compaction answered \(String(describing: compaction)), expected \(counts.pullChanges) kept and none removed")
        }

        var section = ReportSection("8. Reference server over loopback HTTP (.full durability)")
        section.rows = [
            ResultRow(
                "push: \(counts.pushOperations) creates in batches of \(counts.pushBatch)",
                Double(counts.pushOperations) / pushTime.seconds, "ops/s"),
            ResultRow(
                "pull: \(counts.pullChanges) changes in pages of \(counts.pullPage)", Double(plain.pulled) / plain.time.seconds,
                "ops/s", target: .atLeast(pullTarget, "ops/s"),
                detail: String(format: "bodies as they are: %.0f bytes per change", Double(plain.wireBytes) / Double(plain.pulled))),
            ResultRow(
                "pull, the same pages in gzip (level \(SyncServer.Configuration(dataDirectory: "").gzipLevel))",
                Double(gzip.pulled) / gzip.time.seconds, "ops/s", target: .atLeast(pullTarget, "ops/s"),
                detail: String(
                    format: "%.2fx the rate as they are; %.0f bytes per change, %.3fx the bytes",
                    (Double(gzip.pulled) / gzip.time.seconds) / (Double(plain.pulled) / plain.time.seconds),
                    Double(gzip.wireBytes) / Double(gzip.pulled), Double(gzip.wireBytes) / Double(plain.wireBytes))),
            ResultRow(
                "compact: \(counts.pullChanges) changes read, none superseded", Double(counts.pullChanges) / compactionTime.seconds,
                "changes/s",
                detail: String(
                    format: "%.0f ms for POST /v1/admin/compact, which reads every change and its entity's state, in commits of %d",
                    compactionTime.seconds * 1000, 10_000)),
            rare, scoped,
        ]
        section.notes = [
            "client and server share this process and its two cores; each batch or page is one HTTP request through URLSession, JSON encoded and decoded on both sides (the server reads pushes and the client reads pull pages with JSONReader); a push commits (with fsync) before it answers.",
            "each operation creates an entity with five fields (a string, an int, a bool, a timestamp, and its project in the server's scope field, \(scopeField), one of \(scopeCount) in turn), of type te, or tn for every \(rareTypeEvery)th.",
        ]
        return section
    }

    /// The type of one operation in `rareTypeEvery` (the 100th, the
    /// 200th, ...), which a pull of that type alone reads.
    static let rareType = "tn"
    static let rareTypeEvery = 100

    /// The server's scope field, and how many projects the operations
    /// put their entities in, in turn: the pull of one (`rareScope`'s)
    /// reads its changes alone.
    static let scopeField = "project"
    static let scopeCount = 100
    static let rareScope = 7

    /// The project of operation `n`.
    private static func scope(_ n: Int) -> String { "p\(n % scopeCount)" }

    /// The type of operation `n`.
    private static func entityType(_ n: Int) -> String { n % rareTypeEvery == rareTypeEvery - 1 ? rareType : "te" }

    private static func operation(_ n: Int) -> PushOperation {
        var data = Fields()
        data["description"] = .string("Task \(n)")
        data["minutes"] = .int(Int64(n % 480))
        data["billable"] = .bool(n % 2 == 0)
        data["started_at"] = .timestamp(1_795_335_611_301_476 + Int64(n))
        data[scopeField] = .string(scope(n))
        return PushOperation(
            idempotencyKey: "op-\(n)", entityType: entityType(n), entityID: "te-\(n)", intent: .create, data: data,
            clientTimestamp: "2026-11-22T08:00:00.000000Z", baseVersion: 0)
    }
}

/// The reference server in this process on a free loopback port, with
/// `.full` durability; each user's bearer token is the user's name.
struct LoopbackServer {
    let server: SyncServer
    let port: Int

    /// Runs `body` with the server serving (answers in gzip at
    /// `gzipLevel`, 0 for none), then stops it gracefully and closes its
    /// store, whether `body` throws or not.
    static func serving<T>(
        directory: String, users: [String], gzipLevel: Int = SyncServer.Configuration(dataDirectory: "").gzipLevel,
        scopeField: String? = nil, _ body: (LoopbackServer) async throws -> T
    ) async throws -> T {
        var configuration = SyncServer.Configuration(dataDirectory: directory)
        configuration.scopeField = scopeField
        configuration.port = 0
        configuration.gzipLevel = gzipLevel
        configuration.tokens = Dictionary(uniqueKeysWithValues: users.map { ($0, Identity(user: $0)) })
        configuration.adminToken = adminToken
        configuration.durability = .full
        // Stopping cancels the server's connections, which Hummingbird logs
        // as errors; they are expected here.
        configuration.logLevel = .critical
        let server = try SyncServer(configuration: configuration)
        let serving: SyncServer.Serving
        do {
            serving = try await server.serve()
        } catch {
            server.close()
            throw error
        }
        let result: Result<T, any Error>
        do {
            result = .success(try await body(LoopbackServer(server: server, port: serving.port)))
        } catch {
            result = .failure(error)
        }
        await serving.stop()
        server.close()
        return try result.get()
    }

    /// The operator's token (section 12 of the protocol).
    static let adminToken = "bench-admin"

    var url: URL { URL(string: "http://127.0.0.1:\(port)")! }
}

/// A minimal HTTP client for the bench (one connection, reused).
struct BenchClient: Sendable {
    let port: Int
    let token: String
    let session: URLSession

    init(port: Int, token: String) {
        self.port = port
        self.token = token
        let configuration = URLSessionConfiguration.ephemeral
        configuration.connectionProxyDictionary = [:]
        session = URLSession(configuration: configuration)
    }

    func send(_ method: String, _ path: String, body: Data?) async throws -> Data {
        try await exchange(method, path, body: body).body
    }

    /// `send`, asking for the body in `acceptEncoding` when given; with
    /// the body's length on the wire (its `Content-Length`, before
    /// URLSession undoes a coding).
    func exchange(_ method: String, _ path: String, body: Data?, acceptEncoding: String? = nil) async throws
        -> (body: Data, wireBytes: Int)
    {
        var request = URLRequest(url: URL(string: "http://127.0.0.1:\(port)\(path)")!)
        request.httpMethod = method
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        if let acceptEncoding { request.setValue(acceptEncoding, forHTTPHeaderField: "Accept-Encoding") }
        request.httpBody = body
        let (data, response) = try await session.data(for: request)
        guard let http = response as? HTTPURLResponse, http.statusCode == 200 else {
            throw BenchError("\(method) \(path): \(String(decoding: data, as: UTF8.self))")
        }
        if let acceptEncoding, (http.value(forHTTPHeaderField: "Content-Encoding") ?? "identity") != acceptEncoding, data.count >= 1_024 {
            throw BenchError("\(method) \(path): asked for \(acceptEncoding), got \(http.value(forHTTPHeaderField: "Content-Encoding") ?? "identity")")
        }
        return (data, http.value(forHTTPHeaderField: "Content-Length").flatMap { Int($0) } ?? data.count)
    }

    /// Pushes the operations `make` builds for `numbers`, `batch` per
    /// request, each checked to be applied.
    /// - Returns: the time spent encoding and sending the requests and decoding
    ///   the answers (building the operations excluded).
    func pushCreates(_ numbers: Range<Int>, batch: Int, _ make: (Int) -> PushOperation) async throws -> Duration {
        let clock = ContinuousClock()
        var elapsed = Duration.zero
        for first in stride(from: numbers.lowerBound, to: numbers.upperBound, by: batch) {
            let operations = (first..<min(first + batch, numbers.upperBound)).map(make)
            // Encoding the request is the client's half of the JSON, timed
            // like the pull's decoding (it was 14% of the push time).
            let started = clock.now
            let body = try JSONEncoder().encode(PushRequest(operations: operations))
            let response = try JSONDecoder().decode(PushResponse.self, from: try await send("POST", "/v1/push", body: body))
            elapsed += clock.now - started
            guard response.results.allSatisfy({ $0.status == PushResult.Status.applied }) else { throw BenchError("a push was not applied") }
        }
        return elapsed
    }

    /// Pulls the whole feed from its start (of `types` and `scopes` only, when given),
    /// `page` changes per request, asking for the bodies in
    /// `acceptEncoding` (URLSession's own choice when nil), handing each
    /// page's changes to `visit`.
    /// - Returns: the changes pulled, the time it took, the bodies' bytes
    ///   on the wire, the requests made and the longest of them.
    func pullAll(
        page: Int, types: String? = nil, scopes: String? = nil, acceptEncoding: String? = nil, _ visit: ([PullChange]) -> Void
    ) async throws
        -> (pulled: Int, time: Duration, wireBytes: Int, requests: Int, longest: Duration)
    {
        let clock = ContinuousClock()
        let started = clock.now
        var cursor: String?
        var pulled = 0
        var wireBytes = 0
        var requests = 0
        var longest = Duration.zero
        for _ in 0..<1_000_000 {
            var path = "/v1/pull?limit=\(page)"
            if let types { path += "&types=\(types)" }
            if let scopes { path += "&scopes=\(scopes)" }
            if let cursor { path += "&cursor=\(cursor)" }
            let sent = clock.now
            let answer = try await exchange("GET", path, body: nil, acceptEncoding: acceptEncoding)
            longest = max(longest, clock.now - sent)
            requests += 1
            wireBytes += answer.wireBytes
            // As a client reads pages: JSONReader, not JSONDecoder (see WireJSON.swift).
            let response = try PullResponse.decode(json: answer.body)
            visit(response.changes)
            pulled += response.changes.count
            cursor = response.cursor
            if !response.hasMore { break }
        }
        return (pulled, clock.now - started, wireBytes, requests, longest)
    }
}
