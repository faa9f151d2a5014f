/// Writes JSON text (RFC 8259) as UTF-8 bytes: the writing half of
/// `JSONReader`, for the wire messages that carry entity data.
///
/// Why not `JSONEncoder`: it builds a tree of boxed values, sorts every
/// object's keys and writes the tree out again, which made encoding most of
/// the CPU time of a push and of a pull page. The messages written here
/// (`PushRequest`, `PushResponse`, `PullResponse`) know their members, so
/// they write them in order straight into one buffer.
///
/// The writer only separates and escapes; which members an object has, and
/// that none repeats, is up to the caller. Output is compact, object members
/// come in the order written, strings escape only what JSON requires
/// (`"`, `\` and the control characters below U+0020), as `JSONEncoder` does
/// with `.withoutEscapingSlashes`.
public struct JSONWriter {
    public private(set) var bytes: [UInt8] = []
    /// Whether the next value or member name follows a sibling, and so needs a comma.
    private var afterSibling = false

    public init(capacity: Int = 1024) { bytes.reserveCapacity(capacity) }

    // MARK: Structure

    public mutating func beginObject() { open(UInt8(ascii: "{")) }

    public mutating func endObject() { close(UInt8(ascii: "}")) }

    public mutating func beginArray() { open(UInt8(ascii: "[")) }

    public mutating func endArray() { close(UInt8(ascii: "]")) }

    private mutating func open(_ bracket: UInt8) {
        separate()
        bytes.append(bracket)
        afterSibling = false
    }

    private mutating func close(_ bracket: UInt8) {
        bytes.append(bracket)
        afterSibling = true
    }

    /// Starts a member of the object being written; its value comes next.
    public mutating func name(_ name: String) {
        separate()
        writeString(name)
        bytes.append(UInt8(ascii: ":"))
        afterSibling = false
    }

    /// A member with a string value.
    public mutating func member(_ name: String, _ text: String) {
        self.name(name)
        string(text)
    }

    /// A member with an unsigned integer value (a version).
    public mutating func member(_ name: String, _ number: UInt64) {
        self.name(name)
        uint(number)
    }

    public mutating func member(_ name: String, _ flag: Bool) {
        self.name(name)
        bool(flag)
    }

    private mutating func separate() {
        if afterSibling { bytes.append(UInt8(ascii: ",")) }
    }

    // MARK: Scalars

    public mutating func null() { scalar("null") }

    public mutating func bool(_ flag: Bool) { scalar(flag ? "true" : "false") }

    public mutating func int(_ number: Int64) { scalar(String(number)) }

    public mutating func uint(_ number: UInt64) { scalar(String(number)) }

    public mutating func string(_ text: String) {
        separate()
        writeString(text)
        afterSibling = true
    }

    /// A finite double as the shortest number text that reads back as the
    /// same binary64 (Swift's `description`), without a trailing `.0`:
    /// `0.25`, `2.5e-07`, `2`, `-0`.
    public mutating func double(_ number: Double) {
        precondition(number.isFinite, "JSON has no form for \(number)")
        var text = number.description
        if text.hasSuffix(".0") { text.removeLast(2) }
        scalar(text)
    }

    /// Writes `text`, already JSON (a literal or a number), as one value.
    private mutating func scalar(_ text: String) {
        separate()
        bytes.append(contentsOf: text.utf8)
        afterSibling = true
    }

    private mutating func writeString(_ text: String) {
        bytes.append(UInt8(ascii: "\""))
        var text = text
        text.withUTF8 { utf8 in
            // Runs without escapes, the common case, are copied whole.
            var start = 0
            for index in utf8.indices where JSONWriter.needsEscape(utf8[index]) {
                bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[start..<index]))
                writeEscaped(utf8[index])
                start = index + 1
            }
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[start...]))
        }
        bytes.append(UInt8(ascii: "\""))
    }

    private static func needsEscape(_ byte: UInt8) -> Bool {
        byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\")
    }

    /// A quote, a backslash or a control character, escaped: the short
    /// escape where JSON has one, else `\u00XX`.
    private mutating func writeEscaped(_ byte: UInt8) {
        bytes.append(UInt8(ascii: "\\"))
        switch byte {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"): bytes.append(byte)
        case 0x08: bytes.append(UInt8(ascii: "b"))
        case 0x09: bytes.append(UInt8(ascii: "t"))
        case 0x0A: bytes.append(UInt8(ascii: "n"))
        case 0x0C: bytes.append(UInt8(ascii: "f"))
        case 0x0D: bytes.append(UInt8(ascii: "r"))
        default:
            precondition(byte < 0x20, "only quotes, backslashes and control characters are escaped")
            bytes.append(contentsOf: [UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
            bytes.append(JSONWriter.hexDigits[Int(byte >> 4)])
            bytes.append(JSONWriter.hexDigits[Int(byte & 0x0F)])
        }
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)
}
