package import CofferKeychain
package import CofferModel
package import CofferSystem
package import Logging

/// When the keybag locks: on request, after idle time, and on a session lock (SIGUSR1) after a grace
/// period announced to subscribers. Time comes from an injected clock, so tests advance it.
package final class LockSchedule: Sendable {
    private let keychain: Keychain
    private let idleSeconds: Double
    private let graceSeconds: Double
    private let clock: any MonotonicClock
    private let logger: Logger
    private let broadcast: @Sendable (LockEvent) -> Void
    /// The reuse grants callers hold across connections: a lock ends them all, and the timer those
    /// of sessions and processes that have ended (``CallerSessions/endThoseOfEndedSessions()``).
    package let sessions: CallerSessions
    /// The idle and grace timers. Never held while calling the keychain or broadcasting.
    private let timers: Protected<Timers>

    private struct Timers {
        /// When a request last used the keychain.
        var lastActivity: Double
        /// When a pending (announced) lock takes effect; nil: none pending.
        var lockDeadline: Double? = nil
        /// Requests that use the keychain and have not finished: no idle lock starts while one runs
        /// (a passcode set that ends after the idle time must not see the keys wiped before its own
        /// `unlocked` is announced), and idle time counts from the last one's end.
        var running = 0
        /// Ticks since the grants of gone sessions were last ended.
        var ticksSinceSweep = 0
    }

    /// Every this many ticks (about a second), the grants of sessions and processes that have gone end.
    package static let ticksPerSweep = 4

    package init(keychain: Keychain, idleSeconds: Double, graceSeconds: Double, clock: any MonotonicClock, logger: Logger,
         sessions: CallerSessions, broadcast: @escaping @Sendable (LockEvent) -> Void) {
        self.keychain = keychain
        self.sessions = sessions
        self.idleSeconds = idleSeconds
        self.graceSeconds = graceSeconds
        self.clock = clock
        self.logger = logger
        self.broadcast = broadcast
        timers = Protected(Timers(lastActivity: clock.now()))
    }

    /// Notes client activity (resets the idle timer).
    package func touch() {
        let now = clock.now()
        timers.withLock { $0.lastActivity = now }
    }

    /// A request that uses the keychain starts: activity, and no idle lock until ``endActivity()``.
    package func beginActivity() {
        let now = clock.now()
        timers.withLock { t in
            t.lastActivity = now
            t.running += 1
        }
    }

    /// The request begun by ``beginActivity()`` ended: idle time counts from now.
    package func endActivity() {
        let now = clock.now()
        timers.withLock { t in
            t.lastActivity = now
            t.running = max(0, t.running - 1)
        }
    }

    /// Starts a graceful lock: subscribers get `willLock`, keys are wiped after the grace period.
    /// Nothing happens when no passcode is set (nothing would protect the keys), when not unlocked, or
    /// when a lock is already pending.
    package func requestLock(reason: String) {
        let status = keychain.status
        guard status.passcodeSet, status.lockState == .unlocked else { return }
        let deadline = clock.now() + graceSeconds
        let started: Bool = timers.withLock { t in
            guard t.lockDeadline == nil else { return false }
            t.lockDeadline = deadline
            return true
        }
        guard started else { return }
        logger.info("locking in \(graceSeconds) s", metadata: ["reason": "\(reason)"])
        broadcast(.willLock(graceMillis: UInt32(min(graceSeconds * 1000, Double(UInt32.max)))))
        if graceSeconds <= 0 { lockNow(reason: reason) }
    }

    /// Locks immediately (an explicit `coffer lock`, or the end of a grace period). Subscribers hear
    /// `locked` only if this call locked the keybag (of two concurrent calls, one).
    package func lockNow(reason: String) {
        timers.withLock { $0.lockDeadline = nil }
        guard keychain.lock() else { return }
        sessions.endAll()
        logger.info("locked", metadata: ["reason": "\(reason)"])
        broadcast(.locked)
    }

    /// After a successful unlock or passcode set/change: cancels a pending lock, restarts the idle
    /// timer, tells subscribers.
    package func didUnlock() {
        let now = clock.now()
        timers.withLock { t in
            t.lockDeadline = nil
            t.lastActivity = now
        }
        broadcast(.unlocked)
    }

    /// Tells subscribers of item changes that items changed (an add, update or delete committed, a
    /// sync applied records, a backup restored items), in `groups` when they are known (nil: any
    /// group may have). Which items is never said.
    package func announceItemsChanged(in groups: Set<String>? = nil) { broadcast(.itemsChanged(in: groups)) }

    /// True while an announced lock is pending.
    package var isLockPending: Bool { timers.withLock { $0.lockDeadline != nil } }

    /// Called periodically (the agent's timer thread, every 0.25 s): ends grace periods and starts idle
    /// locks; every ``ticksPerSweep`` ticks, ends the grants of sessions and processes that have ended.
    package func tick() {
        let now = clock.now()
        let (due, idle, sweep): (Bool, Bool, Bool) = timers.withLock { t in
            let due = t.lockDeadline.map { now >= $0 } ?? false
            let idle = idleSeconds > 0 && t.lockDeadline == nil && t.running == 0 && now - t.lastActivity >= idleSeconds
            t.ticksSinceSweep += 1
            let sweep = t.ticksSinceSweep >= Self.ticksPerSweep
            if sweep { t.ticksSinceSweep = 0 }
            return (due, idle, sweep)
        }
        if due { lockNow(reason: "grace period over") }
        if idle { requestLock(reason: "idle") }
        if sweep {
            let ended = sessions.endThoseOfEndedSessions()
            if ended > 0 { logger.debug("reuse grants ended: their session's leader or their process exited", metadata: ["grants": "\(ended)"]) }
        }
    }
}
