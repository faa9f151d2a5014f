import ArgumentParser
import Foundation
import LogStore
import LogTesting

/// Runs one store workload's checks, as the harness runs them after a
/// kill, on a store and the reports of its workers read from a file. The
/// checks are what decides a run; this lets a test hand them a store or
/// reports made to break one promise and see them catch it, where a
/// killed writer breaks none.
struct CheckCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Check a store against its workers' reports, as after a kill (to test the checks).",
        discussion: """
            --reports is a file of the lines the workers wrote (ready, try, ack, ...). Prints each violation and a \
            last line: crashtest check: A acknowledged writes checked, V violations. \
            Exit status: 0 every check passed, 1 a violation, 2 the check could not run, 64 usage.
            """)

    @Option(help: "The workload whose checks run: one whose writer is killed on a store (append, app, pull, outbox, compact, replay, conflicts).")
    var workload: String
    @Option(help: "The store's directory.") var store: String
    @Option(help: "The file of the workers' reports, one a line.") var reports: String
    @Option(help: "The durability the store is reopened with.") var durability = "full"

    func validate() throws {
        guard Workloads.stores.contains(where: { $0.name == workload }) else {
            throw ValidationError("--workload \(workload) is none of \(Workloads.stores.map { $0.name }.joined(separator: ", "))")
        }
        guard Durability(rawValue: durability) != nil else { throw ValidationError("--durability must be full, metaAsync or process") }
    }

    func run() async throws {
        guard let recipe = Workloads.stores.first(where: { $0.name == workload }) else { throw ExitCode(64) }
        let lines: [String]
        let scratch: String
        do {
            lines = try String(contentsOfFile: reports, encoding: .utf8).split(separator: "\n").map(String.init)
            scratch = try TemporaryStores.make()
        } catch {
            FileHandle.standardError.write(Data("crashtest check: \(error)\n".utf8))
            throw ExitCode(2)
        }
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let options = HarnessOptions(
            iterations: 1, seed: 0, durability: Durability(rawValue: durability) ?? .full, delayMillisecondsMax: 0,
            directory: scratch, executable: "", syncserver: "", injectViolation: false)
        var context = IterationContext(options: options, workload: workload, iteration: 0, random: SeededRandom(seed: 0))
        await Self.check(recipe, store: store, lines: lines, &context)
        for violation in context.tally.violations { Harness.say("crashtest: VIOLATION \(violation)") }
        Harness.say("crashtest check: \(context.tally.checks) acknowledged writes checked, \(context.tally.violations.count) violations")
        if !context.tally.violations.isEmpty { throw ExitCode(1) }
    }

    private static func check<Recipe: StoreWorkload>(
        _: Recipe.Type, store: String, lines: [String], _ context: inout IterationContext
    ) async {
        var ledger = Ledger()
        ledger.append(WorkerRun.parse(lines, &context))
        await StoreCheck.afterCrash(Recipe.self, directory: store, ledger: ledger, &context)
    }
}
