import Foundation
import LMDB
import LogTesting
import Testing

/// The checks that decide a crashtest run, run by `crashtest check` on a
/// store a real worker wrote, against that worker's reports with one
/// promise changed: the store then breaks a promise of a kind a killed
/// writer never breaks (and `--inject-violation` does not make), and the
/// check for that kind must name it. The unchanged reports must pass, so
/// each check fails for its reason alone.
@Suite struct StoreCheckTests {
    static let executable = CrashTestTests.executable

    /// The lines `crashtest worker` writes for `count` writes made one at a
    /// time (`append` and `app` take `--count`) on `store`.
    static func written(_ workload: String, count: Int, store: String, seed: UInt64 = 1) async throws -> [String] {
        try #require(FileManager.default.isExecutableFile(atPath: executable), "build the crashtest product first")
        let run = try await ToolRun.running(
            executable, ["worker", "--workload", workload, "--store", store, "--seed", "\(seed)", "--count", "\(count)"])
        try #require(run.status == 0, "\(run.errors)")
        return run.lines
    }

    /// The lines of a worker of `workload` killed once its reports hold a
    /// line starting with `verb ` (for workers that write until killed).
    static func written(_ workload: String, killedAfter verb: String, store: String) async throws -> [String] {
        try #require(FileManager.default.isExecutableFile(atPath: executable), "build the crashtest product first")
        let worker = try ChildProcess(
            "worker", executable: executable, arguments: ["worker", "--workload", workload, "--store", store, "--seed", "1"])
        defer { worker.kill() }
        let reached = await worker.waitForLine(timeout: .seconds(60)) { $0.hasPrefix("\(verb) ") }
        worker.kill()
        #expect(await worker.waitForExit(timeout: .seconds(60)))
        try #require(reached != nil, "no \(verb) from the worker: \(worker.errorText)")
        return worker.outputLines
    }

