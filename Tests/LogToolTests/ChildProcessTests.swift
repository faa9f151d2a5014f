import Foundation
import LogTesting
import Testing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The child processes the tests and the crash harness start.
@Suite struct ChildProcessTests {
    /// A child gets its own stdin, stdout and stderr and no other descriptor
    /// of this process, even with over a thousand open (plain pipes, which
    /// exec would not close): Foundation's `Process` could crash listing
    /// that many, and a child holding another's pipe would keep it open.
    /// The tools the tests run are the ones built with them, found beside
    /// the test executable: not `.build/debug` under the package, which a
    /// `swift test -c release` or `--scratch-path` build does not write
    /// (and may hold an older build's).
    @Test func theToolsRunAreTheOnesBuiltWithTheTests() throws {
        let runner = try #require(Bundle.main.executableURL?.resolvingSymlinksInPath())
        let logtool = ToolRun.builtProduct("logtool", root: URL(fileURLWithPath: "/nonexistent-package"))
        #expect(logtool == runner.deletingLastPathComponent().appendingPathComponent("logtool").path)
        #expect(FileManager.default.isExecutableFile(atPath: logtool))
    }

    @Test func aChildInheritsNoDescriptorEvenWithManyOpen() throws {
        var held: [Int32] = []
        defer { held.forEach { close($0) } }
        for _ in 0..<750 {
            var fds: [Int32] = [-1, -1]
            guard pipe(&fds) == 0 else { break }
            held += fds
        }
        try #require(held.count >= 1_000, "could open only \(held.count) descriptors")
        for _ in 0..<3 {
            let listing = try ToolRun.run("/bin/ls", ["/proc/self/fd"])
            #expect(listing.status == 0, "\(listing.errors)")
            // 0, 1 and 2, and the one ls opened to list the directory.
            #expect(listing.lines.count == 4, "\(listing.lines)")
        }
    }

    @Test func exitStatusSignalAndOutputAreReported() async throws {
        let shell = try ChildProcess(executable: "/bin/sh", arguments: ["-c", "echo out; echo err >&2; exit 3"])
        #expect(await shell.waitForExit(timeout: .seconds(60)))
        #expect(shell.ending == .exit(3))
        #expect(shell.outputLines == ["out"] && shell.errorText == "err\n")

        let sleeper = try ChildProcess(executable: "/bin/sleep", arguments: ["30"])
        #expect(sleeper.isRunning)
        sleeper.kill()
        #expect(await sleeper.waitForExit(timeout: .seconds(60)))
        #expect(sleeper.ending == .signal(SIGKILL) && sleeper.ending.status == 128 + SIGKILL)
    }

    /// A child started in a process group of its own takes its own children
    /// with it when killed (the crash harness's `strace` and the worker it
    /// traces: killing strace alone leaves the worker running, detached).
    @Test func killingAGroupLeaderKillsItsChildren() async throws {
        let shell = try ChildProcess(
            executable: "/bin/sh", arguments: ["-c", "sleep 300 & echo $!; wait"], ownProcessGroup: true)
        let line = await shell.waitForLine(timeout: .seconds(60)) { !$0.isEmpty }
        let grandchild = try #require(line.flatMap { pid_t($0) }, "the shell did not say its child's pid")
        defer { _ = kill(grandchild, SIGKILL) }
        shell.kill()
        #expect(await shell.waitForExit(timeout: .seconds(60)))
        // Killed, it is gone or a zombie waiting for init; left running, it sleeps.
        var state = processState(grandchild)
        for _ in 0..<300 where state != nil && state != "Z" {
            try await Task.sleep(for: .milliseconds(10))
            state = processState(grandchild)
        }
        #expect(state == nil || state == "Z", "the shell's child is still in state \(state ?? "?")")
    }

    /// A wait looks at the child once more at its deadline: a poll that
    /// woke past it (a busy host: a full test run with a release build
    /// beside it) reported a server that had stopped as still running, and
    /// `SyncServerProcessTests` failed. A zero timeout is a wake past the
    /// deadline at once.
    @Test func aWaitLooksOnceMoreAtItsDeadline() async throws {
        let shell = try ChildProcess(executable: "/bin/sh", arguments: ["-c", "echo done"])
        #expect(await shell.waitForExit(timeout: .seconds(60)))
        #expect(await shell.waitForExit(timeout: .zero))
        #expect(await shell.waitForLine(timeout: .zero) { $0 == "done" } == "done")

        let sleeper = try ChildProcess(executable: "/bin/sleep", arguments: ["30"])
        defer { sleeper.kill() }
        #expect(await sleeper.waitForExit(timeout: .zero) == false)
        #expect(await sleeper.waitForLine(timeout: .zero) { _ in true } == nil)
    }

    @Test func aMissingExecutableIsAnErrorNamingIt() {
        #expect {
            try ChildProcess(executable: "/nonexistent/tool", arguments: [])
        } throws: { error in
            "\(error)".contains("/nonexistent/tool") && "\(error)".contains("No such file")
        }
    }
}

/// The state letter of process `pid` in /proc (R, S, Z...), nil when there is none.
private func processState(_ pid: pid_t) -> String? {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let end = stat.lastIndex(of: ")")
    else { return nil }
    return stat[stat.index(after: end)...].split(separator: " ").first.map(String.init)
}
