import Foundation
@testable import LogStore
import LogTesting
import Testing

@Suite struct StoreEventsTests {
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
}
