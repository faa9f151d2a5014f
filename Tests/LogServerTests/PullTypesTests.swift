import Foundation
import LMDB
import LogFormat
@testable import LogServer
import LogTesting
import Testing

/// Section 8, `types`: a pull of some entity types only.
@Suite struct PullTypesTests {
    /// The feed: t0 (task), p0 p1 p2 (photo), t1 (task), p3 (photo), n0 (note).
    private func serverWithMixedFeed(_ name: String) async throws -> TestServer {
        let server = try await TestServer(name)
        let pushes: [(String, String)] = [
            ("task", "t0"), ("photo", "p0"), ("photo", "p1"), ("photo", "p2"), ("task", "t1"), ("photo", "p3"), ("note", "n0"),
        ]
        for (type, id) in pushes {
            #expect(try await server.push([operation(.create, id, ["n": 1], type: type)]).status == 200)
        }
        return server
    }

    private func page(_ server: TestServer, cursor: String? = nil, limit: Int? = nil, types: String?) async throws -> PullResponse {
        let reply = try await server.pull(cursor: cursor, limit: limit, types: types)
        #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
        return try reply.decode(PullResponse.self)
    }

    /// Only changes of the types named come, in feed order, each page's
    /// cursor pointing at its last change; has_more says whether a change
    /// of those types follows.
    @Test func aPullOfSomeTypesSkipsTheOthers() async throws {
        let server = try await serverWithMixedFeed("pull-types")
        defer { Task { await server.stop() } }
        let first = try await page(server, limit: 1, types: "task,note")
        #expect(first.changes.map(\.entityID) == ["t0"] && first.hasMore)
        let second = try await page(server, cursor: first.cursor, limit: 1, types: "task,note")
        #expect(second.changes.map(\.entityID) == ["t1"] && second.hasMore)
        let third = try await page(server, cursor: second.cursor, limit: 5, types: "note,task")
        #expect(third.changes.map(\.entityID) == ["n0"] && !third.hasMore)
        // Past the feed's end: an empty last page that keeps its cursor.
        let after = try await page(server, cursor: third.cursor, types: "task,note")
        #expect(after.changes.isEmpty && !after.hasMore && after.cursor == third.cursor)

        let photos = try await page(server, limit: 3, types: "photo")
        #expect(photos.changes.map(\.entityID) == ["p0", "p1", "p2"] && photos.hasMore)
        let lastPhoto = try await page(server, cursor: photos.cursor, types: "photo")
        #expect(lastPhoto.changes.map(\.entityID) == ["p3"] && !lastPhoto.hasMore)
        // The offsets in the user's feed: t0 1, p0 2, p1 3, p2 4, t1 5, p3 6, n0 7.
        #expect(Cursor(token: first.cursor)?.offset == 1 && Cursor(token: photos.cursor)?.offset == 4)
        #expect(Cursor(token: lastPhoto.cursor)?.offset == 6)
        let tail = try await page(server, cursor: lastPhoto.cursor, types: "photo")
        #expect(tail.changes.isEmpty && !tail.hasMore && tail.cursor == lastPhoto.cursor)
        _ = try await server.push([operation(.create, "p4", ["n": 1], type: "photo")])
        let next = try await page(server, cursor: lastPhoto.cursor, types: "photo")
        #expect(next.changes.map(\.entityID) == ["p4"])

        // No change of those types at all: an empty page from the start.
        let none = try await page(server, types: "invoice")
        #expect(none.changes.isEmpty && !none.hasMore)
        let still = try await page(server, cursor: none.cursor, types: "invoice")
        #expect(still.changes.isEmpty && still.cursor == none.cursor)
        // Without types, every change, as before.
        #expect(try await server.pullAll().map(\.entityID) == ["t0", "p0", "p1", "p2", "t1", "p3", "n0", "p4"])
    }

    /// A cursor goes with the types it was made for (the changes of other
    /// types before it were skipped): another set, none, or types for a
    /// cursor made without, is 410 CURSOR_INVALID. Order and repeats do
    /// not make another set.
    @Test func aCursorServesOnlyTheTypesItWasMadeFor() async throws {
        let server = try await serverWithMixedFeed("pull-types-cursor")
        defer { Task { await server.stop() } }
        let typed = try await page(server, limit: 1, types: "task,note")
        #expect(try await page(server, cursor: typed.cursor, limit: 1, types: "note,task,note").changes.map(\.entityID) == ["t1"])
        let plain = try await server.pull(limit: 1).decode(PullResponse.self)
        for (cursor, types) in [(typed.cursor, "task"), (typed.cursor, nil), (typed.cursor, "task,note,photo"), (plain.cursor, "task")] {
            let reply = try await server.pull(cursor: cursor, types: types)
            #expect(reply.status == 410 && reply.error?.error.code == .cursorInvalid, "\(types ?? "none"): \(reply.status)")
        }
        let empty = try await page(server, types: "invoice")
        #expect(try await server.pull(cursor: empty.cursor).status == 410)
    }

