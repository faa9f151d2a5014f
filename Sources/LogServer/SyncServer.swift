import Foundation
import HTTPTypes
import Hummingbird
import LMDB
import LogFormat
import Logging
import NIOCore
import NIOHTTP1
import Synchronization

/// The reference sync server (`Format/sync-protocol.md`): push, pull and
/// health over HTTP/1.1 with JSON, bearer tokens per user, a token-bucket
/// rate limit, and fault injection for tests.
public final class SyncServer: Sendable {
    public struct Configuration: Sendable {
        public typealias Durability = LMDB.Environment.Durability

        /// Loopback by default: expose the server deliberately.
        public var host = "127.0.0.1"
        /// 0 to 65535; 0 picks a free port (see `onRunning`).
        public var port = 8080
        public var dataDirectory: String
        /// Only `.full` keeps the protocol's promise that a push answered
        /// "applied" survives a power loss (`sync-protocol.md` section 7):
        /// under `.metaAsync` a power loss may undo the last commit, and
        /// under `.process` any commit, answered pushes included (and may
        /// corrupt the store). The other two are for tests and benchmarks.
        public var durability = LMDB.Environment.Durability.full
        /// Check every page of the store's `data.mdb` at start
        /// (`Environment.checkPages`): a damaged one refuses the start,
        /// named. It reads the whole file, so it is off unless asked for.
        public var checkPagesAtStart = false
        /// Bearer token -> who it is.
        public var tokens: [String: Identity] = [:]
        /// The token for /v1/admin (nil: no admin endpoints).
        public var adminToken: String?
        /// Requests per second per user, and the burst (nil: no limit).
        public var rateLimit: (rate: Double, burst: Int)?
        public var faultInjection = false
        /// A connection that has sent no part of a request for this long,
        /// while no answer is being made, is closed (nil: never): one idle
        /// between requests, and one that stalls sending a request, such as
        /// a head sent a byte at a time. The default outlasts libcurl's
        /// 118 s limit on reusing an idle connection, so a URLSession
        /// client on Linux never sends a request into a connection as the
        /// server closes it. Positive.
        public var idleTimeout: Duration? = .seconds(300)
        /// The longest a request may take to send its body, from its
        /// head's arrival to its end (nil: no bound). Past it the connection
        /// is closed without an answer, which a client retries as a network
        /// error: a body sent a byte at a time, each within the idle
        /// timeout, would otherwise hold its connection and its buffer for
        /// as long as the client kept sending. The default lets a body of
        /// `Wire.requestBodyBytesMax` arrive at 14 KB/s. Positive.
        public var bodyTimeout: Duration? = .seconds(300)
        /// The most bytes of push bodies the server holds at once, being
        /// received or waiting for the store's one writer (`PushBuffer`).
        /// A push that would go over it, while others hold bytes, is answered
        /// `503 SERVICE_UNAVAILABLE` with `Retry-After: 1`, which clients
        /// retry; a push alone is always taken, whatever its size. The
        /// default holds 16 bodies of `Wire.requestBodyBytesMax`.
        public var pushBufferBytesMax = 16 * Wire.requestBodyBytesMax
        /// The least severe message the server logs.
        public var logLevel = Logger.Level.info
        /// How long after a failed commit (a full disk, a refused sync) the
        /// server reopens its store, and how long it waits between
        /// attempts that fail (nil: never; it answers 503 until restarted).
        /// A failed commit fails LMDB's environment for good, but not the
        /// store: LMDB writes a commit's meta page only after its pages
        /// reached the disk, so the last commit before the failure stands,
        /// and the store reopens as a restart would open it (with the failed
        /// commit too when only its meta page's write failed). Meanwhile
        /// every request is answered `503 SERVICE_UNAVAILABLE`. The
        /// reopening runs in the request that finds it due, page check
        /// (`checkPagesAtStart`) included. Not negative.
        public var reopenInterval: Duration? = .seconds(10)
        /// The gzip level of answers to clients that accept gzip
        /// (`Accept-Encoding`), for bodies of at least 1 KiB: 1 (the
        /// default) is the fastest, 9 the smallest, 0 sends every body as it
        /// is. A pulled page of JSON takes about a tenth of its size or
        /// less (bench section 8). Push bodies in gzip are taken whatever
        /// the level.
        public var gzipLevel = 1
        /// The entity field whose string value is an entity's scope (a
        /// project, a team), fixed for its life, so that a client may pull
        /// the changes of some scopes only (`Format/sync-protocol.md`,
        /// section 7, "Scopes", and section 8, `scopes`); nil: entities have
        /// none, and a pull that names scopes is refused. The server keeps
        /// an index of the feed by scope, made afresh at start when the
        /// field is another than the one it was made for.
        public var scopeField: String?
        /// The most pulls of one user that wait for a change at once
        /// (`wait`, section 8): each holds a connection and a task until a
        /// push or its deadline. A user's pull past it answers at once with
        /// its page, as the protocol allows; the Swift client then asks
        /// again when its wait would have ended. 0 makes every pull answer
        /// at once. Not negative.
        public var waitingPullsPerUserMax = 16

