import Foundation
@testable import LogStore
import LogFormat
import LogSync
import LogTesting
import Synchronization
import Testing

/// The store's sync-side API as the sync engine uses it: batches, answers,
/// retries, failures and pulled pages, each checked against a replay.
@Suite struct SyncSideTests {
    /// The derived tables equal a replay of the log.
    private func expectReplayAgrees(_ store: Store, _ label: String = "") async throws {
        let incremental = try store.derivedTables()
        try await store.rebuildProjections(entriesPerTransaction: 1)
        #expect(try store.derivedTables() == incremental, "\(label)")
    }

    @Test func aBatchSendsTheGreatestAckedVersionOfEarlierIntents() async throws {
        let fixture = try StoreFixture("sync-base")
        let store = fixture.store
        let id = try await store.create(type: "te", fields: ["a": 1])
        try await store.update(type: "te", id: id, changes: ["a": 2])
        try await store.update(type: "te", id: id, changes: ["a": 3])
        var batch = try store.pushBatch(limit: 10, now: 0)
        #expect(batch.map(\.intent.baseVersion) == [0, 0, 0])
        try await store.record([(batch[0].offset, .acknowledged(.applied, serverVersion: 1))])
        batch = try store.pushBatch(limit: 10, now: 0)
        #expect(batch.map(\.intent.baseVersion) == [1, 1])
        try await store.record([(batch[0].offset, .rejected(code: "VALIDATION_ERROR", message: "no"))])
        batch = try store.pushBatch(limit: 10, now: 0)
        #expect(batch.map(\.intent.baseVersion) == [1])
        try await expectReplayAgrees(store)
    }

    /// A resync resets the acked version with the base (`Format/storage.md`
    /// section 15, `resync`: "its acked version (it becomes 0: the server's
    /// versions may have started over)"): the intent still pending is pushed
    /// against version 0, not against the version the earlier ack gave, and
    /// so is it after a replay.
    @Test func aResyncResetsTheAckedVersionThePendingIntentsArePushedAgainst() async throws {
        let fixture = try StoreFixture("sync-resync-acked")
        let store = fixture.store
        let id = try await store.create(type: "te", fields: ["a": 1])
        try await store.update(type: "te", id: id, changes: ["a": 2])
        let batch = try store.pushBatch(limit: 10, now: 0)
        try #require(batch.count == 2)
        try await store.record([(batch[0].offset, .acknowledged(.applied, serverVersion: 3))])
        #expect(try store.pushBatch(limit: 10, now: 0).map(\.intent.baseVersion) == [3])
        try await store.resync(reason: "test")
        #expect(try store.pushBatch(limit: 10, now: 0).map(\.intent.baseVersion) == [0])
        try await expectReplayAgrees(store)
        #expect(try store.pushBatch(limit: 10, now: 0).map(\.intent.baseVersion) == [0])
    }

    /// An ack at a lower version than one already recorded for its entity
    /// (answers recorded out of order) leaves the acked version at the
    /// greater of the two (`Format/storage.md` section 15, `ack`: "R's acked
    /// version becomes the greater of its acked version and v"), so the
    /// intent still pending is pushed against the later version.
    @Test func anAckAtALowerVersionKeepsTheGreaterAckedVersion() async throws {
        let fixture = try StoreFixture("sync-acked-max")
        let store = fixture.store
        let id = try await store.create(type: "te", fields: ["a": 1])
        try await store.update(type: "te", id: id, changes: ["a": 2])
        try await store.update(type: "te", id: id, changes: ["a": 3])
        let batch = try store.pushBatch(limit: 10, now: 0)
        try #require(batch.count == 3)
        try await store.record([(batch[1].offset, .acknowledged(.applied, serverVersion: 2))])
        try await store.record([(batch[0].offset, .acknowledged(.applied, serverVersion: 1))])
        #expect(try store.pushBatch(limit: 10, now: 0).map(\.intent.baseVersion) == [2])
        #expect(try store.get(type: "te", id: id)?.fields == ["a": 3])
        try await expectReplayAgrees(store)
    }

