import CZlib
import Foundation

/// gzip (RFC 1952) through zlib, for the sync protocol's bodies
/// (`Format/sync-protocol.md` section 2, "Bodies"): the server's answers
/// and the client's pushes.
public enum Gzip {
    /// `data` in gzip at `level` (1 the fastest, 9 the smallest; -1 zlib's
    /// default, 6), or nil if zlib fails (out of memory).
    public static func compress(_ data: Data, level: Int32 = -1) -> Data? {
        var stream = z_stream()
        guard czlib_deflate_init_gzip(&stream, level) == Z_OK else { return nil }
        defer { deflateEnd(&stream) }
        var output = Data(count: Int(deflateBound(&stream, uLong(data.count))))
        let result = data.withUnsafeBytes { input in
            output.withUnsafeMutableBytes { output in
                // zlib does not write through next_in; its type is older than const.
                stream.next_in = UnsafeMutablePointer(mutating: input.bindMemory(to: Bytef.self).baseAddress)
                stream.avail_in = uInt(input.count)
                stream.next_out = output.bindMemory(to: Bytef.self).baseAddress
                stream.avail_out = uInt(output.count)
                return deflate(&stream, Z_FINISH)
            }
        }
        // deflateBound leaves room for all of it: one call ends the stream.
        guard result == Z_STREAM_END else { return nil }
        output.count = Int(stream.total_out)
        return output
    }

    /// Why `decompress` refused its input.
    public enum Failure: Error, Equatable, Sendable {
        /// It inflates to more than the limit.
        case tooLarge
        /// It is not one whole gzip stream: a header, data or a checksum
        /// that does not check, a stream cut short, or bytes after its end.
        case notGzip(String)
    }

    /// What `data`, one whole gzip stream, inflates to: at most
    /// `bytesMax` bytes, inflated a piece at a time, so that a few
    /// kilobytes that would inflate to gigabytes take no more than the
    /// limit. zlib checks the stream's CRC-32 and length.
    public static func decompress(_ data: Data, bytesMax: Int) throws(Failure) -> Data {
        var stream = z_stream()
        guard czlib_inflate_init_gzip(&stream) == Z_OK else { throw .notGzip("zlib could not start") }
        defer { inflateEnd(&stream) }
        var output = Data()
        var piece = [UInt8](repeating: 0, count: 64 * 1024)
        var result = Z_OK
        data.withUnsafeBytes { input in
            stream.next_in = UnsafeMutablePointer(mutating: input.bindMemory(to: Bytef.self).baseAddress)
            stream.avail_in = uInt(input.count)
            while result == Z_OK {
                piece.withUnsafeMutableBufferPointer { piece in
                    stream.next_out = piece.baseAddress
                    stream.avail_out = uInt(piece.count)
                    result = inflate(&stream, Z_NO_FLUSH)
                    output.append(piece.baseAddress!, count: piece.count - Int(stream.avail_out))
                }
                if output.count > bytesMax { return }
            }
        }
        if output.count > bytesMax { throw .tooLarge }
        switch result {
        case Z_STREAM_END:
            guard stream.avail_in == 0 else { throw .notGzip("\(stream.avail_in) bytes after the end of the stream") }
            return output
        case Z_BUF_ERROR:
            // Out of input before the stream's end: nothing more can come.
            throw .notGzip("the stream is cut short")
        default:
            throw .notGzip(stream.msg.map { String(cString: $0) } ?? "zlib error \(result)")
        }
    }
}
