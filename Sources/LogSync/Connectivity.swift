/// The device's network path, as the platform reports it: whether there is
/// one, and what using it costs the user. On Apple platforms these are
/// `NWPath`'s `status == .satisfied`, `isExpensive` and `isConstrained`.
public struct NetworkPath: Sendable, Equatable, CustomStringConvertible {
    /// Whether the device has a path to the network. A path is not proof of
    /// reaching the server (a captive portal has one); the engine's health
    /// check decides that.
    public var isSatisfied: Bool
    /// Whether the path costs the user for what it carries: cellular, or a
    /// phone's hotspot.
    public var isExpensive: Bool
    /// Whether the user asked to save data on it (Low Data Mode).
    public var isConstrained: Bool

    public init(isSatisfied: Bool, isExpensive: Bool = false, isConstrained: Bool = false) {
        self.isSatisfied = isSatisfied
        self.isExpensive = isExpensive
        self.isConstrained = isConstrained
    }

    /// A path that costs nothing to use (Wi-Fi, Ethernet).
    public static let satisfied = NetworkPath(isSatisfied: true)
    /// No path.
    public static let unsatisfied = NetworkPath(isSatisfied: false)

    /// Expensive or constrained: what `NetworkPolicy` may keep from it.
    var isCostly: Bool { isExpensive || isConstrained }

    /// `no path`, `path`, `path (expensive, constrained)`.
    public var description: String {
        guard isSatisfied else { return "no path" }
        let costs = [isExpensive ? "expensive" : nil, isConstrained ? "constrained" : nil].compactMap { $0 }
        return costs.isEmpty ? "path" : "path (\(costs.joined(separator: ", ")))"
    }
}

/// Reports the device's network path: on Linux
/// `LogSyncHTTP.LinuxConnectivityMonitor`, on Apple platforms a wrapper of
/// `NWPathMonitor`.
public protocol ConnectivityMonitor: Sendable {
    /// The current path first, then every change, until the stream's
    /// consumer stops iterating.
    func paths() -> AsyncStream<NetworkPath>
}

/// What the engine may send over an expensive or constrained path
/// (`SyncConfiguration.network`): a user's "sync over cellular" and "large
/// files on Wi-Fi only" settings.
public struct NetworkPolicy: Sendable, Equatable {
    /// Whether to sync over an expensive path. When false, the scheduler
    /// starts no run there, and a run started there (`SyncEngine.sync()`)
    /// makes no request and ends as `.pathNotAllowed`; the first run on a
    /// path that costs nothing syncs what waited.
    public var syncsOnExpensivePaths = true
    /// Whether to sync over a constrained path, alike.
    public var syncsOnConstrainedPaths = true
    /// Entity types whose intents are pushed only over a path that is
    /// neither expensive nor constrained (large ones: attachments,
    /// recordings). Until then they wait in the outbox, with no attempt
    /// counted, and hold nothing else back (each entity is of one type).
    /// Their pulled changes still come: the server's feed is one for every
    /// type.
    public var typesPushedOnlyOnFreePaths: Set<String> = []

    public init() {}

    /// Whether a run may sync over `path`, which must have one.
    public func allowsSync(over path: NetworkPath) -> Bool {
        path.isSatisfied && (syncsOnExpensivePaths || !path.isExpensive) && (syncsOnConstrainedPaths || !path.isConstrained)
    }

    /// The types whose intents wait while the device is on `path`.
    func heldTypes(on path: NetworkPath) -> Set<String> { path.isCostly ? typesPushedOnlyOnFreePaths : [] }
}
