import Foundation
import LogFormat
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// The client against a server that breaks the protocol in ways the
/// reference server cannot be made to: bodies without end, compressed
/// bodies that inflate without end, answers that never come. Each must end
/// the request or the run with an error that says what went wrong, and lose
/// nothing.
@Suite struct HostileServerTests {
    /// Longer than any scripted body below: the client must stop reading
    /// long before it, at `responseBodyBytesMax`, and a client that does not
    /// stops here rather than taking all memory.
    static let bodyBytesSentMax = 48 * 1024 * 1024

    /// A pull page, valid JSON, followed by `padding` spaces (valid JSON
    /// too): a client without a limit reads it whole and takes it.
    static func paddedPage(padding: Int) -> Data {
        Data(#"{"changes": [], "cursor": "c1", "has_more": false, "force_resync": false}"#.utf8)
            + Data(repeating: UInt8(ascii: " "), count: padding)
    }

    static let protocolHeaders = ["Sync-Protocol-Version": "1", "Content-Type": "application/json"]
    static let health = Data(#"{"status": "ok", "protocol_version": 1, "server_id": "01KAQ3H2M4Z8X0V6T5R7P9N1B3"}"#.utf8)

    static func change(_ id: String, version: UInt64) -> PullChange {
        PullChange(
            entityType: "task", entityID: id, operation: .upsert, data: ["v": .int(Int64(version))], serverVersion: version,
            updatedAt: "2026-11-25T12:00:00.000000Z")
    }

    /// `count` bytes of `data` over and over, in chunks, then nil.
    static func chunks(of data: Data, upTo count: Int) -> @Sendable () -> Data? {
        let sent = Atomic<Int>(0)
        return {
            let offset = sent.load(ordering: .relaxed)
            guard offset < count else { return nil }
            let start = offset % data.count
            let chunk = data[start..<min(data.count, start + count - offset)]
            sent.store(offset + chunk.count, ordering: .relaxed)
            return Data(chunk)
        }
    }

    /// A server that answers health and nothing else, calling `asked` as
    /// each other request arrives.
    static func silentServer(asked: @escaping @Sendable () -> Void = {}) throws -> ScriptedServer {
        try ScriptedServer { request in
            guard request.path == "/v1/health" else {
                asked()
                return .silence
            }
            return .answer(status: 200, headers: Self.protocolHeaders, body: Self.health)
        }
    }

    /// A client of `server` whose requests wait `requestTimeout` seconds for data.
    static func replica(_ name: String, of server: ScriptedServer, requestTimeout: TimeInterval) throws -> Replica {
        var options = loopback
        options.requestTimeout = requestTimeout
        return try Replica(name, url: server.url, transport: HTTPTransport(baseURL: server.url, token: "alice-token", options: options))
    }

    func pullFailure(_ server: ScriptedServer, options: HTTPTransport.Options = loopback) async -> TransportError? {
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: options)
        do {
            let page = try await transport.pull(cursor: nil, limit: 100)
            Issue.record("expected the pull to fail, got a page with cursor \(page.cursor)")
            return nil
        } catch { return error }
    }

    /// A body whose declared length is over the limit is refused as soon
    /// as its header arrives. Here it declares 2 GiB.
    @Test func aBodyDeclaredOverTheLimitIsRefused() async throws {
        let body = Self.paddedPage(padding: 1024 * 1024)
        let server = try ScriptedServer { _ in
            .stream(headers: Self.protocolHeaders, contentLength: 2 << 30, chunks: Self.chunks(of: body, upTo: Self.bodyBytesSentMax))
        }
        defer { server.stop() }
        let error = try #require(await pullFailure(server))
        #expect(error.kind == .responseTooLarge && error.isRetryable)
        // Refused on its declared length, before a byte of it is counted.
        #expect(error.message.contains("a body of \(2 << 30) bytes over responseBodyBytesMax"), "\(error)")
    }

    /// A negative `responseBodyBytesMax` reads no body, as 0 does: the
    /// answer fails naming the setting and its value, where the
    /// transport's init stopped the app with a precondition.
    @Test func aNegativeBodyLimitReadsNoBody() async throws {
        let server = try ScriptedServer { _ in .answer(status: 200, headers: Self.protocolHeaders, body: Self.paddedPage(padding: 0)) }
        defer { server.stop() }
        var options = loopback
        options.responseBodyBytesMax = -1
        let error = try #require(await pullFailure(server, options: options))
        #expect(error.kind == .responseTooLarge, "\(error)")
        #expect(error.message.contains("responseBodyBytesMax (-1)"), "\(error)")
    }

    /// A body of no declared length (it ends with the connection) is
    /// counted as it arrives.
    @Test func aBodyWithoutALengthIsCountedAsItArrives() async throws {
        let body = Self.paddedPage(padding: Self.bodyBytesSentMax)
        let server = try ScriptedServer { _ in
            .stream(headers: Self.protocolHeaders, contentLength: nil, chunks: Self.chunks(of: body, upTo: body.count))
        }
        defer { server.stop() }
        let error = try #require(await pullFailure(server))
        #expect(error.kind == .responseTooLarge && error.isRetryable)
        #expect(error.message.contains("responseBodyBytesMax"), "\(error)")
    }

    /// A body within the limit is read whole, however it arrives.
    @Test func aBodyWithinTheLimitIsRead() async throws {
        let body = Self.paddedPage(padding: 8 * 1024 * 1024)
        let server = try ScriptedServer { _ in
            .stream(headers: Self.protocolHeaders, contentLength: nil, chunks: Self.chunks(of: body, upTo: body.count))
        }
        defer { server.stop() }
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        #expect(try await transport.pull(cursor: nil, limit: 100).cursor == "c1")
    }

    /// A gzip body is counted after decompression: a few hundred kilobytes
    /// that inflate to gigabytes (here 48 MiB of spaces after a page, from
    /// about 300 KB) fail the request at the limit.
    @Test func aCompressedBodyIsCountedAfterDecompression() async throws {
        let bomb = GzipBomb(prefix: Data(#"{"changes": [], "cursor": "c1", "has_more": false, "force_resync": false}"#.utf8))
        let sent = Atomic<Int>(0)
        let server = try ScriptedServer { _ in
            var headers = Self.protocolHeaders
            headers["Content-Encoding"] = "gzip"
            return .stream(headers: headers, contentLength: nil) {
                guard sent.add(1, ordering: .relaxed).oldValue < 2 + Self.bodyBytesSentMax / GzipBomb.inflatedBytesPerChunk else {
                    return nil
                }
                return bomb.next()
            }
        }
        defer { server.stop() }
        let error = try #require(await pullFailure(server))
        #expect(error.kind == .responseTooLarge && error.isRetryable)
        #expect(error.message.contains("responseBodyBytesMax"), "\(error)")
    }

    /// A pull page too long to read is asked for again with half the
    /// changes, until one fits: the protocol bounds no page, only what one
    /// change holds. Here pages of more than 10 changes are too long.
    @Test func aPageTooLongToReadIsPulledInSmallerPages() async throws {
        let asked = Mutex<[Int]>([])
        let server = try ScriptedServer { request in
            guard request.path == "/v1/pull" else {
                return .answer(status: 200, headers: Self.protocolHeaders, body: Self.health)
            }
            let limit = URLComponents(string: request.target)?.queryItems?.first { $0.name == "limit" }?.value.flatMap { Int($0) } ?? 0
            asked.withLock { $0.append(limit) }
            guard limit <= 10 else { return .answer(status: 200, headers: Self.protocolHeaders, body: Self.paddedPage(padding: 100_000)) }
            let page = PullResponse(changes: [Self.change("t1", version: 1)], cursor: "c1", hasMore: false)
            return .answer(status: 200, headers: Self.protocolHeaders, body: try! page.encodeJSON())
        }
        defer { server.stop() }
        var options = loopback
        options.responseBodyBytesMax = 64 * 1024
        var configuration = SyncConfiguration()
        configuration.pullPageCountMax = 100
        let a = try Replica(
            "long-page", url: server.url, configuration: configuration,
            transport: HTTPTransport(baseURL: server.url, token: "alice-token", options: options))
        let report = await a.sync()
        #expect(report.outcome == .completed && report.pages == 1, "\(report)")
        #expect(asked.withLock { $0 } == [100, 50, 25, 12, 6])
        #expect(try a.store.get(type: "task", id: "t1")?.fields == ["v": 1])
    }

    /// A push answer too long to read is asked for again in smaller
    /// requests, as a 413 is; the operations it may have applied are
    /// answered duplicate.
    @Test func aPushAnswerTooLongToReadIsPushedInSmallerRequests() async throws {
        let server = try await TestServer("long-push-answer")
        let inner = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        let a = try Replica("long-push-answer", server: server, transport: LongAnswers(inner: inner))
        for n in 0..<3 { try await a.store.create(type: "task", fields: ["n": .int(Int64(n))]) }
        let report = await a.sync()
        #expect(report.outcome == .completed && report.acknowledged == 3, "\(report)")
        #expect(try a.store.outboxCount() == 0)
        await server.stop()
    }

    /// A push answer too long to read for one operation alone is retried,
    /// not marked failed (section 10: only a 413 for one operation is
    /// permanent): the server applied it, may send a shorter answer next
    /// time (the `duplicate` answer carries no fields), and the run that
    /// comes at its retry time acknowledges it.
    @Test func aPushAnswerTooLongToReadForOneOperationIsRetried() async throws {
        let server = try await TestServer("long-push-answer-alone")
        let tooLong = Atomic<Bool>(true)
        let inner = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        let a = try Replica("long-push-answer-alone", server: server, transport: AnswersTooLong(inner: inner) { tooLong.load(ordering: .relaxed) })
        try await a.store.create(type: "task", fields: ["n": 1])
        let failed = await a.sync()
        guard case .failed = failed.outcome else {
            Issue.record("the run should fail: \(failed)")
            return
        }
        let state = try #require(try a.store.outbox().first?.state)
        #expect(state.status == .pending && state.attempts == 1, "\(state)")
        tooLong.store(false, ordering: .relaxed)
        a.clock.advance(by: try #require(try await a.engine.health().nextAttemptAt) - a.clock.nowMilliseconds)
        let retried = await a.sync()
        #expect(retried.outcome == .completed && retried.acknowledged == 1, "\(retried)")
        await server.stop()
    }

    /// A server that takes the request and never answers: the request
    /// fails after `requestTimeout` as a network error, and the run ends in
    /// error with the intents kept for a retry, rather than waiting forever.
    @Test func aServerThatNeverAnswersFailsTheRun() async throws {
        let server = try Self.silentServer()
        defer { server.stop() }
        let a = try Self.replica("silent", of: server, requestTimeout: 1)
        try await a.store.create(type: "task", fields: ["title": "kept"])
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("expected the run to fail, got \(report.outcome)")
            return
        }
        #expect(message.hasPrefix("push: ") && message.contains("timed out") && message.contains("requestTimeout"), "\(message)")
        let pending = try a.store.outbox()
        #expect(pending.count == 1 && pending.first?.state.attempts == 1, "\(pending)")
    }

    /// A server that stops sending in the middle of its body fails the
    /// request after `requestTimeout` as a network error (an answer cut
    /// short), long before `resourceTimeout`, with a message that says it
    /// timed out. FoundationNetworking describes its timeout only as
    /// "NSURLErrorDomain error -1001".
    @Test func aServerThatStopsInTheMiddleOfItsBodyTimesOut() async throws {
        let server = try ScriptedServer { _ in
            let sent = Atomic<Int>(0)
            return .stream(headers: Self.protocolHeaders, contentLength: nil) {
                guard sent.add(1, ordering: .relaxed).oldValue == 0 else {
                    // Until the client closes the connection, or the bound
                    // of this test if it never does.
                    Thread.sleep(forTimeInterval: 60)
                    return nil
                }
                return Data(#"{"changes": [], "#.utf8)
            }
        }
        defer { server.stop() }
        var options = loopback
        options.requestTimeout = 1
        options.resourceTimeout = 600
        let error = try #require(await pullFailure(server, options: options))
        #expect(error.kind == .network, "\(error)")
        #expect(error.message.contains("timed out") && error.message.contains("requestTimeout"), "\(error)")
    }

    /// A sync cancelled while its request waits on a slow server ends at
    /// once as cancelled, abandoning the request: the intents stay pending
    /// with no attempt counted, pushed again in a later run (answered
    /// duplicate if the server applied them). Cancelled by `cancel()`, by
    /// the caller's task, or by its deadline (`runBackground`'s budget).
    /// Before, the run waited for `requestTimeout` (here 30 s, the default;
    /// `resourceTimeout`, 120 s, for a server that trickles) and then failed,
    /// counting an attempt.
    @Test(arguments: ["push", "pull", "caller's task", "deadline"])
    func aCancelledSyncAbandonsItsRequest(_ shape: String) async throws {
        let cancellation = Mutex<(@Sendable () -> Void)?>(nil)
        let server = try Self.silentServer { cancellation.withLock { $0 }?() }
        defer { server.stop() }
        let a = try Self.replica("cancelled", of: server, requestTimeout: 30)
        if shape != "pull" { try await a.store.create(type: "task", fields: ["title": "kept"]) }
        let report: SyncReport
        switch shape {
        case "caller's task":
            let run = Mutex<Task<SyncReport, Never>?>(nil)
            cancellation.withLock { $0 = { run.withLock { $0 }?.cancel() } }
            let task = Task { await a.engine.sync() }
            run.withLock { $0 = task }
            report = await task.value
        case "deadline":
            let clock = a.clock
            cancellation.withLock { $0 = { clock.advance(by: 2_000) } }
            report = await a.engine.sync(cancellation: SyncCancellation(deadlineMilliseconds: clock.monotonicMilliseconds + 1_000, clock: clock))
        default:
            let stop = SyncCancellation()
            cancellation.withLock { $0 = stop.cancel }
            report = await a.engine.sync(cancellation: stop)
        }
        #expect(report.outcome == .cancelled, "\(shape): \(report)")
        let pending = try a.store.outbox()
        #expect(pending.allSatisfy { $0.state.attempts == 0 && $0.state.lastError.isEmpty }, "\(shape): \(pending)")
    }

    /// A server that answers a byte at a time, never pausing for
    /// `requestTimeout`, is cut off after `resourceTimeout`. Its status
    /// line and headers came: it is an answer cut short, a network error
    /// (which resets the circuit breaker's count of 429s, section 10), not
    /// no answer. The transfer ends with it: the client closes the
    /// connection, rather than reading on and dropping what comes.
    @Test func aServerThatTricklesItsAnswerIsCutOff() async throws {
        let server = try ScriptedServer { _ in
            let sent = Atomic<Int>(0)
            return .stream(headers: Self.protocolHeaders, contentLength: nil) {
                // A client that does not cut it off gets a whole page after
                // 10 minutes, long past its 10 s even when a loaded machine
                // runs the client's timer late (after 30 s, the page came first).
                switch sent.add(1, ordering: .relaxed).oldValue {
                case 0: return Self.paddedPage(padding: 0)
                case 6_000...: return nil
                default:
                    Thread.sleep(forTimeInterval: 0.1)
                    return Data(" ".utf8)
                }
            }
        }
        defer { server.stop() }
        // A byte every 0.1 s is far inside requestTimeout. Both bounds leave
        // a loaded machine seconds to bring the status line: one that came
        // after either would be no answer (`.noAnswer`), not this.
        var options = loopback
        options.requestTimeout = 5
        options.resourceTimeout = 10
        let error = try #require(await pullFailure(server, options: options))
        #expect(error.isRetryable, "\(error)")
        #expect(error.kind == .network && error.message.contains("resourceTimeout"), "\(error)")
        try await waitUntil { server.streamsCutShort == 1 }
    }

    /// A `resourceTimeout` of `.infinity` (or any a year or more away) sets
    /// no deadline of the transport's own, rather than one it cannot hold.
    @Test func anInfiniteResourceTimeoutIsNone() async throws {
        let server = try ScriptedServer { _ in .answer(status: 200, headers: Self.protocolHeaders, body: Self.paddedPage(padding: 0)) }
        defer { server.stop() }
        var options = loopback
        options.resourceTimeout = .infinity
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: options)
        #expect(try await transport.pull(cursor: nil, limit: 100).cursor == "c1")
    }

    /// A `requestTimeout` that Foundation on Linux cannot hold as an
    /// `Int` of milliseconds (infinite, NaN, 10^16 s or more) waits a
    /// year, as a `resourceTimeout` past a year is none, rather than trap
    /// in `URLSession` as the request starts (`Int(_:)` of the seconds).
    @Test(arguments: [Double.infinity, .nan, 1e16])
    func aRequestTimeoutNoIntHoldsIsAYear(seconds: Double) async throws {
        let server = try ScriptedServer { _ in .answer(status: 200, headers: Self.protocolHeaders, body: Self.paddedPage(padding: 0)) }
        defer { server.stop() }
        var options = loopback
        options.requestTimeout = seconds
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: options)
        #expect(try await transport.pull(cursor: nil, limit: 100).cursor == "c1")
    }

    /// Cookies a server sets are neither kept nor sent back: the protocol
    /// has none, and a session keeps every cookie of a new name for as long
    /// as it lives and sends them all with each request, so a server that
    /// sets one per answer grows the client's memory and its requests
    /// without end, until a server or proxy refuses them (431, a permanent
    /// failure that marks a push's intents failed). Before, the second
    /// request carried the first answer's cookie.
    @Test func cookiesAreNotKept() async throws {
        let sent = Mutex<[String]>([])
        let server = try ScriptedServer { request in
            let count = sent.withLock { sent in
                sent.append(request.headers["cookie"] ?? "")
                return sent.count
            }
            var headers = Self.protocolHeaders
            headers["Set-Cookie"] = "c\(count)=\(String(repeating: "v", count: 100)); Path=/"
            return .answer(status: 200, headers: headers, body: Self.paddedPage(padding: 0))
        }
        defer { server.stop() }
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        for _ in 0..<3 { _ = try await transport.pull(cursor: nil, limit: 100) }
        #expect(sent.withLock { $0 } == ["", "", ""])
    }

    /// A redirect is not followed: the protocol has none, and
    /// FoundationNetworking would send the request, bearer token included,
    /// to wherever it points, another host or plain HTTP. It fails the
    /// request as a network error (a proxy or portal answered).
    @Test(arguments: [301, 302, 307])
    func aRedirectIsNotFollowed(status: Int) async throws {
        let elsewhere = Mutex<[String]>([])
        let other = try ScriptedServer { request in
            elsewhere.withLock { $0.append(request.headers["authorization"] ?? "no token") }
            return .answer(status: 200, headers: Self.protocolHeaders, body: Self.health)
        }
        defer { other.stop() }
        let server = try ScriptedServer { _ in
            var headers = Self.protocolHeaders
            headers["Location"] = other.url.appendingPathComponent("v1/pull").absoluteString
            return .answer(status: status, headers: headers, body: Data())
        }
        defer { server.stop() }
        let error = try #require(await pullFailure(server))
        #expect(error.kind == .network, "\(error)")
        #expect(error.message.contains("\(status)"), "\(error)")
        #expect(elsewhere.withLock { $0 }.isEmpty)
    }

    /// An answer without `Sync-Protocol-Version` is not the sync server's
    /// (a captive portal's login page, a proxy's error): a network error
    /// saying so, not a page of another protocol version or one that
    /// breaks this one.
    @Test func anAnswerWithoutTheVersionHeaderIsNotTheServers() async throws {
        let server = try ScriptedServer { _ in
            .answer(status: 200, headers: ["Content-Type": "text/html"], body: Data("<html>Sign in to the Wi-Fi</html>".utf8))
        }
        defer { server.stop() }
        let error = try #require(await pullFailure(server))
        #expect(error.kind == .network, "\(error)")
        #expect(error.message.contains("HTTP 200 without Sync-Protocol-Version (a proxy or captive portal answered)"), "\(error)")
    }

    /// An error answer's envelope code reaches the engine with its status,
    /// which decides by it (a 400 VALIDATION_ERROR rejects the batch).
    @Test func anErrorAnswersCodeComesWithItsStatus() async throws {
        let body = Data(#"{"error": {"code": "VALIDATION_ERROR", "message": "no", "retryable": false}}"#.utf8)
        let server = try ScriptedServer { _ in .answer(status: 400, headers: Self.protocolHeaders, body: body) }
        defer { server.stop() }
        let error = try #require(await pullFailure(server))
        #expect(error.kind == .status(400, .validationError), "\(error)")
    }

    /// A body of exactly `responseBodyBytesMax` bytes is read, and one a
    /// byte longer is not, whether the body declares its length or ends
    /// with the connection: the limit is the longest body read.
    @Test(arguments: [true, false])
    func aBodyOfExactlyTheLimitIsRead(declared: Bool) async throws {
        let body = Self.paddedPage(padding: 1_000)
        let server = try ScriptedServer { _ in
            .stream(headers: Self.protocolHeaders, contentLength: declared ? body.count : nil, chunks: Self.chunks(of: body, upTo: body.count))
        }
        defer { server.stop() }
        var options = loopback
        options.responseBodyBytesMax = body.count
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: options)
        #expect(try await transport.pull(cursor: nil, limit: 100).cursor == "c1", "declared: \(declared)")
        options.responseBodyBytesMax = body.count - 1
        let error = try #require(await pullFailure(server, options: options))
        #expect(error.kind == .responseTooLarge, "declared: \(declared), \(error)")
    }

    /// A server that takes the request and sends nothing until
    /// `resourceTimeout` ends the exchange gave no answer, as one that
    /// makes `requestTimeout` end it: it is no answer, which leaves the
    /// circuit breaker's count of 429s alone (`Format/sync-protocol.md`
    /// section 10, "Circuit breaker"), not an answer cut short.
    @Test func aDeadlinePassedBeforeAnyAnswerIsNoAnswer() async throws {
        let server = try Self.silentServer()
        defer { server.stop() }
        var options = loopback
        options.requestTimeout = 600
        options.resourceTimeout = 1
        let error = try #require(await pullFailure(server, options: options))
        #expect(error.kind == .noAnswer, "\(error)")
        #expect(error.message.contains("resourceTimeout"), "\(error)")
    }

    /// A request made from a task already cancelled is cancelled as soon
    /// as it is sent, rather than waiting on the server for
    /// `requestTimeout` (here 60 s): the cancellation came
    /// before the request had a task of `URLSession`'s to cancel.
    @Test func aRequestFromACancelledTaskIsAbandoned() async throws {
        let server = try Self.silentServer()
        defer { server.stop() }
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        let pull = Task { () -> TransportError? in
            withUnsafeCurrentTask { $0?.cancel() }
            do throws(TransportError) {
                _ = try await transport.pull(cursor: nil, limit: 100)
                return nil
            } catch { return error }
        }
        let error = try #require(await pull.value)
        #expect(error.kind == .noAnswer && !error.message.contains("timed out"), "\(error)")
    }

    /// A request whose task is cancelled while the server holds it is
    /// cancelled then, its connection closed, rather than left waiting on
    /// the server for `requestTimeout` (here 60 s): the caller that stopped
    /// waiting must not leave the exchange running behind it.
    @Test func aRequestCancelledInFlightIsAbandoned() async throws {
        let (asked, ask) = AsyncStream.makeStream(of: Void.self)
        let server = try Self.silentServer { ask.yield() }
        defer { server.stop() }
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        let pull = Task { () -> TransportError? in
            do throws(TransportError) {
                _ = try await transport.pull(cursor: nil, limit: 100)
                return nil
            } catch { return error }
        }
        for await _ in asked { break }
        pull.cancel()
        let error = try #require(await pull.value)
        #expect(error.kind == .noAnswer && !error.message.contains("timed out"), "\(error)")
    }

    /// A health answer whose body names another protocol version than its
    /// header is not a healthy sync server's: the transport fails it as a
    /// network error rather than report a server no run can sync with.
    @Test func aHealthAnswerOfAnotherVersionInItsBodyIsRefused() async throws {
        let body = Data(#"{"status": "ok", "protocol_version": 2, "server_id": "01KAQ3H2M4Z8X0V6T5R7P9N1B3"}"#.utf8)
        let server = try ScriptedServer { _ in .answer(status: 200, headers: Self.protocolHeaders, body: body) }
        defer { server.stop() }
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        do throws(TransportError) {
            let health = try await transport.health()
            Issue.record("expected the health check to fail, got \(health)")
        } catch {
            #expect(error.kind == .network && error.message.contains("not a healthy sync server's"), "\(error)")
        }
    }
}

/// A gzip stream that inflates to `prefix` and then spaces without end:
/// one fixed-Huffman deflate block (RFC 1951, section 3.2.6) of literals,
/// then copies of 258 bytes at distance 1, 13 bits each, so about 160
/// inflated bytes per byte sent. The block never ends; the stream has no
/// trailer, as a client that stops at its limit never needs one.
final class GzipBomb: @unchecked Sendable {
    /// Copies per chunk after the first: 8 copies take 13 bytes, so a
    /// multiple of 8 keeps every chunk on a byte boundary.
    static let copiesPerChunk = 8 * 4096
    static let inflatedBytesPerChunk = copiesPerChunk * 258
    private var first: Data?
    private let repeated: Data

    init(prefix: Data) {
        var bits = BitWriter()
        bits.bytes = [0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 3]  // gzip header: deflate, no flags, Unix
        bits.write(0, count: 1)  // BFINAL: not the last block
        bits.write(1, count: 2)  // BTYPE: fixed Huffman codes
        for byte in prefix + [UInt8(ascii: " ")] { bits.writeCode(0x30 + UInt32(byte), count: 8) }
        // 3 + 8n header and literal bits, plus 13 per copy, must end on a
        // byte boundary before the repeated chunks: 13c = -(3 + 8n) mod 8.
        var copies = 0
        while (3 + 8 * (prefix.count + 1) + 13 * copies) % 8 != 0 { copies += 1 }
        for _ in 0..<copies { bits.writeCopy() }
        first = Data(bits.bytes)
        var chunk = BitWriter()
        for _ in 0..<Self.copiesPerChunk { chunk.writeCopy() }
        repeated = Data(chunk.bytes)
    }

    func next() -> Data {
        defer { first = nil }
        return first ?? repeated
    }

    private struct BitWriter {
        var bytes: [UInt8] = []
        var used = 8

        /// `count` bits of `value`, least significant first (header fields).
        mutating func write(_ value: UInt32, count: Int) {
            for bit in 0..<count { append((value >> bit) & 1) }
        }

        /// A Huffman code, most significant bit first.
        mutating func writeCode(_ code: UInt32, count: Int) {
            for bit in (0..<count).reversed() { append((code >> bit) & 1) }
        }

        /// Length 258 (code 285: 11000101, no extra bits), distance 1
        /// (code 0: 00000).
        mutating func writeCopy() {
            writeCode(0b1100_0101, count: 8)
            writeCode(0, count: 5)
        }

        private mutating func append(_ bit: UInt32) {
            if used == 8 {
                bytes.append(0)
                used = 0
            }
            bytes[bytes.count - 1] |= UInt8(bit) << used
            used += 1
        }
    }
}

/// The real server's push, whose every answer the transport finds too
/// long to read (after the server applied it) while `tooLong()` says so.
struct AnswersTooLong: SyncTransport {
    let inner: HTTPTransport
    let tooLong: @Sendable () -> Bool

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        let response = try await inner.push(request)
        if tooLong() { throw TransportError(.responseTooLarge, "push: too long to read") }
        return response
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        try await inner.pull(cursor: cursor, limit: limit, types: types)
    }
}

/// The real server's push, whose answer to more than one operation the
/// transport finds too long to read (after the server applied it).
struct LongAnswers: SyncTransport {
    let inner: HTTPTransport

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        let response = try await inner.push(request)
        guard request.operations.count == 1 else { throw TransportError(.responseTooLarge, "push: too long to read") }
        return response
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        try await inner.pull(cursor: cursor, limit: limit, types: types)
    }
}
