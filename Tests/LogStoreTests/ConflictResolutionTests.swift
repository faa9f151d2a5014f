import LogFormat
import LogStore
import LogTesting
import Testing

/// The app's own decisions on a waiting conflict (`.custom`, `.merged`),
/// each against a server that deleted the entity and one that changed it:
/// the intent the resolution pushes, and what the app sees then (the
/// confirmed state with that intent over it: the server's state is
/// confirmed by the pull that follows), after that pull, and after a
/// reopen and a replay. (`KeepLocalTests` covers `.keepLocal`.)
@Suite struct ConflictResolutionTests {
    static let confirmed: Fields = ["title": "v1", "notes": "n", "done": false]

    /// An update of `task/t1` (title "from a") that the server refused
    /// with `server` as its state; the conflict waits for the app.
    static func refusedUpdate(_ store: Store, server: ServerState) async throws -> UInt64 {
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "task", entityID: "t1", serverVersion: 1, fields: confirmed)], cursor: "c1")
        try await store.update(type: "task", id: "t1", changes: ["title": "from a"])
        let update = try #require(try store.outbox().first)
        try await store.record([(update.offset, .conflict(server, message: "refused"))]) { _ in .askApp }
        #expect(try store.conflicts().map(\.conflict.intentOffset) == [update.offset])
        return update.offset
    }

    static let deleted = ServerState(serverVersion: 2, deleted: true, data: [:])
    static let changed = ServerState(serverVersion: 2, deleted: false, data: ["title": "theirs", "notes": "n", "done": true])
    static let nulled = ServerState(serverVersion: 2, deleted: false, data: ["title": "theirs", "notes": .null, "done": true])

    struct Case: Sendable, CustomTestStringConvertible {
        var server: ServerState
        var decision: ConflictDecision
        /// The intent the resolution pushes (nil: none).
        var pushed: (Intent.Operation, Fields)?
        /// What the app sees once it is resolved and the server's state is
        /// pulled (nil: no entity).
        var seen: Fields?
        var testDescription: String { "\(decision) against \(server.deleted ? "a delete" : "a change")" }
    }

    static let cases = [
        // Both sides agree the entity is gone: nothing to push.
        Case(server: deleted, decision: .custom(nil), pushed: nil, seen: nil),
        // Brought back as the app decided.
        Case(server: deleted, decision: .custom(["title": "revived"]), pushed: (.create, ["title": "revived"]), seen: ["title": "revived"]),
        Case(server: deleted, decision: .merged(["title": "both"]), pushed: (.create, ["title": "both"]), seen: ["title": "both"]),
        // Deleted as the app decided.
        Case(server: changed, decision: .custom(nil), pushed: (.delete, [:]), seen: nil),
        // Moved to the target with one update: a field the target lacks
        // becomes null (an update cannot remove it), one it shares with
        // the server is not sent.
        Case(
            server: changed, decision: .merged(["title": "both", "done": true]),
            pushed: (.update, ["title": "both", "notes": .null]), seen: ["title": "both", "notes": .null, "done": true]),
        // The target is the server's state: nothing to push.
        Case(server: changed, decision: .custom(changed.data), pushed: nil, seen: changed.data),
        // A field the target lacks that the server has as null is null
        // already: the target is the server's state, nothing to push.
        Case(server: nulled, decision: .merged(["title": "theirs", "done": true]), pushed: nil, seen: nulled.data),
    ]

    /// An intent's effect on a state, as the store's projections apply it.
    static func applying(_ operation: Intent.Operation, _ fields: Fields, to state: Fields?) -> Fields? {
        switch operation {
        case .create: fields
        case .update: state?.merging(fields)
        case .delete: nil
        }
    }

    @Test(arguments: cases)
    func aDecisionOfTheAppPushesOneIntentToItsTarget(_ test: Case) async throws {
        var fixture = try StoreFixture("conflict-resolution")
        let refused = try await Self.refusedUpdate(fixture.store, server: test.server)
        try await fixture.store.resolveConflict(intentOffset: refused, test.decision)
        #expect(try fixture.store.conflicts().isEmpty)
        let pending = try fixture.store.outbox()
        #expect(pending.count == (test.pushed == nil ? 0 : 1))
        if let (operation, fields) = test.pushed, let intent = pending.first?.intent {
            #expect(intent.operation == operation)
            #expect(intent.fields == fields)
            #expect(intent.baseVersion == 2)
        }
        var beforePull: Fields? = Self.confirmed
        if let (operation, fields) = test.pushed {
            beforePull = Self.applying(operation, fields, to: beforePull)
        }
        #expect(try fixture.store.get(type: "task", id: "t1")?.fields == beforePull)
        try await fixture.store.applyPulledPage(
            [
                test.server.deleted
                    ? PulledChange(.delete, entityType: "task", entityID: "t1", serverVersion: 2)
                    : PulledChange(.upsert, entityType: "task", entityID: "t1", serverVersion: 2, fields: test.server.data)
            ], cursor: "c2")
        for pass in ["pulled", "reopened and rebuilt"] {
            let fields = try fixture.store.get(type: "task", id: "t1")?.fields
            #expect(fields == test.seen, "\(pass)")
            if pass == "pulled" {
                try fixture.reopen()
                try await fixture.store.rebuildProjections()
            }
        }
    }

    /// A conflict waiting for the app has settled on nothing yet: its
    /// `resolved_fields` are empty, except when the server had deleted the
    /// entity, where they keep what the app saw for a `keepLocal` decided
    /// later to bring back (`storage.md`, section 7).
    @Test(arguments: [changed, deleted])
    func aWaitingConflictKeepsWhatTheAppSawOnlyAgainstADelete(_ server: ServerState) async throws {
        let fixture = try StoreFixture("conflict-resolution-waiting-fields")
        _ = try await Self.refusedUpdate(fixture.store, server: server)
        let expected: Fields = server.deleted ? Self.confirmed.merging(["title": "from a"]) : [:]
        #expect(try fixture.store.conflicts().map(\.conflict.resolvedFields) == [expected])
    }

    /// Resolving an intent with no waiting conflict (never one, or one
    /// already resolved) is an error naming the offset, and writes nothing.
    @Test func resolvingWhatDoesNotWaitIsNotFound() async throws {
        let fixture = try StoreFixture("conflict-resolution-none")
        let refused = try await Self.refusedUpdate(fixture.store, server: Self.changed)
        try await fixture.store.resolveConflict(intentOffset: refused, .keepRemote)
        let last = try fixture.store.log.lastOffset()
        for offset in [refused, refused - 1, 999] {
            let error = await #expect(throws: LogStoreError.self) {
                try await fixture.store.resolveConflict(intentOffset: offset, .keepLocal)
            }
            #expect(error?.code == .notFound)
            #expect(error?.offset == offset)
        }
        #expect(try fixture.store.log.lastOffset() == last)
    }
}
