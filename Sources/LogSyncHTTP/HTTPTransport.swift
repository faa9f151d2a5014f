import Foundation
import LogFormat
import LogSync

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The sync protocol over HTTP with `URLSession` (`Format/sync-protocol.md`):
/// bearer token, timeouts, gzip accepted. It works on Linux and Apple
/// platforms alike. It never retries; the engine decides that.
public final class HTTPTransport: SyncTransport {
    public struct Options: Sendable {
        /// Seconds a request may wait for data before it fails as a network error.
        public var requestTimeout: TimeInterval = 30
        /// Seconds a whole exchange may take (a long pull page included).
        public var resourceTimeout: TimeInterval = 120
        /// Connect directly, ignoring proxy settings (a loopback server).
        public var ignoreProxies = false

        public init() {}
    }

    private let baseURL: URL
    private let token: String
    private let session: URLSession

    /// - Parameters:
    ///   - baseURL: the server's root, such as `http://127.0.0.1:8080`.
    ///   - token: the user's bearer token.
    public init(baseURL: URL, token: String, options: Options = .init()) {
        self.baseURL = baseURL
        self.token = token
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = options.requestTimeout
        configuration.timeoutIntervalForResource = options.resourceTimeout
        configuration.httpAdditionalHeaders = ["Accept-Encoding": "gzip", "Sync-Protocol-Version": "\(Wire.protocolVersion)"]
        configuration.urlCache = nil
        if options.ignoreProxies { configuration.connectionProxyDictionary = [:] }
        session = URLSession(configuration: configuration)
    }

    deinit { session.finishTasksAndInvalidate() }

    public func health() async throws(TransportError) -> HealthResponse {
        let (body, _) = try await exchange("GET", "/v1/health", authorized: false)
        guard let health = try? JSONDecoder().decode(HealthResponse.self, from: body), health.status == "ok",
            health.protocolVersion == Wire.protocolVersion
        else { throw TransportError(.network, "health: the answer is not a healthy sync server's") }
        return health
    }

    public func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        let body: Data
        do { body = try request.encodeJSON() } catch { throw TransportError(.network, "push: cannot encode: \(error)") }
        // Section 10: a request is at most this many bytes. A larger one is
        // never sent: the engine splits it as it splits one the server
        // refused, and a proxy's own 413 (which the engine cannot tell from
        // any other proxy's answer) never comes into it.
        guard body.count <= Wire.requestBodyBytesMax else {
            throw TransportError(
                .status(413, .payloadTooLarge),
                "push: \(request.operations.count) operations make a body of \(body.count) bytes, over requestBodyBytesMax "
                    + "(\(Wire.requestBodyBytesMax)); not sent")
        }
        let (data, _) = try await exchange("POST", "/v1/push", body: body)
        do { return try PushResponse.decode(json: data) } catch {
            throw TransportError(.network, "push: the answer is not a push response: \(error)")
        }
    }

    public func pull(cursor: String?, limit: Int) async throws(TransportError) -> PullResponse {
        var query = [URLQueryItem(name: "limit", value: String(limit))]
        if let cursor { query.append(URLQueryItem(name: "cursor", value: cursor)) }
        let (data, _) = try await exchange("GET", "/v1/pull", query: query)
        do { return try PullResponse.decode(json: data) } catch {
            throw TransportError(.network, "pull: the answer is not a pull page: \(error)")
        }
    }

    /// Sends one request and returns a 2xx body, or throws the failure
    /// classified as the protocol's section 10 says.
    private func exchange(
        _ method: String, _ path: String, query: [URLQueryItem] = [], body: Data? = nil, authorized: Bool = true
    ) async throws(TransportError) -> (Data, HTTPURLResponse) {
        guard var components = URLComponents(url: baseURL.appendingPathComponent(path), resolvingAgainstBaseURL: false) else {
            throw TransportError(.network, "\(path): bad server URL \(baseURL)")
        }
        if !query.isEmpty {
            components.queryItems = query
            // `+` is literal in a query component, but some servers read it as a space.
            components.percentEncodedQuery = components.percentEncodedQuery?.replacingOccurrences(of: "+", with: "%2B")
        }
        guard let url = components.url else { throw TransportError(.network, "\(path): bad URL") }
        var request = URLRequest(url: url)
        request.httpMethod = method
        if authorized { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        if let body {
            request.httpBody = body
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let data: Data
        let response: URLResponse
        do {
            (data, response) = try await session.data(for: request)
        } catch {
            throw TransportError(.network, "\(method) \(path): \(error.localizedDescription)")
        }
        guard let http = response as? HTTPURLResponse else { throw TransportError(.network, "\(path): not an HTTP response") }
        guard let version = http.value(forHTTPHeaderField: Wire.versionHeader) else {
            throw TransportError(.network, "\(path): HTTP \(http.statusCode) without \(Wire.versionHeader) (a proxy or captive portal answered)")
        }
        guard version == String(Wire.protocolVersion) else {
            throw TransportError(.protocolVersion(version), "\(path): the server speaks protocol version \(version)")
        }
        guard (200..<300).contains(http.statusCode) else { throw Self.failure(http, data, path) }
        return (data, http)
    }

    private static func failure(_ http: HTTPURLResponse, _ data: Data, _ path: String) -> TransportError {
        let envelope = try? JSONDecoder().decode(ErrorEnvelope.self, from: data)
        let retryAfter = http.value(forHTTPHeaderField: "Retry-After").flatMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        let detail = envelope.map { "\($0.error.code): \($0.error.message)" } ?? "no error envelope"
        return TransportError(
            .status(http.statusCode, envelope?.error.code), "\(path): HTTP \(http.statusCode), \(detail)", retryAfterSeconds: retryAfter)
    }
}
