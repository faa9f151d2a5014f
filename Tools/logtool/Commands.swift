import ArgumentParser
import Foundation
import LogFormat
import LogStore

struct Stat: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Counts by kind, offset range, outbox, cursor, projections, format, file size and the size of each table.")

    @OptionGroup var store: StoreOptions

    struct Report: Encodable {
        var path: String
        var firstOffset: UInt64?
        var lastOffset: UInt64
        var entries: Int
        var kinds: [String: Int]
        var compactedBelow: UInt64
        var entryFormatVersion: Int
        var storeFormatVersion: UInt32
        var fileBytes: Int
        var mapBytes: Int
        var mapUsedBytes: Int
        var projectionVersion: UInt32?
        var projectionWatermark: UInt64?
        var projections: String
        /// The intents in the outbox: pending, or failed (waiting for the
        /// app's `retryFailed`), of which there are `outboxFailed`.
        var outbox: Int?
        var outboxFailed: Int?
        var oldestPendingSeconds: Double?
        var cursor: String?
        /// Each table's keys and the bytes of its pages; empty when the
        /// projections are stale (the store cannot be read then).
        var tables: [Table] = []

        struct Table: Encodable {
            var name: String
            var entries: Int
            var bytes: Int
            var depth: Int
        }

        enum CodingKeys: String, CodingKey {
            case path, entries, kinds, cursor, outbox, projections, tables
            case firstOffset = "first_offset", lastOffset = "last_offset", compactedBelow = "compacted_below"
            case entryFormatVersion = "entry_format_version", storeFormatVersion = "store_format_version"
            case fileBytes = "file_bytes", mapBytes = "map_bytes", mapUsedBytes = "map_used_bytes"
            case projectionVersion = "projection_version", projectionWatermark = "projection_watermark"
            case outboxFailed = "outbox_failed", oldestPendingSeconds = "oldest_pending_seconds"
        }
    }

    func run() throws {
        let log = try store.openLog()
        var report = Report(
            path: log.path, lastOffset: try log.lastOffset(), entries: 0, kinds: [:], compactedBelow: 0,
            entryFormatVersion: Int(EntryCodec.formatVersion), storeFormatVersion: EventLog.storeFormatVersion,
            fileBytes: (try? FileManager.default.attributesOfItem(atPath: log.path + "/data.mdb")[.size] as? Int) ?? 0,
            mapBytes: log.mapUsage().mapSize, mapUsedBytes: log.mapUsage().usedBytes, projections: "current")
        // Up to the last offset read above: a writer in another process may
        // append while the scan runs, and the counts must match the range.
        var scanner = log.entries(through: report.lastOffset)
        while let entry = try scanner.next() {
            if report.firstOffset == nil { report.firstOffset = entry.offset }
            report.entries += 1
            report.kinds[entry.kind.description, default: 0] += 1
        }
        // The log's own: the projections may be stale, and the store unopenable.
        report.compactedBelow = try log.compactedBelow()
        log.close()
        do {
            let opened = try store.openStore()
            defer { opened.close() }
            let state = try opened.projectionState()
            report.projectionVersion = state.version
            report.projectionWatermark = state.watermark
            let outbox = try opened.outbox()
            report.outbox = outbox.count
            report.outboxFailed = outbox.count(where: { $0.state.status == .failed })
            if let oldest = outbox.first(where: { $0.state.status == .pending }) {
                report.oldestPendingSeconds = max(0, Date().timeIntervalSince1970 - Double(oldest.timestamp.milliseconds) / 1000)
            }
            report.cursor = try opened.pullCursor()
            report.tables = try opened.tableStatistics().map {
                Report.Table(name: $0.name, entries: $0.statistics.entries, bytes: $0.statistics.bytes, depth: $0.statistics.depth)
            }
        } catch let error as LogStoreError where error.code == .projectionsStale {
            report.projections = "stale: \(error.detail)"
        }
        if store.json { return try Output.line(report) }
        print("store       \(report.path)")
        print("format      entries v\(report.entryFormatVersion), store v\(report.storeFormatVersion)")
        print("offsets     \(report.firstOffset.map(String.init) ?? "-")...\(report.lastOffset) (\(report.entries) entries; compacted below \(report.compactedBelow))")
        print("kinds       " + report.kinds.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))
        print("projections \(report.projections) (version \(report.projectionVersion.map(String.init) ?? "-"), watermark \(report.projectionWatermark.map(String.init) ?? "-"))")
        let failed = report.outboxFailed ?? 0
        let outbox = report.outbox.map { "\($0 - failed) pending, \(failed) failed" } ?? "-"
        print("outbox      \(outbox)" + (report.oldestPendingSeconds.map { String(format: ", oldest pending %.0f s old", $0) } ?? ""))
        print("cursor      \(report.cursor ?? "none")")
        print("file        \(report.fileBytes) bytes; map \(report.mapUsedBytes) of \(report.mapBytes) bytes used")
        let nameWidth = report.tables.map(\.name.count).max() ?? 0
        for table in report.tables {
            let name = table.name.padding(toLength: nameWidth, withPad: " ", startingAt: 0)
            print("table       \(name)  \(table.entries) key\(table.entries == 1 ? "" : "s"), \(table.bytes) bytes in pages")
        }
    }
}

