import Foundation
import LogFormat
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting
import Testing

/// A token no server can accept (a line feed left from the file it was read
/// from, an empty one): `HTTPTransport` says what is wrong with it where the
/// server's 401 may not (protocol section 3), and sends no request with it.
@Suite struct HTTPTransportTokenTests {
    @Test func aTokenWithALineFeedIsNamedNotSent() async throws {
        let server = try await TestServer("token-line-feed")
        let a = try Replica("a", server: server, token: "alice-token\n")
        try await a.store.create(type: "task", fields: ["title": "t"])
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("a run with an unusable token ended as \(report.outcome)")
            return
        }
        #expect(message.contains("U+000A at character 12"), "\(message)")
        #expect(message.contains("not sent"), "\(message)")
        // The token itself is a secret: never in a message.
        #expect(!message.contains("alice-token"), "\(message)")
        // As the server's 401 would: the push's intents wait for the app.
        #expect(try a.store.outboxSummary().failedCount == 1)
        await server.stop()
    }

    @Test func anEmptyTokenIsNamedNotSent() async throws {
        let server = try await TestServer("token-empty")
        let a = try Replica("a", server: server, token: "")
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("a run with an empty token ended as \(report.outcome)")
            return
        }
        #expect(message.contains("the token is empty"), "\(message)")
        await server.stop()
    }

    /// Spaces around a token are HTTP's whitespace around a header value,
    /// which the server drops: such a token worked, and still does.
    @Test func spacesAroundATokenStillSync() async throws {
        let server = try await TestServer("token-spaces")
        let a = try Replica("a", server: server, token: " alice-token ")
        try await a.store.create(type: "task", fields: ["title": "t"])
        let report = await a.sync()
        #expect(report.outcome == .completed && report.acknowledged == 1)
        await server.stop()
    }
}

/// A server named by an IPv6 address: FoundationNetworking on Linux fails
/// such a request as a bad URL before it connects (swift-corelibs-foundation
/// issue 5496), and the message said only "NSURLErrorDomain error -1000".
/// Where it fails so, the message says why and what to name the server by;
/// a Foundation that connects finds nobody at the port.
@Test func aServerNamedByAnIPv6AddressIsReachedOrTheFailureSaysWhy() async throws {
    let transport = HTTPTransport(baseURL: URL(string: "http://[::1]:1")!, token: "alice-token")
    do {
        _ = try await transport.health()
        Issue.record("a health check of port 1 was answered")
    } catch {
        // Either way the request was not sent.
        #expect(error.kind == .noAnswer, "\(error)")
        if error.message.contains("-1000") {
            #expect(error.message.contains("issue 5496") && error.message.contains("localhost for ::1"), "\(error.message)")
        }
    }
}

