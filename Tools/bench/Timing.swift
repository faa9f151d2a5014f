import Foundation
import Synchronization

extension Duration {
    /// The duration in whole nanoseconds (durations here are far below the
    /// 292 years an Int64 of nanoseconds holds).
    var nanoseconds: Int64 {
        components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000
    }

    var seconds: Double {
        Double(components.seconds) + Double(components.attoseconds) * 1e-18
    }
}

/// Per-operation latencies in nanoseconds, summarized by nearest-rank
/// percentiles. Every measurement that reports p50 and p99 goes through this.
struct LatencySummary: Codable, Sendable {
    var count: Int
    var totalSeconds: Double
    var meanMicroseconds: Double
    var p50Microseconds: Double
    var p99Microseconds: Double
    var maxMicroseconds: Double

    /// Operations per second, from the time spent inside the operations.
    var ratePerSecond: Double { totalSeconds > 0 ? Double(count) / totalSeconds : 0 }

    init(nanoseconds samples: [Int64]) {
        precondition(!samples.isEmpty, "a latency summary needs at least one sample")
        let sorted = samples.sorted()
        let total = sorted.reduce(0, +)
        count = sorted.count
        totalSeconds = Double(total) / 1e9
        meanMicroseconds = Double(total) / Double(sorted.count) / 1e3
        p50Microseconds = Double(LatencySummary.percentile(0.50, of: sorted)) / 1e3
        p99Microseconds = Double(LatencySummary.percentile(0.99, of: sorted)) / 1e3
        maxMicroseconds = Double(sorted[sorted.count - 1]) / 1e3
    }

    /// The nearest-rank percentile: the smallest sample with at least
    /// `fraction` of all samples at or below it.
    static func percentile(_ fraction: Double, of sorted: [Int64]) -> Int64 {
        precondition(fraction > 0 && fraction <= 1, "a percentile is a fraction in (0, 1]")
        let rank = Int((fraction * Double(sorted.count)).rounded(.up))
        return sorted[max(rank, 1) - 1]
    }
}

/// Writes back every dirty page in the system (sync(2)) and waits for it:
/// a section that wrote without syncing (.process, raw LMDB with
/// `MDB_NOSYNC`) leaves hundreds of megabytes whose writeback would
/// otherwise land in the timings of whatever runs next.
func settleDisk() {
    sync()
}

/// Times `body` with the continuous clock and returns its elapsed time.
@inline(__always)
func timed(_ body: () throws -> Void) rethrows -> Duration {
    let clock = ContinuousClock()
    let start = clock.now
    try body()
    return clock.now - start
}

/// A flag the controlling thread raises to end a timed run; writers poll it
/// between operations.
final class StopFlag: Sendable {
    private let raised = Atomic<Bool>(false)

    var isRaised: Bool { raised.load(ordering: .acquiring) }

    func raise() { raised.store(true, ordering: .releasing) }
}

/// Runs `body` on a thread of its own and returns its result.
///
/// Blocking work (`appendBlocking`, fsync-bound loops, joins) must not sit on
/// Swift's cooperative pool: it has one thread per core, two on this machine,
/// and a blocked pool thread stalls every task, the writer's completions
/// included.
func onDedicatedThread<T: Sendable>(_ name: String, _ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            continuation.resume(with: Result { try body() })
        }
        thread.name = name
        thread.stackSize = dedicatedThreadStackBytes
        thread.start()
    }
}

/// Stack for the bench's own threads; Foundation's default (512 KiB on
/// Linux) is enough today, but decoding and GRDB both recurse.
let dedicatedThreadStackBytes = 8 << 20

/// Starts `count` threads running `body(index)`, releases them together,
/// runs `whileRunning` on the calling thread, and waits for all of them.
/// Returns the time from the release to the last exit.
func runThreads(
    count: Int, name: String, whileRunning: () -> Void = {}, _ body: @escaping @Sendable (Int) -> Void
) -> Duration {
    precondition(count > 0, "at least one thread")
    let ready = DispatchSemaphore(value: 0)
    let start = DispatchSemaphore(value: 0)
    let done = DispatchGroup()
    for index in 0..<count {
        done.enter()
        let thread = Thread {
            ready.signal()
            start.wait()
            body(index)
            done.leave()
        }
        thread.name = "\(name) \(index)"
        thread.stackSize = dedicatedThreadStackBytes
        thread.start()
    }
    for _ in 0..<count { ready.wait() }
    let clock = ContinuousClock()
    let begin = clock.now
    for _ in 0..<count { start.signal() }
    whileRunning()
    done.wait()
    return clock.now - begin
}
