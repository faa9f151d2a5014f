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
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: data, count: size)
    guard let selector = input.first else { return 0 }
    let bytes = UnsafeRawBufferPointer(rebasing: input[1...])
    switch FuzzTarget(rawValue: selector % UInt8(FuzzTarget.allCases.count)) {
    case .jsonValue: readJSON(bytes)
    case .jsonResponse:
        _ = try? PullResponse.decode(json: bytes)
        _ = try? PushResponse.decode(json: bytes)
    case .entry: _ = try? EntryCodec.decode(bytes)
    case .entryFixedChecksum: readEntryBehindAValidChecksum(bytes)
    case .fields, nil: readFields(bytes)
    }
    return 0
}

private func readJSON(_ bytes: UnsafeRawBufferPointer) {
    guard let json = try? JSONReader.parse(bytes) else { return }
    _ = try? PushOperation(json: json)
    if case .array(let operations)? = json["operations"] {
        for operation in operations { _ = try? PushOperation(json: operation) }
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
}

private func readFields(_ bytes: UnsafeRawBufferPointer) {
    var reader = ByteReader(bytes)
    guard let fields = try? Fields.decode(from: &reader) else { return }
    var writer = ByteWriter()
    fields.encode(into: &writer)
    let consumed = bytes.count - reader.remaining
    guard writer.bytes == [UInt8](bytes[0..<consumed]) else { fatalError("decoded fields do not encode to their bytes") }
}
