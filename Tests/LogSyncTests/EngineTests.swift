import Foundation
import LMDB
import LogFormat
import LogServer
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting
import Synchronization
import Testing

/// The engine against the real reference server over loopback HTTP: the
/// rows of the seed's "Reliability Guarantees Summary" that apply off iOS,
/// and the issue's named cases.
@Suite struct EngineTests {
    @Test func offlineWritesSyncAndAnotherReplicaSeesThem() async throws {
        let server = try await TestServer("converge")
        let a = try Replica("a", server: server)
        let b = try Replica("b", server: server)
        let id = try await a.store.create(type: "task", fields: ["title": "Buy milk", "weight": .double(2)])
        try await a.store.update(type: "task", id: id, changes: ["done": true])
        let report = await a.sync()
        #expect(report.outcome == .completed)
        #expect(report.acknowledged == 2)
        #expect(try a.store.outboxCount() == 0)
        // The pull after the push showed both acknowledged changes: nothing
        // is left waiting for the feed, and there was no reason to resync.
        #expect(report.resyncs == 0)
        #expect(try a.store.acknowledgedChangesNotInFeed(through: .max).isEmpty)
        await b.sync()
        #expect(try b.entities("task") == [id: ["title": "Buy milk", "weight": .double(2), "done": true]])
        #expect(try a.entities("task") == b.entities("task"))
        // The second update was pushed with the version its create's ack gave.
        try await a.store.update(type: "task", id: id, changes: ["done": false])
        #expect(await a.sync().acknowledged == 1)
        await server.stop()
    }

    /// One `WriteBatch` written twice is two changes, each pushed and
    /// applied: the app's second write of a batch it kept (a "mark done"
    /// it prepared once) wins over the change made between them. Before,
    /// both writes carried the keys made when the operations were added,
    /// the server answered the second `duplicate`, and the change between
    /// them came back: the second write was lost without a word.
    @Test func aBatchWrittenTwiceIsPushedTwice() async throws {
        let server = try await TestServer("batch-twice")
        let a = try Replica("a", server: server)
        let id = try await a.store.create(type: "task", fields: ["done": false])
        var markDone = WriteBatch()
        try markDone.update(type: "task", id: id, changes: ["done": true])
        try await a.store.write(markDone)
        try await a.store.update(type: "task", id: id, changes: ["done": false])
        try await a.store.write(markDone)
        let keys = try a.store.outbox().map(\.intent.idempotencyKey)
        #expect(Set(keys).count == keys.count, "\(keys)")
        let report = await a.sync()
        #expect(report.outcome == .completed)
        #expect(try a.store.get(type: "task", id: id)?.fields == ["done": true])
        #expect(try await server.pullAll().last?.data == ["done": true])
        await server.stop()
    }

    /// The server merges an update made against an older version with a
    /// change to another field; the client that pushed it ends up with the
    /// merged entity, not with its own guess at it.
    @Test func anUpdateTheServerMergedEndsAsTheServerHasIt() async throws {
        let server = try await TestServer("merged")
        let a = try Replica("a", server: server)
        let b = try Replica("b", server: server)
        let id = try await a.store.create(type: "task", fields: ["title": "Buy milk", "n": 1])
        await a.sync()
        await b.sync()
        try await b.store.update(type: "task", id: id, changes: ["n": 2])
        await b.sync()
        try await a.store.update(type: "task", id: id, changes: ["title": "Buy oat milk"])
        let report = await a.sync()
        #expect(report.acknowledged == 1 && report.conflicts == 0)
        let entity = try #require(try a.store.get(type: "task", id: id))
        #expect(entity.fields == ["title": "Buy oat milk", "n": 2])
        #expect(entity.serverVersion == 3)
        #expect(try await server.pullAll().last?.data == entity.fields)
        await server.stop()
    }

    /// "App crashes after user action": the intent is in the log before the
    /// write returns, and is pushed after a restart.
    @Test func anIntentWrittenBeforeACrashIsPushedAfterRestart() async throws {
        let server = try await TestServer("restart")
        let a = try Replica("a", server: server)
        let id = try await a.store.create(type: "task", fields: ["title": "kept"])
        try a.restart()
        #expect(try a.store.outboxCount() == 1)
        #expect(await a.sync().acknowledged == 1)
        #expect(try await server.pullAll().map(\.entityID) == [id])
        await server.stop()
    }

    /// "Network fails mid-push": retried with backoff; the operations stay.
    @Test func aNetworkFailureSchedulesARetryWithBackoff() async throws {
        let server = try await TestServer("network")
        let a = try Replica("a", server: server)
        try await a.store.create(type: "task", fields: ["n": 1])
        // Health passes, then the push meets a closed connection.
        try await server.faults(FaultSettings(dropAfterPush: 0))
        await server.stop()
        let report = await a.sync()
        #expect(report.outcome == .offline)
        try await server.restart()
        let replica = try Replica("a2", server: server)
        try await replica.store.create(type: "task", fields: ["n": 2])
        try await server.faults(FaultSettings(failNext: 1, status: 503))
        let failed = await replica.sync()
        guard case .failed = failed.outcome else { Issue.record("expected a failure, got \(failed.outcome)"); return }
        let pending = try #require(try replica.store.outbox().first)
        #expect(pending.state.attempts == 1)
        let delay = pending.state.nextAttemptAt - replica.clock.nowMilliseconds
        #expect((800...1_200).contains(delay) || delay == 1_000, "first retry after about 1 s (Retry-After 1), got \(delay) ms")
        // Not due yet: the next run pushes nothing and pulls.
        #expect(await replica.sync().acknowledged == 0)
        replica.clock.advance(by: 1_300)
        #expect(await replica.sync().acknowledged == 1)
        await server.stop()
    }