struct Dump: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print entries, oldest first, with filters.")

    @OptionGroup var store: StoreOptions
    /// Nil when not given: a store with no entries dumps as nothing, but an
    /// offset given past the end is named, as `show` names one.
    @Option(parsing: .unconditional, help: "The first offset (default: 1).") var from: UInt64?
    @Option(parsing: .unconditional, help: "The last offset.") var to: UInt64?
    @Option(help: "Only entries of this kind (intent, ack, reject, remote, conflict, resync, snapshot).") var kind: String?
    @Option(help: "Only entries about this entity type.") var type: String?
    @Option(help: "Only entries about this entity id.") var id: String?
    @Option(parsing: .unconditional, help: "At most this many entries.") var limit: Int?

    func validate() throws {
        if let kind, EntryKind(name: kind) == nil { throw ValidationError("--kind \(kind) is not a kind") }
        // No entry names an entity so (every writer checks its names): a
        // mistyped `--type TE` printed nothing, status 0, as if none matched.
        if let type, let problem = NameRules.entityTypeProblem(type) { throw ValidationError("--type: \(problem)") }
        if let id, let problem = NameRules.entityIDProblem(id) { throw ValidationError("--id: \(problem)") }
        if let limit, limit < 0 { throw ValidationError("--limit must be 0 or more") }
        if let to, to < from ?? 1 { throw ValidationError("--to is before --from") }
    }

    func run() throws {
        let log = try store.openLog()
        defer { log.close() }
        // Printing nothing with status 0 said that no entry matched the
        // filters, where the offset was the mistake.
        if let from, from > (try log.lastOffset()) {
            throw LogToolError("no entry at --from \(from) or after it (\(try log.endInWords()))")
        }
        var scanner = log.entries(from: from ?? 1, through: to)
        var printed = 0
        let wanted = kind.flatMap(EntryKind.init(name:))
        while printed < (limit ?? Int.max), let entry = try scanner.next() {
            if let wanted, entry.kind != wanted { continue }
            if type != nil || id != nil {
                // By bytes, as the store tells entities apart (`EntityName`).
                guard let entity = entry.entity, type.map({ $0.utf8.elementsEqual(entity.type.utf8) }) ?? true,
                    id.map({ $0.utf8.elementsEqual(entity.id.utf8) }) ?? true
                else { continue }
            }
            try printEntry(entry, json: store.json)
            printed += 1
        }
    }
}

func printEntry(_ entry: Entry, json: Bool) throws {
    if json { return try Output.line(EntryJSON(entry: entry)) }
    print("\(Value.iso8601(microseconds: Int64(entry.timestamp.milliseconds) * 1000))  \(entry)")
}

struct Show: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the entries at the offsets given, in that order.")

    @OptionGroup var store: StoreOptions
    /// Every word the parser leaves over, so that a negative number reaches
    /// the offset's own check: it takes "-1" for an option name, and a
    /// plain positional argument said "Missing expected argument
    /// '<offset>'" of an offset the user had given. Words, not numbers, so
    /// that `validate()` can tell a mistyped option from a bad offset.
    @Argument(parsing: .allUnrecognized, help: "The offsets (they start at 1).") var offset: [String]

    /// A word that is not an offset: a mistyped option (a dash and a
    /// letter; "-1" is a negative number) is named as the parser names an
    /// unknown option, with the nearest of the store options; a store's
    /// directory after an offset as the two swapped; any other as the
    /// parser names a value it cannot read.
    func validate() throws {
        for word in offset where UInt64(word) == nil {
            var isDirectory: ObjCBool = false
            if UInt64(store.path) != nil, FileManager.default.fileExists(atPath: word, isDirectory: &isDirectory), isDirectory.boolValue {
                throw ValidationError("'\(word)' is a directory and '\(store.path)' an offset: the store comes first (logtool show \(word) \(store.path))")
            }
            if word.hasPrefix("-"), let second = word.dropFirst().first, second == "-" || second.isLetter {
                do {
                    _ = try StoreOptions.parse([store.path, word])
                } catch {
                    throw ValidationError(StoreOptions.message(for: error))
                }
            }
            throw ValidationError("The value '\(word)' is invalid for '<offset>'")
        }
    }

    func run() throws {
        let log = try store.openLog()
        defer { log.close() }
        // All found before any is printed: a missing one prints nothing.
        let entries = try offset.compactMap(UInt64.init).map { offset in
            guard let entry = try log.entry(at: offset) else {
                // Below the compaction watermark a missing entry is a hole
                // compaction left, not an offset past the end.
                let compactedBelow = try log.compactedBelow()
                let why = offset == 0 ? "offsets start at 1"
                    : offset < compactedBelow
                    ? "compaction below \(compactedBelow) removed it" : try log.endInWords()
                throw LogToolError("no entry at offset \(offset) (\(why))")
            }
            return entry
        }
        for entry in entries { try printEntry(entry, json: store.json) }
    }
}

