import Foundation
@testable import LogStore
import LogTesting
import Testing

/// Every value `stream` still holds, read once the store that feeds it has
/// closed (so the read ends): what a reader that never came back would have
/// cost in memory.
func drained<S: AsyncSequence>(_ stream: S) async -> [S.Element] where S.Failure == Never {
    var values: [S.Element] = []
    for await value in stream { values.append(value) }
    return values
}

/// Writes `count` intents and returns their offsets, in log order.
private func writeIntents(_ store: Store, count: Int) async throws -> [UInt64] {
    var batch = WriteBatch()
    for n in 0..<count { try batch.create(type: "te", id: "e\(n)", fields: [:]) }
    try await store.write(batch)
    return try store.outbox().map(\.offset)
}

/// Records a rejection of each of `offsets`, in one commit.
private func reject(_ offsets: some Collection<UInt64>, in store: Store) async throws {
    try await store.record(offsets.map { ($0, PushOutcome.rejected(code: "NO", message: "no")) })
}

/// The intents `events` reports rejected, in order, and `-count` for a
/// `.missed(count:)`.
private func rejectedOffsets(_ events: [StoreEvent]) -> [Int] {
    events.map { event in
        switch event {
        case .rejected(let rejected): Int(rejected.intentOffset)
        case .missed(let count): -count
        default: 0
        }
    }
}

@Suite struct StoreEventsTests {
    /// A `changes(type:)` stream that is never read while many commits
    /// happen holds one change, the last one of its type (not a later one
    /// of another type): it says that something changed, and a reader that
    /// falls behind reads the store.
    @Test func aChangesStreamNobodyReadsHoldsOneChange() async throws {
        let fixture = try StoreFixture("events-changes-unread")
        let store = fixture.store
        let changes = store.changes(type: "te")
        for n in 0..<500 {
            try await store.create(type: "te", id: "e\(n)", fields: [:])
            try await store.create(type: "other", id: "o\(n)", fields: [:])
        }
        let last = try store.log.lastOffset()
        store.close()
        let held = await drained(changes)
        #expect(held.count == 1, "\(held.count) changes held")
        #expect(held.last == StoreChange(entityType: "te", offset: last - 1))
    }

    /// So does `intentCommits()`, the scheduler's "local write" signal.
    @Test func anIntentCommitsStreamNobodyReadsHoldsOneOffset() async throws {
        let fixture = try StoreFixture("events-intents-unread")
        let store = fixture.store
        let intents = store.intentCommits()
        for n in 0..<500 { try await store.create(type: "te", id: "e\(n)", fields: [:]) }
        let last = try store.log.lastOffset()
        store.close()
        let held = await drained(intents)
        #expect(held.count == 1, "\(held.count) offsets held")
        #expect(held.last == last)
    }

    /// An `events()` stream that is never read holds the first
    /// `eventBufferCountMax` events, then counts the rest in one `.missed`.
    @Test func anEventsStreamNobodyReadsHoldsABoundedNumber() async throws {
        let fixture = try StoreFixture("events-unread")
        let store = fixture.store
        let events = store.events()
        let offsets = try await writeIntents(store, count: Store.eventBufferCountMax + 76)
        try await reject(offsets, in: store)
        store.close()
        let held = await drained(events)
        #expect(held.count == Store.eventBufferCountMax + 1, "\(held.count) events held")
        #expect(rejectedOffsets(held) == offsets.prefix(Store.eventBufferCountMax).map { Int($0) } + [-76])
    }

    /// A reader that falls behind and catches up reads the events it was
    /// given, then `.missed` where the dropped ones were, then every later
    /// event: the gap is where it happened, and nothing after it is lost.
    @Test func aReaderThatCatchesUpReadsEveryEventAfterTheGap() async throws {
        let fixture = try StoreFixture("events-catch-up")
        let store = fixture.store
        let events = store.events()
        let countMax = Store.eventBufferCountMax
        let offsets = try await writeIntents(store, count: countMax + 100)
        try await reject(offsets.prefix(countMax + 30), in: store)
        var iterator = events.makeAsyncIterator()
        var read: [StoreEvent] = []
        for _ in 0..<countMax + 1 { read.append(try #require(await iterator.next())) }
        try await reject(offsets.dropFirst(countMax + 30), in: store)
        store.close()
        while let event = await iterator.next() { read.append(event) }
        let expected = offsets.prefix(countMax).map { Int($0) } + [-30] + offsets.dropFirst(countMax + 30).map { Int($0) }
        #expect(rejectedOffsets(read) == expected)
    }

    /// A stream whose reader is cancelled, or that is dropped unread, gives
    /// up its place: subscribers that come and go leave nothing behind.
    @Test func cancelledAndDroppedStreamsAreUnregistered() async throws {
        let fixture = try StoreFixture("events-unregister")
        let store = fixture.store
        let readers = (0..<50).map { _ in
            let changes = store.changes(type: "te")
            let events = store.events()
            let intents = store.intentCommits()
            return Task {
                for await _ in changes {}
                for await _ in events {}
                for await _ in intents {}
            }
        }
        try await store.create(type: "te", fields: [:])
        #expect(store.changeFeed.subscriberCount == 50)
        for reader in readers { reader.cancel() }
        for reader in readers { await reader.value }
        for _ in 0..<50 {
            _ = store.changes(type: "te")
            _ = store.events()
            _ = store.intentCommits()
        }
        #expect(store.changeFeed.subscriberCount == 0)
        #expect(store.eventFeed.subscriberCount == 0)
        #expect(store.intentFeed.subscriberCount == 0)
        store.close()
    }

    /// A pulled page that changes no record (a stale change, and one that
    /// repeats the base the store has) is no change to its type: the
    /// `remote` rule of `Format/storage.md` section 15 leaves R unchanged,
    /// so the app has nothing to read again.
    @Test func aPulledPageThatChangesNoRecordIsNoChangeToItsType() async throws {
        let fixture = try StoreFixture("events-stale-page")
        let store = fixture.store
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 2, fields: ["a": 1])], cursor: "c1")
        let changes = store.changes(type: "te")
        try await store.applyPulledPage(
            [
                PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1, fields: ["a": 0]),
                PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 2, fields: ["a": 1]),
            ], cursor: "c2")
        #expect(try store.pullCursor() == "c2")
        #expect(try store.get(type: "te", id: "x")?.fields == ["a": 1])
        store.close()
        #expect(await drained(changes).isEmpty)
    }

    /// A resync is a change to every type with a record: it forgets the
    /// bases (`Format/storage.md` section 15, `resync`), so an entity that
    /// existed through its base alone is gone for the app, which must read
    /// the type again.
    @Test func aResyncIsAChangeToTheTypesOfItsRecords() async throws {
        let fixture = try StoreFixture("events-resync")
        let store = fixture.store
        let id = try await store.create(type: "te", fields: ["n": 1])
        try await store.record([(try #require(try store.outbox().first?.offset), .acknowledged(.applied, serverVersion: 1))])
        let changes = store.changes(type: "te")
        try await store.resync(reason: "test")
        let resyncAt = try store.log.lastOffset()
        #expect(try store.get(type: "te", id: id) == nil)
        store.close()
        #expect(await drained(changes) == [StoreChange(entityType: "te", offset: resyncAt)])
    }
}
