#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A pthread read-write lock. Transactions hold it shared; growing the map
/// holds it exclusively, because LMDB only allows `mdb_env_set_mapsize` while
/// this process has no transaction open.
final class ReadWriteLock: @unchecked Sendable {
    private let lock: UnsafeMutablePointer<pthread_rwlock_t>

    init() {
        lock = .allocate(capacity: 1)
        lock.initialize(to: pthread_rwlock_t())
        precondition(pthread_rwlock_init(lock, nil) == 0, "pthread_rwlock_init failed")
    }

    deinit {
        pthread_rwlock_destroy(lock)
        lock.deallocate()
    }

    func withShared<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        precondition(pthread_rwlock_rdlock(lock) == 0, "pthread_rwlock_rdlock failed")
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }

    /// For holds that span two calls (a read transaction's begin and end);
    /// pair each with `unlock`.
    func lockShared() {
        precondition(pthread_rwlock_rdlock(lock) == 0, "pthread_rwlock_rdlock failed")
    }

    func unlock() { pthread_rwlock_unlock(lock) }

    func withExclusive<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        precondition(pthread_rwlock_wrlock(lock) == 0, "pthread_rwlock_wrlock failed")
        defer { pthread_rwlock_unlock(lock) }
        return try body()
    }
}