struct Entities: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the entities of a type as the app sees them, or one of them.")

    @OptionGroup var store: StoreOptions
    @Argument(help: "The entity type.") var type: String
    @Argument(help: "One entity's id.") var id: String?

    /// An id no entity can have (an empty one: an unset variable) was
    /// answered "no te/", as if it named one that is missing.
    func validate() throws {
        if let id, let problem = NameRules.entityIDProblem(id) { throw ValidationError("the id: \(problem)") }
    }

    struct Row: Encodable {
        var type: String
        var id: String
        var fields: Fields
        var serverVersion: UInt64
        var pendingIntents: Int
        enum CodingKeys: String, CodingKey {
            case type, id, fields
            case serverVersion = "server_version", pendingIntents = "pending_intents"
        }
    }

    func run() throws {
        let opened = try store.openStore()
        defer { opened.close() }
        var entities: [Entity] = []
        if let id {
            guard let entity = try opened.get(type: type, id: id) else { throw LogToolError("no \(type)/\(id)") }
            entities = [entity]
        } else {
            // Every page from one snapshot: an app writing meanwhile cannot
            // make the listing mix two commits.
            let types: [String]
            (entities, types) = try opened.read { snapshot in
                let entities = try Entities.all(type, in: snapshot)
                return (entities, entities.isEmpty ? try snapshot.entityTypes() : [])
            }
            if entities.isEmpty {
                // An empty listing is an answer, but a mistyped type gives
                // one too: say which types have entities, on stderr.
                let listed = types.isEmpty ? "none has any" : "those with entities: \(types.joined(separator: ", "))"
                FileHandle.standardError.write(Data("logtool entities: no entities of type \(type) (\(listed))\n".utf8))
            }
        }
        for entity in entities {
            let row = Row(type: entity.type, id: entity.id, fields: entity.fields, serverVersion: entity.serverVersion, pendingIntents: entity.pendingIntentCount)
            if store.json { try Output.line(row) } else { print("\(Value.printable(row.id))  v\(row.serverVersion)\(row.pendingIntents > 0 ? " +\(row.pendingIntents) pending" : "")  \(row.fields)") }
        }
    }
}

extension Entities {
    /// Every entity of `type` the app sees, page by page (bounded by the
    /// entity count).
    static func all(_ type: String, in snapshot: borrowing StoreSnapshot) throws -> [Entity] {
        var entities: [Entity] = []
        var after: String?
        while true {
            let page = try snapshot.all(type: type, after: after, limit: Store.pageCountMax)
            entities += page
            guard page.count == Store.pageCountMax, let last = page.last else { return entities }
            after = last.id
        }
    }
}

struct Outbox: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the pending intents, oldest first, with their attempt state.")

    @OptionGroup var store: StoreOptions

    struct Row: Encodable {
        var offset: UInt64
        var status: String
        var attempts: UInt32
        var nextAttemptAt: UInt64
        var lastError: String
        var entry: EntryJSON
        enum CodingKeys: String, CodingKey {
            case offset, status, attempts, entry
            case nextAttemptAt = "next_attempt_at", lastError = "last_error"
        }
    }

    func run() throws {
        let opened = try store.openStore()
        defer { opened.close() }
        for pending in try opened.outbox() {
            let entry = Entry(offset: pending.offset, timestamp: pending.timestamp, body: .intent(pending.intent))
            let status = pending.state.status == .pending ? "pending" : "failed"
            if store.json {
                try Output.line(Row(offset: pending.offset, status: status, attempts: pending.state.attempts, nextAttemptAt: pending.state.nextAttemptAt, lastError: pending.state.lastError, entry: EntryJSON(entry: entry)))
            } else {
                let error = pending.state.lastError.isEmpty ? "" : "  last error: \(Value.printable(pending.state.lastError))"
                print("#\(pending.offset)  \(status), \(pending.state.attempts) attempts  \(pending.intent.operation) \(Value.printable(pending.intent.entityType))/\(Value.printable(pending.intent.entityID))\(error)")
            }
        }
    }
}

