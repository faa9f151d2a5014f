import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Plain TCP sockets on loopback, for tests that speak HTTP by hand.
public enum LoopbackSocket {
    /// A new TCP socket; the caller closes it.
    public static func make() throws -> Int32 {
        #if canImport(Glibc)
            let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
            let descriptor = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard descriptor >= 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
        return descriptor
    }

    /// 127.0.0.1 at `port` (0: any free port, when bound).
    public static func address(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return address
    }

    /// Calls `body` with 127.0.0.1:`port` as the address and length that
    /// `bind` and `connect` take.
    public static func withAddress<R>(port: Int, _ body: (UnsafePointer<sockaddr>, socklen_t) throws -> R) rethrows -> R {
        var address = address(port: port)
        return try withUnsafePointer(to: &address) {
            try $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { try body($0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
    }

    /// Binds a socket to 127.0.0.1:`port` and does not listen: while the
    /// caller keeps it open, a connection to the port is refused at once,
    /// and no socket bound to port 0 is given this port. A test that stops
    /// a server and expects its clients to find nobody there holds the
    /// port, or another test's server may be given it and answer them.
    /// `SO_REUSEADDR` lets it bind beside the stopped server's closing
    /// connections. Returns the socket for the caller to close, or the
    /// error that kept it from binding.
    public static func hold(port: Int) throws -> Int32 {
        let descriptor = try make()
        var on: Int32 = 1
        let bound =
            setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size)) == 0
            && withAddress(port: port) { bind(descriptor, $0, $1) } == 0
        guard bound else {
            let error = POSIXError(.init(rawValue: errno) ?? .EIO)
            close(descriptor)
            throw error
        }
        return descriptor
    }
}
