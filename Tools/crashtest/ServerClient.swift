import Foundation
import LogFormat

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Push and pull over HTTP, with URLSession.
final class ServerClient: Sendable {
    /// Requests to a killed server fail at once (the connection is reset or
    /// refused); this bounds a request to a live but stuck one.
    static let requestSecondsMax: TimeInterval = 30
    /// The most pages one `pullAll` reads.
    static let pagesPerPullMax = 100_000

    let base: String
    let token: String
    private let session: URLSession

    init(port: Int, token: String) {
        base = "http://127.0.0.1:\(port)"
        self.token = token
        let configuration = URLSessionConfiguration.ephemeral
        // Proxy settings from the environment must not catch loopback requests.
        configuration.connectionProxyDictionary = [:]
        configuration.timeoutIntervalForRequest = ServerClient.requestSecondsMax
        session = URLSession(configuration: configuration)
    }

    /// A session holds connections and threads until it is invalidated; a
    /// run starts hundreds of servers, each with a client of its own.
    deinit { session.invalidateAndCancel() }

    /// Pushes the operations and returns the result for each, in order.
    /// - Throws: a transport error, `StatusError` for an answer other than
    ///   200, or `HarnessError` for one without one result per operation.
    func push(_ operations: [PushOperation]) async throws -> [PushResult] {
        var request = URLRequest(url: URL(string: "\(base)/v1/push")!)
        request.httpMethod = "POST"
        request.httpBody = try Wire.makeEncoder().encode(PushRequest(operations: operations))
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        let response = try await send(request).decode(PushResponse.self)
        guard response.results.map(\.idempotencyKey) == operations.map(\.idempotencyKey) else {
            throw HarnessError("\(base)/v1/push answered \(response.results.count) results for \(operations.count) operations, or out of order")
        }
        return response.results
    }

    /// One page of the change feed after `cursor` (nil: from the start),
    /// of `types` only when given.
    func pull(
        after cursor: String?, limit: Int = Wire.pullPageCountMax, types: Set<String>? = nil, scopes: Set<String>? = nil
    ) async throws -> PullResponse {
        var components = URLComponents(string: "\(base)/v1/pull")!
        components.queryItems = [URLQueryItem(name: "limit", value: String(limit))]
            + (types.map { [URLQueryItem(name: "types", value: Wire.pullTypesValue($0))] } ?? [])
            + (scopes.map { [URLQueryItem(name: "scopes", value: Wire.pullTypesValue($0))] } ?? [])
            + (cursor.map { [URLQueryItem(name: "cursor", value: $0)] } ?? [])
        return try await send(URLRequest(url: components.url!)).decode(PullResponse.self)
    }

    /// What `POST /v1/admin/compact` did (the client's token must be the
    /// admin token).
    struct Compaction: Decodable {
        var removed: Int
        var kept: Int
        var users: Int
    }

    /// Compacts every feed (`POST /v1/admin/compact`).
    func compact() async throws -> Compaction {
        var request = URLRequest(url: URL(string: "\(base)/v1/admin/compact")!)
        request.httpMethod = "POST"
        return try await send(request).decode(Compaction.self)
    }

    /// An answer other than 200 (nil: no HTTP status).
    struct StatusError: Error, CustomStringConvertible {
        var status: Int?
        var description: String
    }

    /// The change feed after `cursor`, or nil when the server answers 410:
    /// the cursor is below the feed's compaction horizon.
    func pullAllUnlessGone(after cursor: String) async throws -> [PullChange]? {
        do {
            return try await pullAll(after: cursor)
        } catch let error as StatusError where error.status == 410 {
            return nil
        }
    }

    /// The change feed after `cursor` (by default the whole feed), of
    /// `types` only when given.
    func pullAll(after cursor: String? = nil, types: Set<String>? = nil, scopes: Set<String>? = nil) async throws -> [PullChange] {
        var changes: [PullChange] = []
        var cursor = cursor
        for _ in 0..<ServerClient.pagesPerPullMax {
            let page = try await pull(after: cursor, types: types, scopes: scopes)
            changes += page.changes
            cursor = page.cursor
            if !page.hasMore { return changes }
        }
        throw HarnessError("\(base)/v1/pull has more than \(ServerClient.pagesPerPullMax) pages")
    }

    private struct Answer {
        var url: String
        var data: Data

        func decode<T: Decodable>(_: T.Type) throws -> T {
            do {
                return try JSONDecoder().decode(T.self, from: data)
            } catch {
                throw HarnessError("\(url) answered what is no \(T.self): \(String(decoding: data.prefix(200), as: UTF8.self))")
            }
        }
    }

    private func send(_ request: URLRequest) async throws -> Answer {
        var request = request
        request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        let (data, response) = try await session.data(for: request)
        let url = request.url?.absoluteString ?? base
        guard let status = (response as? HTTPURLResponse)?.statusCode, status == 200 else {
            let status = (response as? HTTPURLResponse)?.statusCode
            throw StatusError(
                status: status, description: "\(url) answered \(status.map(String.init) ?? "no HTTP status"): \(String(decoding: data.prefix(200), as: UTF8.self))")
        }
        return Answer(url: url, data: data)
    }
}