    /// An update made before the ack of its entity's create is pushed
    /// against the acknowledged version (the batch above), and the base
    /// that ack confirmed is the state it was pushed against: a conflict on
    /// it tells the strategy so (`ConflictCase.baseIsCommonAncestor`).
    /// Read as an intent made against no version, it was not, and
    /// `fieldMerge(prefer: .remote)` left to the app a field that only this
    /// replica had changed.
    @Test func anUpdateMadeBeforeItsCreatesAckConflictsOverTheAcknowledgedBase() async throws {
        let fixture = try StoreFixture("sync-acked-ancestor")
        let store = fixture.store
        try await store.create(type: "task", id: "t1", fields: ["title": "v1", "done": false])
        try await store.update(type: "task", id: "t1", changes: ["done": true])
        let batch = try store.pushBatch(limit: 10, now: 0)
        try #require(batch.map(\.intent.baseVersion) == [0, 0])
        try await store.record([(batch[0].offset, .acknowledged(.applied, serverVersion: 1))])
        #expect(try store.pushBatch(limit: 10, now: 0).map(\.intent.baseVersion) == [1])
        // Another replica renamed the task and set `done` to what it was.
        let server = ServerState(serverVersion: 2, deleted: false, data: ["title": "theirs", "done": false])
        let cases = Mutex<[ConflictCase]>([])
        try await store.record([(batch[1].offset, .conflict(server, message: "done changed"))]) { conflict in
            cases.withLock { $0.append(conflict) }
            return ConflictStrategy.fieldMerge(prefer: .remote).decide(conflict)
        }
        #expect(cases.withLock { $0.map(\.baseIsCommonAncestor) }.allSatisfy { $0 })
        #expect(cases.withLock { $0.map(\.base) }.allSatisfy { $0 == ["title": "v1", "done": false] })
        #expect(try store.conflicts().isEmpty)
        let resolution = try #require(try store.outbox().last?.intent)
        #expect(resolution.operation == .update && resolution.fields == ["done": true])
        #expect(resolution.baseVersion == 2)
        try await expectReplayAgrees(store)
    }

    @Test func aLateAckSettlesAFailedIntentAndReleasesItsEntity() async throws {
        let fixture = try StoreFixture("sync-failed-ack")
        let store = fixture.store
        let id = try await store.create(type: "te", fields: ["a": 1])
        try await store.update(type: "te", id: id, changes: ["a": 2])
        try await store.create(type: "te", fields: ["b": 1])
        let all = try store.outbox()
        try await store.markFailed(offsets: [all[0].offset], error: "HTTP 400")
        #expect(try store.pushBatch(limit: 10, now: 0).map(\.offset) == [all[2].offset])
        #expect(try store.outboxSummary().failedCount == 1)
        let recorded = try await store.record([(all[0].offset, .acknowledged(.applied, serverVersion: 1))])
        #expect(recorded.settled == [all[0].offset])
        #expect(try store.outboxSummary().failedCount == 0)
        #expect(try store.outboxSummary().pendingCount == 2)
        #expect(try store.pushBatch(limit: 10, now: 0).map(\.offset) == [all[1].offset, all[2].offset])
        // A retry for the acked intent changes nothing.
        try await store.scheduleRetry(offsets: [all[0].offset], error: "late", at: 9, attemptsMax: 1)
        try await store.markFailed(offsets: [all[0].offset], error: "late")
        #expect(try store.outboxCount() == 2)
        try await store.retryFailed()
        #expect(try store.outboxCount() == 2)
        try await expectReplayAgrees(store)
    }

    @Test func answersForOffsetsNotPendingAreSkippedAndRepeatsSettleOnce() async throws {
        let fixture = try StoreFixture("sync-answers-other")
        let store = fixture.store
        _ = try await store.create(type: "te", fields: ["a": 1])
        let offset = try #require(try store.outbox().first?.offset)
        let last = try store.log.lastOffset()
        let recorded = try await store.record([
            (offset + 100, .acknowledged(.applied, serverVersion: 1)),
            (offset, .acknowledged(.applied, serverVersion: 1)),
            (offset, .rejected(code: "VALIDATION_ERROR", message: "no")),
            (offset, .conflict(ServerState(serverVersion: 2, deleted: false, data: ["a": 5]), message: "x")),
            (last + 1, .acknowledged(.applied, serverVersion: 1)),
        ])
        #expect(recorded.settled == [offset])
        #expect(try store.log.lastOffset() == last + 1)
        try await expectReplayAgrees(store)
    }

