import NIOCore
import NIOHTTPTypes

/// Bounds the time a request may take to send its body: from its head's
/// arrival to its end. Hummingbird's idle timeout counts from the last part
/// received, and every piece of a body is one, so a body sent a byte at a
/// time (slowloris) within it held the connection, and the route's buffer,
/// for as long as the client kept sending.
///
/// Past the bound, the route reading the body gets `RequestBodyTimedOut`,
/// and the connection is closed without an answer, also when the route
/// answered without reading the body. No answer, rather than 408: to a
/// client (`sync-protocol.md` section 10) a closed connection is a network
/// error, retried later, where a 4xx such as 408 is permanent and would
/// mark a slow client's intents failed.
final class RequestBodyDeadline: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart

    /// nil: no bound.
    private let timeout: TimeAmount?
    /// The close of a request whose head has arrived and whose end has not.
    private var deadline: Scheduled<Void>?

    init(timeout: TimeAmount?) { self.timeout = timeout }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head:
            deadline?.cancel()
            guard let timeout else { break }
            deadline = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) {
                self.deadline = nil
                // The error first: the route reading the body learns why it
                // ends before the close ends the stream of request parts.
                context.fireErrorCaught(RequestBodyTimedOut(timeout: timeout))
                context.close(promise: nil)
            }
        case .body:
            break
        case .end:
            deadline?.cancel()
            deadline = nil
        }
        context.fireChannelRead(data)
    }

    func channelInactive(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
        deadline = nil
    }
}

/// A request's body did not arrive within the body timeout; its connection
/// is closed.
struct RequestBodyTimedOut: Error, CustomStringConvertible {
    let timeout: TimeAmount
    var description: String { "the request body did not arrive within \(timeout.nanoseconds / 1_000_000) ms" }
}
