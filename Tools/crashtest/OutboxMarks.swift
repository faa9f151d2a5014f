import LogFormat
import LogStore
import LogTesting

/// The outbox's attempt state, written without a log entry: retries
/// scheduled (`Store.scheduleRetry`), intents marked failed
/// (`markFailed`) and failed ones made pending again (`retryFailed`), one
/// call at a time, as a sync engine makes them. The log does not hold this
/// state, so a replay cannot bring it back: a rebuild carries it over from
/// the tables it replaces, and an acknowledged mark must survive a kill
/// whether it lands before, during or after a rebuild.
///
/// Reports: `mark ID KIND AT OFFSET...` before a call (KIND `retry`, `fail`
/// or `unfail`, AT the retry time) and `marked ID` after it returned.
enum OutboxMarks {
    /// A retry that reaches this many attempts marks its intent failed.
    static let attemptsMax: UInt32 = 3
    /// Marks go to the first this many pending intents, so the same ones
    /// are marked again and again (and reach `attemptsMax`).
    static let targetCountMax = 64
    /// The most intents one call marks.
    static let offsetsPerCallMax = 3
    /// The longest pause between calls, in milliseconds.
    static let pauseMillisecondsMax = 3

    enum Kind: String, Sendable {
        case retry, fail, unfail
    }

    /// One call, as reported.
    struct Call {
        var id: String
        var kind: Kind
        var at: UInt64
        var offsets: [UInt64]
        var error: String { "crashtest-\(id)" }

        init(id: String, kind: Kind, at: UInt64, offsets: [UInt64]) {
            self.id = id
            self.kind = kind
            self.at = at
            // Each intent once, as the store counts one attempt per call.
            var seen = Set<UInt64>()
            self.offsets = offsets.filter { seen.insert($0).inserted }
        }

        init?(_ report: Report) {
            guard report.words.count >= 3, let kind = Kind(rawValue: report.words[1]), let at = UInt64(report.words[2]) else {
                return nil
            }
            let offsets = report.words.dropFirst(3).compactMap { UInt64($0) }
            guard offsets.count == report.words.count - 3 else { return nil }
            self.init(id: report.words[0], kind: kind, at: at, offsets: offsets)
        }

        var words: [String] { [id, kind.rawValue, String(at)] + offsets.map { String($0) } }

        /// A row's state after this call, as the store's rules make it.
        func applied(to state: State, offset: UInt64) -> State {
            var state = state
            switch kind {
            case .unfail:
                if state.status == .failed { state = State() }
            case .retry, .fail:
                guard offsets.contains(offset), state.status == .pending else { break }
                state.attempts = state.attempts == .max ? .max : state.attempts + 1
                state.lastError = error
                if kind == .fail || state.attempts >= OutboxMarks.attemptsMax {
                    state.status = .failed
                    state.nextAttemptAt = 0
                } else {
                    state.nextAttemptAt = at
                }
            }
            return state
        }
    }

    /// `OutboxState`, hashable, so a row can have several possible states.
    struct State: Hashable, CustomStringConvertible {
        var status = OutboxState.Status.pending
        var attempts: UInt32 = 0
        var nextAttemptAt: UInt64 = 0
        var lastError = ""

        init() {}

        init(_ state: OutboxState) {
            status = state.status
            attempts = state.attempts
            nextAttemptAt = state.nextAttemptAt
            lastError = state.lastError
        }

        var description: String {
            "\(status == .failed ? "failed" : "pending"), \(attempts) attempts, next at \(nextAttemptAt), last error \"\(lastError)\""
        }
    }

    /// A worker loop that marks pending intents until the worker ends.
    static func loop(_ store: Store, _ worker: Worker) -> Worker.Loop {
        {
            var random = SeededRandom(seed: worker.seed &+ 0x6D61_726B)
            for number in 0..<worker.writesMax {
                try await Task.sleep(for: .milliseconds(Int.random(in: 1...pauseMillisecondsMax, using: &random)))
                let pending = try store.outbox(limit: targetCountMax)
                guard !pending.isEmpty else { continue }
                let roll = Int.random(in: 0..<10, using: &random)
                let kind: Kind = roll < 6 ? .retry : roll < 9 ? .fail : .unfail
                let offsets =
                    kind == .unfail
                    ? [] : (0..<Int.random(in: 1...offsetsPerCallMax, using: &random)).map { _ in pending.randomElement(using: &random)!.offset }
                let call = Call(id: "\(worker.tag)-\(number)", kind: kind, at: UInt64(1_000 + number), offsets: offsets)
                worker.reporter.send("mark", call.words)
                switch kind {
                case .retry:
                    try await store.scheduleRetry(offsets: call.offsets, error: call.error, at: call.at, attemptsMax: attemptsMax)
                case .fail: try await store.markFailed(offsets: call.offsets, error: call.error)
                case .unfail: try await store.retryFailed()
                }
                worker.reporter.send("marked", [call.id])
            }
        }
    }

    /// Every outbox row must be in a state the calls leave it in: the
    /// acknowledged ones applied, and each one in flight at a kill applied
    /// or not. After `downgrade` (tables marked older, `ReplayWorkload`) a
    /// row may also be back in its first state, and after `upgraded` it is.
    /// - Returns: how many acknowledged calls it checked.
    static func check(_ ledger: Ledger, _ store: Store, _ context: inout IterationContext) throws -> Int {
        let acknowledged = Set(ledger.with("marked").compactMap(\.words.first))
        var possible: [UInt64: Set<State>] = [:]
        for report in ledger.reports {
            switch report.verb {
            case "downgrade":
                for offset in possible.keys { possible[offset]?.insert(State()) }
                continue
            case "upgraded":
                possible = [:]
                continue
            case "mark": break
            default: continue
            }
            guard let call = Call(report) else {
                context.violation("a malformed report: \(report)")
                continue
            }
            for offset in call.offsets where possible[offset] == nil { possible[offset] = [State()] }
            for (offset, states) in possible {
                let after = Set(states.map { call.applied(to: $0, offset: offset) })
                possible[offset] = acknowledged.contains(call.id) ? after : states.union(after)
            }
        }
        var shown = 0
        for pending in try store.outbox() {
            let state = State(pending.state)
            let allowed = possible[pending.offset] ?? [State()]
            guard !allowed.contains(state), shown < StoreCheck.differencesShownMax else { continue }
            shown += 1
            context.violation(
                "outbox at offset \(pending.offset): the attempt state is \(state); the marks made leave it "
                    + allowed.map(\.description).sorted().joined(separator: " or "))
        }
        return acknowledged.count
    }
}
