import ArgumentParser
import Foundation
import LMDB
import LogFormat
import LogStore
import ToolSupport

/// The first line of an export: what it is and what the store was.
struct ExportHeader: Codable {
    static let formatName = "syncstore-export"
    /// The version of this file's layout (the header and the entry lines),
    /// apart from the entry format version of the entries it describes.
    static let currentVersion = 1

    var format = ExportHeader.formatName
    var version = ExportHeader.currentVersion
    var entryFormat = Int(EntryCodec.formatVersion)
    var compactedBelow: UInt64
    var lastOffset: UInt64

    enum CodingKeys: String, CodingKey {
        case format, version
        case entryFormat = "entry_format", compactedBelow = "compacted_below", lastOffset = "last_offset"
    }
}

extension ExportHeader {
    /// The header, the first line of `file` that is not empty (line
    /// `number`). Its `format` and `version` are
    /// checked before the rest: an export of another version, whose header
    /// may have other members, is named as that, not as a damaged header.
    static func read(_ line: [UInt8], file: String, line number: Int) throws -> ExportHeader {
        let json = try? JSONReader.parse(line)
        guard case .string(formatName)? = json?["format"] else {
            throw LogToolError("\(file):\(number): not a syncstore export (no \"format\":\"\(formatName)\" header)")
        }
        guard case .int(let version)? = json?["version"] else {
            throw LogToolError("\(file):\(number): the export header has no version number")
        }
        guard version == currentVersion else {
            throw LogToolError("\(file):\(number): export version \(version); this logtool reads version \(currentVersion)")
        }
        let header: ExportHeader
        do {
            header = try JSONDecoder().decode(ExportHeader.self, from: Data(line))
        } catch {
            throw LogToolError("\(file):\(number): not an export header of version \(currentVersion)")
        }
        guard header.entryFormat == Int(EntryCodec.formatVersion) else {
            throw LogToolError(
                "\(file):\(number): entries of format version \(header.entryFormat); this logtool reads version \(EntryCodec.formatVersion)")
        }
        return header
    }
}

