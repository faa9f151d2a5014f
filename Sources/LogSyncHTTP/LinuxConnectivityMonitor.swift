import Foundation
import LogSync

/// The machine's network path, read from the kernel: a default route,
/// IPv4 (`/proc/net/route`) or IPv6 (`/proc/net/ipv6_route`, so an
/// IPv6-only network counts), over an interface other than loopback that is
/// up (`/sys/class/net/*/operstate`). It polls at an interval, on the
/// engine's clock; that is simpler than a netlink socket and quick enough
/// for a 2.5 s debounce. On systems without these files it reports a path
/// (the health check still decides whether the server is reachable).
///
/// The path is expensive when the route the kernel prefers (the lowest
/// metric) of either family goes over a mobile broadband modem (the
/// kernel marks its interface `DEVTYPE=wwan`) or over one of
/// `expensiveInterfaces`. Linux has no setting for a constrained path (Low
/// Data Mode), nor does the kernel know a Wi-Fi network is a phone's
/// hotspot (NetworkManager's "metered" guess is its own): an app that
/// knows more wraps this monitor, or writes its own.
public struct LinuxConnectivityMonitor: ConnectivityMonitor {
    /// How often it reads the kernel's view; at least `pollMillisecondsMin`
    /// (a shorter interval, 0 included, polls at that), so that a setting
    /// cannot make the monitor spin on the files.
    public var pollMilliseconds: UInt64
    public static let pollMillisecondsMin: UInt64 = 50
    /// Interfaces whose traffic costs the user besides the modems the
    /// kernel marks: a phone tethered over USB (`usb0`), a modem behind PPP.
    public var expensiveInterfaces: Set<String>
    private let clock: any SyncClock
    private let root: String

    /// - Parameter root: where `sys` and `proc` are (tests point it at a
    ///   directory of fake files).
    public init(
        pollMilliseconds: UInt64 = 1_000, expensiveInterfaces: Set<String> = [], clock: any SyncClock = SystemClock(),
        root: String = "/"
    ) {
        self.pollMilliseconds = pollMilliseconds
        self.expensiveInterfaces = expensiveInterfaces
        self.clock = clock
        self.root = root
    }

    public func paths() -> AsyncStream<NetworkPath> {
        let (stream, continuation) = AsyncStream<NetworkPath>.makeStream()
        let task = Task { [self] in
            var last: NetworkPath?
            while !Task.isCancelled {
                let now = currentPath()
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

    /// Whether the kernel's view, read once, has a path.
    public func hasPath() -> Bool { currentPath().isSatisfied }

    /// Reads the kernel's view once.
    public func currentPath() -> NetworkPath {
        let net = (root as NSString).appendingPathComponent("sys/class/net")
        let route = (root as NSString).appendingPathComponent("proc/net/route")
        let route6 = (root as NSString).appendingPathComponent("proc/net/ipv6_route")
        guard let interfaces = try? FileManager.default.contentsOfDirectory(atPath: net) else { return .satisfied }
        let up = Set(
            interfaces.filter { name in
                guard name != "lo" else { return false }
                let state = try? String(contentsOfFile: "\(net)/\(name)/operstate", encoding: .utf8)
                // "unknown" is what many virtual interfaces (tun, some veth) report while working.
                return ["up", "unknown"].contains(state?.trimmingCharacters(in: .whitespacesAndNewlines))
            }.map { Substring($0) })
        guard !up.isEmpty else { return .unsatisfied }
        guard let routes = Self.defaultRoutes(try? String(contentsOfFile: route, encoding: .utf8)) else { return .satisfied }
        // The route's own interface: the kernel keeps a route whose device
        // lost its carrier, while another interface (docker0) may be up.
        let preferred = [routes, Self.defaultIPv6Routes(try? String(contentsOfFile: route6, encoding: .utf8))].compactMap { routes in
            routes.filter { up.contains($0.device) }.min { $0.metric < $1.metric }?.device
        }
        guard !preferred.isEmpty else { return .unsatisfied }
        return NetworkPath(isSatisfied: true, isExpensive: preferred.contains { isExpensive($0, net: net) })
    }

    /// Whether traffic over `device` costs the user: one of
    /// `expensiveInterfaces`, or a modem (`DEVTYPE=wwan` in its `uevent`).
    private func isExpensive(_ device: Substring, net: String) -> Bool {
        if expensiveInterfaces.contains(String(device)) { return true }
        let uevent = try? String(contentsOfFile: "\(net)/\(device)/uevent", encoding: .utf8)
        return uevent?.split(separator: "\n").contains("DEVTYPE=wwan") == true
    }

    /// A default route: its device, and its metric (the kernel prefers the
    /// lowest).
    struct DefaultRoute: Equatable {
        var device: Substring
        var metric: UInt64
    }

    /// The lines of `/proc/net/route` whose destination is 00000000 and
    /// whose flags have RTF_UP and not RTF_REJECT: the default routes.
    /// `unreachable`, `prohibit` and `blackhole` defaults (a VPN's kill
    /// switch) are listed on device `*`, the first two with RTF_REJECT:
    /// they send nothing anywhere. No file means no knowledge: nil.
    static func defaultRoutes(_ table: String?) -> [DefaultRoute]? {
        guard let table else { return nil }
        return table.split(separator: "\n").dropFirst().compactMap { line in
            let columns = line.split(whereSeparator: { $0 == "\t" || $0 == " " })
            guard columns.count > 6, columns[0] != "*", columns[1] == "00000000", let flags = Int(columns[3], radix: 16),
                let metric = UInt64(columns[6])
            else { return nil }
            return isUsable(flags) ? DefaultRoute(device: columns[0], metric: metric) : nil
        }
    }

    /// The lines of `/proc/net/ipv6_route` for ::/0 (destination all
    /// zeros, prefix length 0) that are up (RTF_UP) and not reject routes
    /// (RTF_REJECT, which the kernel keeps on `lo` where there is no IPv6
    /// route): the default routes. No file: none.
    static func defaultIPv6Routes(_ table: String?) -> [DefaultRoute] {
        guard let table else { return [] }
        return table.split(separator: "\n").compactMap { line in
            let columns = line.split(whereSeparator: { $0 == "\t" || $0 == " " })
            guard columns.count >= 10, columns[0].allSatisfy({ $0 == "0" }), columns[0].count == 32, columns[1] == "00",
                let metric = UInt64(columns[5], radix: 16), let flags = Int(columns[8], radix: 16)
            else { return nil }
            return isUsable(flags) ? DefaultRoute(device: columns[9], metric: metric) : nil
        }
    }

    /// Flags with RTF_UP and without RTF_REJECT.
    private static func isUsable(_ flags: Int) -> Bool {
        let up = 0x1
        let reject = 0x200
        return flags & up != 0 && flags & reject == 0
    }
}
