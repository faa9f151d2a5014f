import Foundation
import LMDB
import LogFormat

/// Runs write jobs on one dedicated thread, many jobs to a transaction, so
/// concurrent writers share each commit and its fsync (group commit).
///
/// Why a thread of its own: a durable commit blocks in `fdatasync` for a
/// millisecond or more, and blocking Swift's cooperative pool (two threads on
/// a two-core machine) would stall every task in the process.
///
/// Jobs run in submission order inside one write transaction. A job that
/// throws must not take the others down with it, so the group is aborted and
/// run again with each job in a child transaction, which undoes a job that
/// throws and nothing else. Its caller is told with the others, once the
/// rest commits. This needs jobs to be deterministic functions of the
/// transaction, which they must be anyway: a full map also reruns the group.
final class GroupCommitter: @unchecked Sendable {
    /// The most jobs committed in one transaction; later ones wait for the next.
    static let groupCountMax = 1024

    private let environment: Environment
    private let condition = NSCondition()
    // Guarded by `condition`.
    private var queue: [any WriteJob] = []
    private var closing = false
    /// How many queued jobs the writer waits for.
    private var wakeCount = 1
    private var thread: Thread?
    /// Entered until the writer has stopped and `onStop` has run. A group,
    /// not a semaphore, so that every waiting `close()` wakes.
    private let stopped = DispatchGroup()
    /// Wakes the callers of a committed group. Waking 64 blocked threads
    /// costs a few microseconds each; done here, it overlaps the next
    /// group's commit instead of delaying it. Serial, so callers learn of
    /// their commits in commit order.
    private let completions = DispatchQueue(label: "SyncStore writer completions")
    /// Marks `completions`, so `close()` knows when it runs there.
    private let onCompletions = DispatchSpecificKey<Bool>()
    /// Owned by the writer thread: the log's position between commits.
    private var committed: WriteContext.Position
    /// Owned by the writer thread: the environment's `reopenCount` when
    /// `committed` was last known to be the log's end.
    private var reopensSeen = 0
    private let log: Database
    /// Called on the writer thread after each commit with the new position
    /// and the number of jobs the commit carried.
    private let onCommit: @Sendable (WriteContext.Position, Int, CommitEffects) -> Void
    /// Called on the writer thread once it has stopped: the owner's
    /// teardown, such as closing the environment.
    private let onStop: @Sendable () -> Void

    init(
        environment: Environment, log: Database, position: WriteContext.Position,
        onCommit: @escaping @Sendable (WriteContext.Position, Int, CommitEffects) -> Void,
        onStop: @escaping @Sendable () -> Void = {}
    ) {
        self.environment = environment
        self.log = log
        self.committed = position
        reopensSeen = environment.reopenCount
        self.onCommit = onCommit
        self.onStop = onStop
        completions.setSpecific(key: onCompletions, value: true)
        stopped.enter()
        let thread = Thread { [unowned self] in self.run() }
        thread.name = "SyncStore writer"
        self.thread = thread
        thread.start()
    }

