import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferPAM
import CofferSystem
import Logging

/// Checks a passcode against the user's login password: PAM in the agent, a stub in tests.
protocol PasscodeVerifier: Sendable {
    /// Returns if `passcode` is `user`'s password; throws (with a reason for the log, never the passcode) if not.
    func verify(user: String, passcode: SecureBytes) throws(PasscodeRejected)
}

/// Why a passcode verifier refused (for the log; names no passcode).
struct PasscodeRejected: Error, CustomStringConvertible {
    let description: String
}

extension PAMAuthenticator: PasscodeVerifier {
    func verify(user: String, passcode: SecureBytes) throws(PasscodeRejected) {
        do { try authenticate(user: user, passcode: passcode) } catch { throw PasscodeRejected(description: "\(error)") }
    }
}

/// How long the next unlock attempt must wait, as a pure value: failures in, delay out.
///
/// The first two failures cost nothing (a typo, a stale password); from the third on each doubles
/// the wait: 1 s, 2 s, 4 s … 60 s at most. A success resets it.
struct RetryThrottle: Sendable, Equatable {
    /// Failed attempts since the last success.
    private(set) var failures = 0

    /// Failures that cost no wait.
    static let freeFailures = 2
    /// The longest wait.
    static let maximumDelay = 60.0

    /// Seconds the attempt after `failures` consecutive failures must wait.
    static func delay(afterFailures failures: Int) -> Double {
        guard failures > freeFailures else { return 0 }
        return min(Double(1 << min(failures - freeFailures - 1, 6)), maximumDelay)
    }

    /// Seconds the next attempt must wait.
    var delay: Double { Self.delay(afterFailures: failures) }

    /// Counts a failure; returns the wait it imposes on the next attempt.
    mutating func recordFailure() -> Double {
        failures += 1
        return delay
    }

    /// A success: the next attempt waits for nothing.
    mutating func recordSuccess() { failures = 0 }
}

/// Unlock and passcode set/change: the verifier (PAM) first, then the keybag, one attempt at a time
/// across all connections, each waiting out the ``RetryThrottle`` of the failures before it.
///
/// The gate is a mutex held for a whole attempt (the backoff wait, PAM, Argon2id): attempts are
/// serialised, so the backoff bounds the guessing rate across connections. Lock order: the gate, then
/// the keychain, then the keybag. Nothing else in the agent takes the gate.
final class UnlockService: Sendable {
    private let keychain: Keychain
    private let verifier: any PasscodeVerifier
    private let userName: String
    private let kdfPolicy: KDFPolicy
    private let clock: any MonotonicClock
    private let logger: Logger
    /// The throttle and when the next attempt may start; held for a whole attempt.
    private let gate: Protected<Attempts>

    private struct Attempts {
        var throttle = RetryThrottle()
        var notBefore = 0.0
    }

    init(keychain: Keychain, verifier: any PasscodeVerifier, userName: String, kdfPolicy: KDFPolicy,
         clock: any MonotonicClock, logger: Logger) {
        self.keychain = keychain
        self.verifier = verifier
        self.userName = userName
        self.kdfPolicy = kdfPolicy
        self.clock = clock
        self.logger = logger
        gate = Protected(Attempts())
    }

    /// Failed attempts since the last success.
    var failures: Int { gate.withLock { $0.throttle.failures } }

    /// Unlocks: the verifier, then the keybag; a wrong passcode at either is the same errSecAuthFailed.
    func unlock(_ passcode: SecureBytes) throws(SecError) {
        guard keychain.status.passcodeSet else {
            throw .notAvailable("no passcode is set; set one with 'coffer passcode set'")
        }
        try attempt { () throws(SecError) in
            do {
                try verifier.verify(user: userName, passcode: passcode)
            } catch {
                logger.notice("PAM refused the passcode", metadata: ["pam": "\(error)"])
                throw .authFailed("authentication failed")
            }
            do throws(SecError) {
                try keychain.unlock(passcode: passcode)
            } catch where error.status == .authFailed {
                throw .authFailed("authentication failed")
            } catch {
                // Not a wrong passcode (an I/O error finishing a migration or a key rotation): no failed
                // attempt is counted, and the caller learns what went wrong.
                logger.error("unlock failed", metadata: ["status": "\(error.status.name)", "reason": "\(error.message)"])
                keychain.logMigrations(to: logger)
                throw error
            }
        }
        keychain.logMigrations(to: logger)
        logger.info("unlocked")
    }

    /// First set: the new passcode must pass the verifier. Change: the current one must open the
    /// keybag and the new one must pass the verifier (the keybag passcode follows the login password).
    func setPasscode(current: SecureBytes, new: SecureBytes) throws(SecError) {
        guard new.count > 0 else { throw .param("the new passcode is empty") }
        let isSet = keychain.status.passcodeSet
        if isSet && current.count == 0 { throw .authFailed("the current passcode is required") }
        if !isSet && current.count > 0 { throw .param("no passcode is set yet; leave the current passcode empty") }
        try attempt { () throws(SecError) in
            do {
                try verifier.verify(user: userName, passcode: new)
            } catch {
                logger.notice("PAM refused the new passcode", metadata: ["pam": "\(error)"])
                throw .authFailed("the new passcode was not accepted by PAM (it must be your login password)")
            }
            try keychain.setPasscode(current: isSet ? current : nil, new: new, kdf: kdfPolicy)
        }
        keychain.logMigrations(to: logger)
        logger.info(isSet ? "passcode changed" : "passcode set")
    }

    /// AUTHORIZE: the user's passcode, checked by the verifier (PAM) alone, with the same throttle as
    /// unlock (a guess here is a guess at the login password); the keybag is not touched.
    func authorize(_ passcode: SecureBytes) throws(SecError) {
        try attempt { () throws(SecError) in
            do {
                try verifier.verify(user: userName, passcode: passcode)
            } catch {
                logger.notice("PAM refused the passcode given to authorize another access group", metadata: ["pam": "\(error)"])
                throw .authFailed("authentication failed")
            }
        }
    }

    /// Runs one attempt holding the gate, after waiting out the backoff. An errSecAuthFailed from `body`
    /// counts a failure; success resets the throttle; any other error counts nothing.
    private func attempt(_ body: () throws(SecError) -> Void) throws(SecError) {
        var failure: SecError? = nil
        gate.withLock { a in
            let wait = a.notBefore - clock.now()
            if wait > 0 { clock.sleep(seconds: wait) }
            do throws(SecError) {
                try body()
                a.throttle.recordSuccess()
                a.notBefore = 0
            } catch {
                failure = error
                guard error.status == .authFailed else { return }
                let delay = a.throttle.recordFailure()
                a.notBefore = clock.now() + delay
                logger.warning("failed unlock attempt",
                               metadata: ["failures": "\(a.throttle.failures)", "next-attempt-delay-s": "\(delay)"])
            }
        }
        if let failure { throw failure }
    }
}

extension Keychain {
    /// Logs what the keychain migrated since the last call (counts only, never values).
    func logMigrations(to logger: Logger) {
        for line in takeMigrationReport() { logger.notice("migrated", metadata: ["what": "\(line)"]) }
    }
}
