import Foundation
import LMDB
import LogFormat
@testable import LogServer
import LogTesting
import Testing

/// Section 7, "Scopes", and section 8, `scopes`: a server whose scope
/// field gives each entity a scope, fixed for its life, and pulls of some
/// scopes only.
@Suite struct PullScopesTests {
    /// The feed, of a server whose scope field is `project`:
    /// 1 a0 (task, A), 2 b0 (task, B), 3 u0 (task, none), 4 a1 (photo, A),
    /// 5 n0 (task, null), 6 a0 updated, 7 b0 deleted, 8 b1 (photo, B).
    private func serverWithScopedFeed(_ name: String) async throws -> TestServer {
        let server = try await TestServer(name, scopeField: "project")
        let pushes: [PushOperation] = [
            operation(.create, "a0", ["project": "A", "n": 1], type: "task"),
            operation(.create, "b0", ["project": "B"], type: "task"),
            operation(.create, "u0", ["n": 1], type: "task"),
            operation(.create, "a1", ["project": "A"], type: "photo"),
            operation(.create, "n0", ["project": .null], type: "task"),
            operation(.update, "a0", ["n": 2], base: 1, type: "task"),
            operation(.delete, "b0", base: 1, type: "task"),
            operation(.create, "b1", ["project": "B"], type: "photo"),
        ]
        for push in pushes {
            let result = try await server.push([push]).decode(PushResponse.self).results[0]
            #expect(result.status == .applied, "\(push.entityID): \(result.errorMessage ?? "")")
        }
        return server
    }

    private func page(
        _ server: TestServer, cursor: String? = nil, limit: Int? = nil, types: String? = nil, scopes: String?
    ) async throws -> PullResponse {
        let reply = try await server.pull(cursor: cursor, limit: limit, types: types, scopes: scopes)
        #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
        return try reply.decode(PullResponse.self)
    }

    /// Every page of a pull, a page of `limit` at a time: the changes as
    /// "id" or "id-" for a deletion, and the has_more of each page.
    private func pullAll(
        _ server: TestServer, limit: Int, types: String? = nil, scopes: String
    ) async throws -> (changes: [String], hasMore: [Bool]) {
        var changes: [String] = []
        var hasMore: [Bool] = []
        var cursor: String?
        for _ in 0..<100 {
            let next = try await page(server, cursor: cursor, limit: limit, types: types, scopes: scopes)
            changes += next.changes.map { $0.entityID + ($0.operation == .delete ? "-" : "") }
            hasMore.append(next.hasMore)
            cursor = next.cursor
            if !next.hasMore { break }
        }
        return (changes, hasMore)
    }

    /// A pull of scopes gets the changes of their entities, and of those in
    /// none, in feed order; a deletion comes to the scope of the life it
    /// ended, without data; has_more says whether such a change follows.
    @Test func aPullOfScopesGetsTheirEntitiesAndThoseInNone() async throws {
        let server = try await serverWithScopedFeed("pull-scopes")
        defer { Task { await server.stop() } }
        let a = try await pullAll(server, limit: 2, scopes: "A")
        #expect(a.changes == ["a0", "u0", "a1", "n0", "a0"] && a.hasMore == [true, true, false])
        let b = try await pullAll(server, limit: 1, scopes: "B")
        #expect(b.changes == ["b0", "u0", "n0", "b0-", "b1"] && b.hasMore == [true, true, true, true, false])
        #expect(try await pullAll(server, limit: 100, scopes: "B,A").changes == ["a0", "b0", "u0", "a1", "n0", "a0", "b0-", "b1"])
        #expect(try await pullAll(server, limit: 3, scopes: "C").changes == ["u0", "n0"])
        let deletion = try #require(try await page(server, scopes: "B").changes.first { $0.operation == .delete })
        #expect(deletion.data == nil)

        // With types: the scopes' changes of those types, read through the
        // index by scope; has_more is exact past skipped changes.
        #expect(try await pullAll(server, limit: 1, types: "photo", scopes: "A").changes == ["a1"])
        let tasks = try await pullAll(server, limit: 2, types: "task", scopes: "B")
        #expect(tasks.changes == ["b0", "u0", "n0", "b0-"] && tasks.hasMore == [true, false])
        let photos = try await page(server, limit: 1, types: "photo", scopes: "A")
        #expect(photos.changes.map(\.entityID) == ["a1"] && !photos.hasMore)

        // A new change of the scope comes after the cursor; one of another does not.
        let end = try await page(server, cursor: try await page(server, scopes: "A").cursor, scopes: "A")
        #expect(end.changes.isEmpty && !end.hasMore)
        _ = try await server.push([operation(.create, "b2", ["project": "B"], type: "task")])
        _ = try await server.push([operation(.create, "a2", ["project": "A"], type: "task")])
        #expect(try await page(server, cursor: end.cursor, scopes: "A").changes.map(\.entityID) == ["a2"])
        // Without scopes, every change, as before.
        #expect(try await server.pullAll().count == 10)
    }