    @Test func aPageNamingAnEntityTwiceKeepsTheNewestVersion() async throws {
        let fixture = try StoreFixture("sync-pulled")
        let store = fixture.store
        try await store.applyPulledPage(
            [
                PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 2, fields: ["a": 1]),
                PulledChange(.delete, entityType: "te", entityID: "x", serverVersion: 3),
                PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1, fields: ["a": 0]),
                PulledChange(.upsert, entityType: "te", entityID: "y", serverVersion: 1, fields: ["b": 1]),
                PulledChange(.delete, entityType: "te", entityID: "y", serverVersion: 2),
                PulledChange(.upsert, entityType: "te", entityID: "y", serverVersion: 3, fields: ["b": 2]),
            ], cursor: "c1")
        #expect(try store.get(type: "te", id: "x") == nil)
        #expect(try store.get(type: "te", id: "y")?.fields == ["b": 2])
        #expect(try store.count(type: "te") == 1)
        try await store.applyPulledPage([], cursor: "c2")
        #expect(try store.pullCursor() == "c1")
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "te", entityID: "y", serverVersion: 3, fields: ["b": 2])], cursor: "c1")
        await #expect(throws: LogStoreError.self) { try await store.applyPulledPage([], cursor: "") }
        #expect(try store.pullCursor() == "c1")
        try await expectReplayAgrees(store)
    }

    /// storage.md section 7, `remote`: `fields` is empty for a delete. A
    /// server that sends fields with a delete does not get them into the
    /// log, where a compaction or an export would carry them on.
    @Test func aPulledDeleteIsLoggedWithoutFields() async throws {
        let fixture = try StoreFixture("sync-pulled-delete-fields")
        let store = fixture.store
        try await store.applyPulledPage(
            [PulledChange(.delete, entityType: "te", entityID: "x", serverVersion: 1, fields: ["a": 1])], cursor: "c1")
        guard case .remote(let remote) = try store.log.entry(at: 1)?.body else {
            Issue.record("no remote entry at offset 1")
            return
        }
        #expect(remote.operation == .delete && remote.fields.isEmpty)
        #expect(try store.get(type: "te", id: "x") == nil)
    }

    /// A page pulled from a cursor the store no longer has (a resync forgot
    /// it while the page came) is not applied, an empty one neither: the
    /// pull goes on from the store's cursor. One pulled from it is.
    @Test func aPageIsAppliedOnlyWhileItsPullCursorIsTheStores() async throws {
        let fixture = try StoreFixture("sync-pulled-from")
        let store = fixture.store
        let first = [PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1, fields: ["a": 1])]
        #expect(try await store.applyPulledPage(first, cursor: "c1", pulledFrom: nil))
        try await store.resync(reason: "the app's own")
        let later = [PulledChange(.upsert, entityType: "te", entityID: "y", serverVersion: 1, fields: ["b": 1])]
        let last = try store.log.lastOffset()
        #expect(try await store.applyPulledPage(later, cursor: "c2", pulledFrom: "c1") == false)
        #expect(try await store.applyPulledPage([], cursor: "c2", pulledFrom: "c1") == false)
        #expect(try store.log.lastOffset() == last)
        #expect(try store.pullCursor() == nil)
        #expect(try store.count(type: "te") == 0)
        #expect(try await store.applyPulledPage([], cursor: "c1", pulledFrom: nil))
        #expect(try await store.applyPulledPage(first, cursor: "c1", pulledFrom: nil))
        #expect(try await store.applyPulledPage(later, cursor: "c2", pulledFrom: "c1"))
        #expect(try store.pullCursor() == "c2")
        #expect(try store.all(type: "te").map(\.id) == ["x", "y"])
        try await expectReplayAgrees(store)
    }

    @Test func aKeepLocalResolutionIsPushedOverTheLaterAckOfItsBatch() async throws {
        let fixture = try StoreFixture("sync-conflict-batch")
        let store = fixture.store
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1, fields: ["a": 1, "b": 1])], cursor: "c1")
        try await store.update(type: "te", id: "x", changes: ["a": 2])
        try await store.update(type: "te", id: "x", changes: ["b": 2])
        let batch = try store.pushBatch(limit: 10, now: 0)
        #expect(batch.map(\.intent.baseVersion) == [1, 1])
        let server = ServerState(serverVersion: 2, deleted: false, data: ["a": 9, "b": 1])
        let recorded = try await store.record(
            [(batch[0].offset, .conflict(server, message: "x")), (batch[1].offset, .acknowledged(.applied, serverVersion: 3))],
            resolve: { _ in .keepLocal })
        #expect(recorded.settled == batch.map(\.offset))
        let next = try store.pushBatch(limit: 10, now: 0)
        #expect(next.count == 1)
        #expect(next.first?.intent.baseVersion == 3)
        #expect(next.first?.intent.fields == ["a": 2])
        try await expectReplayAgrees(store)
    }

    /// `nextRetry(after:)` is the earliest retry time still ahead: an intent
    /// already due, a failed one and one with no retry count for nothing,
    /// and a time further off than `retryWaitMax` is due now, as
    /// `pushBatch` takes it.
    @Test func theNextRetryIsTheEarliestRetryTimeStillAhead() async throws {
        let fixture = try StoreFixture("sync-next-retry")
        let store = fixture.store
        for n in 0..<4 { try await store.create(type: "te", fields: ["n": .int(Int64(n))]) }
        let all = try store.outbox().map(\.offset)
        #expect(try store.nextRetry(after: 1_000) == nil)
        try await store.scheduleRetry(offsets: [all[0]], error: "HTTP 500", at: 900, attemptsMax: 10)
        try await store.scheduleRetry(offsets: [all[1]], error: "HTTP 500", at: 5_000, attemptsMax: 10)
        try await store.scheduleRetry(offsets: [all[2]], error: "HTTP 500", at: 3_000, attemptsMax: 10)
        try await store.markFailed(offsets: [all[3]], error: "HTTP 400")
        #expect(try store.nextRetry(after: 1_000) == 3_000)
        #expect(try store.nextRetry(after: 3_000) == 5_000)
        #expect(try store.nextRetry(after: 5_000) == nil)
        #expect(try store.nextRetry(after: 1_000, retryWaitMax: 3_000) == 3_000, "5,000 is 4,000 ahead: due now")
        #expect(try store.nextRetry(after: 1_000, retryWaitMax: 1_000) == nil)
    }

    /// `dueCount` counts what `pushBatch` would return, batches put
    /// together: not an intent waiting for its retry or failed, nor the
    /// later intents on their entities.
    @Test func theDueCountIsWhatPushBatchesWouldSend() async throws {
        let fixture = try StoreFixture("sync-due-count")
        let store = fixture.store
        var ids: [String] = []
        for n in 0..<3 { ids.append(try await store.create(type: "te", fields: ["n": .int(Int64(n))])) }
        for id in ids { try await store.update(type: "te", id: id, changes: ["n": -1]) }
        let creates = try store.outbox().prefix(3).map(\.offset)
        #expect(try store.dueCount(now: 1_000) == 6, "none holds another back")
        try await store.scheduleRetry(offsets: [creates[0]], error: "HTTP 500", at: 5_000, attemptsMax: 10)
        try await store.markFailed(offsets: [creates[1]], error: "HTTP 400")
        #expect(try store.dueCount(now: 1_000) == 2)
        #expect(try store.dueCount(now: 1_000) == store.pushBatch(limit: 100, now: 1_000).count)
        #expect(try store.dueCount(now: 5_000) == 4)
        #expect(try store.dueCount(now: 1_000, retryWaitMax: 3_000) == 4, "a retry further off than the longest wait is due")
        #expect(try store.pushBatch(limit: 1, now: 5_000).map(\.offset) == [creates[0]])
    }

    @Test func retriesCountPerRequestAndFailAtTheMaximum() async throws {
        let fixture = try StoreFixture("sync-retry-counts")
        let store = fixture.store
        let id = try await store.create(type: "te", fields: ["a": 1])
        try await store.update(type: "te", id: id, changes: ["a": 2])
        let all = try store.outbox()
        try await store.scheduleRetry(offsets: all.map(\.offset), error: "503", at: 100, attemptsMax: 2)
        #expect(try store.pushBatch(limit: 10, now: 99).isEmpty)
        #expect(try store.pushBatch(limit: 10, now: 100).count == 2)
        #expect(try store.outboxSummary().nextAttemptAt == 100)
        try await store.scheduleRetry(offsets: [all[0].offset], error: "503", at: 200, attemptsMax: 2)
        #expect(try store.outboxSummary().failedCount == 1)
        #expect(try store.pushBatch(limit: 10, now: 1000).isEmpty)
        try await store.retryFailed()
        #expect(try store.pushBatch(limit: 10, now: 1000).count == 2)
        try await expectReplayAgrees(store)
    }

    /// `retryFailed` returns the `failed` rows alone to their initial state
    /// (`Format/storage.md` section 15, `outbox`: "every `failed` row
    /// returns to the initial state"): a pending intent waiting for its
    /// retry keeps its attempts, its error and its time.
    @Test func retryingFailedIntentsLeavesAWaitingRetryAsItIs() async throws {
        let fixture = try StoreFixture("sync-retry-failed-only")
        let store = fixture.store
        try await store.create(type: "te", fields: ["a": 1])
        try await store.create(type: "te", fields: ["b": 1])
        let all = try store.outbox().map(\.offset)
        try await store.markFailed(offsets: [all[0]], error: "HTTP 400")
        try await store.scheduleRetry(offsets: [all[1]], error: "HTTP 503", at: 5_000, attemptsMax: 10)
        try await store.retryFailed()
        var waiting = OutboxState()
        waiting.attempts = 1
        waiting.nextAttemptAt = 5_000
        waiting.lastError = "HTTP 503"
        #expect(try store.outbox().map(\.state) == [OutboxState(), waiting])
        #expect(try store.pushBatch(limit: 10, now: 1_000).map(\.offset) == [all[0]])
    }

    /// `Format/storage.md` section 15: when an intent's failed attempts
    /// reach the maximum, its row is `failed` with the next attempt 0,
    /// "instead of a time": a failed intent waits for the app, not for a
    /// retry time, and the row holds the bytes the format gives it.
    @Test func anIntentOutOfRetriesKeepsNoNextAttemptTime() async throws {
        let fixture = try StoreFixture("sync-out-of-retries")
        let store = fixture.store
        _ = try await store.create(type: "te", fields: ["a": 1])
        let offset = try #require(try store.outbox().first?.offset)
        try await store.scheduleRetry(offsets: [offset], error: "HTTP 503", at: 5_000, attemptsMax: 1)
        let state = try #require(try store.outbox().first?.state)
        #expect(state.status == .failed && state.attempts == 1 && state.lastError == "HTTP 503")
        #expect(state.nextAttemptAt == 0, "no retry time for a failed intent")
        try await expectReplayAgrees(store)
    }

    /// A failed attempt counts only for a pending intent (`storage.md`
    /// section 15: "each `pending` row of the request"): an intent already
    /// failed, named by a later failure, keeps its count, its error and its
    /// status until the app retries it, and gets no retry time.
    @Test func aFailedIntentNamedByALaterFailureIsLeftAsItIs() async throws {
        let fixture = try StoreFixture("sync-failed-again")
        let store = fixture.store
        _ = try await store.create(type: "te", fields: ["a": 1])
        let offset = try #require(try store.outbox().first?.offset)
        try await store.markFailed(offsets: [offset], error: "HTTP 400")
        let failed = try #require(try store.outbox().first?.state)
        #expect(failed.status == .failed && failed.attempts == 1)
        try await store.scheduleRetry(offsets: [offset], error: "HTTP 503", at: 5_000, attemptsMax: 10)
        try await store.markFailed(offsets: [offset], error: "HTTP 403")
        #expect(try store.outbox().first?.state == failed)
    }

    /// `outboxSummary().nextAttemptAt` is the earliest retry time set on a
    /// pending intent: one never retried (next attempt 0, due now) waits
    /// for no retry, so a fresh outbox has none, and a retry among fresh
    /// intents gives its own time, not 0 ("nil when none waits for a retry").
    @Test func theSummarysNextAttemptIgnoresIntentsDueNow() async throws {
        let fixture = try StoreFixture("sync-summary-next-attempt")
        let store = fixture.store
        for n in 0..<3 { _ = try await store.create(type: "te", fields: ["n": .int(Int64(n))]) }
        #expect(try store.outboxSummary().nextAttemptAt == nil, "none waits for a retry")
        let first = try #require(try store.outbox().first?.offset)
        try await store.scheduleRetry(offsets: [first], error: "HTTP 503", at: 5_000, attemptsMax: 10)
        #expect(try store.outboxSummary().nextAttemptAt == 5_000)
    }
}

