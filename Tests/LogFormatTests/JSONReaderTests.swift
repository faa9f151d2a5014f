import Foundation
import LogFormat
import LogTesting
import Testing

@Suite struct JSONReaderTests {
    private func read(_ text: String) throws -> JSONValue { try JSONReader.parse(Array(text.utf8)) }

    @Test func numbersAreReadByValue() throws {
        #expect(try read("2") == .int(2))
        #expect(try read("2.0") == .int(2))
        #expect(try read("1e2") == .int(100))
        #expect(try read("-0") == .negativeZero)
        #expect(try Value(json: read("-0")) == .int(0))
        #expect(try Value(json: read(#"{"$double": -0}"#)) == .double(-0.0))
        #expect(try read("-0.0") == .negativeZero)
        #expect(try read("2.5") == .double(2.5))
        #expect(try read("9223372036854775807") == .int(.max))
        #expect(try read("-9223372036854775808") == .int(.min))
        #expect(try read("9223372036854775808") == .unsigned(9_223_372_036_854_775_808))
        #expect(try Value(json: read("9223372036854775808")) == .double(9_223_372_036_854_775_808))
        for bad in ["01", "1.", ".5", "1e", "-", "+1", "1e400", "NaN", "0x10"] {
            #expect(throws: JSONReadError.self, "\(bad)") { try read(bad) }
        }
    }

    @Test func stringsAndEscapes() throws {
        #expect(try read(#""a\"b\\c\/d\n\t""#) == .string("a\"b\\c/d\n\t"))
        #expect(try read(#""\u00e9\ud83d\ude00""#) == .string("é😀"))
        #expect(try read("\"漢字\"") == .string("漢字"))
        for bad in [#""\ud83d""#, #""\ude00""#, #""\x""#, "\"a\nb\"", #""abc"#, "\"\u{1}\""] {
            #expect(throws: JSONReadError.self, "\(bad)") { try read(bad) }
        }
        #expect(throws: JSONReadError.self) { try JSONReader.parse([0x22, 0xFF, 0x22]) }
    }