    /// A setting the protocol cannot carry is an error when the engine is
    /// made, naming it, rather than a trap or a failure at the first sync.
    @Test func aConfigurationOutOfRangeIsRefused() throws {
        let directory = try TemporaryDirectory("engine-configuration")
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        let transport = HTTPTransport(baseURL: URL(string: "http://127.0.0.1:9")!, token: "unused")
        let tooMany = Wire.pushOperationCountMax + 1
        let cases: [(named: String, change: (inout SyncConfiguration) -> Void)] = [
            ("pushBatchCountMax 0 is outside 1...", { $0.pushBatchCountMax = 0 }),
            ("pushBatchCountMax \(tooMany) is outside 1...", { $0.pushBatchCountMax = tooMany }),
            ("pullPageCountMax 0 is outside 1...", { $0.pullPageCountMax = 0 }),
            ("resyncsPerRunMax -1 is negative", { $0.resyncsPerRunMax = -1 }),
            ("retry.jitter -0.1 is outside 0...1", { $0.retry.jitter = -0.1 }),
            ("retry.jitter 1.5 is outside 0...1", { $0.retry.jitter = 1.5 }),
            ("retry.jitter nan is outside 0...1", { $0.retry.jitter = .nan }),
            ("retry.attemptsMax 0 allows no attempt", { $0.retry.attemptsMax = 0 }),
        ]
        for (named, change) in cases {
            var configuration = SyncConfiguration()
            change(&configuration)
            #expect {
                try SyncEngine(store: store, transport: transport, configuration: configuration)
            } throws: { error in
                error is SyncConfigurationError && "\(error)".contains(named)
            }
        }
        #expect(throws: Never.self) { try SyncEngine(store: store, transport: transport) }
    }

    /// Delays saturate for any valid settings: a base delay whose doublings
    /// pass UInt64, or a maximum at UInt64.max with jitter up to 1, give the
    /// longest delay instead of dropped bits or a trap.
    @Test func retryDelaysSaturateForAnySettings() {
        var random = SeededRandom(seed: 7)
        var policy = RetryPolicy()
        policy.baseDelayMilliseconds = 1 << 40
        policy.delayMaxMilliseconds = 1 << 50
        policy.jitter = 0
        // 2^40 doubled 32 times passes 2^64: the maximum, not the bits left over.
        #expect(policy.delay(beforeRetry: 33, random: &random) == 1 << 50)
        // At UInt64.max, a factor of 1 or more takes the product past it.
        policy.baseDelayMilliseconds = .max
        policy.delayMaxMilliseconds = .max
        policy.jitter = 1
        let delays = (0..<20).map { _ in policy.delay(beforeRetry: 1, random: &random) }
        #expect(delays.contains(.max))
    }

    /// A delay whose product lands on 2^64 exactly (the maximum at
    /// UInt64.max with no jitter: a factor of exactly 1) saturates as any
    /// product past UInt64 does: 2^64 is the first value past it, and
    /// converted, it would trap.
    @Test func aDelayOfExactly2To64Saturates() {
        var random = SeededRandom(seed: 7)
        var policy = RetryPolicy()
        policy.baseDelayMilliseconds = .max
        policy.delayMaxMilliseconds = .max
        policy.jitter = 0
        #expect(policy.delay(beforeRetry: 1, random: &random) == .max)
    }

    /// A whole push refused as unauthorized (401: a token the server does
    /// not know) is a permanent failure of the request, no judgement on
    /// each operation (`Format/sync-protocol.md` section 10): the batch is
    /// marked failed, the app is told, and the run fails. The intents wait
    /// for the app's `retryFailed`, which pushes them once the token is good.
    @Test func aPushRefusedAsUnauthorizedMarksTheBatchFailed() async throws {
        let server = try await TestServer("unauthorized-push")
        let a = try Replica("a", server: server, token: "a-token-the-server-does-not-know")
        let events = a.store.events()
        try await a.store.create(type: "task", fields: ["n": 1])
        try await a.store.create(type: "task", fields: ["n": 2])
        let report = await a.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("expected the run to fail, got \(report.outcome)")
            return
        }
        #expect(message.hasPrefix("push: ") && message.contains("HTTP 401"), "\(message)")
        #expect(report.retried == 2 && report.acknowledged == 0)
        let states = try a.store.outbox().map(\.state)
        // Checked before the event is awaited, which comes only with them.
        guard states.count == 2, states.allSatisfy({ $0.status == .failed && $0.attempts == 1 }) else {
            Issue.record("expected both intents failed after one attempt, got \(states)")
            return
        }
        var iterator = events.makeAsyncIterator()
        guard case .retriesExhausted? = await iterator.next() else {
            Issue.record("no retriesExhausted event")
            return
        }
        try a.connect(to: server)
        #expect(await a.sync().acknowledged == 0)
        try await a.store.retryFailed()
        #expect(await a.sync().acknowledged == 2)
        #expect(try a.store.outbox().isEmpty)
        await server.stop()
    }

    /// "Server returns 500": retried up to 10 times, then failed and reported.
    @Test func fiveHundredsAreRetriedTenTimesThenFailed() async throws {
        let server = try await TestServer("five-hundreds")
        let a = try Replica("a", server: server)
        let events = a.store.events()
        try await a.store.create(type: "task", fields: ["n": 1])
        try await server.faults(FaultSettings(failNext: 1_000, status: 500))
        for _ in 0..<12 {
            await a.sync()
            a.clock.advance(by: 400_000)
        }
        let state = try #require(try a.store.outbox().first?.state)
        #expect(state.attempts == 10)
        #expect(state.status == .failed)
        var iterator = events.makeAsyncIterator()
        guard case .retriesExhausted? = await iterator.next() else { Issue.record("no retriesExhausted event"); return }
        try await server.faults(FaultSettings(failNext: 0))
        try await a.store.retryFailed()
        #expect(await a.sync().acknowledged == 1)
        await server.stop()
    }

    /// A pending outbox row whose attempt count is at its maximum (damaged
    /// or forged: the store marks an intent failed long before) meets a
    /// failed push: the engine counts that attempt without a trap, as the
    /// store does (`StoreIntegrityTests`), and the intent is marked failed.
    /// Before, the engine computed the retry's delay from the count plus
    /// one, and trapped.
    @Test func anAttemptCountAtItsMaximumDoesNotTrapTheEngine() async throws {
        let server = try await TestServer("attempts-max")
        let a = try Replica("attempts-max", server: server, transport: Refusing(server, status: 503, retryAfterSeconds: 1))
        try await a.store.create(type: "task", fields: ["n": 1])
        a.store.close()
        // Pending, attempts 0xFFFFFFFF, due now, no error (storage.md, section 15, "outbox").
        let row: [UInt8] = [0] + [0xFF, 0xFF, 0xFF, 0xFF] + [UInt8](repeating: 0, count: 8) + [0, 0, 0, 0]
        let environment = try Environment(path: a.directory.path)
        let outbox = try #require(try environment.openDatabase("outbox", create: false))
        try environment.write { txn in try txn.put(outbox, key: withUnsafeBytes(of: UInt64(1).bigEndian) { Array($0) }, value: row) }
        environment.close()
        try a.restart()
        let report = await a.sync()
        guard case .failed = report.outcome else { Issue.record("a 503 fails the run: \(report.outcome)"); return }
        #expect(report.retried == 1)
        let state = try #require(try a.store.outbox().first?.state)
        #expect(state.attempts == .max && state.status == .failed)
        await server.stop()
    }

    /// "3/10 operations rejected": each handled on its own.
    @Test func threeOfTenRejectedAreEachHandledOnTheirOwn() async throws {
        let server = try await TestServer("three-of-ten")
        let a = try Replica("a", server: server)
        let b = try Replica("b", server: server)
        var doomed: [String] = []
        for n in 0..<3 { doomed.append(try await b.store.create(type: "task", fields: ["n": .int(Int64(n))])) }
        await b.sync()
        await a.sync()
        for id in doomed { try await b.store.delete(type: "task", id: id) }
        await b.sync()
        let events = a.store.events()
        for (n, id) in doomed.enumerated() { try await a.store.update(type: "task", id: id, changes: ["n": .int(Int64(n + 10))]) }
        for n in 0..<7 { try await a.store.create(type: "task", fields: ["fresh": .int(Int64(n))]) }
        let report = await a.sync()
        #expect(report.acknowledged == 7)
        #expect(report.rejected == 3)
        var rejected: [String] = []
        var iterator = events.makeAsyncIterator()
        while rejected.count < 3, let event = await iterator.next() {
            if case .rejected(let intent) = event {
                #expect(intent.code == "ENTITY_NOT_FOUND")
                rejected.append(intent.entityID)
            }
        }
        #expect(Set(rejected) == Set(doomed))
        #expect(try a.store.outboxCount() == 0)
        #expect(try a.entities("task").count == 7)
        await server.stop()
    }

    /// A push whose answer is lost after the server applied it: the retry
    /// answers duplicate, the server applied it once, the client acks once.
    @Test func aLostAnswerIsRetriedAndAnsweredDuplicate() async throws {
        let server = try await TestServer("lost-answer")
        let a = try Replica("a", server: server)
        try await a.store.create(type: "task", fields: ["title": "once"])
        try await server.faults(FaultSettings(dropAfterPush: 1))
        let first = await a.sync()
        guard case .failed = first.outcome else { Issue.record("expected the dropped answer to fail the run, got \(first.outcome)"); return }
        a.clock.advance(by: 2_000)
        let second = await a.sync()
        #expect(second.acknowledged == 1)
        let acks = try a.entries(.ack)
        #expect(acks.count == 1)
        guard case .ack(let ack)? = acks.first?.body else { return }
        #expect(ack.outcome == .duplicate)
        #expect(try await server.pullAll().count == 1)
        await server.stop()
    }

    /// The circuit breaker trips after three 429s, waits, and recovers; the
    /// states follow the state machine.
    @Test func theCircuitBreakerTripsWaitsAndRecovers() async throws {
        let server = try await TestServer("breaker")
        let a = try Replica("a", server: server)
        let states = a.engine.states()
        try await a.store.create(type: "task", fields: ["n": 1])
        try await server.faults(FaultSettings(failNext: 3, status: 429))
        #expect(await a.sync().outcome == .failed("push: /v1/push: HTTP 429, RATE_LIMITED: injected fault: rate limited"))
        #expect(await a.sync().outcome != .completed)  // nothing due; the pull meets the second 429
        #expect(await a.sync().outcome == .rateLimited)  // the third opens the breaker
        #expect(await a.engine.state == .rateLimited(retryAfter: 30, pending: 1))
        // While open, no request is sent at all.
        #expect(await a.sync().outcome == .rateLimited)
        a.clock.advance(by: 30_000)
        let recovered = await a.sync()
        #expect(recovered.outcome == .completed)
        #expect(recovered.acknowledged == 1)
        var seen: [SyncState] = []
        for await state in states {
            seen.append(state)
            if seen.count > 3, state == .idle, seen.contains(where: { if case .rateLimited = $0 { true } else { false } }) { break }
        }
        let names = seen.map { state -> String in
            switch state {
            case .idle: "idle"
            case .pushing: "pushing"
            case .pulling: "pulling"
            case .rateLimited: "rateLimited"
            case .error: "error"
            }
        }
        #expect(names.first == "idle")
        #expect(names.contains("pushing") && names.contains("error") && names.contains("rateLimited"))
        #expect(names.last == "idle")
        // Every transition is one the state machine draws.
        let allowed: Set<[String]> = [
            ["idle", "pushing"], ["pushing", "pulling"], ["pushing", "error"], ["pushing", "rateLimited"], ["pulling", "idle"],
            ["pulling", "error"], ["pulling", "rateLimited"], ["error", "pushing"], ["rateLimited", "pushing"], ["error", "rateLimited"],
            ["rateLimited", "rateLimited"], ["pushing", "pushing"],
        ]
        for (from, to) in zip(names, names.dropFirst()) { #expect(allowed.contains([from, to]), "\(from) -> \(to)") }
        await server.stop()
    }

    /// A run's push progress counts the intents it pushes: not one waiting
    /// for its retry time (retried alone for its answer), nor a later one
    /// on its entity, held behind it. Before, the total was every pending
    /// intent, and the run ended at `pushing 2/4`.
    @Test func pushProgressCountsTheIntentsTheRunPushes() async throws {
        let server = try await TestServer("push-progress")
        let refusing = Atomic<Bool>(true)
        let transport = RewritingTransport.retryingTheFirstIntent(server) { refusing.load(ordering: .relaxed) }
        let a = try Replica("push-progress", server: server, transport: transport)
        let retried = try await a.store.create(type: "task", fields: ["n": 1])
        #expect(await a.sync().retried == 1)
        refusing.store(false, ordering: .relaxed)
        try await a.store.update(type: "task", id: retried, changes: ["n": 2])
        for n in 3...4 { try await a.store.create(type: "task", fields: ["n": .int(Int64(n))]) }
        let states = a.engine.states()
        #expect(await a.sync().acknowledged == 2)
        var pushing: [String] = []
        for await state in states {
            if case .pushing = state { pushing.append(state.description) }
            if state == .pulling { break }
        }
        #expect(pushing == ["pushing 0/2", "pushing 2/2"])
        #expect(try a.store.outbox().count == 2)
        await server.stop()
    }

    /// A sync cancelled before it starts sends neither a push nor a pull
    /// (the health check aside), fails nothing, and leaves the intent for
    /// the next run.
    @Test func aSyncCancelledBeforeItStartsSendsNoRequest() async throws {
        let server = try await TestServer("cancelled-before")
        let a = try Replica("cancelled-before", server: server)
        try await a.store.create(type: "task", fields: ["n": 1])
        let cancellation = SyncCancellation()
        cancellation.cancel()
        let report = await a.engine.sync(cancellation: cancellation)
        #expect(report.outcome == .cancelled)
        #expect(report.acknowledged == 0 && report.retried == 0 && report.pages == 0)
        #expect(try await server.pullAll().isEmpty)
        #expect(try a.store.outbox().first?.state.attempts == 0)
        #expect(await a.engine.state == .idle)
        #expect(await a.engine.lastError == nil)
        #expect(await a.sync().acknowledged == 1)
        await server.stop()
    }

    /// Pagination over 10,000 changes, cancelled after the first page and resumed.
    @Test func tenThousandChangesPageWithCancellationAndResume() async throws {
        let server = try await TestServer("pages")
        var configuration = SyncConfiguration()
        configuration.pushBatchCountMax = 500
        configuration.pullPageCountMax = 1_000
        let writer = try Replica("writer", server: server, configuration: configuration)
        var batch = WriteBatch()
        for n in 0..<10_000 { try batch.create(type: "item", fields: ["n": .int(Int64(n))]) }
        try await writer.store.write(batch)
        #expect(await writer.sync().acknowledged == 10_000)
        let cancellation = SyncCancellation()
        let counting = AfterPull(inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)) {
            cancellation.cancel()
        }
        let reader = try Replica("reader", server: server, configuration: configuration, transport: counting)
        let first = await reader.engine.sync(cancellation: cancellation)
        #expect(first.outcome == .cancelled)
        #expect(first.pages == 1)
        #expect(try reader.store.count(type: "item") == 1_000)
        #expect(await reader.engine.state == .idle)
        #expect(await reader.engine.lastError == nil)
        let rest = await reader.sync()
        #expect(rest.outcome == .completed)
        #expect(rest.changes == 9_000)
        #expect(try reader.store.count(type: "item") == 10_000)
        await server.stop()
    }

    /// "Runs a sync, or joins the one running": once a run has published
    /// its end, it is not running, and a sync asked for then is a run of
    /// its own. The app that syncs again on seeing that end, because it
    /// wrote while the run pulled, gets that write pushed, not the ended
    /// run's report back.
    @Test func aSyncAskedForOnceARunHasEndedRunsAgain() async throws {
        let server = try await TestServer("after-end")
        let writer = Mutex<Store?>(nil)
        let transport = AfterPull(inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)) {
            guard let store = writer.withLock({ $0 }) else { return }
            _ = try? await store.create(type: "task", fields: ["title": "written during the pull"])
        }
        let replica = try Replica("after-end", server: server, transport: transport)
        for round in 0..<20 {
            writer.withLock { $0 = replica.store }
            let states = replica.engine.states()
            let first = Task { await replica.sync() }
            var pulled = false
            for await state in states {
                if state == .pulling { pulled = true } else if pulled, state == .idle { break }
            }
            writer.withLock { $0 = nil }
            let second = await replica.sync()
            #expect(second.outcome == .completed, "round \(round)")
            #expect(second.acknowledged == 1, "round \(round): the intent written during the last run's pull")
            #expect(try replica.store.outboxCount() == 0, "round \(round)")
            #expect(await first.value.acknowledged == 0, "round \(round)")
        }
        await server.stop()
    }

    /// "Cursor becomes invalid": a full resync keeps pending intents, and
    /// the replicas converge; so does a forced resync. The pending intent
    /// waits for a retry, so it is still pending when the pull resyncs.
    @Test func cursorInvalidAndForcedResyncKeepPendingIntents() async throws {
        let server = try await TestServer("resync")
        let a = try Replica("a", server: server)
        let b = try Replica("b", server: server)
        let shared = try await b.store.create(type: "task", fields: ["title": "shared"])
        await b.sync()
        await a.sync()
        try await server.forceResync()
        let local = try await a.store.create(type: "task", fields: ["title": "offline"])
        try await server.faults(FaultSettings(failNext: 1, status: 503))
        _ = await a.sync()
        let forced = await a.sync()
        #expect(forced.outcome == .completed)
        #expect(forced.resyncs == 1)
        #expect(try a.store.outboxCount() == 1)
        #expect(try a.entities("task").keys.sorted() == [local, shared].sorted())
        try await a.syncUntilQuiet()
        await b.sync()
        #expect(try a.entities("task") == b.entities("task"))

        // A new server store: the old cursor names another server (410).
        await server.stop()
        server.configuration.dataDirectory = server.directory.appending("data-2")
        try await server.restart()
        try a.connect(to: server)
        let second = try await a.store.create(type: "task", fields: ["title": "after the move"])
        try await server.faults(FaultSettings(failNext: 1, status: 503))
        _ = await a.sync()
        let invalid = await a.sync()
        #expect(invalid.outcome == .completed)
        #expect(invalid.resyncs == 1)
        // The new server has nothing yet: only the pending create is visible.
        #expect(try a.entities("task").keys.sorted() == [second])
        try await a.syncUntilQuiet()
        #expect(try await server.pullAll().map(\.entityID) == [second])
    }

    /// A conflict with `askApp` waits, survives a restart, and is resolved
    /// by the app; `keepLocal` re-pushes on the server's version.
    @Test func conflictsAreKeptListedAndResolved() async throws {
        let server = try await TestServer("conflicts")
        var configuration = SyncConfiguration()
        configuration.conflictStrategies["note"] = .keepLocal
        let a = try Replica("a", server: server, configuration: configuration)
        let b = try Replica("b", server: server)
        let task = try await b.store.create(type: "task", fields: ["title": "v1"])
        let note = try await b.store.create(type: "note", fields: ["text": "v1"])
        await b.sync()
        await a.sync()
        try await b.store.update(type: "task", id: task, changes: ["title": "from b"])
        try await b.store.update(type: "note", id: note, changes: ["text": "from b"])
        await b.sync()
        try await a.store.update(type: "task", id: task, changes: ["title": "from a"])
        try await a.store.update(type: "note", id: note, changes: ["text": "from a"])
        let report = await a.sync()
        #expect(report.conflicts >= 2)
        try a.restart()
        let waiting = try a.store.conflicts()
        #expect(waiting.map(\.intent.entityID) == [task])
        #expect(waiting.first?.conflict.serverFields == ["title": "from b"])
        // keepLocal made a new intent on the server's version, already pushed.
        try await a.syncUntilQuiet()
        #expect(try a.entities("note")[note] == ["text": "from a"])
        try await a.store.resolveConflict(intentOffset: waiting[0].conflict.intentOffset, .merged(["title": "from a and b"]))
        #expect(try a.store.conflicts().isEmpty)
        try await a.syncUntilQuiet()
        await b.sync()
        #expect(try b.entities("task")[task] == ["title": "from a and b"])
        #expect(try a.entities("task") == b.entities("task"))
        #expect(try a.entities("note") == b.entities("note"))
        await server.stop()
    }

    /// A request too large for the server (413) is pushed in smaller ones.
    /// An update after its create, both in the refused request, is sent with
    /// the version the create's ack gave, as section 7 asks across requests,
    /// rather than with the version it was made against: otherwise the
    /// server takes the client's own create for a conflicting change.
    @Test func aSplitRequestCarriesTheVersionsItsFirstHalfWasAnswered() async throws {
        let server = try await TestServer("split")
        let a = try Replica("a", server: server)
        // Two operations of 2.2 MB each: together over the 4 MiB body limit.
        let large = String(repeating: "x", count: 2_200_000)
        let id = try await a.store.create(type: "doc", fields: ["body": .string(large)])
        try await a.store.update(type: "doc", id: id, changes: ["body": .string(large + "y")])
        let report = await a.sync()
        #expect(report.outcome == .completed)
        #expect(report.acknowledged == 2)
        #expect(report.conflicts == 0)
        #expect(try a.store.conflicts().isEmpty)
        #expect(try a.store.outboxCount() == 0)
        #expect(try await server.pullAll().last?.data?["body"] == .string(large + "y"))
        await server.stop()
    }

    /// A 413 halves the operations per request for the rest of the run, so
    /// a run splits at most log2 of the batch size times: eight intents,
    /// against a server that takes at most two at a time, go as requests
    /// of 8, 4 and then 2 operations.
    @Test func aRefusedRequestIsPushedInHalves() async throws {
        let server = try await TestServer("split-halves")
        let pushes = PushesOverACountRefused(inner: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback), countMax: 2)
        let a = try Replica("a", server: server, transport: pushes)
        for n in 1...8 { try await a.store.create(type: "task", fields: ["n": .int(Int64(n))]) }
        let report = await a.sync()
        #expect(report.outcome == .completed && report.acknowledged == 8, "\(report)")
        #expect(pushes.operationCounts == [8, 4, 2, 2, 2, 2])
        await server.stop()
    }

    /// Section 10: a 413 means the client built too large a request, and
    /// it pushes the operations in smaller ones; an operation that alone is
    /// refused as too large is marked `failed` for the app, and the run
    /// fails: retried, it would be refused again on every run, for ever.
    @Test func anOperationRefusedAsTooLargeAloneIsMarkedFailed() async throws {
        let server = try await TestServer("too-large-alone")
        let inner = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        let a = try Replica("a", server: server, transport: PushesOverACountRefused(inner: inner, countMax: 0))
        try await a.store.create(type: "doc", fields: ["n": 1])
        let report = await a.sync()
        guard case .failed = report.outcome else {
            Issue.record("the run should fail: \(report.outcome)")
            return
        }
        #expect(try a.store.outbox().map(\.state.status) == [.failed])
        #expect(try a.store.outboxSummary().failedCount == 1)
        await server.stop()
    }

    /// Section 10, step 3: a push request is at most `requestBodyBytesMax`
    /// bytes. The transport does not send a larger body; it fails it as the
    /// server's 413 would, so the engine splits it all the same. Nothing
    /// listens on the port here: a request that was sent would fail with
    /// no answer (`.noAnswer`: the connection is refused).
    @Test func aPushBodyOverTheLimitIsNotSent() async throws {
        let server = try await TestServer("body-limit")
        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        await server.stop()
        func operation(_ n: Int, bytes: Int) -> PushOperation {
            PushOperation(
                idempotencyKey: "key-\(n)", entityType: "doc", entityID: "doc-\(n)", intent: .create,
                data: ["body": .string(String(repeating: "x", count: bytes))], clientTimestamp: "2026-11-25T12:00:00.000000Z",
                baseVersion: 0)
        }
        func failure(_ operations: [PushOperation]) async -> TransportError? {
            do {
                _ = try await transport.push(PushRequest(operations: operations))
                return nil
            } catch { return error }
        }
        let over = await failure([operation(1, bytes: 2_200_000), operation(2, bytes: 2_200_000)])
        #expect(over?.kind == .status(413, .payloadTooLarge))
        #expect(over?.message.contains("not sent") == true, "\(String(describing: over))")
        #expect(await failure([operation(1, bytes: 1_000)])?.kind == .noAnswer)
    }

    /// Results that do not answer the operations in order (a misbehaving
    /// server or proxy) are recorded against no intent: each result names
    /// its operation's idempotency key, and a mismatch is retried as a
    /// network error, so no intent takes another's answer.
    @Test func resultsOutOfOrderAreRecordedAgainstNoIntent() async throws {
        let server = try await TestServer("results-out-of-order")
        let reversed = RewritingTransport(server, pushes: { $0.results.reverse() })
        let a = try Replica("a", server: server, transport: reversed)
        try await a.store.create(type: "task", fields: ["title": "one"])
        try await a.store.create(type: "task", fields: ["title": "two"])
        let report = await a.sync()
        #expect(report.acknowledged == 0)
        if case .failed(let message) = report.outcome {
            #expect(message.contains("idempotency key"), "\(message)")
        } else {
            Issue.record("expected the mismatched results to fail the run, got \(report.outcome)")
        }
        #expect(try a.store.outboxCount() == 2)
        #expect(try a.entries(.ack).isEmpty)
        // Answered properly (the server remembers the keys: duplicates), each
        // intent gets its own answer.
        try a.connect(to: server)
        try await a.syncUntilQuiet()
        #expect(try a.store.outboxCount() == 0)
        #expect(try a.entries(.ack).count == 2)
        await server.stop()
    }

    /// A pulled upsert without `data` (a body the protocol does not define,
    /// which `PullResponse.decode` reads as nil data) fails the run with a
    /// clear error: it neither wipes the entity's fields nor moves the
    /// cursor past the change, so a later pull still delivers it.
    @Test func aPulledUpsertWithoutDataIsAnErrorAndLosesNothing() async throws {
        let server = try await TestServer("upsert-without-data")
        let b = try Replica("b", server: server)
        let id = try await b.store.create(type: "task", fields: ["title": "Buy milk"])
        await b.sync()
        let withoutData = RewritingTransport(server, pulls: { page in
            for index in page.changes.indices where page.changes[index].operation == .upsert { page.changes[index].data = nil }
        })
        let a = try Replica("a", server: server, transport: withoutData)
        let broken = await a.sync()
        if case .failed(let message) = broken.outcome {
            #expect(message.contains("without data"))
        } else {
            Issue.record("expected the malformed page to fail the run, got \(broken.outcome)")
        }
        #expect(try a.store.pullCursor() == nil)
        try a.connect(to: server)
        #expect(await a.sync().outcome == .completed)
        #expect(try a.entities("task") == [id: ["title": "Buy milk"]])
        await server.stop()
    }

    /// A `CONFLICT` result without `server_state` (which the protocol
    /// always sends with it) is not taken for a permanent rejection: the
    /// local change stays pending, and once the server answers properly the
    /// conflict is recorded and waits for the app.
    @Test func aConflictWithoutServerStateKeepsTheChange() async throws {
        let server = try await TestServer("conflict-without-state")
        let b = try Replica("b", server: server)
        let id = try await b.store.create(type: "task", fields: ["title": "v1"])
        await b.sync()
        let withoutState = RewritingTransport(server, pushes: { response in
            for index in response.results.indices { response.results[index].serverState = nil }
        })
        let a = try Replica("a", server: server, transport: withoutState)
        await a.sync()
        try await b.store.update(type: "task", id: id, changes: ["title": "from b"])
        await b.sync()
        try await a.store.update(type: "task", id: id, changes: ["title": "from a"])
        let report = await a.sync()
        #expect(report.rejected == 0)
        #expect(try a.store.outboxCount() == 1)
        #expect(try a.entities("task")[id] == ["title": "from a"])
        try a.connect(to: server)
        try await a.syncUntilQuiet()
        #expect(try a.store.conflicts().map(\.intent.fields) == [["title": "from a"]])
        await server.stop()
    }

    /// A batch whose answers the store cannot record (here the store is
    /// closed while the push is on its way) fails the run, and its report
    /// counts none of them: nothing was recorded.
    @Test func anUnrecordedBatchIsNotCounted() async throws {
        let server = try await TestServer("unrecorded-batch")
        let replica = Mutex<Replica?>(nil)
        let closing = RewritingTransport(server, pushes: { _ in replica.withLock { $0?.store.close() } })
        let a = try Replica("a", server: server, transport: closing)
        replica.withLock { $0 = a }
        try await a.store.create(type: "task", fields: ["title": "one"])
        try await a.store.create(type: "task", fields: ["title": "two"])
        let report = await a.sync()
        guard case .failed = report.outcome else {
            Issue.record("expected the unrecordable batch to fail the run, got \(report.outcome)")
            return
        }
        #expect(report.acknowledged == 0 && report.rejected == 0 && report.conflicts == 0, "\(report)")
        replica.withLock { $0 = nil }
        try a.restart()
        #expect(try a.store.outboxCount() == 2)
        await server.stop()
    }

    /// A `CONFLICT` whose `server_state` the store cannot keep (a field name
    /// the format refuses; fields over `entityFieldsBytesMax`) breaks the
    /// protocol: the change stays pending for a retry, as with no state at
    /// all, and the batch's other answers are recorded. Recording it would
    /// fail the whole batch on every run.
    @Test(arguments: [
        ("$x", ["$x": 1] as Fields),
        ("entityFieldsBytesMax", ["blob": .bytes([UInt8](repeating: 7, count: Wire.entityFieldsBytesMax))] as Fields),
    ])
    func aConflictWithAStateTheStoreCannotKeepIsRetried(reason: String, data: Fields) async throws {
        let server = try await TestServer("conflict-invalid-state")
        let invalidState = RewritingTransport(server, pushes: { response in
            let last = response.results.count - 1
            response.results[last] = .rejected(
                response.results[last].idempotencyKey, .conflict, "exists",
                state: ServerState(serverVersion: 1, deleted: false, data: data))
        })
        let a = try Replica("a", server: server, transport: invalidState)
        try await a.store.create(type: "task", fields: ["title": "one"])
        try await a.store.create(type: "task", fields: ["title": "two"])
        let report = await a.sync()
        #expect(report.outcome == .completed)
        #expect(report.acknowledged == 1 && report.conflicts == 0 && report.retried == 1, "\(report)")
        let pending = try a.store.outbox()
        #expect(pending.map(\.intent.fields) == [["title": "two"]])
        #expect(pending.first?.state.lastError.contains(reason) == true, "\(pending.first?.state.lastError ?? "")")
        try a.connect(to: server)
        a.clock.advance(by: 600_000)
        try await a.syncUntilQuiet()
        #expect(try a.store.outboxCount() == 0)
        await server.stop()
    }
}