struct Export: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Write the log as JSON lines: a header, then one entry per line (as dump --json prints them).")

    // The store's path alone, not `StoreOptions`: an export is JSON lines
    // whatever it is told, and a `--json` that changed nothing misled.
    @Argument(help: "The store directory.") var path: String
    @Option(
        name: .shortAndLong,
        help: ArgumentHelp("The file to write (default: standard output); 'logtool import FILE NEWSTORE' reads it back.", valueName: "file"))
    var output: String?

    func validate() throws { try checkPathGiven(path) }

    func run() throws {
        // An unset variable (`-o "$OUT"`): the whole log was written to a
        // partial file in the working directory, and the rename to ""
        // failed, naming that file.
        if output?.isEmpty == true { throw LogToolError("--output is empty; it names the file to write") }
        MapFault.watch(storeAt: path)
        let log = try EventLog(path: path, options: .inspecting)
        defer { log.close() }
        guard let output else { return try write(log, to: FileHandle.standardOutput, named: "standard output") }
        // A link to a file is followed: the file it names is replaced, and
        // the link stays a link. (Written in place as a device is, an older,
        // longer export kept its tail after the new one.)
        let target = realpath(output, nil).map { path in
            defer { free(path) }
            return String(cString: path)
        } ?? output
        // Renamed over `STORE/data.mdb` (a slip of tab completion), the
        // export took the place of the store it was read from.
        if let file = Export.storeFile(at: target, in: log.path) {
            throw LogToolError("--output \(output) is the store's own \(file): the export would replace it; name a file outside the store")
        }
        if let type = try? FileManager.default.attributesOfItem(atPath: target)[.type] as? FileAttributeType,
            type != .typeRegular
        {
            // A pipe or a device (`-o /dev/stdout`) is written as it is;
            // a directory is refused, with the reason.
            let descriptor = open(output, O_WRONLY | O_CLOEXEC)
            guard descriptor >= 0 else { throw LogToolError("cannot write to \(output): \(String(cString: strerror(errno)))") }
            return try write(log, to: FileHandle(fileDescriptor: descriptor, closeOnDealloc: true), named: output)
        }
        // Written beside the file and renamed over it when complete: a
        // failed export never leaves a file that looks like a whole one.
        let partial = target + ".partial-\(ProcessInfo.processInfo.processIdentifier)"
        guard FileManager.default.createFile(atPath: partial, contents: nil) else {
            // Named as the user gave it: the partial file is this tool's own.
            throw LogToolError("cannot create \(output): \(String(cString: strerror(errno)))")
        }
        do {
            let sink = try FileHandle(forWritingTo: URL(fileURLWithPath: partial))
            defer { try? sink.close() }
            try write(log, to: sink, named: output)
            do {
                try sink.synchronize()
            } catch {
                throw LogToolError("cannot write \(output): \(Export.reason(error))")
            }
            guard rename(partial, target) == 0 else {
                throw LogToolError("cannot rename \(partial) to \(target): \(String(cString: strerror(errno)))")
            }
        } catch {
            try? FileManager.default.removeItem(atPath: partial)
            throw error
        }
    }

    /// The name of the file of the store in the directory `store` that
    /// `path` is (by device and inode: a link to it, another path to it);
    /// nil when it is none of them.
    private static func storeFile(at path: String, in store: String) -> String? {
        guard let target = fileIdentity(of: path) else { return nil }
        return ["data.mdb", "lock.mdb", "writer.lock"].first { fileIdentity(of: store + "/" + $0) == target }
    }

    /// Line by line, so it never holds the whole log in memory, and from one
    /// snapshot, so a compaction by another process cannot change the log
    /// halfway through.
    private func write(_ log: EventLog, to sink: FileHandle, named name: String) throws {
        let newline = Data("\n".utf8)
        try log.readSnapshot { compactedBelow, lastOffset in
            let header = ExportHeader(compactedBelow: compactedBelow, lastOffset: lastOffset)
            try Export.write(try Output.encoder.encode(header) + newline, to: sink, named: name)
        } visit: { entry in
            try Export.write(try Output.encoder.encode(EntryJSON(entry: entry)) + newline, to: sink, named: name)
        }
    }

    /// Writes `data` to `sink`; a failure (a full disk) names the file and
    /// the reason, not Foundation's error as it stands.
    private static func write(_ data: Data, to sink: FileHandle, named name: String) throws {
        do {
            try sink.write(contentsOf: data)
        } catch {
            throw LogToolError("cannot write \(name): \(reason(error))")
        }
    }

    /// The operating system's reason for a failed write, which Foundation
    /// wraps in an error of its own.
    static func reason(_ error: any Error) -> String {
        let error = error as NSError
        let posix = error.domain == NSPOSIXErrorDomain ? error : error.userInfo[NSUnderlyingErrorKey] as? NSError
        guard let posix, posix.domain == NSPOSIXErrorDomain else { return error.localizedDescription }
        return String(cString: strerror(Int32(posix.code)))
    }
}

