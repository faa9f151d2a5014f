#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A pthread read-write lock. Transactions hold it shared; growing the map
/// holds it exclusively, because LMDB only allows `mdb_env_set_mapsize` while
/// this process has no transaction open.
///
/// A thread may take it shared while it already holds it shared (a read
/// inside a write job), so readers must not queue behind a waiting writer:
/// on glibc that is asked for explicitly (its default, but a default is
/// not a promise).
final class ReadWriteLock: @unchecked Sendable {
    private let lock: UnsafeMutablePointer<pthread_rwlock_t>

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
