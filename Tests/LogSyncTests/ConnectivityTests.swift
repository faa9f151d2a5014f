import Foundation
import LogSync
import LogSyncHTTP
import LogTesting
import Testing

/// `LinuxConnectivityMonitor` over a directory of fake `/sys` and `/proc`
/// files, laid out as the kernel writes them.
@Suite struct ConnectivityTests {
    static let routeHeader =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    static let ipv4Default = "eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
    static let ipv4Subnet = "eth0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    /// The default route of an IPv6 network, via a router on eth0.
    static let ipv6Default =
        "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
        + "fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0\n"
    /// What the kernel lists on a machine without IPv6 routing: ::/0 as a
    /// reject route on lo, and the loopback address.
    static let ipv6None =
        "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
        + "00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n"
        + "00000000000000000000000000000001 80 00000000000000000000000000000000 00 "
        + "00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo\n"

    /// A fake root with eth0 in `state`, the interfaces `alsoUp` up, and the
    /// two route tables (nil: no file).
    /// A monitor polling every `pollMilliseconds` on a manual clock, over
    /// a root with a path (eth0 up, an IPv4 default route): it has reported
    /// the path, and sleeps until its next poll.
    static func polling(_ name: String, every pollMilliseconds: UInt64) async throws
        -> (root: TemporaryDirectory, clock: ManualClock, paths: AsyncStream<NetworkPath>.Iterator)
    {
        let root = try Self.root(name, route: Self.routeHeader + Self.ipv4Default, route6: Self.ipv6None)
        let clock = ManualClock()
        var paths = LinuxConnectivityMonitor(pollMilliseconds: pollMilliseconds, clock: clock, root: root.path).paths().makeAsyncIterator()
        #expect(await paths.next() == .satisfied)
        try await clock.waitForSleepers(1)
        return (root, clock, paths)
    }

    static func root(_ name: String, state: String = "up", alsoUp: [String] = [], route: String?, route6: String?) throws
        -> TemporaryDirectory
    {
        let root = try TemporaryDirectory(name)
        let files = FileManager.default
        for (interface, operstate) in [("lo", "unknown"), ("eth0", state)] + alsoUp.map({ ($0, "up") }) {
            let directory = root.appending("sys/class/net/\(interface)")
            try files.createDirectory(atPath: directory, withIntermediateDirectories: true)
            try (operstate + "\n").write(toFile: directory + "/operstate", atomically: true, encoding: .utf8)
        }
        try files.createDirectory(atPath: root.appending("proc/net"), withIntermediateDirectories: true)
        if let route { try route.write(toFile: root.appending("proc/net/route"), atomically: true, encoding: .utf8) }
        if let route6 { try route6.write(toFile: root.appending("proc/net/ipv6_route"), atomically: true, encoding: .utf8) }
        return root
    }

    @Test func aDefaultRouteOfEitherFamilyIsAPath() throws {
        let cases: [(name: String, route: String?, route6: String?, path: Bool)] = [
            ("ipv4", Self.routeHeader + Self.ipv4Default, Self.ipv6None, true),
            ("ipv6-only", Self.routeHeader + Self.ipv4Subnet, Self.ipv6Default, true),
            ("ipv6-only-no-v4-table", Self.routeHeader, Self.ipv6Default, true),
            ("neither", Self.routeHeader + Self.ipv4Subnet, Self.ipv6None, false),
            ("no-v6-file", Self.routeHeader + Self.ipv4Subnet, nil, false),
        ]
        for item in cases {
            let root = try Self.root("connectivity-\(item.name)", route: item.route, route6: item.route6)
            #expect(LinuxConnectivityMonitor(root: root.path).hasPath() == item.path, "\(item.name)")
        }
    }

    /// Loopback is no path, whatever state it reports: with every other
    /// interface down and no route tables to read, there is none.
    @Test func loopbackAloneIsNoPath() throws {
        let root = try Self.root("connectivity-loopback-only", state: "down", route: nil, route6: nil)
        #expect(!LinuxConnectivityMonitor(root: root.path).hasPath())
    }

    @Test func anInterfaceThatIsDownIsNoPath() throws {
        let root = try Self.root("connectivity-down", state: "down", route: Self.routeHeader + Self.ipv4Default, route6: Self.ipv6Default)
        #expect(!LinuxConnectivityMonitor(root: root.path).hasPath())
    }

