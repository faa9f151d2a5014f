import Foundation
import LogFormat
import LogServer
import LogTesting
import Synchronization
import Testing

/// Many clients at once over loopback HTTP: pushes from several writers
/// interleave on shared entities while readers page the feed. The classic
/// way a feed loses a change is a change numbered below a cursor already
/// handed out that commits after it; each reader here checks that it sees
/// every change once, with each entity's versions dense along the feed,
/// and ends with the server's state.
@Suite struct ConcurrentClientTests {
    static let writerCount = 6
    static let requestsPerWriter = 20
    static let readerCount = 4
    static let sharedEntities = ["s0", "s1", "s2"]

    final class Flag: Sendable {
        private let value = Atomic(false)
        func set() { value.store(true, ordering: .sequentiallyConsistent) }
        var isSet: Bool { value.load(ordering: .sequentiallyConsistent) }
    }

    /// What a reader built from the feed: per entity, its last version and
    /// fields (nil once deleted), and every (entity, version) it saw.
    struct Replica: Equatable {
        struct State: Equatable {
            var version: UInt64
            var data: Fields?
        }

        var entities: [String: State] = [:]
        var seen: Set<String> = []
        var problems: [String] = []

        mutating func apply(_ change: PullChange) {
            let name = "\(change.entityType)/\(change.entityID)"
            let expected = (entities[name]?.version ?? 0) + 1
            if change.serverVersion != expected { problems.append("\(name): version \(change.serverVersion) after \(expected - 1)") }
            if !seen.insert("\(name)@\(change.serverVersion)").inserted { problems.append("\(name)@\(change.serverVersion) twice") }
            entities[name] = State(version: change.serverVersion, data: change.operation == .delete ? nil : change.data)
        }
    }

    @Test func everyReaderSeesEveryChangeOfConcurrentWriters() async throws {
        let server = try await TestServer("concurrent-clients")
        defer { Task { await server.stop() } }
        let created = try await server.push(Self.sharedEntities.map { operation(.create, $0, ["n": 0]) }).decode(PushResponse.self)
        #expect(created.results.allSatisfy { $0.status == .applied })
        let writersDone = Flag()
        async let replicas = withThrowingTaskGroup(of: Replica.self) { group in
            for reader in 0..<Self.readerCount {
                group.addTask { try await Self.read(server, reader: reader, until: writersDone) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let acknowledged = try await withThrowingTaskGroup(of: [String].self) { group in
            for writer in 0..<Self.writerCount { group.addTask { try await Self.write(server, writer: writer) } }
            return try await group.reduce(into: []) { $0 += $1 }
        }
        writersDone.set()
        var reference = Replica()
        for change in try await server.pullAll(limit: 1000) { reference.apply(change) }
        #expect(reference.problems.isEmpty, "\(reference.problems.prefix(5))")
        // Every applied answer is in the feed, and the feed holds nothing else.
        #expect(Set(acknowledged).count == acknowledged.count, "two applied answers name one version")
        #expect(reference.seen == Set(acknowledged).union(Self.sharedEntities.map { "te/\($0)@1" }))
        for replica in try await replicas {
            #expect(replica.problems.isEmpty, "\(replica.problems.prefix(5))")
            #expect(replica == reference, "a reader has \(replica.seen.count) changes, the feed \(reference.seen.count)")
        }
        // Each writer's last value of its field on each shared entity won.
        for entity in Self.sharedEntities {
            let data = reference.entities["te/\(entity)"]?.data
            for writer in 0..<Self.writerCount {
                #expect(data?["w\(writer)"] == .int(Int64(Self.requestsPerWriter - 1)), "\(entity) w\(writer)")
            }
        }
    }

    /// Pushes creates, updates and deletes of the writer's own entities and
    /// an update of its own field on each shared entity, each against the
    /// version its last applied answer gave, so none conflicts. Returns
    /// "type/id@version" of every applied answer.
    static func write(_ server: TestServer, writer: Int) async throws -> [String] {
        var applied: [String] = []
        var sharedBase = Dictionary(uniqueKeysWithValues: sharedEntities.map { ($0, UInt64(1)) })
        for request in 0..<requestsPerWriter {
            let own = "w\(writer)-\(request)"
            var operations = [operation(.create, own, ["n": .int(Int64(request))])]
            if request > 0 {
                let previous = "w\(writer)-\(request - 1)"
                operations.append(
                    request % 3 == 0 ? operation(.delete, previous, base: 1) : operation(.update, previous, ["m": 1], base: 1))
            }
            operations += sharedEntities.map { operation(.update, $0, ["w\(writer)": .int(Int64(request))], base: sharedBase[$0]!) }
            let reply = try await server.push(operations)
            try #require(reply.status == 200, "writer \(writer): \(String(decoding: reply.body, as: UTF8.self))")
            for (operation, result) in zip(operations, try reply.decode(PushResponse.self).results) {
                try #require(result.status == .applied, "writer \(writer) \(operation.entityID): \(result.errorMessage ?? "")")
                let version = try #require(result.serverVersion)
                applied.append("te/\(operation.entityID)@\(version)")
                if sharedBase[operation.entityID] != nil { sharedBase[operation.entityID] = version }
            }
        }
        return applied
    }

    /// Pages the feed with varied limits while the writers run, then to its
    /// end once they are done (a pull that starts after the last answer
    /// sees every change).
    static func read(_ server: TestServer, reader: Int, until writersDone: Flag) async throws -> Replica {
        var replica = Replica()
        var cursor: String?
        let limits = [1, 2, 7, 50, 1000]
        for round in 0..<200_000 {
            try Task.checkCancellation()
            let finishing = writersDone.isSet
            let reply = try await server.pull(cursor: cursor, limit: limits[(round + reader) % limits.count])
            try #require(reply.status == 200, "reader \(reader): \(String(decoding: reply.body, as: UTF8.self))")
            let page = try reply.decode(PullResponse.self)
            for change in page.changes { replica.apply(change) }
            if page.hasMore, page.changes.isEmpty { replica.problems.append("a page with has_more and no change") }
            cursor = page.cursor
            if finishing, !page.hasMore { return replica }
        }
        replica.problems.append("reader \(reader) never reached the end")
        return replica
    }
}
