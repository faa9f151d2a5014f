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
        #expect(error.code == .corruptEntry && "\(error)".contains("te/x is damaged: 3 bytes"), "\(error)")
        // It stops every answer and pulled change of its entity; a resync,
        // which keeps the rows that decode, takes it out.
        try await store.resync(reason: "repair")
        #expect(try store.acknowledgedChangesNotInFeed(through: .max).isEmpty)
    }

    /// The feed names the operation that made each change: a change at the
    /// acknowledged version made by another operation is the server giving
    /// that version again (a store put back from a backup, then written to
    /// by another client), so the acknowledged change is lost, and stays
    /// so whatever comes after it. The acknowledged operation's own change,
    /// or one whose operation the server does not name, clears the row.
    @Test func aChangeAtTheAcknowledgedVersionByAnotherOperationIsALoss() async throws {
        let fixture = try StoreFixture("awaited-keys")
        let store = fixture.store
        for id in ["a", "b", "c"] { try await store.create(type: "te", id: id, fields: ["n": 1]) }
        let pending = try store.outbox()
        try await store.record(pending.map { ($0.offset, .acknowledged(.applied, serverVersion: 1)) })
        let keys = pending.map(\.intent.idempotencyKey)
        func pulled(_ id: String, _ version: UInt64, key: String?) -> PulledChange {
            PulledChange(.upsert, entityType: "te", entityID: id, serverVersion: version, fields: ["n": 9], idempotencyKey: key)
        }
        try await store.applyPulledPage(
            [pulled("a", 1, key: keys[0]), pulled("b", 1, key: nil), pulled("c", 1, key: "another-clients-key")], cursor: "c1")
        #expect(try awaited(store) == ["te/c@1"])
        // Neither a later change nor a repeat of its own clears a lost one.
        try await store.applyPulledPage([pulled("c", 2, key: "later"), pulled("c", 1, key: keys[2])], cursor: "c2")
        #expect(try awaited(store) == ["te/c@1"])
        // Nor does a later ack of the entity take its place: the engine has
        // still to report it.
        try await store.update(type: "te", id: "c", changes: ["n": 3])
        try await store.record([(try store.outbox()[0].offset, .acknowledged(.applied, serverVersion: 3))])
        #expect(try awaited(store) == ["te/c@1"])
    }

    /// A row written before rows held the key (16 bytes: the ack's offset
    /// and the version) is read, and cleared by the version alone; a state
    /// byte other than 0 or 1 is damage.
    @Test func aRowWithoutAKeyIsClearedByItsVersion() async throws {
        let fixture = try StoreFixture("awaited-old-rows")
        fixture.store.close()
        try putRaw(fixture.directory.path, database: "awaited-feed", key: Array("te\0x".utf8), value: UInt64(7).bigEndianBytes + UInt64(2).bigEndianBytes)
        try putRaw(fixture.directory.path, database: "awaited-feed", key: Array("te\0y".utf8), value: UInt64(8).bigEndianBytes + UInt64(2).bigEndianBytes + [2, 65])
        let store = try Store(path: fixture.directory.path)
        defer { store.close() }
        let error = try #require(throws: LogStoreError.self) { try store.acknowledgedChangesNotInFeed(through: .max) }
        #expect(error.code == .corruptEntry && "\(error)".contains("te/y is damaged: 18 bytes"), "\(error)")
        try await store.resync(reason: "repair")
        #expect(try awaited(store) == ["te/x@2"])
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 2, idempotencyKey: "any")], cursor: "c1")
        #expect(try awaited(store).isEmpty)
    }
}
