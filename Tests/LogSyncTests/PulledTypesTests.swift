import Foundation
import LogFormat
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting
import Testing

/// `SyncConfiguration.pulledTypes`: a replica that pulls some types only,
/// against the real server over loopback.
@Suite struct PulledTypesTests {
    private func tasksOnly() -> SyncConfiguration {
        var configuration = SyncConfiguration()
        configuration.pulledTypes = ["task"]
        return configuration
    }

    /// Changes of other types never come; the replica's own intents of any
    /// type are pushed, and one of a type it does not pull, which its pull
    /// never shows, is not reported lost (nor resynced for).
    @Test func aReplicaPullsItsTypesAndPushesEveryType() async throws {
        let server = try await TestServer("pulled-types")
        let everything = try Replica("pulled-types-all", server: server)
        let tasks = try Replica("pulled-types-tasks", server: server, configuration: tasksOnly())
        for n in 0..<2 {
            _ = try await everything.store.create(type: "task", id: "t\(n)", fields: ["n": .int(Int64(n))])
            _ = try await everything.store.create(type: "photo", id: "p\(n)", fields: ["n": .int(Int64(n))])
        }
        try await everything.syncUntilQuiet()
        try await tasks.syncUntilQuiet()
        #expect(try tasks.entities("task").keys.sorted() == ["t0", "t1"])
        #expect(try tasks.entities("photo").isEmpty)

        _ = try await tasks.store.create(type: "photo", id: "p-from-tasks", fields: ["n": 9])
        _ = try await tasks.store.update(type: "task", id: "t0", changes: ["n": 10])
        for _ in 0..<3 { #expect(await tasks.sync().outcome == .completed) }
        #expect(tasks.lostChanges.isEmpty && tasks.resyncs == 0)
        #expect(try tasks.store.acknowledgedChangesNotInFeed(through: .max).isEmpty)
        // Its own photo stays as the app wrote it (the server confirmed it).
        #expect(try tasks.entities("photo") == ["p-from-tasks": ["n": 9]])
        try await everything.syncUntilQuiet()
        #expect(try everything.entities("photo")["p-from-tasks"] == ["n": 9])
        #expect(try everything.entities("task")["t0"] == ["n": 10])
        await server.stop()
    }

    /// The server's cursor goes with the types it was made for: a replica
    /// whose set changes resyncs once, and then holds what the new set
    /// pulls (a type it stopped pulling is forgotten with the rest of the
    /// confirmed state; its pending intents would stay).
    @Test func aReplicaWhoseTypesChangeResyncsOnce() async throws {
        let server = try await TestServer("pulled-types-change")
        let writer = try Replica("pulled-types-change-writer", server: server)
        _ = try await writer.store.create(type: "task", id: "t0", fields: [:])
        _ = try await writer.store.create(type: "photo", id: "p0", fields: [:])
        try await writer.syncUntilQuiet()
        let reader = try Replica("pulled-types-change-reader", server: server, configuration: tasksOnly())
        try await reader.syncUntilQuiet()
        #expect(try reader.entities("photo").isEmpty && reader.resyncs == 0)

        var every = try SyncEngine(
            store: reader.store, transport: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback),
            clock: reader.clock)
        var report = await every.sync()
        #expect(report.outcome == .completed && report.resyncs == 1, "\(report)")
        #expect(try reader.entities("photo").keys.sorted() == ["p0"] && reader.entities("task").keys.sorted() == ["t0"])
        report = await every.sync()
        #expect(report.outcome == .completed && report.resyncs == 0, "\(report)")

        every = try SyncEngine(
            store: reader.store, transport: HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback),
            clock: reader.clock, configuration: tasksOnly())
        report = await every.sync()
        #expect(report.outcome == .completed && report.resyncs == 1, "\(report)")
        #expect(try reader.entities("photo").isEmpty && reader.entities("task").keys.sorted() == ["t0"])
        await server.stop()
    }

    /// No type, more than the protocol allows, or a name the rules refuse
    /// is a configuration error, named before any request.
    @Test func pulledTypesTheProtocolRefusesAreAConfigurationError() throws {
        let many = Set((0...Wire.pullTypesCountMax).map { "t\($0)" })
        for (types, words) in [(Set<String>(), "pulledTypes names 0 types"), (many, "names 65 types"), (["task", "Photo"], "\"Photo\"")] {
            var configuration = SyncConfiguration()
            configuration.pulledTypes = types
            let error = #expect(throws: SyncConfigurationError.self) { try configuration.validate() }
            #expect(error?.description.contains(words) == true, "\(String(describing: error))")
        }
    }
}