extension EngineTests {
    /// A pulled change too big for one log entry (a server that breaks
    /// `entityFieldsBytesMax`) fails the run with an error naming the
    /// entity, and applies nothing of its page: the cursor stays, so the
    /// page is pulled again once the server sends what fits.
    @Test func aPulledChangeTooBigForAnEntryFailsTheRunByName() async throws {
        let server = try await TestServer("pull-too-big")
        let writer = try Replica("writer", server: server)
        let id = try await writer.store.create(type: "task", fields: ["title": "big"])
        try await writer.syncUntilQuiet()
        let inflating = Atomic<Bool>(true)
        let oversized = RewritingTransport(server, pulls: { page in
            guard inflating.load(ordering: .relaxed) else { return }
            for index in page.changes.indices {
                page.changes[index].data?["blob"] = .bytes([UInt8](repeating: 7, count: Limits.entryBodyBytesMax))
            }
        })
        let reader = try Replica("reader", server: server, transport: oversized)
        let report = await reader.sync()
        guard case .failed(let message) = report.outcome else {
            Issue.record("the pull should fail: \(report)")
            return
        }
        #expect(message.contains("task/\(id)") && message.contains("\(Limits.entryBodyBytesMax)"), "\(message)")
        #expect(await reader.engine.lastError == message)
        #expect(try reader.store.pullCursor() == nil)
        #expect(try reader.store.get(type: "task", id: id) == nil)
        inflating.store(false, ordering: .relaxed)
        reader.clock.advance(by: 600_000)
        try await reader.syncUntilQuiet()
        #expect(try reader.store.get(type: "task", id: id)?.fields == ["title": "big"])
        await server.stop()
    }
}

