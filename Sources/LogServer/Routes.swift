import Foundation
import Hummingbird
import LogFormat
import ServiceLifecycle

/// The endpoints: authentication, rate limiting, body limits and decoding
/// around `SyncService`.
struct Routes: Sendable {
    let server: SyncServer

    /// `ok` only while the store can serve push and pull (section 6).
    func health(_ request: Request, _ context: BasicRequestContext) throws -> Response {
        if let problem = server.service.storage.environment.problem { throw server.storageUnavailable(problem) }
        let health = HealthResponse(serverID: server.serverID, requestCodings: BodyCompression.requestCodings)
        return try reply(Wire.makeEncoder().encode(health), to: request)
    }

    func push(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        let identity = try authenticate(request)
        // Held from the body's first byte until the push is done: the body,
        // what it parses to, and its wait for the store's one writer.
        var held = 0
        defer { server.pushBuffer.release(held) }
        let body = try await collect(request) { count in
            try server.pushBuffer.take(count, holding: held)
            held += count
        }
        let pushRequest = try ReceivedPush(body: body)
        let response = try await server.service.push(pushRequest, as: identity)
        // Committed: the pulls waiting on this user's feed look again.
        server.feedWaiters.wake(identity.user)
        if server.configuration.faultInjection, server.faults.takeDrop() {
            // Applied and committed; the answer is cut off mid-body.
            return Response(
                status: .ok, headers: [.contentType: "application/json"],
                body: ResponseBody(contentLength: 1_000) { writer in
                    try await writer.write(ByteBuffer(string: "{\"results\":"))
                    throw DroppedAnswer()
                })
        }
        return try reply(response.encodeJSON(), to: request)
    }

    func pull(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        let identity = try authenticate(request)
        let query = request.uri.queryParameters
        for name in ["cursor", "limit", "types", "scopes", "wait"] where query.getAll(name).count > 1 {
            throw ServiceError(.validationError, "\(name) is given more than once")
        }
        let cursor = query["cursor"].map(String.init)
        var limit = Wire.pullPageCountDefault
        if let text = query["limit"] {
            // Digits only: no sign, no fraction, not empty.
            guard Wire.isDigits(text), let number = Int(text)
            else { throw ServiceError(.validationError, "limit \"\(text.prefix(40))\" is not 1 to \(Wire.pullPageCountMax)") }
            limit = number
        }
        // A list the protocol refuses is a validation error.
        func names(_ parsed: Result<Set<String>, Wire.PullTypesProblem>) throws -> Set<String> {
            try parsed.mapError { ServiceError(.validationError, $0.description) }.get()
        }
        let types = try query["types"].map { try names(Wire.pullTypes($0)) }
        let scopes = try query["scopes"].map { try names(Wire.pullScopes($0)) }
        if scopes != nil, server.configuration.scopeField == nil { throw ServiceError.noScopeField }
        var wait = 0
        if let text = query["wait"] {
            guard Wire.isDigits(text), let seconds = Int(text), seconds <= Wire.pullWaitSecondsMax
            else { throw ServiceError(.validationError, "wait \"\(text.prefix(40))\" is not 0 to \(Wire.pullWaitSecondsMax) seconds") }
            wait = seconds
        }
        let deadline = ContinuousClock.now + .seconds(wait)
        let waiters = server.feedWaiters
        while true {
            // Read before the page: a push committed after it wakes the wait below.
            let wakes = waiters.wakes(of: identity.user)
            let page = try server.service.pull(cursor: cursor, limit: limit, types: types, scopes: scopes, as: identity)
            guard page.changes.isEmpty, !page.forceResync, ContinuousClock.now < deadline else {
                return try reply(page.encodeJSON(), to: request)
            }
            // A graceful stop waits for the answers under way: it ends the waits.
            let woken = await withGracefulShutdownHandler {
                await waiters.wait(identity.user, after: wakes, until: deadline)
            } onGracefulShutdown: {
                waiters.close()
            }
            guard woken else { return try reply(page.encodeJSON(), to: request) }
        }
    }

    func resync(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        try authenticateAdmin(request)
        let generation = try await server.service.forceResync()
        // The waiting pulls answer force_resync now.
        server.feedWaiters.wakeEveryone()
        return try Reply.json(["generation": generation])
    }

    func compact(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        try authenticateAdmin(request)
        return try Reply.json(try await server.service.compactFeeds())
    }

    func setFaults(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        try authenticateAdmin(request)
        try server.faults.set(try FaultSettings(json: try await collect(request)))
        return try Reply.json(server.faults.current)
    }

    // MARK: Helpers

