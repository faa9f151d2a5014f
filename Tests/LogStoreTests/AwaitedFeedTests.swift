@testable import LogStore
import LogFormat
import LogTesting
import Testing

/// The changes the server acknowledged that its feed has not shown yet
/// (`Format/storage.md`, section 15, `awaited-feed`): what lets the engine
/// see a server that lost them.
@Suite struct AwaitedFeedTests {
    private func awaited(_ store: Store) throws -> [String] {
        try store.acknowledgedChangesNotInFeed(through: .max).map { "\($0.entityType)/\($0.entityID)@\($0.serverVersion)" }
    }

    @Test func anAckWaitsUntilAPulledChangeOfItsEntityReachesItsVersion() async throws {
        let fixture = try StoreFixture("awaited-rules")
        let store = fixture.store
        let a = try await store.create(type: "te", id: "a", fields: ["n": 1])
        try await store.update(type: "te", id: a, changes: ["n": 2])
        try await store.create(type: "te", id: "b", fields: ["n": 1])
        let pending = try store.outbox()
        try await store.record([
            (pending[0].offset, .acknowledged(.applied, serverVersion: 1)),
            (pending[1].offset, .acknowledged(.applied, serverVersion: 2)),
            (pending[2].offset, .acknowledged(.applied, serverVersion: 1)),
        ])
        // One row an entity, at its latest acknowledged version.
        #expect(try awaited(store) == ["te/a@2", "te/b@1"])
        let acks = try store.acknowledgedChangesNotInFeed(through: .max).map(\.ackOffset)
        #expect(try store.acknowledgedChangesNotInFeed(through: acks.min()! - 1).isEmpty)
        #expect(try store.acknowledgedChangesNotInFeed(through: acks.min()!).count == 1)

        // The feed's older change of `a` is not the acknowledged one.
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 1, fields: ["n": 1])], cursor: "c1")
        #expect(try awaited(store) == ["te/a@2", "te/b@1"])
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 2, fields: ["n": 2])], cursor: "c2")
        #expect(try awaited(store) == ["te/b@1"])
        // A later change (another client's, over the acknowledged one) shows it too; so does a delete.
        try await store.applyPulledPage([PulledChange(.delete, entityType: "te", entityID: "b", serverVersion: 3)], cursor: "c3")
        #expect(try awaited(store).isEmpty)
    }

    /// A pull that ran ahead of the answer (the page with the change came
    /// first) already showed it: the ack waits for nothing.
    @Test func anAckTheFeedAlreadyShowedWaitsForNothing() async throws {
        let fixture = try StoreFixture("awaited-ahead")
        let store = fixture.store
        try await store.create(type: "te", id: "a", fields: ["n": 1])
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 1, fields: ["n": 1])], cursor: "c1")
        try await store.record([(try store.outbox()[0].offset, .acknowledged(.applied, serverVersion: 1))])
        #expect(try awaited(store).isEmpty)
    }

    /// A resync forgets what the server confirmed, not the rows: the pull
    /// from the start shows every entity the server has, and clears them
    /// as any pull does; what it ends without, the server lost. A reopen
    /// or a rebuild keeps them too (they are not derived from the log).
    @Test func aResyncAReopenAndARebuildKeepIt() async throws {
        var fixture = try StoreFixture("awaited-resync")
        for id in ["a", "b", "c"] { try await fixture.store.create(type: "te", id: id, fields: ["n": 1]) }
        try await fixture.store.record(try fixture.store.outbox().map { ($0.offset, .acknowledged(.applied, serverVersion: 1)) })
        try fixture.reopen()
        try await fixture.store.rebuildProjections()
        #expect(try awaited(fixture.store) == ["te/a@1", "te/b@1", "te/c@1"])
        try await fixture.store.resync(reason: "test")
        #expect(try awaited(fixture.store) == ["te/a@1", "te/b@1", "te/c@1"])
        try await fixture.store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 1, fields: ["n": 1])], cursor: "c1")
        #expect(try awaited(fixture.store) == ["te/b@1", "te/c@1"])

        // Forgetting a lost change leaves a row a later ack put in its place.
        let lost = try fixture.store.acknowledgedChangesNotInFeed(through: .max)
        try await fixture.store.create(type: "te", id: "c", fields: ["n": 2])
        try await fixture.store.record([(try fixture.store.outbox()[0].offset, .acknowledged(.applied, serverVersion: 2))])
        try await fixture.store.forgetAcknowledgedChanges(lost)
        #expect(try awaited(fixture.store) == ["te/c@2"])
    }

    /// A damaged row is an error naming its entity, not a trap or a row.
    @Test func aDamagedRowIsAnErrorNamingItsEntity() async throws {
        let fixture = try StoreFixture("awaited-damage")
        fixture.store.close()
        try putRaw(fixture.directory.path, database: "awaited-feed", key: Array("te\0x".utf8), value: [1, 2, 3])
        let store = try Store(path: fixture.directory.path)
        defer { store.close() }
        let error = try #require(throws: LogStoreError.self) { try store.acknowledgedChangesNotInFeed(through: .max) }
        #expect(error.code == .corruptEntry && "\(error)".contains("te/x is 3 bytes"), "\(error)")
        // It stops every answer and pulled change of its entity; a resync,
        // which keeps the rows that decode, takes it out.
        try await store.resync(reason: "repair")
        #expect(try store.acknowledgedChangesNotInFeed(through: .max).isEmpty)
    }
}
