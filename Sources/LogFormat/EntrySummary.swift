/// One-line, human-readable renderings of entries and values, for tools and
/// demos. Not a serialization: use `EntryCodec` (bytes) for that.
extension Value: CustomStringConvertible {
    public var description: String {
        switch self {
        case .null: "null"
        case .bool(let flag): flag ? "true" : "false"
        case .int(let number): String(number)
        case .double(let number): String(number)
        case .string(let text): "\"" + Value.printable(text).replacingOccurrences(of: "\"", with: "\\\"") + "\""
        case .bytes(let data): "<\(data.count) bytes>"
        case .timestamp(let micros): Value.iso8601(microseconds: micros)
        case .array(let elements): "[" + elements.map(\.description).joined(separator: ", ") + "]"
        case .object(let fields): fields.description
        }
    }
}

extension EntryBody {
    /// For example `intent create te/te_01J... {minutes: 30}` or
    /// `ack #12 applied v3`.
    public var summary: String {
        switch self {
        case .intent(let intent):
            let fields = intent.fields.isEmpty ? "" : " " + intent.fields.description
            let base = intent.baseVersion == 0 ? "" : " base v\(intent.baseVersion)"
            return "\(intent.operation) \(Value.printable(intent.entityType))/\(Value.printable(intent.entityID))\(base)\(fields)"
        case .ack(let ack):
            return "#\(ack.intentOffset) \(ack.outcome) v\(ack.serverVersion)"
        case .reject(let reject):
            return "#\(reject.intentOffset) \(Value.printable(reject.code)): \(Value.printable(reject.message))"
        case .remote(let remote):
            return "\(remote.operation) \(Value.printable(remote.entityType))/\(Value.printable(remote.entityID)) v\(remote.serverVersion) "
                + "cursor \(Value.printable(remote.cursor))"
        case .conflict(let conflict):
            return "#\(conflict.intentOffset) \(Value.printable(conflict.entityType))/\(Value.printable(conflict.entityID)) "
                + "server v\(conflict.serverVersion) \(conflict.resolution.name)"
        case .resync(let reason):
            return Value.printable(reason)
        case .snapshot(let snapshot):
            return "\(Value.printable(snapshot.entityType))/\(Value.printable(snapshot.entityID)) v\(snapshot.serverVersion) "
                + "below #\(snapshot.watermark)"
        }
    }
}

extension Entry: CustomStringConvertible {
    public var description: String { "#\(offset) \(kind) \(body.summary)" }
}

extension Value {
    /// `text` kept to one line and free of terminal controls, for the
    /// renderings above: a backslash, the line breaks and tab (`\\`,
    /// `\n`, `\r`, `\t`), the other control characters (C0, DEL, C1) and
    /// the line and paragraph separators are escaped (`\u{1B}`). Strings
    /// come from apps and servers: one holding a line break or an escape
    /// sequence split a `logtool dump` line, or reached the terminal.
    public static func printable(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: needsEscape) else { return text }
        var escaped = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\\": escaped += "\\\\"
            case "\n": escaped += "\\n"
            case "\r": escaped += "\\r"
            case "\t": escaped += "\\t"
            case _ where needsEscape(scalar): escaped += "\\u{" + String(scalar.value, radix: 16, uppercase: true) + "}"
            default: escaped.unicodeScalars.append(scalar)
            }
        }
        return escaped
    }

    private static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        scalar == "\\" || scalar.properties.generalCategory == .control || scalar == "\u{2028}" || scalar == "\u{2029}"
    }

    /// `2026-11-22T08:19:56.123456Z` for microseconds since the Unix epoch
    /// (proleptic Gregorian calendar, UTC).
    public static func iso8601(microseconds: Int64) -> String {
        let (seconds, micros) = microseconds.quotientAndRemainder(dividingBy: 1_000_000)
        let adjustedSeconds = micros < 0 ? seconds - 1 : seconds
        let fraction = micros < 0 ? micros + 1_000_000 : micros
        let (days, secondOfDay) = adjustedSeconds.quotientAndRemainder(dividingBy: 86_400)
        let dayNumber = secondOfDay < 0 ? days - 1 : days
        let second = secondOfDay < 0 ? secondOfDay + 86_400 : secondOfDay
        // Days to a civil date (Howard Hinnant's algorithm).
        let z = dayNumber + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        // Written byte by byte: the client stamps every pushed operation
        // and the server every pulled change with this.
        var text: [UInt8] = []
        text.reserveCapacity(27)
        appendPadded(year, width: 4, then: "-", to: &text)
        appendPadded(month, width: 2, then: "-", to: &text)
        appendPadded(day, width: 2, then: "T", to: &text)
        appendPadded(second / 3600, width: 2, then: ":", to: &text)
        appendPadded(second / 60 % 60, width: 2, then: ":", to: &text)
        appendPadded(second % 60, width: 2, then: ".", to: &text)
        appendPadded(fraction, width: 6, then: "Z", to: &text)
        return String(decoding: text, as: UTF8.self)
    }

    /// `String(value)` left-padded with zeros to `width` characters (a
    /// minus sign counts as one, and the zeros go before it), then `separator`.
    private static func appendPadded(_ value: Int64, width: Int, then separator: Unicode.Scalar, to text: inout [UInt8]) {
        var magnitude = value.magnitude
        var digitCount = 1
        while magnitude >= 10 {
            magnitude /= 10
            digitCount += 1
        }
        let signCount = value < 0 ? 1 : 0
        text.append(contentsOf: repeatElement(UInt8(ascii: "0"), count: max(0, width - digitCount - signCount)))
        if value < 0 { text.append(UInt8(ascii: "-")) }
        let end = text.count + digitCount
        text.append(contentsOf: repeatElement(UInt8(ascii: "0"), count: digitCount))
        magnitude = value.magnitude
        for index in stride(from: end - 1, through: end - digitCount, by: -1) {
            text[index] = UInt8(ascii: "0") + UInt8(magnitude % 10)
            magnitude /= 10
        }
        text.append(UInt8(ascii: separator))
    }
}
