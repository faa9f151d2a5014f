import Foundation
import LMDB
import LogFormat
import LogStore
import LogTesting
import Synchronization
import Testing

/// Runs the built `logtool` (and `demo`) as child processes, as people do.
enum Tool {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static func path(_ name: String) -> String { ToolRun.builtProduct(name, root: root) }

    /// Runs the tool to its end, waited for off the cooperative pool
    /// (`ToolRun.running`): the suite's tests all start at once on a pool
    /// of a thread per core, and a test blocked in a child's wait would
    /// hold one of them.
    static func run(_ arguments: [String], executable: String = "logtool") async throws -> ToolRun {
        try await ToolRun.running(path(executable), arguments)
    }

    /// Writes `lines` as the export file `file`, then imports it into the
    /// new store `store`.
    static func importLines(_ lines: some Sequence<String>, file: String, into store: String) async throws -> ToolRun {
        try (lines.joined(separator: "\n") + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        return try await run(["import", file, store])
    }

    /// The `export` lines of a new store at `source`, after `write` has
    /// made its log (the store is closed before the export).
    static func exportOfNewStore(at source: String, _ write: (Store) async throws -> Void) async throws -> [String] {
        let store = try Store(path: source, options: .init(durability: .process))
        try await write(store)
        store.close()
        return try await run(["export", source]).lines
    }

    /// Flips a bit of the last byte of the entry at `offset` in the closed
    /// store at `path`, through LMDB, so that its checksum fails.
    static func damageEntry(at offset: UInt64, inStore path: String) throws {
        let environment = try Environment(path: path)
        defer { environment.close() }
        let log = try #require(try environment.openDatabase("log", create: false))
        try environment.write { txn in
            var bytes = try #require(try txn.get(log, key: offset.bigEndianBytes))
            bytes[bytes.count - 1] ^= 0x01
            try txn.put(log, key: offset.bigEndianBytes, value: bytes)
        }
    }

    /// `run` as a user whom file permissions stop: nobody (by `setpriv`)
    /// when this process runs as root, whom they do not stop; this user
    /// otherwise.
    static func runUnprivileged(_ arguments: [String]) async throws -> ToolRun {
        guard geteuid() == 0 else { return try await run(arguments) }
        let setpriv = "/usr/bin/setpriv"
        try #require(FileManager.default.isExecutableFile(atPath: setpriv))
        return try await ToolRun.running(setpriv, ["--reuid=65534", "--regid=65534", "--clear-groups", path("logtool")] + arguments)
    }
}

extension ToolRun {
    /// Each output line parsed as a JSON object.
    func objects() throws -> [[String: Any]] {
        try lines.map { line in
            guard let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
                throw CocoaError(.fileReadCorruptFile)
            }
            return object
        }
    }
}

@Suite struct LogToolTests {
    /// A store with every common kind of entry: intents, an ack, a reject
    /// and pulled changes. Closed before the tool runs.
    private func makeStore(_ name: String) async throws -> TemporaryDirectory {
        let directory = try TemporaryDirectory(name)
        let store = try Store(path: directory.path, options: .init(durability: .process))
        try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "pulled", serverVersion: 1, fields: ["n": 1])], cursor: "c-1")
        try await store.create(type: "te", id: "a", fields: ["title": "CORRUPT-ME-42", "n": 1])
        try await store.update(type: "te", id: "a", changes: ["title": "fine"])
        try await store.create(type: "prj", id: "p", fields: ["name": "Sync"])
        let pending = try store.outbox()
        try await store.record([(pending[0].offset, .acknowledged(.applied, serverVersion: 1))])
        try await store.record([(pending[2].offset, .rejected(code: "VALIDATION_ERROR", message: "no"))])
        store.close()
        return directory
    }

    @Test func everyReadingCommandWorksAndItsJSONParses() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Tool.path("logtool")), "build the logtool product first")
        let directory = try await makeStore("logtool-commands")
        let path = directory.path

        let stat = try await Tool.run(["stat", path, "--json"])
        #expect(stat.status == 0, "\(stat.errors)")
        let report = try #require(try stat.objects().first)
        #expect(report["last_offset"] as? Int == 6 && report["entries"] as? Int == 6)
        #expect((report["kinds"] as? [String: Int]) == ["intent": 3, "ack": 1, "reject": 1, "remote": 1])
        #expect(report["outbox"] as? Int == 1 && report["cursor"] as? String == "c-1")
        #expect(try await Tool.run(["stat", path]).output.contains("offsets     1...6"))
        // Each table's keys: 6 entries, the 2 entities left (the rejected
        // create is gone), the 1 pending intent, 3 idempotency keys, 1 type,
        // and the acked change, which no pull has shown.
        let tables = try #require(report["tables"] as? [[String: Any]])
        #expect(
            tables.map { $0["name"] as? String }
                == ["log", "meta", "entities", "outbox", "idempotency", "counts", "conflicts", "awaited-feed"])
        let keys = Dictionary(uniqueKeysWithValues: tables.map { ($0["name"] as? String ?? "", $0["entries"] as? Int ?? -1) })
        #expect(keys["log"] == 6 && keys["entities"] == 2 && keys["outbox"] == 1 && keys["idempotency"] == 3 && keys["counts"] == 1)
        #expect(keys["awaited-feed"] == 1)
        for table in tables {
            let bytes = try #require(table["bytes"] as? Int)
            let entries = try #require(table["entries"] as? Int)
            // Whole pages, and none for an empty table.
            #expect(bytes % 4096 == 0 && (bytes > 0) == (entries > 0), "\(table)")
        }
        #expect(try await Tool.run(["stat", path]).output.contains("table       entities      2 keys, "))

        let dump = try await Tool.run(["dump", path, "--json"])
        #expect(try dump.objects().map { $0["offset"] as? Int } == Array(1...6))
        let intents = try await Tool.run(["dump", path, "--kind", "intent", "--type", "te", "--id", "a", "--json"]).objects()
        #expect(intents.map { $0["operation"] as? String } == ["create", "update"])
        #expect((intents.first?["fields"] as? [String: Any])?["title"] as? String == "CORRUPT-ME-42")
        #expect(try await Tool.run(["dump", path, "--from", "2", "--to", "3", "--json"]).objects().count == 2)
        #expect(try await Tool.run(["dump", path, "--from", "3", "--to", "3", "--json"]).objects().map { $0["offset"] as? Int } == [3])
        // Each filter alone: the ack, then the one intent on a prj entity.
        #expect(try await Tool.run(["dump", path, "--kind", "ack", "--json"]).objects().map { $0["offset"] as? Int } == [5])
        #expect(try await Tool.run(["dump", path, "--type", "prj", "--json"]).objects().map { $0["offset"] as? Int } == [4])
        #expect(try await Tool.run(["dump", path, "--limit", "1"]).lines.count == 1)

        let show = try await Tool.run(["show", path, "5", "--json"]).objects()
        #expect(show.first?["kind"] as? String == "ack" && show.first?["intent_offset"] as? Int == 2)
        let shown = try await Tool.run(["show", path, "5", "2", "--json"]).objects()
        #expect(shown.map { $0["offset"] as? Int } == [5, 2])
        #expect(try await Tool.run(["show", path, "2", "99"]).output.isEmpty)

        let entities = try await Tool.run(["entities", path, "te", "--json"]).objects()
        #expect(entities.map { $0["id"] as? String } == ["a", "pulled"])
        #expect(try await Tool.run(["entities", path, "te", "a", "--json"]).objects().first?["server_version"] as? Int == 1)
        let none = try await Tool.run(["entities", path, "prj", "--json"])
        #expect(none.status == 0 && none.lines.isEmpty)
        // A mistyped type lists nothing too: the types that have entities are named.
        #expect(none.errors == "logtool entities: no entities of type prj (those with entities: te)\n", "\(none.errors)")

        let outbox = try await Tool.run(["outbox", path, "--json"]).objects()
        #expect(outbox.map { $0["offset"] as? Int } == [3])
        #expect(try await Tool.run(["cursors", path, "--json"]).objects().first?["pull"] as? String == "c-1")
        let verify = try await Tool.run(["verify", path])
        #expect(verify.status == 0 && verify.errors.contains("6 entries checked, 0 problems"))
    }

    /// A conflict recorded as the sync engine records it (the intent
    /// rejected with CONFLICT, the decision left to the app) is listed.
    @Test func conflictsListsWhatWaitsForTheApp() async throws {
        let directory = try TemporaryDirectory("logtool-conflicts")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: ["n": 1])
            try await store.record([(1, .conflict(ServerState(serverVersion: 3, deleted: false, data: ["n": 2]), message: "newer"))])
            #expect(try store.conflicts().map(\.conflict.serverVersion) == [3])
            store.close()
        }
        let waiting = try await Tool.run(["conflicts", directory.path, "--json"])
        #expect(waiting.status == 0, "\(waiting.errors)")
        #expect(try waiting.objects().map { $0["server_version"] as? Int } == [3])
    }

    /// The compaction watermark is the log's, reported also when the
    /// projections are stale (entries appended without the store).
    @Test func statReportsTheWatermarkOfAStoreWithStaleProjections() async throws {
        let directory = try TemporaryDirectory("logtool-stat-stale")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 1)], cursor: "c1")
            try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 2)], cursor: "c2")
            _ = try await store.compact(below: 2)
            store.close()
        }
        do {
            let log = try EventLog(path: directory.path, options: .init(durability: .process))
            _ = try await log.append(.resync(reason: "raw"))
            log.close()
        }
        let report = try #require(try await Tool.run(["stat", directory.path, "--json"]).objects().first)
        #expect((report["projections"] as? String)?.hasPrefix("stale") == true)
        #expect(report["compacted_below"] as? Int == 2)
    }

    @Test func verifyFindsAFlippedByteInTheFile() async throws {
        let directory = try await makeStore("logtool-flip")
        let file = directory.appending("data.mdb")
        var bytes = try #require(FileManager.default.contents(atPath: file))
        let marker = Data("CORRUPT-ME-42".utf8)
        // Copy-on-write leaves stale copies of pages in the file, so flip the
        // marker wherever it is: one of them is in the live entry at offset 2
        // (the entity record now holds "fine" instead).
        var start = bytes.startIndex
        var flipped = 0
        while let found = bytes[start...].range(of: marker) {
            bytes[found.lowerBound] ^= 0x20
            start = found.upperBound
            flipped += 1
        }
        #expect(flipped >= 1)
        try bytes.write(to: URL(fileURLWithPath: file))
        let verify = try await Tool.run(["verify", directory.path])
        #expect(verify.status == 1)
        #expect(verify.output.contains("log at offset 2: bad checksum"), "\(verify.output)")
        // A damaged entry is a one-line error for the other commands, exit 2.
        let dump = try await Tool.run(["dump", directory.path])
        #expect(dump.status == 2 && dump.errors.contains("offset 2"))
        // An export that meets it fails and leaves no file that looks whole.
        let elsewhere = try TemporaryDirectory("logtool-flip-export")
        let export = try await Tool.run(["export", directory.path, "--output", elsewhere.appending("export.jsonl")])
        #expect(export.status == 2 && export.errors.contains("offset 2"))
        #expect(try FileManager.default.contentsOfDirectory(atPath: elsewhere.path).isEmpty)
    }

    /// Damage inside the pages of `data.mdb` (a few random bytes of one
    /// page, for 40 seeds) is what `verify` reports, with exit 1 (or 0
    /// where it hit bytes nothing reads), never a crash: its page check
    /// reads every page without LMDB first. Without it, about one damage
    /// in six killed `logtool verify` inside liblmdb (SIGSEGV, SIGBUS), as
    /// LMDB followed a damaged offset or size through its map.
    @Test func verifyReportsDamagedPagesAndNeverCrashes() async throws {
        let directory = try TemporaryDirectory("logtool-damaged-pages")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            for round in 0..<2 {
                var batch = WriteBatch()
                for n in 0..<400 { _ = try batch.create(type: "te", fields: ["title": .string("entry \(round) \(n)"), "n": .int(Int64(n))]) }
                try await store.write(batch)
            }
            store.close()
        }
        let file = directory.appending("data.mdb")
        let pristine = try #require(FileManager.default.contents(atPath: file))
        let pageSize = 4096
        var pageProblems = 0
        for seed in UInt64(1)...40 {
            var random = SeededRandom(seed: seed)
            var bytes = pristine
            let page = Int.random(in: 2..<bytes.count / pageSize, using: &random)
            for _ in 0..<[1, 2, 4, 8].randomElement(using: &random)! {
                // The header and first node offsets half the time.
                let within = Bool.random(using: &random) ? Int.random(in: 0..<64, using: &random) : Int.random(in: 0..<pageSize, using: &random)
                bytes[page * pageSize + within] = UInt8.random(in: 0...255, using: &random)
            }
            try bytes.write(to: URL(fileURLWithPath: file))
            // Off the cooperative pool: forty runs would hold a thread of it.
            let verify = try await Tool.run(["verify", directory.path])
            #expect(verify.status == 0 || verify.status == 1, "seed \(seed), page \(page): exit \(verify.status): \(verify.errors.suffix(300))")
            if verify.output.contains(" page \(page): ") { pageProblems += 1 }
        }
        #expect(pageProblems > 10, "the page check found \(pageProblems) of the 40 damages")
    }

    /// `verify` lists a damaged last entry as a problem and exits 1, as
    /// for any other entry; opening the store decoded the last entry and
    /// failed, so it exited 2 with a plain error.
    @Test func verifyReportsADamagedLastEntryAsAProblem() async throws {
        let directory = try TemporaryDirectory("logtool-verify-last")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: ["n": 1])
            try await store.create(type: "te", id: "b", fields: ["n": 2])
            store.close()
        }
        try Tool.damageEntry(at: 2, inStore: directory.path)
        let verify = try await Tool.run(["verify", directory.path])
        #expect(verify.status == 1, "exit \(verify.status): \(verify.errors)")
        #expect(verify.output.contains("log at offset 2: bad checksum"), "\(verify.output)")
        // The other commands still refuse it, naming the offset.
        let stat = try await Tool.run(["stat", directory.path])
        #expect(stat.status == 2 && stat.errors.contains("at offset 2: corrupt entry"), "\(stat.errors)")
    }

    /// A `data.mdb` cut short (after its two meta pages, or part way)
    /// is a one-line error with exit 2 for every command, not a SIGBUS
    /// inside liblmdb, and `compact --copy` leaves no half-made copy.
    @Test func aTruncatedDataFileIsAnErrorNotACrash() async throws {
        let directory = try await makeStore("logtool-truncated")
        let file = directory.appending("data.mdb")
        let whole = try #require(try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int)
        let elsewhere = try TemporaryDirectory("logtool-truncated-copy")
        for size in [8192, whole / 2] {
            let handle = try #require(FileHandle(forUpdatingAtPath: file))
            try handle.truncate(atOffset: UInt64(size))
            try handle.close()
            for command in [["stat"], ["dump"], ["verify"], ["compact", "--copy", elsewhere.appending("copy")]] {
                let run = try await Tool.run([command[0], directory.path] + command.dropFirst())
                #expect(run.status == 2, "\(command) at \(size) bytes: exit \(run.status)")
                #expect(run.errors.contains("data file truncated") && run.errors.contains("\(file) is \(size) bytes"), "\(run.errors)")
            }
            #expect(!FileManager.default.fileExists(atPath: elsewhere.appending("copy")))
        }
    }

    @Test func verifyFindsAWrongProjectionRow() async throws {
        let directory = try await makeStore("logtool-projection")
        do {
            let environment = try Environment(path: directory.path)
            let entities = try #require(try environment.openDatabase("entities", create: false))
            try environment.write { txn in
                try txn.put(entities, key: Array("te".utf8) + [0] + Array("ghost".utf8), value: [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
            }
            environment.close()
        }
        let verify = try await Tool.run(["verify", directory.path, "--json"])
        #expect(verify.status == 1)
        let problems = try verify.objects()
        #expect(problems.contains { ($0["message"] as? String)?.contains("te/ghost") == true && $0["table"] as? String == "entities" })
    }

    @Test func errorsAreOneLineWithExitTwo() async throws {
        let directory = try TemporaryDirectory("logtool-errors")
        _ = FileManager.default.createFile(atPath: directory.appending("notes.txt"), contents: Data("x".utf8))
        let notAStore = try await Tool.run(["stat", directory.path])
        #expect(notAStore.status == 2 && notAStore.errors.contains("not a sync store"))
        // A missing path is named as no store, not by LMDB's call: it said
        // "open (PATH): No such file or directory [2]".
        let missing = try await Tool.run(["stat", directory.appending("missing")])
        #expect(missing.status == 2 && missing.errors == "logtool: \(directory.appending("missing")): not a sync store: no such directory\n", "\(missing.errors)")
        // A file is named as what it is, not as a directory without a store.
        let file = try await Tool.run(["stat", directory.appending("notes.txt")])
        #expect(file.status == 2 && file.errors.contains("Not a directory") && !file.errors.contains("no data.mdb"))
        #expect(try await Tool.run(["dump", directory.path, "--kind", "nope"]).status == 2)
        #expect(try await Tool.run(["frobnicate"]).status == 2)
        // Nothing was created in a directory that is not a store.
        #expect(!FileManager.default.fileExists(atPath: directory.appending("data.mdb")))
    }

    /// This process holds the store open for writing (and its writer
    /// lock) and keeps appending; `logtool` in other processes reads it.
    /// No timing is involved: the writer is open for the whole test.
    @Test func readingWorksWhileAnotherProcessWrites() async throws {
        let directory = try TemporaryDirectory("logtool-concurrent")
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        var seen: [Int] = []
        for round in 0..<4 {
            try await store.create(type: "te", id: "t\(round)", fields: ["round": .int(Int64(round))])
            let stat = try await Tool.run(["stat", directory.path, "--json"])
            #expect(stat.status == 0, "\(stat.errors)")
            seen.append(try #require(try stat.objects().first?["entries"] as? Int))
            #expect(try await Tool.run(["entities", directory.path, "te", "--json"]).objects().count == round + 1)
        }
        #expect(seen == [1, 2, 3, 4])
        #expect(try await Tool.run(["verify", directory.path]).status == 0)
    }

    /// Reads made while another process writes must each describe one
    /// state of the store. `verify` compares the stored projections with a
    /// replay of the log: from two snapshots, commits landing between the
    /// reads show up as problems the store does not have. `stat` counts the
    /// entries up to the last offset it reports, not past it (nothing is
    /// compacted here, so they are all the offsets from the first).
    @Test(arguments: ["verify", "stat"])
    func aReadWhileAnotherProcessWritesSeesOneState(_ command: String) async throws {
        let directory = try TemporaryDirectory("logtool-\(command)-concurrent")
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        try await store.create(type: "te", id: "first", fields: [:])
        let written = Atomic<Int>(0)
        let writer = Task {
            var number = 0
            while !Task.isCancelled {
                try await store.create(type: "te", id: "w\(number)", fields: ["n": .int(Int64(number))])
                number += 1
                written.store(number, ordering: .releasing)
                // Often enough to land between any two reads of a verify,
                // rarely enough that the store stays small.
                try? await Task.sleep(for: .milliseconds(1))
            }
            return number
        }
        for _ in 0..<10 {
            // The writer is running before each verify starts (other tests
            // may keep the cooperative threads busy), and the verify waits
            // on a thread of its own, so it does not hold one of them.
            let before = written.load(ordering: .acquiring)
            while written.load(ordering: .acquiring) == before { try await Task.sleep(for: .milliseconds(1)) }
            let run = try await Tool.run(command == "stat" ? ["stat", directory.path, "--json"] : ["verify", directory.path])
            #expect(run.status == 0, "\(run.output)\(run.errors)")
            if command == "stat" {
                let report = try #require(try run.objects().first)
                let first = try #require(report["first_offset"] as? Int)
                let last = try #require(report["last_offset"] as? Int)
                #expect(report["entries"] as? Int == last - first + 1, "\(report)")
            }
        }
        writer.cancel()
        #expect(try await writer.value > 0)
    }
}

@Suite struct WriterLockTests {
    /// One writing process per store: while this process has the store
    /// open for writing, a writing `logtool` command is refused (naming
    /// this pid) and reading ones are not; once closed, it may write.
    @Test func aSecondWritingProcessIsRefused() async throws {
        let directory = try TemporaryDirectory("writer-lock")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            defer { store.close() }
            try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 1)], cursor: "c")
            try await store.create(type: "te", id: "b", fields: [:])
            let refused = try await Tool.run(["compact", directory.path, "--below", "2"])
            #expect(refused.status == 2)
            #expect(refused.errors.contains("another process has the store open for writing (pid \(getpid()))"), "\(refused.errors)")
            #expect(try await Tool.run(["replay", directory.path]).status == 2)
            #expect(try await Tool.run(["stat", directory.path]).status == 0)
        }
        let compacted = try await Tool.run(["compact", directory.path, "--below", "2"])
        #expect(compacted.status == 0, "\(compacted.errors)")
    }

    /// `compact --below --dry-run` writes nothing, so it reads the store as
    /// the other read commands do: while this process has the store open
    /// for writing (holding its writer lock), it reports what would go and
    /// changes nothing. It was refused as a second writer.
    @Test func aDryRunReportsWhileAnotherProcessWrites() async throws {
        let directory = try TemporaryDirectory("writer-lock-dry-run")
        let store = try Store(path: directory.path, options: .init(durability: .process))
        defer { store.close() }
        try await store.applyPulledPage(
            (0..<10).map { PulledChange(.upsert, entityType: "te", entityID: "e\($0 % 4)", serverVersion: UInt64($0 + 1)) }, cursor: "c")
        try await store.create(type: "te", id: "mine", fields: [:])
        let dry = try await Tool.run(["compact", directory.path, "--below", "10", "--dry-run"])
        #expect(dry.status == 0, "\(dry.errors)")
        #expect(dry.output.contains("below #10: 9 entries; would remove 9, would write 4 snapshots, would keep 0"), "\(dry.output)")
        let json = try await Tool.run(["compact", directory.path, "--below", "10", "--dry-run", "--json"]).objects().first
        #expect(json?["entries_removed"] as? Int == 9 && json?["snapshots_written"] as? Int == 4, "\(json ?? [:])")
        // Out of range, the value is named by the option the user gave it as.
        let outside = try await Tool.run(["compact", directory.path, "--below", "99", "--dry-run"])
        #expect(outside.status == 2 && outside.errors.contains(": --below 99: compaction watermark 99 is outside"), "\(outside.errors)")
        #expect(try store.log.lastOffset() == 11)
        #expect(try store.compactedBelow() == 0)
        // The store is still this process's to write.
        try await store.create(type: "te", id: "after", fields: [:])
        let compacted = try await store.compact(below: 10)
        #expect(compacted.entriesRemoved == 9 && compacted.snapshotsWritten == 4)
    }
}

