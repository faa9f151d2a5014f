import Foundation
import Synchronization

/// A built executable of this package, run to its end as a person runs it
/// from a shell: its exit status and what it printed.
public struct ToolRun: Sendable {
    public var status: Int32
    public var output: String
    public var errors: String

    public var lines: [String] { output.split(separator: "\n").map(String.init) }

    /// The path of the debug build of `product`, under the package `root`.
    public static func builtProduct(_ product: String, root: URL) -> String {
        root.appendingPathComponent(".build/debug/\(product)").path
    }

    /// Runs `executable` with `arguments` and waits for it to end, blocking
    /// the calling thread. stderr is read on a thread of its own, so a tool
    /// that fills either pipe never stalls.
    /// - Throws: what `Process.run()` throws (no such file, not executable).
    public static func run(_ executable: String, _ arguments: [String]) throws -> ToolRun {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let errorText = ErrorText()
        let reader = Thread { errorText.read(errors.fileHandleForReading) }
        reader.start()
        let out = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return ToolRun(status: process.terminationStatus, output: String(decoding: out, as: UTF8.self), errors: errorText.wait())
    }

    /// `run(_:_:)` on a thread of its own, so that an async test never holds
    /// a thread of the cooperative pool while the tool runs.
    public static func running(_ executable: String, _ arguments: [String]) async throws -> ToolRun {
        try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try run(executable, arguments) }) }.start()
        }
    }
}

/// A pipe's text, read to its end on one thread and collected by another.
private final class ErrorText: Sendable {
    private let text = Mutex("")
    private let done = DispatchSemaphore(value: 0)

    func read(_ handle: FileHandle) {
        let read = String(decoding: handle.readDataToEndOfFile(), as: UTF8.self)
        text.withLock { $0 = read }
        done.signal()
    }

    /// The text, once the pipe has ended.
    func wait() -> String {
        done.wait()
        return text.withLock { $0 }
    }
}
