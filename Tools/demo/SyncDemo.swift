import Foundation
import SyncStore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The sync half of the demo: two replicas of one user write offline, sync
/// through the server, meet a conflict that waits for the app, resolve it,
/// hold a photo on the phone's cellular path until it is on Wi-Fi, and
/// converge; then a third replica pulls tasks only, and hears of the
/// next task through the server's long poll; with the server's scope
/// field, a work phone pulls one project's tasks alone; with the admin
/// token, the server compacts its feed and a last replica pulls what is
/// left.
enum SyncDemo {
    static func run(server: URL, token: String, adminToken: String?, scopeField: String?, directory: String) async throws {
        var options = HTTPTransport.Options()
        options.ignoreProxies = true
        let transport = HTTPTransport(baseURL: server, token: token, options: options)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let laptop = try Store(path: directory + "/laptop", options: .init(durability: .full))
        let phone = try Store(path: directory + "/phone", options: .init(durability: .full))
        defer {
            laptop.close()
            phone.close()
        }
        let laptopSync = try SyncEngine(store: laptop, transport: transport)
        // The phone's user keeps photos off cellular.
        var phoneConfiguration = SyncConfiguration()
        phoneConfiguration.network.typesPushedOnlyOnFreePaths = ["photo"]
        let phoneSync = try SyncEngine(store: phone, transport: transport, configuration: phoneConfiguration)

        print("\n== Two replicas write offline")
        let groceries = try await laptop.create(type: "task", fields: ["title": "Buy milk", "done": false])
        try await laptop.create(type: "task", fields: ["title": "Call mum", "done": false])
        try await phone.create(type: "task", fields: ["title": "Book dentist", "done": false])
        print("laptop: \(try laptop.count(type: "task")) tasks, \(try laptop.outboxCount()) pending")
        print("phone:  \(try phone.count(type: "task")) tasks, \(try phone.outboxCount()) pending")

        print("\n== Both sync (push, then pull)")
        try await report("laptop", await laptopSync.sync(), laptopSync, server: server)
        try await report("phone", await phoneSync.sync(), phoneSync, server: server)
        try await report("laptop", await laptopSync.sync(), laptopSync, server: server)

        print("\n== Both edit the same task's title offline")
        try await phone.update(type: "task", id: groceries, changes: ["title": "Buy oat milk"])
        try await laptop.update(type: "task", id: groceries, changes: ["title": "Buy milk and bread"])
        try await report("phone", await phoneSync.sync(), phoneSync, server: server)
        try await report("laptop", await laptopSync.sync(), laptopSync, server: server)
        let waiting = try laptop.conflicts()
        for conflict in waiting {
            print("laptop: conflict on \(conflict.intent.entityType)/\(conflict.intent.entityID)")
            print("  mine:   \(conflict.intent.fields)")
            print("  server: \(conflict.conflict.serverFields) (version \(conflict.conflict.serverVersion))")
        }

        print("\n== The app resolves it: a merge of both titles")
        for conflict in waiting {
            try await laptop.resolveConflict(intentOffset: conflict.conflict.intentOffset, .merged(["title": "Buy oat milk and bread", "done": false]))
        }
        try await report("laptop", await laptopSync.sync(), laptopSync, server: server)
        try await report("phone", await phoneSync.sync(), phoneSync, server: server)

        print("\n== On cellular, the phone holds its photo for Wi-Fi")
        await phoneSync.networkPathChanged(NetworkPath(isSatisfied: true, isExpensive: true))
        let photo = try await phone.create(type: "photo", fields: ["name": "receipt.jpg", "bytes": .bytes(Array(repeating: 0xFF, count: 65_536))])
        try await phone.update(type: "task", id: groceries, changes: ["done": true])
        try await report("phone", await phoneSync.sync(), phoneSync, server: server)
        print("phone health: \(try await phoneSync.health())")
        print("phone: on Wi-Fi")
        await phoneSync.networkPathChanged(.satisfied)
        try await report("phone", await phoneSync.sync(), phoneSync, server: server)
        try await report("laptop", await laptopSync.sync(), laptopSync, server: server)
        guard try laptop.get(type: "photo", id: photo) != nil else { throw DemoError("the laptop did not get the phone's photo") }

        print("\n== Converged")
        let mine = try laptop.all(type: "task").map { "\($0.id) \($0.fields)" }
        let theirs = try phone.all(type: "task").map { "\($0.id) \($0.fields)" }
        for line in mine { print("  \(line)") }
        let photos = try laptop.all(type: "photo").map(\.id) == phone.all(type: "photo").map(\.id)
        print(mine == theirs && photos ? "laptop and phone hold the same \(mine.count) tasks and 1 photo" : "NOT CONVERGED")
        print("laptop health: \(try await laptopSync.health())")
        guard mine == theirs, photos, try laptop.conflicts().isEmpty else { throw DemoError("the replicas did not converge") }

        print("\n== A watch pulls tasks only")
        let watch = try Store(path: directory + "/watch", options: .init(durability: .full))
        defer { watch.close() }
        var watchConfiguration = SyncConfiguration()
        watchConfiguration.pulledTypes = ["task"]
        let watchSync = try SyncEngine(store: watch, transport: transport, configuration: watchConfiguration)
        try await report("watch", await watchSync.sync(), watchSync, server: server)
        let (watchTasks, watchPhotos) = (try watch.count(type: "task"), try watch.count(type: "photo"))
        print("watch: \(watchTasks) tasks and \(watchPhotos) photos (the photo's 64 KiB never came)")
        guard watchTasks == mine.count, watchPhotos == 0 else { throw DemoError("the watch pulled other types than tasks") }

        print("\n== The watch hears of the laptop's next task as it reaches the server (a long poll)")
        let listening = Task { try await watchSync.watchFeed(waitSeconds: 20) }
        defer { listening.cancel() }
        try await laptop.create(type: "task", fields: ["title": "Water plants", "done": false])
        try await report("laptop", await laptopSync.sync(), laptopSync, server: server)
        let clock = ContinuousClock()
        let synced = clock.now
        while try watch.count(type: "task") == watchTasks {
            guard clock.now - synced < .seconds(10) else { throw DemoError("the watch did not hear of the laptop's task within 10 s") }
            try await Task.sleep(for: .milliseconds(2))
        }
        let heard = (clock.now - synced).components
        print(String(
            format: "watch: %d tasks, the new one there %.0f ms after the laptop's sync ended, with no sync called on the watch",
            try watch.count(type: "task"), Double(heard.seconds) * 1000 + Double(heard.attoseconds) / 1e15))
        // Ended before its store closes.
        listening.cancel()
        _ = await listening.result

        if let scopeField {
            try await projects(laptop, laptopSync, transport: transport, scopeField: scopeField, server: server, directory: directory)
        }

        guard let adminToken else { return }
        print("\n== The server compacts its feed: a new replica pulls each entity's latest change alone")
        var request = URLRequest(url: server.appendingPathComponent("v1/admin/compact"))
        request.httpMethod = "POST"
        request.setValue("Bearer \(adminToken)", forHTTPHeaderField: "Authorization")
        let session = URLSessionConfiguration.ephemeral
        session.connectionProxyDictionary = [:]  // loopback, as the transport's `ignoreProxies`
        let (answer, response) = try await URLSession(configuration: session).data(for: request)
        guard (response as? HTTPURLResponse)?.statusCode == 200 else {
            throw DemoError("POST /v1/admin/compact: \(String(decoding: answer, as: UTF8.self))")
        }
        print("server: \(String(decoding: answer, as: UTF8.self))")
        let tablet = try Store(path: directory + "/tablet", options: .init(durability: .full))
        defer { tablet.close() }
        let tabletSync = try SyncEngine(store: tablet, transport: transport)
        let pulled = await tabletSync.sync()
        try await report("tablet", pulled, tabletSync, server: server)
        let tabletTasks = try tablet.all(type: "task", limit: 100).map { "\($0.fields["title"] ?? .null)" }.sorted()
        let laptopTasks = try laptop.all(type: "task", limit: 100).map { "\($0.fields["title"] ?? .null)" }.sorted()
        print("tablet: \(tabletTasks.count) tasks and \(try tablet.count(type: "photo")) photo from \(pulled.changes) changes")
        guard tabletTasks == laptopTasks else { throw DemoError("the tablet does not hold the laptop's tasks") }
    }

