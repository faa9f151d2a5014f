import Foundation
import LMDB
import LogFormat
@testable import LogStore
import LogTesting
import Synchronization
import Testing

/// A write job that writes nothing and lets the test act at each step:
/// when it runs (inside the group's transaction, on the writer thread) and
/// when it is told its outcome (on the completion queue).
private final class ProbeJob: WriteJob, Sendable {
    private let onRun: @Sendable () -> Void
    private let onOutcome: @Sendable () -> Void

    init(onRun: @escaping @Sendable () -> Void = {}, onOutcome: @escaping @Sendable () -> Void = {}) {
        self.onRun = onRun
        self.onOutcome = onOutcome
    }

    func run(_ txn: borrowing Transaction, _ context: inout WriteContext) throws { onRun() }
    func succeed() { onOutcome() }
    func fail(_ error: any Error) { onOutcome() }
}

/// An environment with an empty `log` database and a committer over it.
private struct CommitterFixture {
    let directory: TemporaryDirectory
    let environment: Environment
    let committer: GroupCommitter

    /// `onCommit` hears each commit's position, job count and effects.
    init(
        _ name: String,
        onCommit: @escaping @Sendable (WriteContext.Position, Int, CommitEffects) -> Void = { _, _, _ in }
    ) throws {
        directory = try TemporaryDirectory(name)
        var options = Environment.Options()
        options.durability = .process
        environment = try Environment(path: directory.path, options: options)
        let log = try #require(try environment.openDatabase("log"))
        let start = WriteContext.Position(lastOffset: 0, lastTimestamp: HybridTimestamp(rawValue: 0))
        committer = GroupCommitter(environment: environment, log: log, position: start, onCommit: onCommit)
    }
}

/// How long a test waits for what should come at once before it calls it
/// a hang: generous, since a hang never ends and a slow machine does.
private let waitSecondsMax = 60.0