/// The real server's answers, changed on their way back: a server or
/// proxy that breaks the protocol in one way.
struct RewritingTransport: SyncTransport {
    let inner: HTTPTransport
    let pushes: @Sendable (inout PushResponse) -> Void
    let pulls: @Sendable (inout PullResponse) -> Void

    init(
        _ server: TestServer, pushes: @escaping @Sendable (inout PushResponse) -> Void = { _ in },
        pulls: @escaping @Sendable (inout PullResponse) -> Void = { _ in }
    ) {
        inner = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        self.pushes = pushes
        self.pulls = pulls
    }

    /// Through the real server, but while `refusing()` says so, each push's
    /// first result is a code this client does not know, which retries that
    /// intent alone (with a retry time of its own) and answers the others.
    static func retryingTheFirstIntent(
        _ server: TestServer, while refusing: @escaping @Sendable () -> Bool = { true }
    ) -> RewritingTransport {
        RewritingTransport(server, pushes: { response in
            guard refusing() else { return }
            response.results[0].status = .rejected
            response.results[0].serverVersion = nil
            response.results[0].errorCode = WireErrorCode(rawValue: "TEAPOT")
        })
    }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        var response = try await inner.push(request)
        pushes(&response)
        return response
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        var page = try await inner.pull(cursor: cursor, limit: limit, types: types)
        pulls(&page)
        return page
    }
}

