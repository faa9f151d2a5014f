import CLMDB
import Foundation

extension Environment {
    /// Reads every page of every table in `data.mdb` with `pread` and
    /// checks its structure: the header, the node offsets and sizes, keys
    /// in order within the bounds the branch above sets, child and overflow
    /// page numbers in the file, every leaf at the tree's depth, each
    /// table's page and entry counts as its record states them, and every
    /// page in use by exactly one table or free (as LMDB's own audit counts
    /// them).
    ///
    /// LMDB checks none of this as it reads: it follows page numbers and
    /// sizes through its map of the file, and damage there (a flipped bit,
    /// a page overwritten) can read past the map and kill the process. This
    /// reads no page through the map, so damage is a problem to report.
    /// It reads one read transaction's snapshot, which keeps a writer (in
    /// this process or another) from reusing its pages meanwhile. It costs
    /// a read of every page in use.
    public func checkPages(problemCountMax: Int = 100) throws -> PageCheckReport {
        // A writer that commits twice between the read's start and the
        // reading of its meta page writes over that page: begin again.
        for _ in 0..<Self.pageCheckAttemptsMax {
            if let report = try read({ txn in try checkPages(txn, problemCountMax: problemCountMax) }) { return report }
        }
        return .unread("the meta page of each read transaction was written over before it could be read, \(Self.pageCheckAttemptsMax) times")
    }

    static let pageCheckAttemptsMax = 5

    /// How many of a page check's problems `pageProblemsInBrief` names.
    static let pageProblemsShownMax = 3

    /// `checkPages`' first problems on one line, for an error that refuses
    /// an open (`logtool verify` lists them all); nil when it finds none.
    public func pageProblemsInBrief() throws -> String? {
        let report = try checkPages(problemCountMax: Self.pageProblemsShownMax + 1)
        return report.problems.isEmpty ? nil : report.problemsInBrief(countMax: Self.pageProblemsShownMax)
    }

    /// `checkPages` in the snapshot of `txn`; nil when the meta page it
    /// began from is no longer in the file.
    private func checkPages(_ txn: borrowing Transaction, problemCountMax: Int) throws -> PageCheckReport? {
        let reader = try Environment.dataFileReader(handle, path: path)
        return PageWalk.check(reader, transactionID: UInt64(mdb_txn_id(txn.handle)), problemCountMax: problemCountMax)
    }
}
