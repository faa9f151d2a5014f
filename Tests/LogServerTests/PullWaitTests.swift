import Foundation
import LogFormat
@testable import LogServer
import LogTesting
import Synchronization
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Section 8, `wait`: a pull with nothing to return waits for a change.
@Suite struct PullWaitTests {
    private func page(_ reply: TestServer.Reply) throws -> PullResponse {
        #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
        return try reply.decode(PullResponse.self)
    }

    /// Pushes t1, pulls it, and starts a pull from there that waits 30 s,
    /// returning once it waits.
    private func pullWaitingAfterAChange(_ server: TestServer) async throws -> Task<TestServer.Reply, any Error> {
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        let first = try page(try await server.pull())
        let waiting = Task { try await server.pull(cursor: first.cursor, wait: 30) }
        try await untilWaiting(server, 1)
        return waiting
    }

    /// Waits until `count` pulls wait on `server`'s feeds.
    private func untilWaiting(_ server: TestServer, _ count: Int) async throws {
        try await waitUntil { server.server.feedWaiters.waitingCount == count }
    }

    /// A pull at the feed's end waits; a push to its user's feed answers it
    /// with the change, as a pull made then would. A push of another user
    /// does not.
    @Test func aWaitingPullIsAnsweredByThePushOfAChange() async throws {
        let server = try await TestServer("pull-wait")
        defer { Task { await server.stop() } }
        let waiting = try await pullWaitingAfterAChange(server)
        #expect(try await server.push([operation(.create, "b1", ["n": 1])], token: "bob-token").status == 200)
        // Bob's push woke no pull of Alice's: hers waits on.
        #expect(server.server.feedWaiters.waitingCount == 1)
        #expect(try await server.push([operation(.create, "t2", ["n": 2])]).status == 200)
        let answered = try page(try await waiting.value)
        #expect(answered.changes.map(\.entityID) == ["t2"] && !answered.hasMore)
        #expect(server.server.feedWaiters.waitingCount == 0)
    }

    /// With nothing pushed, the wait ends at its deadline with the empty
    /// page a pull without `wait` gives: the request's own cursor.
    @Test func aWaitWithNoChangeEndsWithAnEmptyPage() async throws {
        let server = try await TestServer("pull-wait-deadline")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        let first = try page(try await server.pull())
        let empty = try page(try await server.pull(cursor: first.cursor, wait: 1))
        #expect(empty.changes.isEmpty && !empty.hasMore && empty.cursor == first.cursor)
        // A pull with changes to return answers at once, whatever its wait.
        #expect(try page(try await server.pull(wait: 60)).changes.map(\.entityID) == ["t1"])
    }

    /// A pull of some types waits on through pushes of other types.
    @Test func aWaitForSomeTypesWaitsThroughOtherTypes() async throws {
        let server = try await TestServer("pull-wait-types")
        defer { Task { await server.stop() } }
        let start = try page(try await server.pull(types: "task"))
        let waiting = Task { try await server.pull(cursor: start.cursor, types: "task", wait: 30) }
        try await untilWaiting(server, 1)
        #expect(try await server.push([operation(.create, "p1", ["n": 1], type: "photo")]).status == 200)
        // Woken, it found no task, and waits again.
        try await untilWaiting(server, 1)
        #expect(try await server.push([operation(.create, "t1", ["n": 1], type: "task")]).status == 200)
        #expect(try page(try await waiting.value).changes.map(\.entityID) == ["t1"])
    }

    /// A forced resync answers the waiting pulls of every user with
    /// `force_resync`, as a pull made then would.
    @Test func aForcedResyncAnswersTheWaitingPulls() async throws {
        let server = try await TestServer("pull-wait-resync")
        defer { Task { await server.stop() } }
        let waiting = try await pullWaitingAfterAChange(server)
        try await server.forceResync()
        #expect(try page(try await waiting.value).forceResync)
    }

    /// A graceful stop ends the waits under way with their empty pages,
    /// rather than waiting for them or cutting their connections.
    @Test func aStoppingServerAnswersItsWaitingPulls() async throws {
        let server = try await TestServer("pull-wait-stop")
        let start = try page(try await server.pull())
        let waiting = Task { try await server.pull(cursor: start.cursor, wait: 60) }
        try await untilWaiting(server, 1)
        await server.stop()
        let answered = try page(try await waiting.value)
        #expect(answered.changes.isEmpty && answered.cursor == start.cursor)
    }

