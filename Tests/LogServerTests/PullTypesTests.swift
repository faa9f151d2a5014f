import Foundation
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

    /// Only changes of the types named come, in feed order; a page that
    /// holds one points past the skipped ones after it, so the next pull
    /// reads from there; has_more says whether a change of those types
    /// follows.
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
        // A page whose last change is followed by skipped ones points past
        // them (here past n0, at offset 7, the feed's end), so that no pull
        // reads them again.
        #expect(Cursor(token: lastPhoto.cursor)?.offset == 7)
        // So does one that stops at its limit, up to the change the next holds.
        #expect(Cursor(token: first.cursor)?.offset == 4 && Cursor(token: photos.cursor)?.offset == 5)
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
}