    /// `types` that is empty, holds an empty item or a name the rules
    /// refuse, names more than 64 types, or is given twice is 400
    /// VALIDATION_ERROR; 64 is taken.
    @Test func typesTheProtocolRefusesAreAValidationError() async throws {
        let server = try await TestServer("pull-types-invalid")
        defer { Task { await server.stop() } }
        let many = (0...Wire.pullTypesCountMax).map { "t\($0)" }
        for types in ["", "task,", ",task", "task,,note", "Task", "9lives", "ta sk", many.joined(separator: ",")] {
            let reply = try await server.pull(types: types)
            #expect(reply.status == 400 && reply.error?.error.code == .validationError, "\(types.prefix(40)): \(reply.status)")
        }
        #expect(try await server.pull(types: many.dropLast().joined(separator: ",")).status == 200)
        let twice = try await server.send("GET", "/v1/pull?types=task&types=task")
        #expect(twice.status == 400 && twice.error?.error.code == .validationError)
    }

    /// A pull of some types reads their changes alone, through the feed's
    /// index by type: a damaged change of another type is not in its way,
    /// while a pull of the damaged change's type names it.
    @Test func aPullOfSomeTypesReadsNoChangeOfTheOthers() async throws {
        let server = try await serverWithMixedFeed("pull-types-index")
        defer { Task { await server.stop() } }
        // p1, at offset 3, cut short.
        try await DamagedServerStorageTests.rewriteRow(of: server, in: "changes", key: changeKey(3)) { Array($0.prefix(12)) }
        #expect(try await page(server, types: "task,note").changes.map(\.entityID) == ["t0", "t1", "n0"])
        let first = try await page(server, limit: 1, types: "photo")
        #expect(first.changes.map(\.entityID) == ["p0"])
        let damaged = try await server.pull(cursor: first.cursor, types: "photo")
        #expect(damaged.status == 500 && damaged.error?.error.message.contains("change 3 is damaged") == true)
        #expect(try await server.pull().status == 500)
    }

    /// A store whose index by type lacks changes (one made before the
    /// index, or one a server that did not keep it wrote to since) is
    /// indexed again as it opens, and pulls of some types give what they
    /// gave before. A change that does not decode then is listed for every
    /// such pull, which names it.
    @Test func aStoreIsIndexedByTypeAsItOpens() async throws {
        let server = try await serverWithMixedFeed("pull-types-reindex")
        defer { Task { await server.stop() } }
        let sets = ["task", "photo", "note,task", "invoice"]
        func pulls() async throws -> [[String]] {
            var pulled: [[String]] = []
            for types in sets {
                var ids: [String] = []
                var cursor: String?
                while true {
                    let next = try await page(server, cursor: cursor, limit: 2, types: types)
                    ids += next.changes.map(\.entityID)
                    cursor = next.cursor
                    if !next.hasMore { break }
                }
                pulled.append(ids)
            }
            return pulled
        }
        let expected = [["t0", "t1"], ["p0", "p1", "p2", "p3"], ["t0", "t1", "n0"], []]
        #expect(try await pulls() == expected)
        // A store from before the index: none at all.
        try await changeIndex(of: server) { txn, index in try txn.removeAll(index) }
        #expect(try await pulls() == expected)
        #expect(try indexCount(server) == 7)
        // One change written without it.
        try await changeIndex(of: server) { txn, index in
            let deleted = try txn.delete(index, key: ServerStorage.indexKey(1, "photo", 4))
            #expect(deleted)
        }
        #expect(try await pulls() == expected)
        #expect(try indexCount(server) == 7)

        // p1, at offset 3, cut short before the index is made again.
        try await DamagedServerStorageTests.rewriteRow(of: server, in: "changes", key: changeKey(3)) { Array($0.prefix(12)) }
        try await changeIndex(of: server) { txn, index in try txn.removeAll(index) }
        #expect(try indexCount(server) == 7)
        let one = try await page(server, limit: 1, types: "task")
        #expect(one.changes.map(\.entityID) == ["t0"] && one.hasMore)
        for (cursor, types) in [(one.cursor, "task"), (nil, "note")] {
            let damaged = try await server.pull(cursor: cursor, types: types)
            #expect(damaged.status == 500 && damaged.error?.error.message.contains("change 3 is damaged") == true, "\(types)")
        }
    }

    /// Alice's (user 1) change at `offset`: its key in `changes`.
    private func changeKey(_ offset: UInt64) -> [UInt8] { ServerStorage.changeKey(1, offset) }

    /// Stops `server`, changes its index by type with `change`, and starts it again.
    private func changeIndex(
        of server: TestServer, _ change: (borrowing Transaction, Database) throws -> Void
    ) async throws {
        await server.stop()
        do {
            let environment = try Environment(path: server.configuration.dataDirectory)
            defer { environment.close() }
            let index = try #require(try environment.openDatabase("type-changes", create: false))
            try environment.write { txn in try change(txn, index) }
        }
        try await server.restart()
    }

    /// The rows of the index by type, as the running server left them.
    private func indexCount(_ server: TestServer) throws -> Int {
        let storage = server.server.service.storage
        return try storage.read { txn in try txn.count(storage.typeChanges) }
    }
}
