// The libFuzzer entry point for `Tools/fuzz/run`. It is compiled into the
// LogFormat module itself (not a SwiftPM target: the sanitizer flags are
// the script's), so it reaches the decoders every untrusted byte meets.
// A trap, a sanitizer report or a failed round trip is a finding.

/// The first byte of an input picks the decoder; `seeds.py` uses the same numbers.
enum FuzzTarget: UInt8, CaseIterable {
    /// JSONReader, then the push operation and fields readers the server uses.
    case jsonValue = 0
    /// The pull and push responses the client reads.
    case jsonResponse = 1
    /// A log entry as stored, checksum and all.
    case entry = 2
    /// A log entry with its checksum made right, so the body parser meets the bytes.
    case entryFixedChecksum = 3
    /// A binary field set (the body of entity records and entries).
    case fields = 4
    /// A push body as the server reads it: unreadable values kept, each
    /// operation read and checked on its own.
    case pushBody = 5
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    guard let selector = input.first else { return 0 }
    let bytes = UnsafeRawBufferPointer(rebasing: input[1...])
    switch FuzzTarget(rawValue: selector % UInt8(FuzzTarget.allCases.count)) {
    case .jsonValue: readJSON(bytes)
    case .jsonResponse: readResponses(bytes)
    case .entry: readEntry(bytes)
    case .entryFixedChecksum: readEntryBehindAValidChecksum(bytes)
    case .pushBody: readPushBody(bytes)
    case .fields, nil: readFields(bytes)
    }
    return 0
}

private func readJSON(_ bytes: UnsafeRawBufferPointer) {
    guard let json = try? JSONReader.parse(bytes) else { return }
    readOperation(json)
    if case .array(let operations)? = json["operations"] {
        for operation in operations { readOperation(operation) }
    }
    if let fields = try? Fields(json: json) {
        // What reads from JSON must come back unchanged from its binary form.
        var writer = ByteWriter()
        fields.encode(into: &writer)
        let again = writer.bytes.withUnsafeBytes { raw -> Fields? in
            var reader = ByteReader(raw)
            return try? Fields.decode(from: &reader)
        }
        guard again == fields else { fatalError("fields read from JSON do not survive their binary form") }
        // And from the JSON this side writes.
        var json = JSONWriter()
        guard (try? fields.writeJSON(to: &json)) != nil else { fatalError("fields read from JSON cannot be written as JSON") }
        guard let read = try? JSONReader.parse(json.bytes), (try? Fields(json: read)) == fields else {
            fatalError("fields read from JSON do not survive the JSON written for them")
        }
    }
}

/// One pushed operation: what reads must write back (as the client writes
/// it) to the same operation.
private func readOperation(_ json: JSONValue) {
    guard let operation = try? PushOperation(json: json) else { return }
    _ = NameRules.fieldsProblem(operation.data ?? Fields())
    var writer = JSONWriter()
    guard (try? operation.writeJSON(to: &writer)) != nil else { fatalError("a pushed operation cannot be written as JSON") }
    guard let read = try? JSONReader.parse(writer.bytes), (try? PushOperation(json: read)) == operation else {
        fatalError("a pushed operation does not survive the JSON written for it")
    }
}

/// The answers the client reads, each of which must survive the JSON the
/// server writes for it.
private func readResponses(_ bytes: UnsafeRawBufferPointer) {
    if let page = try? PullResponse.decode(json: bytes) {
        guard let text = try? page.encodeJSON(), (try? PullResponse.decode(json: text)) == page else {
            fatalError("a pull page does not survive the JSON written for it")
        }
    }
    if let answer = try? PushResponse.decode(json: bytes) {
        guard let text = try? answer.encodeJSON(), (try? PushResponse.decode(json: text)) == answer else {
            fatalError("a push answer does not survive the JSON written for it")
        }
    }
}

/// As the server reads a push (`ReceivedPush`): numbers outside binary64
/// and nesting past the reader's depth are kept as unreadable values. Where
/// there are none, the text reads the same as without keeping them.
private func readPushBody(_ bytes: UnsafeRawBufferPointer) {
    let strict = try? JSONReader.parse(bytes)
    guard let kept = try? JSONReader.parse(bytes, keepingUnreadableValues: true) else {
        guard strict == nil else { fatalError("a text read strictly fails when unreadable values are kept") }
        return
    }
    if !holdsUnreadable(kept), strict != kept { fatalError("a text without unreadable values reads differently when they are kept") }
    if case .array(let operations)? = kept["operations"] {
        for operation in operations { readOperation(operation) }
    }
}

/// Whether `json` holds an unreadable value at any depth (bounded by the reader's depth).
private func holdsUnreadable(_ json: JSONValue) -> Bool {
    switch json {
    case .unreadable: true
    case .array(let elements): elements.contains(where: holdsUnreadable)
    case .object(let members): members.contains { holdsUnreadable($0.1) }
    default: false
    }
}

private func readEntryBehindAValidChecksum(_ bytes: UnsafeRawBufferPointer) {
    guard bytes.count >= EntryCodec.headerBytes else { return }
    var copy = [UInt8](bytes)
    let checksum = copy.withUnsafeBytes { EntryCodec.checksum(of: $0) }
    withUnsafeBytes(of: checksum.bigEndian) { stored in
        for index in 0..<4 { copy[EntryCodec.checksumPosition + index] = stored[index] }
    }
    // Anything that decodes is canonical: it encodes to the same bytes.
    guard let entry = try? EntryCodec.decode(copy) else { return }
    guard (try? EntryCodec.encode(entry)) == copy else { fatalError("a decoded entry does not encode to its bytes") }
    describe(entry)
}

private func readEntry(_ bytes: UnsafeRawBufferPointer) {
    guard let entry = try? EntryCodec.decode(bytes) else { return }
    describe(entry)
}

/// What tools print of an entry read from a log (`logtool dump`, `show`),
/// and the checks a store makes of stored fields.
private func describe(_ entry: Entry) {
    _ = entry.description
    switch entry.body {
    case .intent(let intent): _ = NameRules.fieldsProblem(intent.fields)
    case .remote(let remote): _ = NameRules.fieldsProblem(remote.fields)
    case .snapshot(let snapshot): _ = NameRules.fieldsProblem(snapshot.fields)
    case .conflict(let conflict): _ = NameRules.fieldsProblem(conflict.serverFields)
    case .ack, .reject, .resync: break
    }
}

private func readFields(_ bytes: UnsafeRawBufferPointer) {
    var reader = ByteReader(bytes)
    guard let fields = try? Fields.decode(from: &reader) else { return }
    var writer = ByteWriter()
    fields.encode(into: &writer)
    let consumed = bytes.count - reader.remaining
    guard writer.bytes == [UInt8](bytes[0..<consumed]) else { fatalError("decoded fields do not encode to their bytes") }
    _ = fields.description
    _ = NameRules.fieldsProblem(fields)
}
