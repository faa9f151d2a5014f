import Foundation
import LogFormat
import Synchronization

/// A token bucket per user: `burst` requests at once, refilled at `rate`
/// per second. Time is injected so tests need no waiting.
final class RateLimiter: Sendable {
    struct Bucket {
        var tokens: Double
        var updated: Double
    }

    let rate: Double
    let burst: Double
    /// By the user's name in UTF-8, as the store tells users apart: `String`
    /// keys would merge names that differ only by Unicode normalization.
    private let buckets = Mutex([[UInt8]: Bucket]())

    init(rate: Double, burst: Int) {
        precondition(rate > 0 && burst > 0, "a rate limit needs a positive rate and burst")
        self.rate = rate
        self.burst = Double(burst)
    }

    /// Takes a token for `user` at `now` (seconds of a monotonic clock); nil
    /// if one was there, else the whole seconds until one will be (at least 1).
    func take(_ user: String, now: Double) -> Int? {
        let name = Array(user.utf8)
        return buckets.withLock { buckets in
            var bucket = buckets[name] ?? Bucket(tokens: burst, updated: now)
            bucket.tokens = min(burst, bucket.tokens + max(0, now - bucket.updated) * rate)
            // Concurrent requests read the clock before they take the lock: an
            // earlier `now` must not move the bucket's clock back, or the time
            // in between would be refilled twice.
            bucket.updated = max(bucket.updated, now)
            defer { buckets[name] = bucket }
            if bucket.tokens >= 1 {
                bucket.tokens -= 1
                return nil
            }
            // A rate slow enough puts the wait past any Int: it is that long.
            let seconds = ((1 - bucket.tokens) / rate).rounded(.up)
            return seconds < Double(Int.max) ? max(1, Int(seconds)) : Int.max
        }
    }
}

/// The bytes of push bodies the server holds at once, from their first
/// byte received until their answer is made: bodies being received, parsed,
/// and waiting for the store's one writer, which applies one push at a
/// time. Without a bound, many clients each sending a body of up to
/// `Wire.requestBodyBytesMax` at once would have the server hold them all.
final class PushBuffer: Sendable {
    /// The most bytes held at once, but for a push that is the only one held
    /// (which is always taken, whatever its size, so that no push is refused
    /// for good).
    let bytesMax: Int
    private let held = Mutex(0)

    init(bytesMax: Int) {
        precondition(bytesMax > 0, "a push buffer needs room for some bytes")
        self.bytesMax = bytesMax
    }

    /// The bytes held now.
    var bytes: Int { held.withLock { $0 } }

    /// Takes `count` more bytes for a push that holds `holding` already.
    /// - Throws: `ServiceError.serviceUnavailable` (503, `Retry-After: 1`,
    ///   section 5), taking nothing, when other pushes hold bytes and the
    ///   total would exceed `bytesMax`.
    func take(_ count: Int, holding: Int) throws {
        precondition(count >= 0 && holding >= 0, "a push holds no negative bytes")
        let taken = held.withLock { held in
            precondition(held >= holding, "a push holds more bytes than the buffer")
            guard held == holding || held + count <= bytesMax else { return false }
            held += count
            return true
        }
        guard taken else {
            throw ServiceError(
                .serviceUnavailable, "the server holds as many pushes as it takes at once; try again shortly", retryAfter: 1)
        }
    }

    /// Gives back every byte a push took, once its answer is made.
    func release(_ count: Int) {
        held.withLock { held in
            precondition(held >= count, "a push gives back more bytes than the buffer holds")
            held -= count
        }
    }
}

