/// Rate limit for repeated log lines: at most one per key per `interval` seconds.
package final class LogThrottle: Sendable {
    private let last = Protected<[String: (at: Double, suppressed: Int)]>([:])
    package let interval: Double

    package init(interval: Double) { self.interval = interval }

    /// Nil when a line for `key` went out less than `interval` ago (this one is counted and left
    /// out); otherwise how many were left out since the last line for `key`.
    package func admit(_ key: String) -> Int? {
        let now = Threads.monotonicSeconds()
        return last.withLock { last in
            if var entry = last[key], now - entry.at < interval {
                entry.suppressed += 1
                last[key] = entry
                return nil
            }
            let left = last[key]?.suppressed ?? 0
            last[key] = (now, 0)
            return left
        }
    }
}
