import Glibc

/// Detached POSIX threads for blocking work (one per agent connection, the signal waiter, timers).
package enum Threads {
    private final class Box { let body: () -> Void; init(_ b: @escaping () -> Void) { body = b } }

    /// Starts `body` on a new detached thread; false if the system refused (thread limit).
    @discardableResult
    package static func detach(stackBytes: Int = 512 << 10, _ body: @escaping @Sendable () -> Void) -> Bool {
        var attr = pthread_attr_t()
        unsafe pthread_attr_init(&attr)
        defer { unsafe pthread_attr_destroy(&attr) }
        unsafe pthread_attr_setdetachstate(&attr, Int32(PTHREAD_CREATE_DETACHED))
        unsafe pthread_attr_setstacksize(&attr, stackBytes)
        let box = unsafe Unmanaged.passRetained(Box(body)).toOpaque()
        var tid = pthread_t()
        let rc = unsafe pthread_create(&tid, &attr, { raw in
            let b = unsafe Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue()
            b.body()
            return nil
        }, unsafe box)
        if rc != 0 { unsafe Unmanaged<Box>.fromOpaque(box).release() }
        return rc == 0
    }

    /// Sleeps for `seconds` (fractions allowed), resuming after signals: the wait is for an absolute
    /// monotonic deadline, so a call retried after EINTR sleeps only the time left.
    package static func sleep(seconds: Double) {
        var now = timespec()
        unsafe clock_gettime(CLOCK_MONOTONIC, &now)
        let whole = Int(seconds), nanos = now.tv_nsec + Int((seconds - Double(whole)) * 1e9)
        var deadline = timespec(tv_sec: now.tv_sec + whole + nanos / 1_000_000_000, tv_nsec: nanos % 1_000_000_000)
        try? Syscall.returningErrorNumber("clock_nanosleep", "sleep") {
            unsafe clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, nil)
        }
    }

    /// Monotonic seconds.
    package static func monotonicSeconds() -> Double {
        var ts = timespec()
        unsafe clock_gettime(CLOCK_MONOTONIC, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}
