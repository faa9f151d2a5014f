import Foundation

/// A built executable of this package, run to its end as a person runs it
/// from a shell: its exit status and what it printed.
public struct ToolRun: Sendable {
    public var status: Int32
    public var output: String
    public var errors: String

    public var lines: [String] { output.split(separator: "\n").map(String.init) }

    /// The path of the executable `name` in a directory of `PATH`
    /// (`/usr/bin:/bin` without one), or nil when none holds it.
    public static func onPath(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return path.split(separator: ":").map { "\($0)/\(name)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// The path of `product` as built with the tests running now: beside
    /// the test executable, where `swift build` puts every product of one
    /// build (`-c release` and `--scratch-path` move them all). Only when
    /// the tests run from somewhere else, the debug build under the package
    /// `root`. Not that one first: it may be another build's, and stale.
    public static func builtProduct(_ product: String, root: URL) -> String {
        if let runner = Bundle.main.executableURL?.resolvingSymlinksInPath() {
            let beside = runner.deletingLastPathComponent().appendingPathComponent(product).path
            if FileManager.default.isExecutableFile(atPath: beside) { return beside }
        }
        return root.appendingPathComponent(".build/debug/\(product)").path
    }

    /// Runs `executable` with `arguments` (stdin /dev/null) and waits for it
    /// to end, blocking the calling thread. A tool ended by a signal has
    /// the status a shell gives it, 128 plus the signal.
    /// - Throws: `ChildProcessError` when it cannot start (no such file, not
    ///   executable).
    public static func run(_ executable: String, _ arguments: [String]) throws -> ToolRun {
        let child = try ChildProcess(executable: executable, arguments: arguments)
        let ending = child.waitUntilExit()
        return ToolRun(status: ending.status, output: child.outputText, errors: child.errorText)
    }

    /// `run(_:_:)` on a thread of its own, so that an async test never holds
    /// a thread of the cooperative pool while the tool runs.
    public static func running(_ executable: String, _ arguments: [String]) async throws -> ToolRun {
        try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try run(executable, arguments) }) }.start()
        }
    }
}