@Suite struct LogToolWritingTests {
    @Test func tailFollowsAnotherProcesssAppends() async throws {
        let directory = try TemporaryDirectory("logtool-tail")
        do {
            let log = try EventLog(path: directory.path, options: .init(durability: .process))
            _ = try await log.append(contentsOf: (1...5).map { _ in EntryBody.resync(reason: "before") })
            log.close()
        }
        let tail = try ChildProcess(
            executable: Tool.path("logtool"),
            arguments: ["tail", directory.path, "-n", "2", "--follow", "--seconds", "600", "--json"])
        defer { tail.kill() }
        // Once tail has printed the last two, this process appends three more.
        // tail lives 600 s and is killed below: on a loaded machine, a
        // shorter life (20 s, 60 s) ended before it printed them all.
        #expect(await tail.waitForLines(timeout: .seconds(60)) { $0.count >= 2 })
        let log = try EventLog(path: directory.path, options: .init(durability: .process))
        _ = try await log.append(contentsOf: (1...3).map { _ in EntryBody.resync(reason: "after") })
        #expect(await tail.waitForLines(timeout: .seconds(60)) { $0.count >= 5 })
        tail.kill(SIGTERM)
        log.close()
        let offsets = try tail.outputLines.map { line in
            try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])["offset"] as? Int
        }
        #expect(offsets == [4, 5, 6, 7, 8])
    }

    /// `tail -n 0` prints nothing; at the last offset there is, 2^64 - 1
    /// (an import can put a log there), it computed `last - 0 + 1` and
    /// trapped. `-n 1` there prints that one entry.
    @Test func tailOfZeroEntriesAtTheLastOffsetPrintsNothing() async throws {
        let directory = try TemporaryDirectory("logtool-tail-top")
        let lines = [
            #"{"compacted_below":18446744073709551615,"entry_format":1,"format":"syncstore-export","last_offset":18446744073709551615,"version":1}"#,
            #"{"kind":"resync","offset":18446744073709551615,"reason":"r","timestamp":5}"#,
        ]
        let store = directory.appending("store")
        let imported = try await Tool.importLines(lines, file: directory.appending("top.jsonl"), into: store)
        #expect(imported.status == 0, "\(imported.errors)")
        let none = try await Tool.run(["tail", store, "-n", "0"])
        #expect(none.status == 0 && none.output.isEmpty, "exit \(none.status): \(none.errors.prefix(300))")
        let one = try await Tool.run(["tail", store, "-n", "1", "--json"])
        #expect(try one.objects().map { $0["offset"] as? UInt64 } == [.max], "\(one.output)\(one.errors)")
    }

    /// A compaction watermark past the log's last offset, which only
    /// damage makes (compaction sets one in 1...last), leaves no offset
    /// above it: `tail` computed `last - watermark + 1` and trapped. It
    /// prints the last entries as for any watermark.
    @Test func tailOfALogWithAWatermarkPastItsEndPrintsTheLastEntries() async throws {
        let directory = try TemporaryDirectory("logtool-tail-watermark")
        let store = directory.appending("store")
        let imported = try await Tool.importLines(LogToolExportTests.resyncExport(count: 3), file: directory.appending("three.jsonl"), into: store)
        #expect(imported.status == 0, "\(imported.errors)")
        do {
            let environment = try Environment(path: store)
            defer { environment.close() }
            let meta = try #require(try environment.openDatabase("meta", create: false))
            try environment.write { txn in try txn.put(meta, key: Array("compacted-below".utf8), value: UInt64(10).bigEndianBytes) }
        }
        let two = try await Tool.run(["tail", store, "-n", "2", "--json"])
        #expect(try two.objects().map { $0["offset"] as? UInt64 } == [2, 3], "exit \(two.status): \(two.output)\(two.errors.prefix(300))")
    }

    /// The writer grows the map past the size `tail` mapped when it opened
    /// (64 MiB): `tail` takes the new size (LMDB's `MDB_MAP_RESIZED`, once
    /// per growth) and goes on printing every entry, none lost or repeated.
    @Test func tailFollowsAWriterThatGrowsTheMap() async throws {
        let directory = try TemporaryDirectory("logtool-tail-grow")
        let log = try EventLog(path: directory.path, options: .init(durability: .process))
        defer { log.close() }
        _ = try await log.append(.resync(reason: "start"))
        let mapBefore = log.mapUsage().mapSize
        let tail = try ChildProcess(
            executable: Tool.path("logtool"), arguments: ["tail", directory.path, "-n", "1", "--follow", "--seconds", "600"])
        defer { tail.kill() }
        #expect(await tail.waitForLines(timeout: .seconds(60)) { $0.count >= 1 })
        // 48 entries of 2 MiB: about 100 MiB of log.
        let blob = Value.bytes([UInt8](repeating: 0x5A, count: 2 << 20))
        for n in 0..<48 {
            _ = try await log.append(
                .intent(
                    Intent(
                        .create, idempotencyKey: "k\(n)", entityType: "blob", entityID: "b\(n)", baseVersion: 0,
                        fields: ["data": blob])))
        }
        #expect(log.mapUsage().mapSize > mapBefore)
        #expect(await tail.waitForLines(timeout: .seconds(60)) { $0.count >= 49 })
        tail.kill(SIGTERM)
        let offsets = tail.outputLines.compactMap { line in
            line.split(separator: " ").first { $0.hasPrefix("#") }.flatMap { Int($0.dropFirst()) }
        }
        #expect(offsets == Array(1...49), "\(tail.outputLines.suffix(3)) \(tail.errorText)")
    }

    /// Makes a store in `directory` of 2 MiB entities `b0`, `b1`, ..., full
    /// enough that a rebuild (`logtool replay`), which writes the
    /// projections again beside those in use, must grow the map; returns
    /// how many it made.
    static func fillForAGrowingReplay(_ directory: TemporaryDirectory) async throws -> Int {
        let writer = try Store(path: directory.path, options: .init(durability: .process))
        defer { writer.close() }
        let blob = Value.bytes([UInt8](repeating: 0x5A, count: 2 << 20))
        var count = 0
        repeat {
            try await writer.create(type: "blob", id: "b\(count)", fields: ["data": blob])
            count += 1
        } while writer.log.mapUsage().usedBytes * 10 < writer.log.mapUsage().mapSize * 7
        return count
    }

    /// A read-only process reads inside a read (a `get` inside `Store.read`)
    /// after another process grew the map past the one it mapped: the inner
    /// read cannot take the new size while the outer one holds the old map.
    /// It gets `.mapResized`, where it waited for its own hold for good; the
    /// next read outside takes the new size.
    @Test func aReadInsideAReadAfterAnotherProcessGrewTheMapIsAnError() async throws {
        let directory = try TemporaryDirectory("logtool-nested-read-grow")
        let count = try await Self.fillForAGrowingReplay(directory)
        let reader = try Store(path: directory.path, options: .init(readOnly: true))
        defer { reader.close() }
        let mapBefore = reader.log.mapUsage().mapSize
        try reader.read { snapshot in
            #expect(try snapshot.get(type: "blob", id: "b0") != nil)
            // Run to its end inside the read, so waited for on this thread:
            // a read transaction is never held across an await.
            let replay = try ToolRun.run(Tool.path("logtool"), ["replay", directory.path])
            #expect(replay.status == 0, "exit \(replay.status): \(replay.errors)")
            let error = #expect(throws: LMDBError.self) { try reader.get(type: "blob", id: "b1") }
            #expect(error?.code == .mapResized, "\(String(describing: error))")
            #expect(error?.description.contains("end the outer read") == true, "\(String(describing: error))")
        }
        #expect(try reader.get(type: "blob", id: "b\(count - 1)") != nil)
        #expect(reader.log.mapUsage().mapSize > mapBefore)
    }

    /// A read-only process that opens a database after another process grew
    /// the map past the one it mapped (as a read-only `Store` does while it
    /// opens, racing a writer's growth) takes the new size, as a read does.
    /// It was `MDB_MAP_RESIZED`, and the open failed.
    @Test func openingADatabaseAfterAnotherProcessGrewTheMapTakesTheNewSize() async throws {
        let directory = try TemporaryDirectory("logtool-open-after-grow")
        _ = try await Self.fillForAGrowingReplay(directory)
        var options = Environment.Options()
        options.readOnly = true
        let reader = try Environment(path: directory.path, options: options)
        defer { reader.close() }
        let mapBefore = reader.info().mapSize
        let replay = try await Tool.run(["replay", directory.path])
        #expect(replay.status == 0, "exit \(replay.status): \(replay.errors)")
        #expect(try reader.openDatabase("log", create: false) != nil)
        #expect(try reader.openDatabase("no-such-database", create: false) == nil)
        #expect(reader.info().mapSize > mapBefore)
    }

    /// `replay` and `compact --below` open the store for writing (a dry run
    /// reads it); a path with no store there is refused as the read commands
    /// refuse it, not made into a new, empty store reported as a success.
    @Test(arguments: [["replay"], ["compact", "--below", "1"], ["compact", "--below", "1", "--dry-run"]])
    func aWritingCommandOnAPathWithNoStoreIsRefused(_ command: [String]) async throws {
        let directory = try TemporaryDirectory("logtool-no-store")
        let missing = directory.appending("typo")
        let run = try await Tool.run([command[0], missing] + command.dropFirst())
        #expect(run.status == 2 && run.errors.contains(missing), "exit \(run.status): \(run.output)\(run.errors)")
        #expect(!FileManager.default.fileExists(atPath: missing))
        let empty = directory.appending("empty")
        try FileManager.default.createDirectory(atPath: empty, withIntermediateDirectories: false)
        let inEmpty = try await Tool.run([command[0], empty] + command.dropFirst())
        #expect(inEmpty.status == 2 && inEmpty.errors.contains("not a sync store"), "exit \(inEmpty.status): \(inEmpty.errors)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: empty).isEmpty)
        // An empty LMDB environment is not a store to take over either.
        let bare = directory.appending("bare")
        try Environment(path: bare).close()
        let inBare = try await Tool.run([command[0], bare] + command.dropFirst())
        #expect(inBare.status == 2 && inBare.errors.contains("not a sync store"), "exit \(inBare.status): \(inBare.errors)")
        #expect(!FileManager.default.fileExists(atPath: bare + "/writer.lock"))
    }

    @Test func compactInPlaceAndAsACompactedCopy() async throws {
        let directory = try TemporaryDirectory("logtool-compact")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.applyPulledPage((0..<200).map { PulledChange(.upsert, entityType: "te", entityID: "e\($0 % 20)", serverVersion: UInt64($0 + 1), fields: ["n": .int(Int64($0))]) }, cursor: "c")
            try await store.create(type: "te", id: "mine", fields: [:])
            store.close()
        }
        let dry = try await Tool.run(["compact", directory.path, "--below", "200", "--dry-run", "--json"]).objects().first
        #expect(dry?["entries_removed"] as? Int == 199 && dry?["snapshots_written"] as? Int == 20)
        let dryText = try await Tool.run(["compact", directory.path, "--below", "200", "--dry-run"])
        #expect(dryText.status == 0 && dryText.output.contains("would remove 199, would write 20 snapshots"))
        #expect(try await Tool.run(["stat", directory.path, "--json"]).objects().first?["entries"] as? Int == 201)
        let done = try await Tool.run(["compact", directory.path, "--below", "200"])
        #expect(done.status == 0 && done.output.contains("removed 199, wrote 20 snapshots"))
        #expect(try await Tool.run(["stat", directory.path, "--json"]).objects().first?["entries"] as? Int == 22)
        #expect(try await Tool.run(["verify", directory.path]).status == 0)
        let copy = directory.appending("copy")
        let copied = try await Tool.run(["compact", directory.path, "--copy", copy, "--json"]).objects().first
        let before = try #require(copied?["bytes_before"] as? Int)
        let after = try #require(copied?["bytes_after"] as? Int)
        #expect(after <= before)
        #expect(try await Tool.run(["entities", copy, "te", "--json"]).objects().count == 21)
        let textCopy = directory.appending("text-copy")
        let copiedText = try await Tool.run(["compact", directory.path, "--copy", textCopy])
        #expect(copiedText.status == 0)
        #expect(copiedText.output == "copied to \(textCopy): data.mdb \(before) bytes -> \(after) bytes\n")
        #expect(try await Tool.run(["compact", directory.path, "--copy", copy]).status == 2)
        #expect(try await Tool.run(["compact", directory.path]).status == 2)
    }
}

