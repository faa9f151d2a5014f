import ArgumentParser
import Foundation
import SyncStore

/// The demo the README's first command runs. At this stage of the project
/// it shows the log: several writers record time entries concurrently while
/// offline, every write is a durable intent, and the log is read back and
/// checked. Later stages add the sync server and a second replica.
@main
struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Write intents concurrently to a store and print a summary of its log.")

    @Option(help: "The store directory (default: a new temporary directory, removed afterwards).")
    var path: String?

    @Option(help: "How many concurrent writers (devices, tabs, background tasks).")
    var writers = 8

    @Option(help: "How many time entries each writer creates.")
    var entriesPerWriter = 30

    @Option(help: "Durability: full, metaAsync or process.")
    var durability: Durability = .full

    func validate() throws {
        guard (1...256).contains(writers) else { throw ValidationError("--writers must be 1...256") }
        guard (1...10_000).contains(entriesPerWriter) else {
            throw ValidationError("--entries-per-writer must be 1...10000")
        }
    }

    func run() async throws {
        let directory = path ?? NSTemporaryDirectory() + "syncstore-demo-\(UUIDv7.Generator.shared.next().ulidString)"
        defer { if path == nil { try? FileManager.default.removeItem(atPath: directory) } }
        print("Store: \(directory) (durability \(durability))")

        let log = try EventLog(path: directory, options: .init(durability: durability))
        let started = ContinuousClock.now
        let counts = try await withThrowingTaskGroup(of: Int.self) { group in
            for writer in 0..<writers {
                group.addTask { try await Self.work(writer: writer, entries: entriesPerWriter, log: log) }
            }
            return try await group.reduce(0, +)
        }
        let elapsed = ContinuousClock.now - started
        let statistics = log.statistics
        print(
            "\(writers) writers appended \(counts) intents in \(statistics.commits) commits "
                + "(\(format(Double(statistics.writes) / Double(max(statistics.commits, 1)))) appends per commit) "
                + "in \(elapsed.formatted(.units(allowed: [.milliseconds])))")
        log.close()

        // Reopen, as an app would after a restart, and read everything back.
        let reopened = try EventLog(path: directory, options: .init(durability: durability, readOnly: true))
        try summarize(reopened)
    }

    /// One writer: creates time entries, edits some, deletes a few, each a
    /// separate durable append, as an app's UI would issue them.
    static func work(writer: Int, entries: Int, log: EventLog) async throws -> Int {
        var appended = 0
        var ids: [String] = []
        for n in 0..<entries {
            let id = PrefixedID(prefix: "te", id: UUIDv7.Generator.shared.next())!.description
            ids.append(id)
            let fields: Fields = [
                "description": .string("Task \(n) from writer \(writer)"),
                "minutes": .int(Int64(15 * (n % 8 + 1))),
                "billable": .bool(n % 3 != 0),
                "started_at": .timestamp(Int64(Date().timeIntervalSince1970 * 1_000_000)),
            ]
            _ = try await log.append(.intent(Intent(.create, idempotencyKey: key(), entityType: "te", entityID: id, fields: fields)))
            appended += 1
            if n % 4 == 3 {
                let changes: Fields = ["minutes": .int(Int64(20 * n))]
                _ = try await log.append(.intent(Intent(.update, idempotencyKey: key(), entityType: "te", entityID: ids[n - 1], fields: changes)))
                appended += 1
            }
            if n % 10 == 9 {
                _ = try await log.append(.intent(Intent(.delete, idempotencyKey: key(), entityType: "te", entityID: ids[n - 2])))
                appended += 1
            }
        }
        return appended
    }

    static func key() -> String { UUIDv7.Generator.shared.next().uuidString }

    func summarize(_ log: EventLog) throws {
        var scanner = log.entries()
        var byOperation: [String: Int] = [:]
        var entities = Set<String>()
        var first: Entry?
        var last: Entry?
        var samples: [Entry] = []
        while let entry = try scanner.next() {
            if first == nil { first = entry }
            last = entry
            if case .intent(let intent) = entry.body {
                byOperation[String(describing: intent.operation), default: 0] += 1
                entities.insert(intent.entityID)
            }
            if samples.count < 5 || entry.offset % 97 == 0 { samples.append(entry) }
        }
        guard let first, let last else {
            print("The log is empty.")
            return
        }
        print("\nLog: offsets \(first.offset)...\(last.offset), every checksum verified, no gaps")
        print("  intents by operation: " + byOperation.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
        print("  entities touched: \(entities.count)")
        print("  time span: \(last.timestamp.milliseconds - first.timestamp.milliseconds) ms (hybrid clock, strictly increasing)")
        print("\nSome entries:")
        for entry in samples.prefix(10) {
            print("  \(entry)")
        }
    }

    private func format(_ value: Double) -> String { String(format: "%.1f", value) }
}

extension Durability: ExpressibleByArgument {}
