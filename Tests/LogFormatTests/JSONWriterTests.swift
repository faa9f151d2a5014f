import Foundation
import LogFormat
import LogTesting
import Testing

@Suite struct JSONWriterTests {
    private func text(_ data: Data) -> String { String(decoding: data, as: UTF8.self) }

    private func written(_ value: Value) throws -> String {
        var writer = JSONWriter()
        try value.writeJSON(to: &writer)
        return String(decoding: writer.bytes, as: UTF8.self)
    }

    @Test func scalarsAndSpecialForms() throws {
        #expect(try written(.null) == "null")
        #expect(try written(.bool(false)) == "false")
        #expect(try written(.int(.min)) == "-9223372036854775808")
        #expect(try written(.double(0.25)) == "0.25")
        #expect(try written(.double(2.5e-7)) == "2.5e-07")
        #expect(try written(.double(2)) == #"{"$double":2}"#)
        #expect(try written(.double(-0.0)) == #"{"$double":-0}"#)
        #expect(try written(.double(1e300)) == #"{"$double":1e+300}"#)
        #expect(try written(.bytes([0, 1, 2])) == #"{"$bytes":"AAEC"}"#)
        #expect(try written(.timestamp(-5)) == #"{"$timestamp":-5}"#)
        #expect(try written(.array([.int(1), .string("a"), .null, .array([])])) == #"[1,"a",null,[]]"#)
        #expect(try written(.object(["b": 1, "a": ["x": .bool(true)]])) == #"{"a":{"x":true},"b":1}"#)
    }

    @Test func stringsEscapeOnlyWhatJSONRequires() throws {
        #expect(try written(.string("a\"b\\c/d")) == #""a\"b\\c/d""#)
        #expect(try written(.string("\u{8}\u{9}\u{A}\u{C}\u{D}\u{0}\u{1F}")) == #""\b\t\n\f\r\u0000\u001f""#)
        #expect(try written(.string("é漢😀\u{7F}")) == "\"é漢😀\u{7F}\"")
        for sample in ["", "plain", "a\"b", "\\", "\u{1}x\u{1F}", "tab\tnew\nline", "😀\"😀"] {
            let json = try written(.string(sample))
            #expect(try JSONReader.parse(Array(json.utf8)) == .string(sample), "\(json)")
            #expect(json == text(try Wire.makeEncoder().encode(Value.string(sample))), "\(json)")
        }
    }

    @Test func whatJSONCannotCarryIsRefused() {
        #expect(throws: EncodingError.self) { try written(.double(.nan)) }
        #expect(throws: EncodingError.self) { try written(.array([.double(.infinity)])) }
        #expect(throws: EncodingError.self) { try written(.object(["$double": 1])) }
    }

    @Test func messagesMatchJSONEncoder() throws {
        let encoder = Wire.makeEncoder()
        let data: Fields = ["n": 1, "d": .double(2), "s": "x\n", "t": .timestamp(7), "b": .bytes([255])]
        let push = PushRequest(operations: [
            PushOperation(
                idempotencyKey: "k1", entityType: "te", entityID: "te_1", intent: .create, data: data,
                clientTimestamp: "2026-11-22T08:00:00.000000Z", baseVersion: 0),
            PushOperation(
                idempotencyKey: "k2", entityType: "te", entityID: "te_1", intent: .delete, data: nil,
                clientTimestamp: "2026-11-22T08:00:01.000000Z", baseVersion: 1),
        ])
        #expect(text(try push.encodeJSON()) == text(try encoder.encode(push)))
        let answer = PushResponse(results: [
            .applied("k1", version: 1), .applied("k2", version: 2, duplicate: true),
            .rejected("k3", .validationError, "bad \"name\""),
            .rejected("k4", .conflict, "te/te_1: it already exists", state: ServerState(serverVersion: 3, deleted: false, data: data)),
        ])
        #expect(text(try answer.encodeJSON()) == text(try encoder.encode(answer)))
        #expect(try PushResponse.decode(json: try answer.encodeJSON()) == answer)
        let page = PullResponse(
            changes: [
                PullChange(entityType: "te", entityID: "a", operation: .upsert, data: data, serverVersion: 3, updatedAt: "2026-11-22T08:00:00.000000Z"),
                PullChange(
                    entityType: "te", entityID: "b", operation: .delete, data: nil, serverVersion: 4,
                    updatedAt: "2026-11-22T08:00:00.000000Z", idempotencyKey: "k2"),
            ], cursor: "c", hasMore: true)
        #expect(text(try page.encodeJSON()) == text(try encoder.encode(page)))
        #expect(try PullResponse.decode(json: try page.encodeJSON()) == page)
        let resync = PullResponse(changes: [], cursor: "", hasMore: true, forceResync: true)
        #expect(text(try resync.encodeJSON()) == text(try encoder.encode(resync)))
    }
}
