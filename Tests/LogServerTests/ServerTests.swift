import Foundation
import LMDB
import LogFormat
import LogServer
import LogTesting
import Testing

@Suite struct PushTests {
    @Test func eachOperationIsAnsweredOnItsOwnInOrder() async throws {
        let server = try await TestServer("push-each")
        defer { Task { await server.stop() } }
        // The third operation has a reserved field name, which PushOperation
        // cannot even encode: it goes as raw JSON.
        var operations = try [
            operation(.create, "t1", ["title": "a", "n": 1]), operation(.update, "missing", ["n": 2]),
        ].map { try JSONSerialization.jsonObject(with: JSONEncoder().encode($0)) }
        operations.append([
            "idempotency_key": "weird", "entity_type": "te", "entity_id": "t2", "intent": "create",
            "data": ["$weird": 1], "client_timestamp": "t", "base_version": 0,
        ])
        operations += try [
            operation(.create, "t3", ["ok": true], type: "Bad-Type"), operation(.update, "t1", ["n": 2]), operation(.delete, "t1"),
        ].map { try JSONSerialization.jsonObject(with: JSONEncoder().encode($0)) }
        let body = try JSONSerialization.data(withJSONObject: ["operations": operations])
        let reply = try await server.send("POST", "/v1/push", body: body)
        #expect(reply.status == 200)
        #expect(reply.headers["sync-protocol-version"] == "1")
        let results = try reply.decode(PushResponse.self).results
        #expect(results.map(\.status) == [.applied, .rejected, .rejected, .rejected, .applied, .applied])
        #expect(results.map(\.errorCode) == [nil, .entityNotFound, .validationError, .validationError, nil, nil])
        #expect(results.map(\.serverVersion) == [1, nil, nil, nil, 2, 3])
        let feed = try await server.pullAll()
        #expect(feed.map(\.operation) == [.upsert, .upsert, .delete])
        #expect(feed.last?.data == nil)
    }

    @Test func aRepeatedKeyIsADuplicateAndAppliedOnce() async throws {
        let server = try await TestServer("push-duplicate")
        defer { Task { await server.stop() } }
        let create = operation(.create, "t1", ["n": 1], key: "key-1")
        let first = try await server.push([create]).decode(PushResponse.self).results[0]
        let again = try await server.push([create]).decode(PushResponse.self).results[0]
        #expect(first.status == .applied && again.status == .duplicate)
        #expect(first.serverVersion == again.serverVersion)
        #expect(try await server.pullAll().count == 1)
    }

    /// An entity is named by its type and its ID together (section 1):
    /// `ab`/`c` and `a`/`bc` are two entities, though their names run
    /// together alike.
    @Test func entitiesWhoseTypeAndIDRunTogetherAlikeAreTwo() async throws {
        let server = try await TestServer("push-type-and-id")
        defer { Task { await server.stop() } }
        for (type, id) in [("ab", "c"), ("a", "bc")] {
            let result = try await server.push([operation(.create, id, ["n": 1], type: type)]).decode(PushResponse.self).results[0]
            #expect(result.status == .applied && result.serverVersion == 1, "\(type)/\(id): \(result.status)")
        }
        #expect(try await server.pullAll().map { "\($0.entityType)/\($0.entityID)" } == ["ab/c", "a/bc"])
    }