    /// A default route with no device is no path: `ip route add unreachable
    /// default` (or `prohibit`, as a VPN's kill switch adds) is listed with
    /// RTF_REJECT, and `blackhole default` with RTF_UP alone, both on `*`
    /// (these lines are the kernel's, from a network namespace). IPv6 lists
    /// them as reject routes, which were already no path.
    @Test(arguments: ["*\t00000000\t00000000\t0201\t0\t0\t0\t00000000\t0\t0\t0\n", "*\t00000000\t00000000\t0001\t0\t0\t0\t00000000\t0\t0\t0\n"])
    func aDefaultRouteWithoutADeviceIsNoPath(_ route: String) throws {
        let root = try Self.root("connectivity-reject", route: Self.routeHeader + route + Self.ipv4Subnet, route6: Self.ipv6None)
        #expect(!LinuxConnectivityMonitor(root: root.path).hasPath(), "\(route)")
    }

    /// A default route over an interface that is down is no path, even with
    /// another interface up: the kernel keeps a route when its device loses
    /// its carrier (`ip route` marks it `linkdown`; `/proc/net/route` lists
    /// it as before), and a bridge such as docker0 is up while containers
    /// run. Before, any interface up and any default route made a path.
    @Test func aDefaultRouteOverAnInterfaceThatIsDownIsNoPath() throws {
        let root = try Self.root(
            "connectivity-linkdown", state: "down", alsoUp: ["docker0"], route: Self.routeHeader + Self.ipv4Default,
            route6: Self.ipv6Default)
        #expect(!LinuxConnectivityMonitor(root: root.path).hasPath())
    }

    /// A poll interval of 0 polls at the floor instead of reading the
    /// files in a loop that never sleeps (before, it spun a core for as
    /// long as the app watched connectivity).
    @Test func aZeroPollIntervalPollsAtTheFloor() async throws {
        // The stream stays read (its iterator held) while the poll sleeps.
        let (_, clock, paths) = try await Self.polling("connectivity-poll", every: 0)
        defer { withExtendedLifetime(paths) {} }
        #expect(clock.sleeperDeadlines == [clock.monotonicMilliseconds + LinuxConnectivityMonitor.pollMillisecondsMin])
    }

    /// An interface whose state is "unknown", as many virtual interfaces
    /// (tun, some veth) report while working, carries a path over its
    /// default route.
    @Test func anInterfaceInStateUnknownIsUp() throws {
        let root = try Self.root("connectivity-unknown", state: "unknown", route: Self.routeHeader + Self.ipv4Default, route6: Self.ipv6None)
        #expect(LinuxConnectivityMonitor(root: root.path).hasPath())
    }

    /// Without the route tables (a system that has no `/proc/net/route`)
    /// the monitor reports a path while an interface is up: it knows of no
    /// route, and the health check decides whether the server is reachable.
    @Test func withoutARouteTableAnInterfaceUpIsAPath() throws {
        let root = try Self.root("connectivity-no-route", route: nil, route6: nil)
        #expect(LinuxConnectivityMonitor(root: root.path).hasPath())
    }

    /// The monitor reports a change, not every poll: a poll that finds
    /// what the last one found reports nothing, and the next report is the
    /// path lost.
    @Test func onlyAChangeIsReported() async throws {
        var (root, clock, iterator) = try await Self.polling("connectivity-changes", every: 1_000)
        clock.advance(by: 1_000)
        // Asleep again: the second poll has read the files, and found a path again.
        try await clock.waitForSleepers(1)
        try "down\n".write(toFile: root.appending("sys/class/net/eth0/operstate"), atomically: true, encoding: .utf8)
        clock.advance(by: 1_000)
        #expect(await iterator.next() == .unsatisfied)
    }

    /// A watcher that stops listening stops the polling: its stream ends,
    /// and the task that reads the files no longer sleeps on the clock.
    /// Polling on, it would read the files for as long as the process
    /// lives.
    @Test func aStreamNoLongerReadStopsThePolling() async throws {
        let root = try Self.root("connectivity-let-go", route: Self.routeHeader + Self.ipv4Default, route6: Self.ipv6None)
        let clock = ManualClock()
        let monitor = LinuxConnectivityMonitor(pollMilliseconds: 1_000, clock: clock, root: root.path)
        let watcher = Task { for await _ in monitor.paths() {} }
        try await clock.waitForSleepers(1)
        watcher.cancel()
        try await waitUntil { clock.sleeperCount == 0 }
    }