    /// RFC 8259 section 7: U+0000 to U+001F must be escaped inside a string.
    /// Each one raw is refused wherever it stands, before or after an
    /// escape (the reader takes another path once it has met one).
    @Test func everyRawControlCharacterInAStringIsRefusedBeforeAndAfterAnEscape() throws {
        for byte in UInt8(0)..<0x20 {
            for (before, after) in [("a", "b"), (#"\n"#, "b"), ("a", #"\t"#)] {
                let text = [0x22] + Array(before.utf8) + [byte] + Array(after.utf8) + [0x22]
                #expect(throws: JSONReadError.self, "byte \(byte) after \(before)") { try JSONReader.parse(text) }
            }
        }
        #expect(try read(#""\n\u001f""#) == .string("\n\u{1F}"))
    }

    /// A body is JSON in UTF-8 (`Format/sync-protocol.md` section 2,
    /// "Bodies"): a string whose bytes are not well-formed UTF-8 is refused,
    /// not read with replacement characters, before an escape or after one.
    @Test func aStringThatIsNotUTF8IsRefusedBeforeAndAfterAnEscape() throws {
        for bad: [UInt8] in [[0xFF], [0x80], [0xC3], [0xC0, 0xAF], [0xED, 0xA0, 0x80], [0xF4, 0x90, 0x80, 0x80]] {
            for (before, after) in [("a", "b"), (#"\n"#, "b"), ("a", #"\t"#)] {
                let text = [0x22] + Array(before.utf8) + bad + Array(after.utf8) + [0x22]
                #expect(throws: JSONReadError.self, "\(bad) after \(before)") { try JSONReader.parse(text) }
            }
        }
        #expect(try JSONReader.parse([0x22, 0x5C, 0x6E, 0xC3, 0xA9, 0x22]) == .string("\né"))
    }

    /// A text cut anywhere inside a surrogate pair's escapes is refused as
    /// an error, without reading past its last byte (the reader looks ahead
    /// for the low half's `\u`).
    @Test func aTextCutInsideASurrogatePairIsRefused() throws {
        let pair = Array(#""\ud83d\ude00""#.utf8)
        #expect(try JSONReader.parse(pair) == .string("😀"))
        for count in 1..<pair.count {
            #expect(throws: JSONReadError.self, "\(count) bytes") { try JSONReader.parse(pair[..<count]) }
        }
    }

    /// Every escape RFC 8259 section 7 defines reads as its character, and
    /// the four hex digits of `\u` are case-insensitive, each of `a` to `f`
    /// and `A` to `F`.
    @Test func everyEscapeReadsAsItsCharacterAndHexDigitsInEitherCase() throws {
        #expect(try read(#""\b\f\r\n\t\"\\\/""#) == .string("\u{8}\u{C}\r\n\t\"\\/"))
        #expect(try read(#""\u00AB\u00CD\u00EF\u00ab\u00cd\u00ef""#) == .string("\u{AB}\u{CD}\u{EF}\u{AB}\u{CD}\u{EF}"))
        #expect(try read(#""\uD83D\uDE00\uDBFF\uDFFF""#) == .string("\u{1F600}\u{10FFFF}"))
        #expect(try read(#""\u0009\u001F\u0041""#) == .string("\t\u{1F}A"))
    }

    /// RFC 8259 section 2: space, tab, line feed and carriage return are
    /// whitespace around any value and structural character (a body written
    /// with CRLF line ends reads); other bytes, such as form feed, are not.
    @Test func theFourWhitespaceBytesAreSkippedEverywhereAndNoOthers() throws {
        for space in [" ", "\t", "\n", "\r", "\r\n"] {
            let text = [space, "{", "\"a\"", ":", "[", "1", ",", "null", "]", "}", space].joined(separator: space)
            #expect(try read(text) == .object([("a", .array([.int(1), .null]))]), "\(Array(space.utf8))")
        }
        for other in ["\u{C}", "\u{B}", "\u{A0}"] {
            #expect(throws: JSONReadError.self, "\(Array(other.utf8))") { try read(other + "1") }
            #expect(throws: JSONReadError.self, "\(Array(other.utf8))") { try read("[1" + other + "]") }
        }
    }

    /// Arrays and objects nest at most `depthMax` (64) deep, counted alike:
    /// 64 of either kind, or mixed, are read; one more of either is refused.
    @Test func objectsAndArraysNestUpToDepthMaxAndNoDeeper() throws {
        let kinds: [(open: String, close: String)] = [(#"{"k": "#, "}"), ("[", "]")]
        for first in 0..<2 {
            for mixed in [false, true] {
                func text(_ depth: Int) -> String {
                    let levels = (0..<depth).map { kinds[mixed ? ($0 + first) % 2 : first] }
                    return levels.map(\.open).joined() + "null" + levels.reversed().map(\.close).joined()
                }
                #expect(throws: Never.self, "\(first) \(mixed)") { try read(text(JSONReader.depthMax)) }
                #expect(throws: JSONReadError.self, "\(first) \(mixed)") { try read(text(JSONReader.depthMax + 1)) }
            }
        }
    }

    /// A value nested past `depthMax` that is kept as unreadable (so a push
    /// can reject only its operation) still has its syntax checked: a member
    /// without a name, a missing colon or comma, or a wrong closer is refused
    /// as the whole text, as it is at any other depth.
    @Test func aTooDeepValueKeptAsUnreadableHasItsSyntaxChecked() throws {
        func text(_ inner: String) -> [UInt8] {
            Array((String(repeating: "[", count: JSONReader.depthMax) + inner + String(repeating: "]", count: JSONReader.depthMax)).utf8)
        }
        var kept = try JSONReader.parse(text(#"{"a": 1, "b": [2, {}], "c": {"d": []}}"#), keepingUnreadableValues: true)
        for _ in 0..<JSONReader.depthMax {
            guard case .array(let elements) = kept, elements.count == 1 else { break }
            kept = elements[0]
        }
        #expect(kept == .unreadable("nested deeper than \(JSONReader.depthMax)"))
        for bad in [#"{"a": 1, 2}"#, #"{"a" 1}"#, #"{"a": 1 "b": 2}"#, "[1 2]", "[1, 2}", #"{"a": [}"#, "{1: 2}", "[1,]"] {
            #expect(throws: JSONReadError.self, "\(bad)") { try JSONReader.parse(text(bad), keepingUnreadableValues: true) }
        }
    }

    /// A number outside binary64 (`1e400`, section 4 point 2) is refused at
    /// the byte where the number starts, so the error points at it.
    @Test func aNumberOutsideBinary64IsRefusedAtItsFirstByte() throws {
        for (text, position) in [("1e400", 0), ("-1e400", 0), (#"{"n": 1e400}"#, 6), ("[1, -2e999]", 4)] {
            let error = #expect(throws: JSONReadError.self, "\(text)") { try read(text) }
            #expect(error?.position == position, "\(text): \(String(describing: error))")
        }
    }

    @Test func structureIsStrict() throws {
        #expect(try read(#" { "a" : [1, {"b": null}] , "c": true } "#) == .object([("a", .array([.int(1), .object([("b", .null)])])), ("c", .bool(true))]))
        for bad in ["", "{", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{\"a\":1,\"a\":2}", "[1] [2]", "tru", "nul"] {
            #expect(throws: JSONReadError.self, "\(bad)") { try read(bad) }
        }
        let deep = String(repeating: "[", count: JSONReader.depthMax + 1) + String(repeating: "]", count: JSONReader.depthMax + 1)
        #expect(throws: JSONReadError.self) { try read(deep) }
    }

    /// A literal may end the text: `true`, `false` and `null` are whole JSON
    /// texts (RFC 8259), read up to the last byte and no further; cut short,
    /// they are refused.
    @Test func literalsThatEndTheTextAreRead() throws {
        for (text, value) in [("true", JSONValue.bool(true)), ("false", .bool(false)), ("null", .null)] {
            #expect(try read(text) == value, "\(text)")
            #expect(try read("[" + text + "]") == .array([value]), "[\(text)]")
            #expect(throws: JSONReadError.self, "\(text.dropLast())") { try read(String(text.dropLast())) }
        }
    }

    /// Small objects scan for a repeated name, larger ones use a set: both
    /// refuse it, wherever it stands.
    @Test func repeatedNamesAreRefusedInObjectsOfAnySize() throws {
        for count in [1, 2, JSONReader.memberScanCountMax - 1, JSONReader.memberScanCountMax, JSONReader.memberScanCountMax + 1, 40] {
            let names = (0..<count).map { "m\($0)" }
            let members = names.map { "\"\($0)\": 1" }
            #expect(try read("{" + members.joined(separator: ",") + "}") == .object(names.map { ($0, .int(1)) }))
            for repeated in [0, count / 2, count - 1] {
                let text = "{" + (members + ["\"m\(repeated)\": 2"]).joined(separator: ",") + "}"
                #expect(throws: JSONReadError.self, "\(count) members, m\(repeated) again") { try read(text) }
            }
        }
    }

    /// Random values written by our encoder read back unchanged: the reader
    /// and the writer agree on every form. `JSONWriter` writes the same
    /// bytes as `JSONEncoder`.
    @Test func encodedValuesReadBackUnchanged() throws {
        let seed = SeededRandom.seed(default: 77)
        var random = RandomEntries(seed: seed)
        let encoder = Wire.makeEncoder()
        for round in 0..<2_000 {
            let fields = random.storeFields(countMax: 6)
            let json = try encoder.encode(fields)
            let read = try Fields(json: try JSONReader.parse(json))
            #expect(read == fields, "seed \(seed) round \(round): \(String(decoding: json, as: UTF8.self))")
            var writer = JSONWriter()
            try fields.writeJSON(to: &writer)
            #expect(writer.bytes == Array(json), "seed \(seed) round \(round): \(String(decoding: writer.bytes, as: UTF8.self))")
        }
    }

    @Test func specialFormsAreChecked() throws {
        #expect(try Value(json: read(#"{"$double": 2}"#)) == .double(2))
        #expect(try Value(json: read(#"{"$double": -0.0}"#)) == .double(-0.0))
        #expect(try Value(json: read("-0.0")) == .int(0))
        #expect(try Value(json: read(#"{"$bytes": "AAEC"}"#)) == .bytes([0, 1, 2]))
        #expect(try Value(json: read(#"{"$timestamp": 5}"#)) == .timestamp(5))
        for bad in [#"{"$double": "2"}"#, #"{"$bytes": "AAE"}"#, #"{"$timestamp": 1.5}"#, #"{"$other": 1}"#, #"{"$double": 1, "x": 2}"#] {
            #expect(throws: WireDecodingError.self, "\(bad)") { try Value(json: read(bad)) }
        }
    }

    @Test func pullPagesDecodeAsJSONDecoderDoes() throws {
        let page = PullResponse(
            changes: [
                PullChange(entityType: "te", entityID: "a", operation: .upsert, data: ["n": 1, "d": .double(2), "s": "x"], serverVersion: 3, updatedAt: "2026-11-22T08:00:00.000000Z"),
                PullChange(
                    entityType: "te", entityID: "b", operation: .delete, data: nil, serverVersion: 4,
                    updatedAt: "2026-11-22T08:00:00.000000Z", idempotencyKey: "k2"),
            ], cursor: "c", hasMore: true)
        let json = try Wire.makeEncoder().encode(page)
        #expect(try PullResponse.decode(json: json) == page)
        #expect(try JSONDecoder().decode(PullResponse.self, from: json) == page)
        #expect(throws: (any Error).self) { try PullResponse.decode(json: Array(#"{"changes": 1}"#.utf8)) }
        // A change's idempotency key is optional, and null is none; another
        // kind of value is a body the protocol does not define.
        func change(_ key: String) -> [UInt8] {
            Array(
                (#"{"changes": [{"entity_type": "te", "entity_id": "a", "operation": "delete", "data": null, "#
                    + #""server_version": 1, "updated_at": "x"\#(key)}], "cursor": "c", "has_more": false, "force_resync": false}"#).utf8)
        }
        #expect(try PullResponse.decode(json: change("")).changes.first?.idempotencyKey == nil)
        #expect(try PullResponse.decode(json: change(#", "idempotency_key": null"#)).changes.first?.idempotencyKey == nil)
        #expect(try PullResponse.decode(json: change(#", "idempotency_key": "k""#)).changes.first?.idempotencyKey == "k")
        let error = #expect(throws: WireDecodingError.self) { try PullResponse.decode(json: change(#", "idempotency_key": 7"#)) }
        #expect("\(String(describing: error))".contains("changes[0].idempotency_key"), "\(String(describing: error))")
    }

    /// A `force_resync` answer carries the empty cursor, which the client
    /// ignores (`Format/sync-protocol.md` section 8, "force_resync"): it is
    /// read, while an empty cursor in any other page is refused, naming it.
    @Test func aForcedResyncsEmptyCursorIsReadAndAnyOtherPagesIsRefused() throws {
        let resync = Array(#"{"changes": [], "cursor": "", "has_more": true, "force_resync": true}"#.utf8)
        #expect(try PullResponse.decode(json: resync) == PullResponse(changes: [], cursor: "", hasMore: true, forceResync: true))
        let page = Array(#"{"changes": [], "cursor": "", "has_more": true, "force_resync": false}"#.utf8)
        let error = #expect(throws: WireDecodingError.self) { try PullResponse.decode(json: page) }
        #expect(error?.path == "cursor", "\(String(describing: error))")
    }

    /// `server_version` is present for applied and duplicate results,
    /// `error_code` for rejected ones (`Format/sync-protocol.md` section 7,
    /// "Response"): a result without the member its status needs is
    /// refused, naming that member.
    @Test func aPushResultWithoutTheMemberItsStatusNeedsIsRefused() throws {
        func answer(_ status: String, _ members: String) -> [UInt8] {
            Array(#"{"results": [{"idempotency_key": "k", "status": "\#(status)"\#(members)}]}"#.utf8)
        }
        for status in ["applied", "duplicate"] {
            #expect(try PushResponse.decode(json: answer(status, #", "server_version": 4"#)).results.first?.serverVersion == 4)
            for members in ["", #", "server_version": null"#, #", "server_version": -1"#, #", "server_version": "4""#] {
                let error = #expect(throws: WireDecodingError.self, "\(status)\(members)") {
                    try PushResponse.decode(json: answer(status, members))
                }
                #expect(error?.path == "results[0].server_version", "\(status)\(members): \(String(describing: error))")
            }
        }
        #expect(try PushResponse.decode(json: answer("rejected", #", "error_code": "CONFLICT""#)).results.first?.errorCode == .conflict)
        let error = #expect(throws: WireDecodingError.self) { try PushResponse.decode(json: answer("rejected", "")) }
        #expect(error?.path == "results[0].error_code", "\(String(describing: error))")
    }

    /// An operation is an object (`Format/sync-protocol.md` section 7,
    /// "Request"); any other JSON value is refused as not an object, naming
    /// the operation itself, not a member it lacks.
    @Test func anOperationThatIsNotAnObjectIsRefusedNamingTheOperation() throws {
        for text in ["null", "1", #""create""#, "[]", #"[{"intent": "create"}]"#, "true"] {
            let error = #expect(throws: WireDecodingError.self, "\(text)") {
                try PushOperation(json: read(text), path: "operations[2]")
            }
            #expect(error == WireDecodingError("operations[2]", "is not an object"), "\(text): \(String(describing: error))")
        }
    }

    /// Objects count toward the depth as arrays do (`Format/sync-protocol.md`
    /// section 4, "Reading"): 32 nested objects are read, a 33rd, at depth
    /// 32, is refused, naming its path.
    @Test func objectsNestedPastValueDepthMaxAreRefusedAtTheFirstTooDeep() throws {
        func nested(_ depth: Int) -> String {
            (0..<depth).reduce("null") { inner, _ in #"{"k": \#(inner)}"# }
        }
        let deepest = try Fields(json: read(#"{"n": \#(nested(Limits.valueDepthMax))}"#))
        var value = Value.null
        for _ in 0..<Limits.valueDepthMax { value = .object(["k": value]) }
        #expect(deepest == ["n": value])
        #expect { try Fields(json: read(#"{"n": \#(nested(Limits.valueDepthMax + 1))}"#)) } throws: {
            ($0 as? WireDecodingError)?.path == "n" + String(repeating: ".k", count: Limits.valueDepthMax)
        }
    }

    /// A page's cursor is 1 to `cursorBytesMax` (1024) bytes, each from `!`
    /// to `~` (`Format/sync-protocol.md` section 8, "Cursors"): one at the
    /// bound and every allowed byte are read; one byte more, a space or DEL
    /// are refused, naming the cursor.
    @Test func aPagesCursorIs1To1024PrintableASCIIBytes() throws {
        func page(_ cursor: String) -> [UInt8] {
            Array(#"{"changes": [], "cursor": "\#(cursor)", "has_more": false, "force_resync": false}"#.utf8)
        }
        let printable = String(decoding: (UInt8(0x21)...0x7E).filter { $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") }, as: UTF8.self)
        for cursor in [String(repeating: "c", count: Wire.cursorBytesMax), printable, "!", "~"] {
            #expect(try PullResponse.decode(json: page(cursor)).cursor == cursor, "\(cursor.utf8.count) bytes")
        }
        #expect(try PullResponse.decode(json: page(#"\"\\"#)).cursor == #""\"#)
        for cursor in [String(repeating: "c", count: Wire.cursorBytesMax + 1), "a b", "a\u{7F}", "é", ""] {
            let error = #expect(throws: WireDecodingError.self, "\(cursor.utf8.count) bytes") { try PullResponse.decode(json: page(cursor)) }
            #expect(error?.path == "cursor", "\(String(describing: error))")
        }
    }

    /// A pull's `limit` (`Format/sync-protocol.md` section 8, "Request") and
    /// a `Retry-After` in seconds are ASCII digits only: not empty, no sign,
    /// space or fraction.
    @Test func digitsOnlyMeansOneOrMoreASCIIDigitsAndNothingElse() {
        for text in ["0", "7", "100", "0123456789", "99999999999999999999999"] {
            #expect(Wire.isDigits(text), "\(text)")
        }
        for text in ["", "-1", "+5", "2.0", " 5", "5 ", "ten", "1e3", "\u{0663}"] {
            #expect(!Wire.isDigits(text), "\(text)")
        }
    }

    /// A CONFLICT for a create ahead of an entity that never existed carries
    /// `server_state` with `server_version` 0 (`Format/sync-protocol.md`
    /// section 7, "Response"): it is read; a negative one is refused, naming it.
    @Test func aConflictsServerStateAtVersion0IsReadAndANegativeOneIsRefused() throws {
        func answer(_ version: String) -> [UInt8] {
            Array(
                (#"{"results": [{"idempotency_key": "k", "status": "rejected", "error_code": "CONFLICT", "error_message": "m", "#
                    + #""server_state": {"server_version": \#(version), "deleted": true, "data": {}}}]}"#).utf8)
        }
        let state = try PushResponse.decode(json: answer("0")).results.first?.serverState
        #expect(state == ServerState(serverVersion: 0, deleted: true, data: [:]))
        let error = #expect(throws: WireDecodingError.self) { try PushResponse.decode(json: answer("-1")) }
        #expect(error?.path == "results[0].server_state.server_version", "\(String(describing: error))")
    }

    /// Versions are read by value, as every number (`Format/sync-protocol.md`
    /// section 4): `-0`, `-0.0` and `4.0` are the versions 0, 0 and 4 in a
    /// result and its server state, as in an operation's `base_version`. A
    /// pulled change's version starts at 1, so `-0` is refused there.
    @Test func versionsAreReadByValueWhereverTheyStand() throws {
        func result(_ version: String, state: String) -> [UInt8] {
            Array(
                (#"{"results": [{"idempotency_key": "k", "status": "duplicate", "server_version": \#(version), "#
                    + #""server_state": {"server_version": \#(state), "deleted": true, "data": {}}}]}"#).utf8)
        }
        for (written, value) in [("-0", UInt64(0)), ("-0.0", 0), ("4.0", 4), ("4", 4)] {
            let read = try #require(try PushResponse.decode(json: result(written, state: written)).results.first, "\(written)")
            #expect(read.serverVersion == value && read.serverState?.serverVersion == value, "\(written): \(read)")
            let operation = try PushOperation(
                json: self.read(
                    #"{"idempotency_key": "k", "entity_type": "t", "entity_id": "i", "intent": "delete", "#
                        + #""client_timestamp": "2026-11-25T12:00:00.000000Z", "base_version": \#(written)}"#))
            #expect(operation.baseVersion == value, "\(written)")
        }
        func change(_ version: String) -> [UInt8] {
            Array(
                (#"{"changes": [{"entity_type": "t", "entity_id": "i", "operation": "delete", "server_version": \#(version), "#
                    + #""updated_at": "2026-11-25T12:00:00.000000Z"}], "cursor": "c", "has_more": false, "force_resync": false}"#).utf8)
        }
        #expect(try PullResponse.decode(json: change("1.0")).changes.first?.serverVersion == 1)
        let error = #expect(throws: WireDecodingError.self) { try PullResponse.decode(json: change("-0")) }
        #expect(error?.path == "changes[0].server_version", "\(String(describing: error))")
    }

    /// A pulled change the store would refuse to apply is a body the
    /// protocol does not define (section 8), refused by the reader with the
    /// member's path: version 0, a delete carrying fields, a type, id or
    /// field name outside the store's rules. Before, the reader took them, and the
    /// store refused the page on apply, the run failing with an invalid
    /// argument of the local store ("server versions start at 1"); a
    /// delete's fields were dropped without a word.
    @Test func aPulledChangeTheStoreWouldRefuseIsRefusedByTheReader() throws {
        func page(_ operation: String, data: String = "null", version: String = "1", type: String = "te", id: String = "a") -> [UInt8] {
            Array(
                (#"{"changes": [{"entity_type": "\#(type)", "entity_id": "\#(id)", "operation": "\#(operation)", "data": \#(data), "#
                    + #""server_version": \#(version), "updated_at": "x"}], "cursor": "c", "has_more": false, "force_resync": false}"#).utf8)
        }
        let refused: [(page: [UInt8], path: String)] = [
            (page("upsert", data: #"{"n": 1}"#, version: "0"), "changes[0].server_version"),
            (page("delete", version: "-0"), "changes[0].server_version"),
            (page("delete", data: #"{"n": 1}"#), "changes[0].data"),
            (page("upsert", data: "{}", type: "Task"), "changes[0].entity_type"),
            (page("upsert", data: "{}", id: ""), "changes[0].entity_id"),
            (page("upsert", data: #"{"": 1}"#), "changes[0].data"),
        ]
        for (bytes, path) in refused {
            let error = #expect(throws: WireDecodingError.self, "\(path)") { try PullResponse.decode(json: bytes) }
            #expect(error?.path == path, "\(String(describing: error))")
        }
        // A delete's `data` is null; `{}` is no fields either.
        for data in ["null", "{}"] {
            #expect(try PullResponse.decode(json: page("delete", data: data)).changes.first?.data?.isEmpty ?? true, "\(data)")
        }
        #expect(try PullResponse.decode(json: page("upsert", data: "{}", version: "1.0")).changes.first?.serverVersion == 1)
    }

    /// A number's value decides int or double (`Format/sync-protocol.md`
    /// section 4, "Reading", point 2), and the value is the decimal the text
    /// writes, not the double nearest to it: a whole number within Int64 is
    /// that int exactly, whatever its form.
    @Test func wholeNumbersInAnyFormAreTheirExactInt() throws {
        #expect(try read("9007199254740993.0") == .int(9_007_199_254_740_993))
        #expect(try read("9.007199254740993e15") == .int(9_007_199_254_740_993))
        #expect(try read("9223372036854775807.0") == .int(.max))
        #expect(try read("-9223372036854775808.0") == .int(.min))
        #expect(try read("922337203685477580.7e1") == .int(.max))
        #expect(try read("10.50e1") == .int(105))
        #expect(try read("0.0") == .int(0))
        // Not whole, though the nearest double is: a double.
        #expect(try read("1.00000000000000001") == .double(1))
        #expect(try read("9223372036854775807.5") == .double(9_223_372_036_854_775_808))
        #expect(try Value(json: read("1.00000000000000001")) == .double(1))
        // Whole but outside Int64: a double as a value, kept exact up to
        // 2^64 - 1 for u64 fields.
        #expect(try read("9223372036854775808.0") == .unsigned(9_223_372_036_854_775_808))
        #expect(try Value(json: read("9223372036854775808.0")) == .double(9_223_372_036_854_775_808))
        #expect(try read("-9223372036854775809.0") == .double(-9_223_372_036_854_775_808))
    }

    /// Whole numbers from 2^63 to 2^64 - 1 are read exactly, in any form,
    /// as `unsigned` (the `u64` fields of `Format/README.md`); as values
    /// they are the nearest double, as before. From 2^64 on, a double.
    @Test func wholeNumbersUpTo2To64Minus1AreExactUnsigned() throws {
        #expect(try read("18446744073709551615") == .unsigned(.max))
        #expect(try read("18446744073709551615.0") == .unsigned(.max))
        #expect(try read("1.8446744073709551615e19") == .unsigned(.max))
        #expect(try read("18446744073709551614") == .unsigned(.max - 1))
        #expect(try Value(json: read("18446744073709551615")) == .double(18_446_744_073_709_551_616))
        #expect(try Value(json: read(#"{"$double": 18446744073709551615}"#)) == .double(18_446_744_073_709_551_616))
        #expect(throws: WireDecodingError.self) { try Value(json: read(#"{"$timestamp": 18446744073709551615}"#)) }
        #expect(try read("18446744073709551616") == .double(18_446_744_073_709_551_616))
        #expect(try read("18446744073709551615.5") == .double(18_446_744_073_709_551_616))
        #expect(try read("-18446744073709551615") == .double(-18_446_744_073_709_551_616))
    }

    /// A number that is not zero but lies nearer to zero than to the least
    /// subnormal is not a whole number (section 4, "Reading", point 2): it is
    /// a double, the binary64 nearest to it, which is zero with the number's
    /// sign. Only a number whose digits are all zero is the int 0.
    @Test func numbersTooSmallForBinary64AreDoublesNotInts() throws {
        let tiny = "0." + String(repeating: "0", count: 400) + "1"
        for (text, zero) in [("1e-400", 0.0), ("-1e-400", -0.0), ("1.5e-400", 0.0), (tiny, 0.0), ("-" + tiny, -0.0), ("1e-99999999999", 0.0)] {
            #expect(try read(text) == .double(zero), "\(text)")
            #expect(try Value(json: read(text)) == .double(zero), "\(text)")
            #expect(try Value(json: read(#"{"$double": \#(text)}"#)) == .double(zero), "\(text)")
        }
        for text in ["0e-400", "0.0e-400", "0e99999999999", "0." + String(repeating: "0", count: 400)] {
            #expect(try read(text) == .int(0), "\(text)")
            #expect(try Value(json: read(#"{"$double": \#(text)}"#)) == .double(0), "\(text)")
            #expect(try Value(json: read(#"{"$double": -\#(text)}"#)) == .double(-0.0), "\(text)")
            #expect(try Value(json: read("-" + text)) == .int(0), "-\(text)")
        }
        // A subnormal is representable: the nearest binary64 is not zero.
        let subnormal = try #require(Double("1e-320"))
        #expect(subnormal != 0 && !subnormal.isNormal)
        #expect(try read("1e-320") == .double(subnormal))
        #expect(try Value(json: read("-4.9406564584124654e-324")) == .double(-Double.leastNonzeroMagnitude))
        // Not a whole number, so neither a timestamp nor a version.
        for text in ["1e-400", "-1e-400", tiny] {
            #expect {
                try Fields(json: read(#"{"at": {"$timestamp": \#(text)}}"#))
            } throws: { ($0 as? WireDecodingError)?.path == "at.$timestamp" }
            let operation = try read(
                #"{"idempotency_key": "k", "entity_type": "te", "entity_id": "e", "intent": "create", "data": {}, "client_timestamp": "t", "base_version": \#(text)}"#
            )
            #expect { try PushOperation(json: operation, path: "operations[0]") } throws: {
                ($0 as? WireDecodingError)?.path == "operations[0].base_version"
            }
        }
        for text in ["0e-400", "-0e-400"] {
            #expect(try Value(json: read(#"{"$timestamp": \#(text)}"#)) == .timestamp(0), "\(text)")
            let operation = try read(
                #"{"idempotency_key": "k", "entity_type": "te", "entity_id": "e", "intent": "create", "data": {}, "client_timestamp": "t", "base_version": \#(text)}"#
            )
            #expect(try PushOperation(json: operation).baseVersion == 0, "\(text)")
        }
    }

    /// `Value`'s `Codable` path (here through `JSONDecoder`) reads a number
    /// as `JSONReader` does, or refuses it; it never reads another value.
    /// Foundation reads a number that is not zero but too small for any
    /// binary64 (`1e-400`) as the `Int64` 0 and refuses it as a `Double`,
    /// so it cannot tell the double zero it is, nor its sign: before, such
    /// a number became the int 0 (and a `$timestamp` of 0).
    @Test func codableReadsNumbersAsTheReaderDoesOrRefusesThem() throws {
        let tiny = "0." + String(repeating: "0", count: 400) + "1"
        let agreed = [
            "2", "2.0", "1e2", "-0", "-0.0", "0e-400", "-0e-400", "2.5", "1e-320", "9007199254740993.0",
            "9223372036854775807", "-9223372036854775808", "9223372036854775808",
            #"{"$double": 2}"#, #"{"$double": -0}"#, #"{"$double": 0e-400}"#,
            #"{"$timestamp": 5}"#, #"{"$timestamp": 5.0}"#, #"{"$timestamp": 0e-400}"#,
        ]
        for text in agreed {
            let decoded = try JSONDecoder().decode(Value.self, from: Data(text.utf8))
            #expect(decoded == (try Value(json: read(text))), "\(text)")
        }
        let underflowing = ["1e-400", "-1e-400", "1.5e-400", tiny, "-" + tiny, "1e-99999999999"]
        for text in underflowing + underflowing.map({ #"{"$timestamp": \#($0)}"# }) + [#"{"$double": 1e-400}"#] {
            #expect(throws: DecodingError.self, "\(text)") { try JSONDecoder().decode(Value.self, from: Data(text.utf8)) }
        }
    }

    /// `base_version` and `$timestamp` are read by value like every number
    /// (section 4): `-0` and `-0.0` are 0, `1e0` is 1.
    @Test func integerMembersTakeEveryFormOfAWholeNumber() throws {
        for (text, version) in [("0", 0), ("-0", 0), ("-0.0", 0), ("1e0", 1), ("2.0", 2)] as [(String, UInt64)] {
            let json = try read(
                #"{"idempotency_key": "k", "entity_type": "te", "entity_id": "e", "intent": "create", "data": {}, "client_timestamp": "t", "base_version": \#(text)}"#
            )
            #expect(try PushOperation(json: json).baseVersion == version, "\(text)")
        }
        for (text, micros) in [("-0", 0), ("-0.0", 0), ("1e2", 100), ("-5", -5)] as [(String, Int64)] {
            #expect(try Value(json: read(#"{"$timestamp": \#(text)}"#)) == .timestamp(micros), "\(text)")
        }
    }

    /// A name starts with `$` when its first scalar is `$`, as the spec
    /// compares strings; `hasPrefix` compares characters, and `$` followed
    /// by a combining mark is one character that is not `$`.
    @Test func reservedNamesAreFoundByTheirFirstScalar() throws {
        let name = "$\u{0301}x"
        let single = JSONValue.object([(name, .int(1))])
        #expect(throws: WireDecodingError.self) { try Fields(json: single) }
        #expect(throws: WireDecodingError.self) { try Value(json: single) }
        #expect(throws: WireDecodingError.self) { try Fields(json: .object([(name, .int(1)), ("b", .int(2))])) }
        #expect(NameRules.fieldsProblem([name: 1]) != nil)
        var writer = JSONWriter()
        #expect(throws: EncodingError.self) { try Fields([name: 1]).writeJSON(to: &writer) }
        #expect(throws: (any Error).self) { try Wire.makeEncoder().encode(Fields([name: 1])) }
        #expect(throws: (any Error).self) { try JSONDecoder().decode(Fields.self, from: Data(#"{"$\u0301x": 1}"#.utf8)) }
    }

    /// A decoding error names where it happened, down through arrays and
    /// objects, after the caller's own path. (The path is made only for an
    /// error: made for every element and member, it copied each ancestor's
    /// name again, and a long name over many elements made a push of
    /// 1.25 MB take 5.8 s to decode, a pull page of 2 MB 4.9 s; now 0.39 s
    /// and 0.72 s, debug builds.)
    @Test func decodingErrorsNameTheirPath() throws {
        let cases: [(json: String, prefix: String, path: String)] = [
            (#"{"a": [1, {"$x": 1}]}"#, "", "a[1].$x"),
            (#"{"a": {"b": [[{"$timestamp": 1.5}]]}}"#, "", "a.b[0][0].$timestamp"),
            (#"{"a": [0, {"$bytes": "A"}]}"#, "changes[2].data", "changes[2].data.a[1].$bytes"),
            (#"{"$x": 1}"#, "", "$x"),
            (#"{"a": [{"b": 1, "$c": 2}]}"#, "d", "d.a[0].$c"),
        ]
        for (json, prefix, path) in cases {
            #expect(throws: WireDecodingError.self, "\(json)") { try Fields(json: read(json), path: prefix) }
            do {
                _ = try Fields(json: read(json), path: prefix)
            } catch let error as WireDecodingError {
                #expect(error.path == path, "\(json): \(error)")
            }
        }
        let deep = String(repeating: "[", count: Limits.valueDepthMax + 1) + String(repeating: "]", count: Limits.valueDepthMax + 1)
        #expect { try Fields(json: read(#"{"n": \#(deep)}"#)) } throws: {
            ($0 as? WireDecodingError)?.path == "n" + String(repeating: "[0]", count: Limits.valueDepthMax)
        }
    }
}
