import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A process the harness starts, watches and kills: a worker, `strace`
/// running a worker, or `syncserver`.
///
/// Foundation's `Process` starts it with `posix_spawn`, so the child is a
/// fresh exec of its binary and never a `fork()` of this process, whose
/// open stores it must not inherit. Its stdout and stderr are each read to
/// the end by a thread of their own: a child that writes more than a pipe
/// holds never blocks, and the parent's waits stay off Swift's cooperative
/// pool (the harness polls, with short sleeps, instead of blocking).
final class ChildProcess: Sendable {
    /// How often waits look at the child again.
    static let pollInterval = Duration.milliseconds(2)

    let name: String
    private let process: Process
    private let output = PipeCollector()
    private let errors = PipeCollector()
    /// The child's stdin, never written: when this process ends, even by
    /// SIGKILL, the child reads its end (`syncserver --stop-at-stdin-end`
    /// then stops).
    private let input = Pipe()

    /// Starts `executable` with `arguments`.
    /// - Throws: what `Process.run()` throws (no such file, not executable).
    init(_ name: String, executable: String, arguments: [String]) throws {
        self.name = name
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardOutput = output.pipe
        process.standardError = errors.pipe
        process.standardInput = input
        do {
            try process.run()
        } catch {
            throw HarnessError("cannot start \(name) (\(executable)): \(error.localizedDescription)")
        }
        self.process = process
        output.start(label: "\(name) stdout")
        errors.start(label: "\(name) stderr")
    }

    deinit { try? input.fileHandleForWriting.close() }

    var pid: Int32 { process.processIdentifier }

    /// Sends `signal` (SIGKILL unless told otherwise); a child that already
    /// ended is left alone.
    func kill(_ signal: Int32 = SIGKILL) {
        guard process.isRunning else { return }
        send(signal, to: process.processIdentifier)
    }

    /// The complete lines the child wrote to stdout so far. A last line
    /// without its newline is left out: a child killed in the middle of
    /// writing it never finished saying it.
    var outputLines: [String] { output.completeLines() }

    /// Everything the child wrote to stderr so far.
    var errorText: String { errors.text() }

    /// Waits until a complete stdout line satisfies `matches`, the child
    /// ends, or `timeout` passes.
    /// - Returns: the first matching line, or nil.
    func waitForLine(timeout: Duration, where matches: (String) -> Bool) async -> String? {
        let deadline = ContinuousClock.now + timeout
        // Bounded by the deadline.
        while ContinuousClock.now < deadline {
            if let line = outputLines.first(where: matches) { return line }
            guard process.isRunning else { return outputLines.first(where: matches) }
            try? await Task.sleep(for: ChildProcess.pollInterval)
        }
        return nil
    }

    /// Waits until the child has ended and both of its pipes are read to
    /// the end.
    /// - Returns: false when `timeout` passed first.
    func waitForExit(timeout: Duration) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        // Bounded by the deadline.
        while ContinuousClock.now < deadline {
            if !process.isRunning, output.finished, errors.finished {
                // Closed here for the same reason as the output pipes.
                try? input.fileHandleForWriting.close()
                return true
            }
            try? await Task.sleep(for: ChildProcess.pollInterval)
        }
        return false
    }

    /// How the child ended, once it has.
    var ending: Ending {
        precondition(!process.isRunning, "the ending of a running process")
        return process.terminationReason == .uncaughtSignal
            ? .signal(process.terminationStatus) : .exit(process.terminationStatus)
    }

    enum Ending: Equatable, CustomStringConvertible {
        case exit(Int32)
        case signal(Int32)

        var description: String {
            switch self {
            case .exit(let status): "exit status \(status)"
            case .signal(let signal): "signal \(signal)\(signal == SIGKILL ? " (SIGKILL)" : "")"
            }
        }
    }
}

private func send(_ signal: Int32, to pid: pid_t) {
    _ = kill(pid, signal)
}

/// One of a child's output pipes, read to the end on a thread of its own.
private final class PipeCollector: Sendable {
    let pipe = Pipe()
    private let state = Mutex<(data: Data, finished: Bool)>((Data(), false))

    func start(label: String) {
        let handle = pipe.fileHandleForReading
        let thread = Thread { [self] in
            // `availableData` blocks until there is data, and returns none
            // only at the end of the pipe, so this ends with the child.
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty { break }
                state.withLock { $0.data.append(chunk) }
            }
            // Closed here, not when the last reference goes: Foundation's
            // Process keeps its pipes alive, and a harness that starts
            // thousands of children would run out of descriptors.
            try? handle.close()
            state.withLock { $0.finished = true }
        }
        thread.name = label
        thread.start()
    }

    var finished: Bool { state.withLock { $0.finished } }

    func text() -> String { state.withLock { String(decoding: $0.data, as: UTF8.self) } }

    func completeLines() -> [String] {
        let text = text()
        guard let lastNewline = text.lastIndex(of: "\n") else { return [] }
        return text[..<lastNewline].split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    }
}

/// A failure of the harness itself (not of the store under test): a child
/// that cannot be started, a tool that is missing, a timeout.
struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
