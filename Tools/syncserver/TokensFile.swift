import ArgumentParser
import Foundation

/// The file `--tokens-file` names: bearer tokens, one per line as
/// `TOKEN USER [read-only]`, in UTF-8, with comments from a `#` that starts
/// a word.
enum TokensFile {
    /// The text of the file at `path`.
    /// - Throws: `ValidationError` naming the file and why it cannot be
    ///   read: a directory as one, bytes that are not UTF-8 by where the
    ///   first of them is.
    static func text(of path: String) throws -> String {
        do {
            return try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ValidationError("cannot read --tokens-file \(path): \(reason(error, reading: path))")
        }
    }

    /// The words of `line` before its comment, split at spaces and tabs. A
    /// comment is a word that starts with `#` and the rest of the line: `#`
    /// starts one at the line's start or after a space or a tab, and inside
    /// a word is part of it, since a token may hold `#` (section 3 of the
    /// protocol allows `!` to `~`), which a comment from any `#` on cut short.
    static func words(of line: Substring) -> [Substring] {
        Array(line.split(whereSeparator: { $0 == " " || $0 == "\t" }).prefix { !$0.hasPrefix("#") })
    }

    /// Why `file` could not be read: Foundation's message, but for a
    /// directory, of which it says only "NSCocoaErrorDomain error 256", and
    /// for bytes that are not UTF-8, of which it says only "The file isn't
    /// in the correct format".
    private static func reason(_ error: any Error, reading file: String) -> String {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: file, isDirectory: &isDirectory), isDirectory.boolValue {
            return "it is a directory"
        }
        if let bytes = FileManager.default.contents(atPath: file), let (offset, line) = firstByteNotUTF8(in: [UInt8](bytes)) {
            let byte = "0x" + String(bytes[offset], radix: 16, uppercase: true)
            return "it is not UTF-8 text: the byte at offset \(offset) (line \(line)), \(byte), begins no valid UTF-8 sequence"
        }
        return error.localizedDescription
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
