/// RFC 3339 timestamps as the protocol writes them
/// (`2026-11-22T08:20:11.301476Z`, any fraction, `Z` or a numeric offset).
enum RFC3339 {
    static func isValid(_ text: String) -> Bool {
        let b = Array(text.utf8)
        func digits(_ range: Range<Int>) -> Int? {
            guard range.upperBound <= b.count else { return nil }
            var value = 0
            for i in range {
                guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b[i]) else { return nil }
                value = value * 10 + Int(b[i] - UInt8(ascii: "0"))
            }
            return value
        }
        guard b.count >= 20, let month = digits(5..<7), let day = digits(8..<10), let hour = digits(11..<13),
            let minute = digits(14..<16), let second = digits(17..<19), let year = digits(0..<4),
            b[4] == UInt8(ascii: "-"), b[7] == UInt8(ascii: "-"), b[10] == UInt8(ascii: "T") || b[10] == UInt8(ascii: "t"),
            b[13] == UInt8(ascii: ":"), b[16] == UInt8(ascii: ":"),
            (1...12).contains(month), (1...daysIn(month: month, year: year)).contains(day), hour < 24, minute < 60,
            second <= 60
        else { return false }
        var index = 19
        if b[index] == UInt8(ascii: ".") {
            index += 1
            let start = index
            while index < b.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(b[index]) { index += 1 }
            guard index > start else { return false }
        }
        guard index < b.count else { return false }
        if b[index] == UInt8(ascii: "Z") || b[index] == UInt8(ascii: "z") { return index + 1 == b.count }
        guard b[index] == UInt8(ascii: "+") || b[index] == UInt8(ascii: "-"), index + 6 == b.count,
            let offsetHour = digits(index + 1..<index + 3), b[index + 3] == UInt8(ascii: ":"),
            let offsetMinute = digits(index + 4..<index + 6)
        else { return false }
        return offsetHour < 24 && offsetMinute < 60
    }

    /// RFC 3339 section 5.7: the day must exist in its month.
    private static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }
}
