import Foundation
import LogFormat
import LogStore
import LogSync
import LogTesting
import Testing

/// A replica against a server that compacted its feed (section 8,
/// "Compaction"): a cursor below the horizon is refused, and the replica
/// resyncs and converges, reporting nothing lost.
@Suite struct CompactedFeedTests {
    @Test func aReplicaBehindACompactedFeedResyncsAndConverges() async throws {
        let server = try await TestServer("compacted-feed")
        defer { Task { await server.stop() } }
        let behind = try Replica("compacted-feed-behind", server: server)
        let other = try Replica("compacted-feed-other", server: server)
        _ = try await behind.store.create(type: "task", id: "t1", fields: ["n": 1])
        try await behind.syncUntilQuiet()
        try await other.syncUntilQuiet()
        for n in 2...3 { _ = try await other.store.update(type: "task", id: "t1", changes: ["n": .int(Int64(n))]) }
        _ = try await other.store.create(type: "task", id: "t2", fields: ["n": 1])
        try await other.syncUntilQuiet()
        _ = try await server.compact()
        let report = await behind.sync()
        #expect(report.outcome == .completed && report.resyncs == 1, "\(report)")
        #expect(try behind.entities("task") == ["t1": ["n": 3], "t2": ["n": 1]])
        #expect(behind.lostChanges.isEmpty)
        // The replica that was at the feed's end goes on without a resync.
        _ = try await behind.store.update(type: "task", id: "t2", changes: ["n": 2])
        try await behind.syncUntilQuiet()
        let otherReport = await other.sync()
        #expect(otherReport.outcome == .completed && otherReport.resyncs == 0, "\(otherReport)")
        #expect(try other.entities("task") == ["t1": ["n": 3], "t2": ["n": 2]])
    }
}
