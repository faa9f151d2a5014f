import ArgumentParser
import Foundation
import SyncStore

/// The demo the README's first command runs. At this stage of the project
/// it shows the store offline: several writers (devices, tabs, background
/// tasks) record time entries concurrently, every write is a durable intent
/// in the log with its projection updated in the same commit, and the store
/// is reopened and read back. Later stages add the sync server and a second
/// replica.
@main
struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Write entities concurrently to a store and show its tables, outbox and log.")

    @Option(help: "The store directory (default: a new temporary directory, removed afterwards).")
    var path: String?

    @Option(help: "How many concurrent writers.")
    var writers = 8

    @Option(help: "How many time entries each writer creates.")
    var entriesPerWriter = 30

    @Option(help: "Durability: full, metaAsync or process.")
    var durability: Durability = .full

    @Option(help: "A sync server's URL: run the two-replica sync demo against it instead (Tools/run-demo starts one).")
    var server: String?

    @Option(help: "The bearer token for --server.")
    var token = "demo-token"

    @Option(help: "The server's --admin-token: the sync demo then also compacts the server's feed.")
    var adminToken: String?

    @Option(help: "The server's --scope-field: the sync demo then also has a phone that pulls one project's tasks alone.")
    var scopeField: String?

    func validate() throws {
        // An unset variable (`--path "$DIR"`) failed as "mkdir (): No such file or directory".
        if path?.isEmpty == true { throw ValidationError("--path must name a directory") }
        guard (1...256).contains(writers) else { throw ValidationError("--writers must be 1...256") }
        guard (1...10_000).contains(entriesPerWriter) else {
            throw ValidationError("--entries-per-writer must be 1...10000")
        }
    }

    func run() async throws {
        let directory = path ?? NSTemporaryDirectory() + "syncstore-demo-\(UUIDv7.Generator.shared.next().ulidString)"
        defer { if path == nil { try? FileManager.default.removeItem(atPath: directory) } }
        if let server {
            guard let url = URL(string: server) else { throw ValidationError("--server \(server) is not a URL") }
            return try await SyncDemo.run(
                server: url, token: token, adminToken: adminToken, scopeField: scopeField, directory: directory)
        }
        print("Store: \(directory) (durability \(durability))")

        let store = try Store(path: directory, options: .init(durability: durability))
        let started = ContinuousClock.now
        let writes = try await withThrowingTaskGroup(of: Int.self) { group in
            for writer in 0..<writers {
                group.addTask { try await Self.work(writer: writer, entries: entriesPerWriter, store: store) }
            }
            return try await group.reduce(0, +)
        }
        let elapsed = ContinuousClock.now - started
        let statistics = store.log.statistics
        print(
            "\(writers) writers made \(writes) writes in \(statistics.commits) commits "
                + "(\(String(format: "%.1f", Double(statistics.writes) / Double(max(statistics.commits, 1)))) per commit) "
                + "in \(elapsed.formatted(.units(allowed: [.milliseconds])))")
        store.close()

        // Reopen, as an app would after a restart, and read everything back.
        let reopened = try Store(path: directory, options: .init(durability: durability))
        defer { reopened.close() }
        try show(reopened)
    }

    /// One writer: creates time entries, edits some, deletes a few, each a
    /// separate durable write, as an app's UI would issue them.
    static func work(writer: Int, entries: Int, store: Store) async throws -> Int {
        var writes = 0
        var ids: [String] = []
        for n in 0..<entries {
            let fields: Fields = [
                "description": .string("Task \(n) from writer \(writer)"),
                "minutes": .int(Int64(15 * (n % 8 + 1))),
                "billable": .bool(n % 3 != 0),
                "started_at": .timestamp(Int64(Date().timeIntervalSince1970 * 1_000_000)),
            ]
            ids.append(try await store.create(type: "te", fields: fields))
            writes += 1
            if n % 4 == 3 {
                try await store.update(type: "te", id: ids[n - 1], changes: ["minutes": .int(Int64(20 * n))])
                writes += 1
            }
            if n % 10 == 9 {
                try await store.delete(type: "te", id: ids[n - 2])
                writes += 1
            }
        }
        return writes
    }

    func show(_ store: Store) throws {
        let count = try store.count(type: "te")
        print("\nTime entries visible: \(count) (each pending until a server acknowledges it)")
        for entity in try store.all(type: "te", limit: 3) {
            print("  \(entity.id) \(entity.fields)")
        }
        let outbox = try store.outbox()
        print("\nOutbox: \(outbox.count) intents waiting to be pushed, oldest first")
        for pending in outbox.prefix(3) {
            print("  #\(pending.offset) \(pending.intent.operation) \(pending.intent.entityID)")
        }

        var scanner = store.log.entries()
        var byOperation: [String: Int] = [:]
        var checked = 0
        while let entry = try scanner.next() {
            checked += 1
            if case .intent(let intent) = entry.body { byOperation["\(intent.operation)", default: 0] += 1 }
        }
        print("\nLog: \(checked) entries, every checksum verified, offsets dense")
        print("  intents: " + byOperation.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
        let last = try store.log.lastOffset()
        print("  last entries:")
        for offset in (last > 2 ? last - 2 : 1)...max(last, 1) {
            if let entry = try store.log.entry(at: offset) { print("    \(entry)") }
        }
    }
}

extension Durability: ExpressibleByArgument {}
