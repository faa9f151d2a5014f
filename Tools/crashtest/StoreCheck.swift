import Foundation
import LogFormat
import LogStore

/// The checks after every kill that hold for every store workload.
enum StoreCheck {
    /// Reopens the store writable (which must work), checks that the outbox
    /// holds exactly the unanswered intents and the workload's promises,
    /// closes it, and runs `Store.verify` (what `logtool verify` runs).
    static func afterCrash<Recipe: StoreWorkload>(
        _: Recipe.Type, directory: String, ledger: Ledger, _ context: inout IterationContext
    ) async {
        let store: Store
        do {
            store = try Store(path: directory, options: .init(durability: context.options.durability))
        } catch {
            context.violation("the store at \(directory) does not reopen: \(error)")
            return
        }
        do {
            let log = try readLog(store)
            outboxHoldsTheUnansweredIntents(store, log: log, &context)
            context.tally.checks += try Recipe.check(ledger, store, log: log, &context)
        } catch {
            context.violation("reading the reopened store at \(directory) failed: \(error)")
        }
        store.close()
        await verify(directory, &context)
    }

    /// Every entry of the log, decoded and checked.
    static func readLog(_ store: Store) throws -> [Entry] {
        var entries: [Entry] = []
        var scanner = store.log.entries()
        // Bounded by the log's length.
        while let entry = try scanner.next() { entries.append(entry) }
        return entries
    }

    /// Every entity of `type` the app sees, page by page.
    static func entities(_ store: Store, type: String) throws -> [Entity] {
        var all: [Entity] = []
        var after: String?
        // Each page moves past its last id, so this ends with the table.
        while true {
            let page = try store.all(type: type, after: after, limit: Store.pageCountMax)
            all += page
            guard let last = page.last, page.count == Store.pageCountMax else { return all }
            after = last.id
        }
    }

    /// `Store.verify`: checksums, dense offsets, and every derived table
    /// equal to a replay of the log.
    static func verify(_ path: String, _ context: inout IterationContext) async {
        let scratch = (context.options.directory as NSString).appendingPathComponent("verify-scratch")
        do {
            let report = try await Store.verify(path: path, scratchDirectory: scratch)
            for problem in report.problems { context.violation("verify \(path): \(problem)") }
        } catch {
            context.violation("verify cannot read the store at \(path): \(error)")
        }
    }

    /// The most differences of one kind reported per check; one is enough
    /// to fail, a few help to see the pattern.
    static let differencesShownMax = 5

    /// The outbox must hold exactly the intents of the log that no ack or
    /// reject answers. (Compaction removes an intent only together with its
    /// answer, so this holds for a compacted log too.)
    static func outboxHoldsTheUnansweredIntents(_ store: Store, log: [Entry], _ context: inout IterationContext) {
        var intents = Set<UInt64>()
        var answered = Set<UInt64>()
        for entry in log {
            switch entry.body {
            case .intent: intents.insert(entry.offset)
            case .ack(let ack): answered.insert(ack.intentOffset)
            case .reject(let reject): answered.insert(reject.intentOffset)
            default: break
            }
        }
        let expected = intents.subtracting(answered)
        let outbox: Set<UInt64>
        do {
            outbox = Set(try store.outbox().map(\.offset))
        } catch {
            return context.violation("the outbox of \(store.path) cannot be read: \(error)")
        }
        for offset in expected.subtracting(outbox).sorted().prefix(differencesShownMax) {
            context.violation("outbox: the intent at offset \(offset) has no answer in the log but is not in the outbox")
        }
        for offset in outbox.subtracting(expected).sorted().prefix(differencesShownMax) {
            let why = intents.contains(offset) ? "the log answers that intent" : "the log has no intent there"
            context.violation("outbox: offset \(offset) is in the outbox, but \(why)")
        }
    }
}
