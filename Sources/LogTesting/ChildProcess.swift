import CSpawn
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A program run as a child process, the way a shell runs it: the tests run
/// the tools through it, and the crash harness starts, watches and kills its
/// workers and servers with it.
///
/// It is started with `posix_spawn` (see `cspawn.h`): a fresh exec of its
/// binary that inherits no descriptor of this process but its own stdin,
/// stdout and stderr. Foundation's `Process` is not used: on Linux it can
/// crash a process that has many descriptors open, as a test run does.
///
/// Its stdout and stderr are each read to the end by a thread of their own,
/// so a child that writes more than a pipe holds never blocks, and a third
/// thread waits for it to end. The async waits poll with short sleeps, so
/// they never block a thread of Swift's cooperative pool.
public final class ChildProcess: Sendable {
    /// How often the async waits look at the child again.
    public static let pollInterval = Duration.milliseconds(2)

    public let name: String
    public let pid: pid_t
    /// Whether the child leads a process group of its own (see `init`).
    private let ownsGroup: Bool
    private let output: PipeReader
    private let errors: PipeReader
    /// The write end of the child's stdin when it is held open (see `init`).
    private let input: Mutex<Int32?>
    private let state = Mutex<Ending?>(nil)
    private let ended = DispatchSemaphore(value: 0)

    /// How a child ended.
    public enum Ending: Equatable, Sendable, CustomStringConvertible {
        case exit(Int32)
        case signal(Int32)
        /// waitpid failed with this errno (something else reaped the child).
        case unknown(Int32)

        /// The exit status, or 128 plus the signal, as a shell reports it;
        /// -1 when unknown.
        public var status: Int32 {
            switch self {
            case .exit(let status): status
            case .signal(let signal): 128 + signal
            case .unknown: -1
            }
        }

        public var description: String {
            switch self {
            case .exit(let status): "exit status \(status)"
            case .signal(let signal): "signal \(signal)\(signal == SIGKILL ? " (SIGKILL)" : "")"
            case .unknown(let code): "an unknown ending (waitpid: \(String(cString: strerror(code))))"
            }
        }
    }

    /// Starts `executable` with `arguments`, in this process's environment.
    /// - Parameter holdingStdinOpen: give the child a stdin pipe that is never
    ///   written, so it reads its end when this process ends, even by
    ///   SIGKILL (`syncserver --stop-at-stdin-end` then stops). Otherwise its
    ///   stdin is /dev/null.
    /// - Parameter ownProcessGroup: start it in a process group of its own,
    ///   which `kill` signals as a whole: for a child that starts children
    ///   of its own (`strace` and the process it traces). Such a group no
    ///   longer gets the terminal's Ctrl-C.
    /// - Throws: `ChildProcessError` when it cannot be started (no such file,
    ///   not executable, out of descriptors).
    public init(
        _ name: String? = nil, executable: String, arguments: [String], holdingStdinOpen: Bool = false,
        ownProcessGroup: Bool = false
    ) throws {
        let name = name ?? URL(fileURLWithPath: executable).lastPathComponent
        self.name = name
        ownsGroup = ownProcessGroup
        var opened: [Int32] = []
        func pipe() throws -> (read: Int32, write: Int32) {
            var fds: [Int32] = [-1, -1]
            let result = cspawn_pipe(&fds)
            guard result == 0 else { throw ChildProcessError(name, executable, "a pipe", result) }
            opened += fds
            return (fds[0], fds[1])
        }
        do {
            let stdout = try pipe()
            let stderr = try pipe()
            let stdin: (read: Int32, write: Int32?)
            if holdingStdinOpen {
                let held = try pipe()
                stdin = (held.read, held.write)
            } else {
                let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
                guard null >= 0 else { throw ChildProcessError(name, executable, "/dev/null", errno) }
                opened.append(null)
                stdin = (null, nil)
            }
            var pid: pid_t = 0
            let result = ChildProcess.spawn(
                executable, arguments, stdin.read, stdout.write, stderr.write, newGroup: ownProcessGroup, &pid)
            guard result == 0 else { throw ChildProcessError(name, executable, nil, result) }
            // The child has its copies; only the ends this process reads or
            // holds stay open here.
            for fd in [stdin.read, stdout.write, stderr.write] { close(fd) }
            self.pid = pid
            input = Mutex(stdin.write)
            output = PipeReader(fd: stdout.read, label: "\(name) stdout")
            errors = PipeReader(fd: stderr.read, label: "\(name) stderr")
        } catch {
            for fd in opened { close(fd) }
            throw error
        }
        // The thread holds this object until the child has ended. It reaps
        // the child under the lock `kill` takes (see there).
        let reaper = Thread { [self] in
            let waited = cspawn_wait_ended(pid)
            state.withLock { ending in
                var status: Int32 = 0
                var signal: Int32 = 0
                let result = waited != 0 ? waited : cspawn_wait(pid, &status, &signal)
                ending = result != 0 ? .unknown(result) : signal != 0 ? .signal(signal) : .exit(status)
            }
            ended.signal()
        }
        reaper.name = "\(name) wait"
        reaper.start()
    }

    deinit { closeInput() }