        /// - Throws: `ConfigurationError` for the first setting out of range.
        func check() throws(ConfigurationError) {
            // Out of range, it failed only as the server began to listen,
            // with the store already made.
            guard (0...65535).contains(port) else { throw ConfigurationError("port must be 0 to 65535, not \(port)") }
            if let limit = rateLimit, !(limit.rate > 0 && limit.rate.isFinite && limit.burst > 0) {
                throw ConfigurationError("rateLimit needs a positive, finite rate and a positive burst, not \(limit)")
            }
            guard pushBufferBytesMax > 0 else {
                throw ConfigurationError("pushBufferBytesMax must be positive, not \(pushBufferBytesMax)")
            }
            for (name, timeout) in [("idleTimeout", idleTimeout), ("bodyTimeout", bodyTimeout)] {
                if let timeout, timeout <= .zero { throw ConfigurationError("\(name) must be positive (nil for none), not \(timeout)") }
            }
            if let reopenInterval, reopenInterval < .zero {
                throw ConfigurationError("reopenInterval must not be negative (nil for never), not \(reopenInterval)")
            }
            guard BodyCompression.levels.contains(gzipLevel) else {
                throw ConfigurationError("gzipLevel must be \(BodyCompression.levels), not \(gzipLevel)")
            }
            guard waitingPullsPerUserMax >= 0 else {
                throw ConfigurationError("waitingPullsPerUserMax must not be negative, not \(waitingPullsPerUserMax)")
            }
            if let scopeField, let problem = NameRules.fieldsProblem([scopeField: .null]) {
                throw ConfigurationError("scopeField: \(problem)")
            }
        }

        public init(dataDirectory: String) { self.dataDirectory = dataDirectory }
    }