@Suite struct LogToolPagingTests {
    /// `entities` and `diff` read past one page (`Store.pageCountMax`):
    /// every entity once, in id order, the other type's not mixed in.
    @Test func entitiesAndDiffReadEveryPage() async throws {
        let directory = try TemporaryDirectory("logtool-pages")
        let count = Store.pageCountMax * 2 + 7
        let ids = (0..<count).map { String(format: "e%06d", $0) }
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            for start in stride(from: 0, to: count, by: 5_000) {
                var batch = WriteBatch()
                for id in ids[start..<min(start + 5_000, count)] { try batch.create(type: "te", id: id, fields: [:]) }
                try batch.create(type: "tf", id: "other-\(start)", fields: [:])
                try await store.write(batch)
            }
            store.close()
        }
        let listed = try await Tool.run(["entities", directory.path, "te", "--json"])
        #expect(listed.status == 0, "\(listed.errors)")
        #expect(try listed.objects().map { $0["id"] as? String } == ids)
        let copy = directory.appending("copy")
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: false)
        try FileManager.default.copyItem(atPath: directory.appending("data.mdb"), toPath: copy + "/data.mdb")
        let same = try await Tool.run(["diff", directory.path, copy, "--json"])
        #expect(same.status == 0 && same.errors.contains("\(count + 5) and \(count + 5) entities, 0 differ"), "\(same.errors)")
    }
}

@Suite struct LogToolReplayTests {
    @Test func replayRepairsProjectionsAndTravelsInTime() async throws {
        let directory = try TemporaryDirectory("logtool-replay")
        let path = directory.appending("store")
        do {
            let store = try Store(path: path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: ["n": 1])
            try await store.update(type: "te", id: "a", changes: ["n": 2])
            try await store.create(type: "te", id: "b", fields: ["n": 3])
            store.close()
        }
        // Forge a row, as a bug or a bad disk might.
        do {
            let environment = try Environment(path: path)
            let entities = try #require(try environment.openDatabase("entities", create: false))
            _ = try environment.write { txn in try txn.delete(entities, key: Array("te".utf8) + [0] + Array("b".utf8)) }
            environment.close()
        }
        #expect(try await Tool.run(["verify", path]).status == 1)
        let replay = try await Tool.run(["replay", path])
        #expect(replay.status == 0 && replay.output.contains("through offset 3"), "\(replay.errors)")
        #expect(try await Tool.run(["verify", path]).status == 0)

        // As of offset 2: a exists with n = 2, b does not yet.
        let past = directory.appending("past")
        #expect(try await Tool.run(["replay", path, "--to", "2", "--output", past]).status == 0)
        let entities = try await Tool.run(["entities", past, "te", "--json"]).objects()
        #expect(entities.map { $0["id"] as? String } == ["a"])
        #expect((entities.first?["fields"] as? [String: Any])?["n"] as? Int == 2)
        #expect(try await Tool.run(["verify", past]).status == 0)

        let diff = try await Tool.run(["diff", path, past, "--json"])
        #expect(diff.status == 1)
        #expect(try diff.objects().map { $0["entity"] as? String } == ["te/b"])
        #expect(try await Tool.run(["diff", path, path]).status == 0)
        #expect(try await Tool.run(["replay", path, "--to", "9", "--output", directory.appending("future")]).status == 2)
        // A refused command leaves no directory in the way of the next try,
        // and a missing parent is named.
        #expect(!FileManager.default.fileExists(atPath: directory.appending("future")))
        let orphan = try await Tool.run(["bundle", path, "--output", directory.appending("missing/bundle")])
        #expect(orphan.status == 2 && orphan.errors.contains("cannot make \(directory.appending("missing/bundle")): No such file"))
    }

    /// Below the compaction watermark the log holds snapshots, not the
    /// entries that were there: the state as of such an offset is gone, and
    /// `--to` says so instead of replaying a few snapshots as that state.
    @Test func replayToAnOffsetCompactedAwayIsRefused() async throws {
        let directory = try TemporaryDirectory("logtool-replay-compacted")
        let path = directory.appending("store")
        do {
            let store = try Store(path: path, options: .init(durability: .process))
            try await store.applyPulledPage(
                (1...6).map { PulledChange(.upsert, entityType: "te", entityID: "e\($0 % 3)", serverVersion: UInt64($0), fields: ["n": .int(Int64($0))]) },
                cursor: "c")
            try await store.create(type: "te", id: "mine", fields: ["n": 7])
            _ = try await store.compact(below: 6)
            store.close()
        }
        #expect(try await Tool.run(["stat", path, "--json"]).objects().first?["compacted_below"] as? Int == 6)
        let past = directory.appending("past")
        let refused = try await Tool.run(["replay", path, "--to", "1", "--output", past])
        #expect(refused.status == 2 && refused.errors.contains("compaction watermark 6"), "\(refused.output)\(refused.errors)")
        #expect(!FileManager.default.fileExists(atPath: past))
        // Past the log's end there is no such state either.
        let beyond = try await Tool.run(["replay", path, "--to", "8", "--output", past])
        #expect(beyond.status == 2 && beyond.errors.contains("--to 8 is outside the log (1...7)"), "\(beyond.output)\(beyond.errors)")
        #expect(!FileManager.default.fileExists(atPath: past))
        // From the watermark on, the log is as it was.
        let kept = try await Tool.run(["replay", path, "--to", "6", "--output", past])
        #expect(kept.status == 0, "\(kept.errors)")
        #expect(try await Tool.run(["entities", past, "te", "--json"]).objects().count == 3)
        #expect(try await Tool.run(["verify", past]).status == 0)
    }
}

