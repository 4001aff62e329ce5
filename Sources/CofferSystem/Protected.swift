package import Glibc

/// State owned by its lock: the value is reachable only inside ``withLock(_:)``, holding a pthread
/// mutex (so ThreadSanitizer sees every access, which it does not for `Synchronization.Mutex`).
///
/// A condition variable comes with it, for waiting until the state allows something
/// (``withLock(waitingUntil:timeout:_:)``) and waking the waiters after a change (``broadcast()``).
/// Both pthread objects are heap-allocated: they must not move, and a Swift property's address is
/// not stable.
@safe package final class Protected<State>: @unchecked Sendable {
    // @unchecked Sendable: `state` is only reached through `withLock`, holding `mutex`; this is the one
    // place the "guarded by" rule is written down in code instead of a comment.
    @usableFromInline let mutex: UnsafeMutablePointer<pthread_mutex_t>
    @usableFromInline let cond: UnsafeMutablePointer<pthread_cond_t>
    @usableFromInline var state: State

    /// Takes ownership of `initial`.
    package init(_ initial: sending State) {
        state = initial
        unsafe mutex = .allocate(capacity: 1)
        unsafe mutex.initialize(to: pthread_mutex_t())
        unsafe pthread_mutex_init(mutex, nil)
        unsafe cond = .allocate(capacity: 1)
        unsafe cond.initialize(to: pthread_cond_t())
        var attr = pthread_condattr_t()
        unsafe pthread_condattr_init(&attr)
        unsafe pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)
        unsafe pthread_cond_init(cond, &attr)
        unsafe pthread_condattr_destroy(&attr)
    }

    deinit {
        unsafe pthread_cond_destroy(cond)
        unsafe pthread_mutex_destroy(mutex)
        unsafe cond.deallocate()
        unsafe mutex.deallocate()
    }

    /// Runs `body` with the state, holding the mutex.
    @inlinable @inline(__always)
    package func withLock<R, E: Error>(_ body: (inout State) throws(E) -> R) throws(E) -> R {
        unsafe pthread_mutex_lock(mutex)
        defer { unsafe pthread_mutex_unlock(mutex) }
        return try body(&state)
    }

    /// Runs `body` holding the mutex if it is free right now; nil (without waiting) if it is held.
    @inlinable @inline(__always)
    package func tryWithLock<R>(_ body: (inout State) -> R) -> R? {
        guard unsafe pthread_mutex_trylock(mutex) == 0 else { return nil }
        defer { unsafe pthread_mutex_unlock(mutex) }
        return body(&state)
    }

    /// Waits (releasing the mutex meanwhile) until `ready` holds, then runs `body` holding the mutex;
    /// nil if `timeout` seconds (monotonic; nil: no limit) pass first. Wake waiters with ``broadcast()``
    /// after a change that may make `ready` true.
    package func withLock<R>(waitingUntil ready: (State) -> Bool, timeout: Double?, _ body: (inout State) -> R) -> R? {
        var deadline = timespec()
        if let timeout {
            unsafe clock_gettime(CLOCK_MONOTONIC, &deadline)
            let whole = Int(timeout)
            deadline.tv_sec += whole
            deadline.tv_nsec += Int((timeout - Double(whole)) * 1e9)
            if deadline.tv_nsec >= 1_000_000_000 { deadline.tv_sec += 1; deadline.tv_nsec -= 1_000_000_000 }
        }
        unsafe pthread_mutex_lock(mutex)
        defer { unsafe pthread_mutex_unlock(mutex) }
        while !ready(state) {
            if timeout == nil {
                unsafe pthread_cond_wait(cond, mutex)
            } else if unsafe pthread_cond_timedwait(cond, mutex, &deadline) == ETIMEDOUT && !ready(state) {
                return nil
            }
        }
        return body(&state)
    }

    /// Wakes every thread waiting in ``withLock(waitingUntil:timeout:_:)`` (call after changing the state).
    package func broadcast() { unsafe pthread_cond_broadcast(cond) }
}
