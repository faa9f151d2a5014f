/// When to sync: the scheduler's rules as a pure state machine. Events go
/// in with the time they happened; actions (start a sync, set or cancel a
/// timer) come out. `SyncScheduler` carries them out with a clock; tests
/// drive this directly with times of their choosing.
///
/// - Periodic sync every `periodMilliseconds` while online.
/// - A local write arms a debounce timer (re-armed by each write), so a
///   burst of writes gives one sync.
/// - Connectivity regained arms a 2.5 s timer; it fires only if the
///   connection is still up (a loss cancels it), and only a gain arms it.
/// - A server nudge syncs at once while online.
public struct SchedulerCore: Sendable, Equatable {
    public enum Timer: Hashable, Sendable { case periodic, localWrite, networkRegained }

    public enum Reason: Hashable, Sendable { case started, periodic, localWrite, networkRegained, nudge }

    public enum Event: Equatable, Sendable {
        case started(online: Bool)
        case localWrite
        case connectivity(Bool)
        case nudge
        case timerFired(Timer)
    }

    public enum Action: Equatable, Sendable {
        case sync(Reason)
        case setTimer(Timer, at: UInt64)
        case cancelTimer(Timer)
    }

    public var periodMilliseconds: UInt64 = 30_000
    public var localWriteDebounceMilliseconds: UInt64 = 1_000
    public var networkDebounceMilliseconds: UInt64 = 2_500
    public private(set) var online = false

    public init() {}

    public mutating func handle(_ event: Event, at now: UInt64) -> [Action] {
        switch event {
        case .started(let isOnline):
            online = isOnline
            return online ? [.sync(.started), .setTimer(.periodic, at: now + periodMilliseconds)] : []
        case .localWrite:
            // Offline, the write waits for the connection to come back.
            return online ? [.setTimer(.localWrite, at: now + localWriteDebounceMilliseconds)] : []
        case .connectivity(let isOnline):
            defer { online = isOnline }
            if isOnline && !online { return [.setTimer(.networkRegained, at: now + networkDebounceMilliseconds)] }
            if !isOnline && online { return [.cancelTimer(.networkRegained), .cancelTimer(.localWrite), .cancelTimer(.periodic)] }
            return []
        case .nudge:
            return online ? [.sync(.nudge)] : []
        case .timerFired(let timer):
            guard online else { return [] }
            switch timer {
            case .periodic: return [.sync(.periodic), .setTimer(.periodic, at: now + periodMilliseconds)]
            case .localWrite: return [.sync(.localWrite)]
            case .networkRegained: return [.sync(.networkRegained), .setTimer(.periodic, at: now + periodMilliseconds)]
            }
        }
    }
}