@Suite struct LogToolExportTests {
    @Test func exportThenImportIsExact() async throws {
        let directory = try TemporaryDirectory("logtool-export")
        let source = directory.appending("source")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            let fields: Fields = [
                "int": .int(.min), "double": 0.1, "integral": .double(3), "negative-zero": .double(-0.0), "text": "é\"\n😀",
                "bytes": .bytes([0, 255]), "at": .timestamp(-5), "null": nil, "list": [1, [true]], "object": ["k": .bytes([])],
            ]
            try await store.applyPulledPage((1...6).map { PulledChange(.upsert, entityType: "te", entityID: "e\($0)", serverVersion: UInt64($0), fields: fields) }, cursor: "c1")
            try await store.create(type: "te", id: "mine", fields: fields)
            let pending = try store.outbox()
            _ = try await store.log.append(.conflict(Conflict(intentOffset: pending[0].offset, entityType: "te", entityID: "mine", serverVersion: 2, serverFields: fields, resolution: .pending)))
            try await store.update(type: "te", id: "mine", changes: ["text": "changed"])
            let update = try #require(try store.outbox().last)
            _ = try await store.log.append(.conflict(Conflict(intentOffset: update.offset, entityType: "te", entityID: "mine", serverVersion: 3, serverFields: [:], resolution: .pending)))
            try await store.record([(pending[0].offset, .acknowledged(.applied, serverVersion: 1))])
            try await store.resync(reason: "test")
            try await store.applyPulledPage([PulledChange(.delete, entityType: "te", entityID: "e1", serverVersion: 9)], cursor: "c2")
            // Compaction leaves snapshots and holes below offset 10.
            _ = try await store.compact(below: 10)
            store.close()
        }
        let file = directory.appending("export.jsonl")
        let exported = try await Tool.run(["export", source, "--output", file])
        #expect(exported.status == 0, "\(exported.errors)")
        let copy = directory.appending("copy")
        let imported = try await Tool.run(["import", file, copy])
        #expect(imported.status == 0, "\(imported.errors)")
        #expect(try await Tool.run(["diff", source, copy]).status == 0)
        let a = try await Tool.run(["dump", source, "--json"])
        let b = try await Tool.run(["dump", copy, "--json"])
        #expect(!a.output.isEmpty && a.output == b.output)
        for (x, y) in zip(a.lines, b.lines) where x != y {
            Issue.record("first difference:\n\(x)\n\(y)")
            break
        }
        #expect(a.output.contains(#""negative-zero":{"$double":-0}"#))
        #expect(a.output.contains("\"kind\":\"snapshot\"") && a.output.contains("\"kind\":\"conflict\""))
        #expect(try await Tool.run(["verify", copy]).status == 0)
        #expect(try await Tool.run(["stat", copy, "--json"]).objects().first?["compacted_below"] as? Int == 10)
        // Both wait for the app, as `Store.conflicts()` lists them: only a
        // conflict entry with a resolution settles a conflict (storage.md,
        // section 15), not an ack of its intent.
        let waiting = try await Tool.run(["conflicts", copy, "--json"]).objects()
        #expect(waiting.map { $0["server_version"] as? Int } == [2, 3])
        #expect(try await Tool.run(["conflicts", copy, "--all", "--json"]).objects().count == 2)
        // A new store named by one character, relative to the working
        // directory (Foundation's `deletingLastPathComponent` traps on it).
        let short = try ToolRun.run("/bin/sh", ["-c", #"cd "$1" && "$0" import export.jsonl d"#, Tool.path("logtool"), directory.path])
        #expect(short.status == 0, "\(short.errors)")
        #expect(try await Tool.run(["diff", source, directory.appending("d")]).status == 0)
        // A second import into the same directory is refused; so is garbage.
        #expect(try await Tool.run(["import", file, copy]).status == 2)
        // The new store first and the file after it: it said "FILE exists;
        // import makes a new store".
        let swapped = try await Tool.run(["import", directory.appending("new"), file])
        #expect(swapped.status == 2, "\(swapped.errors)")
        #expect(swapped.errors == "logtool: \(directory.appending("new")) does not exist and \(file) is a file: the export file comes first (logtool import \(file) \(directory.appending("new")))\n", "\(swapped.errors)")
        #expect(!FileManager.default.fileExists(atPath: directory.appending("new")))
        try "not json\n".write(toFile: directory.appending("bad.jsonl"), atomically: true, encoding: .utf8)
        let bad = try await Tool.run(["import", directory.appending("bad.jsonl"), directory.appending("bad")])
        #expect(bad.status == 2 && bad.errors.contains("bad.jsonl:1"))
        // Only the store's own directory is made: a missing parent is named.
        let deep = try await Tool.run(["import", file, directory.appending("missing/new")])
        #expect(deep.status == 2)
        #expect(deep.errors == "logtool: \(directory.appending("missing")) does not exist; import makes only the store's own directory\n")
    }
}

extension LogToolExportTests {
    /// `export STORE FILE`, the file where `import FILE STORE` takes it,
    /// is refused with the option that names it (status 2): the parser said
    /// only "Unexpected argument 'FILE'". Nothing is written.
    @Test func anOutputFileWithoutItsOptionIsPointedToOutput() async throws {
        let directory = try TemporaryDirectory("logtool-export-positional")
        let file = directory.appending("out.jsonl")
        let run = try await Tool.run(["export", directory.appending("store"), file])
        #expect(run.status == 2, "\(run.status): \(run.errors)")
        #expect(run.errors.contains("export writes to --output FILE or to standard output: logtool export \(directory.appending("store")) --output \(file)"), "\(run.errors)")
        #expect(!FileManager.default.fileExists(atPath: file))
        // A misspelled option is named as such.
        let misspelled = try await Tool.run(["export", directory.appending("store"), "--ouput", file])
        #expect(misspelled.status == 2 && misspelled.errors.contains("Unknown option '--ouput'. Did you mean '--output'?"), "\(misspelled.errors)")
        // The help names what --output takes, and import's help the export.
        let help = try await Tool.run(["export", "--help"]).output.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        #expect(help.contains("-o, --output <file> The file to write (default: standard output); 'logtool import FILE NEWSTORE' reads it back."), "\(help)")
        let importHelp = try await Tool.run(["import", "--help"]).output.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        #expect(importHelp.contains("as 'logtool export STORE --output FILE' writes it"), "\(importHelp)")
        // import's paths are positional: an --output or --input, export's
        // form mirrored, is named with the line without it.
        for option in ["--output", "-o", "--input"] {
            let arguments = option == "--input" ? [option, file, directory.appending("new")] : [file, option, directory.appending("new")]
            let mirrored = try await Tool.run(["import"] + arguments)
            #expect(mirrored.status == 2, "\(option): \(mirrored.errors)")
            #expect(
                mirrored.errors.contains("Unknown option '\(option)': import takes the export file, then the new store, by position: logtool import \(file) \(directory.appending("new"))"),
                "\(option): \(mirrored.errors)")
        }
        let two = try await Tool.run(["export", directory.appending("store"), file, "more"])
        #expect(two.status == 2 && two.errors.contains("2 unexpected arguments: '\(file)', 'more'"), "\(two.errors)")
    }
}

extension LogToolExportTests {
    /// A misspelled option, or a directory given without its option, is
    /// named (status 2) where bundle requires --output: the parser reported
    /// the option missing first ("Missing expected argument '--output
    /// <output>'"). `replay STORE DIR` is named with --to and --output: the
    /// parser said only "Unexpected argument 'DIR'". Nothing is written.
    @Test func aMistakeBehindAMissingOutputIsNamed() async throws {
        let directory = try TemporaryDirectory("logtool-bundle-mistakes")
        let (store, out) = (directory.appending("store"), directory.appending("out"))
        let cases = [
            (["bundle", store, "--ouput", out], "Unknown option '--ouput'. Did you mean '--output'?"),
            (["bundle", store, out], "Unexpected argument '\(out)': bundle writes to --output DIR: logtool bundle \(store) --output \(out)"),
            (["replay", store, out], "Unexpected argument '\(out)': replay writes a new directory only with --to OFFSET --output DIR: logtool replay \(store) --to OFFSET --output \(out)"),
        ]
        for (arguments, message) in cases {
            let run = try await Tool.run(arguments)
            #expect(run.status == 2, "\(arguments): \(run.status): \(run.errors)")
            #expect(run.errors.contains(message) && !run.errors.contains("Missing"), "\(arguments): \(run.errors)")
        }
        // With --output given, a word too many is only that.
        let extra = try await Tool.run(["bundle", store, "--output", out, "more"])
        #expect(extra.status == 2 && extra.errors.contains("Unexpected argument 'more'\n"), "\(extra.errors)")
        // A missing --output alone is still named as missing.
        #expect(try await Tool.run(["bundle", store]).errors.contains("Missing expected argument '--output <dir>'"))
        #expect(!FileManager.default.fileExists(atPath: out))
    }
}

extension LogToolExportTests {
    /// An export into a directory that does not exist names the file asked
    /// for: it named the file written beside it, "cannot create
    /// FILE.partial-PID", which the user never gave.
    @Test func anExportIntoAMissingDirectoryNamesTheFile() async throws {
        let directory = try TemporaryDirectory("logtool-export-no-directory")
        _ = try await Tool.exportOfNewStore(at: directory.appending("store")) { _ in }
        let file = directory.appending("missing/out.jsonl")
        let run = try await Tool.run(["export", directory.appending("store"), "--output", file])
        #expect(run.status == 2, "\(run.status): \(run.errors)")
        #expect(run.errors == "logtool: cannot create \(file): No such file or directory\n", "\(run.errors)")
    }
}

extension LogToolTests {
    /// compact's options refused say which: both --below and --copy said
    /// "give one of --below or --copy", as did --dry-run alone.
    @Test func compactsOptionsRefusedAreNamed() async throws {
        let cases = [
            (["--below", "2", "--copy", "/tmp/never"], "Error: --below and --copy go apart: give one of them\n"),
            (["--dry-run"], "Error: --dry-run goes with --below\n"),
            ([], "Error: give one of --below N or --copy DIR\n"),
        ]
        for (arguments, message) in cases {
            let run = try await Tool.run(["compact", "/tmp/never-a-store"] + arguments)
            #expect(run.status == 2 && run.errors.hasPrefix(message), "\(arguments): \(run.errors)")
        }
    }
}

extension LogToolExportTests {
    /// An export that replay would refuse (a hole above the compaction
    /// watermark, or offsets out of order) is refused before anything is
    /// written, and the new store's directory is not left behind.
    @Test func anImportWithAHoleIsRefusedAndLeavesNothing() async throws {
        let directory = try TemporaryDirectory("logtool-import-hole")
        let exported = try await Tool.exportOfNewStore(at: directory.appending("source")) { store in
            for number in 0..<3 { try await store.create(type: "te", id: "e\(number)", fields: ["n": .int(Int64(number))]) }
        }
        #expect(exported.count == 4 && exported[1].contains(#""offset":1,"#), "\(exported)")
        let cases = [
            ("hole.jsonl", 1, #""offset":5,"#, "the entry on line 2 has offset 5 where 1 comes next"),
            ("backwards.jsonl", 2, #""offset":1,"#, "the entry on line 3 has offset 1 where 2 comes next"),
        ]
        for (name, line, replacement, message) in cases {
            var lines = exported
            lines[line] = lines[line].replacingOccurrences(of: #""offset":\#(line),"#, with: replacement)
            let imported = try await Tool.importLines(lines, file: directory.appending(name), into: directory.appending("copy"))
            #expect(imported.status == 2 && imported.errors.contains(name) && imported.errors.contains(message), "\(imported.errors)")
            let left = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasPrefix("copy") }
            #expect(left.isEmpty, "\(name) left \(left)")
        }
        // A file cut short (its last entry lost) falls short of its header.
        let imported = try await Tool.importLines(exported.dropLast(), file: directory.appending("cut.jsonl"), into: directory.appending("copy"))
        #expect(imported.status == 2 && imported.errors.contains("the entries end at offset 2, the header says 3"), "\(imported.errors)")
    }
}

extension LogToolExportTests {
    /// A header whose compaction watermark lies past the log's last entry
    /// would let holes hide the loss of entries the store appends later
    /// (storage.md, section 4: the watermark is at most the last offset).
    @Test func anImportWithAWatermarkPastItsEndIsRefused() async throws {
        let directory = try TemporaryDirectory("logtool-import-watermark")
        var lines = try await Tool.exportOfNewStore(at: directory.appending("source")) { store in
            for number in 0..<3 { try await store.create(type: "te", id: "e\(number)", fields: [:]) }
        }
        #expect(lines.first?.contains(#""compacted_below":0,"#) == true, "\(lines)")
        lines[0] = lines[0].replacingOccurrences(of: #""compacted_below":0,"#, with: #""compacted_below":100,"#)
        let imported = try await Tool.importLines(lines, file: directory.appending("watermark.jsonl"), into: directory.appending("copy"))
        #expect(imported.status == 2 && imported.errors.contains("compaction watermark 100"), "\(imported.errors)")
        #expect(!FileManager.default.fileExists(atPath: directory.appending("copy")))
    }
}

extension LogToolExportTests {
    /// A line whose remote operation or deletion flag is not one the format
    /// has is refused, naming the line and the field, rather than read as
    /// an upsert or as not deleted.
    @Test func anImportWithAnUnknownOperationOrFlagIsRefused() async throws {
        let directory = try TemporaryDirectory("logtool-import-strict")
        let lines = try await Tool.exportOfNewStore(at: directory.appending("source")) { store in
            // a created and deleted, then b: folded below 3, a is a deleted
            // snapshot; b's delete at 4 stays a remote entry.
            let changes = [
                PulledChange(.upsert, entityType: "te", entityID: "a", serverVersion: 1, fields: ["n": 1]),
                PulledChange(.delete, entityType: "te", entityID: "a", serverVersion: 2),
                PulledChange(.upsert, entityType: "te", entityID: "b", serverVersion: 3, fields: ["n": 2]),
                PulledChange(.delete, entityType: "te", entityID: "b", serverVersion: 4),
                PulledChange(.upsert, entityType: "te", entityID: "c", serverVersion: 5, fields: ["n": 3]),
            ]
            for (index, change) in changes.enumerated() { try await store.applyPulledPage([change], cursor: "c\(index)") }
            _ = try await store.compact(below: 3)
        }
        let damaged = [
            ("operation", #""operation":"delete""#, #""operation":"remove""#),
            ("deleted", #""deleted":true"#, #""deleted":"yes""#),
        ]
        for (field, good, bad) in damaged {
            guard let index = lines.firstIndex(where: { $0.contains(good) }) else {
                Issue.record("no line has \(good): \(lines)")
                continue
            }
            var changed = lines
            changed[index] = changed[index].replacingOccurrences(of: good, with: bad)
            let imported = try await Tool.importLines(
                changed, file: directory.appending("\(field).jsonl"), into: directory.appending("copy-\(field)"))
            #expect(imported.status == 2 && imported.errors.contains("\(field).jsonl:\(index + 1)"), "\(imported.errors)")
            #expect(imported.errors.contains(field), "\(imported.errors)")
            #expect(!FileManager.default.fileExists(atPath: directory.appending("copy-\(field)")))
        }
    }
}

@Suite struct LogToolBundleTests {
    @Test func aBundleKeepsTheTailAndOnlyTheEntitiesItTouches() async throws {
        let directory = try TemporaryDirectory("logtool-bundle")
        let source = directory.appending("source")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            try await store.applyPulledPage((0..<50).map { PulledChange(.upsert, entityType: "te", entityID: "other\($0)", serverVersion: 1, fields: ["secret": .int(Int64($0))]) }, cursor: "c1")
            try await store.applyPulledPage([PulledChange(.upsert, entityType: "te", entityID: "bug", serverVersion: 1, fields: ["n": 1])], cursor: "c2")
            try await store.create(type: "te", id: "pending-other", fields: [:])
            // The tail: what the bug report is about.
            try await store.update(type: "te", id: "bug", changes: ["n": 2])
            try await store.update(type: "te", id: "bug", changes: ["n": 3])
            store.close()
        }
        let bundle = directory.appending("bundle")
        let run = try await Tool.run(["bundle", source, "--tail", "2", "--output", bundle])
        #expect(run.status == 0, "\(run.errors)")
        #expect(run.output == "bundled offsets 53...54 and 1 entity into \(bundle)\n", "\(run.output)")
        #expect(try await Tool.run(["verify", bundle]).status == 0)
        let entities = try await Tool.run(["entities", bundle, "te", "--json"]).objects()
        #expect(entities.map { $0["id"] as? String } == ["bug"])
        #expect((entities.first?["fields"] as? [String: Any])?["n"] as? Int == 3)
        #expect(entities.first?["server_version"] as? Int == 1)
        let offsets = try await Tool.run(["dump", bundle, "--json"]).objects().compactMap { $0["offset"] as? Int }
        #expect(Array(offsets.suffix(2)) == [53, 54])
        #expect(try await Tool.run(["outbox", bundle, "--json"]).objects().count == 2)
        #expect(try await !Tool.run(["dump", bundle]).output.contains("secret"))
    }

    /// A damaged entry that `bundle` meets in its copy of the store is the
    /// store's: the error names the store and the offset, not the output
    /// directory (which is removed), below the tail or in it.
    @Test(arguments: [2, 5])
    func aBundleOfADamagedStoreNamesTheStore(tail: Int) async throws {
        let directory = try TemporaryDirectory("logtool-bundle-damaged")
        let source = directory.appending("store")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            for n in 0..<6 { try await store.create(type: "te", id: "e\(n)", fields: ["n": .int(Int64(n))]) }
            store.close()
        }
        try Tool.damageEntry(at: 3, inStore: source)
        let output = directory.appending("out")
        let run = try await Tool.run(["bundle", source, "--tail", "\(tail)", "-o", output])
        #expect(run.status == 2)
        #expect(run.errors.contains("\(source) at offset 3: corrupt entry") && !run.errors.contains(output), "\(run.errors)")
        #expect(!FileManager.default.fileExists(atPath: output))
    }

    /// `--json`, which every command with a store path offers, makes
    /// `bundle` print one JSON object too, not its sentence.
    @Test func bundlePrintsJSONWhenAsked() async throws {
        let directory = try TemporaryDirectory("logtool-bundle-json")
        let source = directory.appending("store")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            try await store.create(type: "te", id: "b", fields: [:])
            store.close()
        }
        let output = directory.appending("out")
        let run = try await Tool.run(["bundle", source, "--tail", "1", "-o", output, "--json"])
        #expect(run.status == 0, "\(run.errors)")
        let report = try #require(try run.objects().first, "\(run.output)")
        #expect(report["path"] as? String == output && report["entities"] as? Int == 1)
        #expect(report["first_offset"] as? Int == 2 && report["last_offset"] as? Int == 2)
    }

    /// A tail that answers an intent below it (an ack or a reject, which
    /// names no entity itself) keeps that intent and its entity, as the
    /// discussion promises ("the intents the tail answers"); an entity
    /// below the tail that nothing in it names stays out.
    @Test(arguments: [PushOutcome.acknowledged(.applied, serverVersion: 1), .rejected(code: "INVALID", message: "no")])
    func aBundleKeepsTheIntentItsTailAnswers(answer: PushOutcome) async throws {
        let directory = try TemporaryDirectory("logtool-bundle-answer")
        let source = directory.appending("store")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            try await store.create(type: "te", id: "answered", fields: ["n": 1])
            try await store.create(type: "te", id: "other", fields: ["n": 2])
            _ = try await store.record([(offset: 1, outcome: answer)])
            store.close()
        }
        let bundle = directory.appending("bundle")
        let run = try await Tool.run(["bundle", source, "--tail", "1", "-o", bundle])
        #expect(run.status == 0, "\(run.errors)")
        #expect(run.output == "bundled offsets 3...3 and 1 entity into \(bundle)\n", "\(run.output)")
        #expect(try await Tool.run(["verify", bundle]).status == 0)
        let intents = try await Tool.run(["dump", bundle, "--kind", "intent", "--json"]).objects()
        #expect(intents.map { $0["offset"] as? Int } == [1] && intents.map { $0["entity_id"] as? String } == ["answered"], "\(intents)")
    }

    /// An answer below the tail names no entity itself; it goes with the
    /// entity of its intent. Compaction keeps an answered intent and its
    /// ack while the entity has a pending intent after it; when the tail
    /// does not touch that entity, the ack goes too, not only its intents.
    @Test func aBundleLeavesOutAnAnswerBelowTheTailToAnEntityItDoesNotTouch() async throws {
        let directory = try TemporaryDirectory("logtool-bundle-answer-below")
        let source = directory.appending("store")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            try await store.create(type: "te", id: "untouched", fields: ["n": 1])
            try await store.update(type: "te", id: "untouched", changes: ["n": 2])
            _ = try await store.record([(offset: 1, outcome: .acknowledged(.applied, serverVersion: 1))])
            try await store.create(type: "te", id: "tail", fields: [:])
            store.close()
        }
        let bundle = directory.appending("bundle")
        let run = try await Tool.run(["bundle", source, "--tail", "1", "-o", bundle])
        #expect(run.status == 0, "\(run.errors)")
        #expect(try await Tool.run(["dump", bundle, "--json"]).objects().compactMap { $0["offset"] as? Int } == [4])
        #expect(try await Tool.run(["entities", bundle, "te", "--json"]).objects().map { $0["id"] as? String } == ["tail"])
    }