    /// Queues `job`; it completes after its transaction commits or fails.
    /// - Returns: false when the committer is closed (the job was not queued).
    func submit(_ job: any WriteJob) -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard !closing else { return false }
        queue.append(job)
        // Waking the writer before it has what it waits for would only make
        // it look and sleep again, taking a core from the callers.
        if queue.count >= wakeCount { condition.signal() }
        return true
    }

    /// Jobs queued and not yet taken into a group (tests wait for them).
    var queuedCount: Int {
        condition.lock()
        defer { condition.unlock() }
        return queue.count
    }

    /// Whether `close()` has been called (tests wait for it).
    var isClosing: Bool {
        condition.lock()
        defer { condition.unlock() }
        return closing
    }

    /// Finishes the queued jobs, stops the thread and runs `onStop`. Every
    /// call waits for all of that, a second or concurrent one too: returning
    /// earlier would let its caller tear down what queued jobs still need.
    /// A call on the writer thread or its completion queue returns at once
    /// instead, and the writer stops on its own: there the call comes from
    /// a `deinit` (a store whose last reference died with a job), and it
    /// would wait for itself forever.
    func close() {
        condition.lock()
        closing = true
        condition.signal()
        let onWritersOwnThreads = Thread.current === thread || DispatchQueue.getSpecific(key: onCompletions) == true
        condition.unlock()
        if !onWritersOwnThreads { stopped.wait() }
    }

    private func run() {
        while let group = nextGroup() {
            commit(group)
        }
        // Every caller has been told before close() returns.
        completions.sync {}
        // Here, not in close(): a close() on the writer's own threads
        // returns before the writer stops, possibly inside a transaction.
        onStop()
        stopped.leave()
    }

    /// How long the writer may wait for callers still on their way back
    /// (woken by the previous commit, about to submit again): a fraction of
    /// one durable commit, so a lone writer never waits at all.
    static let lingerMax: TimeInterval = 0.000_1
    /// After a wait for returning callers runs out, the writer skips this
    /// many chances to wait for them.
    static let rejoinPauseCount = 16
    // Only the writer thread touches these two (under `condition`).
    /// The size of the last group.
    private var lastGroupCount = 0
    /// Chances to wait for returning callers still to skip.
    private var rejoinPause = 0

    private func nextGroup() -> [any WriteJob]? {
        condition.lock()
        defer { condition.unlock() }
        // Jobs queued while the last group committed, and the callers of
        // that group, woken now and on their way back, can share the next
        // commit. Without this wait they take turns: two halves of the
        // writers, each commit carrying one. It pays when callers come back
        // quickly (an async caller's task resumes): bench section 2, async
        // appends, 30-40% more entries/s with 4 to 64 writers. 64 blocked
        // threads woken one by one on two cores take longer than the commit
        // the wait saves, so after a wait that runs out the writer stops
        // waiting for a while.
        var waited = false
        if !queue.isEmpty, lastGroupCount > 0, !closing {
            if rejoinPause > 0 {
                rejoinPause -= 1
            } else {
                let target = min(queue.count + lastGroupCount, GroupCommitter.groupCountMax)
                if !waitForQueue(target) { rejoinPause = GroupCommitter.rejoinPauseCount }
                waited = true
            }
        }
        while queue.isEmpty && !closing { condition.wait() }
        if queue.isEmpty { return nil }
        // Fewer jobs than half the last group means the rest of its callers
        // are still being woken; a moment's wait lets them share this commit
        // (one wait per group at most).
        if !waited, queue.count * 2 < lastGroupCount, !closing {
            waitForQueue((lastGroupCount + 1) / 2)
        }
        let count = min(queue.count, GroupCommitter.groupCountMax)
        let group = Array(queue.prefix(count))
        queue.removeFirst(count)
        lastGroupCount = count
        return group
    }

    /// Waits up to `lingerMax` for `count` queued jobs, holding `condition`.
    /// - Returns: whether they came (or the committer is closing).
    @discardableResult
    private func waitForQueue(_ count: Int) -> Bool {
        let deadline = Date(timeIntervalSinceNow: GroupCommitter.lingerMax)
        wakeCount = count
        defer { wakeCount = 1 }
        while queue.count < count, !closing, condition.wait(until: deadline) {}
        return queue.count >= count || closing
    }

    /// Where the group's entries go: after `committed`, unless the
    /// environment was opened again after a failure since it was known.
    /// Then the log's last entry says: a commit whose meta page failed to
    /// write is reported failed, and LMDB writes the old page back, but a
    /// log that went on from memory would clash with any that came through.
    private func startPosition(_ txn: borrowing Transaction) throws -> WriteContext.Position {
        let reopens = environment.reopenCount
        guard reopens != reopensSeen else { return committed }
        committed = try EventLog.lastPosition(txn, log: log, path: environment.path)
        reopensSeen = reopens
        return committed
    }

    private func commit(_ group: [any WriteJob]) {
        // The first pass runs the jobs straight in the transaction, the
        // cheap way. When one throws, that pass is undone and the group runs
        // again with each job in a child transaction of its own, which a
        // job that throws undoes alone: two passes, however many jobs fail
        // (dropping one job per rerun made them quadratic).
        var isolated = false
        while true {
            var succeeded: [any WriteJob] = []
            // A job's error may rest on the writes of the jobs before it
            // ("already exists"), so its caller hears it only once those are
            // committed, and hears the transaction's error if they never are.
            var rejected: [(job: any WriteJob, error: any Error)] = []
            var jobFailed = false
            do {
                let (position, effects) = try environment.write { txn in
                    (succeeded, rejected) = ([], [])
                    var context = WriteContext(log: log, path: environment.path, position: try startPosition(txn))
                    for job in group {
                        do {
                            if isolated {
                                // Kept only here: a copy would make each
                                // job's first change copy the effects.
                                let before = context
                                do {
                                    try txn.nested { child in try job.run(child, &context) }
                                } catch let error where !(error is LMDBError) {
                                    context = before
                                    rejected.append((job, error))
                                    continue
                                }
                            } else {
                                try job.run(txn, &context)
                            }
                            succeeded.append(job)
                        } catch let error as LMDBError {
                            throw error  // The whole transaction is at fault.
                        } catch {
                            jobFailed = true
                            throw error
                        }
                    }
                    return (context.position, context.effects)
                }
                committed = position
                var published = effects
                published.offset = position.lastOffset
                onCommit(position, succeeded.count, published)
                let (committedJobs, rejectedJobs) = (succeeded, rejected)
                completions.async {
                    for job in committedJobs { job.succeed() }
                    for (job, error) in rejectedJobs { job.fail(error) }
                }
                return
            } catch {
                if jobFailed, !isolated {
                    isolated = true
                    continue
                }
                completions.async { for job in group { job.fail(error) } }
                return
            }
        }
    }
}