    @Test func updatesMergeFieldsAndConflictOnlyOnFieldsOthersChanged() async throws {
        let server = try await TestServer("push-conflict")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["a": 1, "b": 1])])
        // The laptop saw version 1 and changes b; the phone changes a meanwhile.
        _ = try await server.push([operation(.update, "t1", ["a": 2], base: 1)])
        let merged = try await server.push([operation(.update, "t1", ["b": 2], base: 1)])
        #expect(try merged.decode(PushResponse.self).results[0].status == .applied)
        // Now the laptop, still at version 1, changes a: the phone changed it after 1.
        let clash = try await server.push([operation(.update, "t1", ["a": 9], base: 1)])
        let result = try clash.decode(PushResponse.self).results[0]
        #expect(result.status == .rejected && result.errorCode == .conflict)
        #expect(result.serverState == ServerState(serverVersion: 3, deleted: false, data: ["a": 2, "b": 2]))
        #expect(result.errorMessage?.contains("a changed") == true)
        // A base version the server never had is a conflict too.
        let ahead = try await server.push([operation(.update, "t1", ["b": 3], base: 9)]).decode(PushResponse.self)
        #expect(ahead.results[0].errorCode == .conflict)
    }

    @Test func laterOperationsOnOneEntityBuildOnEarlierOnesInThePush() async throws {
        let server = try await TestServer("push-chain")
        defer { Task { await server.stop() } }
        // Made offline one after another, all against base 0.
        let results = try await server.push([
            operation(.create, "t3", ["title": "Buy soil", "done": false]),
            operation(.update, "t3", ["done": true]),
            operation(.update, "t3", ["title": "Buy more soil"]),
            operation(.delete, "t3"),
        ]).decode(PushResponse.self).results
        #expect(results.map(\.status) == [.applied, .applied, .applied, .applied])
        #expect(results.map(\.serverVersion) == [1, 2, 3, 4])
        // Across pushes the client raises the base itself; a stale one conflicts.
        _ = try await server.push([operation(.create, "t4", ["n": 1])])
        _ = try await server.push([operation(.update, "t4", ["n": 2], base: 1)])
        let stale = try await server.push([operation(.update, "t4", ["n": 3], base: 1)]).decode(PushResponse.self)
        #expect(stale.results[0].errorCode == .conflict)
    }

    @Test func operationsThatBreakTheRulesAreRejectedOnTheirOwn() async throws {
        let server = try await TestServer("push-rules")
        defer { Task { await server.stop() } }
        var bad = operation(.create, "t1", ["n": 1])
        bad.clientTimestamp = "yesterday"
        var deleteWithData = operation(.delete, "t2")
        deleteWithData.data = ["n": 1]
        let results = try await server.push([bad, deleteWithData, operation(.create, "t4", [:])]).decode(PushResponse.self).results
        #expect(results.map(\.errorCode) == [.validationError, .validationError, nil])
        // Each push fits the body limit; together they would make the entity
        // too large for one entry of a client's log.
        let half = [UInt8](repeating: 7, count: Wire.entityFieldsBytesMax / 2 + 1)
        let first = try await server.push([operation(.update, "t4", ["a": .bytes(half)], base: 1)]).decode(PushResponse.self)
        #expect(first.results[0].status == .applied)
        let second = try await server.push([operation(.update, "t4", ["b": .bytes(half)], base: 2)]).decode(PushResponse.self)
        #expect(second.results[0].errorCode == .validationError)
        #expect(try await server.pullAll().count == 2)
    }

    /// A server whose store is unavailable (closed here; failed after an
    /// unsuccessful commit alike) says so: health is not `ok` but 503 with
    /// `Retry-After` (section 6), and push and pull are 503 too, retryable,
    /// rather than a 500 that reads as a bug.
    @Test func aServerWhoseStoreIsUnavailableAnswers503() async throws {
        let server = try await TestServer("storage-unavailable")
        defer { Task { await server.stop() } }
        #expect(try await server.push([operation(.create, "t1", ["n": 1])]).status == 200)
        #expect(try await server.send("GET", "/v1/health", token: nil).status == 200)
        server.server.close()
        let health = try await server.send("GET", "/v1/health", token: nil)
        let push = try await server.push([operation(.create, "t2", ["n": 2])])
        let pull = try await server.pull()
        for (name, reply) in [("health", health), ("push", push), ("pull", pull)] {
            #expect(reply.status == 503, "\(name): \(String(decoding: reply.body, as: UTF8.self))")
            #expect(reply.error?.error.code == .serviceUnavailable && reply.error?.error.retryable == true, "\(name)")
            #expect(reply.headers["retry-after"] == "30", "\(name)")
        }
    }

    /// A number outside binary64 and nesting deeper than the reader builds
    /// are valid JSON (RFC 8259): they break a rule of section 4, so the
    /// operation holding them is rejected and the others are evaluated.
    @Test func anUnreadableNumberOrDeepNestingRejectsOnlyItsOperation() async throws {
        let server = try await TestServer("push-unreadable-values")
        defer { Task { await server.stop() } }
        func op(_ id: String, _ data: String, base: String = "0") -> String {
            #"{"idempotency_key": "\#(id)", "entity_type": "te", "entity_id": "\#(id)", "intent": "create", "data": \#(data), "client_timestamp": "2026-11-22T08:00:00Z", "base_version": \#(base)}"#
        }
        let deep = String(repeating: "[", count: 100) + String(repeating: "]", count: 100)
        let operations = [
            op("huge", #"{"n": 1e400}"#), op("negative-huge", #"{"n": -1e400}"#), op("huge-double", #"{"n": {"$double": 1e400}}"#),
            op("huge-base", "{}", base: "1e400"), op("deep", #"{"d": \#(deep)}"#), op("kept", #"{"n": 1}"#),
        ]
        let reply = try await server.send("POST", "/v1/push", body: Data(#"{"operations": [\#(operations.joined(separator: ","))]}"#.utf8))
        #expect(reply.status == 200)
        let results = try reply.decode(PushResponse.self).results
        #expect(results.map(\.idempotencyKey) == ["huge", "negative-huge", "huge-double", "huge-base", "deep", "kept"])
        #expect(results.map(\.errorCode) == [.validationError, .validationError, .validationError, .validationError, .validationError, nil])
        // Invalid JSON inside the deep part is still invalid JSON.
        let broken = String(repeating: "[", count: 100) + "1,]" + String(repeating: "]", count: 99)
        #expect(try await server.send("POST", "/v1/push", body: Data(#"{"operations": [\#(op("x", #"{"d": \#(broken)}"#))]}"#.utf8)).status == 400)
    }

    /// `client_timestamp` must be an RFC 3339 date-time, whose day exists
    /// in its month (RFC 3339 section 5.7): the 30th of February is not a date.
    @Test func aClientTimestampOnADayThatDoesNotExistIsRejected() async throws {
        let server = try await TestServer("push-timestamps")
        defer { Task { await server.stop() } }
        let stamps = [
            ("2026-02-30T08:00:00Z", false), ("2026-04-31T08:00:00Z", false), ("2025-02-29T08:00:00Z", false),
            ("1900-02-29T08:00:00Z", false), ("2026-06-31T08:00:00.5+02:00", false),
            ("2024-02-29T08:00:00Z", true), ("2000-02-29T08:00:00Z", true), ("2026-01-31t08:00:00z", true),
            ("2026-12-31T23:59:59.123456789-05:30", true),
        ]
        let operations = stamps.enumerated().map { index, stamp in
            var create = operation(.create, "t\(index)", ["n": 1])
            create.clientTimestamp = stamp.0
            return create
        }
        let results = try await server.push(operations).decode(PushResponse.self).results
        for (result, stamp) in zip(results, stamps) {
            #expect((result.status == .applied) == stamp.1, "\(stamp.0): \(result.status) \(result.errorMessage ?? "")")
            if !stamp.1 { #expect(result.errorCode == .validationError, "\(stamp.0)") }
        }
    }

    @Test func createsAndDeletesFollowTheEntitysLife() async throws {
        let server = try await TestServer("push-life")
        defer { Task { await server.stop() } }
        let created = try await server.push([operation(.create, "t1", ["n": 1])]).decode(PushResponse.self).results
        #expect(created.map(\.serverVersion) == [1])
        let results = try await server.push([
            operation(.create, "t1", ["n": 2]),
            operation(.delete, "t1", base: 1),
            operation(.delete, "t1", base: 2),
            operation(.create, "t1", ["n": 3]),
        ]).decode(PushResponse.self).results
        #expect(results.map(\.status) == [.rejected, .applied, .rejected, .applied])
        #expect(results[0].errorCode == .conflict && results[0].serverState?.data == ["n": 1])
        #expect(results[2].errorCode == .entityNotFound)
        #expect(results[3].serverVersion == 3)
    }

    /// A create made against the version of an entity that exists replaces
    /// it, and an operation's base is raised by the client's own earlier
    /// operations in the request (section 7, step 4): a second create of
    /// an entity in one request is made on top of the first, and replaces
    /// it. One made against an older version conflicts.
    @Test func aCreateMadeAgainstTheEntitysVersionReplacesIt() async throws {
        let server = try await TestServer("push-replace")
        defer { Task { await server.stop() } }
        let results = try await server.push([
            operation(.create, "t1", ["n": 1, "note": "first"]),
            operation(.create, "t1", ["n": 2]),
        ]).decode(PushResponse.self).results
        #expect(results.map(\.serverVersion) == [1, 2])
        let stale = try await server.push([operation(.create, "t1", ["n": 3], base: 1)]).decode(PushResponse.self).results
        #expect(stale.first?.errorCode == .conflict)
        #expect(stale.first?.serverState == ServerState(serverVersion: 2, deleted: false, data: ["n": 2]))
    }

    @Test func aDeleteOfSomethingAnotherReplicaChangedConflicts() async throws {
        let server = try await TestServer("push-delete-conflict")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        _ = try await server.push([operation(.update, "t1", ["n": 2], base: 1)])
        let result = try await server.push([operation(.delete, "t1", base: 1)])
            .decode(PushResponse.self).results[0]
        #expect(result.errorCode == .conflict && result.serverState?.serverVersion == 2)
    }

    /// A create that replaces an entity starts a new life of it (section
    /// 7, "Versions"): its version is the created version, and the last
    /// changed version of every field it sets. An update made against the
    /// version before the replace conflicts on any field, one the replace
    /// set again as much as one it removed: its author never saw the
    /// replaced state, and applied it would be merged into a state it was
    /// not made for.
    @Test func anUpdateMadeBeforeAReplaceConflictsOnEveryField() async throws {
        let server = try await TestServer("push-replace-versions")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["a": 1, "b": 1])])
        _ = try await server.push([operation(.update, "t1", ["a": 2], base: 1)])
        let replaced = try await server.push([operation(.create, "t1", ["a": 3], base: 2)]).decode(PushResponse.self).results
        #expect(replaced.map(\.serverVersion) == [3])
        // Each in its own push: an applied one would raise the other's base.
        for field in ["a", "b"] {
            let stale = try await server.push([operation(.update, "t1", [field: 4], base: 2)]).decode(PushResponse.self).results
            #expect(stale.map(\.errorCode) == [.conflict], "\(field)")
            #expect(stale.first?.serverState == ServerState(serverVersion: 3, deleted: false, data: ["a": 3]), "\(field)")
        }
    }

    /// A create over a tombstone is applied from any base up to the
    /// tombstone's version (section 7): whoever made it never saw the
    /// entity, or saw a life the delete ended, and it replaces nothing
    /// that lives. Only a create over a live entity must be made against
    /// its version.
    @Test func aCreateOverATombstoneIsAppliedFromAnOlderBase() async throws {
        let server = try await TestServer("push-create-over-tombstone")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["n": 1]), operation(.delete, "t1", base: 1)])
        let never = try await server.push([operation(.create, "t1", ["n": 2], base: 0)]).decode(PushResponse.self).results
        #expect(never.map(\.serverVersion) == [3])
        _ = try await server.push([operation(.delete, "t1", base: 3)])
        let older = try await server.push([operation(.create, "t1", ["n": 3], base: 2)]).decode(PushResponse.self).results
        #expect(older.map(\.serverVersion) == [5])
        #expect(try await server.pullAll().last?.data == ["n": 3])
    }

    /// A delete made against a version the server does not have (the
    /// server lost data, or the client mixed up servers) conflicts, as any
    /// delete whose base is not the entity's version does (section 7): it
    /// was not made against the state it would delete.
    @Test func aDeleteMadeAgainstAVersionAheadOfTheServersConflicts() async throws {
        let server = try await TestServer("push-delete-ahead")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        let ahead = try await server.push([operation(.delete, "t1", base: 5)]).decode(PushResponse.self).results
        #expect(ahead.map(\.errorCode) == [.conflict])
        #expect(ahead.first?.serverState == ServerState(serverVersion: 1, deleted: false, data: ["n": 1]))
        #expect(try await server.pullAll().map(\.operation) == [.upsert])
    }

    @Test func aReadOnlyUserIsDeniedEveryOperation() async throws {
        let server = try await TestServer("push-denied")
        defer { Task { await server.stop() } }
        let results = try await server.push([operation(.create, "t1", ["n": 1]), operation(.create, "Bad", [:])], token: "reader-token")
            .decode(PushResponse.self).results
        #expect(results.map(\.errorCode) == [.permissionDenied, .permissionDenied])
        #expect(try await server.pull(token: "reader-token").status == 200)
    }

    /// Step 1 of section 7 refuses every operation of a read-only user, so
    /// such a push writes nothing. It used to open a durable write
    /// transaction all the same, to give the user a number, and commit it.
    @Test func aReadOnlyUsersPushCommitsNothing() async throws {
        let server = try await TestServer("push-denied-writes-nothing", durability: .full)
        defer { Task { await server.stop() } }
        /// The commits the stopped server's store has had.
        func commits() throws -> Int {
            var options = Environment.Options()
            options.readOnly = true
            let environment = try Environment(path: server.configuration.dataDirectory, options: options)
            defer { environment.close() }
            return environment.info().lastTransactionID
        }
        await server.stop()
        let before = try commits()
        try await server.restart()
        let results = try await server.push([operation(.create, "t1", ["n": 1]), operation(.update, "t2", ["n": 2])], token: "reader-token")
            .decode(PushResponse.self).results
        #expect(results.map(\.errorCode) == [.permissionDenied, .permissionDenied])
        await server.stop()
        let after = try commits()
        #expect(after == before)
    }

    /// An idempotency key far over its 256 bytes comes back whole in the
    /// result's `idempotency_key`; the message quotes its first 64 bytes
    /// (whole scalars) and "…", where it used to repeat all of it, doubling
    /// the answer. A key of 64 bytes is quoted whole, with no "…".
    @Test func aMessageQuotesTheStartOfAnOverlongKey() async throws {
        let server = try await TestServer("push-overlong-key")
        defer { Task { await server.stop() } }
        let long = String(repeating: "k", count: 100_000)
        let accented = String(repeating: "\u{E9}", count: 50_000)  // 2 bytes each
        let whole = String(repeating: "w", count: 64)
        let first = String(decoding: try JSONEncoder().encode(operation(.create, "t1", ["n": 1], key: long)), as: UTF8.self)
        let body = #"""
            {"operations": [\#(first), {"idempotency_key": "\#(accented)", "intent": "explode"}, {"idempotency_key": "\#(whole)", "intent": "explode"}]}
            """#
        let reply = try await server.send("POST", "/v1/push", body: Data(body.utf8))
        let results = try reply.decode(PushResponse.self).results
        #expect(results.map(\.idempotencyKey) == [long, accented, whole])
        #expect(results.map(\.errorCode) == [.validationError, .validationError, .validationError])
        for (result, quoted) in zip(results, [String(repeating: "k", count: 64) + "…", String(repeating: "\u{E9}", count: 32) + "…", whole + ":"]) {
            let message = try #require(result.errorMessage)
            #expect(message.contains(quoted), "\(message.prefix(200))")
            #expect(message.utf8.count < 400, "\(message.utf8.count) bytes: \(message.prefix(200))")
        }
        #expect(reply.body.count < long.utf8.count + accented.utf8.count + 2_000)
    }

    /// Section 7: a delete carries no fields. Its `data` may be absent or
    /// an empty object, which is applied as a delete; `data` holding fields
    /// is refused, and `null` is refused for every intent.
    @Test func aDeletesDataIsAbsentOrEmptyAndNullIsRefused() async throws {
        let server = try await TestServer("push-delete-empty-data")
        defer { Task { await server.stop() } }
        let created = try await server.push([operation(.create, "t1", ["n": 1])]).decode(PushResponse.self)
        #expect(created.results.map(\.status) == [.applied])
        var empty = operation(.delete, "t1", base: 1)
        empty.data = [:]
        var full = operation(.delete, "t1", base: 1)
        full.data = ["n": 1]
        let deleted = try await server.push([full, empty]).decode(PushResponse.self)
        #expect(deleted.results.map(\.status) == [.rejected, .applied], "\(deleted.results)")
        #expect(deleted.results.first?.errorCode == .validationError)
        #expect(try await server.pullAll().last?.operation == .delete)

        func nullData(_ key: String, _ intent: String, base: Int) -> String {
            #"{"idempotency_key": "\#(key)", "entity_type": "te", "entity_id": "t1", "intent": "\#(intent)", "data": null, "#
                + #""client_timestamp": "2026-11-22T08:00:00.000000Z", "base_version": \#(base)}"#
        }
        let nulls = #"{"operations": [\#(nullData("n1", "create", base: 2)), \#(nullData("n2", "delete", base: 2))]}"#
        let refused = try await server.send("POST", "/v1/push", body: Data(nulls.utf8)).decode(PushResponse.self)
        #expect(refused.results.map(\.errorCode) == [.validationError, .validationError], "\(refused.results)")
        #expect(refused.results.allSatisfy { $0.errorMessage?.contains("data is null") == true }, "\(refused.results)")
    }

    @Test func valuesRoundTripExactly() async throws {
        let server = try await TestServer("push-values")
        defer { Task { await server.stop() } }
        let fields: Fields = [
            "int": .int(Int64.max), "negative": -7, "double": 1.5, "integral": .double(2), "zero": .double(-0.0),
            "string": "é漢😀\"\\", "bool": false, "null": nil, "bytes": .bytes([0, 1, 2, 255]),
            "at": .timestamp(1_795_335_611_301_476), "list": [1, "two", [3.25]], "nested": ["deeper": ["k": .bytes([])]],
        ]
        _ = try await server.push([operation(.create, "t1", fields)])
        let change = try #require(try await server.pullAll().first)
        #expect(change.data == fields)
    }

    /// Each conflict carries the entity's state, up to entityFieldsBytesMax
    /// of fields: a dozen conflicting creates, a kilobyte of request, made
    /// the server build a 36 MiB answer (500 of them, gigabytes), over what
    /// a client reads. Past entityFieldsBytesMax of states the push is undone
    /// and answered 413, which a client pushes again in smaller requests;
    /// one operation's answer always fits.
    @Test func conflictsOnLargeEntitiesNeverMakeAnAnswerFarLargerThanTheRequest() async throws {
        let server = try await TestServer("push-large-conflicts")
        defer { Task { await server.stop() } }
        let large = String(repeating: "x", count: 3_000_000)
        #expect(try await server.push([operation(.create, "big", ["body": .string(large)])]).status == 200)
        let conflicts = [operation(.create, "t1", ["n": 1])] + (0..<12).map { _ in operation(.create, "big", ["n": 1]) }
        let reply = try await server.push(conflicts)
        #expect(reply.body.count <= Wire.requestBodyBytesMax, "an answer of \(reply.body.count) bytes")
        #expect(reply.status == 413 && reply.error?.error.code == .payloadTooLarge)
        #expect(try await server.pullAll().map(\.entityID) == ["big"], "the push was undone")
        // Two fit when their states do; one always does.
        let two = try await server.push(Array(conflicts.prefix(2))).decode(PushResponse.self).results
        #expect(two.map(\.status) == [.applied, .rejected] && two[1].serverState?.data == ["body": .string(large)])
        let one = try await server.push([conflicts[2]]).decode(PushResponse.self).results
        #expect(one.map(\.errorCode) == [.conflict] && one[0].serverState != nil)
    }

    /// A client retries an applied or duplicate answer whose server_version
    /// is not above the base_version it pushed (section 10): every path
    /// answers a version above the base, or a conflict. A create over a
    /// tombstone at 2 with base 5 (a client that knows versions this server
    /// lost) was applied at 3, and its repeats answered 3 for ever.
    @Test func everyAppliedVersionIsAboveTheBasePushed() async throws {
        let server = try await TestServer("push-above-base")
        defer { Task { await server.stop() } }
        var pushed: [(PushOperation, PushResult)] = []
        func push(_ operations: [PushOperation], token: String = "alice-token") async throws {
            let results = try await server.push(operations, token: token).decode(PushResponse.self).results
            pushed += zip(operations, results)
        }
        let update = operation(.update, "t1", ["n": 2], base: 1)
        try await push([operation(.create, "t1", ["n": 1]), update])
        try await push([operation(.update, "t1", ["m": 3], base: 2)])
        try await push([update])  // duplicate, after a later change
        try await push([operation(.delete, "t1", base: 3)])
        try await push([operation(.create, "t1", ["n": 4], base: 4)])  // over the tombstone at 4
        try await push([operation(.delete, "t1", base: 5)])
        let ahead = operation(.create, "t1", ["n": 5], base: 9)  // over the tombstone at 6
        try await push([ahead, ahead])
        let fresh = operation(.create, "t2", ["n": 1], base: 3)  // never existed
        try await push([fresh, fresh])
        for (operation, result) in pushed where result.status != .rejected {
            #expect(
                try #require(result.serverVersion) > operation.baseVersion,
                "\(operation.intent) \(operation.entityID) base \(operation.baseVersion): \(result.status) \(result.serverVersion ?? 0)")
        }
        #expect(pushed.suffix(4).map(\.1.errorCode) == [.conflict, .conflict, .conflict, .conflict])
    }
}

@Suite struct PullTests {
    /// Each change names the idempotency key of the operation that made it
    /// (section 8), so a client can tell its acknowledged change from
    /// another made at its version. A change stored by a server before it
    /// kept them (here: its row cut back to the entry) names none.
    @Test func aChangeNamesTheOperationThatMadeIt() async throws {
        let server = try await TestServer("pull-keys")
        defer { Task { await server.stop() } }
        #expect(try await server.push([operation(.create, "a", key: "k1"), operation(.update, "a", key: "k2", base: 1)]).status == 200)
        #expect(try await server.push([operation(.create, "a", key: "k1")]).status == 200)  // a repeat adds no change
        #expect(try await server.pullAll().map(\.idempotencyKey) == ["k1", "k2"])
        try await DamagedServerStorageTests.rewriteFirstChange(of: server) { row in
            let entry = try #require(row.withUnsafeBytes { EntryCodec.count(ofEntryAt: $0) })
            #expect(entry == row.count - 2, "the row ends with the key k1")
            return Array(row.prefix(entry))
        }
        #expect(try await server.pullAll().map(\.idempotencyKey) == [nil, "k2"])
        let body = try #require(String(data: try await server.pull().body, encoding: .utf8))
        #expect(body.components(separatedBy: "idempotency_key").count == 2, "\(body)")
    }

    @Test func tenThousandChangesPageWithoutLossOrDuplicate() async throws {
        let server = try await TestServer("pull-10k")
        defer { Task { await server.stop() } }
        for batch in 0..<20 {
            let operations = (0..<500).map { n in operation(.create, "t\(batch * 500 + n)", ["n": .int(Int64(batch * 500 + n))]) }
            #expect(try await server.push(operations).status == 200)
        }
        for limit in [1000, 333] {
            let changes = try await server.pullAll(limit: limit)
            #expect(changes.count == 10_000)
            #expect(Set(changes.map(\.entityID)).count == 10_000)
            #expect(changes.map { $0.data?["n"] } == (0..<10_000).map { Value.int(Int64($0)) })
        }
    }

    /// Section 8: a page may hold fewer than `limit` changes, to stay near
    /// `requestBodyBytesMax`, but at least one. Ten entities of 1.5 MB each
    /// came back in one page of 15 MB (1,000 such changes would have been
    /// 1.5 GB, built in memory); now in pages of at most two, one of them
    /// alone when it is over the limit by itself.
    @Test func aPageOfLargeEntitiesStopsNearTheBodyLimit() async throws {
        let server = try await TestServer("pull-large")
        defer { Task { await server.stop() } }
        let large = String(repeating: "x", count: 1_500_000)
        for n in 0..<10 { #expect(try await server.push([operation(.create, "t\(n)", ["body": .string(large)])]).status == 200) }
        var cursor: String?
        var pages: [Int] = []
        var ids: [String] = []
        while pages.count < 20 {
            let reply = try await server.pull(cursor: cursor, limit: 1000)
            #expect(reply.body.count <= 2 * Wire.requestBodyBytesMax, "a page of \(reply.body.count) bytes")
            let page = try reply.decode(PullResponse.self)
            pages.append(page.changes.count)
            ids += page.changes.map(\.entityID)
            cursor = page.cursor
            if !page.hasMore { break }
        }
        #expect(ids == (0..<10).map { "t\($0)" })
        #expect(pages.allSatisfy { (1...2).contains($0) }, "\(pages)")
        // The largest change a push can make, fields near
        // `entityFieldsBytesMax`, is served, on a page of its own. No change
        // is over the limit alone (fields, names and key stay under it), so
        // the page's rule that it holds at least one change is a backstop
        // that no store this server wrote can reach.
        let huge = String(repeating: "y", count: Wire.entityFieldsBytesMax - 2_000)
        #expect(try await server.push([operation(.update, "t0", ["body": .string(huge)], base: 1)]).status == 200)
        let last = try await server.pull(cursor: cursor, limit: 1000).decode(PullResponse.self)
        #expect(last.changes.map(\.entityID) == ["t0"] && !last.hasMore)
    }

    @Test func cursorsResumeAndEmptyPagesKeepTheirPlace() async throws {
        let server = try await TestServer("pull-cursor")
        defer { Task { await server.stop() } }
        _ = try await server.push((0..<5).map { operation(.create, "t\($0)", ["n": .int(Int64($0))]) })
        let first = try await server.pull(limit: 2).decode(PullResponse.self)
        #expect(first.changes.count == 2 && first.hasMore && !first.forceResync)
        let rest = try await server.pull(cursor: first.cursor, limit: 10).decode(PullResponse.self)
        #expect(rest.changes.map(\.entityID) == ["t2", "t3", "t4"] && !rest.hasMore)
        let idle = try await server.pull(cursor: rest.cursor).decode(PullResponse.self)
        #expect(idle.changes.isEmpty && idle.cursor == rest.cursor && !idle.hasMore)
        _ = try await server.push([operation(.update, "t0", ["n": 10], base: 1)])
        let next = try await server.pull(cursor: idle.cursor).decode(PullResponse.self)
        #expect(next.changes.map(\.serverVersion) == [2])
    }

    @Test func usersSeeOnlyTheirOwnData() async throws {
        let server = try await TestServer("pull-isolation")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "shared-id", ["owner": "alice"])])
        #expect(try await server.pullAll(token: "bob-token").isEmpty)
        let bob = try await server.push([operation(.update, "shared-id", ["owner": "bob"])], token: "bob-token")
        #expect(try bob.decode(PushResponse.self).results[0].errorCode == .entityNotFound)
        _ = try await server.push([operation(.create, "shared-id", ["owner": "bob"])], token: "bob-token")
        #expect(try await server.pullAll().map { $0.data?["owner"] } == ["alice"])
        #expect(try await server.pullAll(token: "bob-token").map { $0.data?["owner"] } == ["bob"])
        // A cursor is no key to another user's data: bob's pull with alice's
        // cursor reads only bob's feed, or (its mark names alice's change,
        // not bob's at that place) is refused.
        let aliceCursor = try await server.pull().decode(PullResponse.self).cursor
        let mixed = try await server.pull(cursor: aliceCursor, token: "bob-token")
        #expect([200, 410].contains(mixed.status))
        if mixed.status == 200 { #expect(try mixed.decode(PullResponse.self).changes.allSatisfy { $0.data?["owner"] == "bob" }) }
    }

    /// Alice's cursors are the same whether bob writes between her changes
    /// or not: each user's feed counts its own changes, so a cursor is no
    /// window on how much, or when, other users write.
    @Test func aCursorTellsNothingOfOtherUsersWrites() async throws {
        func aliceCursors(_ name: String, bobWrites: Int) async throws -> [[UInt8]] {
            let server = try await TestServer(name)
            defer { Task { await server.stop() } }
            _ = try await server.push([operation(.create, "t1", ["n": 1])])
            let first = try await server.pull().decode(PullResponse.self)
            if bobWrites > 0 {
                _ = try await server.push((0..<bobWrites).map { operation(.create, "b\($0)", ["n": 1]) }, token: "bob-token")
            }
            _ = try await server.push([operation(.create, "t2", ["n": 2])])
            let second = try await server.pull(cursor: first.cursor).decode(PullResponse.self)
            #expect(second.changes.map(\.entityID) == ["t2"])
            return try [first.cursor, second.cursor].map(afterServerID)
        }
        let alone = try await aliceCursors("pull-cursor-alone", bobWrites: 0)
        let beside = try await aliceCursors("pull-cursor-beside", bobWrites: 3)
        #expect(alone == beside)
    }

    /// Section 8: `cursor` or `limit` given more than once is 400
    /// `VALIDATION_ERROR`, whether the values agree or not, rather than
    /// one of them taken at the server's choice.
    @Test func aParameterGivenTwiceIsAValidationError() async throws {
        let server = try await TestServer("pull-repeated-parameter")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        let cursor = try await server.pull().decode(PullResponse.self).cursor
        #expect(try await server.send("GET", "/v1/pull?cursor=\(cursor)&limit=5").status == 200)
        for query in ["limit=5&limit=5", "limit=5&limit=7", "cursor=\(cursor)&cursor=\(cursor)", "limit=5&cursor=\(cursor)&limit=5"] {
            let reply = try await server.send("GET", "/v1/pull?\(query)")
            #expect(reply.status == 400 && reply.error?.error.code == .validationError, "\(query): \(reply.status)")
        }
    }

    /// Section 8: without `limit`, a page holds at most
    /// `pullPageCountDefault` (100) changes, and says more follow.
    @Test func aPullWithoutALimitTakesTheDefault() async throws {
        let server = try await TestServer("pull-default-limit")
        defer { Task { await server.stop() } }
        let count = Wire.pullPageCountDefault + 1
        #expect(try await server.push((0..<count).map { operation(.create, "t\($0)", ["n": .int(Int64($0))]) }).status == 200)
        let page = try await server.pull().decode(PullResponse.self)
        #expect(page.changes.count == Wire.pullPageCountDefault && page.hasMore)
        let rest = try await server.pull(cursor: page.cursor).decode(PullResponse.self)
        #expect(rest.changes.map(\.entityID) == ["t\(count - 1)"] && !rest.hasMore)
    }

    /// A user's first change is at offset 1 of their own feed, however
    /// many changes users numbered before them made: each feed counts its
    /// own changes (`aCursorTellsNothingOfOtherUsersWrites` writes after).
    @Test func aUsersFeedStartsAtOneWhateverOthersWroteBefore() async throws {
        let server = try await TestServer("pull-own-offsets")
        defer { Task { await server.stop() } }
        _ = try await server.push((0..<3).map { operation(.create, "t\($0)", ["n": 1]) })
        _ = try await server.push([operation(.create, "b1", ["n": 1])], token: "bob-token")
        let bob = try await server.pull(token: "bob-token").decode(PullResponse.self)
        #expect(bob.changes.map(\.entityID) == ["b1"])
        #expect(try afterServerID(bob.cursor).suffix(8) == UInt64(1).bigEndianBytes)
    }

    /// A client refuses a page whose cursor is not 1 to cursorBytesMax
    /// bytes from ! to ~ (but for force_resync): every cursor issued is one.
    @Test func everyCursorIssuedIsOneAClientAccepts() async throws {
        let server = try await TestServer("pull-cursor-rule")
        defer { Task { await server.stop() } }
        var pages: [PullResponse] = []
        func pull(_ cursor: String? = nil, limit: Int? = nil, token: String = "alice-token") async throws -> PullResponse {
            let page = try await server.pull(cursor: cursor, limit: limit, token: token).decode(PullResponse.self)
            pages.append(page)
            return page
        }
        let empty = try await pull(token: "bob-token")  // a user with no feed
        _ = try await pull(empty.cursor, token: "bob-token")
        _ = try await server.push((0..<3).map { operation(.create, "t\($0)", ["n": 1]) })
        let first = try await pull(limit: 2)
        let last = try await pull(first.cursor)
        _ = try await pull(last.cursor)
        #expect(try await server.send("POST", "/v1/admin/resync", token: "admin-token").status == 200)
        let forced = try await pull(last.cursor)
        #expect(forced.forceResync)
        let again = try await pull()
        _ = try await pull(again.cursor)
        _ = try await pull(empty.cursor, token: "bob-token")
        _ = try await pull(token: "bob-token")
        for page in pages where !page.forceResync {
            #expect(
                (1...Wire.cursorBytesMax).contains(page.cursor.utf8.count)
                    && page.cursor.utf8.allSatisfy { (UInt8(ascii: "!")...UInt8(ascii: "~")).contains($0) }, "\(page.cursor)")
        }
    }

    @Test func anOperatorResyncForcesClientsToStartOver() async throws {
        let server = try await TestServer("pull-resync")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        let cursor = try await server.pull().decode(PullResponse.self).cursor
        #expect(try await server.send("POST", "/v1/admin/resync", token: "alice-token").status == 401)
        #expect(try await server.send("POST", "/v1/admin/resync", token: "admin-token").status == 200)
        let forced = try await server.pull(cursor: cursor).decode(PullResponse.self)
        #expect(forced.forceResync && forced.changes.isEmpty)
        let fresh = try await server.pull().decode(PullResponse.self)
        #expect(!fresh.forceResync && fresh.changes.count == 1)
    }

    @Test func aRestartKeepsDataAndCursors() async throws {
        let server = try await TestServer("pull-restart", durability: .full)
        defer { Task { await server.stop() } }
        _ = try await server.push((0..<3).map { operation(.create, "t\($0)", ["n": .int(Int64($0))]) })
        let page = try await server.pull(limit: 2).decode(PullResponse.self)
        let serverID = server.server.serverID
        try await server.restart()
        #expect(server.server.serverID == serverID)
        let rest = try await server.pull(cursor: page.cursor).decode(PullResponse.self)
        #expect(rest.changes.map(\.entityID) == ["t2"])
        let duplicate = try await server.push([operation(.create, "t0", ["n": 0])]).decode(PushResponse.self)
        #expect(duplicate.results[0].errorCode == .conflict)
    }

    /// A server that cannot listen (an address this host does not have)
    /// fails to start with the reason, rather than waiting for a port forever.
    @Test func aServerThatCannotListenFailsToStart() async throws {
        let server = try await TestServer("unlistenable")
        defer { Task { await server.stop() } }
        // TEST-NET-3 (RFC 5737): never an address of this host.
        server.configuration.host = "203.0.113.1"
        await #expect { try await server.restart() } throws: { "\($0)".contains("bind") }
    }
}

@Suite struct PullCursorBoundaryTests {
    /// An operator restores the server's store from a backup holding t1,
    /// after t2 and t3 were pushed: a server on the backup, the server ID
    /// of the first one, and alice's cursor from after t3 (which the backup
    /// never had). `backup` holds the restored server's data.
    struct Restored {
        let server: TestServer
        let backup: TemporaryDirectory
        let originalServerID: String
        let staleCursor: String
    }

    static func restoredFromBackup(_ name: String) async throws -> Restored {
        let server = try await TestServer(name, durability: .full)
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        await server.stop()
        let backup = try TemporaryDirectory("\(name)-backup")
        try FileManager.default.copyItem(atPath: server.configuration.dataDirectory, toPath: backup.appending("data"))
        try await server.restart()
        _ = try await server.push([operation(.create, "t2", ["n": 2]), operation(.create, "t3", ["n": 3])])
        let cursor = try await server.pull().decode(PullResponse.self).cursor
        await server.stop()
        let restored = try await TestServer("\(name)-2", durability: .full, dataDirectory: backup.appending("data"))
        return Restored(server: restored, backup: backup, originalServerID: server.server.serverID, staleCursor: cursor)
    }

    /// A store from before each user's feed counted its own changes: one
    /// sequence for all users left gaps in each user's offsets (here alice's
    /// second change at 5, where bob's took 2 to 4). Her feed reads as it
    /// did, her cursors stay good, and her next change goes on after her
    /// last offset.
    @Test func aFeedWithOffsetsSharedByAllUsersGoesOn() async throws {
        let server = try await TestServer("pull-shared-offsets", durability: .full)
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["n": 1]), operation(.create, "t2", ["n": 2])])
        let early = try await server.pull(limit: 1).decode(PullResponse.self)
        #expect(early.changes.map(\.entityID) == ["t1"])
        await server.stop()
        // Alice, the first user to write, is user number 1.
        try Self.moveChange(of: 1, from: 2, to: 5, in: server.configuration.dataDirectory)
        try await server.restart()
        let all = try await server.pull().decode(PullResponse.self)
        #expect(all.changes.map(\.entityID) == ["t1", "t2"])
        #expect(try afterServerID(all.cursor).suffix(8) == [0, 0, 0, 0, 0, 0, 0, 5])
        _ = try await server.push([operation(.create, "t3", ["n": 3])])
        let next = try await server.pull(cursor: all.cursor).decode(PullResponse.self)
        #expect(next.changes.map(\.entityID) == ["t3"])
        #expect(try afterServerID(next.cursor).suffix(8) == [0, 0, 0, 0, 0, 0, 0, 6])
        let fromEarly = try await server.pull(cursor: early.cursor).decode(PullResponse.self)
        #expect(fromEarly.changes.map(\.entityID) == ["t2", "t3"])
    }

    /// Rewrites the change at offset `from` of user number `user` to offset
    /// `to` in the stopped server's store (`ServerStorage`: `changes` keyed
    /// by the user's number and the offset, each value an entry carrying
    /// its offset, then its operation's idempotency key).
    static func moveChange(of user: UInt32, from: UInt64, to: UInt64, in directory: String) throws {
        let environment = try Environment(path: directory)
        defer { environment.close() }
        let changes = try #require(try environment.openDatabase("changes", create: false))
        try environment.write { txn in
            let old = user.bigEndianBytes + from.bigEndianBytes
            let value = try #require(try txn.get(changes, key: old))
            let count = try #require(value.withUnsafeBytes { EntryCodec.count(ofEntryAt: $0) })
            var entry = try EntryCodec.decode(Array(value.prefix(count)), expectedOffset: from)
            entry.offset = to
            #expect(try txn.delete(changes, key: old))
            try txn.put(
                changes, key: user.bigEndianBytes + to.bigEndianBytes, value: try EntryCodec.encode(entry) + value.dropFirst(count))
        }
    }

    /// The cursor points past the end of the restored feed, which the
    /// server can tell it never issued (`sync-protocol.md` section 8,
    /// "Cursors"): 410, so the client resyncs, rather than an empty page
    /// that keeps the cursor and makes the client skip the changes the
    /// restored feed gets next.
    @Test func aCursorPastTheEndOfARestoredStoreIsInvalid() async throws {
        let restored = try await Self.restoredFromBackup("pull-restored")
        defer { Task { await restored.server.stop() } }
        #expect(restored.server.server.serverID == restored.originalServerID)
        let reply = try await restored.server.pull(cursor: restored.staleCursor)
        #expect(reply.status == 410 && reply.error?.error.code == .cursorInvalid, "\(String(decoding: reply.body, as: UTF8.self))")
    }

    /// The same restore, but another user writes to the restored store
    /// before alice pulls. Her cursor must be refused as before, whatever
    /// other users wrote (an end taken over every user's feed would be past
    /// it): accepting it would keep her client at a place her feed never
    /// reached, skipping her changes made at lower offsets.
    @Test func aCursorPastTheEndOfTheUsersFeedIsInvalidWhateverOthersWrote() async throws {
        let restored = try await Self.restoredFromBackup("pull-restored-others")
        defer { Task { await restored.server.stop() } }
        // Alice's other device writes t4 (her offset 2), then bob writes
        // three changes (his 1 to 3).
        _ = try await restored.server.push([operation(.create, "t4", ["n": 4])])
        _ = try await restored.server.push(
            [operation(.create, "b1", ["n": 1]), operation(.create, "b2", ["n": 2]), operation(.create, "b3", ["n": 3])],
            token: "bob-token")
        let reply = try await restored.server.pull(cursor: restored.staleCursor)
        #expect(reply.status == 410 && reply.error?.error.code == .cursorInvalid, "\(String(decoding: reply.body, as: UTF8.self))")
    }

    /// The same restore, but alice's other device writes t4 and t5, which
    /// take the offsets t2 and t3 had: her feed reaches the stale cursor
    /// again. An empty page that kept the cursor left her client past t4
    /// and t5 for good (it never pulled them); the cursor names a change
    /// the feed does not hold at its offset, so it is 410 and she resyncs.
    @Test func aCursorOfChangesARestoredStoreNeverHadIsInvalidOnceItsFeedRegrows() async throws {
        let restored = try await Self.restoredFromBackup("pull-restored-regrown")
        defer { Task { await restored.server.stop() } }
        _ = try await restored.server.push([operation(.create, "t4", ["n": 4]), operation(.create, "t5", ["n": 5])])
        let reply = try await restored.server.pull(cursor: restored.staleCursor)
        #expect(reply.status == 410 && reply.error?.error.code == .cursorInvalid, "\(String(decoding: reply.body, as: UTF8.self))")
        // Cursors the restored store issued itself still lead to every change.
        let start = try await restored.server.pull(limit: 1).decode(PullResponse.self)
        let rest = try await restored.server.pull(cursor: start.cursor).decode(PullResponse.self)
        #expect((start.changes + rest.changes).map(\.entityID) == ["t1", "t4", "t5"])
        let idle = try await restored.server.pull(cursor: rest.cursor)
        #expect(idle.status == 200)
        #expect(try idle.decode(PullResponse.self).cursor == rest.cursor)
    }

    /// A pull that returns no change answers with the request's cursor,
    /// the same string (section 8), a cursor issued before marks
    /// (`Cursor.mark`: 32 bytes, 43 characters, still taken) too: here at
    /// the end of alice's feed, and at the start of bob's, who has none,
    /// where the server's own start cursor carries a mark.
    @Test func anEmptyPageKeepsACursorIssuedBeforeMarksAsSent() async throws {
        let server = try await TestServer("pull-unmarked")
        defer { Task { await server.stop() } }
        _ = try await server.push((1...2).map { operation(.create, "t\($0)", ["n": .int(Int64($0))]) })
        let end = try unmarked(try await server.pull().decode(PullResponse.self).cursor)
        #expect(end.utf8.count == 43)
        let idle = try await server.pull(cursor: end).decode(PullResponse.self)
        #expect(idle.changes.isEmpty && idle.cursor == end)
        let start = try unmarked(try await server.pull(token: "bob-token").decode(PullResponse.self).cursor)
        let bobIdle = try await server.pull(cursor: start, token: "bob-token").decode(PullResponse.self)
        #expect(bobIdle.changes.isEmpty && bobIdle.cursor == start)
    }
}

/// Names that differ only by Unicode canonical equivalence (U+00E9 and
/// U+0065 U+0301) must not appear in one object (`sync-protocol.md`, section
/// 16, point 17): the Swift reader refuses such an object as a repeated name.
/// The server's own rows that hold numbers (`ServerStorage`): a value of
/// the wrong length is damage, answered 500 with a message naming the row,
/// never read as absent. Read as absent, a damaged `next-user` gave the
/// next new user the number of the first, and with it her data; a damaged
/// user row gave its user a new, empty feed; a damaged idempotency row
/// applied a pushed operation a second time.
@Suite struct DamagedServerStorageTests {
    /// Stops `server`, puts `value` under `key` in its database `name`, and starts it again.
    private func damage(_ server: TestServer, _ name: String, key: [UInt8], value: [UInt8]) async throws {
        await server.stop()
        do {
            let environment = try Environment(path: server.configuration.dataDirectory)
            defer { environment.close() }
            let database = try #require(try environment.openDatabase(name, create: false))
            try environment.write { txn in try txn.put(database, key: key, value: value) }
        }
        try await server.restart()
    }

    private func expectDamage(_ reply: TestServer.Reply, naming row: String) {
        let body = String(decoding: reply.body, as: UTF8.self)
        #expect(reply.status == 500 && reply.error?.error.code == .internalError, "\(reply.status) \(body)")
        #expect(reply.error?.error.message.contains(row) == true, "\(body)")
    }

    /// Stops `server`, replaces alice's first change row (user 1, offset 1)
    /// with what `rewrite` makes of it, and starts the server again.
    static func rewriteFirstChange(of server: TestServer, _ rewrite: ([UInt8]) throws -> [UInt8]) async throws {
        try await rewriteRow(of: server, in: "changes", key: [0, 0, 0, 1] + UInt64(1).bigEndianBytes, rewrite)
    }

    /// Stops `server`, replaces the row under `key` in its database `name`
    /// with what `rewrite` makes of it, and starts the server again.
    static func rewriteRow(
        of server: TestServer, in name: String, key: [UInt8], _ rewrite: ([UInt8]) throws -> [UInt8]
    ) async throws {
        await server.stop()
        do {
            let environment = try Environment(path: server.configuration.dataDirectory)
            defer { environment.close() }
            let database = try #require(try environment.openDatabase(name, create: false))
            try environment.write { txn in
                let row = try #require(try txn.get(database, key: key))
                try txn.put(database, key: key, value: try rewrite(row))
            }
        }
        try await server.restart()
    }

    /// The key after a change's entry is the server's own bytes: damaged,
    /// it is named, not shown with replacement characters that a client
    /// would take for another operation's key, and so for a lost change.
    @Test func aDamagedChangeKeyIsNamed() async throws {
        let server = try await TestServer("damaged-change-key")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["owner": "alice"], key: "k1")])
        try await Self.rewriteFirstChange(of: server) { row in row.dropLast() + [0xFF] }
        expectDamage(try await server.pull(), naming: "change 1")
    }

    /// A change row shorter than its entry's header says is damage too.
    @Test func aCutChangeRowIsNamed() async throws {
        let server = try await TestServer("cut-change-row")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["owner": "alice"], key: "k1")])
        try await Self.rewriteFirstChange(of: server) { row in Array(row.prefix(EntryCodec.headerBytes + 3)) }
        expectDamage(try await server.pull(), naming: "change 1")
    }

    /// A change row holding an entry of another kind than a change
    /// (`remote`) is damage too: answered 500 naming the change and its
    /// kind, and no other user's request is stopped by it.
    @Test func aChangeRowOfAnotherKindIsNamed() async throws {
        let server = try await TestServer("change-row-kind")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["owner": "alice"], key: "k1")])
        try await Self.rewriteFirstChange(of: server) { row in
            let count = try #require(row.withUnsafeBytes { EntryCodec.count(ofEntryAt: $0) })
            let entry = try EntryCodec.decode(Array(row.prefix(count)), expectedOffset: 1)
            return try EntryCodec.encode(Entry(offset: 1, timestamp: entry.timestamp, body: .resync(reason: "damage"))) + row.dropFirst(count)
        }
        expectDamage(try await server.pull(), naming: "change 1 is a resync entry")
        #expect(try await server.pull(token: "bob-token").status == 200)
    }

    @Test func aDamagedUserCounterGivesNoOnesNumberAgain() async throws {
        let server = try await TestServer("damaged-next-user")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["owner": "alice"])])
        try await damage(server, "meta", key: Array("next-user".utf8), value: [0, 1])
        expectDamage(try await server.push([operation(.create, "b1", ["owner": "bob"])], token: "bob-token"), naming: "next-user")
        // Bob, refused a number, has no feed; alice's has only her change.
        #expect(try await server.pullAll(token: "bob-token").isEmpty)
        #expect(try await server.pullAll().map(\.entityID) == ["t1"])
    }

    @Test func aDamagedUserRowIsNotANewUser() async throws {
        let server = try await TestServer("damaged-user-row")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["owner": "alice"])])
        try await damage(server, "users", key: Array("alice".utf8), value: [0, 0, 1])
        expectDamage(try await server.pull(), naming: "alice")
        expectDamage(try await server.push([operation(.create, "t2", ["owner": "alice"])]), naming: "alice")
        #expect(try await server.pullAll(token: "bob-token").isEmpty)
    }

    /// Read as 0, a damaged generation made every cursor issued since an
    /// operator's resync look current again.
    @Test func aDamagedGenerationIsNamed() async throws {
        let server = try await TestServer("damaged-generation")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["owner": "alice"])])
        try await damage(server, "meta", key: Array("generation".utf8), value: [1])
        expectDamage(try await server.pull(), naming: "generation")
    }

    /// Only damage puts an entity at the last version there is: the next
    /// push to it overflowed the version and stopped the server, and with
    /// it every user's requests.
    @Test func anEntityAtTheLastVersionIsNamed() async throws {
        let server = try await TestServer("damaged-entity-version")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        // Alice's entity te/t1 (`ServerStorage.entityKey`); its state
        // holds the version after a layout byte and a deleted byte (`EntityState`).
        let key = UInt32(1).bigEndianBytes + Array("te".utf8) + [0] + Array("t1".utf8)
        try await Self.rewriteRow(of: server, in: "entities", key: key) { row in
            Array(row.prefix(2)) + UInt64.max.bigEndianBytes + row.dropFirst(10)
        }
        expectDamage(try await server.push([operation(.update, "t1", ["n": 2], base: 1)]), naming: "te/t1")
        #expect(try await server.pullAll().map(\.serverVersion) == [1])
    }

    @Test func aDamagedIdempotencyRowDoesNotApplyAgain() async throws {
        let server = try await TestServer("damaged-idempotency-row")
        defer { Task { await server.stop() } }
        let update = operation(.update, "t1", ["n": 2])
        _ = try await server.push([operation(.create, "t1", ["n": 1]), update])
        // Alice is user 1; her keys start with her number (`ServerStorage.idempotencyKey`).
        try await damage(server, "idempotency", key: UInt32(1).bigEndianBytes + Array(update.idempotencyKey.utf8), value: [9])
        expectDamage(try await server.push([update]), naming: update.idempotencyKey)
        #expect(try await server.pullAll().last?.serverVersion == 2)
    }

    /// Only damage puts a user's change at the last offset there is: their
    /// next push is answered 500 naming the full feed, where the next
    /// offset overflowed and stopped the server, or (the change at the
    /// last offset overlooked) went on at offset 1, below it.
    @Test func aFeedAtTheLastOffsetIsNamed() async throws {
        let server = try await TestServer("feed-at-last-offset")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "t1", ["n": 1])])
        await server.stop()
        // Alice, the first user to write, is user number 1.
        try PullCursorBoundaryTests.moveChange(of: 1, from: 1, to: .max, in: server.configuration.dataDirectory)
        try await server.restart()
        expectDamage(try await server.push([operation(.create, "t2", ["n": 2])]), naming: "change feed of user 1 is full")
        #expect(try await server.pullAll().map(\.entityID) == ["t1"])
        #expect(try await server.push([operation(.create, "b1", ["n": 1])], token: "bob-token").status == 200)
    }
}

@Suite struct CanonicallyEquivalentFieldTests {
    @Test func anUpdateNeverPutsTwoEquivalentNamesInOneEntity() async throws {
        let server = try await TestServer("push-equivalent-names")
        defer { Task { await server.stop() } }
        let composed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        let create = try await server.push([operation(.create, "t1", [composed: 1])]).decode(PushResponse.self)
        #expect(create.results[0].status == .applied)
        let update = try await server.push([operation(.update, "t1", [decomposed: 2], base: 1)]).decode(PushResponse.self)
        #expect(update.results[0].errorCode == .validationError)
        // The feed stays readable by the client's reader.
        let body = try await server.pull().body
        #expect(throws: Never.self) { try PullResponse.decode(json: body) }
        // The same name, byte for byte, is of course an update.
        let same = try await server.push([operation(.update, "t1", [composed: 3], base: 1)]).decode(PushResponse.self)
        #expect(same.results[0].status == .applied)
    }

    /// A field's last-changed version is its own, found by its scalars
    /// (section 1), not another spelling's: the decomposed name, never
    /// set, counts as set at the create (1), so an update of it made at 1
    /// does not conflict, and is refused for the spelling alone. Before,
    /// the versions, keyed by `String`, answered for the composed name
    /// (set at 2): a `CONFLICT`, whose resolution could only be refused too.
    @Test func aFieldsLastChangedVersionIsNotAnotherSpellings() async throws {
        let server = try await TestServer("push-equivalent-versions")
        defer { Task { await server.stop() } }
        let composed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        _ = try await server.push([operation(.create, "t1", [composed: 1]), operation(.update, "t1", [composed: 2], base: 1)])
        let update = try await server.push([operation(.update, "t1", [decomposed: 3], base: 1)]).decode(PushResponse.self)
        #expect(update.results[0].errorCode == .validationError, "\(update.results[0])")
        #expect(update.results[0].serverState == nil)
    }
}

@Suite struct ServerConfigurationTests {
    enum Setting: String, CaseIterable, Sendable {
        case noPushBuffer, zeroRate, nanRate, zeroBurst, negativeIdleTimeout, zeroBodyTimeout, negativePort, portPastRange

        func apply(to configuration: inout SyncServer.Configuration) -> String {
            switch self {
            case .noPushBuffer: configuration.pushBufferBytesMax = 0
            case .zeroRate: configuration.rateLimit = (rate: 0, burst: 5)
            case .nanRate: configuration.rateLimit = (rate: .nan, burst: 5)
            case .zeroBurst: configuration.rateLimit = (rate: 10, burst: 0)
            case .negativeIdleTimeout: configuration.idleTimeout = .seconds(Int64.min)
            case .zeroBodyTimeout: configuration.bodyTimeout = .zero
            case .negativePort: configuration.port = -1
            case .portPastRange: configuration.port = 65536
            }
            switch self {
            case .noPushBuffer: return "pushBufferBytesMax"
            case .negativeIdleTimeout: return "idleTimeout"
            case .zeroBodyTimeout: return "bodyTimeout"
            case .negativePort, .portPastRange: return "port"
            default: return "rateLimit"
            }
        }
    }

    /// An embedding app's settings out of range are an error naming the
    /// setting, not a trap in the server's init (as a zero push buffer or
    /// rate was) or as it makes its application (as an idle timeout of
    /// more negative nanoseconds than an `Int64` holds was), and nothing is opened.
    @Test(arguments: Setting.allCases)
    func aSettingOutOfRangeIsAnErrorNamingIt(setting: Setting) throws {
        let directory = try TemporaryDirectory("server-configuration")
        defer { directory.remove() }
        var configuration = SyncServer.Configuration(dataDirectory: directory.appending("data"))
        let name = setting.apply(to: &configuration)
        let error = #expect(throws: SyncServer.ConfigurationError.self) {
            _ = try SyncServer(configuration: configuration).application()
        }
        #expect(error?.description.contains(name) == true, "\(String(describing: error))")
        #expect(!FileManager.default.fileExists(atPath: directory.appending("data")))
    }

    /// A first start stopped after it made `meta`, the server's first
    /// database, and before it wrote its identity there, leaves an
    /// environment whose `meta` is empty: the server's own store, which the
    /// next start takes and completes, not another program's.
    @Test func aStoreWhoseFirstStartStoppedBeforeItsIdentityIsServed() async throws {
        let directory = try TemporaryDirectory("server-first-start-cut")
        let data = directory.appending("data")
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
        do {
            let environment = try Environment(path: data)
            defer { environment.close() }
            #expect(try environment.openDatabase("meta", create: true) != nil)
        }
        let server = try await TestServer("first-start-cut", dataDirectory: data)
        defer { Task { await server.stop() } }
        #expect(try await server.push([operation(.create, "t1", ["n": 1])]).status == 200)
        #expect(try await server.pullAll().map(\.entityID) == ["t1"])
    }
}

@Suite struct ProtocolErrorTests {
    /// A body sent in chunks, with no length up front, is refused with 413
    /// once it passes the limit: the server stops reading it then, rather
    /// than holding all of it.
    @Test func aChunkedBodyOverTheLimitIsRefused() async throws {
        let server = try await TestServer("errors-chunked")
        defer { Task { await server.stop() } }
        let chunk = Data(repeating: 32, count: 64 * 1024)
        let chunks = Wire.requestBodyBytesMax / chunk.count + 2
        let reply = try await onAThreadOfItsOwn { try rawChunkedPost(port: server.port, path: "/v1/push", chunk: chunk, count: chunks) }
        #expect(reply.hasPrefix("HTTP/1.1 413"), "\(reply.prefix(200))")
        #expect(reply.contains("PAYLOAD_TOO_LARGE"), "\(reply.prefix(400))")
        // The server is still there for the next request.
        #expect(try await server.pull().status == 200)
    }

    /// A `Content-Length` over the limit is refused from the head alone:
    /// the client is not made to send megabytes first, nor the server to
    /// wait for them (here no byte of the body is ever sent).
    @Test func aDeclaredLengthOverTheLimitIsRefusedBeforeTheBody() async throws {
        let server = try await TestServer("errors-declared-length")
        defer { Task { await server.stop() } }
        let head =
            "POST /v1/push HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer alice-token\r\nContent-Type: application/json\r\n"
            + "Content-Length: \(Wire.requestBodyBytesMax + 1)\r\n\r\n"
        let reply = try await onAThreadOfItsOwn {
            try rawExchange(port: server.port, receiveTimeoutSeconds: 30) { sendAll in _ = sendAll(Data(head.utf8)) }
        }
        #expect(statuses(reply) == [413], "\(reply.prefix(400))")
        #expect(reply.contains("PAYLOAD_TOO_LARGE") && reply.contains("\(Wire.requestBodyBytesMax + 1) bytes"), "\(reply.prefix(400))")
        #expect(try await server.pull().status == 200)
    }

    /// The server holds at most `pushBufferBytesMax` bytes of push bodies
    /// at once (being received, or waiting for the store's one writer): a
    /// push that would take it over while another holds bytes is answered
    /// 503 with `Retry-After`, which clients retry, and applies nothing; the
    /// server used to hold every body sent to it at once. A push alone is
    /// taken whatever its size. Here one push holds all but the last byte
    /// of its body while a second is sent.
    @Test func pushBodiesOverTheBufferAreAnswered503() async throws {
        let server = try await TestServer("push-buffer")
        defer { Task { await server.stop() } }
        server.configuration.pushBufferBytesMax = 32 * 1024
        try await server.restart()
        func body(_ id: String, bytes: Int) throws -> Data {
            try JSONEncoder().encode(PushRequest(operations: [operation(.create, id, ["s": .string(String(repeating: "x", count: bytes))])]))
        }
        // Alone, a push over the buffer is taken.
        #expect(try await server.send("POST", "/v1/push", body: try body("alone", bytes: 48 * 1024)).status == 200)
        #expect(server.server.pushBufferBytes == 0)

        let held = try body("held", bytes: 24 * 1024)
        let head = "POST /v1/push HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer alice-token\r\nContent-Type: application/json\r\n"
            + "Content-Length: \(held.count)\r\n\r\n"
        let lastByte = DispatchSemaphore(value: 0)
        let port = server.port
        async let heldReply = onAThreadOfItsOwn {
            try rawExchange(port: port, receiveTimeoutSeconds: 60) { sendAll in
                guard sendAll(Data(head.utf8) + held.dropLast()) else { return }
                // A hang guard: the test signals once the second push is answered.
                _ = lastByte.wait(timeout: .now() + 120)
                _ = sendAll(held.suffix(1))
            }
        }
        // Waits for the server to hold all but the last byte (a hang guard, no timing).
        for _ in 0..<12_000 where server.server.pushBufferBytes < held.count - 1 { try await Task.sleep(for: .milliseconds(10)) }
        #expect(server.server.pushBufferBytes == held.count - 1)
        let refused = try await server.send("POST", "/v1/push", body: try body("refused", bytes: 16 * 1024))
        lastByte.signal()
        #expect(refused.status == 503, "\(String(decoding: refused.body, as: UTF8.self))")
        #expect(refused.error?.error.code == .serviceUnavailable && refused.error?.error.retryable == true)
        #expect(refused.headers["retry-after"] == "1")
        let reply = try await heldReply
        #expect(statuses(reply) == [200], "\(reply.prefix(300))")
        #expect(server.server.pushBufferBytes == 0)
        // Retried once the buffer has room, it is applied.
        #expect(try await server.send("POST", "/v1/push", body: try body("refused", bytes: 16 * 1024)).status == 200)
        #expect(try await server.pullAll().map(\.entityID) == ["alone", "held", "refused"])
    }

    /// What HTTP's parser refuses (a method HTTP does not know, a header
    /// line without a colon, a chunk size that is not hex) is answered with
    /// the error envelope (section 5) and the connection closed, where the
    /// server used to send Hummingbird's bare 400 (and a 500 for a bad
    /// chunk in a body it read).
    @Test(arguments: [
        ("FOO /v1/push HTTP/1.1\r\nHost: h\r\n\r\n", "invalid HTTP method"),
        ("GET /v1/health HTTP/1.1\r\nHost: h\r\nno colon here\r\n\r\n", "invalid character in header"),
        (
            "POST /v1/push HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer alice-token\r\nTransfer-Encoding: chunked\r\n\r\n"
                + "2\r\n{}\r\nZZ\r\n", "chunk size"
        ),
    ])
    func whatHTTPCannotParseHasTheEnvelope(request: String, reason: String) async throws {
        let server = try await TestServer("errors-unparsable")
        defer { Task { await server.stop() } }
        let reply = try await onAThreadOfItsOwn {
            try rawExchange(port: server.port, untilClosed: true) { sendAll in _ = sendAll(Data(request.utf8)) }
        }
        #expect(reply.hasPrefix("HTTP/1.1 400"), "\(reply)")
        #expect(reply.contains("\"code\":\"VALIDATION_ERROR\"") && reply.contains(reason), "\(reply)")
        #expect(reply.lowercased().contains("connection: close") && reply.contains("\(Wire.versionHeader): 1"), "\(reply)")
        #expect(statuses(reply) == [400], "one answer: \(reply)")
        #expect(try await server.pull().status == 200)
    }

    /// Garbage in a body that the route answers without reading (a push
    /// without a token, a pull, which takes no body): that answer is the
    /// connection's last and only one, where Hummingbird alone adds a bare
    /// 400 after it.
    @Test(arguments: [
        ("POST /v1/push HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\nZZ\r\n", 401),
        (
            "GET /v1/pull HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer alice-token\r\nTransfer-Encoding: chunked\r\n\r\n"
                + "2\r\n{}\r\nZZ\r\n", 200
        ),
    ])
    func garbageInABodyLeftUnreadEndsTheConnectionAfterOneAnswer(request: String, status: Int) async throws {
        let server = try await TestServer("errors-unread-body")
        defer { Task { await server.stop() } }
        let reply = try await onAThreadOfItsOwn {
            try rawExchange(port: server.port, untilClosed: true) { sendAll in _ = sendAll(Data(request.utf8)) }
        }
        #expect(statuses(reply) == [status], "\(reply)")
        #expect(reply.lowercased().contains("connection: close"), "\(reply)")
    }

    /// Seeded damage to the bytes of whole HTTP requests (bytes flipped,
    /// cut short, bytes inserted, a second request behind the first): the
    /// server never answers 5xx, gives every non-2xx answer the envelope,
    /// answers what it cannot parse last (it closes then), and keeps
    /// serving. (Bytes past a body's `Content-Length` are the next request
    /// to HTTP: one damaged request can get two answers.)
    @Test func damagedHTTPIsAnsweredWithEnvelopesAndParseErrorsLast() async throws {
        let server = try await TestServer("errors-damaged-http")
        defer { Task { await server.stop() } }
        let seed = SeededRandom.seed(default: 1_404)
        var random = SeededRandom(seed: seed)
        let body = try JSONEncoder().encode(PushRequest(operations: [operation(.create, "d1", ["n": 1])]))
        let plain = Data(
            ("POST /v1/push HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer alice-token\r\n"
                + "Content-Type: application/json\r\nContent-Length: \(body.count)\r\n\r\n").utf8) + body
        let chunked = Data(
            ("POST /v1/push HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer alice-token\r\n"
                + "Transfer-Encoding: chunked\r\n\r\n\(String(body.count, radix: 16))\r\n").utf8) + body + Data("\r\n0\r\n\r\n".utf8)
        for round in 0..<60 {
            var request = [UInt8](Bool.random(using: &random) ? plain : chunked)
            switch Int.random(in: 0...3, using: &random) {
            case 0: flipBytes(&request, 1...4, &random)
            case 1: cutShort(&request, &random)
            case 2:  // bytes inserted
                let inserted = (0..<Int.random(in: 1...16, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
                request.insert(contentsOf: inserted, at: Int.random(in: 0...request.count, using: &random))
            default:  // a damaged request behind a whole one
                var second = request
                second[Int.random(in: 0..<second.count, using: &random)] = UInt8.random(in: 0...255, using: &random)
                request += second
            }
            let bytes = Data(request)
            let reply = try await onAThreadOfItsOwn {
                try rawExchange(port: server.port, untilClosed: true, closeWriting: true) { sendAll in _ = sendAll(bytes) }
            }
            let codes = statuses(reply)
            let context = "seed \(seed) round \(round): \(reply.prefix(600))"
            #expect(codes.allSatisfy { (200..<300).contains($0) || (400..<500).contains($0) }, "\(context)")
            let errors = codes.filter { $0 >= 400 }.count
            #expect(reply.components(separatedBy: "{\"error\":{\"code\":").count - 1 == errors, "\(context)")
            let unparsable = reply.components(separatedBy: "cannot parse the request").count - 1
            #expect(unparsable <= 1, "\(context)")
            if unparsable == 1, let last = reply.range(of: "HTTP/1.1 \(codes.last ?? 0) ", options: .backwards) {
                #expect(reply[last.lowerBound...].contains("cannot parse the request"), "\(context)")
            }
        }
        #expect(try await server.send("GET", "/v1/health", token: nil).status == 200)
        #expect(try await server.pull().status == 200)
    }

    /// Garbage pipelined after a whole request is answered after that
    /// request's answer, which it must not cut into.
    @Test func garbageAfterARequestIsAnsweredAfterIt() async throws {
        let server = try await TestServer("errors-pipelined")
        defer { Task { await server.stop() } }
        let request = "GET /v1/health HTTP/1.1\r\nHost: h\r\n\r\nFOO /v1/pull HTTP/1.1\r\nHost: h\r\n\r\n"
        let reply = try await onAThreadOfItsOwn {
            try rawExchange(port: server.port, untilClosed: true) { sendAll in _ = sendAll(Data(request.utf8)) }
        }
        #expect(statuses(reply) == [200, 400], "\(reply)")
        #expect(reply.hasSuffix("invalid HTTP method\",\"retryable\":false}}"), "\(reply)")
    }

    /// Section 13 at its bounds, where `everyRequestLevelErrorHasTheEnvelope`
    /// covers one past them: a push of exactly `pushOperationCountMax`
    /// operations is applied, and a body of exactly `requestBodyBytesMax`
    /// bytes ("a body of exactly this size is allowed") is read and applied,
    /// not 413.
    @Test func requestsAtTheLimitsAreServed() async throws {
        let server = try await TestServer("limits-at-bounds")
        defer { Task { await server.stop() } }
        let most = PushRequest(operations: (1...Wire.pushOperationCountMax).map { operation(.create, "m\($0)", [:]) })
        let reply = try await server.send("POST", "/v1/push", body: try JSONEncoder().encode(most))
        #expect(reply.status == 200, "\(String(decoding: reply.body.prefix(300), as: UTF8.self))")
        let results = try reply.decode(PushResponse.self).results
        #expect(results.count == Wire.pushOperationCountMax && results.allSatisfy { $0.status == .applied })

        // One operation and a member the server ignores, padded to the byte.
        let head = #"{"operations":[{"idempotency_key":"big","entity_type":"te","entity_id":"big","intent":"create","data":{},"#
            + #""client_timestamp":"2026-11-22T08:00:00Z","base_version":0}],"pad":""#
        let tail = #""}"#
        let padding = String(repeating: "x", count: Wire.requestBodyBytesMax - head.utf8.count - tail.utf8.count)
        let body = Data((head + padding + tail).utf8)
        #expect(body.count == Wire.requestBodyBytesMax)
        let big = try await server.send("POST", "/v1/push", body: body)
        #expect(big.status == 200, "\(String(decoding: big.body.prefix(300), as: UTF8.self))")
        #expect(try big.decode(PushResponse.self).results.map(\.status) == [.applied])
    }

    /// Section 12 at its bounds: `fail_next` and `drop_after_push` of
    /// 1,000,000 and `delay_ms` of 60,000 are taken (one more is refused,
    /// `aFaultOutOfRangeIsNamedWithItsRange`), and answered in force.
    @Test func faultsAtTheirLimitsAreTaken() async throws {
        let server = try await TestServer("faults-at-bounds")
        defer { Task { await server.stop() } }
        let most = #"{"fail_next": 1000000, "status": 429, "delay_ms": 60000, "drop_after_push": 1000000}"#
        let reply = try await server.send("POST", "/v1/admin/faults", token: "admin-token", body: Data(most.utf8))
        #expect(reply.status == 200, "\(String(decoding: reply.body, as: UTF8.self))")
        #expect(try reply.decode(FaultSettings.self) == FaultSettings(failNext: 1_000_000, status: 429, delayMs: 60_000, dropAfterPush: 1_000_000))
        // The admin endpoints are never delayed or failed: clearing is at once.
        let cleared = try await server.send("POST", "/v1/admin/faults", token: "admin-token", body: Data("{}".utf8))
        #expect(try cleared.decode(FaultSettings.self) == FaultSettings(failNext: 0, status: 503, delayMs: 0, dropAfterPush: 0))
        #expect(try await server.pull().status == 200)
    }

    @Test func everyRequestLevelErrorHasTheEnvelope() async throws {
        let server = try await TestServer("errors")
        defer { Task { await server.stop() } }
        var cases: [(TestServer.Reply, Int, WireErrorCode)] = []
        cases.append((try await server.send("GET", "/v1/pull", token: nil), 401, .unauthorized))
        cases.append((try await server.send("GET", "/v1/pull", token: "nobody"), 401, .unauthorized))
        cases.append((try await server.send("POST", "/v1/push", body: Data("{not json".utf8)), 400, .validationError))
        cases.append((try await server.send("POST", "/v1/push", body: Data(#"{"operations": "no"}"#.utf8)), 400, .validationError))
        cases.append((try await server.send("POST", "/v1/push", body: Data(#"{"operations": []}"#.utf8)), 400, .validationError))
        let tooMany = PushRequest(operations: (0...Wire.pushOperationCountMax).map { operation(.create, "t\($0)", [:]) })
        cases.append((try await server.send("POST", "/v1/push", body: try JSONEncoder().encode(tooMany)), 400, .validationError))
        cases.append((try await server.send("POST", "/v1/push", body: Data(repeating: 32, count: Wire.requestBodyBytesMax + 1)), 413, .payloadTooLarge))
        for limit in ["0", "1001", "-5", "+5", "ten", "99999999999999999999"] {
            cases.append((try await server.send("GET", "/v1/pull", query: ["limit": limit]), 400, .validationError))
        }
        for cursor in ["garbage", "", String(repeating: "A", count: 43), String(repeating: "é", count: 500)] {
            cases.append((try await server.send("GET", "/v1/pull", query: ["cursor": cursor]), 410, .cursorInvalid))
        }
        cases.append((try await server.send("GET", "/v1/nowhere"), 404, .notFound))
        for (reply, status, code) in cases {
            #expect(reply.status == status, "\(code): \(String(decoding: reply.body, as: UTF8.self))")
            #expect(reply.error?.error.code == code)
            #expect(reply.error?.error.retryable == false)
            #expect(reply.headers["sync-protocol-version"] == "1")
        }
        #expect(cases[0].0.headers["www-authenticate"] == "Bearer")
        // It keeps serving, and unknown fields are ignored.
        let extra = #"{"operations":[{"idempotency_key":"k","entity_type":"te","entity_id":"x","intent":"create","data":{},"client_timestamp":"2026-11-22T08:00:00Z","base_version":0,"future":1}],"also":2}"#
        #expect(try await server.send("POST", "/v1/push", body: Data(extra.utf8)).decode(PushResponse.self).results[0].status == .applied)
        #expect(try await server.send("GET", "/v1/health", token: nil).decode(HealthResponse.self).status == "ok")
    }

    /// Paths are matched exactly (`sync-protocol.md` section 2): a trailing
    /// slash or an empty segment makes an unknown path, and a known path with
    /// any other method, HEAD and OPTIONS included, is 405 with `Allow`.
    @Test func pathsMatchExactlyAndEveryOtherMethodIs405() async throws {
        let server = try await TestServer("paths")
        defer { Task { await server.stop() } }
        let push = try JSONEncoder().encode(PushRequest(operations: [operation(.create, "t1", ["n": 1])]))
        for (method, path) in [("POST", "/v1/push/"), ("POST", "//v1/push"), ("POST", "/v1//push"), ("GET", "/v1/health/"), ("GET", "/v1/pull/")] {
            let reply = try await server.send(method, path, body: method == "POST" ? push : nil)
            #expect(reply.status == 404 && reply.error?.error.code == .notFound, "\(method) \(path): \(reply.status)")
        }
        #expect(try await server.pullAll().isEmpty)
        let others = [
            ("OPTIONS", "/v1/push", "POST"), ("HEAD", "/v1/push", "POST"), ("OPTIONS", "/v1/pull", "GET"),
            ("TRACE", "/v1/push", "POST"), ("PROPFIND", "/v1/pull", "GET"), ("PUT", "/v1/health", "GET"),
        ]
        for (method, path, allowed) in others {
            let reply = try await server.send(method, path)
            #expect(reply.status == 405 && reply.headers["allow"] == allowed, "\(method) \(path): \(reply.status)")
        }
    }

    @Test func rateLimitsAnswer429WithRetryAfter() async throws {
        // One token per 1,000 s: no refill can happen while the test runs.
        let server = try await TestServer("rate", rateLimit: (0.001, 3))
        defer { Task { await server.stop() } }
        var statuses: [Int] = []
        for _ in 0..<5 { statuses.append(try await server.pull().status) }
        #expect(statuses.prefix(3).allSatisfy { $0 == 200 })
        #expect(statuses.last == 429)
        let limited = try await server.pull()
        #expect(limited.error?.error.code == .rateLimited && limited.error?.error.retryable == true)
        #expect(Int(limited.headers["retry-after"] ?? "") ?? 0 >= 1)
        // Another user has a bucket of their own.
        #expect(try await server.pull(token: "bob-token").status == 200)
    }

    /// Users are told apart by their names' bytes, as the store does: two
    /// names that differ only by Unicode normalization are two users, and
    /// must not share one bucket (Swift's `String` equality merges them).
    @Test func usersWhoseNamesAreCanonicallyEquivalentHaveBucketsOfTheirOwn() async throws {
        let server = try await TestServer("rate-equivalent", rateLimit: (0.001, 2))
        defer { Task { await server.stop() } }
        server.configuration.tokens["composed-token"] = Identity(user: "caf\u{E9}")
        server.configuration.tokens["decomposed-token"] = Identity(user: "cafe\u{301}")
        try await server.restart()
        #expect(try await server.pull(token: "composed-token").status == 200)
        #expect(try await server.pull(token: "composed-token").status == 200)
        #expect(try await server.pull(token: "decomposed-token").status == 200)
    }
}

@Suite struct FaultInjectionTests {
    @Test(arguments: [(500, WireErrorCode.internalError), (503, .serviceUnavailable), (429, .rateLimited)])
    func failTheNextRequests(status: Int, code: WireErrorCode) async throws {
        let server = try await TestServer("faults-\(status)")
        defer { Task { await server.stop() } }
        let settings = try JSONEncoder().encode(FaultSettings(failNext: 2, status: status))
        #expect(try await server.send("POST", "/v1/admin/faults", token: "admin-token", body: settings).status == 200)
        for _ in 0..<2 {
            let failed = try await server.pull()
            #expect(failed.status == status && failed.error?.error.code == code && failed.error?.error.retryable == true)
            if status != 500 { #expect(failed.headers["retry-after"] == "1") }
        }
        #expect(try await server.send("GET", "/v1/health", token: nil).status == 200)
        #expect(try await server.pull().status == 200)
    }

    @Test func aDroppedAnswerStillAppliedThePushOnce() async throws {
        let server = try await TestServer("faults-drop")
        defer { Task { await server.stop() } }
        try server.server.setFaults(FaultSettings(dropAfterPush: 1))
        let create = operation(.create, "t1", ["n": 1], key: "lost-answer")
        await #expect(throws: (any Error).self) { _ = try await server.push([create]) }
        let retry = try await server.push([create]).decode(PushResponse.self).results[0]
        #expect(retry.status == .duplicate && retry.serverVersion == 1)
        #expect(try await server.pullAll().count == 1)
    }

    @Test func delaysSlowEveryAnswer() async throws {
        let server = try await TestServer("faults-delay")
        defer { Task { await server.stop() } }
        try server.server.setFaults(FaultSettings(delayMs: 300))
        let clock = ContinuousClock()
        let started = clock.now
        #expect(try await server.pull().status == 200)
        // A lower bound only: the delay is a floor, never a ceiling.
        #expect(clock.now - started >= .milliseconds(300))
        try server.server.setFaults(FaultSettings())
    }

    /// Section 12: without fault injection the path is unknown for every
    /// method (other methods got 405 with `Allow: POST`, telling it exists).
    @Test func faultsAreOffUnlessEnabled() async throws {
        let server = try await TestServer("faults-off", faultInjection: false)
        defer { Task { await server.stop() } }
        for method in ["POST", "GET", "PUT"] {
            let reply = try await server.send(method, "/v1/admin/faults", token: "admin-token", body: method == "POST" ? Data("{}".utf8) : nil)
            #expect(reply.status == 404 && reply.headers["allow"] == nil, "\(method): \(reply.status)")
        }
    }

    /// Section 12: the body is read by the protocol's JSON rules, which
    /// `JSONDecoder` did not keep: `null` for a member, a fraction, an
    /// escaped lone surrogate, a byte order mark, and a body that is not an
    /// object are 400, and the configuration stays as it was. A whole
    /// number is read by value, as `base_version` is.
    @Test func faultsBodiesAreReadByTheProtocolsJSONRules() async throws {
        let server = try await TestServer("faults-json")
        defer { Task { await server.stop() } }
        let bodies = [
            Data(#"{"fail_next": null}"#.utf8), Data(#"{"fail_next": 1.5}"#.utf8), Data(#"{"status": "503"}"#.utf8),
            Data(#"{"note": "\ud800"}"#.utf8), Data([0xEF, 0xBB, 0xBF]) + Data("{}".utf8), Data("[]".utf8),
            Data(#"{"fail_next": 1000001}"#.utf8), Data(#"{"fail_next": 1e30}"#.utf8),
        ]
        for body in bodies {
            let reply = try await server.send("POST", "/v1/admin/faults", token: "admin-token", body: body)
            #expect(reply.status == 400 && reply.error?.error.code == .validationError, "\(String(decoding: body, as: UTF8.self)): \(reply.status)")
        }
        #expect(try await server.pull().status == 200, "a refused body changed the faults")
        let byValue = try await server.send("POST", "/v1/admin/faults", token: "admin-token", body: Data(#"{"fail_next": 1.0e0, "x": null}"#.utf8))
        #expect(byValue.status == 200, "\(String(decoding: byValue.body, as: UTF8.self))")
        #expect(try await server.pull().status == 503)
        #expect(try await server.pull().status == 200)
    }

    /// Section 5: an error message names what was wrong and where. A
    /// member out of range was answered "fault counts and delays must be in
    /// range", naming neither the member nor its range.
    @Test(arguments: [
        (#"{"delay_ms": 60001}"#, "delay_ms", "0 to 60000"), (#"{"fail_next": -1}"#, "fail_next", "0 to 1000000"),
        (#"{"drop_after_push": 1000001}"#, "drop_after_push", "0 to 1000000"), (#"{"status": 404}"#, "status", "500, 503 or 429"),
    ])
    func aFaultOutOfRangeIsNamedWithItsRange(body: String, member: String, range: String) async throws {
        let server = try await TestServer("faults-range")
        defer { Task { await server.stop() } }
        let reply = try await server.send("POST", "/v1/admin/faults", token: "admin-token", body: Data(body.utf8))
        let message = reply.error?.error.message ?? ""
        #expect(reply.status == 400 && message.contains(member) && message.contains(range), "\(body): \(reply.status) \(message)")
    }
}

@Suite struct HostileInputTests {
    /// Section 3: the admin token on push or pull is 401, as it names no
    /// user. Configured as a user's token too, it was taken as that user's.
    @Test func theAdminTokenIsNoUserTokenEvenWhenAUserHasIt() async throws {
        let server = try await TestServer("admin-token-as-user")
        defer { Task { await server.stop() } }
        server.configuration.adminToken = "alice-token"
        try await server.restart()
        let push = try await server.push([operation(.create, "t1", ["n": 1])])
        #expect(push.status == 401 && push.headers["www-authenticate"] == "Bearer", "\(push.status)")
        #expect(try await server.pull().status == 401)
        #expect(try await server.send("POST", "/v1/admin/resync", token: "alice-token").status == 200)
        #expect(try await server.pullAll(token: "bob-token").isEmpty)
    }

    /// Section 3: a token is one or more characters from `!` to `~`,
    /// compared exactly. Unicode spaces around it were trimmed, and a
    /// KELVIN SIGN (U+212A) matched the `K` of a configured token, as
    /// `String` equates canonically equivalent text. The token follows
    /// `Bearer` and one or more spaces: after any other byte (a tab, a
    /// letter) there is no token, not one that starts a byte later.
    @Test func aTokenIsItsExactBytes() async throws {
        let server = try await TestServer("token-bytes")
        defer { Task { await server.stop() } }
        server.configuration.tokens["K-token"] = Identity(user: "dave")
        try await server.restart()
        func status(_ authorization: String) async throws -> Int? {
            let reply = try await onAThreadOfItsOwn {
                try rawExchange(port: server.port, untilClosed: true) { sendAll in
                    _ = sendAll(Data("GET /v1/pull HTTP/1.1\r\nHost: h\r\nAuthorization: \(authorization)\r\nConnection: close\r\n\r\n".utf8))
                }
            }
            return statuses(reply).first
        }
        for accepted in ["Bearer K-token", "bearer   K-token", "BEARER K-token \t"] {
            #expect(try await status(accepted) == 200, "\(accepted)")
        }
        for refused in ["Bearer \u{A0}K-token", "Bearer K-token\u{3000}", "Bearer \u{212A}-token", "Bearer K-token x", "BearerK-token", "BearerxK-token", "Bearer\tK-token", "Bearer "] {
            #expect(try await status(refused) == 401, "\(refused.unicodeScalars.map { String($0.value, radix: 16) })")
        }
    }

    /// A connection that sends no part of a request for the idle timeout is
    /// closed: one stalled part way through its head (as a client sending
    /// it a byte at a time would be) and one idle after its answer. One
    /// whose answer takes longer than that (an injected delay) is not cut:
    /// it gets its answer. (The test's timeout is 1 s; the server's default
    /// is 300 s.)
    @Test func stalledAndIdleConnectionsAreClosed() async throws {
        let server = try await TestServer("idle-timeout")
        defer { Task { await server.stop() } }
        server.configuration.idleTimeout = .seconds(1)
        try await server.restart()
        for (label, request) in [("a stalled head", "GET /v1/pull HTTP/1.1\r\nHost: h\r\nAuthori"), ("an idle connection", "GET /v1/health HTTP/1.1\r\nHost: h\r\n\r\n")] {
            let closed = try await onAThreadOfItsOwn { try closedByServer(port: server.port, sending: Data(request.utf8)) }
            #expect(closed, "\(label): still open after 30 s")
        }
        try server.server.setFaults(FaultSettings(delayMs: 2_500))
        #expect(try await server.pull().status == 200)
        try server.server.setFaults(FaultSettings())
    }

    /// An HTTP/1.0 request without `Connection: keep-alive`, or any request
    /// with `Connection: close`, is its connection's last (RFC 9112 section
    /// 9.3): the server answers it with `Connection: close` and closes. An
    /// HTTP/1.0 connection used to stay open until the idle timeout
    /// (Hummingbird's HTTP/1 codec drops the request's version, so the
    /// request looked persistent). An HTTP/1.0 request with keep-alive leaves
    /// the connection open: the request behind it is answered too.
    @Test(arguments: [
        ("GET /v1/health HTTP/1.0\r\n\r\n", 1),
        ("GET /v1/health HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /v1/health HTTP/1.0\r\n\r\n", 2),
        ("GET /v1/health HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\nGET /v1/health HTTP/1.1\r\nConnection: Close\r\n\r\n", 2),
        ("GET /v1/health HTTP/1.1\r\nHost: h\r\nConnection: close, te\r\nTE: trailers\r\n\r\n", 1),
    ])
    func aRequestThatDoesNotKeepItsConnectionIsItsLast(requests: String, answers: Int) async throws {
        let server = try await TestServer("http10")
        defer { Task { await server.stop() } }
        let (reply, closed) = try await onAThreadOfItsOwn {
            var closed = false
            let reply = try rawExchange(port: server.port, untilClosed: true, receiveTimeoutSeconds: 30, onEnd: { closed = $0 }) {
                sendAll in _ = sendAll(Data(requests.utf8))
            }
            return (reply, closed)
        }
        #expect(closed, "still open after 30 s: \(reply)")
        #expect(statuses(reply) == Array(repeating: 200, count: answers), "\(reply)")
        let heads = reply.lowercased().components(separatedBy: "http/1.1 ").dropFirst()
        #expect(heads.last?.contains("connection: close") == true, "the last answer says it closes: \(reply)")
        #expect(heads.dropLast().allSatisfy { !$0.contains("connection: close") }, "\(reply)")
    }

    /// A body sent a byte at a time (slowloris) sends a part of the request
    /// well within every idle timeout, and held its connection, and the
    /// route's buffer, for as long as it kept trickling. It has the body
    /// timeout from its head on, then the connection is closed with no
    /// answer, whether the route is reading the body (a push) or has
    /// answered without it (a 401), and nothing of it is applied. A body
    /// sent at once is unaffected. (The test's timeout is 1 s; the client
    /// would take over 30 s to send the whole body.)
    @Test func aBodyTrickledPastTheBodyTimeoutIsCutOff() async throws {
        let server = try await TestServer("body-timeout")
        defer { Task { await server.stop() } }
        server.configuration.bodyTimeout = .seconds(1)
        try await server.restart()
        let operation = PushOperation(
            idempotencyKey: "k1", entityType: "te", entityID: "slow", intent: .create, data: ["n": 1],
            clientTimestamp: "2026-11-22T08:00:00Z", baseVersion: 0)
        let body = try JSONEncoder().encode(PushRequest(operations: [operation]))
        for token in ["alice-token", "wrong-token"] {
            let head = "POST /v1/push HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer \(token)\r\nContent-Type: application/json\r\n"
                + "Content-Length: \(body.count)\r\n\r\n"
            let (sentWhole, reply) = try await onAThreadOfItsOwn {
                try trickle(port: server.port, head: Data(head.utf8), body: body, pause: .milliseconds(200))
            }
            #expect(!sentWhole, "\(token): the whole body was taken over \(body.count * 200) ms")
            #expect(!statuses(reply).contains(200), "\(token): \(reply)")
        }
        let pulled = try await server.pull()
        #expect(pulled.status == 200)
        #expect(try pulled.decode(PullResponse.self).changes.isEmpty)
        // A body sent at once is whole at once: an answer that takes longer
        // than the timeout (an injected delay) still comes.
        try server.server.setFaults(FaultSettings(delayMs: 2_500))
        #expect(try await server.push([operation]).status == 200)
        try server.server.setFaults(FaultSettings())
    }

    /// Section 8: a cursor the server can tell it never issued is 410.
    /// Base64 leaves the last character's two low bits of a 32-byte cursor
    /// (as issued before cursors had a mark, and still taken) unused, and
    /// the decoder ignored them: a cursor changed only there was taken.
    @Test func aCursorDifferingOnlyInItsPadBitsIsInvalid() async throws {
        let server = try await TestServer("cursor-pad-bits")
        defer { Task { await server.stop() } }
        let marked = try cursorBytes(try await server.pull().decode(PullResponse.self).cursor)
        let issued = Data(marked.prefix(32)).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        let last = try #require(issued.last.flatMap { alphabet.firstIndex(of: $0) })
        #expect(last & 3 == 0, "an issued cursor's pad bits are zero")
        let forged = String(issued.dropLast()) + String(alphabet[last | 1])
        let reply = try await server.pull(cursor: forged)
        #expect(reply.status == 410 && reply.error?.error.code == .cursorInvalid, "\(reply.status)")
        #expect(try await server.pull(cursor: issued).status == 200)
    }

    /// Section 8: a cursor that names another server is 410, whatever
    /// else is true of it: also the start cursor of a user with no feed on
    /// either, which points where one of this server's could, and one of
    /// an earlier resync generation than this server's (410 comes before
    /// `force_resync`).
    @Test func aCursorFromAnotherServerIsInvalid() async throws {
        let first = try await TestServer("cursor-epoch-a")
        let second = try await TestServer("cursor-epoch-b")
        defer { Task { await first.stop(); await second.stop() } }
        _ = try await first.push([operation(.create, "t1", ["n": 1])])
        let cursor = try await first.pull().decode(PullResponse.self).cursor
        let start = try await first.pull(token: "bob-token").decode(PullResponse.self).cursor
        #expect(try await first.pull(cursor: start, token: "bob-token").status == 200)
        func expectInvalid(_ cursor: String, token: String = "alice-token", _ comment: Comment) async throws {
            let reply = try await second.pull(cursor: cursor, token: token)
            #expect(
                reply.status == 410 && reply.error?.error.code == .cursorInvalid,
                "\(comment): \(reply.status) \(String(decoding: reply.body, as: UTF8.self))")
        }
        try await expectInvalid(cursor, "a change's cursor")
        try await expectInvalid(start, token: "bob-token", "a start cursor")
        #expect(try await second.send("POST", "/v1/admin/resync", token: "admin-token").status == 200)
        try await expectInvalid(cursor, "a change's cursor, of an earlier generation")
        try await expectInvalid(start, token: "bob-token", "a start cursor, of an earlier generation")
    }

    /// Seeded garbage in every place a client controls: the server answers
    /// each with a 4xx envelope (or per-operation rejections), changes
    /// nothing, and keeps serving.
    @Test func garbageNeverCrashesOrChangesTheStore() async throws {
        let server = try await TestServer("garbage")
        defer { Task { await server.stop() } }
        _ = try await server.push([operation(.create, "kept", ["n": 1])])
        let seed = SeededRandom.seed(default: 404)
        var random = SeededRandom(seed: seed)
        let valid = try JSONEncoder().encode(PushRequest(operations: [operation(.update, "kept", ["n": 2], base: 1)]))
        var applied = 0
        for round in 0..<300 {
            var body = [UInt8](valid)
            switch Int.random(in: 0...3, using: &random) {
            case 0: flipBytes(&body, 1...8, &random)
            case 1: cutShort(&body, &random)
            case 2:  // random bytes
                body = (0..<Int.random(in: 0...200, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            default:  // wrong types in known places
                let wrong = ["\"operations\": 5", "\"operations\": [1, 2]", "\"operations\": [{\"intent\": 7}]",
                             "\"operations\": [{\"data\": {\"a\": {\"$bytes\": 1}}}]", "\"operations\": null"]
                body = Array("{\(wrong[Int.random(in: 0..<wrong.count, using: &random)])}".utf8)
            }
            let reply = try await server.send("POST", "/v1/push", body: Data(body))
            if reply.status == 200 {
                // Still a push (perhaps of garbage operations, each rejected
                // on its own): its answer decodes, one result per operation.
                let results = try reply.decode(PushResponse.self).results
                #expect(!results.isEmpty, "seed \(seed) round \(round)")
                applied += results.filter { $0.status == .applied }.count
            } else {
                #expect((400..<500).contains(reply.status), "seed \(seed) round \(round): \(reply.status)")
                #expect(reply.error != nil, "seed \(seed) round \(round): no envelope")
            }
            let query = String(decoding: (0..<Int.random(in: 0...60, using: &random)).map { _ in UInt8.random(in: 33...126, using: &random) }, as: UTF8.self)
            let pull = try await server.send("GET", "/v1/pull", query: ["cursor": query, "limit": query])
            #expect((400..<500).contains(pull.status), "seed \(seed) round \(round): pull \(pull.status)")
        }
        // Still serving, and the feed holds exactly what was answered applied.
        let changes = try await server.pullAll()
        #expect(changes.first?.entityID == "kept" && changes.count == 1 + applied)
        #expect(try await server.send("GET", "/v1/health", token: nil).status == 200)
    }
}

/// Sets `count` bytes at seeded places to seeded values.
private func flipBytes(_ bytes: inout [UInt8], _ count: ClosedRange<Int>, _ random: inout SeededRandom) {
    for _ in 0..<Int.random(in: count, using: &random) {
        bytes[Int.random(in: 0..<bytes.count, using: &random)] = UInt8.random(in: 0...255, using: &random)
    }
}

/// Drops a seeded number of bytes from the end, keeping at least one.
private func cutShort(_ bytes: inout [UInt8], _ random: inout SeededRandom) {
    bytes.removeLast(Int.random(in: 1..<bytes.count, using: &random))
}

/// The reference server's cursor (`Pull.swift`) without the server ID
/// its first 16 bytes hold (two servers have two IDs) and what follows the
/// position (the mark of the change it points after, whose checksum covers
/// when it was made, and the compaction count): the resync generation and
/// the position in the user's feed.
private func afterServerID(_ cursor: String) throws -> [UInt8] {
    let bytes = try cursorBytes(cursor)
    try #require(bytes.count == 41, "cursor \(cursor) is \(bytes.count) bytes")
    return Array(bytes[16..<32])
}

/// A cursor's bytes: its base64url decoded.
private func cursorBytes(_ cursor: String) throws -> [UInt8] {
    let standard = cursor.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    let padded = standard + String(repeating: "=", count: (4 - standard.count % 4) % 4)
    return Array(try #require(Data(base64Encoded: padded), "cursor \(cursor) is not base64url"))
}

/// `cursor` as the reference server issued it before marks: its first 32
/// bytes, without the mark and the compaction count after them.
private func unmarked(_ cursor: String) throws -> String {
    let bytes = try cursorBytes(cursor)
    try #require(bytes.count == 41, "cursor \(cursor) is \(bytes.count) bytes")
    return Data(bytes.prefix(32)).base64EncodedString()
        .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
}

/// Runs `body` on a new thread (it blocks in socket calls).
private func onAThreadOfItsOwn<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread { continuation.resume(with: Result { try body() }) }.start()
    }
}

/// The status codes of the answers in what `rawExchange` read, in order.
/// (A status line follows the body before it with no line break between.)
private func statuses(_ reply: String) -> [Int] {
    reply.components(separatedBy: "HTTP/1.1 ").dropFirst().compactMap { answer in
        // "HTTP/1.1 cannot parse" in a message is no status line.
        answer.count > 3 && answer.dropFirst(3).first == " " ? Int(answer.prefix(3)) : nil
    }
}

/// POSTs `count` copies of `chunk` with `Transfer-Encoding: chunked` (no
/// `Content-Length`) over a plain socket, and returns what the server
/// answered, as `rawExchange` does. A write the server refuses once it has
/// answered ends the sending early.
private func rawChunkedPost(port: Int, path: String, chunk: Data, count: Int) throws -> String {
    try rawExchange(port: port) { sendAll in
        let head = "POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer alice-token\r\n"
            + "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        var open = sendAll(Data(head.utf8))
        let framed = Data(String(chunk.count, radix: 16).utf8) + Data("\r\n".utf8) + chunk + Data("\r\n".utf8)
        for _ in 0..<count where open { open = sendAll(framed) }
        if open { _ = sendAll(Data("0\r\n\r\n".utf8)) }
    }
}

/// Connects to the server over a plain socket, lets `write` write to it
/// (its function returns false once a write fails), and returns what the
/// server answered (status lines, headers, bodies), read until it closes,
/// a timeout (`receiveTimeoutSeconds`: generous, as only a server that
/// fails the test is waited for so long), or (`untilClosed` false) the
/// first JSON body. With
/// `closeWriting`, the socket's sending side is shut once `write` returns,
/// so the server reads the end of the stream after what was sent.
private func rawExchange(
    port: Int, untilClosed: Bool = false, closeWriting: Bool = false, receiveTimeoutSeconds: Int = 60,
    onEnd: (_ closedByServer: Bool) -> Void = { _ in }, _ write: ((Data) -> Bool) -> Void
) throws -> String {
    String(
        decoding: try rawBytes(
            port: port, untilClosed: untilClosed, closeWriting: closeWriting, receiveTimeoutSeconds: receiveTimeoutSeconds,
            onEnd: onEnd, write),
        as: UTF8.self)
}

/// `rawExchange`'s bytes as the server sent them.
private func rawBytes(
    port: Int, untilClosed: Bool = false, closeWriting: Bool = false, receiveTimeoutSeconds: Int = 60,
    onEnd: (_ closedByServer: Bool) -> Void = { _ in }, _ write: ((Data) -> Bool) -> Void
) throws -> Data {
    let descriptor = try LoopbackSocket.make()
    defer { close(descriptor) }
    let connected = LoopbackSocket.withAddress(port: port) { connect(descriptor, $0, $1) }
    guard connected == 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
    var timeout = timeval(tv_sec: receiveTimeoutSeconds, tv_usec: 0)
    setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    // A write after the server closed must fail, not raise SIGPIPE.
    #if canImport(Glibc)
        let noSignal = Int32(MSG_NOSIGNAL)
    #else
        let noSignal: Int32 = 0
        var on: Int32 = 1
        setsockopt(descriptor, SOL_SOCKET, SO_NOSIGPIPE, &on, socklen_t(MemoryLayout<Int32>.size))
    #endif
    write { data in
        data.withUnsafeBytes { raw in
            var sent = 0
            while sent < raw.count {
                let n = send(descriptor, raw.baseAddress! + sent, raw.count - sent, noSignal)
                if n <= 0 { return false }
                sent += n
            }
            return true
        }
    }
    if closeWriting { shutdown(descriptor, Int32(SHUT_WR)) }
    var reply = Data()
    var buffer = [UInt8](repeating: 0, count: 16 * 1024)
    while true {
        let n = recv(descriptor, &buffer, buffer.count, 0)
        if n <= 0 {
            // 0: the server closed the connection; -1: the receive timed out.
            onEnd(n == 0)
            break
        }
        reply.append(contentsOf: buffer[0..<n])
        if !untilClosed, let text = String(data: reply, encoding: .utf8), text.contains("\r\n\r\n"), text.contains("}") { break }
    }
    return reply
}

/// Sends `head` at once, then `body` one byte per `pause`, stopping when a
/// send fails (the server closed the connection); returns whether every
/// byte was sent, and what the server answered, read until it closes.
private func trickle(port: Int, head: Data, body: Data, pause: Duration) throws -> (sentWhole: Bool, reply: String) {
    var open = false
    let reply = try rawExchange(port: port, untilClosed: true) { sendAll in
        open = sendAll(head)
        for byte in body where open {
            Thread.sleep(forTimeInterval: Double(pause / .milliseconds(1)) / 1_000)
            open = sendAll(Data([byte]))
        }
    }
    return (open, reply)
}

/// Sends `data` on a new connection and reads until the server closes it
/// (true) or 30 s pass with it open (false).
private func closedByServer(port: Int, sending data: Data) throws -> Bool {
    var closed = false
    _ = try rawExchange(port: port, untilClosed: true, receiveTimeoutSeconds: 30, onEnd: { closed = $0 }) { sendAll in _ = sendAll(data) }
    return closed
}

extension ProtocolErrorTests {
    /// A push or faults body in a content coding other than gzip is
    /// answered 415 UNSUPPORTED_MEDIA_TYPE with `Accept-Encoding: gzip`
    /// (RFC 9110 section 15.5.16), and nothing is applied: the header was
    /// ignored, so a compressed body failed to parse (400, which blamed its
    /// JSON) and one sent as it is under a coding's name was applied.
    /// `identity` is the body as it is; a body that says gzip and is not
    /// is a 400.
    @Test func aContentEncodedBodyIsAnsweredUnsupportedMediaType() async throws {
        let server = try await TestServer("content-encoding")
        defer { Task { await server.stop() } }
        let body = try JSONEncoder().encode(PushRequest(operations: [operation(.create, "t1", [:])]))
        for coding in ["br", "identity, br", "deflate", "gzip, gzip", "gzip, br"] {
            let reply = try await server.send("POST", "/v1/push", body: body, headers: ["Content-Encoding": coding])
            #expect(reply.status == 415 && reply.error?.error.code == .unsupportedMediaType, "\(coding): \(String(decoding: reply.body, as: UTF8.self))")
            #expect(reply.error?.error.retryable == false)
            #expect(reply.headers["accept-encoding"] == "gzip" && reply.headers["sync-protocol-version"] == "1", "\(reply.headers)")
        }
        for coding in ["gzip", "GZIP", "x-gzip"] {
            let reply = try await server.send("POST", "/v1/push", body: body, headers: ["Content-Encoding": coding])
            #expect(reply.status == 400 && reply.error?.error.code == .validationError, "\(coding)")
            #expect(reply.error?.error.message.contains("not gzip") == true, "\(coding): \(String(decoding: reply.body, as: UTF8.self))")
        }
        let faults = try await server.send("POST", "/v1/admin/faults", token: "admin-token", body: Data("{}".utf8), headers: ["Content-Encoding": "br"])
        #expect(faults.status == 415 && faults.error?.error.code == .unsupportedMediaType)
        #expect(try await server.pullAll().isEmpty, "a refused push applies nothing")
        let identity = try await server.send("POST", "/v1/push", body: body, headers: ["Content-Encoding": "identity"])
        #expect(identity.status == 200, "\(String(decoding: identity.body, as: UTF8.self))")
    }

    /// A push (or faults) body in gzip is inflated and served as the body
    /// it inflates to, within the request limit counted both ways: one that
    /// inflates past `requestBodyBytesMax` (a few kilobytes of gzip can
    /// hold gigabytes) is 413, and gzip cut short or followed by other
    /// bytes is a 400. The health answer says the server takes gzip.
    @Test func aBodyInGzipIsInflatedWithinTheLimit() async throws {
        let server = try await TestServer("content-gzip")
        defer { Task { await server.stop() } }
        #expect(try await server.send("GET", "/v1/health").decode(HealthResponse.self).requestCodings == ["gzip"])
        func gzip(_ data: Data) throws -> Data { try #require(Gzip.compress(data)) }
        let operations = (0..<20).map { operation(.create, "t\($0)", ["title": .string("Task \($0)")]) }
        let body = try JSONEncoder().encode(PushRequest(operations: operations))
        let pushed = try await server.send("POST", "/v1/push", body: try gzip(body), headers: ["Content-Encoding": "gzip"])
        #expect(pushed.status == 200, "\(String(decoding: pushed.body, as: UTF8.self))")
        #expect(try pushed.decode(PushResponse.self).results.allSatisfy { $0.status == .applied })
        #expect(try await server.pullAll().count == 20)

        // Valid JSON, padded past the limit with spaces: 4 MiB of them take 4 KiB in gzip.
        let padded = Data(#"{"operations": []}"#.utf8) + Data(repeating: UInt8(ascii: " "), count: Wire.requestBodyBytesMax)
        let bomb = try await server.send("POST", "/v1/push", body: try gzip(padded), headers: ["Content-Encoding": "gzip"])
        #expect(bomb.status == 413 && bomb.error?.error.code == .payloadTooLarge, "\(String(decoding: bomb.body, as: UTF8.self))")
        let one = try JSONEncoder().encode(PushRequest(operations: [operation(.create, "at-the-limit", [:])]))
        let atTheLimit = one + Data(repeating: UInt8(ascii: " "), count: Wire.requestBodyBytesMax - one.count)
        let taken = try await server.send("POST", "/v1/push", body: try gzip(atTheLimit), headers: ["Content-Encoding": "gzip"])
        #expect(taken.status == 200, "\(String(decoding: taken.body, as: UTF8.self))")
        #expect(try taken.decode(PushResponse.self).results.map(\.status) == [.applied])

        let whole = try gzip(body)
        for (name, damaged) in [("cut short", whole.prefix(whole.count - 9)), ("followed by more", whole + Data("{}".utf8))] {
            let reply = try await server.send("POST", "/v1/push", body: Data(damaged), headers: ["Content-Encoding": "gzip"])
            #expect(reply.status == 400 && reply.error?.error.code == .validationError, "\(name): \(String(decoding: reply.body, as: UTF8.self))")
        }
        let faults = try await server.send(
            "POST", "/v1/admin/faults", token: "admin-token", body: try gzip(Data("{}".utf8)), headers: ["Content-Encoding": "gzip"])
        #expect(faults.status == 200, "\(String(decoding: faults.body, as: UTF8.self))")
        #expect(try await server.pullAll().count == 21, "a refused push applies nothing")
    }
}

/// gzip of answers (`Format/sync-protocol.md` section 2, "Bodies"), read
/// off the wire: the bytes the server sent, not what a client's HTTP
/// library made of them (URLSession asks for gzip itself, and inflates).
@Suite struct ResponseCompressionTests {
    /// One request on its own connection (read on a thread of its own, off
    /// the pool the server's handlers run on): the head's fields (names in
    /// lower case) and the body, as sent.
    static func exchange(_ server: TestServer, _ path: String, headers: [String] = []) async throws
        -> (fields: [String: String], body: Data)
    {
        let head = (["GET \(path) HTTP/1.1", "Host: localhost", "Authorization: Bearer alice-token", "Connection: close"] + headers)
            .joined(separator: "\r\n") + "\r\n\r\n"
        let port = server.port
        let reply = try await onAThreadOfItsOwn {
            try rawBytes(port: port, untilClosed: true) { sendAll in _ = sendAll(Data(head.utf8)) }
        }
        let end = try #require(reply.firstRange(of: Data("\r\n\r\n".utf8)))
        var fields: [String: String] = [:]
        for line in String(decoding: reply[..<end.lowerBound], as: UTF8.self).split(separator: "\r\n").dropFirst() {
            let parts = line.split(separator: ":", maxSplits: 1)
            fields[parts[0].lowercased()] = parts.count == 2 ? parts[1].trimmingCharacters(in: .whitespaces) : ""
        }
        let body = Data(reply[end.upperBound...])
        #expect(fields["content-length"] == String(body.count), "\(path) \(headers)")
        return (fields, body)
    }

    /// A server with a feed whose first page is several kilobytes of JSON.
    static func serverWithAFeed(_ name: String, gzipLevel: Int = 1) async throws -> TestServer {
        let server = try await TestServer(name)
        if gzipLevel != 1 {
            var configuration = server.configuration
            configuration.gzipLevel = gzipLevel
            server.configuration = configuration
            try await server.restart()
        }
        let operations = (0..<40).map { operation(.create, "t\($0)", ["title": .string("Task \($0) of the list"), "done": false]) }
        #expect(try await server.push(operations).status == 200)
        return server
    }


    /// A pulled page is gzipped for exactly the `Accept-Encoding` values
    /// that accept gzip (RFC 9110 section 12.5.3: a name in any case,
    /// `x-gzip`, a weight above 0, or `*` when gzip is not named), and
    /// inflates to the page sent as it is; every answer says it varies with
    /// `Accept-Encoding`.
    @Test func aPageIsGzippedForClientsThatAcceptIt() async throws {
        let server = try await Self.serverWithAFeed("gzip-accept")
        defer { Task { await server.stop() } }
        let plain = try await Self.exchange(server, "/v1/pull?limit=100")
        #expect(plain.fields["content-encoding"] == nil && plain.fields["vary"] == "Accept-Encoding")
        #expect(try JSONDecoder().decode(PullResponse.self, from: plain.body).changes.count == 40)
        let cases: [(accept: [String], gzip: Bool)] = [
            (["Accept-Encoding: gzip"], true), (["Accept-Encoding: GZip"], true), (["Accept-Encoding: x-gzip"], true),
            (["Accept-Encoding: deflate, gzip;q=0.5"], true), (["Accept-Encoding: br", "Accept-Encoding: gzip"], true),
            (["Accept-Encoding: *"], true), (["Accept-Encoding: gzip ; q=1.000"], true),
            (["Accept-Encoding: gzip;q=0"], false), (["Accept-Encoding: gzip;q=0.000, *"], false), (["Accept-Encoding: *;q=0"], false),
            (["Accept-Encoding: identity"], false), (["Accept-Encoding: br, deflate"], false), (["Accept-Encoding: gzip;q=1.5"], false),
            (["Accept-Encoding: gzip;q=0.0001"], false), (["Accept-Encoding: "], false),
        ]
        for item in cases {
            let answer = try await Self.exchange(server, "/v1/pull?limit=100", headers: item.accept)
            #expect(answer.fields["vary"] == "Accept-Encoding", "\(item.accept)")
            if item.gzip {
                #expect(answer.fields["content-encoding"] == "gzip", "\(item.accept)")
                #expect(try GzipTool.decompress(answer.body) == plain.body, "\(item.accept)")
                #expect(answer.body.count * 4 < plain.body.count, "\(answer.body.count) of \(plain.body.count) bytes")
            } else {
                #expect(answer.fields["content-encoding"] == nil && answer.body == plain.body, "\(item.accept)")
            }
        }
    }

    /// A body under 1 KiB (health, a page of one change) goes as it is.
    @Test func aSmallBodyGoesAsItIs() async throws {
        let server = try await Self.serverWithAFeed("gzip-small")
        defer { Task { await server.stop() } }
        for path in ["/v1/health", "/v1/pull?limit=1"] {
            let answer = try await Self.exchange(server, path, headers: ["Accept-Encoding: gzip"])
            #expect(answer.fields["content-encoding"] == nil && answer.body.count < 1_024, "\(path)")
            #expect(answer.body.first == UInt8(ascii: "{"), "\(path)")
        }
    }

    /// Level 0 sends every body as it is, and says nothing of
    /// `Accept-Encoding`; level 9 gzips, and a level out of 0...9 is refused.
    @Test func theLevelIsTheOperators() async throws {
        let off = try await Self.serverWithAFeed("gzip-off", gzipLevel: 0)
        let answer = try await Self.exchange(off, "/v1/pull?limit=100", headers: ["Accept-Encoding: gzip"])
        #expect(answer.fields["content-encoding"] == nil && answer.fields["vary"] == nil)
        await off.stop()
        let best = try await Self.serverWithAFeed("gzip-best", gzipLevel: 9)
        let smallest = try await Self.exchange(best, "/v1/pull?limit=100", headers: ["Accept-Encoding: gzip"])
        #expect(smallest.fields["content-encoding"] == "gzip")
        let sameAsItIs = try await Self.exchange(best, "/v1/pull?limit=100").body
        #expect(try GzipTool.decompress(smallest.body) == sameAsItIs)
        await best.stop()
        for level in [-1, 10] {
            var configuration = SyncServer.Configuration(dataDirectory: "/nonexistent")
            configuration.gzipLevel = level
            #expect {
                try SyncServer(configuration: configuration)
            } throws: { error in
                "\(error)" == "sync server configuration: gzipLevel must be 0...9, not \(level)"
            }
        }
    }
}
