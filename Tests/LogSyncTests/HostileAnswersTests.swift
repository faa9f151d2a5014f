import Foundation
import LogFormat
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// The engine against answers that break the protocol's rules of
/// progress and matching: a feed that never ends, push results that answer
/// other operations or make no version. Each ends the run, or the one
/// operation, with an error that says what was wrong; no intent takes an
/// answer that is not its own, and a pull keeps what it applied.
@Suite struct HostileAnswersTests {
    /// Pulls a scripted feed answers before it says `has_more: false`, so
    /// that a client that never notices the lack of progress still ends.
    static let scriptedPagesMax = 200

    /// A server whose feed is `page(cursor)` for each pull, up to
    /// `scriptedPagesMax` pulls (then an empty last page).
    static func feed(counting pulls: Counter, _ page: @escaping @Sendable (_ cursor: String?) -> PullResponse) throws
        -> ScriptedServer
    {
        try ScriptedServer { request in
            let headers = HostileServerTests.protocolHeaders
            guard request.path == "/v1/pull" else {
                return .answer(status: 200, headers: headers, body: HostileServerTests.health)
            }
            let cursor = URLComponents(string: request.target)?.queryItems?.first { $0.name == "cursor" }?.value
            var answer = page(cursor)
            if pulls.next() >= scriptedPagesMax {
                answer = PullResponse(changes: [], cursor: cursor ?? "end", hasMore: false)
            }
            return .answer(status: 200, headers: headers, body: (try? answer.encodeJSON()) ?? Data())
        }
    }

