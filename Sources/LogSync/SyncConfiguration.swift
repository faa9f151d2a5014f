import LogFormat
import LogStore
import Synchronization

/// The engine's settings. The defaults are the protocol's recommendations.
public struct SyncConfiguration: Sendable {
    /// Intents per push request (at most `Wire.pushOperationCountMax`).
    public var pushBatchCountMax = 100
    /// Changes asked for per pull page (at most `Wire.pullPageCountMax`).
    public var pullPageCountMax = 500
    public var retry = RetryPolicy()
    /// The strategy for each entity type; others use `defaultConflictStrategy`.
    public var conflictStrategies: [String: ConflictStrategy] = [:]
    public var defaultConflictStrategy = ConflictStrategy.askApp
    /// The oldest pending intent is "stuck" once it waited this long while
    /// the server was reachable.
    public var stuckAfterMilliseconds: UInt64 = 10 * 60 * 1_000
    /// Full resyncs one run may start before it gives up (a server that
    /// keeps asking for one is broken).
    public var resyncsPerRunMax = 3
    /// What to send over an expensive or constrained network path.
    public var network = NetworkPolicy()
    /// The entity types to pull (`Format/sync-protocol.md` section 8,
    /// `types`); nil pulls every type. Changes of other types never come:
    /// an app whose user keeps large attachments off the device leaves
    /// their type out. Intents of any type are still pushed. The server's
    /// cursor goes with the set it was made for, so a store that pulled
    /// another set (or every type) does a full resync at its next pull:
    /// the confirmed state of every type is forgotten, pending intents
    /// stay, and the new set comes from the start of the feed.
    public var pulledTypes: Set<String>?
    /// The scopes to pull (`Format/sync-protocol.md` section 7, "Scopes",
    /// and section 8, `scopes`), with a server whose scope field gives
    /// each entity a scope (a project, a team): only the changes of
    /// entities in these scopes come, and of those in none; nil pulls
    /// every scope. As with `pulledTypes`, intents of any scope are still
    /// pushed, and a store that pulled another set does a full resync at
    /// its next pull, which forgets the confirmed state of the scopes left
    /// out. The transport must be `ScopedPulling` (as `HTTPTransport` is).
    public var pulledScopes: PulledScopes?
    /// Compacts the store's log below its last offset
    /// (`Store.compact(below:)`) at the end of a run that completed, once
    /// at least this many offsets were written since the log was last
    /// compacted (`Store.compactedBelow()`), so that the log of an app
    /// that never compacts stops growing with its history. nil (the
    /// default) never does: the app compacts when it chooses. Pending
    /// intents, their conflicts and the pull cursor stay; what it did is
    /// the run's `SyncReport.compaction`. At least 1.
    public var compactAfterOffsets: UInt64?

    public init() {}

    func strategy(for type: String) -> ConflictStrategy { conflictStrategies[type] ?? defaultConflictStrategy }

    /// - Throws: `SyncConfigurationError` naming the first setting out of
    ///   its range.
    public func validate() throws(SyncConfigurationError) {
        let push = 1...Wire.pushOperationCountMax
        guard push.contains(pushBatchCountMax) else {
            throw SyncConfigurationError("pushBatchCountMax \(pushBatchCountMax) is outside \(push)")
        }
        let pull = 1...Wire.pullPageCountMax
        guard pull.contains(pullPageCountMax) else {
            throw SyncConfigurationError("pullPageCountMax \(pullPageCountMax) is outside \(pull)")
        }
        guard resyncsPerRunMax >= 0 else { throw SyncConfigurationError("resyncsPerRunMax \(resyncsPerRunMax) is negative") }
        // A jitter outside 0...1 (or NaN) makes no range of factors, or negative ones.
        guard (0...1).contains(retry.jitter) else { throw SyncConfigurationError("retry.jitter \(retry.jitter) is outside 0...1") }
        guard retry.attemptsMax >= 1 else { throw SyncConfigurationError("retry.attemptsMax 0 allows no attempt") }
        if let pulledTypes {
            guard (1...Wire.pullTypesCountMax).contains(pulledTypes.count) else {
                throw SyncConfigurationError(
                    "pulledTypes names \(pulledTypes.count) types; 1 to \(Wire.pullTypesCountMax), or nil for every type")
            }
            for type in pulledTypes.sorted() {
                if let problem = NameRules.entityTypeProblem(type) { throw SyncConfigurationError("pulledTypes: \(problem)") }
            }
        }
        if compactAfterOffsets == 0 {
            throw SyncConfigurationError("compactAfterOffsets 0 would compact after every run; at least 1, or nil for never")
        }
        if let pulledScopes {
            if let problem = NameRules.fieldsProblem([pulledScopes.field: .null]) {
                throw SyncConfigurationError("pulledScopes.field: \(problem)")
            }
            let scopes = pulledScopes.scopes
            guard (1...Wire.pullScopesCountMax).contains(scopes.count) else {
                throw SyncConfigurationError(
                    "pulledScopes names \(scopes.count) scopes; 1 to \(Wire.pullScopesCountMax), or nil for every scope")
            }
            for scope in scopes.sorted() {
                if let problem = Wire.scopeProblem(scope) { throw SyncConfigurationError("pulledScopes: \(problem)") }
            }
        }
    }
}

