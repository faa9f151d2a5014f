import Foundation
import LogFormat
import LogSync
import Synchronization

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The sync protocol over HTTP with `URLSession` (`Format/sync-protocol.md`):
/// bearer token, timeouts, gzip accepted, push bodies of 1 KiB or more sent
/// in gzip to a server whose health answer says it takes them, bodies read
/// up to a limit. It works on Linux and Apple platforms alike. It never
/// retries; the engine decides that (but for a push in gzip refused with
/// 415, sent again at once as it is).
///
/// Caveats: on Linux, FoundationNetworking (libcurl) inflates a compressed
/// body whatever the request accepted, and cannot cancel a transfer while
/// its data comes faster than it inflates it. A server that sends a
/// compressed stream without end fails its request at
/// `responseBodyBytesMax`, and the memory held stays within it, but the
/// transfer keeps a core busy, and the process's later requests wait,
/// until the server stops. A process that must not depend on its server
/// for that can give `SyncEngine` a `SyncTransport` of its own.
public final class HTTPTransport: SyncTransport, FeedWaiting, ScopedPulling {
    public struct Options: Sendable {
        /// Seconds a request may wait for data before it fails as a network
        /// error. Infinite, NaN, or a year or more: a year.
        public var requestTimeout: TimeInterval = 30
        /// Seconds a whole exchange may take (a long pull page included).
        public var resourceTimeout: TimeInterval = 120
        /// Connect directly, ignoring proxy settings (a loopback server).
        public var ignoreProxies = false
        /// The longest response body read, counted after decompression; a
        /// longer one fails its request as `.responseTooLarge`. A negative
        /// one, as 0, reads no body.
        public var responseBodyBytesMax = HTTPTransport.responseBodyBytesDefault
        /// Whether to send push bodies in gzip to a server that takes them.
        public var gzipsPushes = true

        public init() {}
    }

    /// The default `responseBodyBytesMax`, 32 MiB. The protocol bounds no
    /// response (section 16, point 14), but it bounds what one holds: one
    /// change, or one result's `server_state`, carries at most
    /// `Wire.entityFieldsBytesMax` bytes of fields, which JSON writes in at
    /// most six times as many (`false` for a one-byte tag, `\u0001` for a
    /// control character in a string), about 24 MiB. A page or a push answer
    /// over the limit holds more than one such, and the engine asks again
    /// for fewer; a body over it that no request can shrink breaks the
    /// protocol. Without a limit, a broken server or proxy could make the
    /// client hold a body without end in memory.
    public static let responseBodyBytesDefault = 32 * 1024 * 1024

    private let baseURL: URL
    private let token: String
    /// Why `token` can authenticate no request (`tokenProblem(_:)`), or nil.
    private let tokenProblem: String?
    /// Why no request can go to `baseURL` (`urlProblem(_:)`), or nil.
    private let urlProblem: String?
    private let options: Options
    private let reader: ResponseReader
    private let session: URLSession
    /// Whether the server's last health answer listed gzip among the
    /// codings it takes in request bodies (`request_codings`).
    private let serverTakesGzip = Atomic(false)

    /// Push bodies shorter than this go as they are.
    static let gzipBytesMin = 1_024

    /// - Parameters:
    ///   - baseURL: the server's root, such as `http://127.0.0.1:8080`.
    ///   - token: the user's bearer token. One that no server can accept
    ///     (empty, or with a character other than `!` to `~` inside, such
    ///     as the line feed a token read from a file ends with) is never
    ///     sent: each request that needs it fails as the server's 401
    ///     would, with a message that names the character.
    public init(baseURL: URL, token: String, options: Options = .init()) {
        self.baseURL = baseURL
        self.token = token
        tokenProblem = Self.tokenProblem(token)
        urlProblem = Self.urlProblem(baseURL)
        self.options = options
        reader = ResponseReader(bytesMax: max(options.responseBodyBytesMax, 0))
        let configuration = URLSessionConfiguration.ephemeral
        // Foundation on Linux converts it to an `Int` of milliseconds as each
        // request starts, a trap for an infinite or NaN one, or 10^16 s.
        let requestTimeout = options.requestTimeout
        configuration.timeoutIntervalForRequest =
            requestTimeout < ResponseReader.deadlineSecondsMax ? requestTimeout : ResponseReader.deadlineSecondsMax
        configuration.timeoutIntervalForResource = options.resourceTimeout
        configuration.httpAdditionalHeaders = ["Accept-Encoding": "gzip", "Sync-Protocol-Version": "\(Wire.protocolVersion)"]
        configuration.urlCache = nil
        // The protocol has no cookies: kept, a server's would pile up, one
        // per name, and go back with every request.
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        configuration.httpCookieAcceptPolicy = .never
        if options.ignoreProxies { configuration.connectionProxyDictionary = [:] }
        session = URLSession(configuration: configuration, delegate: reader, delegateQueue: nil)
    }

