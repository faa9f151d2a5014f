import Foundation
import LMDB
import LogFormat
import LogStore
import LogTesting
import Testing

/// What `logtool`'s commands promise that a mutation pass over them found
/// no test holding them to: each test runs the built tool on real stores.
@Suite struct LogToolContractTests {
    /// A closed store of three intents on `te` (a, b, c) at offsets 1...3
    /// and a pulled `te/pulled` at 4, at `path`.
    private static func makeStore(at path: String) async throws {
        let store = try Store(path: path, options: .init(durability: .process))
        try await store.create(type: "te", id: "a", fields: ["n": 1])
        try await store.create(type: "te", id: "b", fields: ["n": 2])
        try await store.update(type: "te", id: "a", changes: ["n": 3])
        try await store.applyPulledPage(
            [PulledChange(.upsert, entityType: "te", entityID: "pulled", serverVersion: 1, fields: ["n": 4])], cursor: "c1")
        store.close()
    }

    /// The names in `directory` that start with `prefix`.
    private static func names(in directory: TemporaryDirectory, startingWith prefix: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasPrefix(prefix) }.sorted()
    }

    /// Imports `lines` (written to `file`) as the new store `copy`, and
    /// expects its entries to be `source`'s, as `dump --json` shows them.
    private static func expectImportedAsIs(_ lines: [String], file: String, copy: String, source: String) async throws {
        let imported = try await Tool.importLines(lines, file: file, into: copy)
        #expect(imported.status == 0, "\(imported.errors)")
        let dumped = try await Tool.run(["dump", source, "--json"]).output
        let dumpedCopy = try await Tool.run(["dump", copy, "--json"]).output
        #expect(!dumped.isEmpty && dumped == dumpedCopy)
    }

    /// `import` into a path that exists (a store, or an empty directory) is
    /// refused before the file is read, naming the path: nothing is built
    /// beside it, and the store there is left as it was.
    @Test func anImportIntoAnExistingPathIsRefusedAndChangesNothing() async throws {
        let directory = try TemporaryDirectory("logtool-contract-import-exists")
        let source = directory.appending("source")
        try await Self.makeStore(at: source)
        let file = directory.appending("export.jsonl")
        #expect(try await Tool.run(["export", source, "--output", file]).status == 0)
        let before = try await Tool.run(["dump", source, "--json"]).output
        let onStore = try await Tool.run(["import", file, source])
        #expect(onStore.status == 2 && onStore.errors == "logtool: \(source) exists; import makes a new store\n", "\(onStore.errors)")
        #expect(try await Tool.run(["dump", source, "--json"]).output == before)
        let empty = directory.appending("empty")
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: false)
        let onEmpty = try await Tool.run(["import", file, empty])
        #expect(onEmpty.status == 2 && onEmpty.errors == "logtool: \(empty) exists; import makes a new store\n", "\(onEmpty.errors)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: empty).isEmpty)
        #expect(try Self.names(in: directory, startingWith: "empty.") == [] && Self.names(in: directory, startingWith: "source.") == [])
    }

    /// An import the file itself stops (a line that does not parse, a file
    /// cut short, an entry past the header's end) leaves nothing behind:
    /// not the new store, and not the store it was building beside it.
    @Test func anImportRefusedByItsFileLeavesNoStagingDirectory() async throws {
        let directory = try TemporaryDirectory("logtool-contract-import-staging")
        let lines = LogToolExportTests.resyncExport(count: 3)
        let cases = [
            ("garbled.jsonl", lines.prefix(2) + ["{not json"] + lines.suffix(1), "garbled.jsonl:3: "),
            ("cut.jsonl", Array(lines.dropLast()), "the entries end at offset 2, the header says 3"),
            ("past.jsonl", LogToolExportTests.resyncExport(count: 3, last: 2), "past.jsonl:4: "),
        ]
        for (name, changed, message) in cases {
            let imported = try await Tool.importLines(changed, file: directory.appending(name), into: directory.appending("copy"))
            #expect(imported.status == 2 && imported.errors.contains(message), "\(name): \(imported.errors)")
            #expect(try Self.names(in: directory, startingWith: "copy") == [], "\(name)")
        }
    }

    /// An export that fails partway (a damaged entry) exits 2 naming the
    /// store and the offset, and leaves the file it was told to write as it
    /// was: no half export in its place, and no partial file beside it.
    @Test func aFailedExportLeavesTheOutputFileAsItWas() async throws {
        let directory = try TemporaryDirectory("logtool-contract-export-failed")
        let source = directory.appending("source")
        try await Self.makeStore(at: source)
        try Tool.damageEntry(at: 2, inStore: source)
        let file = directory.appending("export.jsonl")
        try "an older export\n".write(toFile: file, atomically: true, encoding: .utf8)
        let exported = try await Tool.run(["export", source, "--output", file])
        #expect(exported.status == 2 && exported.errors.contains(source) && exported.errors.contains("2"), "\(exported.errors)")
        #expect(try String(contentsOfFile: file, encoding: .utf8) == "an older export\n")
        #expect(try Self.names(in: directory, startingWith: "export.jsonl") == ["export.jsonl"])
        let fresh = directory.appending("fresh.jsonl")
        #expect(try await Tool.run(["export", source, "--output", fresh]).status == 2)
        #expect(try Self.names(in: directory, startingWith: "fresh") == [])
    }

    /// `export -o ""` (an unset variable) is refused before the log is
    /// read, naming the option: it wrote the whole log to a partial file in
    /// the working directory and then failed to rename it to "", naming
    /// only that file ("cannot rename .partial-N to : ...").
    @Test func anExportToAnEmptyOutputPathNamesTheOption() async throws {
        let directory = try TemporaryDirectory("logtool-contract-export-empty-output")
        let source = directory.appending("source")
        try await Self.makeStore(at: source)
        let exported = try await Tool.run(["export", source, "--output", ""])
        #expect(exported.status == 2 && exported.errors == "logtool: --output is empty; it names the file to write\n", "\(exported.errors)")
        #expect(exported.output.isEmpty)
    }

    /// An empty new directory (an unset variable) for `bundle --output`,
    /// `compact --copy` and `replay --output` is refused naming the
    /// option: it said only "cannot make : No such file or directory".
    @Test func anEmptyNewDirectoryOptionIsNamed() async throws {
        let directory = try TemporaryDirectory("logtool-contract-empty-new-directory")
        let source = directory.appending("source")
        try await Self.makeStore(at: source)
        let cases = [
            (["bundle", source, "--output", ""], "--output"),
            (["compact", source, "--copy", ""], "--copy"),
            (["replay", source, "--to", "2", "--output", ""], "--output"),
        ]
        for (arguments, option) in cases {
            let run = try await Tool.run(arguments)
            #expect(run.status == 2 && run.errors == "logtool: \(option) is empty; it names a new directory\n", "\(arguments): \(run.errors)")
        }
    }

    /// An empty store path (an unset variable) is a usage error that says
    /// which path is empty: the store's open said only "not a sync store:
    /// no such directory", naming no path, and import "cannot read : No
    /// such file or directory".
    @Test func anEmptyPathIsNamedAsEmpty() async throws {
        let directory = try TemporaryDirectory("logtool-contract-empty-path")
        let source = directory.appending("source")
        try await Self.makeStore(at: source)
        let cases = [
            (["stat", ""], "the store"), (["entities", "", "te"], "the store"), (["export", ""], "the store"),
            (["diff", "", source], "the first store"), (["diff", source, ""], "the second store"),
            (["import", "", directory.appending("new")], "the export file"),
        ]
        for (arguments, name) in cases {
            let run = try await Tool.run(arguments)
            #expect(run.status == 2 && run.errors.hasPrefix("Error: \(name)'s path is empty\n"), "\(arguments): \(run.errors)")
        }
    }

    /// `dump --type` or `--id` naming what no entity can be named (an upper
    /// case type, an empty id) is a usage error naming the option: it
    /// printed nothing, status 0, as if no entry matched.
    @Test func dumpRefusesATypeOrIDNoEntityCanHave() async throws {
        let directory = try TemporaryDirectory("logtool-contract-dump-names")
        let source = directory.appending("source")
        try await Self.makeStore(at: source)
        let cases = [(["--type", "TE"], "Error: --type: entity type \"TE\": "), (["--id", ""], "Error: --id: entity id must be 1 to 256 bytes")]
        for (arguments, message) in cases {
            let run = try await Tool.run(["dump", source] + arguments)
            #expect(run.status == 2 && run.errors.hasPrefix(message) && run.output.isEmpty, "\(arguments): \(run.errors)")
        }
        #expect(try await Tool.run(["dump", source, "--type", "te", "--id", "a", "--json"]).lines.count == 2)
    }

    /// `entities STORE TYPE ""` (an unset variable) is a usage error naming
    /// the id's rule: it said "no te/", as if it named an entity missing.
    @Test func entitiesRefusesAnIDNoEntityCanHave() async throws {
        let directory = try TemporaryDirectory("logtool-contract-entities-id")
        let source = directory.appending("source")
        try await Self.makeStore(at: source)
        let run = try await Tool.run(["entities", source, "te", ""])
        #expect(run.status == 2 && run.errors.hasPrefix("Error: the id: entity id must be 1 to 256 bytes") && run.output.isEmpty, "\(run.errors)")
        #expect(try await Tool.run(["entities", source, "te", "a", "--json"]).lines.count == 1)
    }

    /// `compact --below` reports every count of its report, in JSON and in
    /// text: the entries below the watermark before, and those it kept
    /// there (a pending intent), beside what it removed and wrote.
    @Test func compactReportsTheEntriesBeforeAndKept() async throws {
        let directory = try TemporaryDirectory("logtool-contract-compact-report")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "mine", fields: [:])  // 1, stays pending
            try await store.applyPulledPage(
                (0..<6).map { PulledChange(.upsert, entityType: "te", entityID: "e\($0 % 2)", serverVersion: UInt64($0 + 1), fields: ["n": .int(Int64($0))]) },
                cursor: "c")  // 2...7
            store.close()
        }
        let dry = try #require(try await Tool.run(["compact", directory.path, "--below", "7", "--dry-run", "--json"]).objects().first)
        #expect(dry["watermark"] as? Int == 7 && dry["entries_before"] as? Int == 6, "\(dry)")
        #expect(dry["entries_removed"] as? Int == 5 && dry["entries_kept"] as? Int == 1 && dry["snapshots_written"] as? Int == 2, "\(dry)")
        let done = try await Tool.run(["compact", directory.path, "--below", "7"])
        #expect(done.status == 0 && done.output == "below #7: 6 entries; removed 5, wrote 2 snapshots, kept 1\n", "\(done.output)")
    }

    /// `compact --copy` writes a compacted copy: after an in-place
    /// compaction has freed pages, the copy's file is smaller than the
    /// store's, and it holds the same entities.
    @Test func aCompactedCopyLeavesTheFreePagesOut() async throws {
        let directory = try TemporaryDirectory("logtool-contract-compact-copy")
        let path = directory.appending("store")
        do {
            let store = try Store(path: path, options: .init(durability: .process))
            let text = String(repeating: "x", count: 2_000)
            try await store.applyPulledPage(
                (0..<400).map { PulledChange(.upsert, entityType: "te", entityID: "e\($0 % 4)", serverVersion: UInt64($0 + 1), fields: ["text": .string(text)]) },
                cursor: "c")
            _ = try await store.compact(below: 400)
            store.close()
        }
        let copy = directory.appending("copy")
        let copied = try #require(try await Tool.run(["compact", path, "--copy", copy, "--json"]).objects().first)
        let before = try #require(copied["bytes_before"] as? Int)
        let after = try #require(copied["bytes_after"] as? Int)
        #expect(after < before, "\(copied)")
        #expect(try await Tool.run(["diff", path, copy]).status == 0)
    }

    /// `replay --to` takes offsets 1 to the log's last: 0 is refused as
    /// outside the log, and the last gives the store's own state.
    @Test func replayToTakesTheWholeLogAndNoMore() async throws {
        let directory = try TemporaryDirectory("logtool-contract-replay-bounds")
        let path = directory.appending("store")
        try await Self.makeStore(at: path)
        let zero = directory.appending("zero")
        let refused = try await Tool.run(["replay", path, "--to", "0", "--output", zero])
        #expect(refused.status == 2 && refused.errors.contains("--to 0 is outside the log (1...4)"), "\(refused.output)\(refused.errors)")
        #expect(!FileManager.default.fileExists(atPath: zero))
        let last = directory.appending("last")
        let replayed = try await Tool.run(["replay", path, "--to", "4", "--output", last])
        #expect(replayed.status == 0, "\(replayed.errors)")
        let diff = try await Tool.run(["diff", path, last])
        #expect(diff.status == 0 && diff.errors.contains("3 and 3 entities, 0 differ"), "\(diff.errors)")
        #expect(try await Tool.run(["cursors", last]).lines == ["pull                  c1", "projection watermark  4"])
    }

    /// `--to` without `--output` (or the other way round) is a usage error:
    /// the store is not replayed in place as if `--to` were not given.
    @Test func replayToWithoutOutputIsRefused() async throws {
        let directory = try TemporaryDirectory("logtool-contract-replay-usage")
        let path = directory.appending("store")
        try await Self.makeStore(at: path)
        for arguments in [["--to", "2"], ["--output", directory.appending("out")]] {
            let run = try await Tool.run(["replay", path] + arguments)
            #expect(run.status == 2 && run.errors.contains("--to and --output go together"), "\(arguments): \(run.errors)")
            #expect(run.output.isEmpty, "\(arguments): \(run.output)")
        }
        #expect(!FileManager.default.fileExists(atPath: directory.appending("out")))
    }

    /// `diff` says which store an entity is only in, and reports an entity
    /// in both whose fields differ, with both versions of its fields; it
    /// exits 1 when anything differs.
    @Test func diffNamesWhereAndHowEachEntityDiffers() async throws {
        let directory = try TemporaryDirectory("logtool-contract-diff")
        let (first, second) = (directory.appending("first"), directory.appending("second"))
        do {
            let store = try Store(path: first, options: .init(durability: .process))
            try await store.create(type: "te", id: "both", fields: ["n": 1])
            try await store.create(type: "te", id: "only-first", fields: [:])
            store.close()
        }
        do {
            let store = try Store(path: second, options: .init(durability: .process))
            try await store.create(type: "te", id: "both", fields: ["n": 2])
            try await store.create(type: "te", id: "only-second", fields: [:])
            store.close()
        }
        let json = try await Tool.run(["diff", first, second, "--json"])
        #expect(json.status == 1, "\(json.errors)")
        let rows = try json.objects().map { "\($0["entity"] as? String ?? "?"): \($0["difference"] as? String ?? "?")" }
        #expect(rows == ["te/both: differs", "te/only-first: only in \(first)", "te/only-second: only in \(second)"], "\(rows)")
        let text = try await Tool.run(["diff", first, second])
        #expect(text.status == 1 && text.errors.contains("2 and 2 entities, 3 differ"), "\(text.errors)")
        #expect(text.lines.first == "te/both: differs" && text.lines.count == 5, "\(text.output)")
        #expect(text.lines.dropFirst().first?.contains("1") == true && text.lines.dropFirst(2).first?.contains("2") == true, "\(text.output)")
    }

    /// `dump --id` and `dump --type` each filter alone: the entries about
    /// that id (of any type and kind), or about that type.
    @Test func dumpFiltersByIdOrTypeAlone() async throws {
        let directory = try TemporaryDirectory("logtool-contract-dump-filters")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])  // 1
            try await store.create(type: "tf", id: "a", fields: [:])  // 2
            try await store.create(type: "te", id: "b", fields: [:])  // 3
            try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 1, fields: [:])], cursor: "c")  // 4
            store.close()
        }
        let offsets = { (arguments: [String]) in try await Tool.run(["dump", directory.path, "--json"] + arguments).objects().map { $0["offset"] as? Int } }
        #expect(try await offsets(["--id", "a"]) == [1, 2, 4])
        #expect(try await offsets(["--type", "te"]) == [1, 3, 4])
        #expect(try await offsets(["--type", "te", "--id", "a"]) == [1, 4])
    }

    /// `entities TYPE ID` of an entity the store does not have is an error
    /// naming it (exit 2), not an empty answer.
    @Test func entitiesOfAMissingIdIsAnError() async throws {
        let directory = try TemporaryDirectory("logtool-contract-entities-missing")
        try await Self.makeStore(at: directory.path)
        let run = try await Tool.run(["entities", directory.path, "te", "zz"])
        #expect(run.status == 2 && run.errors == "logtool: no te/zz\n" && run.output.isEmpty, "\(run.errors)")
        let found = try await Tool.run(["entities", directory.path, "te", "a", "--json"]).objects()
        #expect(found.count == 1 && (found.first?["fields"] as? [String: Any])?["n"] as? Int == 3 && found.first?["pending_intents"] as? Int == 2)
    }

    /// A directory a command is to make (`compact --copy`, `replay
    /// --output`) that exists is named as such, and what it holds stays.
    @Test func aNewDirectoryThatExistsIsNamedAndKept() async throws {
        let directory = try TemporaryDirectory("logtool-contract-new-directory")
        let path = directory.appending("store")
        try await Self.makeStore(at: path)
        let existing = directory.appending("existing")
        try FileManager.default.createDirectory(atPath: existing, withIntermediateDirectories: false)
        try "keep me".write(toFile: existing + "/note", atomically: true, encoding: .utf8)
        let cases = [
            (["compact", path, "--copy", existing], "logtool: \(existing) exists; --copy names a new directory\n"),
            (["replay", path, "--to", "2", "--output", existing], "logtool: \(existing) exists; --output names a new directory\n"),
        ]
        for (arguments, message) in cases {
            let run = try await Tool.run(arguments)
            #expect(run.status == 2 && run.errors == message, "\(arguments): \(run.errors)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: existing) == ["note"], "\(arguments)")
        }
    }

    /// Every kind of entry, in each of its variants, survives `export` then
    /// `import` exactly: a delete intent, a duplicate ack, a reject, a
    /// conflict with the server's deletion and one resolved with merged
    /// fields, a deleted snapshot. An ack whose outcome is not one the
    /// format has is refused, naming its line and the field.
    @Test func everyVariantOfEveryKindRoundTrips() async throws {
        let directory = try TemporaryDirectory("logtool-contract-round-trip")
        let source = directory.appending("source")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            try await store.applyPulledPage(
                [
                    PulledChange(.upsert, entityType: "te", entityID: "x", serverVersion: 1, fields: ["n": 1]),
                    PulledChange(.delete, entityType: "te", entityID: "x", serverVersion: 2),
                    PulledChange(.upsert, entityType: "te", entityID: "y", serverVersion: 3, fields: ["n": 3]),
                ], cursor: "c1")
            _ = try await store.compact(below: 3)
            try await store.create(type: "te", id: "a", fields: ["n": 1])
            try await store.create(type: "te", id: "b", fields: ["n": 2])
            try await store.create(type: "te", id: "c", fields: ["n": 3])
            try await store.delete(type: "te", id: "a")
            let pending = try store.outbox().map(\.offset)
            let (a, b, c) = (pending[0], pending[1], pending[2])
            try await store.record([(a, .acknowledged(.duplicate, serverVersion: 1))])
            try await store.record([(b, .rejected(code: "VALIDATION_ERROR", message: "too long"))])
            try await store.record([(c, .conflict(ServerState(serverVersion: 4, deleted: true, data: [:]), message: "gone"))])
            try await store.resolveConflict(intentOffset: c, .merged(["n": 9]))
            try await store.resync(reason: "test")
            store.close()
        }
        let lines = try await Tool.run(["export", source]).lines
        for variant in [
            #""operation":"delete","time""#, #""outcome":"duplicate""#, #""kind":"reject""#, #""server_deleted":true"#,
            #""resolution":"merged""#, #""deleted":true"#, #""kind":"resync""#,
        ] {
            #expect(lines.contains { $0.contains(variant) }, "no line has \(variant): \(lines)")
        }
        let copy = directory.appending("copy")
        try await Self.expectImportedAsIs(lines, file: directory.appending("export.jsonl"), copy: copy, source: source)
        #expect(try await Tool.run(["diff", source, copy]).status == 0)
        #expect(try await Tool.run(["verify", copy]).status == 0)

        let index = try #require(lines.firstIndex { $0.contains(#""outcome":"duplicate""#) })
        var damaged = lines
        damaged[index] = damaged[index].replacingOccurrences(of: #""outcome":"duplicate""#, with: #""outcome":"twice""#)
        let refused = try await Tool.importLines(damaged, file: directory.appending("outcome.jsonl"), into: directory.appending("refused"))
        #expect(refused.status == 2 && refused.errors.contains("outcome.jsonl:\(index + 1): ") && refused.errors.contains("outcome"), "\(refused.errors)")
        #expect(!FileManager.default.fileExists(atPath: directory.appending("refused")))
    }

    /// `outbox --json` gives each intent's attempts and last error, as the
    /// text listing does.
    @Test func outboxJSONGivesAttemptsAndTheLastError() async throws {
        let directory = try TemporaryDirectory("logtool-contract-outbox")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            try await store.create(type: "te", id: "b", fields: [:])
            try await store.markFailed(offsets: [1], error: "permanent")
            store.close()
        }
        let rows = try await Tool.run(["outbox", directory.path, "--json"]).objects()
        #expect(rows.map { $0["attempts"] as? Int } == [1, 0], "\(rows)")
        #expect(rows.map { $0["last_error"] as? String } == ["permanent", ""], "\(rows)")
    }

    /// The text listing of `entities` marks an entity's pending intents
    /// only when it has some.
    @Test func entitiesTextMarksPendingIntentsOnlyWhenThereAreSome() async throws {
        let directory = try TemporaryDirectory("logtool-contract-entities-text")
        try await Self.makeStore(at: directory.path)
        let run = try await Tool.run(["entities", directory.path, "te"])
        #expect(run.status == 0 && run.lines == ["a  v0 +2 pending  [n: 3]", "b  v0 +1 pending  [n: 2]", "pulled  v1  [n: 4]"], "\(run.output)")
    }

    /// A hand-written export may leave a boolean out (`deleted`,
    /// `server_deleted`: false) and write a `u64` as `-0` (0): both import,
    /// as the values they stand for.
    @Test func anImportReadsAnOmittedBooleanAsFalseAndMinusZeroAsZero() async throws {
        let directory = try TemporaryDirectory("logtool-contract-import-forms")
        let lines = [
            #"{"compacted_below":2,"entry_format":1,"format":"syncstore-export","last_offset":3,"version":1}"#,
            #"{"kind":"snapshot","offset":1,"timestamp":65536,"watermark":2,"cursor":"c","entity_type":"te","entity_id":"b","server_version":1,"fields":{}}"#,
            #"{"kind":"intent","offset":2,"timestamp":131072,"operation":"create","idempotency_key":"k1","entity_type":"te","entity_id":"a","base_version":-0,"fields":{}}"#,
            #"{"kind":"conflict","offset":3,"timestamp":196608,"intent_offset":2,"entity_type":"te","entity_id":"a","server_version":2,"server_fields":{},"resolution":"pending","resolved_fields":{}}"#,
        ]
        let store = directory.appending("store")
        let imported = try await Tool.importLines(lines, file: directory.appending("forms.jsonl"), into: store)
        #expect(imported.status == 0, "\(imported.errors)")
        let entries = try await Tool.run(["dump", store, "--json"]).objects()
        #expect(entries.count == 3)
        #expect(entries.first?["deleted"] as? Bool == false && entries.last?["server_deleted"] as? Bool == false, "\(entries)")
        #expect(entries.dropFirst().first?["base_version"] as? Int == 0, "\(entries)")
    }

    /// `dump` (text and `--json`) and `export` name a conflict's resolution as the
    /// format does (Format/README.md, entries.json: "keep_local",
    /// "keep_remote"), and `import` reads those names. They wrote Swift's
    /// case names ("keepLocal"), which no other reader of the format knows,
    /// and refused an export that named them as the format does. An export
    /// written so before still imports.
    @Test func conflictResolutionsAreNamedAsTheFormatNamesThem() async throws {
        let directory = try TemporaryDirectory("logtool-contract-resolutions")
        let source = directory.appending("source")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: ["n": 1])
            try await store.create(type: "te", id: "b", fields: ["n": 1])
            let pending = try store.outbox().map(\.offset)
            for offset in pending {
                try await store.record([(offset, .conflict(ServerState(serverVersion: 5, deleted: false, data: ["n": 5]), message: "newer"))])
            }
            try await store.resolveConflict(intentOffset: pending[0], .keepLocal)
            try await store.resolveConflict(intentOffset: pending[1], .keepRemote)
            store.close()
        }
        let dumped = try await Tool.run(["dump", source, "--kind", "conflict", "--json"])
        let resolutions = try dumped.objects().map { $0["resolution"] as? String ?? "?" }
        #expect(resolutions.contains("keep_local") && resolutions.contains("keep_remote"), "\(resolutions)")
        #expect(!dumped.output.contains("keepLocal") && !dumped.output.contains("keepRemote"), "\(dumped.output)")
        // The text listing names them so too.
        let text = try await Tool.run(["dump", source, "--kind", "conflict"]).output
        #expect(text.contains("server v5 keep_local") && text.contains("server v5 keep_remote"), "\(text)")
        let lines = try await Tool.run(["export", source]).lines
        #expect(lines.contains { $0.contains(#""resolution":"keep_local""#) }, "\(lines)")
        try await Self.expectImportedAsIs(lines, file: directory.appending("export.jsonl"), copy: directory.appending("copy"), source: source)
        let older = lines.map {
            $0.replacingOccurrences(of: #""resolution":"keep_local""#, with: #""resolution":"keepLocal""#)
                .replacingOccurrences(of: #""resolution":"keep_remote""#, with: #""resolution":"keepRemote""#)
        }
        #expect(older != lines)
        try await Self.expectImportedAsIs(older, file: directory.appending("older.jsonl"), copy: directory.appending("older"), source: source)
    }

    /// `cursors` of a store that has never pulled says so, in text ("none")
    /// and in JSON (an empty cursor).
    @Test func cursorsOfAStoreThatNeverPulledSaysNone() async throws {
        let directory = try TemporaryDirectory("logtool-contract-cursors")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            store.close()
        }
        let text = try await Tool.run(["cursors", directory.path])
        #expect(text.status == 0 && text.lines == ["pull                  none", "projection watermark  1"], "\(text.output)")
        let json = try await Tool.run(["cursors", directory.path, "--json"]).objects()
        #expect(json.first?["pull"] as? String == "" && json.first?["projection_watermark"] as? Int == 1, "\(json)")
    }
}