    /// A server served again after a stop (which answered its waiting
    /// pulls and let none wait) lets pulls wait again.
    @Test func aServerServedAgainLetsPullsWaitAgain() async throws {
        let directory = try TemporaryDirectory("pull-wait-again")
        var configuration = SyncServer.Configuration(dataDirectory: directory.appending("data"))
        configuration.port = 0
        configuration.tokens = ["alice-token": Identity(user: "alice")]
        configuration.logLevel = .critical
        let server = try SyncServer(configuration: configuration)
        defer { server.close() }
        let session = URLSessionConfiguration.ephemeral
        session.connectionProxyDictionary = [:]
        for _ in 0..<2 {
            let serving = try await server.serve()
            var request = URLRequest(url: URL(string: "http://127.0.0.1:\(serving.port)/v1/pull?wait=30")!)
            request.setValue("Bearer alice-token", forHTTPHeaderField: "Authorization")
            let waiting = Task { [request] in try await URLSession(configuration: session).data(for: request) }
            try await waitUntil { server.feedWaiters.waitingCount == 1 }
            await serving.stop()
            let (body, response) = try await waiting.value
            #expect((response as? HTTPURLResponse)?.statusCode == 200)
            #expect(try PullResponse.decode(json: body).changes.isEmpty)
        }
    }

    /// A user has at most `waitingPullsPerUserMax` pulls waiting: the
    /// next answers at once with its empty page, while another user's
    /// pull still waits, and a push answers the ones that wait.
    @Test func aUsersPullsPastTheMostThatWaitAnswerAtOnce() async throws {
        let server = try await TestServer("pull-wait-most")
        defer { Task { await server.stop() } }
        server.configuration.waitingPullsPerUserMax = 2
        try await server.restart()
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        let cursor = try page(try await server.pull()).cursor
        let waiting = (0..<2).map { _ in Task { try await server.pull(cursor: cursor, wait: 30) } }
        try await untilWaiting(server, 2)
        let answered = Mutex(false)
        let third = Task {
            defer { answered.withLock { $0 = true } }
            return try await server.pull(cursor: cursor, wait: 30)
        }
        // Answered, or (wrongly) waiting beside the other two.
        try await waitUntil { answered.withLock { $0 } || server.server.feedWaiters.waitingCount > 2 }
        let early = try page(try await third.value)
        #expect(early.changes.isEmpty && early.cursor == cursor)
        #expect(server.server.feedWaiters.waitingCount == 2)
        let bob = Task { try await server.pull(wait: 30, token: "bob-token") }
        try await untilWaiting(server, 3)
        _ = try await server.push([operation(.create, "t2", ["n": 2])])
        for pull in waiting { #expect(try page(try await pull.value).changes.map(\.entityID) == ["t2"]) }
        _ = try await server.push([operation(.create, "b1", ["n": 1])], token: "bob-token")
        #expect(try page(try await bob.value).changes.map(\.entityID) == ["b1"])

        var configuration = server.configuration
        configuration.waitingPullsPerUserMax = -1
        let error = #expect(throws: SyncServer.ConfigurationError.self) { try SyncServer(configuration: configuration) }
        #expect(error?.description.contains("waitingPullsPerUserMax must not be negative") == true)
    }

    /// `wait` that is not digits only, or over 60 seconds, or given twice,
    /// is 400 VALIDATION_ERROR; 0 and 60 are taken (a change to pull
    /// answers them at once).
    @Test func waitsTheProtocolRefusesAreAValidationError() async throws {
        let server = try await TestServer("pull-wait-invalid")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        for wait in ["", "-1", "+5", "1.5", "ten", "61", "99999999999999999999"] {
            let reply = try await server.send("GET", "/v1/pull", query: ["wait": wait])
            #expect(reply.status == 400 && reply.error?.error.code == .validationError, "\(wait): \(reply.status)")
        }
        for wait in [0, Wire.pullWaitSecondsMax] { #expect(try await server.pull(wait: wait).status == 200) }
        let twice = try await server.send("GET", "/v1/pull?wait=1&wait=1")
        #expect(twice.status == 400 && twice.error?.error.code == .validationError)
    }
}
