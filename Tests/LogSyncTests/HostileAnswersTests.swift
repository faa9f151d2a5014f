import Foundation
import LogFormat
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// The engine against answers that break the protocol's rules of
/// progress and matching: a feed that never ends. Each ends the run with an
/// error that says what was wrong, and a pull keeps what it applied.
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
}

/// A count shared with a server's threads.
final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    var count: Int { value.load(ordering: .relaxed) }

    /// Counts one more; the count after it.
    func next() -> Int { value.add(1, ordering: .relaxed).newValue }
}