    /// The laptop adds a task to project work and one to project home; a
    /// work phone that pulls project work alone gets the tasks in no
    /// project and the work one, and the server refuses its move of that
    /// task to home (an entity's project is fixed for its life).
    private static func projects(
        _ laptop: Store, _ laptopSync: SyncEngine, transport: HTTPTransport, scopeField: String, server: URL, directory: String
    ) async throws {
        print("\n== A work phone pulls the tasks of project work only")
        let inNone = try laptop.count(type: "task")
        try await laptop.create(type: "task", fields: ["title": "Send the report", "done": false, scopeField: "work"])
        try await laptop.create(type: "task", fields: ["title": "Paint the fence", "done": false, scopeField: "home"])
        try await report("laptop", await laptopSync.sync(), laptopSync, server: server)
        let phone = try Store(path: directory + "/work-phone", options: .init(durability: .full))
        defer { phone.close() }
        var configuration = SyncConfiguration()
        configuration.pulledScopes = PulledScopes(field: scopeField, scopes: ["work"])
        let phoneSync = try SyncEngine(store: phone, transport: transport, configuration: configuration)
        try await report("work phone", await phoneSync.sync(), phoneSync, server: server)
        let tasks = try phone.all(type: "task", limit: 100)
        let work = tasks.filter { $0.fields[scopeField] == "work" }
        print("work phone: \(tasks.count) tasks: the \(inNone) in no project and \(work.count) of work, none of home")
        guard tasks.count == inNone + 1, let report = work.first, work.count == 1 else {
            throw DemoError("the work phone holds other tasks than those of work and of no project")
        }
        print("work phone: moves \(report.fields["title"] ?? .null) to project home")
        try await phone.update(type: "task", id: report.id, changes: [scopeField: "home"])
        let moved = await phoneSync.sync()
        try await Self.report("work phone", moved, phoneSync, server: server)
        let after = try phone.get(type: "task", id: report.id)?.fields[scopeField]
        print("work phone: the server rejected the move (\(moved.rejected) rejected); the task is in project \(after ?? .null) again")
        guard moved.rejected == 1, after == "work" else { throw DemoError("the server did not refuse the move to another project") }
    }

    /// Prints how a run ended, and ends the demo when it failed or found
    /// the server unreachable: the steps after it rely on what it synced
    /// (an offline run went on to fail at an update of a task the other
    /// replica never pulled, naming the task, not the server).
    private static func report(_ name: String, _ report: SyncReport, _ engine: SyncEngine, server: URL) async throws {
        print("\(name): \(report.outcome); acked \(report.acknowledged), rejected \(report.rejected), conflicts \(report.conflicts), pulled \(report.changes)")
        if case .failed(let message) = report.outcome { throw DemoError("\(name): sync failed: \(message)") }
        if case .offline = report.outcome {
            let reason = try await engine.health().offlineReason ?? "its health check failed"
            throw DemoError("\(name): the server \(server.absoluteString) is unreachable: \(reason)")
        }
    }
}

struct DemoError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