extension SyncSideTests {
    /// Random sync-side steps; after each, the replay agrees, the summary
    /// agrees with the outbox, and a push batch keeps each entity's order.
    @Test func randomSyncStepsKeepSummaryBatchesAndReplayInStep() async throws {
        for seed in UInt64(1)...60 {
            var random = RandomEntries(seed: seed)
            var fixture = try StoreFixture("sync-random")
            var versions: [String: UInt64] = [:]
            var cursor = 0
            var now: UInt64 = 1000
            for step in 0..<30 {
                let store = fixture.store
                let ids = ["a", "b", "c"]
                let id = ids[random.int(0...2)]
                let label = "seed \(seed) step \(step)"
                switch random.int(0...11) {
                case 0, 1:
                    if try store.get(type: "te", id: id) == nil {
                        try await store.create(type: "te", id: id, fields: ["n": .int(Int64(step))])
                    } else {
                        try await store.update(type: "te", id: id, changes: ["m\(random.int(0...2))": .int(Int64(step))])
                    }
                case 2:
                    if try store.get(type: "te", id: id) != nil { try await store.delete(type: "te", id: id) }
                case 3, 4, 5:
                    let batch = try store.pushBatch(limit: random.int(1...5), now: now)
                    var answers: [(offset: UInt64, outcome: PushOutcome)] = []
                    for item in batch {
                        let key = item.intent.entityID
                        switch random.int(0...5) {
                        case 0, 1, 2:
                            versions[key] = max(versions[key, default: 0], item.intent.baseVersion) + 1
                            answers.append((item.offset, .acknowledged(.applied, serverVersion: versions[key]!)))
                        case 3:
                            answers.append((item.offset, .rejected(code: "VALIDATION_ERROR", message: "no")))
                        case 4:
                            versions[key, default: 0] += 1
                            answers.append((item.offset, .conflict(ServerState(serverVersion: versions[key]!, deleted: random.int(0...2) == 0, data: ["s": 1]), message: "c")))
                        default:
                            break
                        }
                        if random.int(0...5) == 0, let last = answers.last { answers.append(last) }
                    }
                    let decisions: [ConflictDecision] = [.askApp, .keepLocal, .keepRemote, .merged(["z": 1]), .custom(nil)]
                    let pick = random.int(0...4)
                    try await store.record(answers) { _ in decisions[pick] }
                    let answered = Set(answers.map(\.offset))
                    let rest = batch.map(\.offset).filter { !answered.contains($0) }
                    if !rest.isEmpty {
                        if random.int(0...3) == 0 {
                            try await store.markFailed(offsets: rest, error: "400")
                        } else {
                            try await store.scheduleRetry(offsets: rest, error: "503", at: now + UInt64(random.int(0...20)), attemptsMax: 3)
                        }
                    }
                case 6, 7:
                    cursor += 1
                    var changes: [PulledChange] = []
                    for _ in 0..<random.int(1...4) {
                        let key = ids[random.int(0...2)]
                        versions[key, default: 0] += UInt64(random.int(0...1))
                        let version = max(1, versions[key, default: 0]) - UInt64(random.int(0...1)) * (versions[key, default: 0] > 1 ? 1 : 0)
                        changes.append(
                            random.int(0...3) == 0
                                ? PulledChange(.delete, entityType: "te", entityID: key, serverVersion: version)
                                : PulledChange(.upsert, entityType: "te", entityID: key, serverVersion: version, fields: ["p": .int(Int64(step))]))
                    }
                    try await store.applyPulledPage(changes, cursor: "c\(cursor)")
                case 8:
                    try await store.retryFailed()
                case 9:
                    now += UInt64(random.int(0...15))
                case 10:
                    for waiting in try store.conflicts() where random.int(0...1) == 0 {
                        try await store.resolveConflict(intentOffset: waiting.conflict.intentOffset, .keepLocal)
                    }
                default:
                    try fixture.reopen()
                }
                let store2 = fixture.store
                let outbox = try store2.outbox()
                let summary = try store2.outboxSummary()
                #expect(summary.pendingCount == outbox.filter { $0.state.status == .pending }.count, "\(label)")
                #expect(summary.failedCount == outbox.filter { $0.state.status == .failed }.count, "\(label)")
                #expect(try store2.outboxCount() == outbox.count, "\(label)")
                let batch = try store2.pushBatch(limit: 100, now: now)
                #expect(batch.map(\.offset) == batch.map(\.offset).sorted(), "\(label)")
                let inBatch = Set(batch.map(\.offset))
                for item in batch {
                    let earlier = outbox.filter { $0.offset < item.offset && $0.intent.entityID == item.intent.entityID }
                    #expect(earlier.allSatisfy { inBatch.contains($0.offset) }, "\(label): \(item.offset) ahead of an earlier intent")
                }
                let incremental = try store2.derivedTables()
                try await store2.rebuildProjections(entriesPerTransaction: 1 + step % 3)
                #expect(try store2.derivedTables() == incremental, "\(label): replay differs")
                // The same entity's pending offsets equal the outbox's.
                for id in ids {
                    let pending = outbox.filter { $0.intent.entityID == id }.count
                    #expect((try store2.get(type: "te", id: id)?.pendingIntentCount ?? pending) == pending, "\(label): \(id) pending count")
                }
            }
            fixture.store.close()
        }
    }
}

