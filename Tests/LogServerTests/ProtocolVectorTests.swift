import LogTesting
import Foundation
import Testing

/// Runs `Format/vectors/protocol.json` (sync-protocol.md, section 14) against
/// one fresh server, exchange by exchange, in order.
@Suite struct ProtocolVectorTests {
    /// `Format/vectors/protocol.json`, found from this file's path: the
    /// package root is two directories above `Tests/LogServerTests`.
    static let url = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent()
        .deletingLastPathComponent()
        .deletingLastPathComponent()
        .appendingPathComponent("Format/vectors/protocol.json")

    /// Section 14 counts the script's exchanges ("The 79 exchanges cover:
    /// ..."); an exchange added without the text said 78 for 79.
    @Test func theSpecificationCountsTheScriptsExchanges() throws {
        let exchanges = try ProtocolExchange.load(from: Self.url)
        let spec = try String(
            contentsOf: Self.url.deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("sync-protocol.md"),
            encoding: .utf8)
        let sentence = try #require(spec.range(of: " exchanges cover:"))
        let stated = spec[..<sentence.lowerBound].split(separator: " ").last.map(String.init)
        #expect(stated == String(exchanges.count), "section 14 says \(stated ?? "no number"); the script has \(exchanges.count)")
    }

    /// One issue per failing exchange; the run goes on after a failure so
    /// that one run shows every problem.
    @Test func everyExchangeGetsTheResponseTheScriptExpects() async throws {
        let exchanges = try ProtocolExchange.load(from: Self.url)
        #expect(!exchanges.isEmpty)
        let server = try await TestServer("protocol-vectors", scopeField: "project")
        defer { Task { await server.stop() } }
        var cursors: [String: String] = [:]
        for (index, exchange) in exchanges.enumerated() {
            let label = "exchange \(index + 1) of \(exchanges.count), \"\(exchange.name)\""
            let request: ProtocolExchange.Request
            do {
                request = try exchange.request(cursors: cursors)
            } catch {
                Issue.record(Comment(rawValue: "\(label): \(error)"))
                continue
            }
            let reply: TestServer.Reply
            do {
                reply = try await server.send(
                    exchange.method, request.target, token: nil, body: request.body, headers: request.headers)
            } catch {
                Issue.record(Comment(rawValue: "\(label) (\(exchange.method) \(request.target)): request failed: \(error)"))
                continue
            }
            let problems = exchange.check(reply, cursors: &cursors)
            if !problems.isEmpty {
                Issue.record(Comment(rawValue: exchange.report(label, request, reply, problems)))
            }
        }
    }
}

// MARK: - One exchange

private struct VectorFileError: Error, CustomStringConvertible {
    let description: String
}

/// An exchange of the script, kept as parsed JSON.
private struct ProtocolExchange {
    let name: String
    let method: String
    let json: ProtocolJSON

    /// What the test sends, with cursors substituted.
    struct Request {
        /// The path with its percent-encoded query string.
        var target: String
        var headers: [String: String]
        var body: Data?
    }

    static func load(from url: URL) throws -> [ProtocolExchange] {
        let root = try ProtocolJSON.parse(Data(contentsOf: url))
        guard case .array(let exchanges)? = root["exchanges"] else { throw VectorFileError(description: "no exchanges array") }
        return try exchanges.map { exchange in
            guard case .string(let name)? = exchange["name"], case .string(let method)? = exchange["request"]?["method"],
                exchange["response"]?["status"]?.integer != nil
            else { throw VectorFileError(description: "malformed exchange \(exchange.serialized)") }
            return ProtocolExchange(name: name, method: method, json: exchange)
        }
    }

    func request(cursors: [String: String]) throws -> Request {
        let request = json["request"]
        guard case .string(let path)? = request?["path"] else { throw VectorFileError(description: "no path") }
        var target = path
        if let query = request?["query"] {
            var pairs: [String] = []
            for (name, value) in try query.stringMembers() {
                pairs.append(percentEncoded(name) + "=" + percentEncoded(try substituted(value, cursors)))
            }
            if !pairs.isEmpty { target += "?" + pairs.joined(separator: "&") }
        }
        var headers: [String: String] = [:]
        for (name, value) in try request?["headers"]?.stringMembers() ?? [] { headers[name] = try substituted(value, cursors) }
        var body: Data?
        if let value = request?["body"] {
            body = Data(try value.substitutingCursors(cursors).serialized.utf8)
        } else if case .string(let raw)? = request?["raw_body"] {
            body = Data(raw.utf8)
        }
        return Request(target: target, headers: headers, body: body)
    }

