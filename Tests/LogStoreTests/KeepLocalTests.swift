import LogFormat
import LogStore
import LogTesting
import Testing

/// How a conflict's decision becomes entries, in a real store. The reference
/// server answers an update of a deleted entity `ENTITY_NOT_FOUND`, so a
/// `CONFLICT` whose server state is deleted (which the protocol allows) is
/// recorded directly.
@Suite struct KeepLocalTests {
    /// When `keepLocal` is decided for an update the server refused because
    /// it had deleted the entity.
    enum Decided: CaseIterable {
        /// By the strategy, while the push's answers are recorded.
        case whenRecorded
        /// By the app, while the conflict waits.
        case byTheApp
        /// By the app, after a pull applied the server's delete (and a
        /// compaction and a reopen, which leave only the log behind).
        case byTheAppAfterThePull
    }

    /// `keepLocal` against a server that deleted the entity brings it back
    /// with a create of what the app saw: the confirmed fields with its
    /// update over them. Before, a decision the app made later read what
    /// the app saw from the projection as it was then, without the refused
    /// update: the entity came back with the fields the server had
    /// confirmed and without the update (the update is no longer pending)
    /// or, once the pull had applied the delete, with the update's fields
    /// alone.
    @Test(arguments: Decided.allCases)
    func keepLocalRecreatesWhatTheAppSawWhenTheServerDeletedTheEntity(_ decided: Decided) async throws {
        var fixture = try StoreFixture("conflicts-keep-local-deleted")
        let decision: ConflictDecision = decided == .whenRecorded ? .keepLocal : .askApp
        let update = try await Self.updateOfATaskTheServerDeleted(fixture.store, decision)
        if decided == .byTheAppAfterThePull {
            // Another task's change after the delete, so that compaction
            // folds the delete into a tombstone.
            try await fixture.store.applyPulledPage(
                [
                    PulledChange(.delete, entityType: "task", entityID: "t1", serverVersion: 2),
                    PulledChange(.upsert, entityType: "task", entityID: "t2", serverVersion: 1, fields: ["title": "t2"]),
                ], cursor: "c2")
            #expect(try fixture.store.get(type: "task", id: "t1") == nil)
            #expect(try await fixture.store.compact(below: try fixture.store.log.lastOffset()).snapshotsWritten > 0)
            try fixture.reopen()
        }
        let seen: Fields = ["title": "from a", "notes": "n", "done": false]
        if decided != .whenRecorded {
            let waiting = try fixture.store.conflicts()
            #expect(waiting.map(\.conflict.intentOffset) == [update])
            #expect(waiting.first?.conflict.resolvedFields == seen)
            try await fixture.store.resolveConflict(intentOffset: update, .keepLocal)
        }
        #expect(try fixture.store.conflicts().isEmpty)
        let resolution = try #require(try fixture.store.outbox().first?.intent)
        #expect(resolution.operation == .create)
        #expect(resolution.fields == seen)
        #expect(resolution.baseVersion == 2)
        #expect(try fixture.store.get(type: "task", id: "t1")?.fields == seen)
        try fixture.reopen()
        try await fixture.store.rebuildProjections()
        #expect(try fixture.store.get(type: "task", id: "t1")?.fields == seen)
    }

    /// The app changes the entity again while the conflict waits (the
    /// server's delete not pulled yet); a `keepLocal` it decides then
    /// recreates what the app saw with that change too: the create is
    /// pushed after the change, and must not undo it.
    @Test func keepLocalDecidedLaterKeepsTheChangesMadeSince() async throws {
        let fixture = try StoreFixture("conflicts-keep-local-deleted-later")
        let update = try await Self.updateOfATaskTheServerDeleted(fixture.store, .askApp)
        try await fixture.store.update(type: "task", id: "t1", changes: ["done": true])
        try await fixture.store.resolveConflict(intentOffset: update, .keepLocal)
        let seen: Fields = ["title": "from a", "notes": "n", "done": true]
        let resolution = try #require(try fixture.store.outbox().last?.intent)
        #expect(resolution.operation == .create)
        #expect(resolution.fields == seen)
        #expect(try fixture.store.get(type: "task", id: "t1")?.fields == seen)
    }