/// A server that keeps the protocol's rules (section 7), for one client.
private struct ServerModel {
    struct Entity {
        var version: UInt64 = 0
        var exists = false
        var fields: [String: Value] = [:]
        var lastChanged: [String: UInt64] = [:]
        var created: UInt64 = 0
    }

    var entities: [String: Entity] = [:]
    var keys: [String: UInt64] = [:]
    var feed: [PulledChange] = []

    enum Answer { case ack(UInt64, duplicate: Bool), reject(String) }

    mutating func push(_ batch: [PendingIntent]) -> [Answer] {
        var raised: [String: UInt64] = [:]
        return batch.map { item in
            let intent = item.intent
            let id = intent.entityID
            if let version = keys[intent.idempotencyKey] {
                raised[id] = max(raised[id, default: 0], version)
                return .ack(version, duplicate: true)
            }
            let base = max(intent.baseVersion, raised[id, default: 0])
            var entity = entities[id, default: Entity()]
            let v = entity.version
            switch intent.operation {
            case .create:
                if entity.exists || base > v { return .reject("CONFLICT") }
                entity.exists = true
                entity.fields = Dictionary(uniqueKeysWithValues: intent.fields.map { ($0.0, $0.1) })
                entity.created = v + 1
                entity.lastChanged = entity.fields.mapValues { _ in v + 1 }
            case .update:
                if !entity.exists { return .reject("ENTITY_NOT_FOUND") }
                if base > v { return .reject("CONFLICT") }
                if base < v, intent.fields.contains(where: { (entity.lastChanged[$0.0] ?? entity.created) > base }) {
                    return .reject("CONFLICT")
                }
                for (name, value) in intent.fields {
                    entity.fields[name] = value
                    entity.lastChanged[name] = v + 1
                }
            case .delete:
                if !entity.exists { return .reject("ENTITY_NOT_FOUND") }
                if base != v { return .reject("CONFLICT") }
                entity.exists = false
                entity.fields = [:]
                entity.lastChanged = [:]
            }
            entity.version = v + 1
            entities[id] = entity
            keys[intent.idempotencyKey] = v + 1
            raised[id] = max(raised[id, default: 0], v + 1)
            feed.append(
                entity.exists
                    ? PulledChange(.upsert, entityType: "te", entityID: id, serverVersion: v + 1, fields: Fields(entity.fields))
                    : PulledChange(.delete, entityType: "te", entityID: id, serverVersion: v + 1))
            return .ack(v + 1, duplicate: false)
        }
    }
}

