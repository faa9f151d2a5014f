import Foundation
import LogFormat
import LogStore
import LogSync
import LogTesting
import Testing

/// `SyncConfiguration.compactAfterOffsets`: an engine that compacts its
/// store's log at the end of a completed run once enough was written since
/// the last compaction, against the real server over loopback.
@Suite struct CompactAfterOffsetsTests {
    private func compactingAfter(_ offsets: UInt64) -> SyncConfiguration {
        var configuration = SyncConfiguration()
        configuration.compactAfterOffsets = offsets
        return configuration
    }

    /// A completed run compacts below the log's last offset when at least
    /// the configured offsets came since the last compaction, and not
    /// before; what the app sees and the pull cursor stay, and the replica
    /// goes on syncing without a resync.
    @Test func aCompletedRunCompactsOnceEnoughWasWritten() async throws {
        let server = try await TestServer("compact-after")
        defer { Task { await server.stop() } }
        let other = try Replica("compact-after-other", server: server)
        let replica = try Replica("compact-after-replica", server: server, configuration: compactingAfter(20))
        for n in 0..<5 { _ = try await replica.store.create(type: "task", id: "t\(n)", fields: ["n": .int(Int64(n))]) }
        var report = await replica.sync()
        #expect(report.outcome == .completed && report.compaction == nil, "\(report)")

        for n in 0..<5 { _ = try await replica.store.update(type: "task", id: "t\(n)", changes: ["n": .int(Int64(n + 10))]) }
        for n in 0..<3 { _ = try await other.store.create(type: "note", id: "n\(n)", fields: [:]) }
        try await other.syncUntilQuiet()
        report = await replica.sync()
        let last = try replica.store.log.lastOffset()
        let compaction = try #require(report.compaction, "\(report)")
        #expect(report.outcome == .completed && last >= 20 && compaction.watermark == last, "\(report)")
        #expect(compaction.entriesRemoved > 0, "\(compaction)")
        #expect(try replica.store.compactedBelow() == last)
        #expect(try replica.entities("task").count == 5 && replica.entities("note").count == 3)
        let scratch = try TemporaryDirectory("compact-after-verify")
        #expect(try await replica.store.verifyProjections(scratchDirectory: scratch.path).isEmpty)

        // Written since: under 20 offsets, no compaction.
        _ = try await replica.store.update(type: "task", id: "t0", changes: ["n": 99])
        report = await replica.sync()
        #expect(report.outcome == .completed && report.compaction == nil, "\(report)")
        #expect(try replica.store.compactedBelow() == last)
        // 20 more: compacted again, with the app's last edit kept.
        for n in 0..<20 { _ = try await other.store.create(type: "note", id: "m\(n)", fields: [:]) }
        try await other.syncUntilQuiet()
        report = await replica.sync()
        #expect(try report.compaction != nil && replica.entities("note").count == 23, "\(report)")
        let compacted = try replica.store.compactedBelow()
        #expect(compacted > last, "compacted below \(compacted), last time \(last)")
        #expect(try replica.entities("task")["t0"] == ["n": 99] && replica.store.outboxCount() == 0)

        // The other replica's change still comes, from the cursor the compaction kept.
        _ = try await other.store.update(type: "note", id: "n0", changes: ["seen": true])
        try await other.syncUntilQuiet()
        report = await replica.sync()
        #expect(report.outcome == .completed && report.changes == 1 && report.resyncs == 0, "\(report)")
    }

    /// 0 offsets is a configuration error.
    @Test func zeroOffsetsIsAConfigurationError() {
        let error = #expect(throws: SyncConfigurationError.self) { try compactingAfter(0).validate() }
        #expect(error?.description.contains("compactAfterOffsets 0") == true)
    }
}