    /// Every way the reply differs from the expected response; binds cursors
    /// seen for the first time.
    func check(_ reply: TestServer.Reply, cursors: inout [String: String]) -> [String] {
        var problems: [String] = []
        let response = json["response"]
        if let status = response?["status"]?.integer, status != reply.status {
            problems.append("status: expected \(status), got \(reply.status)")
        }
        for (name, value) in (try? response?["headers"]?.stringMembers()) ?? [] {
            let actual = reply.headers[name.lowercased()]
            if actual != value { problems.append("header \(name): expected \"\(value)\", got \(actual.map { "\"\($0)\"" } ?? "none")") }
        }
        guard let expected = response?["body"] else { return problems }
        do {
            let actual = try ProtocolJSON.parse(reply.body)
            var matcher = BodyMatcher(cursors: cursors)
            matcher.match(expected, actual, at: "$", inDouble: false)
            cursors = matcher.cursors
            problems += matcher.problems
        } catch {
            problems.append("body: not JSON (\(error))")
        }
        return problems
    }

    func report(_ label: String, _ request: Request, _ reply: TestServer.Reply, _ problems: [String]) -> String {
        let response = json["response"]
        let expectedHeaders = response?["headers"]?.serialized ?? "{}"
        let actualHeaders = reply.headers.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: "; ")
        return """
            \(label) (\(method) \(request.target)):
              \(problems.joined(separator: "\n  "))
              expected: \(response?["status"]?.serialized ?? "?") \(expectedHeaders)
                \(response?["body"]?.serialized ?? "(no body)")
              actual:   \(reply.status) {\(actualHeaders)}
                \(String(decoding: reply.body, as: UTF8.self))
            """
    }

    private func substituted(_ value: String, _ cursors: [String: String]) throws -> String {
        guard let name = cursorName(value) else { return value }
        guard let bound = cursors[name] else { throw VectorFileError(description: "request uses unbound cursor \(name)") }
        return bound
    }

    /// Everything but the unreserved characters of RFC 3986 is escaped.
    private func percentEncoded(_ text: String) -> String {
        var allowed = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }
}

/// NAME when `value` is exactly `<cursor:NAME>`, NAME being letters, digits and `-`.
private func cursorName(_ value: String) -> String? {
    guard value.hasPrefix("<cursor:"), value.hasSuffix(">") else { return nil }
    let name = value.dropFirst("<cursor:".count).dropLast()
    let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-".unicodeScalars)
    guard !name.isEmpty, name.unicodeScalars.allSatisfy(allowed.contains) else { return nil }
    return String(name)
}

// MARK: - Matching a body

/// The rules of sync-protocol.md, section 14, "Matching a body".
private struct BodyMatcher {
    var cursors: [String: String]
    var problems: [String] = []

    mutating func match(_ expected: ProtocolJSON, _ actual: ProtocolJSON, at path: String, inDouble: Bool) {
        switch (expected, actual) {
        case (.string("<any>"), _):
            return
        case (.string(let text), _) where cursorName(text) != nil:
            matchCursor(cursorName(text)!, actual, at: path)
        case (.object(let expectedMembers), .object(let actualMembers)):
            matchObject(expectedMembers, actualMembers, at: path)
        case (.array(let expectedElements), .array(let actualElements)):
            if expectedElements.count != actualElements.count {
                problems.append("\(path): expected \(expectedElements.count) elements, got \(actualElements.count)")
            }
            for (index, (e, a)) in zip(expectedElements, actualElements).enumerated() {
                match(e, a, at: "\(path)[\(index)]", inDouble: false)
            }
        case (.number(let e), .number(let a)):
            if !numbersMatch(e, a, inDouble: inDouble) { mismatch(expected, actual, at: path) }
        case (.string(let e), .string(let a)):
            if !e.unicodeScalars.elementsEqual(a.unicodeScalars) { mismatch(expected, actual, at: path) }
        case (.bool(let e), .bool(let a)):
            if e != a { mismatch(expected, actual, at: path) }
        case (.null, .null):
            return
        default:
            mismatch(expected, actual, at: path)
        }
    }

    private mutating func matchCursor(_ name: String, _ actual: ProtocolJSON, at path: String) {
        guard case .string(let value) = actual else {
            problems.append("\(path): expected a string for <cursor:\(name)>, got \(actual.serialized)")
            return
        }
        if let bound = cursors[name] {
            if bound != value { problems.append("\(path): expected cursor \(name) = \"\(bound)\", got \"\(value)\"") }
        } else {
            cursors[name] = value
        }
    }