@Suite struct GroupCommitTests {
    /// `close()` promises the queued jobs are finished when it returns; a
    /// second, concurrent `close()` must keep that promise too, or its
    /// caller (`EventLog.close`) closes the environment under jobs it
    /// already accepted, and they fail with `.closed`.
    @Test func everyCloseWaitsForTheQueuedJobs() throws {
        let fixture = try CommitterFixture("commit-double-close")
        let committer = fixture.committer
        let started = DispatchSemaphore(value: 0)
        let gate = DispatchSemaphore(value: 0)
        let told = Atomic<Int>(0)
        let tell: @Sendable () -> Void = { told.add(1, ordering: .relaxed) }
        // Holds the writer inside its transaction until the gate opens (the
        // job may run again, so the gate stays open once opened).
        let blocker = ProbeJob(onRun: { started.signal(); gate.wait(); gate.signal() }, onOutcome: tell)
        #expect(committer.submit(blocker))
        try #require(started.wait(timeout: .now() + waitSecondsMax) == .success)
        let queuedCount = 8
        for _ in 0..<queuedCount { #expect(committer.submit(ProbeJob(onOutcome: tell))) }
        let expected = queuedCount + 1

        let toldAtReturn = Mutex<[Int]>([])
        let returned = DispatchSemaphore(value: 0)
        let closer = { @Sendable in
            Thread {
                committer.close()
                toldAtReturn.withLock { $0.append(told.load(ordering: .relaxed)) }
                returned.signal()
            }.start()
        }
        closer()
        // The first close has begun once the committer refuses jobs.
        var refusals = 0
        while committer.submit(ProbeJob(onOutcome: tell)), refusals < 1_000 {
            refusals += 1
            usleep(1_000)
        }
        closer()
        // Neither close can finish while the writer is held; one that
        // returns now has not waited. The wait only decides when to let the
        // writer go, never the verdict.
        let early = returned.wait(timeout: .now() + 0.3) == .success
        gate.signal()
        var returns = early ? 1 : 0
        while returns < 2, returned.wait(timeout: .now() + waitSecondsMax) == .success { returns += 1 }
        try #require(returns == 2, "a close() never returned")
        let counts = toldAtReturn.withLock { $0 }
        #expect(counts.allSatisfy { $0 >= expected }, "close() returned with \(counts) of \(expected) jobs told")
        fixture.environment.close()
    }

    /// A store dropped on the writer's own thread or completion queue closes
    /// there (its `deinit`): a close that waits for the writer would wait
    /// for itself. Here the jobs call `close()` from both places, inside the
    /// group's transaction and in a completion.
    @Test(arguments: [false, true])
    func aCloseOnTheWritersOwnThreadsDoesNotWaitForItself(inCompletion: Bool) throws {
        let fixture = try CommitterFixture("commit-close-self")
        let committer = fixture.committer
        let returned = DispatchSemaphore(value: 0)
        let closeHere: @Sendable () -> Void = {
            committer.close()
            returned.signal()
        }
        let job = inCompletion ? ProbeJob(onOutcome: closeHere) : ProbeJob(onRun: closeHere)
        #expect(committer.submit(job))
        guard returned.wait(timeout: .now() + waitSecondsMax) == .success else {
            // The writer is stuck waiting for itself (inside a transaction,
            // so closing the environment would hang this test too).
            Issue.record("close() on the writer's \(inCompletion ? "completion queue" : "thread") never returned")
            return
        }
        #expect(!committer.submit(ProbeJob()), "a closed committer accepted a job")
        // A close from elsewhere now waits for the writer to stop, which it
        // does: nothing is left to commit.
        let stopped = DispatchSemaphore(value: 0)
        Thread {
            committer.close()
            stopped.signal()
        }.start()
        #expect(stopped.wait(timeout: .now() + waitSecondsMax) == .success, "the writer never stopped")
        fixture.environment.close()
    }

    /// A job's error may rest on the writes of the jobs before it in the
    /// group ("already exists"), so its caller may hear it only once those
    /// writes are committed; and when they never are (here a put fails with
    /// ENOSPC, which a spill of dirty pages to disk can do), the job failed
    /// for the transaction's reason, not for state that never existed.
    @Test(arguments: [false, true])
    func aJobsErrorWaitsForTheWritesItRestsOn(groupFails: Bool) throws {
        struct AlreadyThere: Error {}
        let fixture = try CommitterFixture("commit-verdict")
        let environment = fixture.environment
        let table = try #require(try environment.openDatabase("t"))
        let started = DispatchSemaphore(value: 0)
        let gate = DispatchSemaphore(value: 0)
        let told = DispatchGroup()
        // Whether the second create's caller had been told when the last job
        // ran, and what it was told then, with whether it could see the key.
        let toldEarly = Atomic<Bool>(false)
        let outcome = Mutex<(error: (any Error)?, keyVisible: Bool)?>(nil)
        let ranLast = Mutex<Bool?>(nil)
        let blocker = ProbeJob(onRun: { started.signal(); gate.wait(); gate.signal() })
        #expect(fixture.committer.submit(blocker))
        try #require(started.wait(timeout: .now() + waitSecondsMax) == .success)

        let create: ValueJob<Bool>.Body = { txn, _ in
            if try txn.get(table, key: [1]) != nil { throw AlreadyThere() }
            try txn.put(table, key: [1], value: [1])
            return true
        }
        for index in 0..<2 {
            told.enter()
            let job = ValueJob(create) { result in
                if index == 1 {
                    let visible = (try? environment.read { txn in try txn.get(table, key: [1]) }) != nil
                    toldEarly.store(true, ordering: .releasing)
                    if case .failure(let error) = result { outcome.withLock { $0 = (error, visible) } }
                }
                told.leave()
            }
            #expect(fixture.committer.submit(job))
        }
        told.enter()
        let last = ValueJob<Bool>({ _, _ in
            ranLast.withLock { $0 = toldEarly.load(ordering: .acquiring) }
            if groupFails { throw LMDBError(code: .noSpace, operation: "mdb_put") }
            return true
        }) { _ in told.leave() }
        #expect(fixture.committer.submit(last))
        gate.signal()
        try #require(told.wait(timeout: .now() + waitSecondsMax) == .success, "a job was never told")

        #expect(ranLast.withLock { $0 } == false, "the second create heard its error before the first was committed")
        let (error, keyVisible) = try #require(outcome.withLock { $0 })
        if groupFails {
            #expect((error as? LMDBError)?.code == .noSpace, "told \(error), for a write that never committed")
            #expect(!keyVisible)
            // Nothing of the group was written, and the next write commits.
            let next = DispatchSemaphore(value: 0)
            let nextResult = Mutex<Result<Bool, any Error>?>(nil)
            #expect(fixture.committer.submit(ValueJob(create) { result in
                nextResult.withLock { $0 = result }
                next.signal()
            }))
            try #require(next.wait(timeout: .now() + waitSecondsMax) == .success)
            #expect(try nextResult.withLock { $0 }?.get() == true)
        } else {
            #expect(error is AlreadyThere)
            #expect(keyVisible, "told the key exists before it could be read")
        }
        fixture.committer.close()
        fixture.environment.close()
    }

    /// Jobs that throw, spread through a group, cost two passes over it:
    /// the first, stopped by the first error, and one with each job in a
    /// child transaction, where one that throws undoes only its own writes.
    /// Dropping one failed job per rerun ran the group's jobs about n^2 / 8
    /// times (5,250 runs here).
    @Test func failingJobsCostTwoPassesOverTheirGroup() throws {
        struct Refused: Error, Equatable { let index: Int }
        let fixture = try CommitterFixture("commit-two-passes")
        let environment = fixture.environment
        let table = try #require(try environment.openDatabase("t"))
        let started = DispatchSemaphore(value: 0)
        let gate = DispatchSemaphore(value: 0)
        let blocker = ProbeJob(onRun: { started.signal(); gate.wait(); gate.signal() })
        #expect(fixture.committer.submit(blocker))
        try #require(started.wait(timeout: .now() + waitSecondsMax) == .success)

        // Every other job writes its key and then throws.
        let jobCount = 200
        let runs = Atomic<Int>(0)
        let told = DispatchGroup()
        let outcomes = Mutex<[Int: Result<Int, any Error>]>([:])
        for index in 0..<jobCount {
            told.enter()
            let job = ValueJob<Int>({ txn, _ in
                runs.add(1, ordering: .relaxed)
                try txn.put(table, key: [UInt8(index >> 8), UInt8(index & 0xFF)], value: [1])
                if index % 2 == 1 { throw Refused(index: index) }
                return index
            }) { result in
                outcomes.withLock { $0[index] = result }
                told.leave()
            }
            #expect(fixture.committer.submit(job))
        }
        gate.signal()
        try #require(told.wait(timeout: .now() + waitSecondsMax) == .success, "a job was never told")

        #expect(runs.load(ordering: .relaxed) <= 2 * jobCount, "\(runs.load(ordering: .relaxed)) runs of \(jobCount) jobs")
        let results = outcomes.withLock { $0 }
        for index in 0..<jobCount {
            let key: [UInt8] = [UInt8(index >> 8), UInt8(index & 0xFF)]
            let stored = try environment.read { txn in try txn.get(table, key: key) } != nil
            if index % 2 == 0 {
                #expect((try? results[index]?.get()) == index)
                #expect(stored, "job \(index) succeeded but its key is missing")
            } else {
                #expect(throws: Refused(index: index)) { try results[index]?.get() }
                #expect(!stored, "job \(index) failed but its write stayed")
            }
        }
        fixture.committer.close()
        fixture.environment.close()
    }

    /// A transaction carries at most `groupCountMax` jobs; the ones queued
    /// past that wait for the next. Without the bound, the group's
    /// transaction (and the memory its dirty pages take) would grow with the
    /// queue.
    @Test func aGroupCarriesAtMostTheMostJobs() throws {
        let groups = Mutex<[Int]>([])
        let fixture = try CommitterFixture("commit-group-bound") { _, jobs, _ in groups.withLock { $0.append(jobs) } }
        let committer = fixture.committer
        let started = DispatchSemaphore(value: 0)
        let gate = DispatchSemaphore(value: 0)
        #expect(committer.submit(ProbeJob(onRun: { started.signal(); gate.wait(); gate.signal() })))
        try #require(started.wait(timeout: .now() + waitSecondsMax) == .success)
        let told = DispatchGroup()
        for _ in 0...GroupCommitter.groupCountMax {
            told.enter()
            #expect(committer.submit(ProbeJob(onOutcome: { told.leave() })))
        }
        gate.signal()
        try #require(told.wait(timeout: .now() + waitSecondsMax) == .success, "a job was never told")
        #expect(groups.withLock { $0 } == [1, GroupCommitter.groupCountMax, 1])
        committer.close()
        fixture.environment.close()
    }

    /// When `close()` returns, every caller has been told its outcome, not
    /// just had its job committed: a caller told later could act on a store
    /// its owner has already torn down. Each outcome here takes a moment to
    /// deliver, so a close that does not wait for them returns first.
    @Test func closeReturnsOnceEveryCallerIsTold() throws {
        let fixture = try CommitterFixture("commit-close-told")
        let committer = fixture.committer
        let told = Atomic<Int>(0)
        let jobCount = 8
        for _ in 0..<jobCount {
            #expect(committer.submit(ProbeJob(onOutcome: {
                usleep(20_000)
                told.add(1, ordering: .relaxed)
            })))
        }
        committer.close()
        #expect(told.load(ordering: .relaxed) == jobCount)
        fixture.environment.close()
    }
}
