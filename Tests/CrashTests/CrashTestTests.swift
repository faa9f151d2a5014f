import Foundation
import LogTesting
import Testing

/// Runs the built `crashtest` briefly, as CI does, and reads its summary.
@Suite struct CrashTestTests {
    static let executable = ToolRun.builtProduct(
        "crashtest",
        root: URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent())

    /// Runs crashtest with its stores in a temporary directory, removed
    /// afterwards even when the run keeps them (after a violation).
    static func run(_ arguments: [String]) async throws -> ToolRun {
        try #require(FileManager.default.isExecutableFile(atPath: executable), "build the crashtest product first")
        let stores = try TemporaryDirectory("crashtest-tests")
        defer { stores.remove() }
        return try await ToolRun.running(executable, arguments + ["--directory", stores.path])
    }

    struct Summary {
        var iterations: Int
        var kills: Int
        var faults: Int
        var unreached: Int
        var acknowledged: Int
        var checks: Int
        var violations: Int
    }

    /// The numbers of the last line: `crashtest: I iterations, K kills[, F
    /// I/O faults (...), U planned but never reached], A acknowledged writes
    /// checked C times, V violations (seed S, ...)`.
    static func summary(_ run: ToolRun) throws -> Summary {
        let line = try #require(run.lines.last { $0.hasPrefix("crashtest: ") && $0.contains(" violations (seed ") }, "no summary in \(run.output)")
        let words = line.split(separator: " ").map(String.init)
        func number(before word: String) -> Int {
            guard let index = words.firstIndex(where: { $0.hasPrefix(word) }), index > 0 else { return 0 }
            return Int(words[index - 1]) ?? -1
        }
        return Summary(
            iterations: number(before: "iterations"), kills: number(before: "kills"), faults: number(before: "I/O"),
            unreached: number(before: "planned"), acknowledged: number(before: "acknowledged"), checks: number(before: "times"),
            violations: number(before: "violations"))
    }

    static var straceInstalled: Bool { ToolRun.onPath("strace") != nil }

    /// Every workload whose writer is killed on a store; `sync` also syncs
    /// the store to quiet in its last iteration and checks it against its
    /// server.
    @Test func killedStoreWorkloadsKeepEveryAcknowledgedWrite() async throws {
        let run = try await Self.run(["--workload", "append,app,pull,outbox,compact,replay,conflicts,sync", "--iterations", "2", "--seed", "11"])
        #expect(run.status == 0, "\(run.output)\(run.errors)")
        let summary = try Self.summary(run)
        #expect(summary.iterations == 16 && summary.kills == 16 && summary.violations == 0, "\(run.output)")
        #expect(summary.acknowledged > 0, "no worker got to write before its kill: \(run.output)")
    }

    /// With one iteration per store, every acknowledged write is checked
    /// once, after the one kill: the summary's two numbers are equal, so
    /// neither counts a kind of acknowledgement the other leaves out.
    @Test func eachAcknowledgedWriteIsCountedAndCheckedOnce() async throws {
        let run = try await Self.run(["--workload", "append,app,pull,outbox,compact,replay,conflicts", "--iterations", "1", "--seed", "11"])
        #expect(run.status == 0, "\(run.output)\(run.errors)")
        let summary = try Self.summary(run)
        #expect(summary.acknowledged > 0 && summary.checks == summary.acknowledged, "\(run.output)")
    }

    @Test func aKilledServerKeepsEveryAppliedPush() async throws {
        let run = try await Self.run(["--workload", "server", "--iterations", "2", "--seed", "12"])
        #expect(run.status == 0, "\(run.output)\(run.errors)")
        let summary = try Self.summary(run)
        #expect(summary.kills == 2 && summary.violations == 0, "\(run.output)")
    }

    @Test(.enabled(if: straceInstalled, "strace is not installed"))
    func injectedIOFaultsFailCleanly() async throws {
        // Twelve runs: each kind of fault, to the append worker, then the
        // app worker, then the conflicts worker.
        let run = try await Self.run(["--workload", "io-faults", "--iterations", "12", "--seed", "13"])
        #expect(run.status == 0, "\(run.output)\(run.errors)")
        let summary = try Self.summary(run)
        #expect(summary.faults + summary.unreached == 12 && summary.kills == 0 && summary.violations == 0, "\(run.output)")
        // Every commit syncs: a run of 24 commits reaches any fdatasync planned.
        #expect(summary.faults >= 1, "\(run.output)")
    }

