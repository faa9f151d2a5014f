import Foundation
import LMDB
import LogFormat
import LogStore
import LogTesting
import Testing

/// Opens a store in a new temporary directory; the directory lives as long
/// as the returned value.
struct StoreFixture {
    let directory: TemporaryDirectory
    var store: Store

    init(_ name: String, durability: Durability = .process) throws {
        directory = try TemporaryDirectory(name)
        store = try Store(path: directory.path, options: .init(durability: durability))
    }

    /// Closes and opens the store again, as after an app restart.
    mutating func reopen() throws {
        store.close()
        store = try Store(path: directory.path, options: .init(durability: .process))
    }
}

extension Store {
    /// What `verifyProjections` finds, replaying into a scratch directory
    /// of its own (removed when this returns).
    func projectionProblems() async throws -> [StoreProblem] {
        let scratch = try TemporaryDirectory("verify-scratch")
        return try await verifyProjections(scratchDirectory: scratch.path)
    }
}

/// Puts `value` under `key` in the database `name` of the closed LMDB
/// environment at `path`, with LMDB alone: damage on disk, or a database
/// no store has. `create` makes the database when it is missing.
func putRaw(_ path: String, database name: String, key: [UInt8], value: [UInt8], create: Bool = false) throws {
    let environment = try Environment(path: path)
    defer { environment.close() }
    let database = try #require(try environment.openDatabase(name, create: create))
    try environment.write { txn in try txn.put(database, key: key, value: value) }
}

@Suite struct StoreTests {
    @Test func createReadUpdateDelete() async throws {
        var fixture = try StoreFixture("store-crud")
        let store = fixture.store
        let id = try await store.create(type: "te", fields: ["description": "Spec", "minutes": 30])
        #expect(id.hasPrefix("te_"))
        #expect(try store.get(type: "te", id: id)?.fields == ["description": "Spec", "minutes": 30])
        try await store.update(type: "te", id: id, changes: ["minutes": 45, "billable": true])
        let entity = try #require(try store.get(type: "te", id: id))
        #expect(entity.fields == ["description": "Spec", "minutes": 45, "billable": true])
        #expect(entity.pendingIntentCount == 2)
        #expect(entity.serverVersion == 0)
        #expect(try store.count(type: "te") == 1)
        try await store.delete(type: "te", id: id)
        #expect(try store.get(type: "te", id: id) == nil)
        #expect(try store.count(type: "te") == 0)
        #expect(try store.outboxCount() == 3)
        try fixture.reopen()
        #expect(try fixture.store.get(type: "te", id: id) == nil)
        #expect(try fixture.store.outbox().map(\.intent.operation) == [.create, .update, .delete])
    }

