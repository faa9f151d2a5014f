import Foundation
import LogSync

/// Whether the machine has a network path, read from the kernel: an
/// interface other than loopback that is up (`/sys/class/net/*/operstate`)
/// and a default route, IPv4 (`/proc/net/route`) or IPv6
/// (`/proc/net/ipv6_route`, so an IPv6-only network counts). It polls at an interval, on the
/// engine's clock; that is simpler than a netlink socket and quick enough
/// for a 2.5 s debounce. On systems without these files it reports a path
/// (the health check still decides whether the server is reachable).
public struct LinuxConnectivityMonitor: ConnectivityMonitor {
    public var pollMilliseconds: UInt64
    private let clock: any SyncClock
    private let root: String

    /// - Parameter root: where `sys` and `proc` are (tests point it at a
    ///   directory of fake files).
    public init(pollMilliseconds: UInt64 = 1_000, clock: any SyncClock = SystemClock(), root: String = "/") {
        self.pollMilliseconds = pollMilliseconds
        self.clock = clock
        self.root = root
    }

    public func paths() -> AsyncStream<Bool> {
        let (stream, continuation) = AsyncStream<Bool>.makeStream()
        let task = Task { [self] in
            var last: Bool?
            while !Task.isCancelled {
                let now = hasPath()
                if now != last {
                    continuation.yield(now)
                    last = now
                }
                do { try await clock.sleep(milliseconds: pollMilliseconds) } catch { break }
            }
            continuation.finish()
        }
        continuation.onTermination = { _ in task.cancel() }
        return stream
    }

    /// Reads the kernel's view once.
    public func hasPath() -> Bool {
        let net = (root as NSString).appendingPathComponent("sys/class/net")
        let route = (root as NSString).appendingPathComponent("proc/net/route")
        let route6 = (root as NSString).appendingPathComponent("proc/net/ipv6_route")
        guard let interfaces = try? FileManager.default.contentsOfDirectory(atPath: net) else { return true }
        let up = interfaces.contains { name in
            guard name != "lo" else { return false }
            let state = try? String(contentsOfFile: "\(net)/\(name)/operstate", encoding: .utf8)
            // "unknown" is what many virtual interfaces (tun, some veth) report while working.
            return ["up", "unknown"].contains(state?.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        guard up else { return false }
        return Self.hasDefaultRoute(try? String(contentsOfFile: route, encoding: .utf8))
            || Self.hasDefaultIPv6Route(try? String(contentsOfFile: route6, encoding: .utf8))
    }

    /// A line of `/proc/net/route` whose destination is 00000000, whose
    /// flags have RTF_UP and not RTF_REJECT, and that has a device, is a
    /// default route. `unreachable`, `prohibit` and `blackhole` defaults (a
    /// VPN's kill switch) are listed on device `*`, the first two with
    /// RTF_REJECT: they send nothing anywhere. No file means no knowledge:
    /// true.
    static func hasDefaultRoute(_ table: String?) -> Bool {
        guard let table else { return true }
        return table.split(separator: "\n").dropFirst().contains { line in
            let columns = line.split(whereSeparator: { $0 == "\t" || $0 == " " })
            guard columns.count > 3, columns[0] != "*", columns[1] == "00000000", let flags = Int(columns[3], radix: 16) else {
                return false
            }
            let up = 0x1
            let reject = 0x200
            return flags & up != 0 && flags & reject == 0
        }
    }

    /// A line of `/proc/net/ipv6_route` for ::/0 (destination all zeros,
    /// prefix length 0) that is up (RTF_UP) and not a reject route
    /// (RTF_REJECT, which the kernel keeps on `lo` where there is no IPv6
    /// route) is a default route. No file: no IPv6 default route.
    static func hasDefaultIPv6Route(_ table: String?) -> Bool {
        guard let table else { return false }
        return table.split(separator: "\n").contains { line in
            let columns = line.split(whereSeparator: { $0 == "\t" || $0 == " " })
            guard columns.count >= 10, columns[0].allSatisfy({ $0 == "0" }), columns[0].count == 32, columns[1] == "00",
                let flags = Int(columns[8], radix: 16)
            else { return false }
            let up = 0x1
            let reject = 0x200
            return flags & up != 0 && flags & reject == 0 && columns[9] != "lo"
        }
    }
}
