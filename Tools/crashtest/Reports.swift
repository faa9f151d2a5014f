import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One line a worker writes to its parent: a verb and its words, separated
/// by single spaces (no word holds a space).
///
/// The verbs every workload shares: `ready` (the store is open), `try`
/// (a write is about to be made; it may or may not commit), `ack` (the call
/// that made it returned: the store promised it), `lied` (see `lie`).
/// Workloads add their own.
struct Report: Equatable, Sendable, CustomStringConvertible {
    var verb: String
    var words: [String]

    init(_ verb: String, _ words: [String] = []) {
        precondition(!verb.isEmpty && !verb.contains(" "), "a report verb is one word")
        precondition(words.allSatisfy { !$0.isEmpty && !$0.contains(" ") && !$0.contains("\n") }, "report words are single words")
        self.verb = verb
        self.words = words
    }

    init?(line: String) {
        let parts = line.split(separator: " ").map(String.init)
        guard let verb = parts.first else { return nil }
        self.verb = verb
        words = Array(parts.dropFirst())
    }

    var description: String { ([verb] + words).joined(separator: " ") }

    /// The verbs that report an acknowledged write.
    static let acknowledgementVerbs: Set = ["ack", "settled", "compacted"]
}

/// The worker's end of the channel: its stdout, a pipe the parent reads.
///
/// A line is written with one `write(2)` of at most `lineBytesMax` bytes,
/// which a pipe takes whole (POSIX makes writes up to `PIPE_BUF` atomic), so
/// the lines of concurrent writers never interleave, and a worker killed at
/// any moment leaves whole lines only. A report is sent only after the call
/// it reports has returned.
final class Reporter: Sendable {
    /// Below `PIPE_BUF` (4096 on Linux), the size a pipe writes atomically.
    static let lineBytesMax = 4000

    /// Whether this worker lies once (`--inject-violation`): it reports a
    /// write as acknowledged without making it, so the parent must find it
    /// missing. This proves the checker can fail.
    let lying: Bool
    /// How far past the log's end a lie names an offset: no worker writes
    /// that far before it is killed.
    static let lieDistance: UInt64 = 1_000_000
    private let lied = Mutex(false)
    private let writing = Mutex(())

    init(lying: Bool) { self.lying = lying }

    func send(_ verb: String, _ words: [String] = []) {
        let bytes = Array((Report(verb, words).description + "\n").utf8)
        precondition(bytes.count <= Reporter.lineBytesMax, "a report of \(bytes.count) bytes could be torn")
        writing.withLock { _ in
            bytes.withUnsafeBytes { raw in
                var written = 0
                // Each pass writes at least one byte or gives up, so this ends.
                while written < raw.count {
                    let result = write(STDOUT_FILENO, raw.baseAddress! + written, raw.count - written)
                    if result > 0 {
                        written += result
                    } else if result < 0 && errno == EINTR {
                        continue
                    } else {
                        // The parent is gone; nobody is left to tell.
                        exit(4)
                    }
                }
            }
        }
    }

    /// For a lying worker, once: sends the report of a write as if it had
    /// been made, then `lied` (so the parent can wait for the lie before it
    /// kills), and returns true; the caller then skips the write.
    func lie(_ verb: String, _ words: [String]) -> Bool {
        guard lying else { return false }
        let first = lied.withLock { lied in
            defer { lied = true }
            return !lied
        }
        guard first else { return false }
        send(verb, words)
        send("lied")
        return true
    }
}

/// The reports of every worker that wrote to one store, in the order they
/// were received: what the store has promised so far.
struct Ledger {
    private(set) var reports: [Report] = []

    mutating func append(_ new: [Report]) { reports += new }

    /// The reports with this verb.
    func with(_ verb: String) -> [Report] { reports.filter { $0.verb == verb } }
}
