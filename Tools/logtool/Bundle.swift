import ArgumentParser
import Foundation
import LMDB
import LogFormat
import LogStore
import ToolSupport

struct Bundle: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Write a trimmed copy of a store for a bug report: the log's tail and the entities it touches.",
        discussion: """
            The copy keeps the last --tail entries as they are (offsets and all). Below them it keeps only what \
            those entries need: the touched entities' confirmed state (as snapshots), their pending intents and \
            the intents the tail answers, and a resync the compaction kept (it names no entity and holds no data). \
            Everything else is left out, so the bundle holds no unrelated data.
            """)

    @OptionGroup var store: StoreOptions
    @Option(parsing: .unconditional, help: "How many of the last entries to keep.") var tail = 1000
    @Option(name: .shortAndLong, help: ArgumentHelp("The new directory to write.", valueName: "dir")) var output: String

    func validate() throws {
        guard tail >= 1 else { throw ValidationError("--tail must be at least 1") }
    }

    func run() async throws {
        try await intoNewDirectory(output, option: "--output") { try await writeBundle() }
    }

    private func writeBundle() async throws {
        let source: String
        let first: UInt64
        let ending: String
        do {
            let log = try store.openLog()
            defer { log.close() }
            source = log.path
            ending = try log.endInWords()
            // --tail is at least 1, so there is always a first offset.
            guard let start = try log.startOfLast(tail) else { preconditionFailure("--tail 0 passed validate()") }
            first = start
            try log.copy(to: output, compact: true)
        }
        let report: Report
        do {
            report = try await trimCopy(keepingFrom: first)
        } catch var error as LogStoreError where error.code == .corruptEntry || error.code == .gap {
            // The copy holds the store's entries byte for byte, under their
            // offsets: damage met in it is the store's, at the same offset.
            // The store is what needs looking at; the copy is removed.
            error.path = source
            throw error
        }
        if store.json { return try Output.line(report) }
        guard let firstOffset = report.firstOffset else { return print("bundled no entries into \(output): \(ending)") }
        print("bundled offsets \(firstOffset)...\(report.lastOffset) and \(report.entities) entit\(report.entities == 1 ? "y" : "ies") into \(output)")
    }

    /// Trims the copy at `output` to the entries from `first` on and what
    /// they need, and rebuilds its projections.
    private func trimCopy(keepingFrom first: UInt64) async throws -> Report {
        // Fold what lies below the tail, then find what the tail touches.
        var touched = Set<EntityName>()
        var dropped: [UInt64] = []
        do {
            MapFault.watch(storeAt: output)
            let copy = try Store(path: output, options: .init(durability: .process))
            defer { copy.close() }
            if first > 1 { _ = try await copy.compact(below: first) }
            var scanner = copy.log.entries(from: first)
            while let entry = try scanner.next() {
                if let entity = entry.entity { touched.insert(EntityName(type: entity.type, id: entity.id)) }
                switch entry.body {
                case .ack(let ack): try touch(ack.intentOffset, in: copy, &touched)
                case .reject(let reject): try touch(reject.intentOffset, in: copy, &touched)
                default: break
                }
            }
            // An entry that names no entity, a resync the compaction kept,
            // stays: it holds no data, and a kept ack before it gives its
            // entity a base that the resync must forget again on replay.
            var below = copy.log.entries(from: 1, through: first - 1)
            while first > 1, let entry = try below.next() {
                let entity = try entry.entity ?? referencedEntity(entry, in: copy)
                if entity.map({ !touched.contains(EntityName(type: $0.type, id: $0.id)) }) ?? false { dropped.append(entry.offset) }
            }
        }
        try dropEntries(dropped, at: output)
        let trimmed = try Store(path: output, options: .init(durability: .full))
        defer { trimmed.close() }
        try await trimmed.rebuildProjections()
        let last = try trimmed.log.lastOffset()
        // An empty store bundles as one: no tail, so no first offset.
        return Report(path: output, firstOffset: last == 0 ? nil : first, lastOffset: last, entities: touched.count)
    }

    /// What a bundle holds: the offsets of the tail it kept and how many
    /// entities that tail touches. No first offset (and last offset 0)
    /// when the store has no entries, as `stat` reports it.
    struct Report: Encodable {
        var path: String
        var firstOffset: UInt64?
        var lastOffset: UInt64
        var entities: Int
        enum CodingKeys: String, CodingKey {
            case path, entities
            case firstOffset = "first_offset", lastOffset = "last_offset"
        }
    }

    /// Adds the entity of the intent at `offset` (when it is still there).
    private func touch(_ offset: UInt64, in store: Store, _ touched: inout Set<EntityName>) throws {
        if let entity = try store.log.entry(at: offset)?.entity { touched.insert(EntityName(type: entity.type, id: entity.id)) }
    }

    /// The entity an answer below the tail is about, through its intent.
    private func referencedEntity(_ entry: Entry, in store: Store) throws -> (type: String, id: String)? {
        switch entry.body {
        case .ack(let ack): try store.log.entry(at: ack.intentOffset)?.entity
        case .reject(let reject): try store.log.entry(at: reject.intentOffset)?.entity
        default: nil
        }
    }

    /// Removes entries from the copy's log (all below its compaction
    /// watermark, where the log may have holes).
    private func dropEntries(_ offsets: [UInt64], at path: String) throws {
        guard !offsets.isEmpty else { return }
        let environment = try Environment(path: path)
        defer { environment.close() }
        guard let log = try environment.openDatabase("log", create: false) else { throw LogToolError("the copy has no log") }
        try environment.write { txn in
            for offset in offsets { try txn.delete(log, key: offset.bigEndianBytes) }
        }
    }
}