/// A unit of work for the writer thread, with its completion.
///
/// The writer drops a job only after telling its caller the outcome, so
/// `succeed` and `fail` first let go of what the job holds for the caller
/// (its closure's captures): the caller's own references must be the last.
protocol WriteJob: AnyObject, Sendable {
    /// Runs inside the group's transaction; may run more than once.
    func run(_ txn: borrowing Transaction, _ context: inout WriteContext) throws
    /// The transaction committed: deliver the last run's value.
    func succeed()
    func fail(_ error: any Error)
}

/// A job whose body returns a value to one waiting caller, async or blocking.
final class ValueJob<Value: Sendable>: WriteJob, @unchecked Sendable {
    typealias Body = @Sendable (borrowing Transaction, inout WriteContext) throws -> Value
    /// Nil once the caller is told. A store's write captures the store: a
    /// job that kept it could outlive the caller's own reference, and the
    /// store would then be released on the writer's threads (see
    /// `GroupCommitter.close()`) rather than when the caller lets go.
    private var body: Body?
    private let complete: @Sendable (Result<Value, any Error>) -> Void
    // Set by the writer thread; read by `succeed` on the completion queue,
    // which runs after the commit.
    private var value: Value?

    init(_ body: @escaping Body, complete: @escaping @Sendable (Result<Value, any Error>) -> Void) {
        self.body = body
        self.complete = complete
    }

    func run(_ txn: borrowing Transaction, _ context: inout WriteContext) throws {
        guard let body else { preconditionFailure("a job ran after its caller was told") }
        value = try body(txn, &context)
    }

    func succeed() {
        guard let value else { preconditionFailure("a job succeeded without running") }
        body = nil
        self.value = nil
        complete(.success(value))
    }

    func fail(_ error: any Error) {
        body = nil
        value = nil
        complete(.failure(error))
    }
}

