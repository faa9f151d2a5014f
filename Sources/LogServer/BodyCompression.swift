import Foundation
import LogFormat

/// gzip for bodies (`Format/sync-protocol.md` section 2, "Bodies"): a
/// pulled page, or a pushed batch, is JSON that repeats its member names,
/// its types and much of its fields, and goes over a phone's metered
/// network. Answers are gzipped for clients that accept it; request bodies
/// in gzip are inflated, within the request limit.
enum BodyCompression {
    /// Bodies shorter than this go as they are: a health answer, most
    /// push answers. gzip's header and trailer alone are 18 bytes.
    static let bytesMin = 1_024

    /// The gzip levels `--gzip-level` takes: 0 sends every body as it is,
    /// 1 is the fastest, 9 the smallest.
    static let levels = 0...9

    /// Whether a request's `Accept-Encoding` values (`header`, its field
    /// lines joined by commas; nil without one) accept gzip, RFC 9110
    /// section 12.5.3: `gzip` or `x-gzip` with a weight above 0, or else
    /// `*` with one. No field is no gzip: a client that never asked may not
    /// inflate. A weight that does not parse accepts nothing.
    static func acceptsGzip(_ header: String?) -> Bool {
        guard let header else { return false }
        var gzip: Bool?
        var any: Bool?
        for item in header.split(separator: ",") {
            let parts = item.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }
            guard let coding = parts.first?.lowercased(), !coding.isEmpty else { continue }
            var accepted = true
            for parameter in parts.dropFirst() {
                let pair = parameter.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
                guard pair.count == 2, pair[0].lowercased() == "q" else { continue }
                accepted = weight(pair[1]).map { $0 > 0 } ?? false
            }
            switch coding {
            case "gzip", "x-gzip": gzip = (gzip ?? false) || accepted
            case "*": any = (any ?? false) || accepted
            default: break
            }
        }
        return gzip ?? any ?? false
    }

    /// A qvalue (RFC 9110 section 12.4.2): 0 to 1, with at most three
    /// decimals; nil for anything else.
    private static func weight(_ text: String) -> Double? {
        let digits = text.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        guard let whole = digits.first, whole == "0" || whole == "1" else { return nil }
        let fraction = digits.count == 2 ? digits[1] : ""
        guard fraction.count <= 3, fraction.allSatisfy(\.isASCII), fraction.allSatisfy(\.isNumber),
            let value = Double(text), value <= 1
        else { return nil }
        return value
    }

    /// `body` in gzip at `level` (1 to 9).
    /// - Throws: `ServiceError` `.internalError` when zlib fails.
    static func gzip(_ body: Data, level: Int) throws -> Data {
        guard let gzipped = Gzip.compress(body, level: Int32(level)) else {
            throw ServiceError(.internalError, "zlib could not compress an answer")
        }
        return gzipped
    }

    /// The codings a request body may be in, which the health answer
    /// lists (`request_codings`) and a 415 names in `Accept-Encoding`.
    static let requestCodings = ["gzip"]

    /// Whether a request's `Content-Encoding` values (nil or empty: none)
    /// say its body is in gzip; `identity` is no coding.
    /// - Throws: `ServiceError` `.unsupportedMediaType` for any other
    ///   coding, or more than one.
    static func isGzipped(_ contentEncoding: [String]) throws -> Bool {
        let codings = contentEncoding.flatMap { $0.split(separator: ",") }.map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty && $0.lowercased() != "identity" }
        guard let coding = codings.first else { return false }
        guard codings.count == 1, ["gzip", "x-gzip"].contains(coding.lowercased()) else {
            throw ServiceError(
                .unsupportedMediaType,
                "Content-Encoding \(codings.joined(separator: ", ").prefix(40)) is not supported: send the body as it is, or in gzip alone")
        }
        return true
    }

    /// The body `gzipped` inflates to, at most `bytesMax` bytes.
    /// - Throws: `ServiceError` `.payloadTooLarge` past `bytesMax`,
    ///   `.validationError` for bytes that are not one whole gzip stream.
    static func gunzip(_ gzipped: Data, bytesMax: Int) throws -> Data {
        do {
            return try Gzip.decompress(gzipped, bytesMax: bytesMax)
        } catch .tooLarge {
            throw ServiceError(.payloadTooLarge, "the body in gzip inflates to over \(bytesMax) bytes")
        } catch .notGzip(let why) {
            throw ServiceError(.validationError, "the body is not gzip (Content-Encoding: gzip): \(why)")
        }
    }
}