    /// Only faults that fired are counted as I/O faults. strace fails the
    /// Nth call; a run that ends before it makes one injects nothing, and
    /// was counted all the same. `--fault-call` plans the Nth call of every
    /// run: the first is always reached, the thousandth never (a run makes
    /// about 50 calls of each syscall).
    @Test(.enabled(if: straceInstalled, "strace is not installed"))
    func onlyFaultsThatFiredAreCounted() async throws {
        let reached = try await Self.run(["--workload", "io-faults", "--iterations", "4", "--seed", "13", "--fault-call", "1"])
        #expect(reached.status == 0, "\(reached.output)\(reached.errors)")
        let fired = try Self.summary(reached)
        #expect(fired.faults == 4 && fired.unreached == 0 && fired.violations == 0, "\(reached.output)")

        let unreached = try await Self.run(["--workload", "io-faults", "--iterations", "4", "--seed", "13", "--fault-call", "1000"])
        #expect(unreached.status == 0, "\(unreached.output)\(unreached.errors)")
        let none = try Self.summary(unreached)
        #expect(none.faults == 0 && none.unreached == 4 && none.violations == 0, "\(unreached.output)")
        #expect(unreached.output.contains("0 I/O faults (0 failed a write), 4 planned but never reached"), "\(unreached.output)")
    }