    /// The JSON answer `body` to `request`: in gzip when the request
    /// accepts it, the body has at least `BodyCompression.bytesMin`
    /// bytes and `Configuration.gzipLevel` is not 0. While it is not, every
    /// answer says it varies with `Accept-Encoding`, for caches between.
    private func reply(_ body: Data, to request: Request) throws -> Response {
        var response = Reply.json(body: body)
        let level = server.configuration.gzipLevel
        guard level > 0 else { return response }
        response.headers[.vary] = "Accept-Encoding"
        guard body.count >= BodyCompression.bytesMin,
            BodyCompression.acceptsGzip(request.headers[values: .acceptEncoding].joined(separator: ","))
        else { return response }
        response.headers[.contentEncoding] = "gzip"
        response.body = ResponseBody(byteBuffer: ByteBuffer(bytes: try BodyCompression.gzip(body, level: level)))
        return response
    }

    /// The token of an `Authorization: Bearer` header (section 3): after
    /// the scheme, matched without regard to case (RFC 9110, section 11.1),
    /// and one or more spaces, one or more characters from `!` to `~`.
    /// Anything else (Unicode spaces, other characters) is no token: a
    /// token checked by its bytes compares exactly, as `String`'s `==`,
    /// which equates canonically equivalent text, would not.
    static func bearerToken(_ header: String?) -> String? {
        guard let header else { return nil }
        let space = UInt8(ascii: " ")
        let bytes = Array(header.utf8)
        let scheme = Array("bearer".utf8)
        // Letters only, so setting the case bit of a byte lowercases it.
        guard bytes.count > scheme.count, zip(bytes, scheme).allSatisfy({ $0 | 0x20 == $1 }), bytes[scheme.count] == space
        else { return nil }
        // Whitespace around a field value is not part of it (RFC 9110,
        // section 5.5); HTTP's own, spaces and tabs, not Unicode's.
        var token = bytes[(scheme.count + 1)...].drop { $0 == space }
        while let last = token.last, last == space || last == UInt8(ascii: "\t") { token.removeLast() }
        guard SyncServer.isToken(token) else { return nil }
        return String(decoding: token, as: UTF8.self)
    }

    /// The caller's identity, after the rate limit. The admin token names
    /// no user (section 3), even one configured with it too.
    private func authenticate(_ request: Request) throws -> Identity {
        guard let token = Routes.bearerToken(request.headers[.authorization]), token != server.configuration.adminToken,
            let identity = server.configuration.tokens[token]
        else {
            throw ServiceError(.unauthorized, "a valid bearer token is required")
        }
        if let limiter = server.limiter,
            // Monotonic: the limiter never moves its clock back, so a wall
            // clock set back would stop refills until it caught up.
            let retryAfter = limiter.take(identity.user, now: ProcessInfo.processInfo.systemUptime)
        {
            throw ServiceError(.rateLimited, "too many requests; retry after \(retryAfter) s", retryAfter: retryAfter)
        }
        return identity
    }

    private func authenticateAdmin(_ request: Request) throws {
        guard let expected = server.configuration.adminToken, Routes.bearerToken(request.headers[.authorization]) == expected else {
            throw ServiceError(.unauthorized, "the admin token is required")
        }
    }

    /// The body, refusing more than `Wire.requestBodyBytesMax` bytes, as
    /// sent and, in gzip (section 2, "Bodies"), inflated; `take` is told the
    /// size of each part before it is kept, and of the inflated body, and
    /// may refuse it. Another coding is refused before the body is read:
    /// 415, as RFC 9110 section 15.5.16 answers a coding the server does
    /// not support, where such a body failed to parse and was answered 400,
    /// which blamed its JSON. `identity` is no coding: the body as it is.
    private func collect(_ request: Request, taking take: (Int) throws -> Void = { _ in }) async throws -> Data {
        let gzipped = try BodyCompression.isGzipped(request.headers[values: .contentEncoding])
        if let length = request.headers[.contentLength].flatMap(Int.init), length > Wire.requestBodyBytesMax {
            throw ServiceError(.payloadTooLarge, "the body is \(length) bytes; the limit is \(Wire.requestBodyBytesMax)")
        }
        var data = Data()
        for try await buffer in request.body {
            guard data.count + buffer.readableBytes <= Wire.requestBodyBytesMax else {
                throw ServiceError(.payloadTooLarge, "the body is over \(Wire.requestBodyBytesMax) bytes")
            }
            try take(buffer.readableBytes)
            data.append(contentsOf: buffer.readableBytesView)
        }
        guard gzipped else { return data }
        let inflated = try BodyCompression.gunzip(data, bytesMax: Wire.requestBodyBytesMax)
        try take(inflated.count)
        return inflated
    }
}