    /// A default route of `device` at `metric`, IPv4 or IPv6.
    static func ipv4Default(_ device: String, metric: Int) -> String {
        "\(device)\t00000000\t0100000A\t0003\t0\t0\t\(metric)\t00000000\t0\t0\t0\n"
    }

    static func ipv6Default(_ device: String, metric: Int) -> String {
        "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
            + "fd000000000000000000000000000001 \(String(format: "%08x", metric)) 00000003 00000000 00000003 \(device)\n"
    }

    /// Marks `device` a mobile broadband modem, as the kernel does in its
    /// `uevent`.
    static func makeModem(_ device: String, in root: TemporaryDirectory) throws {
        try "DEVTYPE=wwan\nINTERFACE=\(device)\nIFINDEX=5\n".write(
            toFile: root.appending("sys/class/net/\(device)/uevent"), atomically: true, encoding: .utf8)
    }

    /// The path is expensive when the route the kernel prefers (the lowest
    /// metric, of either family) goes over a modem, or over an interface
    /// the app names; a modem's route the kernel does not prefer, or one
    /// whose modem is down, costs nothing.
    @Test func aPreferredRouteOverAModemIsExpensive() throws {
        let wifiFirst = Self.routeHeader + Self.ipv4Default("wlan0", metric: 600) + Self.ipv4Default("wwan0", metric: 700)
        let modemFirst = Self.routeHeader + Self.ipv4Default("wlan0", metric: 600) + Self.ipv4Default("wwan0", metric: 100)
        let cases: [(name: String, route: String, route6: String, up: [String], expensive: Set<String>, path: NetworkPath)] = [
            ("wifi-preferred", wifiFirst, Self.ipv6None, ["wlan0", "wwan0"], [], .satisfied),
            ("modem-preferred", modemFirst, Self.ipv6None, ["wlan0", "wwan0"], [], NetworkPath(isSatisfied: true, isExpensive: true)),
            ("modem-down", modemFirst, Self.ipv6None, ["wlan0"], [], .satisfied),
            (
                "modem-ipv6", Self.routeHeader + Self.ipv4Default("wlan0", metric: 600), Self.ipv6Default("wwan0", metric: 1024),
                ["wlan0", "wwan0"], [], NetworkPath(isSatisfied: true, isExpensive: true)
            ),
            ("named", wifiFirst, Self.ipv6None, ["wlan0", "wwan0"], ["wlan0"], NetworkPath(isSatisfied: true, isExpensive: true)),
        ]
        for item in cases {
            let root = try Self.root("connectivity-\(item.name)", state: "down", alsoUp: item.up, route: item.route, route6: item.route6)
            try FileManager.default.createDirectory(atPath: root.appending("sys/class/net/wwan0"), withIntermediateDirectories: true)
            try Self.makeModem("wwan0", in: root)
            let monitor = LinuxConnectivityMonitor(expensiveInterfaces: item.expensive, root: root.path)
            #expect(monitor.currentPath() == item.path, "\(item.name)")
        }
    }

    /// An interface whose `uevent` says another device type (or has no
    /// `uevent`) is no modem.
    @Test func onlyAModemsDeviceTypeIsExpensive() throws {
        let route = Self.routeHeader + Self.ipv4Default("usb0", metric: 100)
        let root = try Self.root("connectivity-usb", alsoUp: ["usb0"], route: route, route6: Self.ipv6None)
        let monitor = LinuxConnectivityMonitor(root: root.path)
        #expect(monitor.currentPath() == .satisfied)
        try "DEVTYPE=gadget\nINTERFACE=usb0\n".write(
            toFile: root.appending("sys/class/net/usb0/uevent"), atomically: true, encoding: .utf8)
        #expect(monitor.currentPath() == .satisfied)
        try Self.makeModem("usb0", in: root)
        #expect(monitor.currentPath() == NetworkPath(isSatisfied: true, isExpensive: true))
    }

    /// A path that becomes expensive is reported as a change, as a lost one is.
    @Test func aPathThatBecomesExpensiveIsReported() async throws {
        var (root, clock, iterator) = try await Self.polling("connectivity-becomes-expensive", every: 1_000)
        try Self.makeModem("eth0", in: root)
        clock.advance(by: 1_000)
        #expect(await iterator.next() == NetworkPath(isSatisfied: true, isExpensive: true))
    }
}
