import LogFormat
import LogStore

/// How conflicts of one entity type are settled (`SyncConfiguration`).
/// Every conflict is written to the log whatever the strategy; `.askApp`
/// (and the others, where their cases say so) leaves it open, listed by
/// `Store.conflicts()` until the app calls `Store.resolveConflict`.
public enum ConflictStrategy: Sendable {
    /// Push the local change again on top of the server's version. Against
    /// a deletion, the entity comes back as the app sees it; when that is
    /// too large for one log entry, the app decides
    /// (`SyncReport.refusedDecisions`).
    case keepLocal
    /// Drop the local change.
    case keepRemote
    /// The side whose `field` (a timestamp, integer or double) is greater
    /// wins; a tie keeps the server's. When either side lacks a comparable
    /// value the app decides.
    case newerWins(field: String)
    /// Field by field: what only one side changed is kept; a field both
    /// changed goes to `prefer`. A delete against a change goes to `prefer`.
    /// When the server is preferred but the state the change was made
    /// against is no longer known (changes pulled before the push moved the
    /// store's base on), a field the two sides set differently may or may
    /// not have been changed by the server: the app decides.
    case fieldMerge(prefer: Side)
    /// The app's own rule, called inside a write transaction: it must be
    /// quick and must not touch the store, and may be called more than once
    /// for one conflict (the transaction runs again when the map grows), so
    /// it decides from the case alone, with no effects of its own. A
    /// decision the store refuses (what `Store.resolveConflict` would
    /// refuse: invalid or reserved names, non-finite doubles, values nested
    /// too deep, a resolution intent over the entry limit) is not applied:
    /// the conflict waits for the app as with `.askApp`, and
    /// `SyncReport.refusedDecisions` names the entity and the reason. The
    /// rest of the run goes on; refusing the whole push would bring the
    /// conflict back, and refuse it again, on every run.
    case custom(@Sendable (ConflictCase) -> ConflictDecision)
    /// Leave it to the app.
    case askApp

    public enum Side: Sendable { case local, remote }

    public func decide(_ conflict: ConflictCase) -> ConflictDecision {
        switch self {
        case .keepLocal: .keepLocal
        case .keepRemote: .keepRemote
        case .askApp: .askApp
        case .custom(let rule): rule(conflict)
        case .newerWins(let field): ConflictStrategy.newer(field, conflict)
        case .fieldMerge(let prefer): ConflictStrategy.merge(conflict, prefer: prefer)
        }
    }

    private static func newer(_ field: String, _ conflict: ConflictCase) -> ConflictDecision {
        let local = conflict.intent.fields[field] ?? conflict.local?[field]
        guard !conflict.server.deleted, let local, let remote = conflict.server.data[field],
            let order = compare(local, remote)
        else { return .askApp }
        return order > 0 ? .keepLocal : .keepRemote
    }

    /// Orders two timestamps, or two numbers; nil for anything else.
    private static func compare(_ a: Value, _ b: Value) -> Int? {
        func order<T: Comparable>(_ x: T, _ y: T) -> Int { x == y ? 0 : (x < y ? -1 : 1) }
        switch (a, b) {
        case (.timestamp(let x), .timestamp(let y)): return order(x, y)
        case (.int(let x), .int(let y)): return order(x, y)
        case (.double(let x), .double(let y)): return x.isNaN || y.isNaN ? nil : order(x, y)
        case (.int(let x), .double(let y)): return compare(x, y)
        case (.double(let x), .int(let y)): return compare(y, x).map { -$0 }
        default: return nil
        }
    }

    /// Orders an integer and a double exactly; nil for NaN. Converting the
    /// integer to a double rounds it past 2^53, which made two different
    /// numbers a tie.
    private static func compare(_ x: Int64, _ y: Double) -> Int? {
        guard !y.isNaN else { return nil }
        // 2^63: no Int64 reaches it, and every Int64 is at or above -2^63.
        guard y < 9_223_372_036_854_775_808.0 else { return -1 }
        guard y >= -9_223_372_036_854_775_808.0 else { return 1 }
        let whole = y.rounded(.towardZero)
        let wholeInteger = Int64(whole)
        if x != wholeInteger { return x < wholeInteger ? -1 : 1 }
        return whole == y ? 0 : (y > whole ? -1 : 1)
    }

    private static func merge(_ conflict: ConflictCase, prefer: Side) -> ConflictDecision {
        let intent = conflict.intent
        guard intent.operation != .delete, !conflict.server.deleted else { return prefer == .local ? .keepLocal : .keepRemote }
        var changes: [(String, Value)] = []
        for (name, value) in intent.fields {
            let serverValue = conflict.server.data[name]
            if prefer == .local || serverValue == value {
                changes.append((name, value))
                continue
            }
            guard conflict.baseIsCommonAncestor else { return .askApp }
            if serverValue == conflict.base?[name] { changes.append((name, value)) }
        }
        return .merged(conflict.server.data.merging(Fields(changes)))
    }
}
