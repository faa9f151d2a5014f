import ArgumentParser
import Foundation

/// The file `--tokens-file` names: bearer tokens, one per line as
/// `TOKEN USER [read-only]`, in UTF-8, with comments from a `#` that starts
/// a word.
enum TokensFile {
    /// The text of the file at `path`, read to its end: a pipe serves
    /// (`--tokens-file <(...)`, which keeps the tokens off the disk), as
    /// does `/dev/null`. Foundation's `String(contentsOfFile:)` refused
    /// both as "You don't have permission", to root too.
    /// - Throws: `ValidationError` naming the file and why it cannot be
    ///   read: a directory as one, bytes that are not UTF-8 by where the
    ///   first of them is.
    static func text(of path: String) throws -> String {
        var isDirectory: ObjCBool = false
        // Foundation said only "NSCocoaErrorDomain error 256" of one.
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), isDirectory.boolValue {
            throw ValidationError("cannot read --tokens-file \(path): it is a directory")
        }
        let data: Data
        do {
            let handle = try FileHandle(forReadingFrom: URL(fileURLWithPath: path))
            defer { try? handle.close() }
            data = try handle.readToEnd() ?? Data()
        } catch {
            throw ValidationError("cannot read --tokens-file \(path): \(error.localizedDescription)")
        }
        guard let text = String(data: data, encoding: .utf8) else {
            // Foundation said only "The file isn't in the correct format".
            let bytes = [UInt8](data)
            let (offset, line) = firstByteNotUTF8(in: bytes) ?? (0, 1)
            let byte = "0x" + String(bytes[offset], radix: 16, uppercase: true)
            throw ValidationError(
                "cannot read --tokens-file \(path): it is not UTF-8 text: the byte at offset \(offset) (line \(line)), \(byte), begins no valid UTF-8 sequence")
        }
        return text
    }

    /// The words of `line` before its comment, split at spaces and tabs. A
    /// comment is a word that starts with `#` and the rest of the line: `#`
    /// starts one at the line's start or after a space or a tab, and inside
    /// a word is part of it, since a token may hold `#` (section 3 of the
    /// protocol allows `!` to `~`), which a comment from any `#` on cut short.
    static func words(of line: Substring) -> [Substring] {
        Array(line.split(whereSeparator: { $0 == " " || $0 == "\t" }).prefix { !$0.hasPrefix("#") })
    }

    /// The first byte of `bytes` that begins no valid UTF-8 sequence: its
    /// offset (from 0) and its line (from 1, counted by every line ending,
    /// as the file's lines are numbered: a CR alone too); nil when every
    /// byte is in one.
    static func firstByteNotUTF8(in bytes: [UInt8]) -> (offset: Int, line: Int)? {
        var parser = Unicode.UTF8.ForwardParser()
        var input = bytes.makeIterator()
        var offset = 0
        // Bounded by the bytes: each scalar parsed takes at least one.
        while true {
            switch parser.parseScalar(from: &input) {
            case .valid(let scalar): offset += scalar.count
            case .emptyInput: return nil
            case .error:
                let before = String(decoding: bytes[..<offset], as: UTF8.self)
                return (offset, before.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).count)
            }
        }
    }
}
