import Foundation
import LogFormat
@testable import LogServer
import LogTesting
import Testing

/// Section 8, "Compaction", and section 12, `POST /v1/admin/compact`.
@Suite struct FeedCompactionTests {
    private func page(_ reply: TestServer.Reply, sourceLocation: SourceLocation = #_sourceLocation) throws -> PullResponse {
        #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))", sourceLocation: sourceLocation)
        return try reply.decode(PullResponse.self)
    }

    /// Pushes t1 at versions 1 to `count` and, after each, a new entity
    /// u0, u1, ...: t1 at the odd offsets, the others at the even ones.
    private func pushTaskVersionsAndOthers(_ count: Int, to server: TestServer) async throws {
        for n in 0..<count {
            #expect(try await server.push([operation(n == 0 ? .create : .update, "t1", ["n": .int(Int64(n))], base: UInt64(n))]).status == 200)
            #expect(try await server.push([operation(.create, "u\(n)", ["n": 1])]).status == 200)
        }
    }

    private func counts(_ answer: [String: Any]) -> [Int] {
        ["removed", "kept", "users"].map { (answer[$0] as? NSNumber)?.intValue ?? -1 }
    }

    /// The feed t1 v1, t1 v2, t2 v1, t2 deleted at v2, t3 v1 (offsets 1 to
    /// 5) compacts to its latest changes, deletions included; a cursor
    /// below the last dropped change is refused (410), one past it goes
    /// on; a later compaction reads the feed from its start again.
    @Test func compactionKeepsTheLatestChangeOfEachEntity() async throws {
        let server = try await TestServer("feed-compaction")
        defer { Task { await server.stop() } }
        for push in [
            operation(.create, "t1", ["n": 1]), operation(.update, "t1", ["n": 2], base: 1), operation(.create, "t2", ["n": 1]),
            operation(.delete, "t2", base: 1), operation(.create, "t3", ["n": 1], type: "note"),
        ] {
            #expect(try await server.push([push]).status == 200)
        }
        let atTwo = try page(try await server.pull(limit: 2)).cursor
        let atFour = try page(try await server.pull(cursor: atTwo, limit: 2)).cursor
        let atEnd = try page(try await server.pull(cursor: atFour)).cursor
        let bobs = try page(try await server.pull(token: "bob-token")).cursor

        #expect(counts(try await server.compact()) == [2, 3, 1])
        let feed = try await server.pullAll()
        #expect(feed.map { "\($0.entityID) v\($0.serverVersion) \($0.operation)" } == ["t1 v2 upsert", "t2 v2 delete", "t3 v1 upsert"])
        // Cursors that would miss t2 v1 (offset 3), or name it: 410.
        for cursor in [atTwo] {
            let reply = try await server.pull(cursor: cursor)
            #expect(reply.status == 410 && reply.error?.error.code == .cursorInvalid, "\(reply.status)")
            #expect(reply.error?.error.message.contains("compaction horizon") == true)
        }
        #expect(try page(try await server.pull(cursor: atFour)).changes.map(\.entityID) == ["t3"])
        #expect(try page(try await server.pull(cursor: atEnd)).changes.isEmpty)
        #expect(try page(try await server.pull(cursor: bobs, token: "bob-token")).changes.isEmpty)
        // The index by type lost the dropped changes too.
        #expect(try page(try await server.pull(types: "te")).changes.map(\.entityID) == ["t1", "t2"])
        let storage = server.server.service.storage
        #expect(try storage.read { txn in try txn.count(storage.typeChanges) == txn.count(storage.changes) })

        // t3 v2 supersedes t3 v1, which the first compaction kept below its horizon.
        #expect(try await server.push([operation(.update, "t3", ["n": 2], base: 1, type: "note")]).status == 200)
        let afterUpdate = try page(try await server.pull(cursor: atEnd)).cursor
        #expect(counts(try await server.compact()) == [1, 3, 1])
        #expect(try await server.pullAll().map { "\($0.entityID) v\($0.serverVersion)" } == ["t1 v2", "t2 v2", "t3 v2"])
        // Below the dropped t3 v1 (offset 5), and at it: 410.
        #expect(try await server.pull(cursor: atFour).error?.error.message.contains("compaction horizon") == true)
        #expect(try await server.pull(cursor: atEnd).error?.error.code == .cursorInvalid)
        #expect(try page(try await server.pull(cursor: afterUpdate)).changes.isEmpty)
    }

