import Synchronization

/// The pulls waiting for a change (`wait`, section 8), woken when their
/// user's feed grows. Each user's feed counts the pushes that woke it: a
/// pull reads the count before it reads its page, and waits only while
/// the count is unchanged, so a push that commits between the page's read
/// and the wait is not missed. A user has at most `perUserMax` pulls
/// waiting; the next answers at once.
final class FeedWaiters: Sendable {
    private struct State {
        /// Pushes that woke each user's feed, by the user's name in UTF-8
        /// (as the store tells users apart).
        var wakes: [[UInt8]: UInt64] = [:]
        /// Wakes of every feed at once (a forced resync), counted in each.
        var everyoneWakes: UInt64 = 0
        /// The waiting pulls, by user, each by its number.
        var waiting: [[UInt8]: [UInt64: Waiter]] = [:]
        var nextNumber: UInt64 = 0
        /// Set as the server stops: no pull waits any longer.
        var closed = false

        func wakes(of name: [UInt8]) -> UInt64 { (wakes[name] ?? 0) &+ everyoneWakes }
    }

    private let state = Mutex(State())
    /// The most pulls of one user that wait at once: each holds a
    /// connection and a task, and a client that starts more (many
    /// devices, or a loop) gets its pages at once, as a server that
    /// ignores `wait` answers.
    let perUserMax: Int

    init(perUserMax: Int) {
        precondition(perUserMax >= 0, "a negative count of waiting pulls")
        self.perUserMax = perUserMax
    }

    /// The wakes of `user`'s feed so far: what `wait` compares with.
    func wakes(of user: String) -> UInt64 {
        state.withLock { $0.wakes(of: Array(user.utf8)) }
    }

    /// Wakes the pulls waiting on `user`'s feed: a push committed to it.
    func wake(_ user: String) {
        let woken = state.withLock { state in
            let name = Array(user.utf8)
            state.wakes[name, default: 0] &+= 1
            return state.waiting.removeValue(forKey: name).map { Array($0.values) } ?? []
        }
        for waiter in woken { waiter.finish() }
    }

    /// Wakes every waiting pull: every feed changed (a forced resync,
    /// which the pulls now answer).
    func wakeEveryone() {
        finishEvery { $0.everyoneWakes &+= 1 }
    }

    /// Wakes every waiting pull, and lets none wait from now on: the server
    /// is stopping, and a graceful stop waits for the answers under way.
    func close() {
        finishEvery { $0.closed = true }
    }

    /// Makes `change` and ends every wait, in one hold of the lock: a pull
    /// that registers after it sees the change.
    private func finishEvery(after change: (inout State) -> Void) {
        let woken = state.withLock { state in
            change(&state)
            defer { state.waiting = [:] }
            return state.waiting.values.flatMap(\.values)
        }
        for waiter in woken { waiter.finish() }
    }

    /// Lets pulls wait again after `close()`: the server serves again.
    func reopen() {
        state.withLock { $0.closed = false }
    }

    /// Waits until `user`'s feed is woken after `wakes` (at once when it
    /// was already, or `perUserMax` pulls of the user wait already),
    /// `deadline` passes, the server stops, or the task is cancelled.
    /// - Returns: whether the feed was woken: a pull now may find a change.
    func wait(_ user: String, after wakes: UInt64, until deadline: ContinuousClock.Instant) async -> Bool {
        let name = Array(user.utf8)
        let waiter = Waiter()
        let number = state.withLock { state -> UInt64? in
            guard !state.closed, state.wakes(of: name) == wakes, state.waiting[name]?.count ?? 0 < perUserMax else { return nil }
            state.nextNumber += 1
            state.waiting[name, default: [:]][state.nextNumber] = waiter
            return state.nextNumber
        }
        guard let number else { return self.wakes(of: user) != wakes }
        let timer = Task {
            try? await Task.sleep(until: deadline, clock: .continuous)
            waiter.finish()
        }
        await withTaskCancellationHandler {
            await waiter.suspend()
        } onCancel: {
            waiter.finish()
        }
        timer.cancel()
        state.withLock { state in
            state.waiting[name]?[number] = nil
            if state.waiting[name]?.isEmpty == true { state.waiting[name] = nil }
        }
        return self.wakes(of: user) != wakes
    }

    /// The pulls waiting now (tests).
    var waitingCount: Int { state.withLock { $0.waiting.values.map(\.count).reduce(0, +) } }
}

/// One waiting pull: `finish()` ends its wait, before it began or during
/// it, once (later calls do nothing).
private final class Waiter: Sendable {
    private let state = Mutex<(continuation: CheckedContinuation<Void, Never>?, finished: Bool)>((nil, false))

    func suspend() async {
        await withCheckedContinuation { continuation in
            let finished = state.withLock { state in
                if !state.finished { state.continuation = continuation }
                return state.finished
            }
            if finished { continuation.resume() }
        }
    }

    func finish() {
        let continuation = state.withLock { state in
            defer { state = (nil, true) }
            return state.continuation
        }
        continuation?.resume()
    }
}
