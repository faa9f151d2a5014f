import Foundation
import LogTesting
import Testing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The test server itself: tests of a client that loses its server rely
/// on a stopped server staying unreachable.
@Suite struct TestServerTests {
    /// A stopped server's port is held: a connection to it is refused at
    /// once, and no other socket can take it. Once, a client of a stopped
    /// server synced with another test's server that the kernel had given
    /// the freed port (`HealthTests.anOfflineRunSaysWhy` failed in CI).
    /// The connection taken just before the stop is one NIO trapped on
    /// when the stop cancelled the serving task, which ended the whole test
    /// process; a graceful shutdown serves and closes it.
    @Test func aStoppedServersPortIsRefusedAndKeptFromOthers() async throws {
        let server = try await TestServer("stopped-port")
        let port = server.port
        #expect(try Self.connect(to: port) == 0, "serving: the connection is taken")
        await server.stop()
        #expect(try Self.connect(to: port) == ECONNREFUSED)
        #expect(try Self.bind(to: port) == EADDRINUSE, "held: no other server is given the port")

        try await server.restart()
        #expect(server.port != port)
        #expect(try await server.send("GET", "/v1/health").status == 200)
        #expect(try Self.connect(to: port) == ECONNREFUSED, "still held after a restart on a new port")
        await server.stop()
    }

    /// 0 once connected to 127.0.0.1:`port`, or the `errno` of the refusal.
    private static func connect(to port: Int) throws -> Int32 {
        #if canImport(Glibc)
            try onANewSocket(port: port) { Glibc.connect($0, $1, $2) }
        #else
            try onANewSocket(port: port) { Darwin.connect($0, $1, $2) }
        #endif
    }

    /// 0 once a socket (without `SO_REUSEADDR`) is bound to
    /// 127.0.0.1:`port`, or the `errno` of the refusal.
    private static func bind(to port: Int) throws -> Int32 {
        #if canImport(Glibc)
            try onANewSocket(port: port) { Glibc.bind($0, $1, $2) }
        #else
            try onANewSocket(port: port) { Darwin.bind($0, $1, $2) }
        #endif
    }

    /// 0 once `call` succeeds for a new socket and 127.0.0.1:`port`, or
    /// its `errno`; the socket is closed.
    private static func onANewSocket(
        port: Int, _ call: (Int32, UnsafePointer<sockaddr>, socklen_t) -> Int32
    ) throws -> Int32 {
        let descriptor = try LoopbackSocket.make()
        defer { close(descriptor) }
        return LoopbackSocket.withAddress(port: port) { call(descriptor, $0, $1) } == 0 ? 0 : errno
    }
}