/// The tests' transport options. A request that waits 60 s for data times
/// out: the bound only ends a test whose server never answers, as the
/// whole suite on two cores delays an answer due at once by seconds (at
/// 10 s, a run failed as timed out). A test of timeouts sets its own.
let loopback: HTTPTransport.Options = {
    var options = HTTPTransport.Options()
    options.ignoreProxies = true
    options.requestTimeout = 60
    return options
}()

/// Runs `afterPull` each time a pull page has arrived, before the engine
/// applies it: something the app does while a run pulls.
struct AfterPull: SyncTransport {
    let inner: HTTPTransport
    let afterPull: @Sendable () async -> Void

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { try await inner.push(request) }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        let page = try await inner.pull(cursor: cursor, limit: limit, types: types)
        await afterPull()
        return page
    }
}

/// Through `inner`, but a push of more than `countMax` operations is
/// refused as too large (413); each push's operation count is kept.
private final class PushesOverACountRefused: SyncTransport {
    private let inner: HTTPTransport
    private let countMax: Int
    private let counts = Mutex<[Int]>([])

    init(inner: HTTPTransport, countMax: Int) {
        self.inner = inner
        self.countMax = countMax
    }

    /// The operations of each push so far, in order.
    var operationCounts: [Int] { counts.withLock { $0 } }

    func health() async throws(TransportError) -> HealthResponse { try await inner.health() }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        counts.withLock { $0.append(request.operations.count) }
        guard request.operations.count <= countMax else { throw TransportError(.status(413, .payloadTooLarge), "push: HTTP 413") }
        return try await inner.push(request)
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse { try await inner.pull(cursor: cursor, limit: limit, types: types) }
}