    /// A resync below the tail names no entity, and stays: compaction
    /// keeps the ack of an intent whose conflict waits for the app, and the
    /// resync after that ack forgot the base it gave. Left out, a replay of
    /// the bundle would give the entity that base again.
    @Test func aBundleKeepsAResyncThatForgetsTheBaseOfAKeptAnswer() async throws {
        let directory = try TemporaryDirectory("logtool-bundle-resync")
        let source = directory.appending("store")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: ["n": 1])  // 1
            try await store.record([(1, .acknowledged(.applied, serverVersion: 1))])  // 2
            try await store.resync(reason: "test")  // 3
            // The tail: a conflict of the acked intent, left for the app.
            // Only a raw append writes one; the next open projects it.
            _ = try await store.log.append(
                .conflict(
                    Conflict(
                        intentOffset: 1, entityType: "te", entityID: "a", serverVersion: 2, serverFields: ["n": 2],
                        resolution: .pending)))  // 4
            store.close()
        }
        let bundle = directory.appending("bundle")
        let run = try await Tool.run(["bundle", source, "--tail", "1", "-o", bundle])
        #expect(run.status == 0, "\(run.errors)")
        #expect(try await Tool.run(["dump", bundle, "--json"]).objects().compactMap { $0["offset"] as? Int } == [1, 2, 3, 4])
        #expect(try await Tool.run(["conflicts", bundle, "--json"]).objects().map { $0["intent_offset"] as? Int } == [1])
        #expect(try await Tool.run(["entities", source, "te", "--json"]).output.isEmpty)
        #expect(try await Tool.run(["entities", bundle, "te", "--json"]).output.isEmpty)
    }

    /// A hole in the log (an offset missing above the compaction
    /// watermark) that `bundle` meets in its copy, below the tail, is the
    /// store's too: the error names the store, not the output directory
    /// (which is removed).
    @Test func aBundleOfAStoreWithAHoleNamesTheStore() async throws {
        let directory = try TemporaryDirectory("logtool-bundle-hole")
        let source = directory.appending("store")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            for n in 0..<6 { try await store.create(type: "te", id: "e\(n)", fields: ["n": .int(Int64(n))]) }
            store.close()
        }
        do {
            let environment = try Environment(path: source)
            defer { environment.close() }
            let log = try #require(try environment.openDatabase("log", create: false))
            _ = try environment.write { txn in try txn.delete(log, key: UInt64(3).bigEndianBytes) }
        }
        let output = directory.appending("out")
        let run = try await Tool.run(["bundle", source, "--tail", "2", "-o", output])
        #expect(run.status == 2)
        #expect(run.errors.contains(source) && !run.errors.contains(output), "\(run.errors)")
        #expect(!FileManager.default.fileExists(atPath: output))
    }

    /// `--tail 0` would keep nothing; it is refused as a usage error
    /// before anything is written.
    @Test func aBundleOfNoEntriesIsRefused() async throws {
        let directory = try TemporaryDirectory("logtool-bundle-zero")
        let source = directory.appending("store")
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            store.close()
        }
        let output = directory.appending("out")
        let run = try await Tool.run(["bundle", source, "--tail", "0", "-o", output])
        #expect(run.status == 2 && run.errors.contains("--tail must be at least 1"), "\(run.status) \(run.errors)")
        #expect(!FileManager.default.fileExists(atPath: output))
    }
}

extension LogToolExportTests {
    /// `u64` fields run to 2^64 - 1 (`Format/README.md`): a log at the last
    /// offsets, with versions and timestamps past 2^63 - 1, imports exactly,
    /// and 2^64 is refused, naming the line and the field. Before,
    /// `JSONReader` read every whole number past Int64 as a double, and
    /// import refused such a field as "not a count".
    @Test func anImportReadsU64FieldsUpTo2To64Minus1() async throws {
        let directory = try TemporaryDirectory("logtool-import-u64")
        let source = directory.appending("source")
        let top = UInt64.max
        do {
            let store = try Store(path: source, options: .init(durability: .process))
            let intent = Intent(.update, idempotencyKey: "k", entityType: "te", entityID: "e", baseVersion: top - 1, fields: ["n": 2])
            let bodies: [EntryBody] = [
                .remote(Remote(cursor: "c", .upsert, entityType: "te", entityID: "e", serverVersion: top - 1, fields: ["n": 1])),
                .intent(intent),
                .ack(Ack(intentOffset: top - 1, outcome: .applied, serverVersion: top)),
            ]
            let entries = bodies.enumerated().map { index, body in
                Entry(offset: top - 2 + UInt64(index), timestamp: HybridTimestamp(rawValue: top - 2 + UInt64(index)), body: body)
            }
            try await store.restore(entries, compactedBelow: top - 2)
            store.close()
        }
        let lines = try await Tool.run(["export", source]).lines
        #expect(lines.count == 4 && lines[3].contains(#""server_version":18446744073709551615"#), "\(lines)")
        let copy = directory.appending("copy")
        let imported = try await Tool.importLines(lines, file: directory.appending("top.jsonl"), into: copy)
        #expect(imported.status == 0, "\(imported.errors)")
        let dumped = try await Tool.run(["dump", source, "--json"]).output
        let dumpedCopy = try await Tool.run(["dump", copy, "--json"]).output
        #expect(!dumped.isEmpty && dumped == dumpedCopy)
        #expect(try await Tool.run(["verify", copy]).status == 0)
        for field in ["server_version", "offset", "timestamp"] {
            let over = lines.enumerated().map { index, line in
                index == 3 ? line.replacingOccurrences(of: #""\#(field)":18446744073709551615"#, with: #""\#(field)":18446744073709551616"#) : line
            }
            #expect(over[3] != lines[3], "\(field)")
            let refused = try await Tool.importLines(over, file: directory.appending("over.jsonl"), into: directory.appending("over"))
            #expect(refused.status == 2 && refused.errors.contains("over.jsonl:4: \(field)"), "\(refused.errors)")
            #expect(!FileManager.default.fileExists(atPath: directory.appending("over")))
        }
    }
}

extension LogToolTests {
    /// `--seconds` past what a `Duration` holds (`inf`, `1e300`) is a usage
    /// error, not a trap when `tail --follow` computes its deadline.
    @Test(arguments: ["inf", "1e300", "nan"])
    func tailRefusesSecondsItCannotWaitFor(seconds: String) async throws {
        let directory = try TemporaryDirectory("logtool-tail-seconds")
        try EventLog(path: directory.path, options: .init(durability: .process)).close()
        let run = try await Tool.run(["tail", directory.path, "--follow", "--seconds", seconds])
        #expect(run.status == 2 && run.errors.contains("--seconds"), "exit \(run.status): \(run.errors.prefix(300))")
    }
}

extension LogToolExportTests {
    /// The header's `format` and `version` are read before anything else
    /// in it: an export of a newer version (whose header may have other
    /// members) is named as such, and a file of another kind as not an export.
    @Test func anImportNamesAnExportVersionItDoesNotRead() async throws {
        let directory = try TemporaryDirectory("logtool-import-version")
        let cases = [
            (#"{"format":"syncstore-export","version":2,"last_offset":0}"#, "v2.jsonl:1: export version 2; this logtool reads version 1"),
            (#"{"format":"syncstore-export","version":1,"entry_format":2,"compacted_below":0,"last_offset":0}"#, "v2.jsonl:1: entries of format version 2; this logtool reads version 1"),
            (#"{"format":"something-else","version":1,"entry_format":1,"compacted_below":0,"last_offset":0}"#, "v2.jsonl:1: not a syncstore export"),
        ]
        for (header, message) in cases {
            let run = try await Tool.importLines([header], file: directory.appending("v2.jsonl"), into: directory.appending("copy"))
            #expect(run.status == 2 && run.errors.contains(message), "\(run.errors)")
            #expect(!FileManager.default.fileExists(atPath: directory.appending("copy")))
        }
    }
}

extension LogToolExportTests {
    /// An export whose lines end in CRLF (it went through an editor on
    /// Windows) imports as the same log: the CR is JSON whitespace. It was
    /// one line, since Swift's `Character` "\r\n" is not "\n".
    @Test func anExportWithCRLFLineEndsImports() async throws {
        let directory = try TemporaryDirectory("logtool-import-crlf")
        let source = directory.appending("source")
        let lines = try await Tool.exportOfNewStore(at: source) { store in
            try await store.create(type: "te", id: "a", fields: ["text": "two\r\nlines"])
            try await store.update(type: "te", id: "a", changes: ["n": 1])
        }
        let copy = directory.appending("copy")
        let imported = try await Tool.importLines(lines.map { $0 + "\r" }, file: directory.appending("crlf.jsonl"), into: copy)
        #expect(imported.status == 0, "\(imported.errors)")
        let dumped = try await Tool.run(["dump", source, "--json"]).output
        let dumpedCopy = try await Tool.run(["dump", copy, "--json"]).output
        #expect(!dumped.isEmpty && dumped == dumpedCopy)
    }
}

extension LogToolExportTests {
    /// `-o` naming a link to an older, longer export replaces the file the
    /// link names, and the link stays. It was taken for a pipe or a device
    /// (not a regular file) and written in place without truncation: the
    /// old export's tail stayed after the new one, a file import refuses.
    @Test func anExportThroughALinkReplacesTheFileItNames() async throws {
        let directory = try TemporaryDirectory("logtool-export-link")
        let source = directory.appending("source")
        let lines = try await Tool.exportOfNewStore(at: source) { store in
            try await store.create(type: "te", id: "a", fields: ["n": 1])
        }
        let file = directory.appending("old.jsonl")
        let link = directory.appending("link.jsonl")
        try String(repeating: "x", count: 100_000).write(toFile: file, atomically: true, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: file)
        let exported = try await Tool.run(["export", source, "-o", link])
        #expect(exported.status == 0, "\(exported.errors)")
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: link) == file)
        #expect(try String(contentsOfFile: file, encoding: .utf8) == lines.joined(separator: "\n") + "\n")
        #expect(try await Tool.run(["import", link, directory.appending("copy")]).status == 0)
    }
}

extension LogToolTests {
    /// Below the compaction watermark a log has holes (storage.md, section
    /// 4): `tail -n N` and `bundle --tail N` count entries, not offsets, and
    /// `show` names a hole as one.
    /// They took the last N offsets, holes included, so a log of entries
    /// at 1 and 20 (compacted below 20) had one "last 2 entries".
    @Test func tailAndBundleCountEntriesNotHoles() async throws {
        let directory = try TemporaryDirectory("logtool-tail-holes")
        let store = directory.appending("store")
        let lines = [
            #"{"compacted_below":20,"entry_format":1,"format":"syncstore-export","last_offset":20,"version":1}"#,
            #"{"kind":"resync","offset":1,"reason":"first","timestamp":5}"#,
            #"{"kind":"resync","offset":20,"reason":"last","timestamp":6}"#,
        ]
        let imported = try await Tool.importLines(lines, file: directory.appending("holes.jsonl"), into: store)
        #expect(imported.status == 0, "\(imported.errors)")
        for (count, offsets) in [(1, [20]), (2, [1, 20]), (5, [1, 20])] {
            let tail = try await Tool.run(["tail", store, "-n", "\(count)", "--json"])
            #expect(try tail.objects().compactMap { $0["offset"] as? Int } == offsets, "-n \(count): \(tail.errors)")
        }
        // `show` of a hole says what made it, not that the log ends at 20.
        let hole = try await Tool.run(["show", store, "5"])
        #expect(hole.status == 2 && hole.errors == "logtool: no entry at offset 5 (compaction below 20 removed it)\n", "\(hole.errors)")
        let past = try await Tool.run(["show", store, "21"])
        #expect(past.status == 2 && past.errors == "logtool: no entry at offset 21 (the log ends at 20)\n", "\(past.errors)")
        let bundle = directory.appending("bundle")
        let bundled = try await Tool.run(["bundle", store, "--tail", "2", "-o", bundle])
        #expect(bundled.status == 0, "\(bundled.errors)")
        #expect(try await Tool.run(["dump", bundle, "--json"]).objects().compactMap { $0["offset"] as? Int } == [1, 20])
    }
}

extension LogToolTests {
    /// Strings come from apps and servers. The text renderings of `dump`,
    /// `entities` and `outbox` keep each entry on its line and let no
    /// control character reach the terminal (an ESC starts an escape
    /// sequence): they are escaped, as `\n` and `\u{1B}`.
    @Test func textOutputKeepsOneLinePerEntryWhateverTheStrings() async throws {
        let directory = try TemporaryDirectory("logtool-one-line")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "id\nwith a break", fields: ["text": "two\nlines \u{1B}[31mred", "a\tb": 1])
            try await store.create(type: "te", id: "b", fields: [:])
            let pending = try store.outbox()
            try await store.record([(pending[1].offset, .rejected(code: "VALIDATION_ERROR", message: "bad\r\nanswer\u{85}"))])
            store.close()
        }
        for command in [["dump"], ["tail"], ["entities", "te"], ["outbox"]] {
            let run = try await Tool.run([command[0], directory.path] + command.dropFirst())
            #expect(run.status == 0, "\(command): \(run.errors)")
            let expected = ["dump": 3, "tail": 3, "entities": 1, "outbox": 1][command[0]]
            #expect(run.lines.count == expected, "\(command): \(run.output)")
            #expect(!run.output.unicodeScalars.contains { $0.properties.generalCategory == .control && $0 != "\n" }, "\(command)")
        }
        let dump = try await Tool.run(["dump", directory.path]).output
        #expect(dump.contains(#"te/id\nwith a break [a\tb: 1, text: "two\nlines \u{1B}[31mred"]"#), "\(dump)")
        #expect(dump.contains(#"VALIDATION_ERROR: bad\r\nanswer\u{85}"#), "\(dump)")
    }
}

