import Foundation
import Hummingbird
import LogFormat

/// The endpoints: authentication, rate limiting, body limits and decoding
/// around `SyncService`.
struct Routes: Sendable {
    let server: SyncServer

    /// `ok` only while the store can serve push and pull (section 6).
    func health(_ request: Request, _ context: BasicRequestContext) throws -> Response {
        if let problem = server.service.storage.environment.problem { throw ServiceError.storageUnavailable(problem) }
        return try Reply.json(HealthResponse(serverID: server.serverID))
    }

    func push(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        let identity = try authenticate(request)
        let body = try await collect(request)
        let pushRequest = try ReceivedPush(body: body)
        let response = try await server.service.push(pushRequest, as: identity)
        if server.configuration.faultInjection, server.faults.takeDrop() {
            // Applied and committed; the answer is cut off mid-body.
            return Response(
                status: .ok, headers: [.contentType: "application/json"],
                body: ResponseBody(contentLength: 1_000) { writer in
                    try await writer.write(ByteBuffer(string: "{\"results\":"))
                    throw DroppedAnswer()
                })
        }
        return Reply.json(body: try response.encodeJSON())
    }

    func pull(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        let identity = try authenticate(request)
        let query = request.uri.queryParameters
        for name in ["cursor", "limit"] where query.getAll(name).count > 1 {
            throw ServiceError(.validationError, "\(name) is given more than once")
        }
        let cursor = query["cursor"].map(String.init)
        var limit = Wire.pullPageCountDefault
        if let text = query["limit"] {
            // Digits only: no sign, no fraction, not empty.
            guard !text.isEmpty, text.utf8.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }),
                let number = Int(text)
            else { throw ServiceError(.validationError, "limit \"\(text.prefix(40))\" is not 1 to \(Wire.pullPageCountMax)") }
            limit = number
        }
        return Reply.json(body: try server.service.pull(cursor: cursor, limit: limit, as: identity).encodeJSON())
    }

    func resync(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        try authenticateAdmin(request)
        let generation = try await server.service.forceResync()
        return try Reply.json(["generation": generation])
    }

    func setFaults(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        guard server.configuration.faultInjection else { throw ServiceError(.notFound, "no such endpoint") }
        try authenticateAdmin(request)
        let body = try await collect(request)
        let settings: FaultSettings
        do {
            settings = try JSONDecoder().decode(FaultSettings.self, from: body)
        } catch {
            throw ServiceError(.validationError, "the faults body is not valid: \(describeDecoding(error))")
        }
        try server.faults.set(settings)
        return try Reply.json(server.faults.current)
    }

    // MARK: Helpers

    private func bearerToken(_ request: Request) -> String? {
        // The scheme name is case-insensitive (RFC 9110, section 11.1).
        guard let header = request.headers[.authorization], header.lowercased().hasPrefix("bearer ") else { return nil }
        let token = header.dropFirst("Bearer ".count).trimmingCharacters(in: .whitespaces)
        return token.isEmpty ? nil : token
    }

    /// The caller's identity, after the rate limit.
    private func authenticate(_ request: Request) throws -> Identity {
        guard let token = bearerToken(request), let identity = server.configuration.tokens[token] else {
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
        guard let expected = server.configuration.adminToken, bearerToken(request) == expected else {
            throw ServiceError(.unauthorized, "the admin token is required")
        }
    }

    /// The body, refusing more than `Wire.requestBodyBytesMax` bytes.
    private func collect(_ request: Request) async throws -> Data {
        if let length = request.headers[.contentLength].flatMap(Int.init), length > Wire.requestBodyBytesMax {
            throw ServiceError(.payloadTooLarge, "the body is \(length) bytes; the limit is \(Wire.requestBodyBytesMax)")
        }
        var data = Data()
        for try await buffer in request.body {
            guard data.count + buffer.readableBytes <= Wire.requestBodyBytesMax else {
                throw ServiceError(.payloadTooLarge, "the body is over \(Wire.requestBodyBytesMax) bytes")
            }
            data.append(contentsOf: buffer.readableBytesView)
        }
        return data
    }
}

/// A decoding error in a sentence that names where.
func describeDecoding(_ error: any Error) -> String {
    guard let error = error as? DecodingError else { return "\(error)" }
    let path = { (context: DecodingError.Context) in
        context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? ".\($0.stringValue)" }.joined()
    }
    switch error {
    case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context):
        return "\(path(context)): \(context.debugDescription)"
    case .keyNotFound(let key, let context):
        return "\(path(context)).\(key.stringValue) is missing"
    @unknown default:
        return "\(error)"
    }
}
