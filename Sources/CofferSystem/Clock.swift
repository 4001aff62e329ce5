import Glibc

/// Monotonic time as the agent's timers see it (idle lock, grace period, attempt schedule), injected so
/// tests can advance time without sleeping (a fake clock whose `sleep` moves `now` forward).
///
/// Not named `Clock`: the standard library has a `Clock` protocol of its own.
package protocol MonotonicClock: Sendable {
    /// Seconds on a monotonic scale (only differences mean anything).
    func now() -> Double
    /// Waits `seconds` (a fake clock advances instead).
    func sleep(seconds: Double)
}

/// The real monotonic clock (`CLOCK_MONOTONIC`, `nanosleep`).
package struct SystemClock: MonotonicClock {
    /// The system clock.
    package init() {}
    package func now() -> Double { Threads.monotonicSeconds() }
    package func sleep(seconds: Double) { Threads.sleep(seconds: seconds) }
}

/// Wall-clock time (`CLOCK_REALTIME`): for attempt delays, which must hold across restarts (a
/// monotonic clock does not).
package struct SystemWallClock: MonotonicClock {
    /// The system's wall clock.
    package init() {}
    package func now() -> Double {
        var ts = timespec()
        unsafe clock_gettime(CLOCK_REALTIME, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
    package func sleep(seconds: Double) { Threads.sleep(seconds: seconds) }
}
