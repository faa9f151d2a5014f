import Foundation
import LogFormat
import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// `HTTPTransport` sends push bodies in gzip only to a server whose health
/// answer takes them (`request_codings`), and as they are when one refuses
/// (`Format/sync-protocol.md` section 2, "Bodies"). Against a scripted
/// server that keeps every request as it came.
@Suite struct PushCompressionTests {
    static func health(requestCodings: String?) -> Data {
        let codings = requestCodings.map { #", "request_codings": \#($0)"# } ?? ""
        return Data(#"{"status": "ok", "protocol_version": 1, "server_id": "01KAQ3H2M4Z8X0V6T5R7P9N1B3"\#(codings)}"#.utf8)
    }

    /// A server whose health answer is `health`, that answers a push in gzip
    /// with `gzipStatus` (200 or 415) and any other with 200, keeping each
    /// push request in `pushes`.
    static func server(health: Data, gzipStatus: Int = 200, pushes: SentPushes) throws -> ScriptedServer {
        let headers = ["Sync-Protocol-Version": "1", "Content-Type": "application/json"]
        return try ScriptedServer { request in
            guard request.path == "/v1/push" else { return .answer(status: 200, headers: headers, body: health) }
            pushes.add(request)
            if request.headers["content-encoding"] == "gzip", gzipStatus == 415 {
                let envelope = #"{"error": {"code": "UNSUPPORTED_MEDIA_TYPE", "message": "no", "retryable": false}}"#
                return .answer(status: 415, headers: headers.merging(["Accept-Encoding": "identity"]) { $1 }, body: Data(envelope.utf8))
            }
            return .answer(status: 200, headers: headers, body: Data(#"{"results": []}"#.utf8))
        }
    }

    /// A push of `count` creates: 1 makes a body under 1 KiB, 40 one of several.
    static func push(_ count: Int) -> PushRequest {
        PushRequest(
            operations: (0..<count).map {
                PushOperation(
                    idempotencyKey: "key-\($0)", entityType: "task", entityID: "task-\($0)", intent: .create,
                    data: ["title": .string("Task \($0) of a long list"), "done": false], clientTimestamp: "2026-11-28T01:00:00.000000Z",
                    baseVersion: 0)
            })
    }

    static func transport(_ server: ScriptedServer, gzipsPushes: Bool = true) -> HTTPTransport {
        var options = loopback
        options.gzipsPushes = gzipsPushes
        return HTTPTransport(baseURL: server.url, token: "alice-token", options: options)
    }

    @Test func aPushOfAKilobyteOrMoreGoesInGzipToAServerThatTakesIt() async throws {
        let pushes = SentPushes()
        let server = try Self.server(health: Self.health(requestCodings: #"["gzip"]"#), pushes: pushes)
        defer { server.stop() }
        let transport = Self.transport(server)
        // Before a health answer said so, as it is.
        _ = try await transport.push(Self.push(40))
        #expect(try await transport.health().requestCodings == ["gzip"])
        _ = try await transport.push(Self.push(40))
        _ = try await transport.push(Self.push(1))
        let sent = pushes.all
        try #require(sent.count == 3)
        let body = try Self.push(40).encodeJSON()
        #expect(sent[0].headers["content-encoding"] == nil && sent[0].body == body)
        #expect(sent[1].headers["content-encoding"] == "gzip")
        #expect(try GzipTool.decompress(sent[1].body) == body)
        #expect(sent[1].body.count * 4 < body.count, "\(sent[1].body.count) bytes in gzip of \(body.count)")
        #expect(sent[2].headers["content-encoding"] == nil && sent[2].body.count < 1_024)
    }

    /// A server that names no coding, or not gzip, or whose client is told
    /// not to, gets every body as it is.
    @Test(arguments: [(nil, true), (#"[]"#, true), (#"["br"]"#, true), (#"["gzip"]"#, false)])
    func otherwiseABodyGoesAsItIs(requestCodings: String?, gzipsPushes: Bool) async throws {
        let pushes = SentPushes()
        let server = try Self.server(health: Self.health(requestCodings: requestCodings), pushes: pushes)
        defer { server.stop() }
        let transport = Self.transport(server, gzipsPushes: gzipsPushes)
        _ = try await transport.health()
        _ = try await transport.push(Self.push(40))
        let sent = pushes.all
        #expect(sent.count == 1 && sent.first?.headers["content-encoding"] == nil)
        #expect(sent.first?.body == (try Self.push(40).encodeJSON()))
    }

    /// A 415 to a body in gzip (another server answers there now) is
    /// answered by the same push as it is, and later pushes go as they are
    /// until a health answer says gzip again.
    @Test func a415IsAnsweredByTheBodyAsItIs() async throws {
        let pushes = SentPushes()
        let server = try Self.server(health: Self.health(requestCodings: #"["gzip"]"#), gzipStatus: 415, pushes: pushes)
        defer { server.stop() }
        let transport = Self.transport(server)
        _ = try await transport.health()
        _ = try await transport.push(Self.push(40))
        _ = try await transport.push(Self.push(40))
        _ = try await transport.health()
        _ = try await transport.push(Self.push(40))
        let codings = pushes.all.map { $0.headers["content-encoding"] ?? "none" }
        #expect(codings == ["gzip", "none", "none", "gzip", "none"])
    }
}

/// The push requests a scripted server got, in order.
final class SentPushes: Sendable {
    private let requests = Mutex<[ScriptedServer.Request]>([])
    var all: [ScriptedServer.Request] { requests.withLock { $0 } }
    func add(_ request: ScriptedServer.Request) { requests.withLock { $0.append(request) } }
}
