import LogFormat
import LogStore
import LogSync
import LogTesting
import Testing

/// A server that is up but fails every push and pull: each run fails, and
/// publishes its `.error` state.
private struct FailingExchanges: SyncTransport {
    func health() async throws(TransportError) -> HealthResponse { HealthResponse(serverID: "failing") }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse {
        throw TransportError(.network, "push: down")
    }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        throw TransportError(.network, "pull: down")
    }
}

@Suite struct StateFeedTests {
    /// An engine released while an app reads its states ends the stream:
    /// a `for await` over `states()` does not wait forever for an engine
    /// that is gone.
    @Test func statesEndWhenTheEngineIsReleased() async throws {
        let directory = try TemporaryDirectory("states-released")
        let store = try Store(path: directory.path, options: .init(durability: .process))
        var engine: SyncEngine? = try SyncEngine(store: store, transport: FailingExchanges(), clock: ManualClock())
        let states = try #require(engine).states()
        weak let released = engine
        engine = nil
        #expect(released == nil)
        #expect(await ends(states), "the states of a released engine never ended")
        store.close()
    }

    /// A `states()` stream nobody reads while the engine runs and fails
    /// again and again holds the newest `stateBufferCountMax` states, the
    /// current one last, not every state since it was made.
    @Test func aStatesStreamNobodyReadsHoldsTheNewestStates() async throws {
        let directory = try TemporaryDirectory("states-unread")
        let store = try Store(path: directory.path, options: .init(durability: .process))
        var engine: SyncEngine? = try SyncEngine(store: store, transport: FailingExchanges(), clock: ManualClock())
        let states = try #require(engine).states()
        try await store.create(type: "task", fields: [:])
        for _ in 0..<200 { await engine?.sync() }
        let current = try #require(await engine?.state)
        engine = nil
        var held: [SyncState] = []
        for await state in states { held.append(state) }
        #expect(held.count == SyncEngine.stateBufferCountMax, "\(held.count) states held")
        #expect(held.last == current)
        store.close()
    }

    /// A scheduler released without `stop()` stops its listeners and
    /// timers: they let go of the engine, which is released in turn, and
    /// the app's own `states()` stream ends.
    @Test func aSchedulerReleasedWithoutStopLetsTheEngineGo() async throws {
        let directory = try TemporaryDirectory("states-scheduler-released")
        let store = try Store(path: directory.path, options: .init(durability: .process))
        var engine: SyncEngine? = try SyncEngine(store: store, transport: FailingExchanges(), clock: ManualClock())
        let states = try #require(engine).states()
        var scheduler: SyncScheduler? = SyncScheduler(
            engine: try #require(engine), clock: ManualClock(), monitor: FixedConnectivity(online: true))
        await scheduler?.start()
        try await store.create(type: "task", fields: [:])
        await scheduler?.settle()
        engine = nil
        scheduler = nil
        #expect(await ends(states), "the engine of a released scheduler was never released")
        store.close()
    }
}