    /// A cursor goes with the scopes and types it was made for: another
    /// set, none, or types added, is 410 CURSOR_INVALID.
    @Test func aCursorServesOnlyTheScopesItWasMadeFor() async throws {
        let server = try await serverWithScopedFeed("pull-scopes-cursor")
        defer { Task { await server.stop() } }
        let scoped = try await page(server, limit: 1, scopes: "A,B")
        #expect(try await page(server, cursor: scoped.cursor, limit: 1, scopes: "B,A,B").changes.map(\.entityID) == ["b0"])
        let typed = try await page(server, limit: 1, types: "task", scopes: nil)
        let both = try await page(server, limit: 1, types: "task", scopes: "A")
        let refused: [(String, String?, String?)] = [
            (scoped.cursor, nil, "A"), (scoped.cursor, nil, nil), (scoped.cursor, "task", "A,B"), (typed.cursor, "task", "A"),
            (both.cursor, "task", nil), (both.cursor, nil, "A"), (both.cursor, "task,photo", "A"),
        ]
        for (cursor, types, scopes) in refused {
            let reply = try await server.pull(cursor: cursor, types: types, scopes: scopes)
            #expect(reply.status == 410 && reply.error?.error.code == .cursorInvalid, "\(types ?? "-") \(scopes ?? "-")")
        }
        #expect(try await server.pull(cursor: both.cursor, types: "task", scopes: "A").status == 200)
    }

    /// An entity's scope is fixed for its life: an update or a create over
    /// it that changes the scope field is rejected, VALIDATION_ERROR, and
    /// nothing of it is applied; one that leaves it is applied. A value
    /// that is no scope is rejected. Deleted, it may come back in another
    /// scope, and each scope's pull shows its side of the move.
    @Test func anEntitysScopeIsFixedForItsLife() async throws {
        let server = try await TestServer("pull-scopes-fixed", scopeField: "project")
        defer { Task { await server.stop() } }
        func result(_ push: PushOperation) async throws -> PushResult {
            try await server.push([push]).decode(PushResponse.self).results[0]
        }
        #expect(try await result(operation(.create, "x", ["project": "A"])).status == .applied)
        for changes: Fields in [["project": "B"], ["project": .null], ["project": 7]] {
            let moved = try await result(operation(.update, "x", changes, base: 1))
            #expect(moved.status == .rejected && moved.errorCode == .validationError, "\(changes)")
        }
        let moved = try await result(operation(.update, "x", ["project": "B"], base: 1))
        #expect(moved.errorMessage?.contains("te/x: project is the server's scope field, fixed for an entity's life: it is \"A\"") == true)
        let replaced = try await result(operation(.create, "x", ["project": "B"], base: 1))
        #expect(replaced.status == .rejected && replaced.errorCode == .validationError)
        #expect(try await result(operation(.update, "x", ["project": "A", "n": 1], base: 1)).status == .applied)
        #expect(try await result(operation(.update, "x", ["n": 2], base: 2)).status == .applied)

        for value: Value in [7, "", "a b", "a,b", .string(String(repeating: "p", count: Wire.scopeBytesMax + 1)), ["A"]] {
            let created = try await result(operation(.create, "bad", ["project": value]))
            #expect(created.status == .rejected && created.errorCode == .validationError, "\(value)")
        }
        let unscoped = try await result(operation(.create, "none", ["n": 1]))
        #expect(unscoped.status == .applied)
        let scoped = try await result(operation(.update, "none", ["project": "A"], base: unscoped.serverVersion ?? 0))
        #expect(scoped.status == .rejected && scoped.errorMessage?.contains("it is unset") == true)

        // Moved: deleted in A, created again in B.
        #expect(try await result(operation(.delete, "x", base: 3)).status == .applied)
        #expect(try await result(operation(.create, "x", ["project": "B"], base: 4)).status == .applied)
        #expect(try await pullAll(server, limit: 10, scopes: "A").changes == ["x", "x", "x", "none", "x-"])
        #expect(try await pullAll(server, limit: 10, scopes: "B").changes == ["none", "x"])
    }

