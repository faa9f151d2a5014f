import Hummingbird
import ServiceLifecycle

extension SyncServer {
    /// A server serving in a task of its own (`serve()`) until `stop()`.
    public struct Serving: Sendable {
        /// The port it listens on.
        public let port: Int
        private let task: Task<Void, any Error>
        private let group: ServiceGroup

        fileprivate init(port: Int, task: Task<Void, any Error>, group: ServiceGroup) {
            self.port = port
            self.task = task
            self.group = group
        }

        /// Stops by a graceful shutdown and returns once it has stopped: no
        /// new connection is taken, and each open one ends once it has
        /// answered the request it is on. It leaves the store open
        /// (`SyncServer.close()` closes it).
        public func stop() async {
            await group.triggerGracefulShutdown()
            _ = await task.result
        }
    }

    /// A server that ended before it listened, without saying why.
    public struct ServeError: Error, CustomStringConvertible {
        public let description: String
    }

    /// Serves `application()` in a task of its own, for a process that
    /// runs a server beside other work (tests, the bench); `syncserver`
    /// runs it with `runService()` instead. Returns once listening.
    ///
    /// Stop it with `Serving.stop()`, never by cancelling a task: a
    /// connection accepted as the serving task is cancelled is never handed
    /// to a handler, and NIO traps on it ("Deinited NIOAsyncWriter without
    /// calling finish()", swift-nio issue 3481), which ends the process.
    /// - Parameter shutdownGrace: how long a graceful stop waits for requests
    ///   under way (a client that never ends its body, say) before it cuts
    ///   them off (nil: as long as they take).
    /// - Throws: why the server ended before it listened (it could not bind,
    ///   say), or `ServeError` when it ended without saying why.
    public func serve(shutdownGrace: Duration? = .seconds(5)) async throws -> Serving {
        let (ports, continuation) = AsyncStream.makeStream(of: Int.self)
        let app = application { port in continuation.yield(port) }
        var groupConfiguration = ServiceGroupConfiguration(services: [.init(service: app)], logger: app.logger)
        groupConfiguration.maximumGracefulShutdownDuration = shutdownGrace
        let group = ServiceGroup(configuration: groupConfiguration)
        let task = Task {
            // Ended before listening, it must not leave `serve` waiting.
            defer { continuation.finish() }
            try await group.run()
        }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next() else {
            try await task.value
            throw ServeError(description: "the server for \(configuration.host):\(configuration.port) ended before it listened")
        }
        return Serving(port: port, task: task, group: group)
    }
}
