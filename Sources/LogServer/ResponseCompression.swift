import CompressNIO
import Foundation
import NIOCore

/// gzip for answers' bodies (`Format/sync-protocol.md` section 2, "Bodies"):
/// a pulled page is JSON that repeats its member names, its types and much
/// of its fields, and goes over a phone's metered network.
enum ResponseCompression {
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
    static func gzip(_ body: Data, level: Int) throws -> ByteBuffer {
        var buffer = ByteBuffer(bytes: body)
        return try buffer.compress(with: .gzip(configuration: .init(compressionLevel: Int32(level))))
    }
}