    private mutating func matchObject(
        _ expected: [(String, ProtocolJSON)], _ actual: [(String, ProtocolJSON)], at path: String
    ) {
        var actualByName: [String: ProtocolJSON] = [:]
        for (name, value) in actual {
            if actualByName.updateValue(value, forKey: name) != nil { problems.append("\(path): member \"\(name)\" twice") }
        }
        let expectedNames = Set(expected.map(\.0))
        for (name, _) in actual where !expectedNames.contains(name) {
            problems.append("\(path): unexpected member \"\(name)\"")
        }
        for (name, value) in expected {
            guard let actualValue = actualByName[name] else {
                problems.append("\(path): missing member \"\(name)\"")
                continue
            }
            match(value, actualValue, at: "\(path).\(name)", inDouble: name == "$double")
        }
    }

    /// An integer literal matches only an integer literal of the same value;
    /// any other number, a non-integer literal of the same binary64 value.
    /// The value of a `$double` member matches any number of the same
    /// binary64 value, negative zero only negative zero.
    private func numbersMatch(_ expected: String, _ actual: String, inDouble: Bool) -> Bool {
        if inDouble { return sameBinary64(expected, actual) }
        switch (isIntegerLiteral(expected), isIntegerLiteral(actual)) {
        case (true, true): return integerValue(expected) == integerValue(actual)
        case (false, false): return sameBinary64(expected, actual)
        default: return false
        }
    }

    private func isIntegerLiteral(_ literal: String) -> Bool { !literal.contains { "eE.".contains($0) } }

    /// JSON has no leading zeros, so the literal is canonical but for `-0`.
    private func integerValue(_ literal: String) -> String { literal == "-0" ? "0" : literal }

    private func sameBinary64(_ a: String, _ b: String) -> Bool {
        guard let x = Double(a), let y = Double(b) else { return false }
        return x.bitPattern == y.bitPattern
    }

    private mutating func mismatch(_ expected: ProtocolJSON, _ actual: ProtocolJSON, at path: String) {
        problems.append("\(path): expected \(expected.serialized), got \(actual.serialized)")
    }
}

// MARK: - JSON that keeps number literals

/// A JSON value that keeps each number as written, so that `2`, `2.0` and
/// `2e0` stay apart, and each object's members in order.
private indirect enum ProtocolJSON {
    case null
    case bool(Bool)
    case number(String)
    case string(String)
    case array([ProtocolJSON])
    case object([(String, ProtocolJSON)])

    subscript(name: String) -> ProtocolJSON? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.0 == name }?.1
    }

    var integer: Int? {
        guard case .number(let literal) = self else { return nil }
        return Int(literal)
    }

    func stringMembers() throws -> [(String, String)] {
        guard case .object(let members) = self else { throw VectorFileError(description: "not an object: \(serialized)") }
        return try members.map { name, value in
            guard case .string(let text) = value else { throw VectorFileError(description: "not a string: \(value.serialized)") }
            return (name, text)
        }
    }

    func substitutingCursors(_ cursors: [String: String]) throws -> ProtocolJSON {
        switch self {
        case .string(let text):
            guard let name = cursorName(text) else { return self }
            guard let bound = cursors[name] else { throw VectorFileError(description: "request uses unbound cursor \(name)") }
            return .string(bound)
        case .array(let elements): return .array(try elements.map { try $0.substitutingCursors(cursors) })
        case .object(let members): return .object(try members.map { ($0.0, try $0.1.substitutingCursors(cursors)) })
        default: return self
        }
    }

    /// Compact JSON. An integer literal is written as written; any other
    /// number by `Double.description`, which keeps a fraction or an exponent.
    var serialized: String {
        switch self {
        case .null: return "null"
        case .bool(let value): return value ? "true" : "false"
        case .number(let literal):
            guard literal.contains(where: { "eE.".contains($0) }), let value = Double(literal), value.isFinite else { return literal }
            return value.description
        case .string(let text): return Self.quoted(text)
        case .array(let elements): return "[" + elements.map(\.serialized).joined(separator: ",") + "]"
        case .object(let members):
            return "{" + members.map { Self.quoted($0.0) + ":" + $0.1.serialized }.joined(separator: ",") + "}"
        }
    }

    private static func quoted(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20: out += String(format: "\\u%04x", scalar.value)
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }

    /// Parses RFC 8259 JSON strictly: one value, nothing after it.
    static func parse(_ data: Data) throws -> ProtocolJSON {
        var parser = ProtocolJSONParser(bytes: Array(data))
        parser.skipWhitespace()
        let value = try parser.value(depth: 0)
        parser.skipWhitespace()
        guard parser.index == parser.bytes.count else { throw parser.error("text after the value") }
        return value
    }
}

private struct ProtocolJSONParser {
    let bytes: [UInt8]
    var index = 0

    func error(_ message: String) -> VectorFileError { VectorFileError(description: "JSON: \(message) at byte \(index)") }

    var next: UInt8? { index < bytes.count ? bytes[index] : nil }

    mutating func skipWhitespace() {
        while let byte = next, byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D { index += 1 }
    }

