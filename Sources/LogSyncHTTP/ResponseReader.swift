import Foundation
import Synchronization

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// Why `ResponseReader` gave up on a request.
enum GiveUp: Error {
    /// The body passed the reader's `bytesMax`; `declaredBytes` is the
    /// length the response declared, when that is what was refused.
    case tooLarge(declaredBytes: Int64?)
    /// The exchange took longer than its deadline; `answered` when the
    /// response's status line and headers had come by then.
    case deadline(answered: Bool)
}

/// A request that failed before its response's status line and headers
/// came (refused, reset, timed out): no answer at all, which
/// `HTTPTransport` tells from an answer cut short.
struct NoAnswer: Error {
    let underlying: any Error
}

/// Reads response bodies for `HTTPTransport` as they arrive, within a limit
/// of bytes and of time.
///
/// `URLSession.data(for:)` keeps a whole body in memory, however long,
/// before it returns; this reader gives up on a request whose body passes
/// `bytesMax`. The bytes counted are the ones the session delivers, after
/// it undoes a `Content-Encoding` (libcurl does on Linux, whatever the
/// request accepted), so a few kilobytes of gzip that inflate to gigabytes
/// are cut off at the limit as a plain body is. It also gives up on an
/// exchange that passes its deadline: FoundationNetworking ignores
/// `timeoutIntervalForResource`, so a server that trickles its answer, a
/// byte at a time, would hold the request forever.
///
/// A request given up on ends at once for its caller, and its later data is
/// dropped as it comes. Its task is cancelled too, but FoundationNetworking
/// runs a cancellation on the queue its transfers run on: while data comes
/// faster than the client reads it (a compressed stream without end), the
/// cancellation waits for the server to stop, and so does every later
/// request of the process's sessions (see `HTTPTransport`, Caveats).
///
/// It is the delegate of the transport's session, which routes every task's
/// events here.
final class ResponseReader: NSObject, URLSessionDataDelegate, Sendable {
    private struct Exchange {
        let continuation: CheckedContinuation<(Data, URLResponse), any Error>
        var body = Data()

        /// Appends `data` to the body; false, leaving the body as it is,
        /// when that would take it past `bytesMax`.
        mutating func take(_ data: Data, bytesMax: Int) -> Bool {
            guard data.count <= bytesMax - body.count else { return false }
            body.append(data)
            return true
        }
    }

    /// The longest deadline kept, a year.
    static let deadlineSecondsMax: TimeInterval = 365 * 24 * 3_600

    private let bytesMax: Int
    /// The requests in flight, by their task.
    private let exchanges = Mutex<[ObjectIdentifier: Exchange]>([:])

    init(bytesMax: Int) {
        precondition(bytesMax >= 0, "a body limit is not negative")
        self.bytesMax = bytesMax
    }

    /// Sends `request` on `session`, whose delegate this must be, and
    /// returns the whole body.
    /// - Throws: `GiveUp`, or the session's error.
    func data(for request: URLRequest, on session: URLSession, deadlineSeconds: TimeInterval) async throws -> (Data, URLResponse) {
        precondition(session.delegate === self, "the session's events must come to this reader")
        let task = session.dataTask(with: request)
        // A deadline a year or more away, infinite or NaN, is none: a
        // `Duration` cannot hold every `TimeInterval`.
        let timer =
            deadlineSeconds < Self.deadlineSecondsMax
            ? Task { [weak self] in
                try await Task.sleep(for: .seconds(deadlineSeconds))
                self?.giveUp(task, .deadline(answered: task.response != nil))
            } : nil
        defer { timer?.cancel() }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                exchanges.withLock { $0[ObjectIdentifier(task)] = Exchange(continuation: continuation) }
                task.resume()
                // Cancelled before it was resumed, the task was left alone
                // (below): a suspended task that is cancelled never ends on
                // Linux.
                if Task.isCancelled { task.cancel() }
            }
        } onCancel: {
            if task.state != .suspended { task.cancel() }
        }
    }

    /// Ends the request `task` makes with `reason`, drops what comes for it
    /// from now on, and cancels it.
    private func giveUp(_ task: URLSessionTask, _ reason: GiveUp) {
        guard let exchange = exchanges.withLock({ $0.removeValue(forKey: ObjectIdentifier(task)) }) else { return }
        exchange.continuation.resume(throwing: reason)
        // On a thread of its own: the cancellation may wait for the whole
        // transfer (above), and meanwhile the delegate's queue must go on
        // dropping its data, and no thread of Dispatch's pool, which is as
        // wide as the machine has cores, may wait with it.
        Thread { task.cancel() }.start()
    }

    /// Follows no redirect: the protocol has none, and the session would
    /// send the request as it is, bearer token included, wherever the
    /// `Location` points (another host, plain HTTP). The redirect is the
    /// answer (`HTTPTransport` fails it as a network error).
    func urlSession(
        _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
        newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void
    ) {
        completionHandler(nil)
    }

    func urlSession(
        _ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void
    ) {
        guard response.expectedContentLength > Int64(bytesMax) else { return completionHandler(.allow) }
        // The disposition is ignored by FoundationNetworking, but not on
        // Apple platforms.
        completionHandler(.cancel)
        giveUp(dataTask, .tooLarge(declaredBytes: response.expectedContentLength))
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        let bytesMax = bytesMax
        let within = exchanges.withLock { exchanges -> Bool in
            // Changed in place: a copy of the exchange would copy its body
            // at every chunk.
            exchanges[ObjectIdentifier(dataTask)]?.take(data, bytesMax: bytesMax) ?? true
        }
        if !within { giveUp(dataTask, .tooLarge(declaredBytes: nil)) }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let exchange = exchanges.withLock({ $0.removeValue(forKey: ObjectIdentifier(task)) }) else { return }
        if let error {
            exchange.continuation.resume(throwing: task.response == nil ? NoAnswer(underlying: error) : error)
        } else if let response = task.response {
            exchange.continuation.resume(returning: (exchange.body, response))
        } else {
            exchange.continuation.resume(throwing: URLError(.badServerResponse))
        }
    }
}