struct Import: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Make a new store from an export, entries at their offsets with their timestamps, projections rebuilt.")

    @Argument(help: "The export file (JSON lines), as 'logtool export STORE --output FILE' writes it.") var file: String
    @Argument(help: "The new store directory (must not exist).") var path: String

    /// An empty export file's path was named as "cannot read : No such file
    /// or directory".
    func validate() throws { try checkPathGiven(file, "the export file") }

    func run() async throws {
        // An unset variable (`import e.jsonl "$NEW"`): checked first, as
        // it passed every check below, and the import ran to its end
        // before the store could not be moved to "".
        guard !path.isEmpty else { throw LogToolError("the new store's path is empty") }
        guard !FileManager.default.fileExists(atPath: path) else {
            // `import NEWSTORE FILE`: the two swapped.
            var isDirectory: ObjCBool = false
            if !FileManager.default.fileExists(atPath: file),
                FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), !isDirectory.boolValue
            {
                throw LogToolError("\(file) does not exist and \(path) is a file: the export file comes first (logtool import \(path) \(file))")
            }
            throw LogToolError("\(path) exists; import makes a new store")
        }
        // The header is checked before anything is made; the entries are
        // read as they are restored, a line at a time.
        let header = try ExportReader(file).header
        // Built beside its destination and moved there only when complete:
        // a failed import leaves nothing behind, never a store that fails verify.
        let destination = (path as NSString).standardizingPath  // "new/" names "new", not a place inside it
        // By hand (`import e.jsonl d` names a path of one character).
        let parent = parentDirectory(of: destination) ?? ""
        var isDirectory: ObjCBool = false
        guard parent.isEmpty || FileManager.default.fileExists(atPath: parent, isDirectory: &isDirectory) else {
            throw LogToolError("\(parent) does not exist; import makes only the store's own directory")
        }
        guard parent.isEmpty || isDirectory.boolValue else { throw LogToolError("\(parent) is not a directory") }
        try Import.removeKilledImports(into: destination, parent: parent)
        let staging = destination + ".importing-\(ProcessInfo.processInfo.processIdentifier)"
        let count: Int
        do {
            MapFault.watch(storeAt: staging)
            let store = try Store(path: staging, options: .init(durability: .full))
            defer { store.close() }
            count = try await store.restore(compactedBelow: header.compactedBelow) { [file] in
                let reader = try ExportReader(file)
                // Named by its line, as a line that does not parse is: a
                // count of entries misses the header and blank lines.
                return { try reader.nextEntry().map { ($0, "the entry on line \(reader.lineNumber)") } }
            }
        } catch let error as LogStoreError where error.code == .invalidArgument {
            try? FileManager.default.removeItem(atPath: staging)
            throw LogToolError("\(file): \(error.detail)")
        } catch {
            try? FileManager.default.removeItem(atPath: staging)
            throw error
        }
        do {
            try FileManager.default.moveItem(atPath: staging, toPath: destination)
        } catch {
            try? FileManager.default.removeItem(atPath: staging)
            throw LogToolError("cannot move the imported store from \(staging) to \(destination): \(error.localizedDescription)")
        }
        print("imported \(count) entries into \(path)")
    }

    /// Removes the directories imports into `destination` that were killed
    /// left behind, `destination.importing-PID`, each named on standard
    /// error. Each import stages under its own PID, so without this one
    /// left by a killed import stayed for good. The directory of an import
    /// whose process still runs is left to it; this process's own PID names
    /// no other live import.
    private static func removeKilledImports(into destination: String, parent: String) throws {
        let prefix = (destination.split(separator: "/").last.map(String.init) ?? destination) + ".importing-"
        // Bounded by the parent's entries.
        for name in (try? FileManager.default.contentsOfDirectory(atPath: parent.isEmpty ? "." : parent)) ?? []
        where name.hasPrefix(prefix) {
            let digits = name.dropFirst(prefix.count)
            guard digits.allSatisfy(\.isASCII), let pid = pid_t(digits), pid > 0 else { continue }
            let alive = pid != getpid() && (kill(pid, 0) == 0 || errno != ESRCH)
            let staging = destination + ".importing-\(digits)"
            var isDirectory: ObjCBool = false
            guard !alive, FileManager.default.fileExists(atPath: staging, isDirectory: &isDirectory), isDirectory.boolValue else {
                continue
            }
            do {
                try FileManager.default.removeItem(atPath: staging)
            } catch {
                throw LogToolError("cannot remove \(staging), left by an import that was killed: \(Export.reason(error))")
            }
            FileHandle.standardError.write(Data("logtool import: removed \(staging), left by an import that was killed\n".utf8))
        }
    }
}