    mutating func expect(_ literal: String) throws {
        for byte in literal.utf8 {
            guard next == byte else { throw error("expected \(literal)") }
            index += 1
        }
    }

    mutating func value(depth: Int) throws -> ProtocolJSON {
        guard depth < 512 else { throw error("nested too deeply") }
        guard let byte = next else { throw error("expected a value") }
        switch byte {
        case UInt8(ascii: "n"): try expect("null"); return .null
        case UInt8(ascii: "t"): try expect("true"); return .bool(true)
        case UInt8(ascii: "f"): try expect("false"); return .bool(false)
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "["): return try array(depth: depth)
        case UInt8(ascii: "{"): return try object(depth: depth)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return .number(try number())
        default: throw error("expected a value")
        }
    }

    mutating func array(depth: Int) throws -> ProtocolJSON {
        index += 1
        skipWhitespace()
        var elements: [ProtocolJSON] = []
        if next == UInt8(ascii: "]") { index += 1; return .array(elements) }
        while true {
            skipWhitespace()
            elements.append(try value(depth: depth + 1))
            skipWhitespace()
            if next == UInt8(ascii: "]") { index += 1; return .array(elements) }
            try expect(",")
        }
    }

    mutating func object(depth: Int) throws -> ProtocolJSON {
        index += 1
        skipWhitespace()
        var members: [(String, ProtocolJSON)] = []
        if next == UInt8(ascii: "}") { index += 1; return .object(members) }
        while true {
            skipWhitespace()
            guard next == UInt8(ascii: "\"") else { throw error("expected a member name") }
            let name = try string()
            skipWhitespace()
            try expect(":")
            skipWhitespace()
            members.append((name, try value(depth: depth + 1)))
            skipWhitespace()
            if next == UInt8(ascii: "}") { index += 1; return .object(members) }
            try expect(",")
        }
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`, returned as written.
    mutating func number() throws -> String {
        let start = index
        if next == UInt8(ascii: "-") { index += 1 }
        if next == UInt8(ascii: "0") {
            index += 1
        } else {
            guard digits() > 0 else { throw error("expected a digit") }
        }
        if next == UInt8(ascii: ".") {
            index += 1
            guard digits() > 0 else { throw error("expected a digit after .") }
        }
        if next == UInt8(ascii: "e") || next == UInt8(ascii: "E") {
            index += 1
            if next == UInt8(ascii: "+") || next == UInt8(ascii: "-") { index += 1 }
            guard digits() > 0 else { throw error("expected an exponent") }
        }
        return String(decoding: bytes[start..<index], as: UTF8.self)
    }

    mutating func digits() -> Int {
        let start = index
        while let byte = next, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) { index += 1 }
        return index - start
    }

    mutating func string() throws -> String {
        index += 1
        var utf8: [UInt8] = []
        while true {
            guard let byte = next else { throw error("unterminated string") }
            index += 1
            switch byte {
            case UInt8(ascii: "\""):
                guard let text = String(validating: utf8, as: UTF8.self) else { throw error("invalid UTF-8") }
                return text
            case UInt8(ascii: "\\"):
                try escape(into: &utf8)
            case 0..<0x20:
                throw error("control character in a string")
            default:
                utf8.append(byte)
            }
        }
    }

    mutating func escape(into utf8: inout [UInt8]) throws {
        guard let byte = next else { throw error("unterminated escape") }
        index += 1
        let simple: [UInt8: UInt8] = [
            UInt8(ascii: "\""): 0x22, UInt8(ascii: "\\"): 0x5C, UInt8(ascii: "/"): 0x2F, UInt8(ascii: "b"): 0x08,
            UInt8(ascii: "f"): 0x0C, UInt8(ascii: "n"): 0x0A, UInt8(ascii: "r"): 0x0D, UInt8(ascii: "t"): 0x09,
        ]
        if let replacement = simple[byte] {
            utf8.append(replacement)
            return
        }
        guard byte == UInt8(ascii: "u") else { throw error("unknown escape") }
        var code = try hex4()
        if (0xD800..<0xDC00).contains(code) {
            try expect("\\u")
            let low = try hex4()
            guard (0xDC00..<0xE000).contains(low) else { throw error("unpaired surrogate") }
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
        }
        guard let scalar = Unicode.Scalar(code) else { throw error("unpaired surrogate") }
        utf8 += Array(String(Character(scalar)).utf8)
    }

    mutating func hex4() throws -> UInt32 {
        guard index + 4 <= bytes.count,
            let value = UInt32(String(decoding: bytes[index..<index + 4], as: UTF8.self), radix: 16),
            bytes[index..<index + 4].allSatisfy({ $0 != UInt8(ascii: "+") && $0 != UInt8(ascii: "-") })
        else { throw error("expected four hex digits") }
        index += 4
        return value
    }
}
