import ArgumentParser
import Foundation
import LogStore

/// The crash-recovery harness: kills a store's writer with SIGKILL at
/// random moments (or fails its syncs and writes under `strace`), reopens
/// the store, and checks that nothing acknowledged was lost.
@main
struct CrashTest: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crashtest",
        abstract: "Kill a store's writer at random moments and check that nothing acknowledged is lost.",
        discussion: """
            Workloads: \(Workloads.all.map { "\($0.name) (\($0.summary))" }.joined(separator: "; ")). \
            Run only when named: \(Workloads.onRequest.map { "\($0.name) (\($0.summary))" }.joined(separator: "; ")).
            Exit status: 0 every check passed, 1 a violation (its seed and iteration are printed), \
            2 the harness could not run, 64 usage.
            """,
        subcommands: [RunCommand.self, WorkerCommand.self, CheckCommand.self],
        defaultSubcommand: RunCommand.self)
}

struct RunCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run", abstract: "Run the workloads, each for a number of iterations (the default command).")

    @Option(help: "Iterations per workload: one kill (or one injected fault) each.")
    var iterations = 20

    @Option(help: "The seed of every random choice (default: from the clock). A failing run prints it.")
    var seed: UInt64?

    @Option(help: ArgumentHelp("The workloads, comma-separated, or all (all but those run only when named).", discussion: "One or more of: \(Workloads.names)."))
    var workload = "all"

    @Option(help: "Durability of the stores and the server: full, metaAsync or process.")
    var durability = "full"

    @Option(help: "The longest a writer runs before its kill, in milliseconds.")
    var delayMax = 250

    @Option(help: "Where the stores go, made when missing (default: a new temporary directory, removed unless a check failed).")
    var directory: String?

    @Option(help: "The syncserver executable (default: the one beside this executable).")
    var syncserver: String?

    @Flag(help: ArgumentHelp("Make each writer lie once about an acknowledgement, to show the checks catch it.", visibility: .hidden))
    var injectViolation = false

    @Flag(help: ArgumentHelp("Make each writer hang before it opens its store, to show the checks catch it.", visibility: .hidden))
    var injectHang = false

    @Flag(help: ArgumentHelp("Make each writer exit by itself before it opens its store, to show the checks catch it.", visibility: .hidden))
    var injectExit = false

    @Option(help: ArgumentHelp("How long a writer may take to open its store, in seconds.", visibility: .hidden))
    var readyWait = 60

    @Option(help: ArgumentHelp("Fail the Nth call in every io-faults run, instead of one drawn at random.", visibility: .hidden))
    var faultCall: Int?

    func validate() throws {
        guard iterations >= 1 else { throw ValidationError("--iterations must be 1 or more") }
        guard delayMax >= 0 else { throw ValidationError("--delay-max must be 0 or more") }
        guard readyWait >= 1 else { throw ValidationError("--ready-wait must be 1 or more") }
        guard (faultCall ?? 1) >= 1 else { throw ValidationError("--fault-call must be 1 or more") }
        guard Durability(rawValue: durability) != nil else { throw ValidationError("--durability must be full, metaAsync or process") }
        _ = try selectedWorkloads()
    }

    func selectedWorkloads() throws -> [any Workload.Type] {
        guard workload != "all" else { return Workloads.all }
        return try workload.split(separator: ",").map { name in
            guard let found = Workloads.named(String(name)) else {
                throw ValidationError("--workload \(name) is none of \(Workloads.names)")
            }
            return found
        }
    }

    func run() async throws {
        let executable = Bundle.main.executableURL?.path ?? CommandLine.arguments[0]
        let base: String
        do {
            base = try directory.map(TemporaryStores.prepare) ?? TemporaryStores.make()
        } catch {
            // Not a violation: the harness cannot run at all.
            FileHandle.standardError.write(Data("crashtest: \(error)\n".utf8))
            throw ExitCode(2)
        }
        let options = HarnessOptions(
            iterations: iterations, seed: seed ?? UInt64(Date().timeIntervalSince1970 * 1000), durability: Durability(rawValue: durability) ?? .full,
            delayMillisecondsMax: delayMax, directory: base, executable: executable,
            syncserver: syncserver ?? ((executable as NSString).deletingLastPathComponent as NSString).appendingPathComponent("syncserver"),
            injectViolation: injectViolation, injectHang: injectHang, injectExit: injectExit, readyWaitMax: .seconds(readyWait),
            faultCall: faultCall)
        let tally: Tally
        do {
            tally = try await Harness(options: options).run(try selectedWorkloads())
        } catch {
            // Stores are kept for a look at what went wrong; a directory of
            // our own that the run never wrote to goes.
            let empty = (try? FileManager.default.contentsOfDirectory(atPath: base).isEmpty) == true
            if directory == nil, empty { try? FileManager.default.removeItem(atPath: base) }
            let kept = directory != nil || !empty ? "; stores in \(base)" : ""
            FileHandle.standardError.write(Data("crashtest: \(error) (seed \(options.seed)\(kept))\n".utf8))
            throw ExitCode(2)
        }
        Harness.say(Harness.summary(tally, options))
        if tally.violations.isEmpty {
            if directory == nil { try? FileManager.default.removeItem(atPath: base) }
        } else {
            Harness.say("crashtest: the stores are kept in \(base)")
            throw ExitCode(1)
        }
    }
}

/// The directory for the stores of a run.
enum TemporaryStores {
    /// `--directory`: made (with its parents) when missing, and otherwise
    /// empty. The stores an earlier run left there would be checked against
    /// this run's acknowledgements: every write of theirs would look like
    /// a violation (and they are not this run's to remove).
    static func prepare(_ path: String) throws -> String {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw HarnessError("--directory \(path) is not a directory") }
            let contents = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
            guard contents.isEmpty else {
                throw HarnessError(
                    "--directory \(path) is not empty (\(contents.sorted().prefix(3).joined(separator: ", "))): "
                        + "give a new or empty directory; the stores of an earlier run there would be checked against this one's writes")
            }
            return path
        }
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        } catch {
            throw HarnessError("cannot make --directory \(path): \(error.localizedDescription)")
        }
        return path
    }

    /// A fresh temporary directory.
    static func make() throws -> String {
        let template = NSTemporaryDirectory() + "crashtest-XXXXXX"
        var bytes = Array(template.utf8CString)
        guard let made = mkdtemp(&bytes) else { throw HarnessError("cannot make a directory like \(template)") }
        return String(cString: made)
    }
}