    /// The app deletes the entity after the refused update; a `keepLocal`
    /// of the strategy, with the delete still pending, keeps what the app
    /// sees: no entity. A conflict left to the app is settled by the delete
    /// itself (`theAppsDeleteSettlesTheConflictOfAnEarlierChange`). Before, the later delete left
    /// no state to recreate, and the resolution fell back to a create of
    /// the update's fields alone, pushed after the delete: the entity came
    /// back with one field.
    @Test(arguments: [Decided.whenRecorded, .byTheApp])
    func keepLocalAfterTheAppDeletedTheEntityLeavesItDeleted(_ decided: Decided) async throws {
        var fixture = try StoreFixture("conflicts-keep-local-app-deleted")
        let update: UInt64
        if decided == .whenRecorded {
            update = try await Self.updateOfATaskTheServerDeleted(fixture.store, .keepLocal) {
                try await fixture.store.delete(type: "task", id: "t1")
            }
        } else {
            update = try await Self.updateOfATaskTheServerDeleted(fixture.store, .askApp)
            try await fixture.store.delete(type: "task", id: "t1")
            // The delete settled the conflict: no decision is left to make.
            let error = await #expect(throws: LogStoreError.self) {
                try await fixture.store.resolveConflict(intentOffset: update, .keepLocal)
            }
            #expect(error?.code == .notFound)
        }
        #expect(try fixture.store.conflicts().isEmpty)
        let delete = try #require(try fixture.store.outbox().last)
        #expect(delete.offset > update)
        for pass in ["settled", "reopened and rebuilt"] {
            let pending = try fixture.store.outbox().map(\.intent.operation)
            let fields = try fixture.store.get(type: "task", id: "t1")?.fields
            #expect(pending == [.delete], "\(pass)")
            #expect(fields == nil, "\(pass)")
            if pass == "settled" {
                try fixture.reopen()
                try await fixture.store.rebuildProjections()
            }
        }
    }

    /// A create the server refused as behind its tombstone (its base version
    /// is ahead of a server restored from a backup), with an update of the
    /// app after it that the server answered `ENTITY_NOT_FOUND`: `keepLocal`,
    /// decided when the answers come or by the app later, brings the entity
    /// back as the app saw it, the update included. Before, it came back
    /// with the create's fields alone: the update's fields were lost.
    @Test(arguments: [Decided.whenRecorded, .byTheApp])
    func keepLocalOfARefusedCreateKeepsTheUpdatesMadeAfterIt(_ decided: Decided) async throws {
        var fixture = try StoreFixture("conflicts-keep-local-create")
        let store = fixture.store
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "task", entityID: "t1", serverVersion: 3, fields: ["title": "v3"])], cursor: "c1")
        try await store.delete(type: "task", id: "t1")
        try await store.create(type: "task", id: "t1", fields: ["title": "again"])
        try await store.update(type: "task", id: "t1", changes: ["done": true])
        let pushed = try store.outbox().map(\.offset)
        let notFound = PushOutcome.rejected(code: "ENTITY_NOT_FOUND", message: "no task/t1")
        let never = ServerState(serverVersion: 0, deleted: true, data: [:])
        try await store.record([(pushed[0], notFound), (pushed[1], .conflict(never, message: "behind")), (pushed[2], notFound)]) { _ in
            decided == .whenRecorded ? .keepLocal : .askApp
        }
        if decided == .byTheApp { try await store.resolveConflict(intentOffset: pushed[1], .keepLocal) }
        let seen: Fields = ["title": "again", "done": true]
        let resolution = try #require(try store.outbox().last?.intent)
        #expect(resolution.operation == .create)
        #expect(resolution.fields == seen)
        #expect(try store.get(type: "task", id: "t1")?.fields == seen)
        try fixture.reopen()
        try await fixture.store.rebuildProjections()
        #expect(try fixture.store.get(type: "task", id: "t1")?.fields == seen)
    }

    /// The app deletes the entity after the update the server refused,
    /// before the answer comes (`beforeTheAnswer`) or while the conflict
    /// waits for the app; the server answers the delete (`ENTITY_NOT_FOUND`:
    /// it had deleted the entity) and its delete is pulled. The app's delete
    /// replaced the whole state, so it settles the conflict `keepLocal` with
    /// what the app sees, no entity: nothing is left to decide, and nothing
    /// brings the entity back. Before, the conflict waited, and a
    /// `keepLocal` decided once the delete was answered (no pending intent
    /// showing it any more) pushed a create of the refused update over the
    /// base (found by a mutation pass).
    @Test(arguments: [true, false])
    func theAppsDeleteSettlesTheConflictOfAnEarlierChange(_ beforeTheAnswer: Bool) async throws {
        var fixture = try StoreFixture("conflicts-app-delete-settles")
        let store = fixture.store
        let deleteTheTask = { try await store.delete(type: "task", id: "t1") }
        let update = try await Self.updateOfATaskTheServerDeleted(store, .askApp, beforeTheAnswer: beforeTheAnswer ? deleteTheTask : {})
        if !beforeTheAnswer {
            #expect(try store.conflicts().map(\.conflict.intentOffset) == [update])
            try await deleteTheTask()
        }
        #expect(try store.conflicts().isEmpty)
        let delete = try #require(try store.outbox().first).offset
        try await store.record([(delete, .rejected(code: "ENTITY_NOT_FOUND", message: "no task/t1"))])
        try await store.applyPulledPage([PulledChange(.delete, entityType: "task", entityID: "t1", serverVersion: 2)], cursor: "c2")
        let error = await #expect(throws: LogStoreError.self) { try await store.resolveConflict(intentOffset: update, .keepLocal) }
        #expect(error?.code == .notFound)
        let conflict = try Self.lastConflict(store)
        #expect(conflict?.intentOffset == update)
        #expect(conflict?.resolution == .keepLocal)
        #expect(conflict?.resolvedFields == [:])
        for pass in ["settled", "reopened and rebuilt"] {
            #expect(try fixture.store.outbox().isEmpty, "\(pass)")
            #expect(try fixture.store.conflicts().isEmpty, "\(pass)")
            #expect(try fixture.store.get(type: "task", id: "t1") == nil, "\(pass)")
            if pass == "settled" {
                try fixture.reopen()
                try await fixture.store.rebuildProjections()
            }
        }
    }

    /// The decisions of `aKeptCreateOfAnEntityTheServerHasStaysVisible`,
    /// each with what the app sees once it is recorded.
    static let keptCreates: [(ConflictDecision, Fields)] = [
        (.keepLocal, ["title": "mine", "notes": "theirs", "done": true]),
        (.merged(["title": "mine", "notes": "theirs"]), ["title": "mine", "notes": "theirs", "done": true]),
        // A field the merge leaves out is null, as an update would set it.
        (.merged(["title": "both"]), ["title": "both", "notes": .null, "done": true]),
        // The app's later update goes over the settled state: it set `done`
        // after the create, so its value wins over the merge's.
        (.merged(["title": "mine", "done": false]), ["title": "mine", "notes": .null, "done": true]),
    ]

    /// A create the server refused because the entity exists (another
    /// replica made one with the same id), kept or merged by the strategy,
    /// with the app's later update of the entity still pending. This store
    /// has not pulled the server's state, so an update resolution would
    /// apply over no base (a `conflict` entry confirms nothing,
    /// `storage.md`, section 15), and the entity the app just created was
    /// gone from `get`, `all` and `count` until a pull brought the
    /// server's state. The resolution is a create of the whole settled
    /// state with the later update over it, made against the server's
    /// version, which the server applies as a replace
    /// (`sync-protocol.md`, section 7): the app sees it at once, and
    /// after the pull, the reopen and the replay.
    @Test(arguments: keptCreates)
    func aKeptCreateOfAnEntityTheServerHasStaysVisible(_ decision: ConflictDecision, _ seen: Fields) async throws {
        var fixture = try StoreFixture("conflicts-keep-local-create-exists")
        let store = fixture.store
        try await store.create(type: "task", id: "settings", fields: ["title": "mine"])
        try await store.update(type: "task", id: "settings", changes: ["done": true])
        let create = try #require(try store.outbox().first)
        let exists = ServerState(serverVersion: 1, deleted: false, data: ["title": "theirs", "notes": "theirs"])
        try await store.record([(create.offset, .conflict(exists, message: "exists"))]) { _ in decision }
        let resolution = try #require(try store.outbox().last?.intent)
        #expect(resolution.operation == .create)
        #expect(resolution.fields == seen)
        #expect(resolution.baseVersion == 1)
        #expect(try store.get(type: "task", id: "settings")?.fields == seen)
        #expect(try store.count(type: "task") == 1)
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "task", entityID: "settings", serverVersion: 1, fields: exists.data)], cursor: "c1")
        for pass in ["pulled", "reopened and rebuilt"] {
            #expect(try fixture.store.get(type: "task", id: "settings")?.fields == seen, "\(pass)")
            if pass == "pulled" {
                try fixture.reopen()
                try await fixture.store.rebuildProjections()
            }
        }
    }

    /// A create the server refused because another replica made one with
    /// the same id, settled by the app's rule on the server's state: as
    /// over a base, nothing is pushed, though this store has no base of the
    /// entity. Pushed, it would be a create of the server's own fields,
    /// which the server applies as a replace: a new version in every
    /// replica's feed and a new life of the entity, which makes updates
    /// made against the old one conflict (`sync-protocol.md`, section 7).
    @Test(arguments: [ConflictDecision.merged(["title": "theirs", "notes": "theirs"]), .custom(["title": "theirs", "notes": "theirs"])])
    func aRefusedCreateSettledOnTheServersStatePushesNothing(_ decision: ConflictDecision) async throws {
        let fixture = try StoreFixture("conflicts-create-settled-on-server")
        let store = fixture.store
        try await store.create(type: "task", id: "settings", fields: ["title": "mine"])
        let create = try #require(try store.outbox().first)
        let exists = ServerState(serverVersion: 1, deleted: false, data: ["title": "theirs", "notes": "theirs"])
        try await store.record([(create.offset, .conflict(exists, message: "exists"))]) { _ in decision }
        #expect(try store.conflicts().isEmpty)
        #expect(try store.outbox().isEmpty)
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "task", entityID: "settings", serverVersion: 1, fields: exists.data)], cursor: "c1")
        #expect(try store.get(type: "task", id: "settings")?.fields == exists.data)
    }

    /// A waiting conflict of an entity the server deleted whose entry has
    /// empty `resolved_fields` (written by an earlier store, or too large
    /// to keep) is decided over the base the store has then, with the
    /// refused intent applied again and the app's later updates over it
    /// (`storage.md`, section 7): `keepLocal` brings the entity back as the
    /// app saw it, not as the empty `resolved_fields` nor as the confirmed
    /// fields without the refused update.
    @Test func keepLocalOfAWaitingConflictWithoutTheAppsStateAppliesTheRefusedUpdateAgain() async throws {
        var fixture = try StoreFixture("conflicts-keep-local-no-resolved-fields")
        let store = fixture.store
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "task", entityID: "t1", serverVersion: 1, fields: ["title": "v1", "notes": "n", "done": false])],
            cursor: "c1")
        try await store.update(type: "task", id: "t1", changes: ["title": "from a"])
        let update = try #require(try store.outbox().first).offset
        // What an earlier store wrote: the reject, then a pending conflict
        // that keeps only the server's state.
        try await store.record([(update, .rejected(code: "CONFLICT", message: "deleted"))])
        _ = try await store.log.append(
            .conflict(
                Conflict(
                    intentOffset: update, entityType: "task", entityID: "t1", serverVersion: 2, serverDeleted: true,
                    serverFields: [:], resolution: .pending)))
        try await store.record([])
        #expect(try store.conflicts().map(\.conflict.resolvedFields) == [[:]])
        try await store.update(type: "task", id: "t1", changes: ["done": true])
        try await store.resolveConflict(intentOffset: update, .keepLocal)
        let seen: Fields = ["title": "from a", "notes": "n", "done": true]
        let resolution = try #require(try store.outbox().last?.intent)
        #expect(resolution.operation == .create)
        #expect(resolution.fields == seen)
        #expect(resolution.baseVersion == 2)
        #expect(try store.get(type: "task", id: "t1")?.fields == seen)
        try fixture.reopen()
        try await fixture.store.rebuildProjections()
        #expect(try fixture.store.get(type: "task", id: "t1")?.fields == seen)
    }

    /// The app deletes a task and creates it again; the server refuses the
    /// delete, another replica having changed the task. The later create
    /// replaced the whole state, so the decision pushes nothing after it
    /// (`storage.md`, section 7): the delete that `keepLocal` would push
    /// again, or the one `custom(nil)` asks for, would be applied after the
    /// create and delete the entity the app has just made. The `conflict`
    /// entry records what the app sees as the state settled on.
    @Test(arguments: [ConflictDecision.keepLocal, .custom(nil)])
    func aRefusedDeleteTheAppFollowedWithACreatePushesNoResolution(_ decision: ConflictDecision) async throws {
        var fixture = try StoreFixture("conflicts-delete-then-create")
        let store = fixture.store
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "task", entityID: "t1", serverVersion: 1, fields: ["title": "v1"])], cursor: "c1")
        try await store.delete(type: "task", id: "t1")
        try await store.create(type: "task", id: "t1", fields: ["title": "again"])
        let (delete, create) = try { () throws -> (UInt64, UInt64) in
            let pending = try store.outbox().map(\.offset)
            return (pending[0], pending[1])
        }()
        let changed = ServerState(serverVersion: 2, deleted: false, data: ["title": "theirs"])
        try await store.record([(delete, .conflict(changed, message: "changed"))]) { _ in decision }
        let conflict = try Self.lastConflict(store)
        #expect(conflict?.resolution != .pending)
        #expect(conflict?.resolvedFields == ["title": "again"])
        for pass in ["settled", "reopened and rebuilt"] {
            #expect(try fixture.store.outbox().map(\.offset) == [create], "\(pass)")
            #expect(try fixture.store.get(type: "task", id: "t1")?.fields == ["title": "again"], "\(pass)")
            if pass == "settled" {
                try fixture.reopen()
                try await fixture.store.rebuildProjections()
            }
        }
    }

    /// `keepLocal` of an update whose fields the app's later updates all
    /// set again pushes nothing: the later updates carry the app's values,
    /// and an empty update would still be applied by the server as a new
    /// version and a change in every replica's feed (`sync-protocol.md`,
    /// section 7).
    @Test func keepLocalOfAnUpdateWhoseFieldsTheAppSetAgainPushesNothing() async throws {
        let fixture = try StoreFixture("conflicts-keep-local-all-set-again")
        let store = fixture.store
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "task", entityID: "t1", serverVersion: 1, fields: ["title": "v1", "done": false])],
            cursor: "c1")
        try await store.update(type: "task", id: "t1", changes: ["title": "from a"])
        try await store.update(type: "task", id: "t1", changes: ["title": "from a, again"])
        let (first, second) = try { () throws -> (UInt64, UInt64) in
            let pending = try store.outbox().map(\.offset)
            return (pending[0], pending[1])
        }()
        let changed = ServerState(serverVersion: 2, deleted: false, data: ["title": "theirs", "done": true])
        try await store.record([(first, .conflict(changed, message: "title changed"))]) { _ in .keepLocal }
        #expect(try store.conflicts().isEmpty)
        #expect(try store.outbox().map(\.offset) == [second])
        #expect(try store.get(type: "task", id: "t1")?.fields == ["title": "from a, again", "done": false])
    }

    /// `keepLocal` of a delete the server refused with its entity deleted
    /// (the protocol allows a `CONFLICT` with a deleted state): both sides
    /// agree it is gone, so nothing is pushed. A delete pushed again would
    /// only be answered `ENTITY_NOT_FOUND`.
    @Test func keepLocalOfADeleteTheServerAlsoDeletedPushesNothing() async throws {
        let fixture = try StoreFixture("conflicts-keep-local-delete-deleted")
        let store = fixture.store
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "task", entityID: "t1", serverVersion: 1, fields: ["title": "v1"])], cursor: "c1")
        try await store.delete(type: "task", id: "t1")
        let delete = try #require(try store.outbox().first).offset
        let deleted = ServerState(serverVersion: 2, deleted: true, data: [:])
        try await store.record([(delete, .conflict(deleted, message: "deleted"))]) { _ in .keepLocal }
        #expect(try store.conflicts().isEmpty)
        #expect(try store.outbox().isEmpty)
        // A `conflict` entry confirms nothing (`storage.md`, section 15):
        // the pull of the server's delete does.
        try await store.applyPulledPage([PulledChange(.delete, entityType: "task", entityID: "t1", serverVersion: 2)], cursor: "c2")
        #expect(try store.get(type: "task", id: "t1") == nil)
    }

    /// The last `conflict` entry of the log, or nil when it has none.
    static func lastConflict(_ store: Store) throws -> Conflict? {
        var offset = try store.log.lastOffset()
        while offset > 0 {
            if case .conflict(let found)? = try store.log.entry(at: offset)?.body { return found }
            offset -= 1
        }
        return nil
    }

    /// Task t1 is pulled at version 1 with three fields, and the app changes
    /// its title; the server, which deleted it at version 2, answers the
    /// push `CONFLICT` (after `beforeTheAnswer`, the app's writes while the
    /// push was on its way), and `decision` is recorded for it.
    /// - Returns: the offset of the refused update.
    static func updateOfATaskTheServerDeleted(
        _ store: Store, _ decision: ConflictDecision, beforeTheAnswer: () async throws -> Void = {}
    ) async throws -> UInt64 {
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "task", entityID: "t1", serverVersion: 1, fields: ["title": "v1", "notes": "n", "done": false])],
            cursor: "c1")
        try await store.update(type: "task", id: "t1", changes: ["title": "from a"])
        let update = try #require(try store.outbox().first)
        try await beforeTheAnswer()
        let deleted = ServerState(serverVersion: 2, deleted: true, data: [:])
        try await store.record([(update.offset, .conflict(deleted, message: "deleted"))]) { _ in decision }
        return update.offset
    }
}