    /// A feed that makes no progress: `has_more` with the cursor it was
    /// given (section 8: a cursor points after the changes returned), or
    /// with a cursor it gave before (a cycle), or an empty page. The run
    /// fails naming it, long before the page bound, and keeps the cursor
    /// and the changes it applied.
    @Test(arguments: ["same cursor", "cursor cycle", "empty page"])
    func aFeedThatMakesNoProgressFailsTheRun(_ shape: String) async throws {
        let pulls = Counter()
        @Sendable func more(_ id: String, cursor: String) -> PullResponse {
            PullResponse(changes: [HostileServerTests.change(id, version: 1)], cursor: cursor, hasMore: true)
        }
        let server = try Self.feed(counting: pulls) { cursor in
            switch (shape, cursor) {
            case (_, nil): more("t1", cursor: "c1")
            case ("same cursor", _): more("t1", cursor: "c1")
            case ("cursor cycle", "c1"?): more("t2", cursor: "c2")
            case ("cursor cycle", _): more("t3", cursor: "c1")
            default: PullResponse(changes: [], cursor: "c1", hasMore: true)
            }
        }
        defer { server.stop() }
        let a = try Replica("no-progress", url: server.url)
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("\(shape): expected the run to fail, got \(report.outcome) after \(pulls.count) pulls")
            return
        }
        #expect(pulls.count < Self.scriptedPagesMax, "\(shape): \(message)")
        let named = shape == "empty page" ? "an empty page with has_more" : "makes no progress"
        #expect(message.hasPrefix("pull: ") && message.contains(named), "\(message)")
        #expect(try a.store.pullCursor() == "c1")
        #expect(try a.store.get(type: "task", id: "t1")?.fields == ["v": 1])
    }

    /// A page whose cursor is not one the protocol allows (section 8: 1 to
    /// `cursorBytesMax` printable ASCII bytes) is not applied: the client
    /// writes the cursor into the entry of every change of the page, so a
    /// long one would multiply the log's growth by the page's changes.
    @Test(arguments: ["over cursorBytesMax", "a space", "empty"])
    func aPageWithACursorOutsideTheProtocolIsNotApplied(_ shape: String) async throws {
        let cursor =
            switch shape {
            case "over cursorBytesMax": String(repeating: "x", count: Wire.cursorBytesMax + 1)
            case "a space": "c 1"
            default: ""
            }
        let server = try Self.feed(counting: Counter()) { _ in
            PullResponse(changes: [HostileServerTests.change("t1", version: 1)], cursor: cursor, hasMore: false)
        }
        defer { server.stop() }
        let a = try Replica("cursor", url: server.url)
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("expected the run to fail, got \(report.outcome)")
            return
        }
        #expect(message.hasPrefix("pull: ") && message.contains("cursor"), "\(message)")
        #expect(message.utf8.count < 300, "\(message)")
        #expect(try a.store.pullCursor() == nil)
        #expect(try a.store.get(type: "task", id: "t1") == nil)
    }

    /// Section 8: an upsert's `data` is the entity's full fields. A page
    /// with an upsert whose `data` is null or absent is a body the protocol
    /// does not define (section 10: retryable, as a network error), and is
    /// not applied: taken for an entity with no fields, it would have the
    /// app see every field of the entity gone until its next change.
    @Test(arguments: ["null", "absent"])
    func anUpsertWithoutDataIsNotApplied(_ shape: String) async throws {
        let first = PullResponse(changes: [HostileServerTests.change("t1", version: 1)], cursor: "c1", hasMore: false)
        let bare = PullChange(
            entityType: "task", entityID: "t1", operation: .upsert, data: nil, serverVersion: 2, updatedAt: "2026-11-25T12:00:00.000000Z")
        var second = String(decoding: try PullResponse(changes: [bare], cursor: "c2", hasMore: false).encodeJSON(), as: UTF8.self)
        if shape == "absent" {
            let withoutData = second.replacingOccurrences(of: #""data":null,"#, with: "")
            #expect(withoutData != second, "\(second)")
            second = withoutData
        }
        let pages = [try first.encodeJSON(), Data(second.utf8)]
        let server = try ScriptedServer { request in
            let headers = HostileServerTests.protocolHeaders
            guard request.path == "/v1/pull" else { return .answer(status: 200, headers: headers, body: HostileServerTests.health) }
            let cursor = URLComponents(string: request.target)?.queryItems?.first { $0.name == "cursor" }?.value
            return .answer(status: 200, headers: headers, body: pages[cursor == nil ? 0 : 1])
        }
        defer { server.stop() }
        let a = try Replica("upsert-without-data", url: server.url)
        #expect(await a.sync().outcome == .completed)
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("\(shape): expected the run to fail, got \(report.outcome)")
            #expect(try a.store.get(type: "task", id: "t1")?.fields == ["v": 1], "\(shape)")
            return
        }
        #expect(message.hasPrefix("pull: ") && message.contains("changes[0] (task t1) is an upsert without data"), "\(message)")
        #expect(try a.store.get(type: "task", id: "t1")?.fields == ["v": 1])
        #expect(try a.store.pullCursor() == "c1")
    }

    /// Section 8: a change's `server_version` is at least 1, and a delete
    /// carries no fields. A page breaking either is a body the protocol
    /// does not define (section 10: retryable, as a network error), refused
    /// as the transport reads it, naming the member, and not applied.
    /// Before, version 0 reached the store, and the run failed as the local
    /// store's error ("store: ... server versions start at 1"); a delete's
    /// fields were dropped and the delete applied.
    @Test(arguments: ["version 0", "delete with fields"])
    func aChangeOutsideTheProtocolFailsThePullNamingIt(_ shape: String) async throws {
        let server = try Self.feed(counting: Counter()) { _ in
            var change = HostileServerTests.change("t1", version: shape == "version 0" ? 0 : 1)
            if shape == "delete with fields" { change.operation = .delete }
            return PullResponse(changes: [change], cursor: "c1", hasMore: false)
        }
        defer { server.stop() }
        let a = try Replica("change-outside-protocol", url: server.url)
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("\(shape): expected the run to fail, got \(report.outcome)")
            return
        }
        let member = shape == "version 0" ? "changes[0].server_version" : "changes[0].data"
        #expect(message.hasPrefix("pull: ") && message.contains(member), "\(shape): \(message)")
        #expect(try a.store.pullCursor() == nil)
        #expect(try a.store.log.lastOffset() == 0)
    }

    /// A feed that asks for a full resync on every pull (section 8,
    /// `force_resync`) is broken: the run resyncs `resyncsPerRunMax` times,
    /// then fails naming it, rather than resyncing for good.
    @Test func aFeedThatAlwaysForcesAResyncFailsTheRun() async throws {
        let pulls = Counter()
        let server = try Self.feed(counting: pulls) { _ in
            PullResponse(changes: [], cursor: "c1", hasMore: false, forceResync: true)
        }
        defer { server.stop() }
        var configuration = SyncConfiguration()
        configuration.resyncsPerRunMax = 2
        let a = try Replica("always-resync", url: server.url, configuration: configuration)
        let report = await a.sync()
        #expect(report.outcome == .failed("pull: the server keeps forcing a resync"))
        #expect(report.resyncs == 2)
        #expect(pulls.count == 3)
        #expect(try a.store.pullCursor() == nil)
    }

    /// A push answered in another protocol version (its
    /// `Sync-Protocol-Version` header, section 2) ends the run and leaves
    /// the intents as they were: no attempt counted, none failed. The
    /// answer is no judgement on them; a client that speaks the server's
    /// version pushes them.
    @Test func aPushAnsweredInAnotherProtocolVersionLeavesTheIntentsAlone() async throws {
        let server = try ScriptedServer { request in
            guard request.path == "/v1/push" else {
                return .answer(status: 200, headers: HostileServerTests.protocolHeaders, body: HostileServerTests.health)
            }
            let envelope = Data(#"{"error": {"code": "VALIDATION_ERROR", "message": "speak version 2"}}"#.utf8)
            return .answer(status: 400, headers: ["Sync-Protocol-Version": "2", "Content-Type": "application/json"], body: envelope)
        }
        defer { server.stop() }
        let a = try Replica("other-version", url: server.url)
        try await a.store.create(type: "task", fields: ["n": 1])
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("expected the run to fail, got \(report.outcome)")
            return
        }
        #expect(message.hasPrefix("push: ") && message.contains("protocol version 2"), "\(message)")
        #expect(report.retried == 0)
        let state = try #require(try a.store.outbox().first?.state)
        #expect(state.attempts == 0)
        #expect(state.status == .pending)
    }

    /// The bound itself is a cursor: one of exactly `cursorBytesMax` bytes,
    /// from `!` to `~`, is applied with its page and stored as it came.
    @Test func aPageWithACursorOfExactlyCursorBytesMaxIsApplied() async throws {
        let cursor = "!" + String(repeating: "x", count: Wire.cursorBytesMax - 2) + "~"
        let server = try Self.feed(counting: Counter()) { _ in
            PullResponse(changes: [HostileServerTests.change("t1", version: 1)], cursor: cursor, hasMore: false)
        }
        defer { server.stop() }
        let a = try Replica("cursor-at-limit", url: server.url)
        let report = await a.sync()
        #expect(report.outcome == .completed, "\(report.outcome)")
        #expect(try a.store.pullCursor() == cursor)
        #expect(try a.store.get(type: "task", id: "t1") != nil)
    }

    /// Section 8: a client sends a cursor back unchanged, percent-encoded
    /// in the query as any value is. A cursor may hold any printable ASCII
    /// character, `&`, `=`, `+`, `#`, `%` and `?` among them, each of which
    /// a query would read as something else if sent as it is. The server
    /// here reads the query as HTML forms do, `+` as a space, as many do.
    @Test func aCursorOfEveryPrintableCharacterGoesBackUnchanged() async throws {
        let cursor = String(decoding: (0x21...0x7E).map { UInt8($0) }, as: UTF8.self)
        let returned = Mutex<[String?]>([])
        let server = try ScriptedServer { request in
            let headers = HostileServerTests.protocolHeaders
            guard request.path == "/v1/pull" else { return .answer(status: 200, headers: headers, body: HostileServerTests.health) }
            let query = request.target.drop { $0 != "?" }.dropFirst()
            let sent = query.split(separator: "&").first { $0.hasPrefix("cursor=") }.map {
                $0.dropFirst("cursor=".count).replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? "undecodable"
            }
            returned.withLock { $0.append(sent) }
            let page =
                sent == nil
                ? PullResponse(changes: [HostileServerTests.change("t1", version: 1)], cursor: cursor, hasMore: true)
                : PullResponse(changes: [HostileServerTests.change("t2", version: 1)], cursor: "end", hasMore: false)
            return .answer(status: 200, headers: headers, body: (try? page.encodeJSON()) ?? Data())
        }
        defer { server.stop() }
        let a = try Replica("cursor-characters", url: server.url)
        let report = await a.sync()
        #expect(report.outcome == .completed, "\(report.outcome)")
        #expect(returned.withLock { $0 } == [nil, cursor])
    }

    /// Text the server writes for people (an error envelope's message, a
    /// rejection's `error_message`) is kept only in part: the engine copies
    /// a request's failure into the outbox state of every intent of the
    /// batch, and a rejection's message into a log entry, so a long one
    /// would multiply into gigabytes, or fail to fit an entry and fail every
    /// run.
    @Test func longTextFromTheServerIsKeptInPart() async throws {
        let long = String(repeating: "é", count: 3_000_000)
        let envelope = try JSONEncoder().encode(ErrorEnvelope(.serviceUnavailable, long))
        let server = try ScriptedServer { request in
            let headers = HostileServerTests.protocolHeaders
            guard request.path == "/v1/push" else {
                return .answer(status: 200, headers: headers, body: HostileServerTests.health)
            }
            return .answer(status: 503, headers: headers, body: envelope)
        }
        defer { server.stop() }
        let a = try Replica("long-failure", url: server.url)
        for n in 0..<3 { try await a.store.create(type: "task", fields: ["n": .int(Int64(n))]) }
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("expected the run to fail, got \(report.outcome)")
            return
        }
        // The engine's own words ("push: ") come before the message kept.
        let kept = TransportError.messageBytesMax + 16
        #expect(message.utf8.count <= kept)
        #expect(try a.store.outbox().allSatisfy { $0.state.lastError.utf8.count <= kept })

        let real = try await TestServer("long-rejection")
        let rejecting = RewritingTransport(real, pushes: { response in
            response.results[0] = .rejected(response.results[0].idempotencyKey, .validationError, long)
        })
        let b = try Replica("long-rejection", server: real, transport: rejecting)
        try await b.store.create(type: "task", fields: ["title": "one"])
        let rejected = await b.sync()
        #expect(rejected.outcome == .completed && rejected.rejected == 1, "\(rejected)")
        guard case .reject(let reject)? = try b.entries(.reject).first?.body else {
            Issue.record("no reject entry")
            return
        }
        #expect(reject.message.utf8.count <= TransportError.messageBytesMax && reject.message.hasPrefix("éé"))
        await real.stop()
    }

    /// Results that do not answer the request's operations one for one
    /// (fewer, more, a key of no operation, one operation answered twice)
    /// are recorded against no intent: the run fails naming the mismatch,
    /// and once the server answers properly each intent gets its own answer.
    @Test(arguments: ["fewer", "more", "unknown key", "answered twice"])
    func resultsThatDoNotMatchTheOperationsAreRecordedAgainstNoIntent(_ shape: String) async throws {
        let server = try await TestServer("results-\(shape.replacingOccurrences(of: " ", with: "-"))")
        let broken = RewritingTransport(server, pushes: { response in
            switch shape {
            case "fewer": response.results.removeLast()
            case "more": response.results.append(response.results[0])
            case "unknown key": response.results[1].idempotencyKey = "0195a3b2-7c4e-7d01-8a2b-3c4d5e6f7a81"
            default: response.results[1] = response.results[0]
            }
        })
        let a = try Replica("results", server: server, transport: broken)
        try await a.store.create(type: "task", fields: ["title": "one"])
        try await a.store.create(type: "task", fields: ["title": "two"])
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("\(shape): expected the run to fail, got \(report.outcome)")
            return
        }
        // Once: the engine names the request, the message does not again.
        #expect(message.hasPrefix("push: ") && !message.hasPrefix("push: push: "), "\(message)")
        #expect(report.acknowledged == 0)
        #expect(try a.entries(.ack).isEmpty)
        #expect(try a.store.outboxCount() == 2)
        try a.connect(to: server)
        try await a.syncUntilQuiet()
        #expect(try a.entries(.ack).count == 2)
        await server.stop()
    }

    /// An `applied` or `duplicate` whose `server_version` is not above the
    /// `base_version` pushed (0 above all: versions start at 1) cannot be
    /// true: every applied operation makes a version past the one it was
    /// made against (section 7). Recorded, it would take the change out of
    /// what the app sees, as if the store already had it. It is retried as
    /// a malformed answer, for that operation alone.
    @Test(arguments: [(UInt64(0), "create"), (UInt64(1), "update"), (UInt64(0), "update")])
    func anAckNotAboveTheBaseVersionIsRetried(version: UInt64, intent: String) async throws {
        let server = try await TestServer("ack-below-base")
        let lying = Atomic<Bool>(false)
        let lowered = RewritingTransport(server, pushes: { response in
            guard lying.load(ordering: .relaxed) else { return }
            // The task's intent is the first of the batch; the note's is
            // answered as the server answered it.
            response.results[0].serverVersion = version
        })
        let a = try Replica("ack-below-base", server: server, transport: lowered)
        let id = try await a.store.create(type: "task", fields: ["title": "one"])
        if intent == "update" {
            try await a.syncUntilQuiet()
            try await a.store.update(type: "task", id: id, changes: ["title": "two"])
        }
        try await a.store.create(type: "note", fields: ["text": "answered properly"])
        lying.store(true, ordering: .relaxed)
        let acksBefore = try a.entries(.ack).count
        let report = await a.sync()
        #expect(report.acknowledged == 1 && report.retried == 1, "\(report)")
        #expect(try a.entries(.ack).count == acksBefore + 1)
        let pending = try a.store.outbox()
        #expect(pending.map(\.intent.entityID) == [id])
        let lastError = pending.first?.state.lastError ?? ""
        #expect(lastError.contains("server_version \(version)"), "\(lastError)")
        lying.store(false, ordering: .relaxed)
        a.clock.advance(by: 600_000)
        try await a.syncUntilQuiet()
        #expect(try a.store.outboxCount() == 0)
        #expect(try a.store.get(type: "task", id: id)?.fields == ["title": intent == "update" ? "two" : "one"])
        await server.stop()
    }

    /// An answer tried again (here, an ack at version 0) holds back the
    /// answers to the later intents of its entity in the same batch: the
    /// store settles answers in the order they come, and an ack of the
    /// later intent recorded first showed the app the earlier intent over
    /// the later one, a state the server never had. They stay pending
    /// behind it, and the next push settles both in log order.
    @Test func aRetriedAnswerHoldsBackTheLaterAnswersOfItsEntity() async throws {
        let server = try await TestServer("retry-holds-entity")
        let lying = Atomic<Bool>(false)
        let lowered = RewritingTransport(server, pushes: { response in
            guard lying.load(ordering: .relaxed) else { return }
            response.results[0].serverVersion = 0
        })
        let a = try Replica("retry-holds-entity", server: server, transport: lowered)
        let id = try await a.store.create(type: "task", fields: ["title": "one"])
        try await a.syncUntilQuiet()
        try await a.store.update(type: "task", id: id, changes: ["title": "two"])
        try await a.store.update(type: "task", id: id, changes: ["title": "three"])
        let updates = try a.store.outbox().map(\.offset)
        try #require(updates.count == 2)
        lying.store(true, ordering: .relaxed)
        let report = await a.sync()
        #expect(report.acknowledged == 0 && report.retried == 1, "\(report)")
        #expect(try a.store.outbox().map(\.offset) == updates, "both wait, in log order")
        #expect(try a.store.get(type: "task", id: id)?.fields == ["title": "three"])
        lying.store(false, ordering: .relaxed)
        a.clock.advance(by: 600_000)
        try await a.syncUntilQuiet()
        #expect(try a.store.outboxCount() == 0)
        #expect(try a.store.get(type: "task", id: id)?.fields == ["title": "three"])
        #expect(try a.store.get(type: "task", id: id)?.serverVersion == 3)
        await server.stop()
    }
}

/// A count shared with a server's threads.
final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    var count: Int { value.load(ordering: .relaxed) }

    /// Counts one more; the count after it.
    func next() -> Int { value.add(1, ordering: .relaxed).newValue }
}
