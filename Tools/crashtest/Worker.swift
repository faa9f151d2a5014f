import ArgumentParser
import Foundation
import LogStore

/// What a workload's writer gets in the worker process.
struct Worker: Sendable {
    /// The most writes one worker makes; a bound it never meets before
    /// its kill, there only so that every loop has one.
    static let writeCountMax = 100_000_000

    let store: String
    let durability: Durability
    let seed: UInt64
    let reporter: Reporter
    /// Stop after this many writes, made one at a time (fault runs need
    /// a known order of syscalls); nil: write concurrently until killed.
    let count: Int?
    /// The sync server's base URL, for workers that sync.
    let server: String?
    /// `SyncConfiguration.compactAfterOffsets`, for workers that sync.
    var compactAfterOffsets: UInt64?

    var options: EventLog.Options { EventLog.Options(durability: durability) }
    var writesMax: Int { count ?? Worker.writeCountMax }
    /// Short and unique per worker, for keys and entity ids.
    var tag: String { String(seed, radix: 36) }

    /// A map for workloads whose commits should find it full (16 pages):
    /// a new store outgrows it in its first worker, and a reopened one is
    /// mapped at its pages in use (LMDB rounds the size up to them), so
    /// commits grow the map and run their group again, the first ones after
    /// each reopen among them, and kills land in that too.
    static let smallMapSize = 64 << 10

    /// Opens the store and, unless the workload says it later (after
    /// setting up what its kills should land in), reports `ready`.
    /// - Parameter smallMap: start with `smallMapSize`, not the default map.
    func openStore(reportingReady: Bool = true, smallMap: Bool = false) throws -> Store {
        var options = options
        if smallMap { options.initialMapSize = Worker.smallMapSize }
        let opened = try Store(path: store, options: options)
        if reportingReady { reporter.send("ready") }
        return opened
    }

    /// One of a worker's concurrent loops.
    typealias Loop = @Sendable () async throws -> Void

    /// Runs the loops concurrently until all end; the first error ends them
    /// all, and the worker.
    static func runAll(_ loops: [Loop]) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for loop in loops { group.addTask(operation: loop) }
            try await group.waitForAll()
        }
    }
}

struct WorkerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "worker",
        abstract: "Run one workload's writer on a store, reporting to stdout (the harness starts it).",
        discussion: "Exit status 3: a write failed; the error is on stderr.",
        shouldDisplay: false)

    @Option var workload: String
    @Option var store: String
    @Option var durability = "full"
    @Option var seed: UInt64
    @Option(help: "Stop after this many writes, made one at a time.") var count: Int?
    @Flag(help: "Report one write as acknowledged without making it.") var lie = false
    @Flag(help: "Hang before opening the store, reporting nothing.") var hang = false
    @Flag(help: "Exit (status 0) before opening the store, reporting nothing.") var exitEarly = false
    @Option(help: "The sync server's base URL (the sync workload).") var server: String?
    @Option(help: "Compact the log after sync runs, every this many offsets (the sync workload).") var compactAfter: UInt64?

    func validate() throws {
        guard Workloads.worker(named: workload) != nil else {
            throw ValidationError("--workload \(workload) has no worker")
        }
        guard Durability(rawValue: durability) != nil else { throw ValidationError("--durability \(durability) is unknown") }
        if let count, count < 1 { throw ValidationError("--count must be 1 or more") }
        if let compactAfter, compactAfter < 1 { throw ValidationError("--compact-after must be 1 or more") }
    }

    func run() async throws {
        guard let kind = Workloads.worker(named: workload) else { throw ExitCode(64) }
        // Until the harness kills it.
        while hang { try? await Task.sleep(for: .seconds(3_600)) }
        if exitEarly { return }
        let worker = Worker(
            store: store, durability: Durability(rawValue: durability) ?? .full, seed: seed, reporter: Reporter(lying: lie),
            count: count, server: server, compactAfterOffsets: compactAfter)
        do {
            try await kind.work(worker)
        } catch {
            FileHandle.standardError.write(Data("crashtest worker (\(workload) on \(store)): \(type(of: error)): \(error)\n".utf8))
            throw ExitCode(3)
        }
    }
}