    /// A `Configuration` setting out of range, or a data directory the
    /// server refuses to serve.
    public struct ConfigurationError: Error, Equatable, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = "sync server configuration: " + description }
    }

    public let configuration: Configuration
    /// The service over the store, a new one after each reopening.
    private let serving: Mutex<Served>
    let limiter: RateLimiter?
    let faults = FaultInjector()
    let pushBuffer: PushBuffer
    /// Pulls waiting for a change (`wait`); they outlive a reopening of
    /// the store, as the pushes that wake them do.
    let feedWaiters: FeedWaiters

    /// Opens (or creates) the server's store, and holds its directory's
    /// lock (`server.lock`) until `close()`.
    /// - Throws: `SyncServer.ConfigurationError` naming a setting out of
    ///   range, or the data directory when another process serves it, it
    ///   holds files or an LMDB environment but no server store, or its
    ///   server ID is damaged; `LMDBError` when the data directory cannot
    ///   be used.
    public init(configuration: Configuration) throws {
        try configuration.check()
        self.configuration = configuration
        let storage = try ServerStorage(
            path: configuration.dataDirectory, durability: configuration.durability, checkPages: configuration.checkPagesAtStart,
            scopeField: configuration.scopeField)
        serving = Mutex(Served(service: SyncService(storage: storage) { Int64(Date().timeIntervalSince1970 * 1_000_000) }))
        limiter = configuration.rateLimit.map { RateLimiter(rate: $0.rate, burst: $0.burst) }
        pushBuffer = PushBuffer(bytesMax: configuration.pushBufferBytesMax)
        feedWaiters = FeedWaiters(perUserMax: configuration.waitingPullsPerUserMax)
    }

    public var serverID: String { service.serverID }

    /// The bytes of push bodies the server holds now (see
    /// `Configuration.pushBufferBytesMax`).
    public var pushBufferBytes: Int { pushBuffer.bytes }

    /// Whether `token` can be a bearer token (section 3): one or more
    /// characters from `!` to `~`. A configured token that is not one could
    /// never be sent, or (`String` equates canonically equivalent text)
    /// would match one that differs from it.
    public static func isToken(_ token: String) -> Bool { isToken(token.utf8) }

    static func isToken(_ bytes: some Collection<UInt8>) -> Bool {
        !bytes.isEmpty && bytes.allSatisfy { (0x21...0x7E).contains($0) }
    }

    /// Every path the protocol defines, with the one method it takes.
    static let endpoints = [
        ("/v1/health", "GET"), ("/v1/push", "POST"), ("/v1/pull", "GET"), ("/v1/admin/resync", "POST"),
        ("/v1/admin/compact", "POST"), ("/v1/admin/faults", "POST"),
    ]
    /// The method each path takes.
    static let methods = Dictionary(uniqueKeysWithValues: endpoints)

    /// The service over the store as it is now (failed, until reopened).
    var service: SyncService { serving.withLock { $0.service } }

    /// Waits for queued writes and closes the store; it is not reopened.
    public func close() {
        serving.withLock { serving in
            serving.closed = true
            return serving.service
        }.storage.close()
    }

    /// What serves requests, and the reopening of a failed store.
    private struct Served: Sendable {
        var service: SyncService
        /// When the failed store is reopened (nil: not failed, or the
        /// failure not yet seen).
        var reopenDue: ContinuousClock.Instant?
        /// A request is reopening the store.
        var reopening = false
        /// A reopening found a store the server refuses to serve: no
        /// other is tried.
        var givenUp = false
        /// `close()` was called.
        var closed = false
    }

    /// Reopens the store once `Configuration.reopenInterval` has passed
    /// since a request found it failed, or since the last attempt, which
    /// failed. Called before and after each request: only one reopens it;
    /// the others, and those in flight, are answered 503 meanwhile, as a
    /// store that fails or is closed makes them. A store the server would
    /// refuse at start (`ConfigurationError`: its directory taken by
    /// another server, its server ID or pages damaged) is not tried again:
    /// that needs the operator. The closing and opening block (they wait
    /// for the writes queued behind the failure, and the page check reads
    /// the whole file), so they run on a thread of dispatch's, not on the
    /// request's task.
    func reopenIfFailed(_ logger: Logger) async {
        guard let interval = configuration.reopenInterval else { return }
        let now = ContinuousClock.now
        // The failed service to reopen, or nil; and whether the failure was
        // seen just now.
        let (failed, seen) = serving.withLock { serving -> (SyncService?, Bool) in
            guard !serving.closed, !serving.reopening, !serving.givenUp, serving.service.storage.environment.problem != nil else {
                return (nil, false)
            }
            guard let due = serving.reopenDue else {
                serving.reopenDue = now + interval
                return (nil, true)
            }
            guard now >= due else { return (nil, false) }
            serving.reopening = true
            return (serving.service, false)
        }
        if seen { logger.error("the store failed; reopening it in \(interval)") }
        guard let failed else { return }
        let configuration = configuration
        // The new service, or nil; and whether the store was refused.
        let (reopened, refused) = await withCheckedContinuation { (continuation: CheckedContinuation<(SyncService?, Bool), Never>) in
            DispatchQueue.global().async {
                // Waits for the writes queued behind the failure: each fails.
                failed.storage.close()
                do {
                    let storage = try ServerStorage(
                        path: configuration.dataDirectory, durability: configuration.durability,
                        checkPages: configuration.checkPagesAtStart, scopeField: configuration.scopeField)
                    logger.notice("reopened the store at \(configuration.dataDirectory)")
                    continuation.resume(returning: (SyncService(storage: storage, clock: failed.clock), false))
                } catch let error as ConfigurationError {
                    logger.error("the store cannot be served again: \(error); not reopening it (restart the server once it is mended)")
                    continuation.resume(returning: (nil, true))
                } catch {
                    logger.error("could not reopen the store: \(error); trying again in \(interval)")
                    continuation.resume(returning: (nil, false))
                }
            }
        }
        let unused = serving.withLock { serving -> SyncService? in
            serving.reopening = false
            guard let reopened else {
                serving.givenUp = refused
                serving.reopenDue = refused ? nil : ContinuousClock.now + interval
                return nil
            }
            // Closed while it reopened: the new store is not served.
            guard !serving.closed else { return reopened }
            serving.service = reopened
            serving.reopenDue = nil
            return nil
        }
        unused?.storage.close()
    }

    /// The 503 for a request the store could not serve: its `Retry-After`
    /// is the time left until the store is reopened (at least 1 s), or 30 s
    /// when it will not be (closed, given up, or `reopenInterval` nil).
    func storageUnavailable(_ problem: LMDBError) -> ServiceError {
        let left = serving.withLock { serving -> Duration? in
            guard !serving.closed, !serving.givenUp, let interval = configuration.reopenInterval else { return nil }
            return serving.reopenDue.map { max($0 - ContinuousClock.now, .zero) } ?? interval
        }
        guard let left else { return ServiceError.storageUnavailable(problem) }
        let seconds = left.components.seconds + (left.components.attoseconds > 0 ? 1 : 0)
        return ServiceError.storageUnavailable(problem, retryAfter: Int(clamping: max(seconds, 1)))
    }

    /// Sets the injected faults (tests; also `POST /v1/admin/faults`).
    public func setFaults(_ settings: FaultSettings) throws { try faults.set(settings) }

    /// The Hummingbird application serving the protocol. Run it with
    /// `runService()` (stops on SIGTERM/SIGINT) or as a service of your own.
    /// - Parameter onRunning: called with the bound port once listening.
    public func application(onRunning: @escaping @Sendable (Int) async -> Void = { _ in }) -> some ApplicationProtocol {
        var logger = Logger(label: "syncserver")
        logger.logLevel = configuration.logLevel
        let router = Router(context: BasicRequestContext.self)
        router.add(middleware: ProtocolMiddleware(server: self))
        let routes = Routes(server: self)
        // Served again after a stop, which closed them: pulls wait again.
        feedWaiters.reopen()
        let bodyTimeout = configuration.bodyTimeout.map { TimeAmount($0) }
        router.get("/v1/health") { request, context in try routes.health(request, context) }
        router.post("/v1/push") { request, context in try await routes.push(request, context) }
        router.get("/v1/pull") { request, context in try await routes.pull(request, context) }
        router.post("/v1/admin/resync") { request, context in try await routes.resync(request, context) }
        router.post("/v1/admin/compact") { request, context in try await routes.compact(request, context) }
        router.post("/v1/admin/faults") { request, context in try await routes.setFaults(request, context) }
        return Application(
            router: router,
            server: .http1MarkingLastRequests(
                configuration: .init(
                    // Made again for each connection (an autoclosure).
                    additionalChannelHandlers: [RequestBodyDeadline(timeout: bodyTimeout), ParserErrorReply()],
                    idleTimeout: configuration.idleTimeout.map { TimeAmount($0) })),
            configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: nil),
            onServerRunning: { channel in await onRunning(channel.localAddress?.port ?? 0) },
            logger: logger)
    }
}