/// What a job may do to the log inside the group's transaction: append
/// entries at the next offsets, stamped with the store's hybrid clock.
struct WriteContext {
    struct Position: Sendable, Equatable {
        /// The last offset written (0 for an empty log).
        var lastOffset: UInt64
        var lastTimestamp: HybridTimestamp

        /// The position of an empty log.
        static let empty = Position(lastOffset: 0, lastTimestamp: HybridTimestamp(rawValue: 0))
    }

    let log: Database
    /// The store's directory, for errors.
    let path: String
    private(set) var position: Position
    private let wallClock = wallClockMilliseconds()

    init(log: Database, path: String, position: Position) {
        self.log = log
        self.path = path
        self.position = position
    }

    /// What the jobs of this transaction did that observers hear about once
    /// it commits.
    var effects = CommitEffects()

    /// Writes an entry as it was (its offset and timestamp kept), after the
    /// last one: for restoring an exported log. Offsets must ascend; holes
    /// are the caller's to account for (the compaction watermark).
    mutating func restore(_ entry: Entry, in txn: borrowing Transaction) throws {
        try Validation.entry(entry.body)
        guard entry.offset > position.lastOffset, entry.timestamp > position.lastTimestamp || position.lastOffset == 0 else {
            throw LogStoreError(
                .invalidArgument, path: path, offset: entry.offset,
                "entries must follow offset \(position.lastOffset) in order, with later timestamps")
        }
        try txn.put(log, key: OffsetKey.encode(entry.offset), value: try EntryCodec.encode(entry), flags: .append)
        position = Position(lastOffset: entry.offset, lastTimestamp: entry.timestamp)
        effects.entries += 1
    }

    /// Appends one entry and returns its offset.
    /// - Throws: `LogStoreError.invalidArgument` when the body breaks a rule
    ///   of `Validation.entry` (every append is checked here, so the
    ///   projections can apply whatever the log holds), `FormatError` (the
    ///   body is over a limit), `LMDBError`; `LogStoreError.logFull` when
    ///   the last entry has the last offset, 2^64 - 1, or the last
    ///   timestamp, which no later one follows (only an imported log gets
    ///   to either).
    mutating func append(_ body: borrowing EntryBody, in txn: borrowing Transaction) throws -> UInt64 {
        try Validation.entry(body)
        guard position.lastOffset < .max else {
            throw LogStoreError(
                .logFull, path: path, offset: position.lastOffset,
                "the last entry has offset \(position.lastOffset), the last there is: no entry can follow it")
        }
        guard position.lastTimestamp.rawValue < .max else {
            throw LogStoreError(
                .logFull, path: path, offset: position.lastOffset,
                "the last entry has timestamp \(UInt64.max), the last there is: no entry can have a later one")
        }
        let offset = position.lastOffset + 1
        let timestamp = position.lastTimestamp.next(wallClockMilliseconds: wallClock)
        let bytes = try EntryCodec.encode(offset: offset, timestamp: timestamp, body: body)
        try txn.put(log, key: OffsetKey.encode(offset), value: bytes, flags: .append)
        precondition(offset == position.lastOffset + 1, "offsets must be dense")
        position = Position(lastOffset: offset, lastTimestamp: timestamp)
        effects.entries += 1
        return offset
    }

    /// Appends one entry and returns it as written (offset and timestamp).
    mutating func appendEntry(_ body: EntryBody, in txn: borrowing Transaction) throws -> Entry {
        let offset = try append(body, in: txn)
        return Entry(offset: offset, timestamp: position.lastTimestamp, body: body)
    }
}

/// What committed transactions tell observers: which entity types changed
/// and which events the app must hear of.
struct CommitEffects: Sendable {
    /// The log's last offset once the transaction committed.
    var offset: UInt64 = 0
    var touchedTypes: Set<String> = []
    var events: [StoreEvent] = []
    /// Intents written now (not replayed): the outbox has more to push.
    var wroteIntents = false
    /// Entries appended (or restored) to the log.
    var entries = 0

    var isEmpty: Bool { touchedTypes.isEmpty && events.isEmpty && !wroteIntents }
}