    @Test func argumentsAreChecked() async throws {
        let fixture = try StoreFixture("store-arguments")
        let store = fixture.store
        for type in ["", "Te", "1te", "te/x", String(repeating: "a", count: 65)] {
            await #expect(throws: LogStoreError.self, "type \(type)") { try await store.create(type: type, fields: [:]) }
        }
        await #expect(throws: LogStoreError.self) { try await store.create(type: "te", id: "", fields: [:]) }
        await #expect(throws: LogStoreError.self) { try await store.create(type: "te", fields: ["$bytes": 1]) }
        await #expect(throws: LogStoreError.self) { try await store.create(type: "te", fields: ["x": .double(.nan)]) }
        // Two spellings of one name: a push could not carry them.
        let equivalent = await #expect(throws: LogStoreError.self) {
            try await store.create(type: "te", fields: ["\u{E9}": 1, "e\u{301}": 2])
        }
        #expect(equivalent?.code == .invalidArgument && String(describing: equivalent).contains("Unicode normalization"))
        let missing = await #expect(throws: LogStoreError.self) { try await store.update(type: "te", id: "te_x", changes: ["a": 1]) }
        #expect(missing?.code == .notFound)
        let id = try await store.create(type: "te", fields: [:])
        let duplicate = await #expect(throws: LogStoreError.self) { try await store.create(type: "te", id: id, fields: [:]) }
        #expect(duplicate?.code == .alreadyExists)
        #expect(try store.log.lastOffset() == 1)
    }

    /// Reads check their names as writes do. A type with a zero byte made
    /// the key of another entity (`a` + `00` + `b` + `00` + `c` is type `a`,
    /// id `b\0c`), which `get` and `all` returned under the type asked for;
    /// an empty type or key reached LMDB, which refused it with a bare
    /// `MDB_BAD_VALSIZE`.
    @Test func readsCheckTheirNamesAsWritesDo() async throws {
        let fixture = try StoreFixture("store-read-arguments")
        let store = fixture.store
        try await store.create(type: "a", id: "b\u{0}c", fields: ["n": 1])
        let calls: [(String, () throws -> Void)] = [
            ("get a\\0b", { _ = try store.get(type: "a\u{0}b", id: "c") }),
            ("all a\\0b", { _ = try store.all(type: "a\u{0}b") }),
            ("count a\\0b", { _ = try store.count(type: "a\u{0}b") }),
            ("count of no type", { _ = try store.count(type: "") }),
            ("intentOffset of no key", { _ = try store.intentOffset(idempotencyKey: "") }),
        ]
        for (name, call) in calls {
            #expect(throws: LogStoreError.self, "\(name)") { try call() }
            do { try call() } catch { #expect((error as? LogStoreError)?.code == .invalidArgument, "\(name): \(error)") }
        }
        #expect(try store.get(type: "a", id: "b\u{0}c")?.fields == ["n": 1])
    }

    /// Paging through ids that are prefixes of one another and hold zero
    /// bytes, one at a time, visits every id once, in byte order.
    @Test func pagingOverIDsThatArePrefixesAndHoldZeroBytes() async throws {
        let fixture = try StoreFixture("review-paging-prefixes")
        let store = fixture.store
        let ids = ["a", "a\u{0}", "a\u{0}\u{0}", "a\u{0}b", "a\u{1}", "ab", "b", "\u{0}", "\u{0}a"]
        var batch = WriteBatch()
        for (n, id) in ids.enumerated() { try batch.create(type: "t", id: id, fields: ["n": .int(Int64(n))]) }
        try batch.create(type: "t.x", id: "a", fields: [:])
        try batch.create(type: "s", id: "zz", fields: [:])
        try await store.write(batch)
        try await store.delete(type: "t", id: "a\u{0}")
        let expected = ids.filter { $0 != "a\u{0}" }.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
        var seen: [String] = []
        var after: String?
        while let next = try store.all(type: "t", after: after, limit: 1).first {
            seen.append(next.id)
            after = next.id
            if seen.count > 20 { break }
        }
        #expect(seen.map { Array($0.utf8) } == expected.map { Array($0.utf8) })
        #expect(try store.count(type: "t") == expected.count)
    }


    /// A closed store throws from every call; none traps.
    @Test func aClosedStoreThrowsFromEveryCall() async throws {
        let fixture = try StoreFixture("review-closed")
        let store = fixture.store
        let id = try await store.create(type: "te", fields: ["n": 1])
        store.close()
        #expect(throws: (any Error).self) { try store.get(type: "te", id: id) }
        #expect(throws: (any Error).self) { try store.all(type: "te") }
        #expect(throws: (any Error).self) { try store.count(type: "te") }
        #expect(throws: (any Error).self) { try store.entityTypes() }
        #expect(throws: (any Error).self) { try store.outbox() }
        #expect(throws: (any Error).self) { try store.outboxCount() }
        #expect(throws: (any Error).self) { try store.outboxSummary() }
        #expect(throws: (any Error).self) { try store.pushBatch(limit: 10, now: 0) }
        #expect(throws: (any Error).self) { try store.pullCursor() }
        #expect(throws: (any Error).self) { try store.intentOffset(idempotencyKey: "k") }
        #expect(throws: (any Error).self) { try store.conflicts() }
        #expect(throws: (any Error).self) { try store.log.entry(at: 1) }
        await #expect(throws: (any Error).self) { try await store.create(type: "te", fields: [:]) }
        await #expect(throws: (any Error).self) { try await store.update(type: "te", id: id, changes: [:]) }
        await #expect(throws: (any Error).self) { try await store.delete(type: "te", id: id) }
        await #expect(throws: (any Error).self) { try await store.retryFailed() }
        await #expect(throws: (any Error).self) { try await store.resync(reason: "r") }
        await #expect(throws: (any Error).self) { try await store.rebuildProjections() }
        await #expect(throws: (any Error).self) {
            try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "y", serverVersion: 1)], cursor: "c")
        }
        await #expect(throws: (any Error).self) { try await store.scheduleRetry(offsets: [1], error: "e", at: 1, attemptsMax: 3) }
        await #expect(throws: (any Error).self) { try await store.record([(1, .acknowledged(.applied, serverVersion: 1))]) }
        await #expect(throws: (any Error).self) { try await store.log.append(.resync(reason: "x")) }
        #expect(throws: (any Error).self) { try store.log.appendBlocking(.resync(reason: "x")) }
        var scanner = store.log.entries()
        #expect(throws: (any Error).self) { try scanner.next() }
    }


    @Test func allPagesInIDOrderWithinItsType() async throws {
        let fixture = try StoreFixture("store-all")
        let store = fixture.store
        var batch = WriteBatch()
        for n in 0..<25 { try batch.create(type: "te", id: String(format: "id-%02d", n), fields: ["n": .int(Int64(n))]) }
        try batch.create(type: "tf", id: "id-00", fields: [:])
        try batch.create(type: "t", id: "zzz", fields: [:])
        try await store.write(batch)
        let first = try store.all(type: "te", limit: 10)
        #expect(first.map(\.id) == (0..<10).map { String(format: "id-%02d", $0) })
        let second = try store.all(type: "te", after: first.last?.id, limit: 100)
        #expect(second.map(\.id) == (10..<25).map { String(format: "id-%02d", $0) })
        #expect(try store.all(type: "te", limit: 0).isEmpty)
        #expect(try store.all(type: "t").map(\.id) == ["zzz"])
        // A negative limit is refused with an error, as every bad argument
        // is, rather than stopping the app.
        func refused(_ call: () throws -> Any) -> Bool {
            do {
                _ = try call()
                return false
            } catch {
                return (error as? LogStoreError)?.code == .invalidArgument && "\(error)".contains("is negative")
            }
        }
        #expect(refused { try store.all(type: "te", limit: -1) })
        #expect(refused { try store.outbox(limit: -1) })
        #expect(refused { try store.pushBatch(limit: -5, now: 0) })
        #expect(try store.count(type: "te") == 25)
    }

    /// limits.md, `Store.pageCountMax`: one call of `all` returns at most
    /// 10,000 entities; a larger `limit` is lowered to it, and the next
    /// page goes on after the last one returned.
    @Test func aLimitOverPageCountMaxIsLoweredToIt() async throws {
        let fixture = try StoreFixture("store-page-max")
        let store = fixture.store
        var batch = WriteBatch()
        for n in 0...Store.pageCountMax { try batch.create(type: "te", id: String(format: "id-%05d", n), fields: [:]) }
        try await store.write(batch)
        #expect(Store.pageCountMax == 10_000)
        #expect(try store.all(type: "te", limit: Store.pageCountMax).count == Store.pageCountMax)
        let page = try store.all(type: "te", limit: Int.max)
        #expect(page.count == Store.pageCountMax)
        #expect(try store.all(type: "te", after: page.last?.id, limit: Int.max).map(\.id) == [String(format: "id-%05d", Store.pageCountMax)])
    }

    /// Ids are any UTF-8: short ones (stored inside the string) and long
    /// ones, with characters of two to four bytes, are found by `get`,
    /// ordered by their bytes in `all`, and come back the same from a replay.
    @Test func idsOfAnyUTF8AreFoundAndOrderedByTheirBytes() async throws {
        var fixture = try StoreFixture("store-utf8-ids")
        let ids = ["é", "z", "漢字-🙂", "ascii-id-longer-than-fifteen-bytes", "é-" + String(repeating: "漢", count: 20) + "-🙂"]
        for (n, id) in ids.enumerated() { _ = try await fixture.store.create(type: "te", id: id, fields: ["n": .int(Int64(n))]) }
        try await fixture.store.update(type: "te", id: ids[4], changes: ["m": true])
        for (n, id) in ids.enumerated() {
            #expect(try fixture.store.get(type: "te", id: id)?.fields["n"] == .int(Int64(n)), "\(id)")
        }
        #expect(try fixture.store.get(type: "te", id: "漢字") == nil)
        let byBytes = ids.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
        #expect(try fixture.store.all(type: "te").map(\.id) == byBytes)
        let tables = try fixture.store.derivedTables()
        try await fixture.store.rebuildProjections()
        #expect(try fixture.store.derivedTables() == tables)
        try fixture.reopen()
        #expect(try fixture.store.get(type: "te", id: ids[4])?.fields == ["n": 4, "m": true])
    }

    /// The commit that puts rebuilt tables in use is a change to every type
    /// visible in the old tables or the new ones (a rebuild may repair what
    /// the app saw); a type with nothing visible in either hears nothing.
    @Test func aRebuildIsAChangeToTheTypesItShows() async throws {
        let fixture = try StoreFixture("store-rebuild-changes")
        let store = fixture.store
        try await store.create(type: "te", fields: ["n": 1])
        try await store.create(type: "tf", fields: [:])
        let gone = try await store.create(type: "tg", fields: [:])
        try await store.delete(type: "tg", id: gone)
        var te = store.changes(type: "te").makeAsyncIterator()
        var tf = store.changes(type: "tf").makeAsyncIterator()
        var tg = store.changes(type: "tg").makeAsyncIterator()
        let rebuiltAt = try store.log.lastOffset()
        try await store.rebuildProjections(entriesPerTransaction: 1)
        // The streams end with the store, so a missing change cannot hang the test.
        store.close()
        #expect(await te.next()?.offset == rebuiltAt)
        #expect(await tf.next()?.offset == rebuiltAt)
        #expect(await tg.next() == nil)
    }

    @Test func aBatchIsAllOrNothing() async throws {
        let fixture = try StoreFixture("store-batch")
        let store = fixture.store
        var batch = WriteBatch()
        try batch.create(type: "te", id: "a", fields: [:])
        try batch.update(type: "te", id: "missing", changes: ["x": 1])
        await #expect(throws: LogStoreError.self) { try await store.write(batch) }
        #expect(try store.get(type: "te", id: "a") == nil)
        #expect(try store.log.lastOffset() == 0)
        #expect(try store.outboxCount() == 0)
    }

    // MARK: The projection rules (DESIGN.md, "Projections")

    @Test func aPendingDeleteIsNotResurrectedByAPulledUpsert() async throws {
        let fixture = try StoreFixture("rule-delete")
        let store = fixture.store
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 1, fields: ["a": 1])], cursor: "c1")
        try await store.delete(type: "te", id: "t1")
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 2, fields: ["a": 2])], cursor: "c2")
        #expect(try store.get(type: "te", id: "t1") == nil)
        #expect(try store.count(type: "te") == 0)
        // Once the delete is acknowledged, the server's state agrees.
        let pending = try store.outbox()
        try await store.record([(pending[0].offset, .acknowledged(.applied, serverVersion: 3))])
        #expect(try store.get(type: "te", id: "t1") == nil)
        #expect(try store.outboxCount() == 0)
    }

    @Test func aPulledChangeDoesNotHideAPendingValue() async throws {
        let fixture = try StoreFixture("rule-pending-value")
        let store = fixture.store
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 1, fields: ["a": 1, "b": 1])], cursor: "c1")
        try await store.update(type: "te", id: "t1", changes: ["a": 10])
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 2, fields: ["a": 2, "b": 2])], cursor: "c2")
        // The pending value of a stays visible; the pulled b shows through.
        #expect(try store.get(type: "te", id: "t1")?.fields == ["a": 10, "b": 2])
        let intent = try #require(try store.outbox().first)
        #expect(intent.intent.baseVersion == 1)
        try await store.record([(intent.offset, .acknowledged(.applied, serverVersion: 3))])
        let entity = try #require(try store.get(type: "te", id: "t1"))
        #expect(entity.fields == ["a": 10, "b": 2])
        #expect(entity.serverVersion == 3)
        #expect(!entity.hasPendingChanges)
    }

    @Test func anAckAfterTheChangeWasPulledDoesNotApplyItTwice() async throws {
        let fixture = try StoreFixture("rule-ack-after-pull")
        let store = fixture.store
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 1, fields: ["n": 1])], cursor: "c1")
        try await store.update(type: "te", id: "t1", changes: ["n": 2])
        // The server applied it as v2, then someone else made v3; the pull
        // arrives before the (duplicate) ack.
        try await store.applyPulledPage([
            PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 2, fields: ["n": 2]),
            PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 3, fields: ["n": 3]),
        ], cursor: "c3")
        let intent = try #require(try store.outbox().first)
        try await store.record([(intent.offset, .acknowledged(.duplicate, serverVersion: 2))])
        let entity = try #require(try store.get(type: "te", id: "t1"))
        #expect(entity.fields == ["n": 3])
        #expect(entity.serverVersion == 3)
    }

    @Test func aRejectedIntentLeavesTheVisibleStateAndIsReported() async throws {
        let fixture = try StoreFixture("rule-reject")
        let store = fixture.store
        let events = store.events()
        let id = try await store.create(type: "te", fields: ["minutes": -5])
        let intent = try #require(try store.outbox().first)
        try await store.record([(intent.offset, .rejected(code: "VALIDATION_ERROR", message: "minutes must be positive"))])
        #expect(try store.get(type: "te", id: id) == nil)
        #expect(try store.outboxCount() == 0)
        var iterator = events.makeAsyncIterator()
        let event = await iterator.next()
        #expect(event == .rejected(RejectedIntent(intentOffset: intent.offset, operation: .create, entityType: "te", entityID: id, code: "VALIDATION_ERROR", message: "minutes must be positive")))
        // The rejection is in the log too, for an app that was not listening.
        #expect(try store.log.entry(at: 2)?.kind == .reject)
    }

    @Test func aRejectedUpdateFallsBackToTheConfirmedState() async throws {
        let fixture = try StoreFixture("rule-reject-update")
        let store = fixture.store
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 4, fields: ["a": 1])], cursor: "c")
        try await store.update(type: "te", id: "t1", changes: ["a": 2])
        try await store.update(type: "te", id: "t1", changes: ["b": 3])
        let first = try #require(try store.outbox().first)
        try await store.record([(first.offset, .rejected(code: "PERMISSION_DENIED", message: "no"))])
        #expect(try store.get(type: "te", id: "t1")?.fields == ["a": 1, "b": 3])
    }

    /// Acks of the oldest pending intents, in order, move each into the
    /// base; the visible state keeps the change still pending, and a replay
    /// builds the same tables.
    @Test func inOrderAcksMoveIntentsIntoTheBaseAndKeepTheRestVisible() async throws {
        let fixture = try StoreFixture("rule-ack-in-order")
        let store = fixture.store
        let id = try await store.create(type: "te", fields: ["a": 1])
        try await store.update(type: "te", id: id, changes: ["b": 2])
        try await store.update(type: "te", id: id, changes: ["a": 3])
        let pending = try store.outbox()
        try #require(pending.count == 3)
        try await store.record([
            (pending[0].offset, .acknowledged(.applied, serverVersion: 1)),
            (pending[1].offset, .acknowledged(.applied, serverVersion: 2)),
        ])
        let entity = try #require(try store.get(type: "te", id: id))
        #expect(entity.fields == ["a": 3, "b": 2])
        #expect(entity.serverVersion == 2)
        #expect(entity.pendingIntentCount == 1)
        let incremental = try store.derivedTables()
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == incremental)
        // What the acks put in the base shows once the last intent is rejected.
        try await store.record([(pending[2].offset, .rejected(code: "CONFLICT", message: "no"))])
        #expect(try store.get(type: "te", id: id)?.fields == ["a": 1, "b": 2])
    }

    /// The server merged an update over a change this client had not
    /// pulled (`b` at version 2): the ack's version 3 is right, but the base
    /// the ack made by applying the intent locally is not. The pull that
    /// follows brings version 3 itself, which must win at the equal version.
    @Test func aPulledChangeAtTheAckedVersionReplacesTheAckedGuess() async throws {
        let fixture = try StoreFixture("rule-ack-guess")
        let store = fixture.store
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 1, fields: ["a": 1, "b": 1])], cursor: "c1")
        try await store.update(type: "te", id: "t1", changes: ["a": 10])
        let intent = try #require(try store.outbox().first)
        try await store.record([(intent.offset, .acknowledged(.applied, serverVersion: 3))])
        #expect(try store.get(type: "te", id: "t1")?.fields == ["a": 10, "b": 1])
        try await store.applyPulledPage([
            PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 2, fields: ["a": 1, "b": 2]),
            PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 3, fields: ["a": 10, "b": 2]),
        ], cursor: "c3")
        let entity = try #require(try store.get(type: "te", id: "t1"))
        #expect(entity.fields == ["a": 10, "b": 2])
        #expect(entity.serverVersion == 3)
    }

    /// A store whose derived databases are of an older projection version
    /// (2, which dropped a pulled change at the base version) is rebuilt
    /// from its log when opened.
    @Test func anOlderProjectionVersionIsRebuiltFromTheLog() async throws {
        var fixture = try StoreFixture("rule-projection-upgrade")
        let id = try await fixture.store.create(type: "te", fields: ["a": 1])
        fixture.store.close()
        do {
            let environment = try Environment(path: fixture.directory.path)
            let meta = try #require(try environment.openDatabase("meta", create: false))
            let entities = try #require(try environment.openDatabase("entities", create: false))
            try environment.write { txn in
                try txn.put(meta, key: Array("projection-version".utf8), value: [0, 0, 0, 2])
                try txn.delete(entities, key: Array("te".utf8) + [0] + Array(id.utf8))
            }
            environment.close()
        }
        try fixture.reopen()
        #expect(try fixture.store.get(type: "te", id: id)?.fields == ["a": 1])
        #expect(try fixture.store.outboxCount() == 1)
    }

    @Test func anOlderPulledChangeCannotUndoANewerState() async throws {
        let fixture = try StoreFixture("rule-stale")
        let store = fixture.store
        try await store.applyPulledPage([PulledChange(.delete, entityType: "te", entityID: "t1", serverVersion: 6)], cursor: "c1")
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 4, fields: ["a": 1])], cursor: "c2")
        #expect(try store.get(type: "te", id: "t1") == nil)
        #expect(try store.pullCursor() == "c2")
    }

    @Test func resyncKeepsPendingIntentsAndForgetsTheRest() async throws {
        var fixture = try StoreFixture("rule-resync")
        let store = fixture.store
        try await store.applyPulledPage([
            PulledChange(.upsert, entityType: "te", entityID: "t1", serverVersion: 1, fields: ["a": 1]),
            PulledChange(.upsert, entityType: "te", entityID: "t2", serverVersion: 1, fields: ["a": 1]),
        ], cursor: "c1")
        let mine = try await store.create(type: "te", fields: ["mine": true])
        try await store.update(type: "te", id: "t2", changes: ["a": 2])
        try await store.resync(reason: "CURSOR_INVALID")
        #expect(try store.pullCursor() == nil)
        #expect(try store.get(type: "te", id: "t1") == nil)
        // An update over nothing shows nothing until the base is pulled again.
        #expect(try store.get(type: "te", id: "t2") == nil)
        #expect(try store.get(type: "te", id: mine)?.fields == ["mine": true])
        #expect(try store.outboxCount() == 2)
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "t2", serverVersion: 1, fields: ["a": 1, "b": 1])], cursor: "c1")
        #expect(try store.get(type: "te", id: "t2")?.fields == ["a": 2, "b": 1])
        try fixture.reopen()
        #expect(try fixture.store.get(type: "te", id: "t2")?.fields == ["a": 2, "b": 1])
        #expect(try fixture.store.count(type: "te") == 2)
    }

    @Test func aResyncOverManyEntitiesResetsThemAllAndReplaysTheSame() async throws {
        var fixture = try StoreFixture("resync-batches")
        let store = fixture.store
        // More entities than two reset batches, so the reset resumes twice.
        let count = 2 * Store.resetBatchCountMax + 500
        let ids = (0..<count).map { String(format: "t%05d", $0) }
        for page in stride(from: 0, to: count, by: 500) {
            let changes = ids[page..<min(page + 500, count)].map {
                PulledChange(.upsert, entityType: "te", entityID: $0, serverVersion: 1, fields: ["a": 1])
            }
            try await store.applyPulledPage(changes, cursor: "c\(page)")
        }
        let mine = try await store.create(type: "te", fields: ["mine": true])
        try await store.update(type: "te", id: ids[count - 1], changes: ["a": 2])
        #expect(try store.count(type: "te") == count + 1)
        try await store.resync(reason: "CURSOR_INVALID")
        #expect(try store.count(type: "te") == 1)
        #expect(try store.all(type: "te", limit: count).map(\.id) == [mine])
        for id in [ids[0], ids[Store.resetBatchCountMax], ids[count - 1]] { #expect(try store.get(type: "te", id: id) == nil) }
        let tables = try store.derivedTables()
        // Replay meets the resync inside a chunk, with its working set.
        try await store.rebuildProjections()
        #expect(try store.derivedTables() == tables)
        try fixture.reopen()
        #expect(try fixture.store.count(type: "te") == 1)
    }

    /// Replay's chunks are write transactions like any other: one that
    /// fills the map is aborted, the map grows, and the chunk runs again from
    /// the start, with a working set of its own. The log is copied raw into a
    /// store with a tiny map (which grows to hold the log alone), so the
    /// replay has to grow it again; the tables must come out as the
    /// incremental path made them in a store with room.
    @Test func replayThatFillsTheMapGrowsItAndBuildsTheSameTables() async throws {
        let roomy = try StoreFixture("replay-map-roomy")
        var random = RandomEntries(seed: 20_261_123)
        var ids: [String] = []
        for round in 0..<12 {
            var batch = WriteBatch()
            for _ in 0..<100 {
                var fields = random.storeFields()
                fields["note"] = .string(String(repeating: "n", count: random.int(0...200)))
                ids.append(try batch.create(type: "te", fields: fields))
            }
            for _ in 0..<50 { try batch.update(type: "te", id: ids[random.int(0...ids.count - 1)], changes: random.storeFields()) }
            try await roomy.store.write(batch)
            // Acks for the oldest pending intents, some entities pulled.
            let acks = try roomy.store.outbox(limit: 80).enumerated().map { index, intent in
                (intent.offset, PushOutcome.acknowledged(.applied, serverVersion: UInt64(round * 100 + index + 1)))
            }
            try await roomy.store.record(acks)
            let pulled = (0..<30).map { index in
                PulledChange(.upsert, entityType: "prj", entityID: "p\(round)-\(index)", serverVersion: 1, fields: random.storeFields())
            }
            try await roomy.store.applyPulledPage(pulled, cursor: "c\(round)")
        }
        let expected = try roomy.store.derivedTables()
        var bodies: [EntryBody] = []
        var scanner = roomy.store.log.entries(from: 1)
        while let entry = try scanner.next() { bodies.append(entry.body) }

        let directory = try TemporaryDirectory("replay-map-tiny")
        var options = EventLog.Options(durability: .process)
        options.initialMapSize = 64 << 10
        let store = try Store(path: directory.path, options: options)
        defer { store.close() }
        _ = try store.log.appendBlocking(contentsOf: bodies)
        let beforeReplay = store.log.mapUsage().mapSize
        try await store.rebuildProjections(entriesPerTransaction: 500)
        #expect(store.log.mapUsage().mapSize > beforeReplay, "the replay never filled the map")
        #expect(try store.derivedTables() == expected)
        for id in [ids[0], ids[ids.count / 2], ids[ids.count - 1]] {
            #expect(try store.get(type: "te", id: id) == roomy.store.get(type: "te", id: id))
        }
    }

    // MARK: Outbox

    @Test func outboxRetriesAndFailures() async throws {
        let fixture = try StoreFixture("outbox-retry")
        let store = fixture.store
        let events = store.events()
        let id = try await store.create(type: "te", fields: [:])
        let offset = try #require(try store.outbox().first?.offset)
        #expect(try store.outbox(dueAt: 1000).count == 1)
        // Named twice, still one failed attempt (it counted two).
        try await store.scheduleRetry(offsets: [offset, offset], error: "HTTP 503", at: 5000, attemptsMax: 2)
        #expect(try store.outbox(dueAt: 4999).isEmpty)
        #expect(try store.outbox(dueAt: 5000).first?.state.attempts == 1)
        try await store.scheduleRetry(offsets: [offset], error: "HTTP 503", at: 9000, attemptsMax: 2)
        #expect(try store.outbox(dueAt: 100_000).isEmpty)
        #expect(try store.outbox().first?.state.status == .failed)
        var iterator = events.makeAsyncIterator()
        #expect(await iterator.next() == .retriesExhausted(offset: offset, entityType: "te", entityID: id, lastError: "HTTP 503"))
        // The app's retry is news for the scheduler, as a new intent is: the
        // intent is due now, not at the next periodic sync.
        let intents = store.intentCommits()
        try await store.retryFailed()
        #expect(try store.outbox(dueAt: 0).first?.state == OutboxState())
        let last = try store.log.lastOffset()
        store.close()
        #expect(await drained(intents) == [last])
    }

    /// A retry time more than `retryWaitMax` after now is due: the caller
    /// sets none that far off, so a clock since set back set it.
    @Test func aRetryTimeBeyondTheLongestWaitIsDue() async throws {
        let fixture = try StoreFixture("outbox-retry-wait-max")
        let store = fixture.store
        try await store.create(type: "te", fields: [:])
        let offset = try #require(try store.outbox().first?.offset)
        try await store.scheduleRetry(offsets: [offset], error: "HTTP 503", at: 5_000, attemptsMax: 10)
        #expect(try store.pushBatch(limit: 10, now: 1_000).isEmpty)
        #expect(try store.pushBatch(limit: 10, now: 1_000, retryWaitMax: 4_000).isEmpty)
        #expect(try store.pushBatch(limit: 10, now: 1_000, retryWaitMax: 3_999).map(\.offset) == [offset])
        #expect(try store.pushBatch(limit: 10, now: 5_000, retryWaitMax: 0).map(\.offset) == [offset])
        // The outbox's due list takes them as the push does.
        #expect(try store.outbox(dueAt: 1_000, retryWaitMax: 4_000).isEmpty)
        #expect(try store.outbox(dueAt: 1_000, retryWaitMax: 3_999).map(\.offset) == [offset])
    }

    @Test func repeatedAcksSettleOnce() async throws {
        let fixture = try StoreFixture("outbox-repeat")
        let store = fixture.store
        _ = try await store.create(type: "te", fields: [:])
        let offset = try #require(try store.outbox().first?.offset)
        #expect(try await store.record([(offset, .acknowledged(.applied, serverVersion: 1))]).settled == [offset])
        #expect(try await store.record([(offset, .acknowledged(.duplicate, serverVersion: 1))]).settled == [])
        #expect(try store.log.lastOffset() == 2)
    }

    /// A conflict decision with fields the store refuses (a NaN) is
    /// recorded as `askApp` and returned as refused; the answers recorded
    /// with it are kept, and the conflict still waits after a reopen.
    @Test func aRefusedConflictDecisionLeavesTheConflictForTheApp() async throws {
        var fixture = try StoreFixture("outbox-refused-decision")
        let store = fixture.store
        let id = try await store.create(type: "te", fields: ["a": 1])
        let other = try await store.create(type: "te", fields: ["b": 1])
        let pending = try store.outbox()
        try #require(pending.count == 2)
        let server = ServerState(serverVersion: 1, deleted: false, data: ["a": 2])
        let recorded = try await store.record(
            [(pending[0].offset, .conflict(server, message: "exists")), (pending[1].offset, .acknowledged(.applied, serverVersion: 1))],
            resolve: { _ in .custom(["a": .double(.nan)]) })
        #expect(recorded.settled == pending.map(\.offset))
        #expect(recorded.refused.map { [$0.entityType, $0.entityID] } == [["te", id]])
        #expect(recorded.refused.first?.intentOffset == pending[0].offset)
        #expect(recorded.refused.first?.reason.contains("nan") == true)
        #expect(try store.outboxCount() == 0)
        #expect(try store.get(type: "te", id: other)?.serverVersion == 1)
        try fixture.reopen()
        let waiting = try fixture.store.conflicts()
        #expect(waiting.map(\.conflict.intentOffset) == [pending[0].offset])
        #expect(waiting.first?.conflict.resolution == .pending)
    }

    @Test func changesAreAnnouncedPerType() async throws {
        let fixture = try StoreFixture("store-changes")
        let store = fixture.store
        let changes = store.changes(type: "te")
        try await store.create(type: "other", fields: [:])
        try await store.create(type: "te", fields: [:])
        var iterator = changes.makeAsyncIterator()
        let change = await iterator.next()
        #expect(change == StoreChange(entityType: "te", offset: 2))
    }

    @Test func idempotencyKeysFindTheirIntent() async throws {
        let fixture = try StoreFixture("store-idempotency")
        let store = fixture.store
        _ = try await store.create(type: "te", fields: [:])
        let pending = try #require(try store.outbox().first)
        #expect(try store.intentOffset(idempotencyKey: pending.intent.idempotencyKey) == pending.offset)
        #expect(try store.intentOffset(idempotencyKey: "unknown") == nil)
    }
}
