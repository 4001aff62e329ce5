import CofferKeychain
import CofferProtocol
import CofferSystem
import Logging

/// When the keybag locks: on request, after idle time, on SIGUSR1 (session lock) with a grace
/// period announced to subscribers; and how fast failed unlocks may be retried.
final class LockController: @unchecked Sendable {
    // @unchecked Sendable: mutable state is guarded by `mutex`.
    private let mutex = Lock()
    /// Serialises unlock attempts so the backoff bounds the guessing rate across connections.
    let unlockGate = Lock()
    private let keychain: Keychain
    private let idleSeconds: Double
    private let graceSeconds: Double
    private let logger: Logger
    private let broadcast: @Sendable (LockEvent) -> Void
    private var lastActivity = Threads.monotonicSeconds()
    private var lockDeadline: Double? = nil
    private var failures = 0
    private var retryNotBefore = 0.0

    init(keychain: Keychain, idleSeconds: Double, graceSeconds: Double, logger: Logger,
         broadcast: @escaping @Sendable (LockEvent) -> Void) {
        self.keychain = keychain
        self.idleSeconds = idleSeconds
        self.graceSeconds = graceSeconds
        self.logger = logger
        self.broadcast = broadcast
    }

    /// Notes client activity (resets the idle timer).
    func touch() { mutex.withLock { lastActivity = Threads.monotonicSeconds() } }

    /// Starts a graceful lock: subscribers get `willLock`, keys are wiped after the grace period.
    /// Nothing happens when no passcode is set (nothing would protect the keys) or already locked.
    func requestLock(reason: String) {
        guard keychain.keybag.isPasscodeSet, keychain.keybag.state == .unlocked else { return }
        let started: Bool = mutex.withLock {
            guard lockDeadline == nil else { return false }
            lockDeadline = Threads.monotonicSeconds() + graceSeconds
            return true
        }
        guard started else { return }
        logger.info("locking in \(graceSeconds) s", metadata: ["reason": "\(reason)"])
        broadcast(.willLock(graceMillis: UInt32(min(graceSeconds * 1000, Double(UInt32.max)))))
        if graceSeconds <= 0 { lockNow(reason: reason) }
    }

    /// Locks immediately (an explicit `coffer lock`, or the end of a grace period).
    func lockNow(reason: String) {
        mutex.withLock { lockDeadline = nil }
        let wasUnlocked = keychain.keybag.state == .unlocked
        keychain.lock()
        if wasUnlocked {
            logger.info("locked", metadata: ["reason": "\(reason)"])
            broadcast(.locked)
        }
    }

    /// After a successful unlock: cancels a pending lock, resets the backoff, tells subscribers.
    func didUnlock() {
        mutex.withLock {
            lockDeadline = nil
            failures = 0
            retryNotBefore = 0
            lastActivity = Threads.monotonicSeconds()
        }
        broadcast(.unlocked)
    }

    /// Waits out the backoff for the next unlock attempt (call holding ``unlockGate``).
    func waitForRetryWindow() {
        let wait = mutex.withLock { retryNotBefore - Threads.monotonicSeconds() }
        if wait > 0 { Threads.sleep(seconds: wait) }
    }

    /// Records a failed attempt: from the third failure on, each doubles the wait (1 s, 2 s, 4 s … 60 s).
    func recordFailure() {
        let (n, delay): (Int, Double) = mutex.withLock {
            failures += 1
            let d = failures < 3 ? 0 : min(Double(1 << min(failures - 3, 6)), 60)
            retryNotBefore = Threads.monotonicSeconds() + d
            return (failures, d)
        }
        logger.warning("failed unlock attempt", metadata: ["failures": "\(n)", "next-attempt-delay-s": "\(delay)"])
    }

    /// Called periodically: ends grace periods and starts idle locks.
    func tick() {
        let now = Threads.monotonicSeconds()
        let (due, idle): (Bool, Bool) = mutex.withLock {
            let due = lockDeadline.map { now >= $0 } ?? false
            let idle = idleSeconds > 0 && lockDeadline == nil && now - lastActivity >= idleSeconds
            return (due, idle)
        }
        if due { lockNow(reason: "grace period over") }
        if idle { requestLock(reason: "idle") }
    }
}
