import Foundation
import LMDB
import LogFormat
import LogStore
import LogSync
import LogTesting
import Testing

/// A store whose environment fails under a running engine (a full disk, in
/// life; here its data file cut while open, which a test can make and mend
/// in-process) fails the engine's runs as store errors, and the same
/// engine syncs again once the store is whole: the store opens its
/// environment again by itself, and nothing needs rebuilding.
@Suite struct FailedStoreTests {
    @Test func theSameEngineSyncsAgainOnceItsStoreIsMended() async throws {
        let server = try await TestServer("failed-store")
        let a = try Replica("failed-store-a", server: server)
        let b = try Replica("failed-store-b", server: server)
        _ = try await a.store.create(type: "task", id: "t1", fields: ["title": "one"])
        try await a.syncUntilQuiet()
        _ = try await a.store.create(type: "task", id: "t2", fields: ["title": "two"])

        let cut = try DataFileCut(directory: a.directory.path, toBytes: 4_096 * 3)
        #expect(throws: LMDBError.self) { try a.store.log.checkDataFileWhole() }

        // The run fails on the store, after the health check: a failed run
        // with its backoff, not a server failure (the breaker stays shut).
        let failed = await a.sync().outcome
        let message: String? = if case .failed(let message) = failed { message } else { nil }
        #expect(message?.hasPrefix("store: ") == true && message?.contains("data file truncated") == true, "\(failed)")

        try cut.mend()
        let health = try await a.engine.health()
        #expect(health.lastError == message && health.breakerOpenUntil == nil && health.pendingCount == 1, "\(health)")
        // "Sync now" keeps no backoff: the same engine, over the same store.
        #expect(await a.sync().outcome == .completed)
        #expect(try a.store.outboxSummary().pendingCount == 0)
        try await b.syncUntilQuiet()
        #expect(try b.entities("task").keys.sorted() == ["t1", "t2"])
        #expect(try a.entities("task") == b.entities("task"))
        await server.stop()
    }
}
