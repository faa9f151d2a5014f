import Foundation

/// How long a test waits for what other tasks do before it calls the wait
/// a hang: a bound that ends a wait that would never end, not a measure of
/// time. It is long because the whole suite on two cores holds the
/// cooperative pool for a minute and more as it starts (every test starts
/// at once, and many block their thread in LMDB commits): there a test of
/// a pure function waited 50 s for a thread, and a scheduler test whose
/// waits take milliseconds alone ran 74 s, so a bound of 60 s failed tests
/// that were only late.
public let hangSeconds: Double = 300

/// A wait that reached `hangSeconds` (or the bound it was given).
public struct WaitTimedOut: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Polls a condition (really, briefly): for events that happen on other
/// tasks (`hangSeconds` bounds the wait).
/// - Throws: `WaitTimedOut` when the condition is not met within `timeoutSeconds`.
public func waitUntil(timeoutSeconds: Double = hangSeconds, _ condition: () async throws -> Bool) async throws {
    let deadline = Date().addingTimeInterval(timeoutSeconds)
    while try await !condition() {
        guard Date() < deadline else { throw WaitTimedOut("condition not met within \(timeoutSeconds) s") }
        try await Task.sleep(for: .milliseconds(5))
    }
}