/// The scopes an engine pulls (`SyncConfiguration.pulledScopes`).
public struct PulledScopes: Sendable, Equatable {
    /// The server's scope field (`syncserver --scope-field`): the engine
    /// reads an entity's scope from it, to know which of its pushed
    /// changes the feed it pulls will show.
    public var field: String
    /// 1 to `Wire.pullScopesCountMax` scopes, each as `Wire.scopeProblem`
    /// allows.
    public var scopes: Set<String>

    public init(field: String, scopes: Set<String>) {
        self.field = field
        self.scopes = scopes
    }

    /// Whether the feed of these scopes shows changes of an entity whose
    /// fields are `fields`: one in these scopes, or in none, as the server
    /// takes a value that is no scope.
    func contain(_ fields: Fields) -> Bool {
        guard case .string(let scope)? = fields[field], Wire.scopeProblem(scope) == nil else { return true }
        return scopes.contains(scope)
    }
}

/// A `SyncConfiguration` setting out of its range.
public struct SyncConfigurationError: Error, Equatable, Sendable, CustomStringConvertible {
    public let description: String

    init(_ description: String) { self.description = "sync configuration: " + description }
}

/// Stops a running sync, abandoning the request it waits for: when
/// `cancel()` is called from anywhere, or once a deadline on a clock has
/// passed.
public final class SyncCancellation: Sendable {
    private let flag = Atomic(false)
    let deadline: (clock: any SyncClock, milliseconds: UInt64)?
    /// Run at `cancel()`, by their key; nil once it was called.
    private let handlers = Mutex<[UInt64: @Sendable () -> Void]?>([:])
    private let nextKey = Atomic<UInt64>(0)

    public init() { deadline = nil }

    /// Cancelled also once `clock.monotonicMilliseconds` reads
    /// `deadlineMilliseconds` or later (a time-boxed run,
    /// `SyncScheduler.runBackground`): a step of the wall clock moves it
    /// neither nearer nor further.
    public init(deadlineMilliseconds: UInt64, clock: any SyncClock) {
        deadline = (clock, deadlineMilliseconds)
    }

    public func cancel() {
        flag.store(true, ordering: .relaxed)
        for handler in handlers.withLock({ handlers in defer { handlers = nil }; return handlers ?? [:] }).values { handler() }
    }

    /// Runs `handler` at `cancel()`, or now if it was called, unless
    /// `forget` is given the key it returns first: a cancellation that an
    /// app passes to every sync, and never cancels, would otherwise hold a
    /// handler for each.
    func onCancel(_ handler: @escaping @Sendable () -> Void) -> UInt64 {
        let key = nextKey.add(1, ordering: .relaxed).oldValue
        let kept = handlers.withLock { handlers in
            handlers?[key] = handler
            return handlers != nil
        }
        if !kept { handler() }
        return key
    }

    func forget(_ key: UInt64) { handlers.withLock { _ = $0?.removeValue(forKey: key) } }

    public var isCancelled: Bool {
        if flag.load(ordering: .relaxed) { return true }
        guard let deadline else { return false }
        return deadline.clock.monotonicMilliseconds >= deadline.milliseconds
    }
}