extension SyncSideTests {
    /// One client alone with a server that keeps the protocol's rules: its
    /// pushes, in batches of any size, with lost responses and retries,
    /// never conflict with its own writes, and it ends with the server's state.
    @Test func oneClientAloneNeverConflictsWithItsOwnWrites() async throws {
        for seed in UInt64(1)...100 {
            var random = RandomEntries(seed: seed)
            let fixture = try StoreFixture("sync-one-client")
            let store = fixture.store
            var server = ServerModel()
            var pulled = 0
            var now: UInt64 = 1
            let ids = ["a", "b"]
            let label = "seed \(seed)"
            func pushOnce(lose: Bool) async throws {
                let batch = try store.pushBatch(limit: random.int(1...4), now: now)
                guard !batch.isEmpty else { return }
                let answers = server.push(batch)
                if lose {
                    try await store.scheduleRetry(offsets: batch.map(\.offset), error: "lost", at: now, attemptsMax: 1000)
                    return
                }
                var outcomes: [(offset: UInt64, outcome: PushOutcome)] = []
                var retries: [UInt64] = []
                for (item, answer) in zip(batch, answers) {
                    // A malformed answer, retried, with the answers of its
                    // entity's later intents in the batch left unrecorded:
                    // recorded ahead of it, their acks would put the base
                    // past it, and the app would see (and write over) a
                    // state the server never had.
                    if random.int(0...7) == 0 || batch.contains(where: { retries.contains($0.offset) && $0.intent.entityID == item.intent.entityID }) {
                        retries.append(item.offset)
                        continue
                    }
                    switch answer {
                    case .ack(let version, let duplicate):
                        outcomes.append((item.offset, .acknowledged(duplicate ? .duplicate : .applied, serverVersion: version)))
                    case .reject(let code):
                        Issue.record("\(label): \(item.intent.operation) \(item.intent.entityID) base \(item.intent.baseVersion) answered \(code)")
                        outcomes.append((item.offset, .rejected(code: code, message: "")))
                    }
                }
                try await store.record(outcomes)
                if !retries.isEmpty { try await store.scheduleRetry(offsets: retries, error: "malformed", at: now, attemptsMax: 1000) }
            }
            func pull() async throws {
                guard pulled < server.feed.count else { return }
                try await store.applyPulledPage(Array(server.feed[pulled...]), cursor: "c\(server.feed.count)")
                pulled = server.feed.count
            }
            for step in 0..<40 {
                let id = ids[random.int(0...1)]
                switch random.int(0...9) {
                case 0, 1, 2:
                    if try store.get(type: "te", id: id) == nil {
                        try await store.create(type: "te", id: id, fields: ["f\(random.int(0...2))": .int(Int64(step))])
                    } else {
                        try await store.update(type: "te", id: id, changes: ["f\(random.int(0...2))": .int(Int64(step))])
                    }
                case 3:
                    if try store.get(type: "te", id: id) != nil { try await store.delete(type: "te", id: id) }
                case 4, 5, 6:
                    try await pushOnce(lose: false)
                case 7:
                    try await pushOnce(lose: true)
                    now += 1
                default:
                    try await pull()
                }
            }
            for _ in 0..<200 where try !store.outbox().isEmpty { try await pushOnce(lose: false) }
            try await pull()
            for id in ids {
                let entity = server.entities[id]
                let expected = entity.flatMap { $0.exists ? Fields($0.fields) : nil }
                #expect(try store.get(type: "te", id: id)?.fields == expected, "\(label): \(id)")
            }
            fixture.store.close()
        }
    }
}

