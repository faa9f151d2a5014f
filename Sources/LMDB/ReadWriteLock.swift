#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif
import Foundation
import Synchronization

/// A pthread read-write lock. Transactions hold it shared; growing the map
/// holds it exclusively, because LMDB only allows `mdb_env_set_mapsize` while
/// this process has no transaction open.
///
/// Two rules pull against each other, and the lock keeps both:
/// - A thread may take it shared while it already holds it shared (a read
///   inside a write job), so that hold must not queue behind a waiting
///   writer, which waits for the first hold: the two would wait for each
///   other for good. The pthread lock prefers readers for that: on glibc
///   that is asked for explicitly (its default, but a default is not a
///   promise).
/// - Reader preference alone lets readers on several threads, one read
///   after another, keep a writer out for good: their holds overlap, and
///   the lock is never free. So while a writer waits, a thread that holds
///   no such lock shared waits at a gate before it takes one. Holds already
///   taken end, and the writer gets in.
///
/// "No such lock", not "not this one": a thread that holds another
/// environment's lock shared passes the gate too. Were it to wait, a reader
/// of one store inside a read of another, and a second thread doing the
/// reverse, could each wait for a writer that waits for the other's hold.
final class ReadWriteLock: @unchecked Sendable {
    private let lock: UnsafeMutablePointer<pthread_rwlock_t>
    /// Writers waiting for the lock or holding it. New readers wait while
    /// there are any; the last one out wakes them.
    private let writerCount = Atomic<Int>(0)
    private let gate = NSCondition()

    init() {
        lock = .allocate(capacity: 1)
        lock.initialize(to: pthread_rwlock_t())
        #if canImport(Glibc)
            var attributes = pthread_rwlockattr_t()
            pthread_rwlockattr_init(&attributes)
            defer { pthread_rwlockattr_destroy(&attributes) }
            pthread_rwlockattr_setkind_np(&attributes, Int32(PTHREAD_RWLOCK_PREFER_READER_NP))
            precondition(pthread_rwlock_init(lock, &attributes) == 0, "pthread_rwlock_init failed")
        #else
            precondition(pthread_rwlock_init(lock, nil) == 0, "pthread_rwlock_init failed")
        #endif
    }

    deinit {
        pthread_rwlock_destroy(lock)
        lock.deallocate()
    }

    func withShared<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lockShared()
        defer { unlock() }
        return try body()
    }

    /// For holds that span two calls (a read transaction's begin and end);
    /// pair each with `unlock` on the same thread.
    func lockShared() {
        let holds = ReadWriteLock.sharedHolds
        if holds == 0, writerCount.load(ordering: .acquiring) > 0 {
            gate.lock()
            while writerCount.load(ordering: .acquiring) > 0 { gate.wait() }
            gate.unlock()
        }
        precondition(pthread_rwlock_rdlock(lock) == 0, "pthread_rwlock_rdlock failed")
        ReadWriteLock.sharedHolds = holds + 1
    }

    /// Ends a shared hold.
    func unlock() {
        ReadWriteLock.sharedHolds -= 1
        pthread_rwlock_unlock(lock)
    }

    func withExclusive<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        writerCount.add(1, ordering: .acquiringAndReleasing)
        precondition(pthread_rwlock_wrlock(lock) == 0, "pthread_rwlock_wrlock failed")
        defer {
            pthread_rwlock_unlock(lock)
            // Under the gate's lock, so a reader between its check and its
            // wait cannot miss the wake-up.
            gate.lock()
            if writerCount.subtract(1, ordering: .acquiringAndReleasing).newValue == 0 { gate.broadcast() }
            gate.unlock()
        }
        return try body()
    }

    /// Writers waiting for the lock or holding it (tests wait for one).
    var writersWaitingOrHolding: Int { writerCount.load(ordering: .acquiring) }

    /// Whether the calling thread holds any `ReadWriteLock` shared: an
    /// exclusive hold it asked for would wait for itself.
    static var threadHoldsShared: Bool { sharedHolds > 0 }

    /// The calling thread's shared holds of any `ReadWriteLock`, kept in a
    /// thread-specific value (a count, not a pointer).
    private static var sharedHolds: Int {
        get { Int(bitPattern: pthread_getspecific(sharedHoldsKey)) }
        set { pthread_setspecific(sharedHoldsKey, UnsafeRawPointer(bitPattern: newValue)) }
    }

    private static let sharedHoldsKey: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, nil) == 0, "pthread_key_create failed")
        return key
    }()
}