extension LogToolExportTests {
    /// An entry the store refuses (a bad entity type, a timestamp that does
    /// not rise) is named by its line in the file and its offset, as a
    /// hole is, and as the README says a message names a line. It was
    /// named "entry N of the import", which misses the header and blank
    /// lines: with a blank line after the header, entry 2 is on line 4.
    @Test func anImportNamesTheEntryTheStoreRefuses() async throws {
        let directory = try TemporaryDirectory("logtool-import-refused")
        let lines = try await Tool.exportOfNewStore(at: directory.appending("source")) { store in
            for number in 0..<3 { try await store.create(type: "te", id: "e\(number)", fields: [:]) }
        }
        let first = try #require(try JSONSerialization.jsonObject(with: Data(lines[1].utf8)) as? [String: Any])
        let timestamp = try #require(first["timestamp"] as? UInt64)
        var typed = lines
        typed[2] = typed[2].replacingOccurrences(of: #""entity_type":"te""#, with: #""entity_type":"TE""#)
        typed.insert("", at: 1)
        var early = lines
        early[3] = try early[3].replacing(Regex(#""timestamp":\d+"#), with: #""timestamp":\#(timestamp)"#)
        early.insert("", at: 1)
        let cases = [
            ("type.jsonl", typed, "the entry on line 4, at offset 2: entity type \"TE\""),
            ("early.jsonl", early, "the entry on line 5, at offset 3: entries must follow offset 2 in order, with later timestamps"),
        ]
        for (name, changed, message) in cases {
            #expect(changed != lines)
            let imported = try await Tool.importLines(changed, file: directory.appending(name), into: directory.appending("copy"))
            #expect(imported.status == 2 && imported.errors.contains("\(name): \(message)"), "\(imported.errors)")
            #expect(!FileManager.default.fileExists(atPath: directory.appending("copy")))
        }
    }
}

extension LogToolExportTests {
    /// `export` writes JSON lines whatever it is told: it took `--json`
    /// and did nothing with it. The option is gone: asked for, it is
    /// refused (exit 2), and `--help` does not offer it.
    @Test func exportHasNoJSONOption() async throws {
        let directory = try TemporaryDirectory("logtool-export-json")
        let source = directory.appending("source")
        _ = try await Tool.exportOfNewStore(at: source) { store in try await store.create(type: "te", id: "a", fields: [:]) }
        let refused = try await Tool.run(["export", source, "--json"])
        #expect(refused.status == 2 && refused.errors.contains("--json"), "exit \(refused.status): \(refused.errors)")
        #expect(refused.output.isEmpty)
        let help = try await Tool.run(["export", "--help"])
        let offered = help.lines.filter { $0.contains("[--json]") || $0.trimmingCharacters(in: .whitespaces).hasPrefix("--json") }
        #expect(help.status == 0 && offered.isEmpty, "\(help.output)")
    }
}

extension LogToolExportTests {
    /// The export lines of a log of `count` resync entries (offsets 1...count,
    /// rising timestamps), each with `reason`, and a header that ends at `last`.
    static func resyncExport(count: Int, last: Int? = nil, reason: String = "r") -> [String] {
        let header = #"{"compacted_below":0,"entry_format":1,"format":"syncstore-export","last_offset":\#(last ?? count),"version":1}"#
        return [header] + (1...count).map { #"{"kind":"resync","offset":\#($0),"reason":"\#(reason)","timestamp":\#($0 << 16)}"# }
    }

    /// `import` reads its file a line at a time (a multi-GB export must
    /// import in bounded memory): it held the whole file. A file larger than the new store's first map (64
    /// MiB), which makes the import's transaction run again once the map
    /// has grown, imports whole; an error far into a long file names its line.
    @Test func aLargeImportWorksAndNamesTheLineOfAnError() async throws {
        let directory = try TemporaryDirectory("logtool-import-large")
        let big = Self.resyncExport(count: 24, reason: String(repeating: "x", count: 3 << 20))
        let bigStore = directory.appending("big")
        let imported = try await Tool.importLines(big, file: directory.appending("big.jsonl"), into: bigStore)
        #expect(imported.status == 0 && imported.output.contains("imported 24 entries"), "\(imported.errors)")
        let report = try #require(try await Tool.run(["stat", bigStore, "--json"]).objects().first)
        #expect(report["entries"] as? Int == 24 && report["last_offset"] as? Int == 24)
        // The map grew past its first 64 MiB: the transaction ran again, reading the file again from its first entry.
        #expect((report["map_bytes"] as? Int ?? 0) > 64 << 20, "\(report)")
        let reason = try #require(try await Tool.run(["show", bigStore, "24", "--json"]).objects().first?["reason"] as? String)
        #expect(reason.utf8.count == 3 << 20)

        var long = Self.resyncExport(count: 20_000)
        long[15_000] = #"{"kind":"resync","offset":15000,"timestamp":1}"#
        let refused = try await Tool.importLines(long, file: directory.appending("long.jsonl"), into: directory.appending("long"))
        #expect(refused.status == 2 && refused.errors.contains("long.jsonl:15001: "), "\(refused.errors)")
        #expect(!FileManager.default.fileExists(atPath: directory.appending("long")))
    }

    /// Blank lines are skipped but counted: a message names the line as
    /// an editor numbers it. They were left out of the count.
    @Test func anImportNamesTheFilesOwnLineNumbers() async throws {
        let directory = try TemporaryDirectory("logtool-import-blank")
        var lines = Self.resyncExport(count: 3)
        lines[3] = #"{"kind":"resync","offset":3}"#
        lines.insert("", at: 1)
        lines.insert("", at: 3)
        lines.insert("", at: 3)
        // header, blank, entry 1, blank, blank, entry 2, damaged entry 3
        let imported = try await Tool.importLines(lines, file: directory.appending("blank.jsonl"), into: directory.appending("copy"))
        #expect(imported.status == 2 && imported.errors.contains("blank.jsonl:7: "), "\(imported.errors)")
        lines[6] = #"{"kind":"resync","offset":3,"reason":"r","timestamp":196608}"#
        let fine = try await Tool.importLines(lines, file: directory.appending("blank.jsonl"), into: directory.appending("copy"))
        #expect(fine.status == 0 && fine.output.contains("imported 3 entries"), "\(fine.errors)")
    }
}

extension LogToolExportTests {
    /// The header's `last_offset` is the offset of the file's last entry
    /// (export writes both from one read transaction): an entry past it is
    /// refused, naming its line, as a file that ends before it is. Such
    /// entries were imported.
    @Test func anImportWithEntriesPastTheHeadersLastOffsetIsRefused() async throws {
        let directory = try TemporaryDirectory("logtool-import-past")
        let lines = Self.resyncExport(count: 3, last: 2)
        let imported = try await Tool.importLines(lines, file: directory.appending("past.jsonl"), into: directory.appending("copy"))
        #expect(imported.status == 2, "exit \(imported.status): \(imported.output)")
        #expect(imported.errors.contains("past.jsonl:4: ") && imported.errors.contains("last_offset 2"), "\(imported.errors)")
        #expect(!FileManager.default.fileExists(atPath: directory.appending("copy")))
        let exact = try await Tool.importLines(lines.dropLast(), file: directory.appending("exact.jsonl"), into: directory.appending("copy"))
        #expect(exact.status == 0, "\(exact.errors)")
    }
}

extension LogToolTests {
    /// A `u64` is a JSON number throughout the tool (Format/README.md), as
    /// `stat` and `compact` print offsets: `cursors`, `replay` and `verify`
    /// printed theirs (and replay's seconds) as strings.
    @Test func offsetsAreJSONNumbersInEveryCommand() async throws {
        let directory = try await makeStore("logtool-json-numbers")
        let cursors = try #require(try await Tool.run(["cursors", directory.path, "--json"]).objects().first)
        #expect(cursors["projection_watermark"] as? Int == 6, "\(cursors)")
        let replay = try #require(try await Tool.run(["replay", directory.path, "--json"]).objects().first)
        #expect(replay["watermark"] as? Int == 6, "\(replay)")
        #expect(replay["seconds"] is NSNumber, "\(replay)")
        try Tool.damageEntry(at: 2, inStore: directory.path)
        let verify = try await Tool.run(["verify", directory.path, "--json"])
        #expect(verify.status == 1)
        #expect(try verify.objects().first?["offset"] as? Int == 2, "\(verify.output)")
    }
}

extension LogToolTests {
    /// `conflicts` lists what waits in `Store.conflicts()`'s order, by
    /// intent, in text and JSON; it printed the conflict entries in log
    /// order, which differs when a later intent's conflict came first.
    @Test func conflictsAreListedInTheStoresOrder() async throws {
        let directory = try TemporaryDirectory("logtool-conflicts-order")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: ["n": 1])  // 1
            try await store.create(type: "te", id: "b", fields: ["n": 1])  // 2
            try await store.record([(2, .conflict(ServerState(serverVersion: 5, deleted: false, data: ["n": 5]), message: "newer"))])
            try await store.record([(1, .conflict(ServerState(serverVersion: 3, deleted: false, data: ["n": 3]), message: "newer"))])
            #expect(try store.conflicts().map(\.conflict.serverVersion) == [3, 5])
            store.close()
        }
        let json = try await Tool.run(["conflicts", directory.path, "--json"]).objects()
        #expect(json.map { $0["server_version"] as? Int } == [3, 5])
        let offsets = json.compactMap { $0["offset"] as? Int }
        let text = try await Tool.run(["conflicts", directory.path])
        var shown: [String] = []
        for offset in offsets { shown += try await Tool.run(["show", directory.path, "\(offset)"]).lines }
        #expect(text.status == 0 && offsets.count == 2 && text.lines == shown, "\(text.output)")
    }
}

extension LogToolTests {
    /// `stat` tells pending intents from failed ones (waiting for the
    /// app's `retryFailed`): it called them all pending.
    @Test func statCountsFailedIntentsApart() async throws {
        let directory = try TemporaryDirectory("logtool-stat-failed")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            try await store.create(type: "te", id: "b", fields: [:])
            try await store.create(type: "te", id: "c", fields: [:])
            try await store.markFailed(offsets: [1], error: "permanent")
            store.close()
        }
        let text = try await Tool.run(["stat", directory.path])
        #expect(text.output.contains("outbox      2 pending, 1 failed"), "\(text.output)")
        let report = try #require(try await Tool.run(["stat", directory.path, "--json"]).objects().first)
        #expect(report["outbox"] as? Int == 3 && report["outbox_failed"] as? Int == 1, "\(report)")
        let outbox = try await Tool.run(["outbox", directory.path, "--json"]).objects()
        #expect(outbox.map { $0["status"] as? String } == ["failed", "pending", "pending"], "\(outbox)")
        let listed = try await Tool.run(["outbox", directory.path]).lines
        #expect(listed.first == "#1  failed, 1 attempts  create te/a  last error: permanent")
    }

    /// The age `stat` gives is the oldest pending intent's: a failed one
    /// waits for the app, not for a push, so with none pending there is
    /// no age.
    @Test func statGivesNoPendingAgeWhenEveryIntentFailed() async throws {
        let directory = try TemporaryDirectory("logtool-stat-all-failed")
        do {
            let store = try Store(path: directory.path, options: .init(durability: .process))
            try await store.create(type: "te", id: "a", fields: [:])
            try await store.markFailed(offsets: [1], error: "permanent")
            store.close()
        }
        let report = try #require(try await Tool.run(["stat", directory.path, "--json"]).objects().first)
        #expect(report["outbox_failed"] as? Int == 1 && report["oldest_pending_seconds"] == nil, "\(report)")
        #expect(!(try await Tool.run(["stat", directory.path]).output.contains("oldest pending")))
    }
}

extension LogToolTests {
    /// `verify --scratch DIR` makes its scratch copy in DIR (not $TMPDIR)
    /// and removes it; a DIR that is not a directory is refused.
    @Test func verifyTakesAScratchDirectory() async throws {
        let directory = try await makeStore("logtool-verify-scratch")
        let scratch = try TemporaryDirectory("logtool-verify-scratch-dir")
        let verify = try await Tool.run(["verify", directory.path, "--scratch", scratch.path])
        #expect(verify.status == 0 && verify.errors.contains("6 entries checked, 0 problems"), "\(verify.errors)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: scratch.path).isEmpty)
        let file = scratch.appending("file")
        _ = FileManager.default.createFile(atPath: file, contents: Data())
        let refused = try await Tool.run(["verify", directory.path, "--scratch", file])
        #expect(refused.status == 2 && refused.errors.contains(file), "exit \(refused.status): \(refused.errors)")
        #expect(try await Tool.run(["verify", "--help"]).output.contains("--scratch"))
    }
}

extension LogToolExportTests {
    /// An `export` killed inside its read (as an interrupt kills it: no
    /// handler closes the store) leaves its LMDB reader slot behind, still
    /// naming the snapshot it read, and LMDB reuses no page freed after
    /// that snapshot. Only an open of the store cleared such slots, so the
    /// app writing all along found every page its commits freed pinned: the
    /// file and the map grew with every commit (here past 32 MiB for a log
    /// of a few hundred KiB). The writer now clears the slots of dead
    /// processes before it grows the map.
    @Test func aReaderKilledInsideItsReadPinsNoPages() async throws {
        let directory = try TemporaryDirectory("logtool-export-killed")
        var options = EventLog.Options(durability: .process)
        options.initialMapSize = 1 << 20
        let log = try EventLog(path: directory.path, options: options)
        defer { log.close() }
        // More than a pipe holds, so the export stays inside its read.
        _ = try await log.append(contentsOf: (0..<2_000).map { .resync(reason: "entry \($0) " + String(repeating: "x", count: 100)) })
        // `sleep` holds the pipe and reads none of it once `head` has the header.
        let export = try ChildProcess(
            executable: "/bin/sh", arguments: ["-c", #""$0" export "$1" | { head -n 1; exec sleep 600; }"#, Tool.path("logtool"), directory.path],
            ownProcessGroup: true)
        let header = await export.waitForLine(timeout: .seconds(60)) { $0.contains("syncstore-export") }
        export.kill()
        #expect(await export.waitForExit(timeout: .seconds(60)))
        try #require(header != nil, "the export wrote no header: \(export.errorText)")
        for number in 0..<3_000 { _ = try await log.append(.resync(reason: "after \(number)")) }
        let usage = log.mapUsage()
        #expect(usage.mapSize <= 4 << 20, "map \(usage.mapSize) bytes, \(usage.usedBytes) used")
    }
}

extension LogToolTests {
    /// A `data.mdb` that cannot be looked at is named with the reason, not
    /// called missing: a store in a directory without search permission
    /// was "not a sync store: no data.mdb in the directory". Root (which
    /// these tests may run as) is refused no permission, so a `data.mdb`
    /// that links to itself stands in for it: looking at it fails with
    /// ELOOP as the other fails with EACCES, and only ENOENT means "none".
    @Test func aDataFileThatCannotBeLookedAtIsNotCalledMissing() async throws {
        let directory = try TemporaryDirectory("logtool-unlookable")
        try FileManager.default.createSymbolicLink(atPath: directory.appending("data.mdb"), withDestinationPath: "data.mdb")
        let run = try await Tool.run(["stat", directory.path])
        #expect(run.status == 2)
        #expect(run.errors.contains("Too many levels of symbolic links") && !run.errors.contains("no data.mdb"), "\(run.errors)")
        #expect(run.errors.split(separator: "\n").count == 1, "\(run.errors)")
    }

