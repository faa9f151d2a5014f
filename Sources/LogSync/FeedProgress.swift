/// Notices a server whose pages go round in circles, so that a pull run
/// fails instead of pulling the same changes until the page bound.
///
/// A cursor names a place in the feed, and a page with `has_more` holds at
/// least one change, so each cursor of a run's chain points further than
/// the one before (`Format/sync-protocol.md` section 8): the client never
/// orders cursors, but one that comes back again means no progress. The
/// check compares each returned cursor with the one it was pulled from (a
/// server that answers with the same cursor) and with one saved cursor,
/// moved up at the 1st, 2nd, 4th, 8th, ... page (Brent's cycle finding): a
/// cycle of any length, such as a cursor that goes back, is found within
/// about twice its length plus the pages before it, in constant memory.
struct FeedProgress {
    private var saved: String?
    private var pages: UInt64 = 0
    private var nextSave: UInt64 = 1

    /// Whether `cursor`, returned with `has_more` by a page pulled from
    /// `sent`, was returned before in this chain.
    mutating func isRepeated(_ cursor: String, pulledFrom sent: String?) -> Bool {
        if cursor == sent || cursor == saved { return true }
        pages += 1
        if pages == nextSave {
            saved = cursor
            nextSave *= 2
        }
        return false
    }

    /// A new chain starts (a full resync forgot the cursor).
    mutating func restart() { self = FeedProgress() }
}