    /// `crashtest check` of `store` against `reports`.
    static func check(_ workload: String, store: String, reports: [String], in directory: TemporaryDirectory) async throws -> ToolRun {
        let file = directory.appending("reports-\(UUID().uuidString)")
        try (reports.joined(separator: "\n") + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        return try await ToolRun.running(executable, ["check", "--workload", workload, "--store", store, "--reports", file])
    }

    /// Each case's reports fail the check of `store` with a violation whose
    /// message holds the case's.
    static func expectEachNamed(
        _ workload: String, store: String, _ cases: [(changed: [String], message: String)], in directory: TemporaryDirectory
    ) async throws {
        for (changed, message) in cases {
            let run = try await check(workload, store: store, reports: changed, in: directory)
            #expect(run.status == 1 && run.output.contains(message), "\(message): \(run.output)\(run.errors)")
        }
    }

    /// The words of the first line with this verb.
    static func words(_ reports: [String], _ verb: String) throws -> [String] {
        let line = try #require(reports.first { $0.hasPrefix("\(verb) ") }, "no \(verb) in \(reports)")
        return line.split(separator: " ").dropFirst().map(String.init)
    }

    /// `--workload`'s help lists the store workloads by hand (built from
    /// `Workloads.stores`, it crashed the compiler): it names the ones the
    /// command takes, as its refusal of another name lists them.
    @Test func theWorkloadsTheHelpNamesAreTheOnesTaken() async throws {
        let help = try await ToolRun.running(Self.executable, ["check", "--help"])
        let refused = try await ToolRun.running(Self.executable, ["check", "--workload", "none", "--store", "s", "--reports", "r"])
        #expect(refused.status == 64)
        let taken = try #require(refused.errors.split(separator: "\n").first { $0.contains("is none of ") })
            .components(separatedBy: "is none of ").last ?? ""
        // The help wraps its lines: the list is read with its breaks as spaces.
        let text = help.output.split(whereSeparator: { $0.isWhitespace }).joined(separator: " ")
        #expect(text.contains("store (\(taken))."), "help: \(text)\nrefusal: \(taken)")
    }

    /// Reports unchanged pass, and the summary counts each acknowledged
    /// append once: the count of a run is the sum of these.
    @Test func theReportsOfAnAppendWorkerPassAndAreCounted() async throws {
        let directory = try TemporaryDirectory("crashtest-check-append")
        defer { directory.remove() }
        let store = directory.appending("store")
        let reports = try await Self.written("append", count: 4, store: store)
        let run = try await Self.check("append", store: store, reports: reports, in: directory)
        #expect(run.status == 0, "\(run.output)\(run.errors)")
        #expect(run.lines.last == "crashtest check: 4 acknowledged writes checked, 0 violations", "\(run.output)")
    }

    /// An append at another offset than its acknowledgement named, a
    /// failed one that committed all the same, a batch with entries
    /// missing or not one after another, and an entry no writer tried: each
    /// is a violation that names it.
    @Test func everyBrokenAppendPromiseIsNamed() async throws {
        let directory = try TemporaryDirectory("crashtest-check-append-broken")
        defer { directory.remove() }
        let store = directory.appending("store")
        let reports = try await Self.written("append", count: 4, store: store)
        // Keys are TAG-0-N-0, one per append, at offsets 1 to 4.
        let keys = (0..<4).map { "1-0-\($0)-0" }
        try #require(reports.contains("ack 1 \(keys[0])") && reports.contains("ack 4 \(keys[3])"), "\(reports)")
        let cases: [(changed: [String], message: String)] = [
            (reports.map { $0 == "ack 1 \(keys[0])" ? "ack 2 \(keys[0])" : $0 }, "the acknowledged append \(keys[0]) was promised offset 2 and is at 1"),
            (reports + ["fail \(keys[1])"], "the failed append \(keys[1]) is in the log at offset 2"),
            (reports.map { $0 == "try \(keys[0])" ? "try \(keys[0]) \(keys[0])x" : $0 }, "1 of the 2 entries of batch \(keys[0]) are there"),
            (
                reports.filter { $0 != "try \(keys[2])" }.map { $0 == "try \(keys[0])" ? "try \(keys[0]) \(keys[2])" : $0 },
                "the entries of batch \(keys[0]) are at offsets [1, 3], not one after another"
            ),
            (reports.filter { !$0.hasSuffix(" \(keys[3])") }, "log at offset 4: intent \(keys[3]) was never attempted"),
        ]
        try await Self.expectEachNamed("append", store: store, cases, in: directory)
    }

    /// A writer that appends its keys again (a second worker with the same
    /// seed) leaves each intent in the log twice, which the check names,
    /// though each acknowledgement is where it said.
    @Test func anAppendInTheLogTwiceIsNamed() async throws {
        let directory = try TemporaryDirectory("crashtest-check-append-twice")
        defer { directory.remove() }
        let store = directory.appending("store")
        let first = try await Self.written("append", count: 2, store: store)
        let second = try await Self.written("append", count: 2, store: store)
        let run = try await Self.check("append", store: store, reports: first + second, in: directory)
        #expect(run.status == 1 && run.output.contains("log: intent 1-0-0-0 is there twice, at offsets 1 and 3"), "\(run.output)")
    }

    /// An app batch that failed and committed anyway, one in flight with an
    /// operation missing, an intent no writer tried, and one that differs
    /// from what was tried: each is a violation that names it.
    @Test func everyBrokenAppPromiseIsNamed() async throws {
        let directory = try TemporaryDirectory("crashtest-check-app-broken")
        defer { directory.remove() }
        let store = directory.appending("store")
        let reports = try await Self.written("app", count: 3, store: store)
        let passed = try await Self.check("app", store: store, reports: reports, in: directory)
        #expect(passed.status == 0 && passed.lines.last == "crashtest check: 3 acknowledged writes checked, 0 violations", "\(passed.output)")
        // The first batch: `try 1-0-0 c:te_1_0_0:1 ...`, then `ack 1-0-0`.
        let first = try Self.words(reports, "try")
        let batch = first[0]
        let tried = "try " + first.joined(separator: " ")
        let create = first[1]
        try #require(create.hasPrefix("c:"), "\(reports)")
        let lastTried = try #require(reports.last { $0.hasPrefix("try ") })
        let last = lastTried.split(separator: " ")[1]
        let cases: [(changed: [String], message: String)] = [
            (reports + ["fail \(batch)"], "batch \(batch), whose write failed, has"),
            (
                reports.filter { $0 != "ack \(batch)" }.map { $0 == tried ? tried + " c:te_never:99" : $0 },
                "batch \(batch) (in flight at a kill) has \(first.count - 1) of \(first.count) intents in the log"
            ),
            (reports.filter { $0 != lastTried && $0 != "ack \(last)" }, "that was never tried"),
            (reports.map { $0 == tried ? tried.replacingOccurrences(of: " \(create)", with: " u" + create.dropFirst()) : $0 }, "the intent of u"),
        ]
        try await Self.expectEachNamed("app", store: store, cases, in: directory)
    }

    /// An entity's intents must be in the log in the order they were
    /// made. A delete is found by its entity alone, so reports that give it
    /// an earlier number than the operations before it describe a log out
    /// of order, and nothing else changes.
    @Test func anEntitysIntentsOutOfOrderAreNamed() async throws {
        let directory = try TemporaryDirectory("crashtest-check-app-order")
        defer { directory.remove() }
        let store = directory.appending("store")
        let reports = try await Self.written("app", count: 12, store: store)
        let words = reports.filter { $0.hasPrefix("try ") }.flatMap { $0.split(separator: " ").dropFirst(2).map(String.init) }
        let delete = try #require(words.first { $0.hasPrefix("d:") }, "no delete in \(reports)")
        let id = delete.split(separator: ":")[1]
        let changed = reports.map { $0.replacingOccurrences(of: " \(delete)", with: " d:\(id):0") }
        let run = try await Self.check("app", store: store, reports: changed, in: directory)
        #expect(run.status == 1 && run.output.contains("log: the intents on te/\(id) are not in the order they were made"), "\(run.output)")
    }

    /// Every check ends with `Store.verify`: a derived table that
    /// disagrees with the log is a violation, also one that no workload's
    /// own check reads (a row of `idempotency`, removed here).
    @Test func aDerivedTableThatDisagreesWithTheLogIsNamed() async throws {
        let directory = try TemporaryDirectory("crashtest-check-verify")
        defer { directory.remove() }
        let store = directory.appending("store")
        let reports = try await Self.written("app", count: 3, store: store)
        do {
            let environment = try Environment(path: store)
            defer { environment.close() }
            let keys = try #require(try environment.openDatabase("idempotency", create: false))
            _ = try environment.write { txn in
                var first: [UInt8] = []
                try txn.forEach(keys) { key, _ in
                    first = Array(key)
                    return false
                }
                try txn.delete(keys, key: first)
            }
        }
        let run = try await Self.check("app", store: store, reports: reports, in: directory)
        #expect(run.status == 1 && run.output.contains("VIOLATION app iteration 0: verify \(store): "), "\(run.output)")
        #expect(run.output.contains("idempotency"), "\(run.output)")
    }

    /// An outbox mark the store acknowledged must be in the intent's
    /// attempt state; one that was only tried (in flight at a kill) may
    /// be there or not. The store's intents are all pending: a mark that
    /// failed the first one and was acknowledged is a violation.
    @Test func anAcknowledgedOutboxMarkMustBeThere() async throws {
        let directory = try TemporaryDirectory("crashtest-check-marks")
        defer { directory.remove() }
        let store = directory.appending("store")
        let reports = try await Self.written("app", count: 2, store: store)
        let mark = "mark never fail 0 1"
        let inFlight = try await Self.check("replay", store: store, reports: reports + [mark], in: directory)
        #expect(inFlight.status == 0, "\(inFlight.output)\(inFlight.errors)")
        let acknowledged = try await Self.check("replay", store: store, reports: reports + [mark, "marked never"], in: directory)
        #expect(acknowledged.status == 1, "\(acknowledged.output)")
        #expect(acknowledged.output.contains("outbox at offset 1: the attempt state is pending, 0 attempts"), "\(acknowledged.output)")
    }

    /// The pull cursor must be at or past the last page acknowledged and
    /// at or before the last one tried.
    @Test func aPullCursorOutsideWhatWasTriedAndAcknowledgedIsNamed() async throws {
        let directory = try TemporaryDirectory("crashtest-check-pull")
        defer { directory.remove() }
        let store = directory.appending("store")
        let reports = try await Self.written("pull", killedAfter: "ack", store: store)
        let passed = try await Self.check("pull", store: store, reports: reports, in: directory)
        #expect(passed.status == 0, "\(passed.output)\(passed.errors)")
        let behind = try await Self.check("pull", store: store, reports: reports + ["try 100000", "ack 100000"], in: directory)
        #expect(behind.status == 1 && behind.output.contains("but page 100000 was acknowledged"), "\(behind.output)")
        let ahead = try await Self.check("pull", store: store, reports: reports.filter { !$0.hasPrefix("try ") }, in: directory)
        #expect(ahead.status == 1 && ahead.output.contains("is past page 0, the last one a worker tried"), "\(ahead.output)")
    }

    /// A compaction acknowledged below a watermark must leave the log
    /// compacted at least that far.
    @Test func aLogCompactedLessThanAcknowledgedIsNamed() async throws {
        let directory = try TemporaryDirectory("crashtest-check-compact")
        defer { directory.remove() }
        let store = directory.appending("store")
        let reports = try await Self.written("compact", killedAfter: "compacted", store: store)
        let passed = try await Self.check("compact", store: store, reports: reports, in: directory)
        #expect(passed.status == 0, "\(passed.output)\(passed.errors)")
        let run = try await Self.check("compact", store: store, reports: reports + ["compacted 100000"], in: directory)
        #expect(run.status == 1 && run.output.contains("but a compaction below 100000 was acknowledged"), "\(run.output)")
    }

    /// A fault run of the compaction worker (`--count`: creates, settles
    /// and compactions by turns): a batch or a compaction whose commit
    /// failed must leave nothing. Reports that call failed the batch the
    /// app sees, or the compactions that reached the store's watermark,
    /// are named.
    @Test func aFailedBatchOrCompactionThatCommittedIsNamed() async throws {
        let directory = try TemporaryDirectory("crashtest-check-compact-faults")
        defer { directory.remove() }
        let store = directory.appending("store")
        let reports = try await Self.written("compact", count: 24, store: store)
        let passed = try await Self.check("compact", store: store, reports: reports, in: directory)
        #expect(passed.status == 0, "\(passed.output)\(passed.errors)")

        let batch = try #require(reports.first { $0.hasPrefix("ack ") && !$0.contains(":") }, "\(reports)")
        let failedBatch = reports.map { $0 == batch ? "fail" + batch.dropFirst(3) : $0 }
        // Each compaction that reached the highest watermark, failed.
        let tries = reports.compactMap { line -> (step: String, watermark: UInt64)? in
            let words = line.split(separator: " ").map(String.init)
            guard words.count == 3, words[0] == "try", words[1].hasPrefix("compact:"), let watermark = UInt64(words[2]) else { return nil }
            return (words[1], watermark)
        }
        let highest = try #require(tries.map(\.watermark).max())
        let reachedIt = Set(tries.filter { $0.watermark == highest }.map(\.step))
        let failedCompactions = reports.compactMap { line -> String? in
            if line == "compacted \(highest)" { return nil }
            guard line.hasPrefix("ack "), reachedIt.contains(String(line.dropFirst(4))) else { return line }
            return "fail" + line.dropFirst(3)
        }
        try await Self.expectEachNamed(
            "compact", store: store,
            [
                (failedBatch, "whose write failed, the app sees"),
                (failedCompactions, "the log is compacted below \(highest), which no compaction that could have committed reached"),
            ], in: directory)
    }

    /// An answer recorded for an intent must be the one acknowledged: an
    /// intent acknowledged as `duplicate` that the log answers `applied`
    /// (or the other way) is named.
    @Test func anAnswerOtherThanTheAcknowledgedOneIsNamed() async throws {
        let directory = try TemporaryDirectory("crashtest-check-outbox")
        defer { directory.remove() }
        let store = directory.appending("store")
        let reports = try await Self.written("outbox", killedAfter: "settled", store: store)
        let passed = try await Self.check("outbox", store: store, reports: reports, in: directory)
        #expect(passed.status == 0, "\(passed.output)\(passed.errors)")
        let swaps = ["applied": "duplicate", "duplicate": "applied"]
        let settled = try #require(reports.first { $0.hasPrefix("settled ") && swaps[String($0.split(separator: " ")[2])] != nil }, "\(reports)")
        let words = settled.split(separator: " ").map(String.init)
        let changed = "settled \(words[1]) \(swaps[words[2]] ?? "")"
        let run = try await Self.check("outbox", store: store, reports: reports.map { $0 == settled ? changed : $0 }, in: directory)
        #expect(run.status == 1, "\(run.output)")
        #expect(run.output.contains("the intent at offset \(words[1]) was acknowledged as \(swaps[words[2]] ?? ""); the log answers it \(words[2])"), "\(run.output)")
    }
}
