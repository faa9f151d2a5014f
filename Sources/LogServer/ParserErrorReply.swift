import Foundation
import HTTPTypes
import LogFormat
import NIOCore
import NIOHTTP1
import NIOHTTPTypes

/// Answers what HTTP's parser refuses with the protocol's error envelope
/// (`sync-protocol.md` section 5), then closes the connection, where
/// Hummingbird would send a bare 400 with no body, and, after a request
/// whose body it could not parse, a second answer.
///
/// - A method HTTP does not know, a malformed request line or header: a
///   400 envelope. When it follows a whole request (pipelined), it is
///   answered after that request's answer, which it must not cut into.
/// - Garbage inside a request's body: the error goes on to the route, which
///   sees it as it reads the body (`ProtocolMiddleware` answers it). That
///   answer, or the one the route gave without reading the body, is the
///   connection's last: nothing after the garbage can be read.
final class ParserErrorReply: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    /// What ends the connection once no answer is in progress.
    private enum Ending {
        /// The envelope for a request the parser refused.
        case answer(HTTPParserError)
        /// Only the close: the request was (or is being) answered.
        case close
    }

    /// Requests whose head has arrived and whose answer has not ended.
    private var unanswered = 0
    /// A request whose head has arrived and whose end has not.
    private var receiving = false
    private var ending: Ending?
    /// The connection is closing: nothing more is written to it.
    private var closing = false
    /// The last answer's end, written or being written: the close waits
    /// for it (closing fails writes still pending).
    private var lastAnswerWritten: EventLoopFuture<Void>?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head:
            unanswered += 1
            receiving = true
        case .body: break
        case .end: receiving = false
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard !closing else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        switch unwrapOutboundIn(data) {
        case .head(var head) where ending != nil:
            head.headerFields[.connection] = "close"
            context.write(wrapOutboundOut(.head(head)), promise: promise)
        case .end:
            unanswered -= 1
            let written = context.eventLoop.makePromise(of: Void.self)
            written.futureResult.cascade(to: promise)
            lastAnswerWritten = written.futureResult
            context.write(data, promise: written)
            if unanswered == 0, let ending { end(ending, context) }
        default:
            context.write(data, promise: promise)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard let parserError = error as? HTTPParserError else {
            context.fireErrorCaught(error)
            return
        }
        // Already dealt with: the connection ends after the answer it waits for.
        guard ending == nil, !closing else { return }
        let ending: Ending
        if receiving {
            context.fireErrorCaught(error)
            ending = .close
        } else {
            ending = .answer(parserError)
        }
        if unanswered == 0 {
            end(ending, context)
        } else {
            self.ending = ending
        }
    }

    private func end(_ ending: Ending, _ context: ChannelHandlerContext) {
        closing = true
        if case .answer(let error) = ending {
            let refusal = ServiceError(.validationError, "HTTP/1.1 cannot parse the request: \(error)")
            let body = Reply.envelope(refusal) ?? Data()
            var head = HTTPResponse(status: HTTPResponse.Status(code: refusal.code.httpStatus))
            head.headerFields[.contentType] = "application/json"
            head.headerFields[.contentLength] = String(body.count)
            head.headerFields[.connection] = "close"
            head.headerFields[Reply.versionField] = String(Wire.protocolVersion)
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            context.write(wrapOutboundOut(.body(context.channel.allocator.buffer(bytes: body))), promise: nil)
            lastAnswerWritten = context.write(wrapOutboundOut(.end(nil)))
        }
        context.flush()
        let channel = context.channel
        if let lastAnswerWritten {
            lastAnswerWritten.whenComplete { _ in channel.close(promise: nil) }
        } else {
            channel.close(promise: nil)
        }
    }
}