    /// Cursors made on the compacted feed carry its compaction count: a
    /// pull from the start, a page at a time, goes through the offsets
    /// below the horizon; a cursor made before the compaction at the same
    /// offset is refused. Cursors of the layouts before the count (48 and
    /// 54 characters) are taken as made before any compaction.
    @Test func cursorsMadeAfterACompactionGoOnBelowItsHorizon() async throws {
        let server = try await TestServer("feed-compaction-after")
        defer { Task { await server.stop() } }
        try await pushTaskVersionsAndOthers(6, to: server)
        // u0 at offset 2: made before the compaction, which drops t1 up to offset 9.
        let before = try page(try await server.pull(limit: 2)).cursor
        #expect(counts(try await server.compact()) == [5, 7, 1])
        #expect(try await server.pull(cursor: before).status == 410)
        var ids: [String] = []
        var cursor: String?
        for _ in 0..<10 {
            let next = try page(try await server.pull(cursor: cursor, limit: 1))
            ids += next.changes.map(\.entityID)
            let made = try #require(Cursor(token: next.cursor))
            #expect(made.compactions == 1 && next.cursor.utf8.count == 55)
            cursor = next.cursor
            if !next.hasMore { break }
        }
        #expect(ids == ["u0", "u1", "u2", "u3", "u4", "t1", "u5"])
        let typed = try page(try await server.pull(limit: 1, types: "te"))
        #expect(typed.cursor.utf8.count == 60 && Cursor(token: typed.cursor)?.compactions == 1)

        // The layouts before the count, and a layout byte that is not its own.
        let made = try #require(Cursor(token: before))
        var old = made
        old.compactions = nil
        #expect(old.token.utf8.count == 48 && Cursor(token: old.token) == old)
        old.filter = 7
        #expect(old.token.utf8.count == 54 && Cursor(token: old.token) == old)
        let forged = Cursor(token: String(made.token.dropLast(2)) + "Ag")
        #expect(forged == nil)
    }

    /// In chunks, each its own transaction, compaction drops the same
    /// changes and ends at the same horizon.
    @Test func aCompactionInChunksDropsWhatOneTransactionWould() async throws {
        let server = try await TestServer("feed-compaction-chunks")
        defer { Task { await server.stop() } }
        try await pushTaskVersionsAndOthers(7, to: server)
        let report = try await server.server.service.compactFeeds(chunkCountMax: 3)
        #expect(report == FeedCompactionReport(removed: 6, kept: 8, users: 1))
        #expect(try await server.pullAll().map(\.entityID) == ["u0", "u1", "u2", "u3", "u4", "u5", "t1", "u6"])
        let storage = server.server.service.storage
        #expect(try storage.read { txn in try storage.horizon(user: 1, txn) } == 11)
    }

    /// A change whose row does not read back is kept: compaction drops
    /// only what it knows a later change replaced, and the damage is
    /// named by the pulls that reach it, as before.
    @Test func aDamagedChangeIsKept() async throws {
        let server = try await TestServer("feed-compaction-damage")
        defer { Task { await server.stop() } }
        for n in 0..<3 {
            #expect(try await server.push([operation(n == 0 ? .create : .update, "t1", ["n": .int(Int64(n))], base: UInt64(n))]).status == 200)
        }
        // t1 v1, at offset 1, cut short.
        try await DamagedServerStorageTests.rewriteFirstChange(of: server) { Array($0.prefix(12)) }
        #expect(counts(try await server.compact()) == [1, 2, 1])
        let reply = try await server.pull()
        #expect(reply.status == 500 && reply.error?.error.message.contains("change 1 is damaged") == true)
    }

    /// Only the admin token may compact.
    @Test func compactionTakesTheAdminToken() async throws {
        let server = try await TestServer("feed-compaction-admin")
        defer { Task { await server.stop() } }
        #expect(try await server.send("POST", "/v1/admin/compact", token: "alice-token").status == 401)
        #expect(try await server.send("POST", "/v1/admin/compact", token: nil).status == 401)
        #expect(try await server.send("GET", "/v1/admin/compact", token: "admin-token").status == 405)
        #expect(counts(try await server.compact()) == [0, 0, 0])
    }
}