    /// A scratch directory `verify` cannot make (a `$TMPDIR` that is a
    /// file, or one it may not write to) is named with the reason in one
    /// line: the message was Foundation's error dump.
    @Test func aScratchDirectoryVerifyCannotMakeIsNamed() async throws {
        let directory = try await makeStore("logtool-verify-no-scratch")
        let file = directory.appending("not-a-directory")
        _ = FileManager.default.createFile(atPath: file, contents: Data("x".utf8))
        let run = try ToolRun.run("/usr/bin/env", ["TMPDIR=\(file)", Tool.path("logtool"), "verify", directory.path])
        #expect(run.status == 2)
        #expect(run.errors.contains("cannot make the scratch directory \(file)/logtool-verify-"), "\(run.errors)")
        #expect(run.errors.contains("Not a directory") && !run.errors.contains("NSCocoaErrorDomain"), "\(run.errors)")
        #expect(run.errors.split(separator: "\n").count == 1, "\(run.errors)")
    }
}

extension LogToolTests {
    /// A negative number for a numeric option is named as out of range:
    /// the parser took "-1" for an option name and said "Missing value for
    /// '-n <count>'", of a value the user had given.
    @Test func aNegativeNumberIsNamedAsOutOfRange() async throws {
        let directory = try await makeStore("logtool-negative")
        let path = directory.path
        let cases: [([String], String)] = [
            (["tail", path, "-n", "-1"], "--count must be 0 or more"),
            (["tail", path, "--follow", "--seconds", "-1"], "--seconds must be from 0"),
            (["dump", path, "--limit", "-1"], "--limit must be 0 or more"),
            (["dump", path, "--from", "-1"], "The value '-1' is invalid for '--from <from>'"),
            (["dump", path, "--to", "-1"], "The value '-1' is invalid for '--to <to>'"),
            (["bundle", path, "--tail", "-5", "-o", directory.appending("bundle")], "--tail must be at least 1"),
            (["compact", path, "--below", "-3"], "The value '-3' is invalid for '--below <below>'"),
            (["replay", path, "--to", "-2", "--output", directory.appending("as-of")], "The value '-2' is invalid for '--to <to>'"),
            (["show", path, "-1"], "The value '-1' is invalid for '<offset>'"),
            (["show", path, "--json", "-1"], "The value '-1' is invalid for '<offset>'"),
            (["show", path, "0"], "no entry at offset 0 (offsets start at 1)"),
        ]
        for (arguments, message) in cases {
            let run = try await Tool.run(arguments)
            #expect(run.status == 2 && run.errors.contains(message) && !run.errors.contains("Missing value"), "\(arguments): \(run.errors)")
        }
        #expect(!FileManager.default.fileExists(atPath: directory.appending("bundle")))
        #expect(!FileManager.default.fileExists(atPath: directory.appending("as-of")))
    }
}

extension LogToolTests {
    /// A mistyped option among `show`'s offsets is named as the parser
    /// names one, with the nearest option: taking every word left over as
    /// an offset (so that "-1" is named out of range) had it said "The
    /// value '--jsno' is invalid for '<offset>'".
    @Test func aMistypedOptionAmongTheOffsetsIsNamed() async throws {
        let directory = try await makeStore("logtool-show-option")
        let cases: [([String], String)] = [
            (["--jsno", "3"], "Error: Unknown option '--jsno'. Did you mean '--json'?"),
            (["3", "-j"], "Error: Unknown option '-j'"),
            (["3", "x"], "Error: The value 'x' is invalid for '<offset>'"),
        ]
        for (arguments, message) in cases {
            let run = try await Tool.run(["show", directory.path] + arguments)
            #expect(run.status == 2 && run.errors.hasPrefix(message + "\n"), "\(arguments): \(run.errors)")
        }
        // The offset first and the store after it: it said "The value
        // 'STORE' is invalid for '<offset>'".
        let swapped = try await Tool.run(["show", "3", directory.path])
        let message = "Error: '\(directory.path)' is a directory and '3' an offset: the store comes first (logtool show \(directory.path) 3)"
        #expect(swapped.status == 2 && swapped.errors.hasPrefix(message + "\n"), "\(swapped.errors)")
    }
}

extension LogToolTests {
    /// `export -o DIR` names the reason it cannot write there: it said
    /// "cannot write to DIR" alone.
    @Test func anExportToADirectoryNamesTheReason() async throws {
        let directory = try await makeStore("logtool-export-directory")
        let target = directory.appending("a-directory")
        try FileManager.default.createDirectory(atPath: target, withIntermediateDirectories: false)
        let run = try await Tool.run(["export", directory.path, "-o", target])
        #expect(run.status == 2)
        #expect(run.errors.contains("cannot write to \(target): Is a directory"), "\(run.errors)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: target).isEmpty)
    }
}

extension LogToolTests {
    /// `tail --follow | head -1` ends once head has: tail stops, as a write
    /// to the pipe would stop it, by SIGPIPE (status 141 in the pipeline),
    /// where it polled on until an entry came or its --seconds ran out
    /// (status 0), holding up the shell that waits for the pipeline.
    @Test func tailFollowEndsWhenItsReaderHasGone() async throws {
        let directory = try await makeStore("logtool-tail-reader-gone")
        let script = "set -o pipefail; \"$0\" tail \"$1\" -n 1 --follow --seconds 30 | head -n 1 >/dev/null"
        let run = try await ToolRun.running("/bin/bash", ["-c", script, Tool.path("logtool"), directory.path])
        #expect(run.status == 128 + SIGPIPE, "\(run.status): \(run.errors)")
    }
}

extension LogToolExportTests {
    /// An import killed midway leaves the store it was building beside
    /// NEWSTORE, `NEWSTORE.importing-PID`. Each import builds under its own
    /// PID, so a later one never met it, and it stayed for good. Now the
    /// next import into NEWSTORE removes it and says so on standard error;
    /// the directory of an import whose process runs (here this test's
    /// PID) is left to it.
    @Test func anImportRemovesWhatAKilledImportLeft() async throws {
        let directory = try TemporaryDirectory("logtool-import-killed")
        let source = directory.appending("source")
        let lines = try await Tool.exportOfNewStore(at: source) { store in
            try await store.create(type: "te", id: "a", fields: [:])
        }
        // A process that has ended and been waited for: its PID names no live import.
        let ended = Process()
        ended.executableURL = URL(fileURLWithPath: "/bin/true")
        try ended.run()
        ended.waitUntilExit()
        let copy = directory.appending("copy")
        let killed = copy + ".importing-\(ended.processIdentifier)"
        try Store(path: killed, options: .init(durability: .process)).close()
        let live = copy + ".importing-\(getpid())"
        try FileManager.default.createDirectory(atPath: live, withIntermediateDirectories: false)
        let imported = try await Tool.importLines(lines, file: directory.appending("export.jsonl"), into: copy)
        #expect(imported.status == 0, "\(imported.errors)")
        #expect(!FileManager.default.fileExists(atPath: killed))
        #expect(imported.errors.contains("removed \(killed), left by an import that was killed"), "\(imported.errors)")
        #expect(FileManager.default.fileExists(atPath: live))
        #expect(try await Tool.run(["diff", source, copy]).status == 0)
    }
}

extension LogToolTests {
    /// A store file the user may not open as LMDB must is named, with why
    /// it must: every command said "mdb_env_open (STORE): Permission
    /// denied", which named neither the file nor why a read-only command
    /// needs to write `lock.mdb` (its reader slot is there).
    @Test func aStoreFileTheUserMayNotOpenIsNamed() async throws {
        let directory = try await makeStore("logtool-file-permissions")
        let path = directory.path
        #expect(chmod(path, 0o755) == 0)
        #expect(chmod(directory.appending("lock.mdb"), 0o444) == 0)
        for arguments in [["stat", path], ["show", path, "1"], ["cursors", path], ["replay", path]] {
            let run = try await Tool.runUnprivileged(arguments)
            #expect(run.status == 2, "\(arguments): \(run.errors)")
            #expect(run.errors.contains("Permission denied [13]: lock.mdb: every process that opens the environment, a read-only one too"), "\(arguments): \(run.errors)")
        }
        #expect(chmod(directory.appending("lock.mdb"), 0o666) == 0)
        #expect(chmod(directory.appending("data.mdb"), 0o000) == 0)
        let unreadable = try await Tool.runUnprivileged(["stat", path])
        #expect(unreadable.status == 2 && unreadable.errors.contains("Permission denied [13]: data.mdb: a read-only open reads it"), "\(unreadable.errors)")
    }
}

extension LogToolExportTests {
    /// An imported cursor that a pull could not send back (a byte outside
    /// `!` to `~`, over `cursorBytesMax`), in a `remote` or a `snapshot`
    /// entry, is refused with its line, as other entries the store
    /// refuses are: it was imported, and the new store's `cursors`, and
    /// its sync, met the pull cursor it set as damage.
    @Test func anImportRefusesACursorAPullCouldNotSend() async throws {
        let directory = try TemporaryDirectory("logtool-import-cursor")
        let header = #"{"compacted_below":0,"entry_format":1,"format":"syncstore-export","last_offset":2,"version":1}"#
        let first = #"{"kind":"resync","offset":1,"reason":"r","timestamp":65536}"#
        func remote(_ cursor: String) -> String {
            #"{"cursor":"\#(cursor)","entity_id":"a","entity_type":"te","fields":{},"kind":"remote","offset":2,"operation":"upsert","server_version":1,"timestamp":131072}"#
        }
        let snapshot = #"{"cursor":"caf\u00e9","deleted":false,"entity_id":"","entity_type":"","fields":{},"kind":"snapshot","offset":2,"server_version":0,"timestamp":131072,"watermark":1}"#
        let cases = [
            ("space.jsonl", remote("c 1"), "a remote change's cursor holds a byte that is not printable ASCII (! to ~)"),
            ("long.jsonl", remote(String(repeating: "c", count: 1025)), "a remote change's cursor is 1025 bytes, over cursorBytesMax (1024)"),
            ("snapshot.jsonl", snapshot, "a snapshot's cursor holds a byte that is not printable ASCII (! to ~)"),
        ]
        let store = directory.appending("store")
        for (name, line, message) in cases {
            let imported = try await Tool.importLines([header, first, line], file: directory.appending(name), into: store)
            #expect(imported.status == 2 && imported.errors.contains("\(name): the entry on line 3, at offset 2: \(message)"), "\(imported.errors)")
            #expect(!FileManager.default.fileExists(atPath: store))
        }
        let imported = try await Tool.importLines([header, first, remote("c1")], file: directory.appending("fine.jsonl"), into: store)
        #expect(imported.status == 0, "\(imported.errors)")
        #expect(try await Tool.run(["cursors", store]).lines.first == "pull                  c1")
    }
}

extension LogToolTests {
    /// A sync server's data directory (`syncserver --data`) given for a
    /// store is named as one: it was "not a sync store: the meta database
    /// has no format marker", which left the user to work out why.
    @Test func aServerDataDirectoryIsNamedAsOne() async throws {
        let directory = try TemporaryDirectory("logtool-server-data")
        // What a server's store holds that the tool reads first: a meta
        // database with the server's id (LogServer's ServerStorage).
        let environment = try Environment(path: directory.path)
        let meta = try #require(try environment.openDatabase("meta", create: true))
        try environment.write { txn in try txn.put(meta, key: Array("server-id".utf8), value: [UInt8](repeating: 1, count: 16)) }
        environment.close()
        let run = try await Tool.run(["stat", directory.path])
        #expect(run.status == 2, "\(run.errors)")
        #expect(run.errors.contains("not a sync store: the meta database has no format marker but a server id: a sync server's data directory (syncserver --data), not a client's store"), "\(run.errors)")
    }
}

extension LogToolTests {
    /// A mistyped command is named, with the nearest command: the parser
    /// said "2 unexpected arguments: 'dmup', 'STORE'".
    @Test func aMistypedCommandIsNamed() async throws {
        let directory = try await makeStore("logtool-mistyped-command")
        let cases: [([String], String)] = [
            (["dmup", directory.path], "Error: Unknown command 'dmup'. Did you mean 'dump'?"),
            (["stats", directory.path], "Error: Unknown command 'stats'. Did you mean 'stat'?"),
            (["frobnicate"], "Error: Unknown command 'frobnicate'; the commands are stat, dump, show, tail,"),
        ]
        for (arguments, message) in cases {
            let run = try await Tool.run(arguments)
            #expect(run.status == 2 && run.errors.hasPrefix(message), "\(arguments): \(run.errors)")
            #expect(run.errors.contains("See 'logtool --help'"), "\(arguments): \(run.errors)")
        }
        #expect(try await Tool.run(["help", "show"]).status == 0)
    }

