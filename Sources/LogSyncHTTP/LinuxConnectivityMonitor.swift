import Foundation
import LogSync

/// Whether the machine has a network path, read from the kernel: a default
/// route, IPv4 (`/proc/net/route`) or IPv6 (`/proc/net/ipv6_route`, so an
/// IPv6-only network counts), over an interface other than loopback that is
/// up (`/sys/class/net/*/operstate`). It polls at an interval, on the
/// engine's clock; that is simpler than a netlink socket and quick enough
/// for a 2.5 s debounce. On systems without these files it reports a path
/// (the health check still decides whether the server is reachable).
public struct LinuxConnectivityMonitor: ConnectivityMonitor {
    /// How often it reads the kernel's view; at least `pollMillisecondsMin`
    /// (a shorter interval, 0 included, polls at that), so that a setting
    /// cannot make the monitor spin on the files.
    public var pollMilliseconds: UInt64
    public static let pollMillisecondsMin: UInt64 = 50
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
                do { try await clock.sleep(milliseconds: max(pollMilliseconds, Self.pollMillisecondsMin)) } catch { break }
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
        let up = Set(
            interfaces.filter { name in
                guard name != "lo" else { return false }
                let state = try? String(contentsOfFile: "\(net)/\(name)/operstate", encoding: .utf8)
                // "unknown" is what many virtual interfaces (tun, some veth) report while working.
                return ["up", "unknown"].contains(state?.trimmingCharacters(in: .whitespacesAndNewlines))
            }.map { Substring($0) })
        guard !up.isEmpty else { return false }
        guard let devices = Self.defaultRouteDevices(try? String(contentsOfFile: route, encoding: .utf8)) else { return true }
        // The route's own interface: the kernel keeps a route whose device
        // lost its carrier, while another interface (docker0) may be up.
        return !up.isDisjoint(with: devices.union(Self.defaultIPv6RouteDevices(try? String(contentsOfFile: route6, encoding: .utf8))))
    }

    /// The devices of the lines of `/proc/net/route` whose destination is
    /// 00000000 and whose flags have RTF_UP and not RTF_REJECT: the default
    /// routes. `unreachable`, `prohibit` and `blackhole` defaults (a VPN's
    /// kill switch) are listed on device `*`, the first two with
    /// RTF_REJECT: they send nothing anywhere. No file means no knowledge:
    /// nil.
    static func defaultRouteDevices(_ table: String?) -> Set<Substring>? {
        guard let table else { return nil }
        return Set(
            table.split(separator: "\n").dropFirst().compactMap { line in
                let columns = line.split(whereSeparator: { $0 == "\t" || $0 == " " })
                guard columns.count > 3, columns[0] != "*", columns[1] == "00000000", let flags = Int(columns[3], radix: 16) else {
                    return nil
                }
                let up = 0x1
                let reject = 0x200
                return flags & up != 0 && flags & reject == 0 ? columns[0] : nil
            })
    }

    /// The devices of the lines of `/proc/net/ipv6_route` for ::/0
    /// (destination all zeros, prefix length 0) that are up (RTF_UP) and
    /// not reject routes (RTF_REJECT, which the kernel keeps on `lo` where
    /// there is no IPv6 route): the default routes. No file: none.
    static func defaultIPv6RouteDevices(_ table: String?) -> Set<Substring> {
        guard let table else { return [] }
        return Set(
            table.split(separator: "\n").compactMap { line in
                let columns = line.split(whereSeparator: { $0 == "\t" || $0 == " " })
                guard columns.count >= 10, columns[0].allSatisfy({ $0 == "0" }), columns[0].count == 32, columns[1] == "00",
                    let flags = Int(columns[8], radix: 16)
                else { return nil }
                let up = 0x1
                let reject = 0x200
                return flags & up != 0 && flags & reject == 0 ? columns[9] : nil
            })
    }
}