/// Adds the protocol version header to every answer, turns every error into
/// the error envelope, and applies injected faults.
struct ProtocolMiddleware: RouterMiddleware {
    typealias Context = BasicRequestContext
    let server: SyncServer

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws
        -> Response
    {
        var response: Response
        await server.reopenIfFailed(context.logger)
        do {
            let path = request.uri.path
            let exempt = path == "/v1/health" || path.hasPrefix("/v1/admin/")
            if server.configuration.faultInjection, !exempt {
                let delay = server.faults.delay
                if delay > .zero { try await Task.sleep(for: delay) }
                if let failure = server.faults.takeFailure() { throw failure }
            }
            // Exactly: the router would also take `/v1/push/` or `/v1//push`
            // for `/v1/push` (it skips empty path segments).
            // The faults endpoint exists only with fault injection on
            // (section 12): otherwise it is unknown for every method.
            guard let allowed = SyncServer.methods[path], server.configuration.faultInjection || path != "/v1/admin/faults"
            else {
                throw ServiceError(.notFound, "no such endpoint: \(path.prefix(100))")
            }
            // Any other method (HEAD, OPTIONS, TRACE, ...) is 405 with the
            // one it takes; the router would answer 404.
            guard request.method.rawValue == allowed else {
                throw ServiceError(.methodNotAllowed, "\(path) takes \(allowed)", allow: allowed)
            }
            response = try await next(request, context)
        } catch let error as ServiceError {
            response = Reply.error(error)
        } catch let error as HTTPError {
            response = Reply.error(ProtocolMiddleware.translate(error))
        } catch let error as HTTPParserError {
            // Inside the body (a chunk size that is not hex, say).
            // `ParserErrorReply` makes this answer the connection's last.
            response = Reply.error(ServiceError(.validationError, "HTTP/1.1 cannot parse the request body: \(error)"))
        } catch let error as DroppedAnswer {
            throw error
        } catch let error as RequestBodyTimedOut {
            // The connection is closing: no answer can be sent.
            throw error
        } catch let error as LMDBError where [.environmentFailed, .closed].contains(error.code) {
            context.logger.error("storage unavailable: \(error)")
            response = Reply.error(server.storageUnavailable(error))
        } catch {
            context.logger.error("request failed: \(error)")
            response = Reply.error(ServiceError(.internalError, "the server failed to answer; try again"))
        }
        response.headers[Reply.versionField] = String(Wire.protocolVersion)
        // A commit of this request's may have failed the store: its
        // reopening is timed from here.
        await server.reopenIfFailed(context.logger)
        return response
    }