/// An export file read a line at a time, so that an import holds one
/// line in memory however long the file is. Lines end at each LF byte,
/// not at each `Character` "\n": a CRLF is one `Character`, so a file with
/// CRLF line ends (from an editor on Windows) was one line. The CR left at
/// a line's end is JSON whitespace. Blank lines are skipped, and counted:
/// a message names a line by its number in the file.
final class ExportReader {
    let file: String
    /// The file's first line that is not empty.
    private(set) var header = ExportHeader(compactedBelow: 0, lastOffset: 0)
    private let stream: UnsafeMutablePointer<FILE>
    private var buffer: UnsafeMutablePointer<CChar>?
    private var capacity = 0
    /// The number of the line read last: after `nextEntry`, its entry's.
    private(set) var lineNumber = 0
    /// The offset of the last entry read, 0 before the first.
    private var lastOffset: UInt64 = 0
    /// The line of the last entry read, when it lies past the header's
    /// last offset.
    private var pastLastOffset: Int?

    /// Opens `file` and reads its header.
    init(_ file: String) throws {
        guard let stream = fopen(file, "r") else { throw LogToolError("cannot read \(file): \(String(cString: strerror(errno)))") }
        self.file = file
        self.stream = stream
        // Thrown from here on, the reader is released as usual: `deinit` closes the file.
        // An import reads the file more than once (the header first, the
        // entries again when the map grows): a pipe would give each read
        // only what the one before left.
        var status = stat()
        guard fstat(fileno(stream), &status) == 0, status.st_mode & S_IFMT == S_IFREG else {
            throw LogToolError("\(file) is not a regular file (a pipe?): import reads its file more than once; write the export to a file first")
        }
        guard var first = try nextLine() else { throw LogToolError("\(file) is empty") }
        // A byte order mark (an editor on Windows, which may end lines in
        // CRLF too) is not part of the header: RFC 8259 lets a reader ignore it.
        if first.starts(with: [0xEF, 0xBB, 0xBF]) { first.removeFirst(3) }
        header = try ExportHeader.read(first, file: file, line: lineNumber)
    }

    deinit {
        free(buffer)
        fclose(stream)
    }

    /// The next entry; nil after the last, which must be at the header's
    /// last offset: the header says where the log ended, exactly.
    func nextEntry() throws -> Entry? {
        // An entry past the header's last offset is refused when the next
        // is asked for: by then the store has checked that it follows the
        // one before, and a hole or a step back is named as that.
        if let line = pastLastOffset {
            throw LogToolError(
                "\(file):\(line): an entry at offset \(lastOffset), past the header's last_offset \(header.lastOffset)")
        }
        guard let line = try nextLine() else {
            guard lastOffset == header.lastOffset else {
                throw LogToolError(
                    "\(file): the entries end at offset \(lastOffset), the header says \(header.lastOffset): the file is cut short")
            }
            return nil
        }
        let entry: Entry
        do {
            entry = try EntryJSON.entry(from: try JSONReader.parse(line))
        } catch {
            throw LogToolError("\(file):\(lineNumber): \(error)")
        }
        if entry.offset > header.lastOffset { pastLastOffset = lineNumber }
        lastOffset = entry.offset
        return entry
    }

    /// The next line that is not empty, without its LF; nil at the end of
    /// the file. Bounded by the file's length.
    private func nextLine() throws -> [UInt8]? {
        while true {
            errno = 0
            let count = getline(&buffer, &capacity, stream)
            guard count >= 0, let line = buffer else {
                guard ferror(stream) == 0 else { throw LogToolError("cannot read \(file): \(String(cString: strerror(errno)))") }
                return nil
            }
            lineNumber += 1
            var bytes = UnsafeRawBufferPointer(start: line, count: count)
            if bytes.last == UInt8(ascii: "\n") { bytes = UnsafeRawBufferPointer(rebasing: bytes.dropLast()) }
            if !bytes.isEmpty { return Array(bytes) }
        }
    }
}

