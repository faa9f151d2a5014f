import Foundation
import LMDB
import LogFormat
import LogStore
import LogTesting
import Testing

@Suite struct StoreSnapshotTests {
    /// What a reader saw through one snapshot, before and after other
    /// writes committed.
    struct Seen: Equatable, Sendable {
        var count: Int
        var first: Entity?
        var ids: [String]
        var types: [String]

        init(count: Int, first: Entity?, ids: [String], types: [String]) {
            self.count = count
            self.first = first
            self.ids = ids
            self.types = types
        }

        init(_ snapshot: borrowing StoreSnapshot) throws {
            self.init(
                count: try snapshot.count(type: "prj"), first: try snapshot.get(type: "prj", id: "p0"),
                ids: try snapshot.all(type: "prj").map(\.id), types: try snapshot.entityTypes())
        }
    }

    /// Every read through one `Store.read` sees the commit it began at:
    /// an update, a create, a delete and a new type that commit while it
    /// is open change none of them; the reads after it see all four.
    @Test func readsInOneSnapshotAgreeWhileWritesCommit() async throws {
        let fixture = try StoreFixture("snapshot-isolation")
        let store = fixture.store
        var batch = WriteBatch()
        for n in 0..<3 { try batch.create(type: "prj", id: "p\(n)", fields: ["name": .string("project \(n)")]) }
        try await store.write(batch)
        let p0 = try #require(try store.get(type: "prj", id: "p0"))
        #expect(p0.fields == ["name": "project 0"])

        let (events, continuation) = AsyncStream<Result<(Seen, Seen), any Error>?>.makeStream()
        let wrote = DispatchSemaphore(value: 0)
        // On a thread of its own: the snapshot's closure waits for the
        // writes, and must not hold a thread of the pool the writes need.
        Thread {
            let result = Result {
                try store.read { snapshot in
                    let before = try Seen(snapshot)
                    continuation.yield(nil)
                    wrote.wait()
                    return (before, try Seen(snapshot))
                }
            }
            continuation.yield(result)
            continuation.finish()
        }.start()

        var iterator = events.makeAsyncIterator()
        _ = await iterator.next()
        try await store.update(type: "prj", id: "p0", changes: ["name": "renamed"])
        var more = WriteBatch()
        try more.create(type: "prj", id: "p3", fields: [:])
        try more.create(type: "prj", id: "p4", fields: [:])
        try more.create(type: "tag", id: "t0", fields: [:])
        try more.delete(type: "prj", id: "p1")
        try await store.write(more)
        wrote.signal()
        let (before, after) = try #require(await iterator.next() ?? nil).get()

        let original = Seen(count: 3, first: p0, ids: ["p0", "p1", "p2"], types: ["prj"])
        #expect(before == original)
        #expect(after == original)
        // A read of its own after the snapshot sees every write.
        #expect(try store.count(type: "prj") == 4)
        #expect(try store.get(type: "prj", id: "p0")?.fields == ["name": "renamed"])
        #expect(try store.all(type: "prj").map(\.id) == ["p0", "p2", "p3", "p4"])
        #expect(try store.entityTypes() == ["prj", "tag"])
    }

    /// The snapshot's reads answer as the store's one-shot reads do,
    /// paging, limits and missing entities included.
    @Test func aSnapshotReadsWhatTheOneShotReadsRead() async throws {
        let fixture = try StoreFixture("snapshot-reads")
        let store = fixture.store
        var batch = WriteBatch()
        for n in 0..<12 { try batch.create(type: "te", id: String(format: "e%02d", n), fields: ["n": .int(Int64(n))]) }
        try batch.create(type: "prj", id: "only", fields: ["name": "one"])
        try await store.write(batch)
        try await store.delete(type: "te", id: "e03")

        // Read into values first: `#expect` captures what it checks in
        // closures, which a borrowed snapshot cannot be.
        let (e05, e03, otherType, first, rest, none, negative, counts, types) = try store.read { snapshot in
            (
                try snapshot.get(type: "te", id: "e05"), try snapshot.get(type: "te", id: "e03"),
                try snapshot.get(type: "nope", id: "e05"), try snapshot.all(type: "te", limit: 5),
                try snapshot.all(type: "te", after: "e05"), try snapshot.all(type: "te", limit: 0),
                Result { try snapshot.all(type: "te", limit: -1) },
                [try snapshot.count(type: "te"), try snapshot.count(type: "nope")], try snapshot.entityTypes()
            )
        }
        let oneShot = try store.get(type: "te", id: "e05")
        #expect(e05 != nil && e05 == oneShot)
        #expect(e03 == nil && otherType == nil)
        let oneShotPage = try store.all(type: "te", limit: 5)
        #expect(first == oneShotPage)
        #expect(first.map(\.id) == ["e00", "e01", "e02", "e04", "e05"])
        #expect(rest.map(\.id) == ["e06", "e07", "e08", "e09", "e10", "e11"])
        #expect(none.isEmpty)
        let refusal = #expect(throws: LogStoreError.self) { try negative.get() }
        #expect(refusal?.code == .invalidArgument)
        #expect(counts == [11, 0])
        #expect(types == ["prj", "te"])
        // What the closure returns, `read` returns.
        #expect(try store.read { try $0.count(type: "prj") } == 1)
    }

    /// `tableStatistics` counts each table's keys, the derived ones of the
    /// set in use under their plain names, before and after a rebuild
    /// switches sets. The 10 acks wait for the feed, which a rebuild (it
    /// is not derived) leaves alone.
    @Test func tableStatisticsCountTheTablesInUse() async throws {
        let fixture = try StoreFixture("snapshot-tables")
        let store = fixture.store
        var batch = WriteBatch()
        for n in 0..<30 { try batch.create(type: "te", id: "e\(n)", fields: ["n": .int(Int64(n))]) }
        try await store.write(batch)
        try await store.record(try store.outbox(limit: 10).map { ($0.offset, .acknowledged(.applied, serverVersion: 1)) })
        let expected = [
            "log": 40, "meta": -1, "entities": 30, "outbox": 20, "idempotency": 30, "counts": 1, "conflicts": 0,
            "awaited-feed": 10,
        ]
        for pass in ["written", "rebuilt"] {
            let tables = try store.tableStatistics()
            #expect(
                tables.map(\.name) == ["log", "meta", "entities", "outbox", "idempotency", "counts", "conflicts", "awaited-feed"],
                "\(pass)")
            for (name, statistics) in tables where expected[name] != -1 {
                #expect(statistics.entries == expected[name], "\(pass): \(name)")
                #expect(statistics.bytes > 0 || statistics.entries == 0, "\(pass): \(name)")
            }
            if pass == "written" { try await store.rebuildProjections() }
        }
        #expect(try store.derivedDatabaseNamesInUse().first == "entities.1")
    }

    /// A closed store refuses the read before `body` runs.
    @Test func aClosedStoreRefusesARead() throws {
        let fixture = try StoreFixture("snapshot-closed")
        fixture.store.close()
        var ran = false
        let error = #expect(throws: LMDBError.self) { try fixture.store.read { _ in ran = true } }
        #expect(error?.code == .closed)
        #expect(!ran)
    }
}
