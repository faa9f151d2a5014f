import LogFormat
@testable import LogStore
import LogSync
import Testing

/// `ConflictStrategy.decide` on its own, without a server: the orderings
/// `newerWins` knows and the cases it leaves to the app.
@Suite struct ConflictStrategyTests {
    /// A conflict on `te/x`: the intent sets `stamp` to `local` (nil: an
    /// update without it, the app's state then has `appStamp`), the server
    /// has `server` (nil: a state without it), or deleted the entity.
    static func conflict(
        local: Value?, appStamp: Value? = nil, server: Value?, serverDeleted: Bool = false
    ) -> ConflictCase {
        let changes: Fields = local.map { ["stamp": $0, "title": "mine"] } ?? ["title": "mine"]
        let app: Fields = appStamp.map { ["stamp": $0, "title": "mine"] } ?? ["title": "mine"]
        return ConflictCase(
            intentOffset: 7,
            intent: Intent(.update, idempotencyKey: "k", entityType: "te", entityID: "x", baseVersion: 1, fields: changes),
            writtenAt: HybridTimestamp(rawValue: 1), base: ["title": "first"], baseIsCommonAncestor: true, local: app,
            server: ServerState(
                serverVersion: 2, deleted: serverDeleted,
                data: serverDeleted ? [:] : server.map { ["stamp": $0, "title": "theirs"] } ?? ["title": "theirs"]))
    }

    static let newer = ConflictStrategy.newerWins(field: "stamp")

    @Test(arguments: [
        // Timestamps, integers and doubles order as numbers; ties keep the server's.
        (Value.timestamp(2_000), Value.timestamp(1_000), ConflictDecision.keepLocal),
        (.timestamp(1_000), .timestamp(2_000), .keepRemote),
        (.timestamp(1_000), .timestamp(1_000), .keepRemote),
        (.int(5), .int(-3), .keepLocal),
        (.double(1.5), .double(2.25), .keepRemote),
        (.int(2), .double(1.5), .keepLocal),
        (.double(-0.5), .int(0), .keepRemote),
        // An integer and a double compare exactly: past 2^53 a double
        // cannot hold every integer, and converting made these ties.
        (.int(9_007_199_254_740_993), .double(9_007_199_254_740_992), .keepLocal),
        (.double(9_007_199_254_740_992), .int(9_007_199_254_740_993), .keepRemote),
        (.int(.max), .double(9_223_372_036_854_775_808), .keepRemote),
        (.int(.min), .double(-9_223_372_036_854_775_808), .keepRemote),
        (.int(-3), .double(-3.5), .keepLocal),
        (.double(.infinity), .int(.max), .keepLocal),
        // What has no order is the app's to decide.
        (.double(.nan), .double(1), .askApp),
        (.int(1), .double(.nan), .askApp),
        (.string("b"), .string("a"), .askApp),
        (.timestamp(5), .int(1), .askApp),
        (.null, .int(1), .askApp),
    ])
    func newerWinsOrdersNumbersAndTimestamps(local: Value, server: Value, expected: ConflictDecision) {
        #expect(Self.newer.decide(Self.conflict(local: local, server: server)) == expected)
    }

    /// An update without the field is judged by the app's state; a state
    /// without it anywhere, or a deletion on the server, is for the app.
    @Test func newerWinsFallsBackToTheAppsStateThenToTheApp() {
        #expect(Self.newer.decide(Self.conflict(local: nil, appStamp: .int(9), server: .int(3))) == .keepLocal)
        #expect(Self.newer.decide(Self.conflict(local: nil, appStamp: .int(1), server: .int(3))) == .keepRemote)
        #expect(Self.newer.decide(Self.conflict(local: nil, server: .int(3))) == .askApp)
        #expect(Self.newer.decide(Self.conflict(local: .int(9), server: nil)) == .askApp)
        #expect(Self.newer.decide(Self.conflict(local: .int(9), server: nil, serverDeleted: true)) == .askApp)
    }

    /// A conflict on `te/x` for `fieldMerge`: the intent (`operation` with
    /// `changes`) was made over `base`; the server has `server` (nil:
    /// deleted it).
    static func mergeConflict(
        _ changes: Fields, base: Fields, server: Fields?, commonAncestor: Bool = true, operation: Intent.Operation = .update
    ) -> ConflictCase {
        ConflictCase(
            intentOffset: 7,
            intent: Intent(operation, idempotencyKey: "k", entityType: "te", entityID: "x", baseVersion: 1, fields: changes),
            writtenAt: HybridTimestamp(rawValue: 1), base: base, baseIsCommonAncestor: commonAncestor,
            local: operation == .delete ? nil : base.merging(changes),
            server: ServerState(serverVersion: 2, deleted: server == nil, data: server ?? [:]))
    }

    /// `fieldMerge` field by field: a field only the app changed (`a`)
    /// takes the app's value, one only the server changed (`c`) keeps the
    /// server's, and one both changed (`b`) goes to the preferred side.
    @Test(arguments: [
        (ConflictStrategy.Side.local, ["a": 2, "b": 2, "c": 3] as Fields),
        (.remote, ["a": 2, "b": 3, "c": 3] as Fields),
    ])
    func fieldMergeKeepsWhatOneSideChangedAndGivesTheRestToThePreferredSide(_ prefer: ConflictStrategy.Side, _ merged: Fields) {
        let conflict = Self.mergeConflict(["a": 2, "b": 2], base: ["a": 1, "b": 1, "c": 1], server: ["a": 1, "b": 3, "c": 3])
        #expect(ConflictStrategy.fieldMerge(prefer: prefer).decide(conflict) == .merged(merged))
    }

    /// With the common base unknown (a pull moved the store's base on), a
    /// field both sides set to the same value is no conflict: the merge
    /// keeps it. Only one they set differently is the app's to decide.
    @Test func fieldMergeWithoutTheCommonBaseKeepsAFieldBothSidesSetAlike() {
        let strategy = ConflictStrategy.fieldMerge(prefer: .remote)
        let alike = Self.mergeConflict(["a": 2], base: ["a": 2, "b": 1], server: ["a": 2, "b": 3], commonAncestor: false)
        #expect(strategy.decide(alike) == .merged(["a": 2, "b": 3]))
        let different = Self.mergeConflict(["a": 5], base: ["a": 2, "b": 1], server: ["a": 2, "b": 3], commonAncestor: false)
        #expect(strategy.decide(different) == .askApp)
    }

    /// A delete against a change, or a change against a delete, cannot be
    /// merged field by field: it goes to the preferred side whole.
    @Test(arguments: [ConflictStrategy.Side.local, .remote])
    func fieldMergeGivesADeleteAgainstAChangeToThePreferredSide(_ prefer: ConflictStrategy.Side) {
        let strategy = ConflictStrategy.fieldMerge(prefer: prefer)
        let expected: ConflictDecision = prefer == .local ? .keepLocal : .keepRemote
        let localDelete = Self.mergeConflict([:], base: ["a": 1], server: ["a": 2], operation: .delete)
        let serverDelete = Self.mergeConflict(["a": 2], base: ["a": 1], server: nil)
        #expect(strategy.decide(localDelete) == expected)
        #expect(strategy.decide(serverDelete) == expected)
    }
}
