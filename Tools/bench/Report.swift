import Foundation

/// A goal a number should meet, shown beside it in the table.
struct Target: Codable, Sendable {
    enum Comparison: String, Codable, Sendable {
        case atLeast = ">="
        case atMost = "<="
    }

    var comparison: Comparison
    var value: Double
    var unit: String

    static func atLeast(_ value: Double, _ unit: String) -> Target { Target(comparison: .atLeast, value: value, unit: unit) }
    static func atMost(_ value: Double, _ unit: String) -> Target { Target(comparison: .atMost, value: value, unit: unit) }

    func isMet(by measured: Double) -> Bool {
        switch comparison {
        case .atLeast: measured >= value
        case .atMost: measured <= value
        }
    }

    var text: String {
        let symbol = comparison == .atLeast ? "≥" : "≤"
        return "\(symbol) \(Report.format(value, unit))"
    }
}

/// One measured number: what it is, its value, its latencies when it has
/// them, and its target when it has one.
struct ResultRow: Codable, Sendable {
    var name: String
    var value: Double
    var unit: String
    var latency: LatencySummary?
    var target: Target?
    var met: Bool?
    var detail: String?

    init(_ name: String, _ value: Double, _ unit: String, latency: LatencySummary? = nil,
         target: Target? = nil, detail: String? = nil) {
        self.name = name
        self.value = value
        self.unit = unit
        self.latency = latency
        self.target = target
        self.met = target?.isMet(by: value)
        self.detail = detail
    }
}

struct ReportSection: Codable, Sendable {
    var title: String
    var rows: [ResultRow] = []
    var notes: [String] = []

    init(_ title: String) { self.title = title }
}

/// Everything one run measured, printed as a table and written as JSON.
struct Report: Codable, Sendable {
    struct Machine: Codable, Sendable {
        var cores: Int
        var scratchDirectory: String
        var scratchFileSystem: String
        var lmdbVersion: String
        var sqliteVersion: String
        /// `/proc/loadavg` (1, 5, 15 minutes) when the run started and ended:
        /// other work on a two-core machine moves every number here.
        var loadAverageAtStart: String
        var loadAverageAtEnd: String
    }

    struct Summary: Codable, Sendable {
        var targetsMet: Int
        var targetsMissed: Int
        var missed: [String]
    }

    var tool = "bench"
    var generatedAt: String
    var quick: Bool
    var settings: Settings
    var machine: Machine
    var entryBytes: Int
    var entryBodyBytes: Int
    var sections: [ReportSection] = []
    var summary = Summary(targetsMet: 0, targetsMissed: 0, missed: [])

    mutating func add(_ section: ReportSection) {
        sections.append(section)
        let targeted = sections.flatMap { section in section.rows.map { (section.title, $0) } }
            .filter { $0.1.met != nil }
        summary.targetsMet = targeted.filter { $0.1.met == true }.count
        summary.targetsMissed = targeted.filter { $0.1.met == false }.count
        summary.missed = targeted.filter { $0.1.met == false }.map { "\($0.0): \($0.1.name)" }
    }

    func writeJSON(to path: String) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try encoder.encode(self).write(to: URL(fileURLWithPath: path), options: .atomic)
    }
}

// MARK: - The table

extension Report {
    static let columnTitles = ["measurement", "result", "p50", "p99", "target", "status"]

    /// The sections as aligned text tables, one per section, with notes below.
    func table() -> String {
        var lines: [String] = []
        for section in sections {
            lines.append("")
            lines.append("== \(section.title) ==")
            let cells = [Report.columnTitles] + section.rows.map(Report.cells)
            let widths = (0..<Report.columnTitles.count).map { column in
                cells.map { $0[column].count }.max() ?? 0
            }
            for (index, row) in cells.enumerated() {
                let padded = row.enumerated().map { column, text in
                    // Names read best left-aligned, numbers right-aligned.
                    column == 0 || column == 5
                        ? text.padding(toLength: widths[column], withPad: " ", startingAt: 0)
                        : String(repeating: " ", count: widths[column] - text.count) + text
                }
                lines.append("  " + padded.joined(separator: "  ").trimmingTrailingSpaces())
                if index == 0 { lines.append("  " + widths.map { String(repeating: "-", count: $0) }.joined(separator: "  ")) }
            }
            for row in section.rows where row.detail != nil {
                lines.append("    \(row.name): \(row.detail ?? "")")
            }
            for note in section.notes { lines.append("  note: \(note)") }
        }
        lines.append("")
        lines.append("targets met: \(summary.targetsMet), missed: \(summary.targetsMissed)")
        for name in summary.missed { lines.append("  missed: \(name)") }
        return lines.joined(separator: "\n")
    }

    private static func cells(_ row: ResultRow) -> [String] {
        let status: String
        switch row.met {
        case true?: status = "met"
        case false?: status = "MISSED"
        case nil: status = "-"
        }
        return [
            row.name, format(row.value, row.unit),
            row.latency.map { formatMicroseconds($0.p50Microseconds) } ?? "",
            row.latency.map { formatMicroseconds($0.p99Microseconds) } ?? "",
            row.target?.text ?? "-", status,
        ]
    }

    /// A value with its unit: ratios to two decimals, rates grouped by thousands.
    static func format(_ value: Double, _ unit: String) -> String {
        if unit == "x" { return String(format: "%.2fx", value) }
        if value >= 100 { return "\(grouped(Int(value.rounded()))) \(unit)" }
        return String(format: "%.1f", value) + " " + unit
    }

    static func formatMicroseconds(_ value: Double) -> String {
        value >= 10_000 ? String(format: "%.1f ms", value / 1000) : "\(grouped(Int(value.rounded()))) µs"
    }

    static func grouped(_ value: Int) -> String {
        let digits = String(value.magnitude)
        var result = ""
        for (index, digit) in digits.enumerated() {
            if index > 0 && (digits.count - index) % 3 == 0 { result.append(",") }
            result.append(digit)
        }
        return value < 0 ? "-" + result : result
    }
}

extension String {
    fileprivate func trimmingTrailingSpaces() -> String {
        var text = self
        while text.last == " " { text.removeLast() }
        return text
    }
}
