import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1

extension HTTPServerBuilder {
    /// Hummingbird's `http1(configuration:)`, with `LastRequestMark`.
    static func http1MarkingLastRequests(configuration: HTTP1Channel.Configuration) -> HTTPServerBuilder {
        HTTPServerBuilder { responder in
            SyncHTTP1Channel(base: HTTP1Channel(responder: responder, configuration: configuration))
        }
    }
}

/// Hummingbird's HTTP/1 channel with `LastRequestMark` in its pipeline,
/// where it sees each request as HTTP/1 sent it: before the codec that
/// turns it into Swift HTTP Types and drops its version.
struct SyncHTTP1Channel: HTTPChannelHandler {
    let base: HTTP1Channel

    var responder: Responder { base.responder }

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<HTTP1Channel.Value> {
        base.setup(channel: channel, logger: logger).flatMapThrowing { value in
            let pipeline = channel.pipeline.syncOperations
            let codec = try pipeline.handler(type: HTTP1ToHTTPServerCodec.self)
            try pipeline.addHandler(LastRequestMark(), position: .before(codec))
            return value
        }
    }

    func handle(value: HTTP1Channel.Value, logger: Logger) async {
        await base.handle(value: value, logger: logger)
    }
}

/// Ends the connection after the answer to a request that does not keep
/// it (RFC 9112 section 9.3): HTTP/1.0 without `Connection: keep-alive`,
/// or `Connection` naming `close` in any case or list. Hummingbird ends a
/// connection only after a request whose `Connection` is exactly `close`,
/// and cannot see a request's version, so such a connection stayed open,
/// unused, until the idle timeout. Each such request is given
/// `Connection: close` for Hummingbird, and its answer says it too.
final class LastRequestMark: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    /// For each request whose final answer has not begun, oldest first
    /// (pipelined requests are answered in order): whether it keeps the
    /// connection.
    private var keepsConnection: [Bool] = []

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .head(var head) = unwrapInboundIn(data) else { return context.fireChannelRead(data) }
        let keeps = head.isKeepAlive
        keepsConnection.append(keeps)
        if !keeps { head.headers.replaceOrAdd(name: "Connection", value: "close") }
        context.fireChannelRead(wrapInboundOut(.head(head)))
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        // An answer with no request waiting (the envelope for what HTTP's
        // parser refused) says what it does itself.
        guard case .head(var head) = unwrapOutboundIn(data), head.status.code >= 200, !keepsConnection.isEmpty else {
            return context.write(data, promise: promise)
        }
        if !keepsConnection.removeFirst() { head.headers.replaceOrAdd(name: "Connection", value: "close") }
        context.write(wrapOutboundOut(.head(head)), promise: promise)
    }
}