    /// `scopes` that is empty, holds an empty item or a value the rules
    /// refuse, names more than 64 scopes, or is given twice is 400
    /// VALIDATION_ERROR; 64 is taken. A server without a scope field
    /// refuses any.
    @Test func scopesTheProtocolRefusesAreAValidationError() async throws {
        let server = try await TestServer("pull-scopes-invalid", scopeField: "project")
        defer { Task { await server.stop() } }
        let many = (0...Wire.pullScopesCountMax).map { "p\($0)" }
        for scopes in ["", "A,", ",A", "A,,B", "a b", "A/B", "é", many.joined(separator: ",")] {
            let reply = try await server.pull(scopes: scopes)
            #expect(reply.status == 400 && reply.error?.error.code == .validationError, "\(scopes.prefix(40)): \(reply.status)")
        }
        #expect(try await server.pull(scopes: many.dropLast().joined(separator: ",")).status == 200)
        #expect(try await server.pull(scopes: "Project-7.v2_~x").status == 200)
        let twice = try await server.send("GET", "/v1/pull?scopes=A&scopes=A")
        #expect(twice.status == 400 && twice.error?.error.code == .validationError)

        let plain = try await TestServer("pull-scopes-none")
        defer { Task { await plain.stop() } }
        let refused = try await plain.pull(scopes: "A")
        #expect(refused.status == 400 && refused.error?.error.message.contains("no scope field") == true)
        // Without one, the field is an ordinary field.
        let push = try await plain.push([operation(.create, "x", ["project": 7])]).decode(PushResponse.self)
        #expect(push.results[0].status == .applied)
    }

    /// Compaction drops the index rows of the changes it drops: after a
    /// move, a pull of the old scope from the start has nothing of the
    /// entity, and the index holds a row for each change left.
    @Test func compactionDropsTheScopeIndexRowsOfWhatItDrops() async throws {
        let server = try await serverWithScopedFeed("pull-scopes-compact")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "b0", ["project": "A"], base: 2, type: "task")])
        let answer = try await server.compact()
        #expect(answer["removed"] as? Int == 3, "\(answer)")
        #expect(try await pullAll(server, limit: 2, scopes: "A").changes == ["u0", "a1", "n0", "a0", "b0"])
        #expect(try await pullAll(server, limit: 2, scopes: "B").changes == ["u0", "n0", "b1"])
        #expect(try indexCount(server) == server.server.service.storage.read { txn in try txn.count(server.server.service.storage.changes) })
    }

    /// The index by scope is made as the store opens when it was made for
    /// another scope field, or lacks changes; a server without a scope
    /// field empties it. A deletion stored without its scope (by a server
    /// without this field) goes to every scope.
    @Test func aStoreIsIndexedByScopeAsItOpens() async throws {
        let server = try await TestServer("pull-scopes-reindex")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "a0", ["project": "A", "team": "T"])])
        _ = try await server.push([operation(.create, "b0", ["project": "B"])])
        _ = try await server.push([operation(.delete, "b0", base: 1)])
        #expect(try indexCount(server) == 0)

        server.configuration.scopeField = "project"
        try await server.restart()
        #expect(try indexCount(server) == 3)
        #expect(try await pullAll(server, limit: 1, scopes: "A").changes == ["a0", "b0-"])
        _ = try await server.push([operation(.create, "b1", ["project": "B"])])
        _ = try await server.push([operation(.delete, "b1", base: 1)])
        #expect(try await pullAll(server, limit: 5, scopes: "A").changes == ["a0", "b0-"])
        #expect(try await pullAll(server, limit: 5, scopes: "B").changes == ["b0", "b0-", "b1", "b1-"])

        // Another field: every change indexed again under it.
        server.configuration.scopeField = "team"
        try await server.restart()
        #expect(try await pullAll(server, limit: 5, scopes: "T").changes == ["a0", "b0", "b0-", "b1", "b1-"])
        #expect(try await pullAll(server, limit: 5, scopes: "A").changes == ["b0", "b0-", "b1", "b1-"])

        // A change written without the index, by a server without it.
        server.configuration.scopeField = nil
        try await server.restart()
        #expect(try indexCount(server) == 0)
        _ = try await server.push([operation(.create, "c0", ["project": "C"])])
        server.configuration.scopeField = "project"
        try await server.restart()
        #expect(try indexCount(server) == 6)
        #expect(try await pullAll(server, limit: 5, scopes: "C").changes == ["b0-", "c0"])
    }

    /// The rows of the index by scope, as the running server left them.
    private func indexCount(_ server: TestServer) throws -> Int {
        let storage = server.server.service.storage
        return try storage.read { txn in try txn.count(storage.scopeChanges) }
    }
}
