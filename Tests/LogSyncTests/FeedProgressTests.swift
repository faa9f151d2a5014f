import Testing

@testable import LogSync

/// `FeedProgress` finds a chain of cursors that comes back to one it
/// returned before, whatever the cycle's length and wherever it starts, and
/// never takes a chain of new cursors for one.
@Suite struct FeedProgressTests {
    /// The page at which a server whose cursors run `lead` new ones, then
    /// go round a cycle of `cycle` cursors, is found out; nil if never
    /// within `pagesMax`.
    static func pagesUntilFound(lead: Int, cycle: Int, pagesMax: Int) -> Int? {
        var progress = FeedProgress()
        var sent: String?
        for page in 1...pagesMax {
            let cursor = page <= lead + cycle ? "c\(page)" : "c\(lead + 1 + (page - lead - 1) % cycle)"
            if progress.isRepeated(cursor, pulledFrom: sent) { return page }
            sent = cursor
        }
        return nil
    }

    @Test(arguments: [(0, 1), (0, 2), (3, 1), (5, 2), (7, 13), (100, 37), (1_000, 1_000)])
    func aCycleIsFoundWithinAboutTwiceItsLengthAfterItsStart(lead: Int, cycle: Int) throws {
        let found = try #require(Self.pagesUntilFound(lead: lead, cycle: cycle, pagesMax: 10_000))
        #expect(found > lead + cycle)
        #expect(found <= 2 * (lead + cycle) + cycle + 1, "found at page \(found)")
    }

    @Test func newCursorsAreNeverTakenForACycle() {
        #expect(Self.pagesUntilFound(lead: 100_000, cycle: 1, pagesMax: 100_000) == nil)
    }

    @Test func aRestartForgetsTheChain() {
        var progress = FeedProgress()
        let first = progress.isRepeated("c1", pulledFrom: nil)
        progress.restart()
        // After a full resync the feed is read again from its start, with
        // cursors a server may have issued before.
        let again = progress.isRepeated("c1", pulledFrom: nil)
        let same = progress.isRepeated("c1", pulledFrom: "c1")
        #expect(!first && !again && same)
    }
}