extension FaultSettings {
    /// Reads a `POST /v1/admin/faults` body (section 12) by the protocol's
    /// JSON rules, which `JSONDecoder` does not keep (it takes a byte order
    /// mark, a lone surrogate, and `null` for an absent member): each member
    /// a whole number by value; unknown members ignored. `FaultInjector.set`
    /// checks the ranges.
    /// - Throws: `ServiceError.validationError` naming what is wrong.
    init(json body: Data) throws {
        let value: JSONValue
        do { value = try JSONReader.parse(body) } catch {
            throw ServiceError(.validationError, "the faults body is not valid JSON: \(error)")
        }
        guard case .object = value else { throw ServiceError(.validationError, "the faults body is not a JSON object") }
        func number(_ name: String) throws -> Int? {
            switch value[name] {
            case nil: return nil
            case .int(let number): return Int(exactly: number)
            case .negativeZero: return 0
            case .some:
                throw ServiceError(.validationError, "\(name) must be a whole number (a JSON number, not null, a string or a fraction)")
            }
        }
        self.init(
            failNext: try number("fail_next"), status: try number("status"), delayMs: try number("delay_ms"),
            dropAfterPush: try number("drop_after_push"))
    }
}

/// Faults a test can switch on (never in production): failing requests,
/// slow answers, and pushes applied whose answer never arrives.
public struct FaultSettings: Codable, Sendable, Equatable {
    /// Fail this many of the next requests (health and admin excepted).
    public var failNext: Int?
    /// With this status: 500, 503 or 429.
    public var status: Int?
    /// Delay every answer by this many milliseconds.
    public var delayMs: Int?
    /// Apply this many of the next pushes, then drop the connection.
    public var dropAfterPush: Int?

    public init(failNext: Int? = nil, status: Int? = nil, delayMs: Int? = nil, dropAfterPush: Int? = nil) {
        self.failNext = failNext
        self.status = status
        self.delayMs = delayMs
        self.dropAfterPush = dropAfterPush
    }

    enum CodingKeys: String, CodingKey {
        case failNext = "fail_next"
        case status
        case delayMs = "delay_ms"
        case dropAfterPush = "drop_after_push"
    }
}

final class FaultInjector: Sendable {
    /// The bounds of what a test may ask for.
    static let failNextMax = 1_000_000
    static let delayMillisecondsMax = 60_000

    private struct State {
        var failNext = 0
        var status = 503
        var delayMs = 0
        var dropAfterPush = 0
    }

    private let state = Mutex(State())

    /// Replaces the faults; `{}` clears them.
    func set(_ settings: FaultSettings) throws {
        let status = settings.status ?? 503
        guard [500, 503, 429].contains(status) else {
            throw ServiceError(.validationError, "status must be 500, 503 or 429, not \(status)")
        }
        let failNext = try FaultInjector.checked("fail_next", settings.failNext, max: FaultInjector.failNextMax)
        let delay = try FaultInjector.checked("delay_ms", settings.delayMs, max: FaultInjector.delayMillisecondsMax)
        let drops = try FaultInjector.checked("drop_after_push", settings.dropAfterPush, max: FaultInjector.failNextMax)
        state.withLock { $0 = State(failNext: failNext, status: status, delayMs: delay, dropAfterPush: drops) }
    }

    /// `value` (0 when absent) when it is 0 to `max`.
    /// - Throws: `ServiceError.validationError` naming the member and its range.
    private static func checked(_ member: String, _ value: Int?, max: Int) throws -> Int {
        let value = value ?? 0
        guard (0...max).contains(value) else { throw ServiceError(.validationError, "\(member) must be 0 to \(max), not \(value)") }
        return value
    }

    /// The error to fail this request with, if one is due.
    func takeFailure() -> ServiceError? {
        state.withLock { state -> ServiceError? in
            guard state.failNext > 0 else { return nil }
            state.failNext -= 1
            switch state.status {
            case 429: return ServiceError(.rateLimited, "injected fault: rate limited", retryAfter: 1)
            case 500: return ServiceError(.internalError, "injected fault: internal error")
            default: return ServiceError(.serviceUnavailable, "injected fault: unavailable", retryAfter: 1)
            }
        }
    }

    var delay: Duration { .milliseconds(state.withLock { $0.delayMs }) }

    /// Every setting now in force.
    var current: FaultSettings {
        state.withLock { FaultSettings(failNext: $0.failNext, status: $0.status, delayMs: $0.delayMs, dropAfterPush: $0.dropAfterPush) }
    }

    /// Whether this push's answer is to be dropped (counting it).
    func takeDrop() -> Bool {
        state.withLock { state in
            guard state.dropAfterPush > 0 else { return false }
            state.dropAfterPush -= 1
            return true
        }
    }
}