    static func translate(_ error: HTTPError) -> ServiceError {
        switch error.status.code {
        case 404: ServiceError(.notFound, "no such endpoint")
        case 405: ServiceError(.methodNotAllowed, "method not allowed here")
        case 413: ServiceError(.payloadTooLarge, "the body is over \(Wire.requestBodyBytesMax) bytes")
        case 400..<500: ServiceError(.validationError, error.body ?? "bad request")
        default: ServiceError(.internalError, "the server failed to answer; try again")
        }
    }
}

/// Thrown to end a response without a complete answer (fault injection).
struct DroppedAnswer: Error {}

/// Building responses.
enum Reply {
    static let versionField = HTTPField.Name(Wire.versionHeader)!

    static func json(_ value: some Encodable, status: HTTPResponse.Status = .ok) throws -> Response {
        json(body: try Wire.makeEncoder().encode(value), status: status)
    }

    /// A response whose body is already JSON (the messages `JSONWriter` writes).
    static func json(body: Data, status: HTTPResponse.Status = .ok) -> Response {
        Response(
            status: status, headers: [.contentType: "application/json"],
            body: ResponseBody(byteBuffer: ByteBuffer(bytes: body)))
    }

    static func error(_ error: ServiceError) -> Response {
        var response =
            envelope(error).map { json(body: $0, status: HTTPResponse.Status(code: error.code.httpStatus)) }
            ?? Response(status: .internalServerError)
        if let retryAfter = error.retryAfter { response.headers[.retryAfter] = String(retryAfter) }
        if let allow = error.allow { response.headers[.allow] = allow }
        if error.code == .unauthorized { response.headers[.wwwAuthenticate] = "Bearer" }
        // The codings a body may be in (RFC 9110 section 15.5.16).
        if error.code == .unsupportedMediaType {
            response.headers[.acceptEncoding] = BodyCompression.requestCodings.joined(separator: ", ")
        }
        return response
    }

    /// The body of an error answer: the envelope of `sync-protocol.md`
    /// section 5 (nil if it does not encode).
    static func envelope(_ error: ServiceError) -> Data? {
        try? Wire.makeEncoder().encode(ErrorEnvelope(error.code, error.message))
    }
}