    deinit { session.finishTasksAndInvalidate() }

    public func health() async throws(TransportError) -> HealthResponse {
        let (body, _) = try await exchange("GET", "/v1/health", authorized: false)
        guard let health = try? JSONDecoder().decode(HealthResponse.self, from: body), health.status == "ok",
            health.protocolVersion == Wire.protocolVersion
        else { throw TransportError(.network, "health: the answer is not a healthy sync server's") }
        serverTakesGzip.store(health.requestCodings?.contains("gzip") == true, ordering: .relaxed)
        return health
    }

    public func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        let body: Data
        do { body = try request.encodeJSON() } catch { throw TransportError(.network, "POST /v1/push: cannot encode: \(error)") }
        // Section 10: a request is at most this many bytes. A larger one is
        // never sent: the engine splits it as it splits one the server
        // refused, and a proxy's own 413 (which the engine cannot tell from
        // any other proxy's answer) never comes into it.
        guard body.count <= Wire.requestBodyBytesMax else {
            throw TransportError(
                .status(413, .payloadTooLarge),
                "POST /v1/push: \(request.operations.count) operations make a body of \(body.count) bytes, over requestBodyBytesMax "
                    + "(\(Wire.requestBodyBytesMax)); not sent")
        }
        let data: Data
        if options.gzipsPushes, body.count >= Self.gzipBytesMin, serverTakesGzip.load(ordering: .relaxed),
            // Level 1, as the server's answers: a push of 100 intents takes
            // a seventh of its JSON, and a level-6 body, 18% smaller, costs
            // four times the CPU (0.5 ms a push beside the server in bench
            // section 9, where it lowered the flush rate by a fifth).
            let gzipped = Gzip.compress(body, level: 1)
        {
            do {
                (data, _) = try await exchange("POST", "/v1/push", body: gzipped, contentEncoding: "gzip")
            } catch let error where error.kind == .status(415, .unsupportedMediaType) {
                // Refused before it was read (another server now answers
                // there): nothing was applied. As it is, from now on.
                serverTakesGzip.store(false, ordering: .relaxed)
                (data, _) = try await exchange("POST", "/v1/push", body: body)
            }
        } else {
            (data, _) = try await exchange("POST", "/v1/push", body: body)
        }
        do { return try PushResponse.decode(json: data) } catch {
            throw TransportError(.network, "POST /v1/push: the answer is not a push response: \(error)")
        }
    }

    public func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        try await pull(cursor: cursor, limit: limit, types: types, scopes: nil)
    }

    public func pull(cursor: String?, limit: Int, types: Set<String>?, scopes: Set<String>) async throws(TransportError)
        -> PullResponse
    {
        try await pull(cursor: cursor, limit: limit, types: types, scopes: .some(scopes))
    }

    private func pull(cursor: String?, limit: Int, types: Set<String>?, scopes: Set<String>?) async throws(TransportError)
        -> PullResponse
    {
        var query = [URLQueryItem(name: "limit", value: String(limit))]
        query += HTTPTransport.filterItems(types: types, scopes: scopes)
        if let cursor { query.append(URLQueryItem(name: "cursor", value: cursor)) }
        let (data, _) = try await exchange("GET", "/v1/pull", query: query)
        do { return try PullResponse.decode(json: data) } catch {
            throw TransportError(.network, "GET /v1/pull: the answer is not a pull page: \(error)")
        }
    }

    /// Waits up to `seconds` (0 to `Wire.pullWaitSecondsMax`; outside,
    /// the nearest) for a change after `cursor` with a pull of one change
    /// that waits (section 8, `wait`). Its request may take that much
    /// longer than `Options.requestTimeout` and `resourceTimeout` allow.
    public func waitForChange(after cursor: String?, types: Set<String>?, scopes: Set<String>?, seconds: Int)
        async throws(TransportError) -> Bool
    {
        let seconds = min(max(seconds, 0), Wire.pullWaitSecondsMax)
        var query = [URLQueryItem(name: "limit", value: "1")]
        query += HTTPTransport.filterItems(types: types, scopes: scopes)
        query.append(URLQueryItem(name: "wait", value: String(seconds)))
        if let cursor { query.append(URLQueryItem(name: "cursor", value: cursor)) }
        let (data, _) = try await exchange("GET", "/v1/pull", query: query, waitSeconds: seconds)
        do {
            let page = try PullResponse.decode(json: data)
            return !page.changes.isEmpty || page.forceResync
        } catch {
            throw TransportError(.network, "GET /v1/pull: the answer is not a pull page: \(error)")
        }
    }

    /// The `types` and `scopes` of a pull (nil: none).
    private static func filterItems(types: Set<String>?, scopes: Set<String>?) -> [URLQueryItem] {
        var items: [URLQueryItem] = []
        if let types { items.append(URLQueryItem(name: "types", value: Wire.pullTypesValue(types))) }
        if let scopes { items.append(URLQueryItem(name: "scopes", value: Wire.pullTypesValue(scopes))) }
        return items
    }

    /// Sends one request and returns a 2xx body, or throws the failure
    /// classified as the protocol's section 10 says. A request that asks
    /// the server to wait `waitSeconds` gets that much more time.
    private func exchange(
        _ method: String, _ path: String, query: [URLQueryItem] = [], body: Data? = nil, contentEncoding: String? = nil,
        authorized: Bool = true, waitSeconds: Int = 0
    ) async throws(TransportError) -> (Data, HTTPURLResponse) {
        // URLSession's "unsupported URL" names neither the URL nor the fix,
        // and the engine counts a health check that fails so as offline.
        if let urlProblem { throw TransportError(.network, "\(method) \(path): \(urlProblem); not sent") }
        // The server's 401 says only that the request is not authenticated
        // (protocol section 3), and URLSession may drop or cut a header with
        // a control character: the app would hear "a valid bearer token is
        // required" about a token that is right but for a line feed.
        if authorized, let tokenProblem {
            throw TransportError(.status(401, .unauthorized), "\(method) \(path): \(tokenProblem); not sent")
        }
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
        if waitSeconds > 0 {
            // As the session's: NaN or too large, a year.
            let timeout = options.requestTimeout + TimeInterval(waitSeconds)
            request.timeoutInterval = timeout < ResponseReader.deadlineSecondsMax ? timeout : ResponseReader.deadlineSecondsMax
        }
        if authorized { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
        if let body {
            request.httpBody = body
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
            if let contentEncoding { request.setValue(contentEncoding, forHTTPHeaderField: "Content-Encoding") }
        }
        let data: Data
        let response: URLResponse
        do {
            (data, response) = try await reader.data(
                for: request, on: session, deadlineSeconds: options.resourceTimeout + TimeInterval(waitSeconds))
        } catch let reason as GiveUp {
            switch reason {
            case .tooLarge(let declared):
                let length = declared.map { "a body of \($0) bytes" } ?? "a body"
                throw TransportError(
                    .responseTooLarge,
                    "\(method) \(path): \(length) over responseBodyBytesMax (\(options.responseBodyBytesMax)); not read")
            case .deadline(let answered):
                throw TransportError(
                    answered ? .network : .noAnswer,
                    "\(method) \(path): no whole answer within resourceTimeout (\(options.resourceTimeout) s)")
            }
        } catch let failure as NoAnswer {
            throw TransportError(.noAnswer, "\(method) \(path): \(describe(failure.underlying))")
        } catch {
            throw TransportError(.network, "\(method) \(path): \(describe(error))")
        }
        guard let http = response as? HTTPURLResponse else { throw TransportError(.network, "\(path): not an HTTP response") }
        // The protocol has no redirects, and the session follows none
        // (`ResponseReader`): a proxy or portal answered, or a server set
        // up wrongly.
        guard !(300..<400).contains(http.statusCode) else {
            let location = http.value(forHTTPHeaderField: "Location").map { " to \($0.prefix(256))" } ?? ""
            throw TransportError(.network, "\(path): HTTP \(http.statusCode), a redirect\(location), not followed")
        }
        guard let version = http.value(forHTTPHeaderField: Wire.versionHeader) else {
            throw TransportError(.network, "\(path): HTTP \(http.statusCode) without \(Wire.versionHeader) (a proxy or captive portal answered)")
        }
        guard version == String(Wire.protocolVersion) else {
            throw TransportError(.protocolVersion(version), "\(path): the server speaks protocol version \(version)")
        }
        guard (200..<300).contains(http.statusCode) else { throw Self.failure(http, data, path) }
        return (data, http)
    }

    /// Why no request can go to `url`, or nil: the protocol runs over http
    /// or https, to a host. `URL(string: "localhost:8080")` parses, with
    /// "localhost" as its scheme and no host.
    static func urlProblem(_ url: URL) -> String? {
        guard let scheme = url.scheme?.lowercased(), ["http", "https"].contains(scheme), url.host?.isEmpty == false else {
            return "the server URL \(url.absoluteString.prefix(256)) is not http:// or https:// and a host, such as http://127.0.0.1:8080"
        }
        return nil
    }

    /// Why `token` cannot be a bearer token (protocol section 3: one or more
    /// characters from `!` to `~`, after the spaces and tabs around a
    /// header's value, which the server drops), or nil. It names the
    /// character and its place, never the token, which is a secret.
    static func tokenProblem(_ token: String) -> String? {
        let blank: Set<Character> = [" ", "\t"]
        let trimmed = token.drop { blank.contains($0) }.reversed().drop { blank.contains($0) }.reversed()
        guard !trimmed.isEmpty else { return "the token is empty" }
        let leading = token.prefix { blank.contains($0) }.unicodeScalars.count
        for (index, scalar) in trimmed.flatMap(\.unicodeScalars).enumerated() where !(0x21...0x7E).contains(scalar.value) {
            let code = String(scalar.value, radix: 16, uppercase: true)
            return "the token holds U+\(String(repeating: "0", count: max(0, 4 - code.count)))\(code) at character \(leading + index + 1), "
                + "which no bearer token has (one or more characters from ! to ~)"
        }
        return nil
    }

    /// `error` for people. FoundationNetworking names its errors only by
    /// their codes ("NSURLErrorDomain error -1001"). A timeout is what a
    /// slow or silent server makes most. A bad URL, for a server named by
    /// an IPv6 address (`http://[::1]:8080`), is FoundationNetworking's own
    /// failure before it connects, where Darwin's Foundation and curl reach
    /// the server (swift-corelibs-foundation issue 5496).
    private func describe(_ error: any Error) -> String {
        switch (error as? URLError)?.code {
        case .timedOut?:
            return "timed out (requestTimeout \(options.requestTimeout) s, resourceTimeout \(options.resourceTimeout) s)"
        case .badURL? where baseURL.host?.contains(":") == true:
            return "\(error.localizedDescription): this Foundation cannot reach a server named by an IPv6 address "
                + "(swift-corelibs-foundation issue 5496); name it by a host name that resolves to the address, "
                + "such as localhost for ::1"
        default:
            return error.localizedDescription
        }
    }

    private static func failure(_ http: HTTPURLResponse, _ data: Data, _ path: String) -> TransportError {
        let envelope = try? JSONDecoder().decode(ErrorEnvelope.self, from: data)
        let retryAfter = http.value(forHTTPHeaderField: "Retry-After").flatMap {
            retryAfterSeconds($0, date: http.value(forHTTPHeaderField: "Date"))
        }
        let detail = envelope.map { "\($0.error.code): \($0.error.message)" } ?? "no error envelope"
        return TransportError(
            .status(http.statusCode, envelope?.error.code), "\(path): HTTP \(http.statusCode), \(detail)", retryAfterSeconds: retryAfter)
    }

    /// The seconds a `Retry-After` asks for: its delay-seconds form (`Int.max`
    /// for more than an `Int` holds), or its
    /// HTTP-date form (RFC 9110 section 10.2.3, which a proxy or another
    /// server may send) less the response's `Date`, or less the client's
    /// clock without one, and at least 0. Nil for a value of neither form.
    /// The caller caps it, as any `Retry-After` (`RetryPolicy.retryAfterMaxMilliseconds`).
    static func retryAfterSeconds(_ value: String, date: String?) -> Int? {
        let value = value.trimmingCharacters(in: .whitespaces)
        if let seconds = Int(value) { return seconds }
        // Too many digits for an `Int`: longer than any wait honoured.
        if Wire.isDigits(value) { return .max }
        guard let until = httpDate(value) else { return nil }
        let now = date.flatMap(httpDate) ?? Date()
        let seconds = until.timeIntervalSince(now).rounded(.up)
        // At most 68 years, far past what is honoured, so any date converts.
        return seconds > 0 ? Int(min(seconds, Double(Int32.max))) : 0
    }

    /// An HTTP-date in any of the three forms a recipient must accept
    /// (RFC 9110 section 5.6.7): IMF-fixdate, RFC 850 and asctime.
    static func httpDate(_ text: String) -> Date? {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        for format in ["EEE, dd MMM yyyy HH:mm:ss 'GMT'", "EEEE, dd-MMM-yy HH:mm:ss 'GMT'", "EEE MMM d HH:mm:ss yyyy"] {
            formatter.dateFormat = format
            // asctime pads a day below 10 with a space ("Oct  1").
            if let date = formatter.date(from: text.split(separator: " ").joined(separator: " ")) { return date }
        }
        return nil
    }
}