    /// `help` of a mistyped command names it, status 2, as the command
    /// itself mistyped is: it printed the tool's own help, status 0.
    @Test func helpOfAMistypedCommandIsNamed() async throws {
        let run = try await Tool.run(["help", "dmup"])
        #expect(run.status == 2 && run.errors.hasPrefix("Error: Unknown command 'dmup'. Did you mean 'dump'?"), "\(run.status): \(run.errors)")
        #expect(run.output.isEmpty, "\(run.output)")
    }
}

extension LogToolExportTests {
    /// `-o` naming one of the store's own files (`STORE/data.mdb`, by a
    /// slip of tab completion) is refused, and the store stays as it was:
    /// the export was renamed over the data file it had just read, which
    /// left no store, and exited 0.
    @Test func anExportOverTheStoresOwnFileIsRefused() async throws {
        let directory = try TemporaryDirectory("logtool-export-own-file")
        let source = directory.appending("source")
        let lines = try await Tool.exportOfNewStore(at: source) { store in
            try await store.create(type: "te", id: "a", fields: ["n": 1])
        }
        try FileManager.default.createSymbolicLink(atPath: directory.appending("link.mdb"), withDestinationPath: source + "/data.mdb")
        for (name, output) in [("data.mdb", source + "/data.mdb"), ("lock.mdb", source + "/lock.mdb"), ("data.mdb", directory.appending("link.mdb"))] {
            let data = try Data(contentsOf: URL(fileURLWithPath: source + "/data.mdb"))
            let exported = try await Tool.run(["export", source, "-o", output])
            #expect(exported.status == 2 && exported.errors.contains("is the store's own \(name)"), "\(output): \(exported.errors)")
            #expect(try Data(contentsOf: URL(fileURLWithPath: source + "/data.mdb")) == data, "\(output)")
            #expect(try await Tool.run(["export", source]).lines == lines, "\(output)")
        }
    }
}

extension LogToolExportTests {
    /// An export read from a pipe (`import <(zcat e.jsonl.gz) NEW`,
    /// `cat e.jsonl | import /dev/stdin NEW`) is refused as a pipe, and
    /// makes nothing: import reads its file once for the header and again
    /// for the entries (and again when the map grows), so the second read
    /// found what the first had left, and the error said the file was empty.
    @Test func anImportFromAPipeIsNamedAsOne() async throws {
        let directory = try TemporaryDirectory("logtool-import-pipe")
        let file = directory.appending("export.jsonl")
        try (Self.resyncExport(count: 3).joined(separator: "\n") + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        let store = directory.appending("copy")
        let piped = try ToolRun.run("/bin/sh", ["-c", "cat \"$1\" | \"$2\" import /dev/stdin \"$3\"", "sh", file, Tool.path("logtool"), store])
        #expect(piped.status == 2 && piped.errors.contains("/dev/stdin is not a regular file"), "\(piped.errors)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["export.jsonl"])
        // Redirected from a file, /dev/stdin is that file, and imports.
        let redirected = try ToolRun.run("/bin/sh", ["-c", "\"$2\" import /dev/stdin \"$3\" < \"$1\"", "sh", file, Tool.path("logtool"), store])
        #expect(redirected.status == 0 && redirected.output.contains("imported 3 entries"), "\(redirected.errors)")
    }
}

extension LogToolExportTests {
    /// An export whose first line starts with a UTF-8 byte order mark (an
    /// editor on Windows saved it, as one that ends lines in CRLF does)
    /// imports: RFC 8259 lets a reader ignore it. It was "not a syncstore
    /// export", of a file that is one.
    @Test func anExportWithAByteOrderMarkImports() async throws {
        let directory = try TemporaryDirectory("logtool-import-bom")
        var lines = Self.resyncExport(count: 2)
        lines[0] = "\u{FEFF}" + lines[0]
        let imported = try await Tool.importLines(lines, file: directory.appending("bom.jsonl"), into: directory.appending("copy"))
        #expect(imported.status == 0 && imported.output.contains("imported 2 entries"), "\(imported.errors)")
    }
}

extension LogToolTests {
    /// `diff STORE LINK`, a link to the same store, is the same store, as
    /// the same path twice is: the link was taken for another store, whose
    /// open this process refused ("environment already open in this
    /// process [-40001]").
    @Test func diffOfAStoreAndALinkToItIsTheSameStore() async throws {
        let directory = try await makeStore("logtool-diff-link")
        let parent = try TemporaryDirectory("logtool-diff-link-parent")
        let link = parent.appending("link")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: directory.path)
        for (first, second) in [(directory.path, link), (link, directory.path)] {
            let diff = try await Tool.run(["diff", first, second])
            #expect(diff.status == 0 && diff.errors.contains("the same store, 0 differ"), "\(first) \(second): \(diff.errors)")
        }
    }
}

extension LogToolExportTests {
    /// A new store's path that is empty (`import e.jsonl "$NEW"`, the
    /// variable unset) or under a file is refused before anything is
    /// made. The empty one passed every check, the import ran to its
    /// end, and then "cannot move the imported store from .importing-PID
    /// to : ..."; the one under a file was named by the staging directory
    /// the user never typed ("mkdir (file/new.importing-PID): Not a directory").
    @Test func anImportIntoAnEmptyPathOrUnderAFileIsRefusedFirst() async throws {
        let directory = try TemporaryDirectory("logtool-import-path")
        let file = directory.appending("export.jsonl")
        try (Self.resyncExport(count: 2).joined(separator: "\n") + "\n").write(toFile: file, atomically: true, encoding: .utf8)
        let empty = try await Tool.run(["import", file, ""])
        #expect(empty.status == 2 && empty.errors == "logtool: the new store's path is empty\n", "\(empty.errors)")
        let underAFile = try await Tool.run(["import", file, file + "/new"])
        #expect(underAFile.status == 2 && underAFile.errors == "logtool: \(file) is not a directory\n", "\(underAFile.errors)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["export.jsonl"])
    }
}

extension LogToolTests {
    /// A store removed while `tail --follow` follows it (an app that
    /// resets its store, a test that cleans up) ends the follow with status
    /// 2, naming the file: it followed the removed file on, silently, for
    /// as long as it ran, and no entry of a store made anew there ever came.
    @Test func tailFollowEndsWhenItsStoreIsRemoved() async throws {
        let directory = try await makeStore("logtool-tail-store-removed")
        let outputDirectory = try TemporaryDirectory("logtool-tail-store-removed-output")
        let output = outputDirectory.appending("out")
        // Removed once tail has printed its entry, so it is following by then.
        let script = """
            "$0" tail "$1" -n 1 --follow --seconds 30 > "$2" & tail=$!
            until [ -s "$2" ] || ! kill -0 $tail; do sleep 0.05; done
            rm -r "$1"
            wait $tail
            """
        let run = try await ToolRun.running("/bin/bash", ["-c", script, Tool.path("logtool"), directory.path, output])
        #expect(run.status == 2, "\(run.status): \(run.errors)")
        #expect(run.errors.contains("data.mdb was removed or replaced while it was followed"), "\(run.errors)")
    }

    /// A `data.mdb` cut short in place while `tail --follow` follows it
    /// (a truncate; a copy restored over it) ends the follow with status 2,
    /// naming the cut: its next read through LMDB's map died of SIGBUS.
    /// Cut to its two meta pages, or to nothing.
    @Test(arguments: [2, 0]) func tailFollowEndsWhenItsDataFileIsCutShort(keptPages: Int) async throws {
        let directory = try await makeStore("logtool-tail-store-cut")
        let outputDirectory = try TemporaryDirectory("logtool-tail-store-cut-output")
        let output = outputDirectory.appending("out")
        let keptBytes = keptPages * Int(sysconf(Int32(_SC_PAGESIZE)))
        let script = """
            "$0" tail "$1" -n 1 --follow --seconds 30 > "$2" & tail=$!
            until [ -s "$2" ] || ! kill -0 $tail; do sleep 0.05; done
            truncate -s "$3" "$1/data.mdb"
            wait $tail
            """
        let run = try await ToolRun.running("/bin/bash", ["-c", script, Tool.path("logtool"), directory.path, output, "\(keptBytes)"])
        #expect(run.status == 2, "\(run.status): \(run.errors)")
        let cut = keptPages == 0 ? "is 0 bytes: it no longer holds a sound meta page" : "is \(keptBytes) bytes; its metadata says pages 0..."
        #expect(run.errors.contains("data file truncated") && run.errors.contains("data.mdb \(cut)"), "\(run.errors)")
    }
}

extension LogToolTests {
    /// A `data.mdb` cut short while `dump` reads it, past the checks of
    /// its open, ends the dump with status 2 and the file named. The read
    /// through LMDB's map that meets the cut raises SIGBUS, which killed
    /// logtool with a backtrace (status 135) naming no file. The dump is
    /// held part way by its output, a pipe nobody reads until the cut.
    @Test func aDataFileCutUnderADumpIsNamed() async throws {
        let directory = try TemporaryDirectory("logtool-dump-cut")
        let path = directory.appending("store")
        let store = try Store(path: path, options: .init(durability: .process))
        var batch = WriteBatch()
        for n in 0..<20_000 { _ = try batch.create(type: "te", fields: ["n": .int(Int64(n)), "note": .string("entry \(n)")]) }
        try await store.write(batch)
        store.close()
        let script = """
            mkfifo "$2"
            "$0" dump "$1" > "$2" & dump=$!
            exec 3< "$2"
            head -c 1 <&3 > /dev/null
            truncate -s "$3" "$1/data.mdb"
            cat <&3 > /dev/null
            wait $dump
            """
        let metaPagesBytes = 2 * Int(sysconf(Int32(_SC_PAGESIZE)))
        let run = try await ToolRun.running(
            "/bin/bash", ["-c", script, Tool.path("logtool"), path, directory.appending("fifo"), "\(metaPagesBytes)"])
        #expect(run.status == 2, "\(run.status): \(run.errors)")
        #expect(
            run.errors
                == "logtool: SIGBUS: a read through LMDB's memory map of \(path)/data.mdb failed: the data file was cut "
                + "short under logtool (truncated, or a shorter copy put in its place), a damaged page points past its "
                + "end, or the disk failed a read of it. logtool verify checks a store.\n")
    }
}

extension LogToolBundleTests {
    /// A store with no entries is said to have none, as `stat` counts "0
    /// entries": `bundle` said "bundled offsets 1...0" and `replay --to`
    /// "outside the log (1...0)"; `show` words it alike.
    @Test func aStoreWithNoEntriesIsSaidToHaveNone() async throws {
        let directory = try TemporaryDirectory("logtool-no-entries")
        let path = directory.appending("store")
        try Store(path: path, options: .init(durability: .process)).close()
        let bundle = directory.appending("bundle")
        let bundled = try await Tool.run(["bundle", path, "-o", bundle])
        #expect(bundled.status == 0 && bundled.output == "bundled no entries into \(bundle): the store has no entries\n", "\(bundled.output)\(bundled.errors)")
        let report = try #require(try await Tool.run(["bundle", path, "-o", directory.appending("json"), "--json"]).objects().first)
        #expect(report["first_offset"] == nil && report["last_offset"] as? Int == 0, "\(report)")
        let replayed = try await Tool.run(["replay", path, "--to", "1", "--output", directory.appending("past")])
        #expect(replayed.status == 2 && replayed.errors == "logtool: --to 1 is outside the log (the store has no entries)\n", "\(replayed.errors)")
        let shown = try await Tool.run(["show", path, "1"])
        #expect(shown.status == 2 && shown.errors == "logtool: no entry at offset 1 (the store has no entries)\n", "\(shown.errors)")
    }
}

extension LogToolTests {
    /// `dump --from` past the log's last offset is refused (status 2),
    /// naming both, as `show` names an offset past the end: it printed
    /// nothing with status 0, as if no entry had matched. A store with no
    /// entries, --from not given, still dumps as nothing.
    @Test func dumpFromPastTheEndIsRefused() async throws {
        let directory = try await makeStore("logtool-dump-past-end")
        let past = try await Tool.run(["dump", directory.path, "--from", "7"])
        #expect(past.status == 2 && past.errors == "logtool: no entry at --from 7 or after it (the log ends at 6)\n", "\(past.errors)")
        #expect(past.output.isEmpty)
        #expect(try await Tool.run(["dump", directory.path, "--from", "6", "--json"]).objects().map { $0["offset"] as? Int } == [6])
        let empty = directory.appending("empty")
        try Store(path: empty, options: .init(durability: .process)).close()
        let all = try await Tool.run(["dump", empty])
        #expect(all.status == 0 && all.output.isEmpty && all.errors.isEmpty, "\(all.errors)")
        let first = try await Tool.run(["dump", empty, "--from", "1"])
        #expect(first.status == 2 && first.errors == "logtool: no entry at --from 1 or after it (the store has no entries)\n", "\(first.errors)")
    }
}

extension LogToolTests {
    /// `tail --seconds` without --follow is refused as a usage mistake
    /// (status 2), naming both: it was ignored, and tail printed the last
    /// entries and ended at once, whatever the seconds asked for.
    @Test func tailSecondsWithoutFollowIsRefused() async throws {
        let directory = try await makeStore("logtool-tail-seconds-alone")
        for seconds in ["5", "0"] {
            let run = try await Tool.run(["tail", directory.path, "--seconds", seconds])
            #expect(run.status == 2 && run.errors.hasPrefix("Error: --seconds goes with --follow\n"), "--seconds \(seconds): \(run.status): \(run.errors)")
            #expect(run.output.isEmpty)
        }
    }
}