extension EntryJSON {
    /// The entry a line of `dump --json` or `export` describes.
    static func entry(from json: JSONValue) throws -> Entry {
        let kind = try json.text("kind")
        func version(_ name: String) throws -> UInt64 { try json.unsigned(name) }
        let body: EntryBody
        switch EntryKind(name: kind) {
        case .intent:
            guard let operation = Intent.Operation.allCases.first(where: { "\($0)" == (try? json.text("operation")) }) else {
                throw WireDecodingError("operation", "is not create, update or delete")
            }
            body = .intent(
                Intent(
                    operation, idempotencyKey: try json.text("idempotency_key"), entityType: try json.text("entity_type"),
                    entityID: try json.text("entity_id"), baseVersion: try version("base_version"),
                    fields: try Fields(json: json["fields"] ?? .object([]), path: "fields")))
        case .ack:
            guard let outcome = Ack.Outcome.allCases.first(where: { "\($0)" == (try? json.text("outcome")) }) else {
                throw WireDecodingError("outcome", "is not applied or duplicate")
            }
            body = .ack(Ack(intentOffset: try version("intent_offset"), outcome: outcome, serverVersion: try version("server_version")))
        case .reject:
            body = .reject(Reject(intentOffset: try version("intent_offset"), code: try json.text("code"), message: try json.text("message")))
        case .remote:
            guard let operation = Remote.Operation.allCases.first(where: { "\($0)" == (try? json.text("operation")) }) else {
                throw WireDecodingError("operation", "is not upsert or delete")
            }
            body = .remote(
                Remote(
                    cursor: try json.text("cursor"), operation, entityType: try json.text("entity_type"),
                    entityID: try json.text("entity_id"), serverVersion: try version("server_version"),
                    fields: try Fields(json: json["fields"] ?? .object([]), path: "fields")))
        case .conflict:
            guard let resolution = (try? json.text("resolution")).flatMap(Conflict.Resolution.init(exportedName:)) else {
                throw WireDecodingError("resolution", "is not a resolution")
            }
            body = .conflict(
                Conflict(
                    intentOffset: try version("intent_offset"), entityType: try json.text("entity_type"),
                    entityID: try json.text("entity_id"), serverVersion: try version("server_version"),
                    serverDeleted: try json.flag("server_deleted"),
                    serverFields: try Fields(json: json["server_fields"] ?? .object([]), path: "server_fields"),
                    resolution: resolution,
                    resolvedFields: try Fields(json: json["resolved_fields"] ?? .object([]), path: "resolved_fields")))
        case .resync:
            body = .resync(reason: try json.text("reason"))
        case .snapshot:
            body = .snapshot(
                Snapshot(
                    watermark: try version("watermark"), cursor: try json.text("cursor"), entityType: try json.text("entity_type"),
                    entityID: try json.text("entity_id"), serverVersion: try version("server_version"),
                    deleted: try json.flag("deleted"), fields: try Fields(json: json["fields"] ?? .object([]), path: "fields")))
        case nil:
            throw WireDecodingError("kind", "\(kind) is not a kind")
        }
        return Entry(offset: try json.unsigned("offset"), timestamp: HybridTimestamp(rawValue: try json.unsigned("timestamp")), body: body)
    }
}

extension JSONValue {
    func text(_ name: String) throws -> String {
        guard case .string(let text)? = self[name] else { throw WireDecodingError(name, "is missing or not a string") }
        return text
    }

    /// A boolean that may be left out (false).
    func flag(_ name: String) throws -> Bool {
        switch self[name] {
        case nil: return false
        case .bool(let value)?: return value
        default: throw WireDecodingError(name, "is not a boolean")
        }
    }

    /// A `u64` field: a whole number from 0 to 2^64 - 1, exactly
    /// (`Format/README.md`), in any of its forms (`JSONValue.int` up to
    /// 2^63 - 1, `.unsigned` past it, `.negativeZero` for `-0`).
    func unsigned(_ name: String) throws -> UInt64 {
        switch self[name] {
        case .int(let number)? where number >= 0: return UInt64(number)
        case .unsigned(let number)?: return number
        case .negativeZero?: return 0
        case nil: throw WireDecodingError(name, "is missing")
        default: throw WireDecodingError(name, "is not a whole number from 0 to 2^64 - 1")
        }
    }
}
