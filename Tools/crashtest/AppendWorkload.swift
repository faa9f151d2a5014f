import LMDB
import LogFormat
import LogStore
import LogTesting

/// Concurrent appends straight to the `EventLog`, single and batched, so
/// that group commit puts several callers' appends in one transaction.
///
/// Reports: `try KEY...` before an append (one key, or a batch's keys) and
/// `ack FIRST KEY...` after it returned, FIRST being the offset of the
/// first key; with `--count`, `fail KEY` when the append threw.
enum AppendWorkload: StoreWorkload {
    static let name = "append"
    static let summary = "concurrent EventLog appends, single and batched, sharing commits (group commit)"

    /// Enough concurrent appenders for group commit to put several appends
    /// in one transaction.
    static let appenderCount = 4
    /// The most entries one `append(contentsOf:)` call carries.
    static let batchCountMax = 5
    static let entityType = "ap"

    /// The entry appended for `key`: every byte follows from the key.
    static func body(key: String) -> EntryBody {
        .intent(
            Intent(
                .create, idempotencyKey: key, entityType: entityType, entityID: "ap_\(key)", baseVersion: 0,
                fields: Payload.fields(key: key)))
    }

    static func work(_ worker: Worker) async throws {
        let log = try EventLog(path: worker.store, options: worker.options)
        worker.reporter.send("ready")
        if worker.count != nil { return try await appendOneByOne(log, worker) }
        try await Worker.runAll(
            (0..<appenderCount).map { appender -> Worker.Loop in { try await appendLoop(log, appender: appender, worker) } })
    }

    private static func appendLoop(_ log: EventLog, appender: Int, _ worker: Worker) async throws {
        var random = SeededRandom(seed: worker.seed &+ UInt64(appender))
        for number in 0..<worker.writesMax {
            let batched = Int.random(in: 0..<4, using: &random) == 0
            let count = batched ? Int.random(in: 2...batchCountMax, using: &random) : 1
            let keys = (0..<count).map { "\(worker.tag)-\(appender)-\(number)-\($0)" }
            worker.reporter.send("try", keys)
            // The lie: an offset promised for entries never appended.
            if worker.reporter.lie("ack", [String(try log.lastOffset() + 1)] + keys) { continue }
            let first: UInt64
            if count == 1 {
                first = try await log.append(body(key: keys[0]))
            } else {
                guard let range = try await log.append(contentsOf: keys.map(body(key:))) else {
                    preconditionFailure("appending \(count) entries returned no offsets")
                }
                first = range.lowerBound
            }
            worker.reporter.send("ack", [String(first)] + keys)
        }
    }

    /// One append per commit, in order, `worker.count` of them: under an
    /// injected fault the Nth sync belongs to a known commit. A failed
    /// append is reported (`fail KEY`) and ends the worker, after one more
    /// append shows whether the store now refuses writes, as it must.
    private static func appendOneByOne(_ log: EventLog, _ worker: Worker) async throws {
        for number in 0..<worker.writesMax {
            let key = "\(worker.tag)-0-\(number)-0"
            worker.reporter.send("try", [key])
            let offset: UInt64
            do {
                offset = try await log.append(body(key: key))
            } catch {
                worker.reporter.send("fail", [key])
                throw await CommitFailure.after("append of \(key)", failed: error) {
                    "succeeded at offset \(try await reportedAppend(key + "-after", log, worker))"
                }
            }
            worker.reporter.send("ack", [String(offset), key])
        }
    }

    static func check(_ ledger: Ledger, _ store: Store, log: [Entry], _ context: inout IterationContext) throws -> Int {
        AppendPromises(ledger.reports, &context).check(log, &context)
    }

    static func acknowledgedCount(_ reports: [Report]) -> Int {
        reports.filter { $0.verb == "ack" }.reduce(0) { $0 + $1.words.count - 1 }
    }
}

/// Appends `key`'s entry, reported `try` before and `ack` after.
func reportedAppend(_ key: String, _ log: EventLog, _ worker: Worker) async throws -> UInt64 {
    worker.reporter.send("try", [key])
    let offset = try await log.append(AppendWorkload.body(key: key))
    worker.reporter.send("ack", [String(offset), key])
    return offset
}

/// A write that threw, with what the store answered the write after it:
/// after a failed commit a store opens its environment again, so that
/// write commits, or meets the fault again while it lasts.
struct CommitFailure: Error, CustomStringConvertible {
    var write: String
    var error: any Error
    var next: String

    var description: String { "\(write) failed: \(type(of: error)): \(error); the next write: \(next)" }

    /// `write`'s failure with `error`, after one more write, `next`, which
    /// returns what it did: the store opens its environment again, and the
    /// write commits once the fault has passed (or meets it again), and the
    /// failure says which.
    static func after(_ write: String, failed error: any Error, next: () async throws -> String) async -> CommitFailure {
        let outcome: String
        do {
            outcome = try await next()
        } catch {
            outcome = "\(type(of: error)): \(error)"
        }
        return CommitFailure(write: write, error: error, next: outcome)
    }
}
