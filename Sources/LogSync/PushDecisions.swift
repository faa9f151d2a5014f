import LogFormat
import LogStore

/// What to do with one pushed intent's result (`Format/sync-protocol.md`,
/// section 10, "How a client records answers" and "Which failures are
/// retried"). Pure, so the rules are tested without a server.
enum ResultDecision: Equatable {
    /// Record this answer in the log.
    case record(PushOutcome)
    /// A code this client does not know: try again later, never drop it.
    case retry(String)
}

/// What to do when a whole push request failed.
enum RequestFailureDecision: Equatable {
    /// Retry every intent of the request later.
    case retryAll
    /// The request, or its answer, was too large: push its intents in
    /// smaller requests.
    case split
    /// Mark every intent failed for the app (a permanent failure that is no
    /// judgement on each operation), and end the run in error.
    case failAll
    /// End the run in error without touching the intents (the server
    /// speaks another protocol version).
    case stop
}

enum PushDecisions {
    /// Codes the protocol defines as permanent for one operation.
    static let permanentCodes: Set<WireErrorCode> = [.validationError, .permissionDenied, .entityNotFound]

    /// - Parameter baseVersion: the `base_version` the operation was pushed with.
    static func decide(_ result: PushResult, baseVersion: UInt64) -> ResultDecision {
        switch result.status {
        case .applied, .duplicate:
            // `PushResponse.decode` guarantees a version for these.
            let version = result.serverVersion ?? 0
            // An applied operation makes a version past the one it was made
            // against (section 7, "Rules"), and a duplicate answers with the
            // version its first application made. An ack at or below the
            // base (0 above all) would settle the intent as if the store
            // already had its change (`storage.md` section 15), taking the
            // change out of what the app sees; it is tried again as a
            // malformed answer, and ends `failed` for the app if it stays.
            guard version > baseVersion else {
                return .retry("\(result.status.rawValue) with server_version \(version), not above the base_version \(baseVersion) pushed")
            }
            return .record(.acknowledged(result.status == .applied ? .applied : .duplicate, serverVersion: version))
        case .rejected:
            let code = result.errorCode ?? WireErrorCode(rawValue: "")
            // Kept in the log's `reject` and `conflict` entries, and in
            // the outbox for a retry: a server's text is kept only in part.
            let message = (result.errorMessage ?? "").truncated(utf8BytesMax: TransportError.messageBytesMax)
            if code == .conflict {
                // The protocol always sends the server's state with a
                // conflict: without it the answer is malformed, so the change
                // is tried again rather than dropped unresolved.
                guard let state = result.serverState else { return .retry("CONFLICT without server_state: \(message)") }
                // A state the store cannot keep breaks the protocol as much:
                // recorded, it would fail the batch's other answers too.
                if let problem = stateProblem(state) { return .retry("CONFLICT with a server_state the store cannot keep: \(problem)") }
                return .record(.conflict(state, message: message))
            }
            if permanentCodes.contains(code) { return .record(.rejected(code: code.rawValue, message: message)) }
            return .retry("\(code.rawValue.truncated(utf8BytesMax: 64)): \(message)")
        }
    }

    /// Why the store cannot record `state` in a conflict entry: names the
    /// format refuses, or more than `Wire.entityFieldsBytesMax`, which
    /// leaves the entry room for the rest (section 13); nil when it can.
    static func stateProblem(_ state: ServerState) -> String? {
        if let problem = NameRules.fieldsProblem(state.data) { return problem }
        let bytes = state.data.encodedSize
        guard bytes <= Wire.entityFieldsBytesMax else {
            return "its fields are \(bytes) bytes, over entityFieldsBytesMax (\(Wire.entityFieldsBytesMax))"
        }
        return nil
    }

    static func decide(_ error: TransportError, batchCount: Int) -> RequestFailureDecision {
        switch error.kind {
        case .status(413, _): batchCount > 1 ? .split : .failAll
        // An answer too long to read: one result per operation, each of at
        // most one entity's state, so fewer operations get one that fits.
        // It may have been applied; pushed again, it is answered duplicate.
        case .responseTooLarge: batchCount > 1 ? .split : .retryAll
        case .protocolVersion: .stop
        default: error.isRetryable ? .retryAll : .failAll
        }
    }

    /// The operation sent for a pending intent, with the base version
    /// `Store.pushBatch` computed.
    static func operation(_ pending: PendingIntent) -> PushOperation {
        PushOperation(pending.intent, clientTimestamp: Value.rfc3339(microseconds: Int64(pending.timestamp.milliseconds) * 1_000))
    }
}
