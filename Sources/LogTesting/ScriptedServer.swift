import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A loopback HTTP/1.1 server that answers as a test's script says, for
/// testing a client against a broken or hostile server: one that sends an
/// endless or compressed body, or never answers at all. The reference
/// server (`TestServer`) cannot be made to misbehave in these ways.
///
/// Each connection is served by a thread of its own, in plain blocking
/// socket calls; requests on one connection are answered in turn. `stop()`
/// closes the listening socket and every connection; a server lives until
/// then, since its threads hold it.
public final class ScriptedServer: Sendable {
    /// A request as the server read it.
    public struct Request: Sendable {
        public var method: String
        /// The path with its query, as sent (`/v1/pull?limit=100`).
        public var target: String
        /// The header fields, by their names in lower case.
        public var headers: [String: String]
        public var body: Data

        /// The path without its query.
        public var path: String { String(target.prefix { $0 != "?" }) }
    }

    /// How the server answers one request.
    public enum Reply: Sendable {
        /// A complete answer with `Content-Length`.
        case answer(status: Int, headers: [String: String], body: Data)
        /// A 200 with `headers` whose body is `chunks` called until it
        /// returns nil or the client stops reading; the connection closes
        /// after it. With `contentLength`, that length is declared (and the
        /// body may stop short of it); otherwise the body ends when the
        /// connection does.
        case stream(headers: [String: String], contentLength: Int?, chunks: @Sendable () -> Data?)
        /// Reads the request and never answers; the connection stays open
        /// until the client closes it or the server stops.
        case silence
    }

    public let port: Int
    public var url: URL { URL(string: "http://127.0.0.1:\(port)")! }
    private let listener: Int32
    private let script: @Sendable (Request) -> Reply
    /// Open connections, so that `stop()` can close them.
    private let connections = Mutex<Set<Int32>>([])
    private let stopped = Atomic<Bool>(false)
    private let cutShort = Atomic<Int>(0)

    /// How many streamed bodies (`.stream`) ended because the client closed
    /// the connection: a write failed before the chunks ran out.
    public var streamsCutShort: Int { cutShort.load(ordering: .relaxed) }

    /// Listens on a loopback port of its own and answers each request with
    /// `script`'s reply.
    public init(_ script: @escaping @Sendable (Request) -> Reply) throws {
        self.script = script
        let descriptor = try LoopbackSocket.make()
        var address = LoopbackSocket.address(port: 0)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                bind(descriptor, address, length) == 0 && listen(descriptor, 16) == 0
                    && getsockname(descriptor, address, &length) == 0
            }
        }
        guard bound else {
            let error = POSIXError(.init(rawValue: errno) ?? .EIO)
            close(descriptor)
            throw error
        }
        listener = descriptor
        port = Int(UInt16(bigEndian: address.sin_port))
        Thread { [self] in acceptConnections() }.start()
    }

    /// Closes the listening socket and every open connection.
    public func stop() {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        // `shutdown` wakes a thread blocked in `accept` or `recv`; `close`
        // alone does not on Linux.
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        connections.withLock { open in
            for descriptor in open { shutdown(descriptor, Int32(SHUT_RDWR)) }
        }
    }

    private func acceptConnections() {
        while !stopped.load(ordering: .acquiring) {
            let descriptor = accept(listener, nil, nil)
            guard descriptor >= 0 else {
                if errno == EINTR { continue }
                return
            }
            #if canImport(Darwin)
                var on: Int32 = 1
                setsockopt(descriptor, SOL_SOCKET, SO_NOSIGPIPE, &on, socklen_t(MemoryLayout<Int32>.size))
            #endif
            let admitted = connections.withLock { open in
                guard !stopped.load(ordering: .acquiring) else { return false }
                open.insert(descriptor)
                return true
            }
            guard admitted else {
                close(descriptor)
                return
            }
            Thread { [self] in
                serve(descriptor)
                connections.withLock { _ = $0.remove(descriptor) }
                close(descriptor)
            }.start()
        }
    }

    /// Answers the requests of one connection until either side ends it.
    private func serve(_ descriptor: Int32) {
        var connection = Connection(descriptor: descriptor)
        while let request = connection.readRequest() {
            switch script(request) {
            case .answer(let status, let headers, let body):
                var head = headers
                head["Content-Length"] = String(body.count)
                guard connection.write(Self.head(status: status, head) + body) else { return }
            case .stream(let headers, let contentLength, let chunks):
                var head = headers
                head["Connection"] = "close"
                if let contentLength { head["Content-Length"] = String(contentLength) }
                guard connection.write(Self.head(status: 200, head)) else { return }
                while let chunk = chunks() {
                    guard connection.write(chunk) else {
                        cutShort.add(1, ordering: .relaxed)
                        return
                    }
                }
                return
            case .silence:
                connection.drain()
                return
            }
        }
    }

    private static func head(status: Int, _ headers: [String: String]) -> Data {
        var text = "HTTP/1.1 \(status) Scripted\r\n"
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { text += "\(name): \(value)\r\n" }
        return Data((text + "\r\n").utf8)
    }
}

/// One accepted connection's socket and what was read from it ahead.
private struct Connection {
    let descriptor: Int32
    var buffered = Data()

    /// The next request, or nil when the client closed the connection or
    /// sent something this server does not read.
    mutating func readRequest() -> ScriptedServer.Request? {
        while true {
            if let end = buffered.range(of: Data("\r\n\r\n".utf8)) {
                let lines = String(decoding: buffered[..<end.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
                let start = lines[0].split(separator: " ")
                guard start.count == 3 else { return nil }
                var headers: [String: String] = [:]
                for line in lines.dropFirst() {
                    let parts = line.split(separator: ":", maxSplits: 1)
                    guard parts.count == 2 else { return nil }
                    headers[parts[0].lowercased()] = parts[1].trimmingCharacters(in: .whitespaces)
                }
                let length = headers["content-length"].flatMap { Int($0) } ?? 0
                while buffered.count - end.upperBound < length {
                    guard receive() else { return nil }
                }
                let body = buffered[end.upperBound..<end.upperBound + length]
                let request = ScriptedServer.Request(
                    method: String(start[0]), target: String(start[1]), headers: headers, body: Data(body))
                buffered = Data(buffered[(end.upperBound + length)...])
                return request
            }
            guard receive() else { return nil }
        }
    }

    /// Reads and drops what the client sends, until it closes.
    mutating func drain() {
        while receive() { buffered.removeAll() }
    }

    /// Reads more; false when the connection ended.
    private mutating func receive() -> Bool {
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        let count = recv(descriptor, &chunk, chunk.count, 0)
        guard count > 0 else { return false }
        buffered.append(contentsOf: chunk[0..<count])
        return true
    }

    /// Writes all of `data`; false when the client no longer reads it.
    func write(_ data: Data) -> Bool {
        #if canImport(Glibc)
            let flags = Int32(MSG_NOSIGNAL)
        #else
            // Darwin has no MSG_NOSIGNAL; SO_NOSIGPIPE is set at accept.
            let flags: Int32 = 0
        #endif
        return data.withUnsafeBytes { raw in
            var sent = 0
            while sent < raw.count {
                let count = send(descriptor, raw.baseAddress! + sent, raw.count - sent, flags)
                guard count > 0 else { return false }
                sent += count
            }
            return true
        }
    }
}
