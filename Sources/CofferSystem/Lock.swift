import Glibc

/// A pthread mutex guarding state shared between agent threads.
public final class Lock: @unchecked Sendable {
    private let m: UnsafeMutablePointer<pthread_mutex_t>

    /// A new, unlocked mutex.
    public init() {
        m = .allocate(capacity: 1)
        m.initialize(to: pthread_mutex_t())
        pthread_mutex_init(m, nil)
    }

    deinit {
        pthread_mutex_destroy(m)
        m.deallocate()
    }

    /// Runs `body` holding the mutex.
    @inline(__always)
    public func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        pthread_mutex_lock(m)
        defer { pthread_mutex_unlock(m) }
        return try body()
    }
}
