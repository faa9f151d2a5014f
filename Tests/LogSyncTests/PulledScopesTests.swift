import Foundation
import LogFormat
import LogStore
import LogSync
import LogSyncHTTP
import LogTesting
import Testing

/// `SyncConfiguration.pulledScopes`: a replica that pulls some scopes only
/// (seed 004's `syncProjects`), against the real server over loopback,
/// whose scope field is `project`.
@Suite struct PulledScopesTests {
    private func pulling(_ scopes: Set<String>) -> SyncConfiguration {
        var configuration = SyncConfiguration()
        configuration.pulledScopes = PulledScopes(field: "project", scopes: scopes)
        return configuration
    }

    /// Writes t1 and t2 in project p1, t3 in p2, and u without one, from a
    /// replica that pulls every scope.
    private func writeProjects(_ name: String, _ server: TestServer) async throws -> Replica {
        let writer = try Replica(name, server: server)
        for (id, project) in [("t1", "p1"), ("t2", "p1"), ("t3", "p2")] {
            _ = try await writer.store.create(type: "task", id: id, fields: ["project": .string(project)])
        }
        _ = try await writer.store.create(type: "task", id: "u", fields: ["n": 1])
        try await writer.syncUntilQuiet()
        return writer
    }

    /// Changes of other scopes never come; the replica's own intents of any
    /// scope are pushed, and one in a scope it does not pull, which its
    /// pull never shows, is not reported lost (nor resynced for), nor is
    /// its own deletion.
    @Test func aReplicaPullsItsScopesAndPushesEveryScope() async throws {
        let server = try await TestServer("pulled-scopes", scopeField: "project")
        defer { Task { await server.stop() } }
        let writer = try await writeProjects("pulled-scopes-writer", server)
        let reader = try Replica("pulled-scopes-reader", server: server, configuration: pulling(["p1"]))
        try await reader.syncUntilQuiet()
        #expect(try reader.entities("task").keys.sorted() == ["t1", "t2", "u"])

        _ = try await reader.store.create(type: "task", id: "t4", fields: ["project": "p2", "n": 4])
        _ = try await reader.store.create(type: "task", id: "t5", fields: ["project": "p3"])
        _ = try await reader.store.update(type: "task", id: "t1", changes: ["n": 1])
        _ = try await reader.store.delete(type: "task", id: "t2")
        for _ in 0..<3 { #expect(await reader.sync().outcome == .completed) }
        _ = try await reader.store.delete(type: "task", id: "t5")
        for _ in 0..<2 { #expect(await reader.sync().outcome == .completed) }
        #expect(reader.lostChanges.isEmpty && reader.resyncs == 0)
        #expect(try reader.store.acknowledgedChangesNotInFeed(through: .max).isEmpty)
        #expect(try reader.entities("task").keys.sorted() == ["t1", "t4", "u"])

        try await writer.syncUntilQuiet()
        #expect(try writer.entities("task") == ["t1": ["project": "p1", "n": 1], "t3": ["project": "p2"], "t4": ["project": "p2", "n": 4], "u": ["n": 1]])
        // The writer's change to t4, in p2, is not pulled by the reader.
        _ = try await writer.store.update(type: "task", id: "t4", changes: ["n": 5])
        _ = try await writer.store.update(type: "task", id: "t1", changes: ["n": 6])
        try await writer.syncUntilQuiet()
        try await reader.syncUntilQuiet()
        #expect(try reader.entities("task")["t4"] == ["project": "p2", "n": 4])
        #expect(try reader.entities("task")["t1"] == ["project": "p1", "n": 6])
    }

    /// The server's cursor goes with the scopes it was made for: a replica
    /// whose set changes resyncs once, and then holds what the new set
    /// pulls.
    @Test func aReplicaWhoseScopesChangeResyncsOnce() async throws {
        let server = try await TestServer("pulled-scopes-change", scopeField: "project")
        defer { Task { await server.stop() } }
        _ = try await writeProjects("pulled-scopes-change-writer", server)
        let reader = try Replica("pulled-scopes-change-reader", server: server, configuration: pulling(["p1"]))
        try await reader.syncUntilQuiet()
        #expect(try reader.entities("task").keys.sorted() == ["t1", "t2", "u"] && reader.resyncs == 0)

        let transport = HTTPTransport(baseURL: server.url, token: "alice-token", options: loopback)
        let other = try SyncEngine(store: reader.store, transport: transport, clock: reader.clock, configuration: pulling(["p2"]))
        var report = await other.sync()
        #expect(report.outcome == .completed && report.resyncs == 1, "\(report)")
        #expect(try reader.entities("task").keys.sorted() == ["t3", "u"])
        report = await other.sync()
        #expect(report.outcome == .completed && report.resyncs == 0, "\(report)")

        let every = try SyncEngine(store: reader.store, transport: transport, clock: reader.clock)
        report = await every.sync()
        #expect(report.outcome == .completed && report.resyncs == 1, "\(report)")
        #expect(try reader.entities("task").keys.sorted() == ["t1", "t2", "t3", "u"])
    }

    /// An update that would move an entity to another scope is rejected by
    /// the server, and the rejection reaches the app: the entity shows its
    /// scope again, and the log holds the server's reason.
    @Test func aMoveToAnotherScopeIsRejected() async throws {
        let server = try await TestServer("pulled-scopes-move", scopeField: "project")
        defer { Task { await server.stop() } }
        _ = try await writeProjects("pulled-scopes-move-writer", server)
        let reader = try Replica("pulled-scopes-move-reader", server: server, configuration: pulling(["p1"]))
        try await reader.syncUntilQuiet()
        _ = try await reader.store.update(type: "task", id: "t1", changes: ["project": "p2"])
        #expect(try reader.entities("task")["t1"] == ["project": "p2"])
        try await reader.syncUntilQuiet()
        #expect(try reader.entities("task")["t1"] == ["project": "p1"])
        let rejects = try reader.entries(.reject)
        guard case .reject(let reject)? = rejects.first?.body else {
            Issue.record("no reject entry: \(rejects)")
            return
        }
        #expect(rejects.count == 1 && reject.code == WireErrorCode.validationError.rawValue)
        #expect(reject.message.contains("project is the server's scope field, fixed for an entity's life"), "\(reject.message)")
    }

    /// No scope, more than the protocol allows, a value the rules refuse,
    /// or a field no entity may have is a configuration error, named before
    /// any request; so is a transport that cannot pull by scope.
    @Test func pulledScopesTheProtocolRefusesAreAConfigurationError() async throws {
        let many = Set((0...Wire.pullScopesCountMax).map { "p\($0)" })
        let cases: [(PulledScopes, String)] = [
            (PulledScopes(field: "project", scopes: []), "pulledScopes names 0 scopes"),
            (PulledScopes(field: "project", scopes: many), "names 65 scopes"),
            (PulledScopes(field: "project", scopes: ["p1", "p 2"]), "\"p 2\""),
            (PulledScopes(field: "$project", scopes: ["p1"]), "pulledScopes.field"),
        ]
        for (scopes, words) in cases {
            var configuration = SyncConfiguration()
            configuration.pulledScopes = scopes
            let error = #expect(throws: SyncConfigurationError.self) { try configuration.validate() }
            #expect(error?.description.contains(words) == true, "\(String(describing: error))")
        }
        let directory = try TemporaryDirectory("pulled-scopes-transport")
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        let error = #expect(throws: SyncConfigurationError.self) {
            try SyncEngine(store: store, transport: PlainTransport(), configuration: pulling(["p1"]))
        }
        #expect(error?.description.contains("ScopedPulling") == true, "\(String(describing: error))")
    }
}

/// A transport that cannot pull by scope; never asked anything here.
private struct PlainTransport: SyncTransport {
    func health() async throws(TransportError) -> HealthResponse { throw TransportError(.noAnswer, "never asked") }
    func push(_ request: PushRequest) async throws(TransportError) -> PushResponse { throw TransportError(.noAnswer, "never asked") }
    func pull(cursor: String?, limit: Int, types: Set<String>?) async throws(TransportError) -> PullResponse {
        throw TransportError(.noAnswer, "never asked")
    }
}
