import Glibc

/// A bare pthread mutex, for the few places that guard no Swift state of their own (a C library's
/// global, a write order). State shared between threads belongs in a ``Protected`` instead. (Not
/// called `Lock`: in this code base "lock" means the keybag's.)
@safe package final class PThreadMutex: @unchecked Sendable {
    // @unchecked Sendable: the only stored property is the mutex itself, heap-allocated so that it
    // never moves, and used only through pthread calls, which are thread-safe.
    private let m: UnsafeMutablePointer<pthread_mutex_t>

    /// A new, unlocked mutex.
    package init() {
        unsafe m = .allocate(capacity: 1)
        unsafe m.initialize(to: pthread_mutex_t())
        unsafe pthread_mutex_init(m, nil)
    }

    deinit {
        unsafe pthread_mutex_destroy(m)
        unsafe m.deallocate()
    }

    /// Runs `body` holding the mutex.
    @inline(__always)
    package func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        unsafe pthread_mutex_lock(m)
        defer { unsafe pthread_mutex_unlock(m) }
        return try body()
    }

    /// Runs `body` holding the mutex if it is free right now; nil (without waiting) if it is held.
    @inline(__always)
    package func tryWithLock<R>(_ body: () -> R) -> R? {
        guard unsafe pthread_mutex_trylock(m) == 0 else { return nil }
        defer { unsafe pthread_mutex_unlock(m) }
        return body()
    }
}