struct Cursors: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the pull cursor and the projection watermark.")

    @OptionGroup var store: StoreOptions

    /// The watermark a JSON number, as every `u64` the tool prints.
    struct Row: Encodable {
        var pull: String
        var projectionWatermark: UInt64
        enum CodingKeys: String, CodingKey {
            case pull
            case projectionWatermark = "projection_watermark"
        }
    }

    func run() throws {
        let opened = try store.openStore()
        defer { opened.close() }
        let cursor = try opened.pullCursor()
        let state = try opened.projectionState()
        if store.json {
            try Output.line(Row(pull: cursor ?? "", projectionWatermark: state.watermark))
        } else {
            print("pull                  \(cursor ?? "none")")
            print("projection watermark  \(state.watermark)")
        }
    }
}

struct Verify: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check every page's structure, every entry's checksum, that offsets are dense, and that every derived table equals a replay.",
        discussion: "Prints each problem with where it is, and exits 1 if there is any.")

    @OptionGroup var store: StoreOptions
    @Option(
        name: .customLong("scratch"),
        help: ArgumentHelp("The directory to make the scratch copy in (default: $TMPDIR); it needs room for a copy of the store.", valueName: "dir"))
    var scratchParent: String?

    /// A problem, its offset a JSON number (left out when it has none).
    struct Row: Encodable {
        var table: String
        var offset: UInt64?
        var message: String
    }

    func run() async throws {
        var isDirectory: ObjCBool = false
        if let scratchParent, !FileManager.default.fileExists(atPath: scratchParent, isDirectory: &isDirectory) || !isDirectory.boolValue {
            throw LogToolError("--scratch \(scratchParent) is not a directory")
        }
        let parent = scratchParent.map { $0 + "/" } ?? NSTemporaryDirectory()
        let scratch = parent + "logtool-verify-\(UUIDv7.Generator.shared.next().ulidString)"
        // Made here, so that a parent it cannot be made in (a $TMPDIR that
        // is not a directory, one without write permission) is named with
        // the reason, not as Foundation's error dump.
        guard mkdir(scratch, 0o700) == 0 else {
            let reason = String(cString: strerror(errno))
            throw LogToolError("cannot make the scratch directory \(scratch): \(reason) (--scratch DIR puts it elsewhere)")
        }
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let report = try await Store.verify(path: store.path, scratchDirectory: scratch)
        let (checked, problems) = (report.checked, report.problems)
        for problem in problems {
            if store.json {
                try Output.line(Row(table: problem.table, offset: problem.offset, message: problem.message))
            } else {
                print(problem)
            }
        }
        let summary = "\(checked) entries checked, \(problems.count) problem\(problems.count == 1 ? "" : "s")"
        FileHandle.standardError.write(Data("logtool verify: \(summary)\n".utf8))
        if !problems.isEmpty { throw ExitCode(1) }
    }
}

struct LogToolError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Runs `body` to fill the new directory `path` that a command writes its
/// result into (named by `option`): refused when it exists, made (in a
/// parent that must exist), and removed again when `body` fails, so a
/// failed command leaves nothing in the way of the next try.
func intoNewDirectory<R>(_ path: String, option: String, _ body: () async throws -> R) async throws -> R {
    // An unset variable (`--output "$DIR"`) was named as "cannot make : No
    // such file or directory", which says neither what nor where.
    guard !path.isEmpty else { throw LogToolError("\(option) is empty; it names a new directory") }
    guard !FileManager.default.fileExists(atPath: path) else {
        throw LogToolError("\(path) exists; \(option) names a new directory")
    }
    guard mkdir(path, 0o755) == 0 else { throw LogToolError("cannot make \(path): \(String(cString: strerror(errno)))") }
    do {
        return try await body()
    } catch {
        try? FileManager.default.removeItem(atPath: path)
        throw error
    }
}

struct Conflicts: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the conflicts waiting for the app (as Store.conflicts() lists them), or all with --all.")

    @OptionGroup var store: StoreOptions
    @Flag(help: "Every conflict entry in the log, resolved or not.") var all = false

    func run() throws {
        let opened = try store.openStore()
        defer { opened.close() }
        guard all else {
            // The conflict entries the `conflicts` table names, in its
            // order (by intent), not in the order they were written.
            for waiting in try opened.conflicts() {
                guard let entry = try opened.log.entry(at: waiting.offset) else {
                    throw LogToolError("no entry at offset \(waiting.offset), which the conflicts table names")
                }
                try printEntry(entry, json: store.json)
            }
            return
        }
        var scanner = opened.log.entries()
        while let entry = try scanner.next() {
            guard case .conflict = entry.body else { continue }
            try printEntry(entry, json: store.json)
        }
    }
}