    private static func spawn(
        _ executable: String, _ arguments: [String], _ stdin: Int32, _ stdout: Int32, _ stderr: Int32, newGroup: Bool,
        _ pid: inout pid_t
    ) -> Int32 {
        let argv = ([executable] + arguments).map { strdup($0) }
        defer { argv.forEach { free($0) } }
        return cspawn(executable, argv + [nil], nil, stdin, stdout, stderr, newGroup ? 1 : 0, &pid)
    }

    /// Whether the child has not ended yet (a child that ended is reaped at
    /// once, so its pid is never a zombie's for long).
    public var isRunning: Bool { state.withLock { $0 == nil } }

    /// How the child ended, once it has.
    public var ending: Ending {
        guard let ending = state.withLock({ $0 }) else { preconditionFailure("the ending of a running process") }
        return ending
    }

    /// Sends `signal` (SIGKILL unless told otherwise), to the child's whole
    /// process group when it has its own; a child that already ended is
    /// left alone.
    public func kill(_ signal: Int32 = SIGKILL) {
        // Checked and sent under the lock the reaper holds while it reaps:
        // until then the child's pid cannot be another process's, nor its
        // group another group.
        state.withLock { ending in
            if ending == nil { send(signal, to: ownsGroup ? -pid : pid) }
        }
    }

    /// Everything the child wrote to stdout so far.
    public var outputText: String { output.text() }

    /// The complete lines the child wrote to stdout so far. A last line
    /// without its newline is left out: a child killed in the middle of
    /// writing it never finished saying it.
    public var outputLines: [String] {
        let text = outputText
        guard let lastNewline = text.lastIndex(of: "\n") else { return [] }
        return text[..<lastNewline].split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    }

    /// Everything the child wrote to stderr so far.
    public var errorText: String { errors.text() }

    /// Waits until the complete stdout lines so far satisfy `done`, the
    /// child ends, or `timeout` passes.
    /// - Returns: whether the lines satisfied `done`.
    public func waitForLines(timeout: Duration, until done: ([String]) -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        // Bounded by the deadline. The lines are looked at once more after
        // it: a sleep that wakes late, on a busy host, must not miss what
        // came meanwhile.
        while true {
            if done(outputLines) { return true }
            guard isRunning else { return done(outputLines) }
            guard ContinuousClock.now < deadline else { return false }
            try? await Task.sleep(for: ChildProcess.pollInterval)
        }
    }

    /// Waits until a complete stdout line satisfies `matches`, the child
    /// ends, or `timeout` passes.
    /// - Returns: the first matching line, or nil.
    public func waitForLine(timeout: Duration, where matches: (String) -> Bool) async -> String? {
        var found: String?
        _ = await waitForLines(timeout: timeout) { lines in
            found = lines.first(where: matches)
            return found != nil
        }
        return found
    }

    /// Waits until the child has ended and both of its pipes are read to
    /// the end.
    /// - Returns: false when `timeout` passed first.
    public func waitForExit(timeout: Duration) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        // Bounded by the deadline. The child is looked at once more after
        // it: a sleep that wakes late, on a busy host, must not report a
        // child that ended meanwhile as running.
        while true {
            if !isRunning, output.finished, errors.finished {
                closeInput()
                return true
            }
            guard ContinuousClock.now < deadline else { return false }
            try? await Task.sleep(for: ChildProcess.pollInterval)
        }
    }

    /// Blocks the calling thread until the child has ended and both of its
    /// pipes are read to the end.
    public func waitUntilExit() -> Ending {
        ended.wait()
        ended.signal()
        output.waitUntilFinished()
        errors.waitUntilFinished()
        closeInput()
        return ending
    }

    /// Closed once the child has ended, or when this object goes: a harness
    /// that starts thousands of children must not run out of descriptors.
    private func closeInput() {
        input.withLock { fd in
            if let open = fd { close(open) }
            fd = nil
        }
    }
}

private func send(_ signal: Int32, to pid: pid_t) {
    _ = kill(pid, signal)
}

/// A child process that could not be started.
public struct ChildProcessError: Error, CustomStringConvertible {
    public let description: String

    init(_ name: String, _ executable: String, _ what: String?, _ code: Int32) {
        let reason = String(cString: strerror(code))
        description = "cannot start \(name) (\(executable))\(what.map { ": cannot open \($0)" } ?? ""): \(reason)"
    }
}

/// One of a child's output pipes, read to its end on a thread of its own.
private final class PipeReader: Sendable {
    private let state = Mutex<(bytes: [UInt8], finished: Bool)>(([], false))
    private let done = DispatchSemaphore(value: 0)

    init(fd: Int32, label: String) {
        let thread = Thread { [self] in
            var buffer = [UInt8](repeating: 0, count: 64 * 1024)
            while true {
                let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if count < 0 && errno == EINTR { continue }
                // The end of the pipe (every copy of its write end closed:
                // the child and its own children are gone), or an error.
                if count <= 0 { break }
                state.withLock { $0.bytes += buffer[..<count] }
            }
            close(fd)
            state.withLock { $0.finished = true }
            done.signal()
        }
        thread.name = label
        thread.start()
    }

    var finished: Bool { state.withLock { $0.finished } }

    func waitUntilFinished() {
        done.wait()
        done.signal()
    }

    func text() -> String { state.withLock { String(decoding: $0.bytes, as: UTF8.self) } }
}
