/// Whether the device has a network path, as the platform reports it: on
/// Linux `LogSyncHTTP.LinuxConnectivityMonitor`, on Apple platforms a wrapper
/// of `NWPathMonitor`. A path is not proof of reaching the server (a captive
/// portal has one); the engine's health check decides that.
public protocol ConnectivityMonitor: Sendable {
    /// The current state first, then every change, until the stream's
    /// consumer stops iterating.
    func paths() -> AsyncStream<Bool>
}