    /// The checker can fail: a writer that reports one write as
    /// acknowledged without making it is caught, with the seed and
    /// iteration to replay it, and the run exits 1.
    /// An strace that cannot trace (ptrace refused, as in many containers)
    /// is the harness unable to run (status 2), not a store violation; the
    /// temporary directory it made for stores it never wrote is removed.
    @Test func anStraceThatCannotTraceIsAHarnessError() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable), "build the crashtest product first")
        let bin = try TemporaryDirectory("crashtest-fake-strace")
        defer { bin.remove() }
        let fake = bin.appending("strace")
        try "#!/bin/sh\necho 'strace: PTRACE_TRACEME: Operation not permitted' >&2\nexit 1\n".write(
            toFile: fake, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: fake)
        let path = bin.path + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        let temporary = try TemporaryDirectory("crashtest-tmpdir")
        defer { temporary.remove() }
        let run = try await ToolRun.running(
            "/usr/bin/env", ["PATH=\(path)", "TMPDIR=\(temporary.path)", Self.executable, "--workload", "io-faults", "--iterations", "2"])
        #expect(run.status == 2, "\(run.output)\(run.errors)")
        #expect(run.errors.contains("strace cannot trace here") && run.errors.contains("Operation not permitted"), "\(run.errors)")
        #expect(!run.output.contains("VIOLATION"), "\(run.output)")
        #expect(!run.errors.contains("stores in"), "\(run.errors)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: temporary.path).isEmpty)
    }

    @Test(arguments: ["append", "app", "pull", "outbox", "compact", "replay", "conflicts", "server", "sync"])
    func aLyingWriterIsCaught(workload: String) async throws {
        let run = try await Self.run(["--workload", workload, "--iterations", "1", "--seed", "5", "--inject-violation"])
        #expect(run.status == 1, "\(run.output)\(run.errors)")
        #expect(run.output.contains("VIOLATION (seed 5) \(workload) iteration 0: "), "\(run.output)")
        #expect(run.output.contains("replay with: crashtest --seed 5 --workload \(workload) --iterations 1 "), "\(run.output)")
        #expect(try Self.summary(run).violations >= 1)
    }

    /// A worker that hangs while it opens its store (as a deadlock in
    /// recovery would) is a violation, and so is a run in which no write was
    /// acknowledged: it checked nothing. Both passed as clean runs.
    @Test func aHungWriterIsCaught() async throws {
        let run = try await Self.run(["--workload", "append", "--iterations", "10", "--seed", "5", "--inject-hang", "--ready-wait", "1"])
        #expect(run.status == 1, "\(run.output)\(run.errors)")
        #expect(run.output.contains("did not report ready within 1.0 seconds: it hung opening or recovering"), "\(run.output)")
        #expect(run.output.contains("no write was acknowledged in 10 iterations: nothing was checked"), "\(run.output)")
    }

    /// A worker that ends by itself before its kill (as one that crashes
    /// does) is a violation, named as such: nothing was killed mid-write,
    /// and its iteration tested no recovery.
    @Test func aWriterThatEndsBeforeItsKillIsCaught() async throws {
        let run = try await Self.run(["--workload", "append", "--iterations", "1", "--seed", "5", "--inject-exit"])
        #expect(run.status == 1, "\(run.output)\(run.errors)")
        #expect(run.output.contains("VIOLATION (seed 5) append iteration 0: the worker (seed "), "\(run.output)")
        #expect(run.output.contains(") ended by itself with "), "\(run.output)")
        #expect(try Self.summary(run).kills == 0, "\(run.output)")
    }

    /// A growth of the map that `mmap` refuses (the worker caps its own
    /// address space) leaves LMDB with no map: the store must fail the
    /// append with an `LMDBError`, and open the environment again for the
    /// next one, where it touched the unmapped pages and died with SIGSEGV.
    /// `map-limit` runs only when named (each iteration takes seconds), so
    /// `--iterations 30` in CI leaves it to this test.
    @Test func aMapThatCannotGrowFailsTheWriteAndReopensForTheNext() async throws {
        let run = try await Self.run(["--workload", "map-limit", "--iterations", "1", "--seed", "14"])
        #expect(run.status == 0, "\(run.output)\(run.errors)")
        let summary = try Self.summary(run)
        #expect(summary.iterations == 1 && summary.faults == 1 && summary.acknowledged > 0 && summary.violations == 0, "\(run.output)")
    }

    /// A disk that fills (the worker limits the size of files it writes)
    /// fails a write, and the app's reads go on; once the worker lifts the
    /// limit, its writes commit on the same `Store`, which opened its
    /// environment again by itself. Three iterations on one store: the
    /// later ones fill a disk that a store already spans.
    @Test func aStoreWritesAgainOnceAFullDiskHasRoom() async throws {
        let run = try await Self.run(["--workload", "full-disk", "--iterations", "3", "--seed", "3"])
        #expect(run.status == 0, "\(run.output)\(run.errors)")
        let summary = try Self.summary(run)
        #expect(summary.iterations == 3 && summary.faults == 3 && summary.acknowledged > 0 && summary.violations == 0, "\(run.output)")
    }

    static let prlimit = "/usr/bin/prlimit"

    /// A disk that fills while a store is created leaves LMDB's first meta
    /// page alone in `data.mdb` (LMDB writes both in one `pwrite`, cut short
    /// and reported as `ENOSPC`), as does a writer killed between the two
    /// pages. Every later open refused the directory as "not a sync store",
    /// also once there was space again; the page says nothing was ever
    /// committed, so the next open makes the store there. The full disk is
    /// a file size limit of one page on the writer (`prlimit --fsize`).
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: prlimit), "prlimit is not installed"))
    func aStoreWhoseCreationFilledTheDiskIsMadeAgain() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable), "build the crashtest product first")
        let store = try TemporaryDirectory("crashtest-creation-enospc")
        defer { store.remove() }
        // LMDB makes the lock file first, bigger than the limit; one made
        // here, bigger than it needs, it takes as it is.
        try Data(count: 65_536).write(to: URL(fileURLWithPath: store.appending("lock.mdb")))
        let worker = ["worker", "--workload", "app", "--store", store.path, "--seed", "1"]
        let full = try await ToolRun.running(Self.prlimit, ["--fsize=4096", Self.executable] + worker)
        #expect(full.status == 3 && full.errors.contains("No space left on device"), "\(full.status): \(full.errors)")
        let size = try FileManager.default.attributesOfItem(atPath: store.appending("data.mdb"))[.size] as? Int
        try #require(size == 4_096, "data.mdb is \(size ?? -1) bytes, not the first page alone")

        let writer = try ChildProcess("worker", executable: Self.executable, arguments: worker)
        defer { writer.kill() }
        let acknowledged = await writer.waitForLine(timeout: .seconds(60)) { $0.hasPrefix("ack ") }
        writer.kill()
        #expect(await writer.waitForExit(timeout: .seconds(60)))
        #expect(acknowledged != nil, "the store was not made again: \(writer.ending) \(writer.errorText)")
    }

    @Test func anUnknownWorkloadIsAUsageError() async throws {
        let run = try await Self.run(["--workload", "append,nonsense"])
        #expect(run.status == 64)
        #expect(run.errors.contains("--workload nonsense is none of append, app, pull"), "\(run.errors)")
    }

    /// `--directory` is made when missing; a file there, or a directory
    /// that is not empty, is a harness error (exit 2) before any iteration,
    /// not a violation of each one.
    @Test func theStoreDirectoryIsMadeOrRefused() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable), "build the crashtest product first")
        let parent = try TemporaryDirectory("crashtest-directory")
        defer { parent.remove() }
        let nested = parent.appending("not/yet/there")
        let made = try await ToolRun.running(Self.executable, ["--workload", "append", "--iterations", "1", "--directory", nested])
        #expect(made.status == 0, "\(made.output)\(made.errors)")
        #expect(try Self.summary(made).violations == 0)

        let file = parent.appending("a-file")
        try Data().write(to: URL(fileURLWithPath: file))
        let refused = try await ToolRun.running(Self.executable, ["--workload", "append", "--iterations", "1", "--directory", file])
        #expect(refused.status == 2)
        #expect(refused.errors.contains("--directory \(file) is not a directory"), "\(refused.errors)")
        #expect(!refused.output.contains("VIOLATION"), "\(refused.output)")

        // The stores of the first run are still there: a second run into
        // the same directory would check them against its own writes and
        // report thousands of violations that are not.
        let reused = try await ToolRun.running(Self.executable, ["--workload", "append", "--iterations", "1", "--directory", nested])
        #expect(reused.status == 2, "\(reused.output)\(reused.errors)")
        #expect(reused.errors.contains("--directory \(nested) is not empty"), "\(reused.errors)")
        #expect(!reused.output.contains("VIOLATION"), "\(reused.output)")
    }

    /// A syncserver that is not there (not built beside crashtest, a
    /// mistyped --syncserver) is named with the fix: it said "cannot start
    /// syncserver (PATH): No such file or directory".
    @Test func aMissingSyncServerIsNamedWithTheFix() async throws {
        let missing = "/nonexistent/syncserver"
        let run = try await Self.run(["--workload", "server", "--iterations", "1", "--syncserver", missing])
        #expect(run.status == 2, "\(run.output)\(run.errors)")
        #expect(run.errors.contains("no syncserver at \(missing): build it (swift build --product syncserver) or name one with --syncserver"), "\(run.errors)")
    }

    /// The harness killed outright (SIGKILL, so it cannot clean up) takes
    /// its children with it: the sync server reads the end of the stdin pipe
    /// the harness held (`--stop-at-stdin-end`) and stops; a worker dies of
    /// SIGPIPE at its next report to the harness.
    @Test func killingTheHarnessEndsItsChildren() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.executable), "build the crashtest product first")
        let stores = try TemporaryDirectory("crashtest-orphans")
        defer { stores.remove() }
        let harness = try ChildProcess(
            executable: Self.executable,
            arguments: ["--workload", "sync", "--iterations", "1000", "--seed", "13", "--directory", stores.path])
        defer { harness.kill() }

        // Wait (a minute at most) until it runs both a server and a worker.
        var children: [(pid: Int32, command: String)] = []
        for _ in 0..<3_000 {
            children = Self.children(of: harness.pid)
            let commands = Set(children.map(\.command))
            if commands.contains("syncserver") && commands.contains("crashtest") { break }
            try await Task.sleep(for: .milliseconds(20))
        }
        let commands = Set(children.map(\.command))
        try #require(commands.contains("syncserver") && commands.contains("crashtest"), "children: \(children)")

        harness.kill(SIGKILL)
        #expect(await harness.waitForExit(timeout: .seconds(60)))
        var remaining = children
        for _ in 0..<3_000 where !remaining.isEmpty {
            remaining = remaining.filter { Self.isRunning($0.pid) }
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(remaining.isEmpty, "still running a minute after the harness was killed: \(remaining)")
        for child in remaining { kill(child.pid, SIGKILL) }
    }

    /// The processes whose parent is `parent`, with their command names,
    /// from `/proc`.
    static func children(of parent: Int32) -> [(pid: Int32, command: String)] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { entry in
            guard let pid = Int32(entry), let stat = Self.stat(pid), stat.parent == parent else { return nil }
            return (pid, stat.command)
        }
    }

    /// Running: it exists and is not a zombie waiting to be reaped.
    static func isRunning(_ pid: Int32) -> Bool { Self.stat(pid).map { $0.state != "Z" } ?? false }

    /// `/proc/PID/stat`: `PID (COMMAND) STATE PPID ...`; the command may
    /// itself hold spaces and parentheses, so it ends at the last `)`.
    static func stat(_ pid: Int32) -> (command: String, state: String, parent: Int32)? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let open = text.firstIndex(of: "("), let close = text.lastIndex(of: ")")
        else { return nil }
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 2, let parent = Int32(fields[1]) else { return nil }
        return (String(text[text.index(after: open)..<close]), String(fields[0]), parent)
    }
}
