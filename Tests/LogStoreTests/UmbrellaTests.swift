import Foundation
import SyncStore
import Testing

/// What an app gets from `import SyncStore` alone (this file imports
/// nothing else of the package).
@Suite struct UmbrellaTests {
    /// The errors the store's calls throw can be named and matched: a
    /// second open of the same store is refused with `LMDBError`.
    @Test func theStoresLMDBErrorIsNamedWithoutImportingLMDB() throws {
        let directory = NSTemporaryDirectory() + "umbrella-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try Store(path: directory)
        defer { store.close() }
        #expect { try Store(path: directory) } throws: { ($0 as? LMDBError)?.code == .alreadyOpen }
    }

    /// The README's example of reads through one snapshot compiles and
    /// answers with `import SyncStore` alone.
    @Test func theReadmesSnapshotExampleReads() async throws {
        let directory = NSTemporaryDirectory() + "umbrella-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try Store(path: directory)
        defer { store.close() }
        let id = try await store.create(type: "te", fields: ["description": "Write the spec", "minutes": 30])
        var batch = WriteBatch()
        let projectID = try batch.create(type: "prj", fields: ["name": "Sync"])
        try await store.write(batch)
        let (project, entries) = try store.read { snapshot in
            (try snapshot.get(type: "prj", id: projectID), try snapshot.all(type: "te", limit: 50))
        }
        #expect(project?.fields == ["name": "Sync"])
        #expect(entries.map(\.id) == [id])
    }

    /// The README's syncing example builds with `import SyncStore` (and
    /// Foundation, for `URL`) alone; its engine reports its state. (Nothing
    /// listens at the URL, so the scheduler is not started.)
    @Test func theReadmesSyncExampleBuilds() async throws {
        let directory = NSTemporaryDirectory() + "umbrella-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try Store(path: directory)
        defer { store.close() }
        let transport = HTTPTransport(baseURL: URL(string: "https://sync.example.com")!, token: "token")
        var configuration = SyncConfiguration()
        configuration.conflictStrategies["note"] = .fieldMerge(prefer: .local)
        let engine = try SyncEngine(store: store, transport: transport, configuration: configuration)
        let scheduler = SyncScheduler(engine: engine, monitor: LinuxConnectivityMonitor())
        for await state in engine.states() {
            #expect(state == .idle)
            break
        }
        #expect(await scheduler.triggered.isEmpty)
    }

    /// The README's example of the log on its own prints what it says.
    @Test func theReadmesLogExamplePrintsItsEntry() async throws {
        let directory = NSTemporaryDirectory() + "umbrella-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let log = try EventLog(path: directory)
        defer { log.close() }
        let offset = try await log.append(.resync(reason: "example"))
        var scanner = log.entries(from: 1)
        var printed: [String] = []
        while let entry = try scanner.next() { printed.append("\(entry)") }
        #expect(offset == 1 && printed == ["#1 resync example"])
    }
}
