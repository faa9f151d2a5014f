import LogFormat

/// The three endpoints of the sync protocol (`Format/sync-protocol.md`), as
/// the engine uses them. `LogSyncHTTP.HTTPTransport` speaks them over HTTP;
/// tests may implement them directly.
///
/// Every method either returns a response the protocol defines or throws a
/// `TransportError` that says how the failure is classified (section 10,
/// "Which failures are retried"). Implementations never retry on their own:
/// retrying is the engine's decision.
public protocol SyncTransport: Sendable {
    /// `GET /v1/health`: returns only for a 200 with the version header and a
    /// health body whose status is "ok" and protocol version 1.
    /// - Throws: `TransportError` for anything else (a captive portal's page
    ///   is `.network`; an answer in another protocol version,
    ///   `.protocolVersion`, and an error status with its `Retry-After`,
    ///   `.status`, neither of which the engine takes for offline).
    func health() async throws(TransportError) -> HealthResponse

    /// `POST /v1/push` with one result per operation, in order.
    /// - Throws: `TransportError`; `.status(413, ...)` when the body is
    ///   over the protocol's `requestBodyBytesMax` (then it is not sent) or
    ///   the server said it was too large.
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse

    /// `GET /v1/pull` from `cursor` (nil: the beginning of the feed), of
    /// the entity types `types` only (nil: every type; section 8, `types`).
    /// - Throws: `TransportError`; `.status(410, .cursorInvalid)` for a
    ///   cursor the server cannot use (one made for other types, too).
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse
}

/// A transport that can pull the changes of some scopes only
/// (`Format/sync-protocol.md` section 8, `scopes`): what an engine whose
/// configuration names `pulledScopes` pulls with.
public protocol ScopedPulling: Sendable {
    /// `GET /v1/pull` from `cursor`, of the entity types `types` only (nil:
    /// every type), and of the entities in `scopes` or in none.
    /// - Throws: `TransportError`, as `SyncTransport.pull` does.
    func pull(cursor: String?, limit: Int, types: Set<String>?, scopes: Set<String>) async throws(TransportError) -> PullResponse
}

extension SyncTransport {
    /// `GET /v1/pull` of every type.
    public func pull(cursor: String?, limit: Int) async throws(TransportError) -> PullResponse {
        try await pull(cursor: cursor, limit: limit, types: nil)
    }
}

/// A request that did not produce a protocol response.
public struct TransportError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// No answer at all: the connection was refused, reset or closed,
        /// or timed out, before a response's status line and headers
        /// came. Retryable. Not an answer, so it leaves the circuit
        /// breaker's count of consecutive 429s as it is (section 10,
        /// "Circuit breaker").
        case noAnswer
        /// An answer that is no complete, well-formed protocol response: a
        /// response without `Sync-Protocol-Version` (a proxy or captive
        /// portal), a redirect, a body cut short or given up on after its
        /// headers came, or a 2xx body that is not the JSON the protocol
        /// defines. Retryable. An answer other than 429, so it resets the
        /// circuit breaker's count.
        case network
        /// The server answered with an error status. `code` is the error
        /// envelope's code when the body had one.
        case status(Int, WireErrorCode?)
        /// The server speaks another protocol version (the header's value).
        /// Permanent.
        case protocolVersion(String)
        /// A response body longer than the transport reads
        /// (`HTTPTransport.Options.responseBodyBytesMax`). Retryable, as a
        /// network error; the engine asks for fewer changes or pushes fewer
        /// operations first, since a conforming server's answer to a
        /// smaller request fits.
        case responseTooLarge
    }

    public var kind: Kind
    /// For people: what failed and where.
    public var message: String
    /// The `Retry-After` of a 429 or 503, in seconds.
    public var retryAfterSeconds: Int?

    /// The most UTF-8 bytes of a message kept. A message carries text the
    /// server wrote (an error envelope's message, a body it could not
    /// read), which the engine copies into the outbox state of every intent
    /// of a failed push, and into the log for a rejection: a server's
    /// megabytes would be multiplied by the intents, or fail to fit an
    /// entry, so they are kept only in part.
    public static let messageBytesMax = 4_096

    /// - Parameter message: kept up to `messageBytesMax` bytes.
    public init(_ kind: Kind, _ message: String, retryAfterSeconds: Int? = nil) {
        self.kind = kind
        self.message = message.truncated(utf8BytesMax: Self.messageBytesMax)
        self.retryAfterSeconds = retryAfterSeconds
    }

    public var description: String { message }

    /// Network errors, 5xx and 429 are worth retrying; everything else is not.
    public var isRetryable: Bool {
        switch kind {
        case .noAnswer, .network, .responseTooLarge: true
        case .status(let status, _): status >= 500 || status == 429
        case .protocolVersion: false
        }
    }

    /// A 429: counts toward the circuit breaker.
    public var isRateLimited: Bool {
        if case .status(429, _) = kind { return true }
        return false
    }
}

extension String {
    /// This string if it is at most `utf8BytesMax` UTF-8 bytes; otherwise
    /// its longest prefix of whole Unicode scalars that fits with "…" after
    /// it.
    func truncated(utf8BytesMax: Int) -> String {
        guard utf8.count > utf8BytesMax else { return self }
        let ellipsis = "…"
        var kept = String.UnicodeScalarView()
        var bytes = ellipsis.utf8.count
        for scalar in unicodeScalars {
            bytes += UTF8.width(scalar)
            guard bytes <= utf8BytesMax else { break }
            kept.append(scalar)
        }
        return String(kept) + ellipsis
    }
}