extension SyncSideTests {
    /// `pushBatch` returns "at most `limit`" intents: a batch of limit 0 is
    /// empty. Its first due intent was taken before the limit was checked.
    @Test func aPushBatchOfLimitZeroIsEmpty() async throws {
        let fixture = try StoreFixture("sync-push-limit-zero")
        let store = fixture.store
        try await store.create(type: "te", fields: ["a": 1])
        #expect(try store.pushBatch(limit: 0, now: 0).isEmpty)
        #expect(try store.pushBatch(limit: 1, now: 0).count == 1)
    }

    /// `outboxSummary().oldestPendingWrittenAt` is when the oldest pending
    /// intent was written, the first `pending` row in log order, not the
    /// last one; a failed intent before it counts for `oldestWrittenAt`
    /// alone. (The timestamps are set by an import, so they differ.)
    @Test func theSummarysOldestPendingIntentIsTheFirstPendingOne() async throws {
        let fixture = try StoreFixture("sync-summary-oldest-pending")
        let store = fixture.store
        let entries = ["a", "b", "c"].enumerated().map { index, id in
            Entry(
                offset: UInt64(1 + index), timestamp: HybridTimestamp(rawValue: UInt64(1_000 * (1 + index)) << 16),
                body: .intent(Intent(.create, idempotencyKey: "k-\(id)", entityType: "te", entityID: id, fields: [:])))
        }
        try await store.restore(entries, compactedBelow: 0)
        var summary = try store.outboxSummary()
        #expect(summary.oldestWrittenAt == 1_000 && summary.oldestPendingWrittenAt == 1_000)
        try await store.markFailed(offsets: [1], error: "HTTP 400")
        summary = try store.outboxSummary()
        #expect(summary.pendingCount == 2 && summary.failedCount == 1)
        #expect(summary.oldestWrittenAt == 1_000, "the failed intent is the oldest in the outbox")
        #expect(summary.oldestPendingWrittenAt == 2_000, "the oldest pending one, not the newest")
    }
}
