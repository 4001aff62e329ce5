package import CofferCrypto
package import CofferKeybag
package import CofferKeychain
package import CofferModel
package import CofferPAM
package import CofferSystem
import Glibc
package import Logging

/// Checks a passcode against the user's login password: PAM in the agent, a stub in tests.
package protocol PasscodeVerifier: Sendable {
    /// Returns if `passcode` is `user`'s password; throws (with a reason for the log, never the passcode) if not.
    func verify(user: String, passcode: SecureBytes) throws(PasscodeRejected)
}

/// Why a passcode verifier refused (for the log; names no passcode).
package struct PasscodeRejected: Error, CustomStringConvertible {
    package let description: String
    package init(description: String) { self.description = description }
}

extension PAMAuthenticator: PasscodeVerifier {
    package func verify(user: String, passcode: SecureBytes) throws(PasscodeRejected) {
        do { try authenticate(user: user, passcode: passcode) } catch { throw PasscodeRejected(description: "\(error)") }
    }
}

/// How long the next passcode attempt must wait, as a pure value: iOS's schedule by default
/// (attempts 1–4: no wait; 5: 1 min; 6: 5 min; 7 and 8: 15 min; 9 and later: 1 h), and optionally
/// erasing everything after a number of failures in a row. Configurable, so tests can use seconds.
package struct AttemptSchedule: Sendable, Equatable {
    /// `delays[k - 1]`: seconds the attempt after the k-th failure in a row must wait (the last
    /// entry holds for every later one).
    package var delays: [Double]
    /// Destroy the keybag after this many failures in a row (nil: never; off by default).
    package var eraseAfter: Int?

    package init(delays: [Double], eraseAfter: Int?) {
        self.delays = delays
        self.eraseAfter = eraseAfter
    }

    package static let standard = AttemptSchedule(delays: ApplicationPasswordAttempts.standardDelays, eraseAfter: nil)
    /// What `erase-after = on` means.
    package static let defaultEraseAfter = 10

    /// Seconds the attempt after `failures` failures in a row waits.
    package func delay(afterFailures failures: Int) -> Double {
        guard failures > 0, !delays.isEmpty else { return 0 }
        return delays[min(failures, delays.count) - 1]
    }

    /// After `failures` failures in a row: how many attempts may still be made at once, and the wait
    /// of the attempt after them (nil: the schedule never makes anyone wait).
    package func attemptsBeforeWait(afterFailures failures: Int) -> (attempts: Int, wait: Double)? {
        var n = 0
        while delay(afterFailures: failures + n) == 0 {
            // Past the schedule's end every later attempt has the last entry's delay.
            if failures + n > delays.count { return nil }
            n += 1
        }
        return (n, delay(afterFailures: failures + n))
    }

    /// After a wrong passcode left `failures` failures in a row: how many attempts are left before a
    /// wait and how long it is, and how many before everything is erased ("2 attempts left before a
    /// wait of 1 min"; empty when the schedule has neither). Issue #43: three mistakes in one dialog
    /// must not silently use three of the four free attempts.
    package func attemptsNotice(afterFailures failures: Int) -> String {
        var parts: [String] = []
        if let (left, wait) = attemptsBeforeWait(afterFailures: failures) {
            let waiting = Self.step(wait)
            parts.append(left == 0 ? "the next attempt must wait \(waiting)"
                         : "\(left) attempt\(left == 1 ? "" : "s") left before a wait of \(waiting)")
        }
        if let eraseAfter, eraseAfter > failures {
            let left = eraseAfter - failures
            parts.append("\(left) more wrong passcode\(left == 1 ? " erases" : "s erase") the keychain")
        }
        return parts.joined(separator: "; ")
    }

    /// A step of the schedule as a person says it: "30 s", "1 min", "15 min", "1 h".
    static func step(_ seconds: Double) -> String {
        let s = Int(seconds.rounded(.up))
        if s >= 3600 && s % 3600 == 0 { return "\(s / 3600) h" }
        if s >= 60 && s % 60 == 0 { return "\(s / 60) min" }
        return ApplicationPasswordAttempts.duration(seconds)
    }

    /// The dialog's line after a wrong passcode when it asks again: "Wrong passcode. Try again (NOTICE)."
    package func wrongPasscodeFeedback(afterFailures failures: Int) -> String {
        let notice = attemptsNotice(afterFailures: failures)
        return notice.isEmpty ? "Wrong passcode. Try again." : "Wrong passcode. Try again (\(notice))."
    }
}

/// Failed passcode attempts in a row, as persisted in the state directory (`attempts`): survives a
/// restart and a kill, because each attempt is written down, and fsynced, as failed *before* the
/// passcode is checked (a success then resets it).
package struct FailedAttempts: Sendable, Equatable {
    package var failures: Int
    /// Wall-clock seconds of the last failure (0: none).
    package var lastFailure: Double

    package static let none = FailedAttempts(failures: 0, lastFailure: 0)

    /// The file's text: `coffer attempts v1 FAILURES LAST\n`.
    package var encoded: [UInt8] { Array("coffer attempts v1 \(failures) \(lastFailure)\n".utf8) }

    /// Reads the file: none if it is missing; a damaged file counts as many failures as the schedule
    /// knows, just now (fail closed: damaging the file must not earn attempts).
    package static func read(_ path: String, schedule: AttemptSchedule, now: Double) -> FailedAttempts {
        let bytes: [UInt8]
        do { bytes = try Files.read(path, maxBytes: 256) } catch {
            return error.errno == ENOENT ? .none : FailedAttempts(failures: max(schedule.delays.count, 1), lastFailure: now)
        }
        let words = String(decoding: bytes, as: UTF8.self).split(whereSeparator: { $0 == " " || $0 == "\n" })
        guard words.count == 5, words[0] == "coffer", words[1] == "attempts", words[2] == "v1",
              let n = Int(words[3]), n >= 0, let t = Double(words[4]), t.isFinite else {
            return FailedAttempts(failures: max(schedule.delays.count, 1), lastFailure: now)
        }
        return FailedAttempts(failures: n, lastFailure: t)
    }
}

/// Unlock, passcode set/change and every other passcode check (AUTHORIZE, an item's authentication):
/// the verifier (PAM) first, then the keybag, one attempt at a time across all connections. An attempt
/// made before the ``AttemptSchedule``'s delay has passed is refused at once (errSecAuthFailed, saying
/// when to try again; not counted); otherwise it is recorded as failed in the `attempts` file (fsynced)
/// before it runs, and a success resets the count. With `eraseAfter`, that many failures in a row
/// destroy the keybag (``Keychain/eraseEverything()``) and the agent stops.
///
/// The gate is a mutex held for a whole attempt (PAM, Argon2id): attempts are serialised, so the
/// schedule bounds the guessing rate across connections and restarts. Lock order: the gate, then the
/// keychain, then the keybag. Nothing else in the agent takes the gate.
package final class UnlockService: Sendable {
    private let keychain: Keychain
    private let verifier: any PasscodeVerifier
    private let userName: String
    private let kdfPolicy: KDFPolicy
    /// Wall-clock time (the schedule holds across restarts).
    private let clock: any MonotonicClock
    private let logger: Logger
    private let schedule: AttemptSchedule
    /// Where the failed attempts are kept (nil: memory only).
    private let attemptsFile: String?
    /// Called after `eraseAfter` failures erased everything (the agent stops).
    private let onErase: @Sendable () -> Void
    /// The failed attempts; held for a whole attempt.
    private let gate: Protected<FailedAttempts>

    package init(keychain: Keychain, verifier: any PasscodeVerifier, userName: String, kdfPolicy: KDFPolicy,
         clock: any MonotonicClock, logger: Logger, schedule: AttemptSchedule = .standard, attemptsFile: String? = nil,
         onErase: @escaping @Sendable () -> Void = {}) {
        self.keychain = keychain
        self.verifier = verifier
        self.userName = userName
        self.kdfPolicy = kdfPolicy
        self.clock = clock
        self.logger = logger
        self.schedule = schedule
        self.attemptsFile = attemptsFile
        self.onErase = onErase
        gate = Protected(attemptsFile.map { FailedAttempts.read($0, schedule: schedule, now: clock.now()) } ?? .none)
    }

    /// Failed attempts in a row.
    package var failures: Int { gate.withLock { $0.failures } }

    /// Argon2id settings for backup passwords: the agent's own setting if fixed (tests), else
    /// libsodium's moderate settings.
    package var backupKDF: KDFParameters {
        if case .fixed(let p) = kdfPolicy { return p }
        return KDFParameters(opsLimit: 3, memLimit: 256 << 20)
    }

    /// The login password PAM accepted at an unlock the keybag refused: the password was changed
    /// outside Coffer (root's `passwd USER`, LDAP, a reset). Kept (secure memory, this process only)
    /// until `coffer passcode sync` re-wraps the keybag under it with the old passcode.
    private let pendingSync = Protected<SecureBytes?>(nil)

    /// True while the keybag passcode and the login password differ (see ``sync(oldPasscode:)``).
    package var isOutOfSync: Bool { pendingSync.withLock { $0 != nil } }

    /// What the person is told after the wrong passcode just counted (``AttemptSchedule/wrongPasscodeFeedback(afterFailures:)``).
    package var wrongPasscodeFeedback: String { schedule.wrongPasscodeFeedback(afterFailures: failures) }

    /// The reason a request that ends at a wrong passcode gives: "wrong passcode (NOTICE)".
    package var wrongPasscodeRefusal: String {
        let notice = schedule.attemptsNotice(afterFailures: failures)
        return notice.isEmpty ? "wrong passcode" : "wrong passcode (\(notice))"
    }

    /// Seconds until the next attempt may start (0: now).
    package var retryAfter: Double {
        let now = clock.now()
        return gate.withLock { a in max(0, a.lastFailure + schedule.delay(afterFailures: a.failures) - now) }
    }

    /// Unlocks: the verifier, then the keybag; a wrong passcode at either is the same errSecAuthFailed.
    package func unlock(_ passcode: SecureBytes) throws(SecError) {
        guard keychain.status.passcodeSet else {
            throw .notAvailable("no passcode is set; set one with 'coffer passcode set'")
        }
        var outOfSync = false
        var refused = false
        do {
        try attempt { () throws(SecError) in
            do {
                try verifier.verify(user: userName, passcode: passcode)
            } catch {
                logger.notice("PAM refused the passcode", metadata: ["pam": "\(error)"])
                refused = true
                throw tpmCounted(passcode, .authFailed("authentication failed"))
            }
            do throws(SecError) {
                try keychain.unlock(passcode: passcode)
            } catch where error.status == .authFailed {
                // PAM accepted it as the login password, the keybag did not: the password changed
                // behind Coffer's back. Keep it for the sync; not a guess (PAM vouched for it).
                pendingSync.withLock { $0 = SecureBytes(copying: passcode.withUnsafeBytes { $0 }) }
                logger.warning("the login password does not open the keybag: the passcode is out of sync (coffer passcode sync)")
                outOfSync = true
                return
            } catch {
                // Not a wrong passcode (an I/O error finishing a migration or a key rotation): no failed
                // attempt is counted, and the caller learns what went wrong.
                logger.error("unlock failed", metadata: ["status": "\(error.status.name)", "reason": "\(error.message)"])
                keychain.logMigrations(to: logger)
                throw error
            }
        }
        } catch where refused && error.message != Self.erasedMessage {
            // A wrong passcode: the person learns how many attempts are left before a wait.
            let notice = schedule.attemptsNotice(afterFailures: failures)
            throw notice.isEmpty ? error : SecError(.authFailed, "\(error.message) (\(notice))")
        }
        if outOfSync {
            throw .authFailed("your login password changed outside Coffer and no longer opens the keybag: run 'coffer passcode sync' "
                + "with your previous password (nothing is lost)")
        }
        keychain.logMigrations(to: logger)
        logger.info("unlocked")
    }

    /// With a passcode bound to the TPM, a passcode PAM refused goes to the TPM as well, which counts
    /// it toward its lockout (deleting the `attempts` file then earns no guesses); `refusal`, with the
    /// TPM's lockout named when it is locked out.
    private func tpmCounted(_ passcode: SecureBytes, _ refusal: SecError) -> SecError {
        guard keychain.attemptsCountedByTPM else { return refusal }
        do throws(SecError) {
            try keychain.checkPasscode(passcode)
        } catch where error.status == .notAvailable {
            return SecError(.authFailed, "\(refusal.message); \(error.message)")
        } catch {}
        return refusal
    }

    /// `coffer passcode remove`: the current passcode passes PAM and opens the keybag; then
    /// WhenPasscodeSetThisDeviceOnly items are deleted and everything else is re-sealed under the device key.
    package func removePasscode(current: SecureBytes) throws(SecError) {
        guard keychain.status.passcodeSet else { throw .notAvailable("no passcode is set") }
        guard current.count > 0 else { throw .authFailed("the current passcode is required") }
        try attempt { () throws(SecError) in
            do {
                try verifier.verify(user: userName, passcode: current)
            } catch {
                logger.notice("PAM refused the passcode", metadata: ["pam": "\(error)"])
                throw .authFailed("authentication failed")
            }
            try keychain.removePasscode(current: current)
        }
        keychain.logMigrations(to: logger)
        logger.notice("passcode removed: WhenPasscodeSet items deleted, the other keys now wrapped by the device key")
    }

    /// `coffer escrow unlock`: the escrow secret opens the keybag (counted like a passcode: a wrong
    /// secret is a failed attempt, though guessing 256 bits is hopeless anyway).
    package func unlock(escrowSecret: SecureBytes) throws(SecError) {
        try attempt { () throws(SecError) in try keychain.unlock(escrowSecret: escrowSecret) }
        logger.notice("unlocked with the escrow record")
    }

    /// `coffer escrow revoke`: the record is deleted and the keys rotated (a passcode change to the same
    /// passcode, checked by PAM), so a copy of the record opens nothing.
    package func revokeEscrow(passcode: SecureBytes) throws(SecError) {
        guard keychain.status.passcodeSet else { throw .notAvailable("no passcode is set") }
        try setPasscode(current: passcode, new: passcode)
        keychain.deleteEscrow()
        logger.notice("escrow record revoked; keys rotated")
    }

    /// `coffer passcode sync`: re-wraps the keybag (a passcode change, with its key rotation) from
    /// `oldPasscode` to the login password PAM accepted at the unlock that found them out of sync.
    package func sync(oldPasscode: SecureBytes) throws(SecError) {
        guard let new = pendingSync.withLock({ $0 }) else {
            throw .notAvailable("the passcode is in sync with the login password (nothing to do)")
        }
        try setPasscode(current: oldPasscode, new: new)
        pendingSync.withLock { $0 = nil }
        logger.notice("passcode synced with the login password")
    }

    /// First set: the new passcode must pass the verifier. Change: the current one must open the
    /// keybag and the new one must pass the verifier (the keybag passcode follows the login password).
    package func setPasscode(current: SecureBytes, new: SecureBytes) throws(SecError) {
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
    package func authorize(_ passcode: SecureBytes) throws(SecError) {
        try attempt { () throws(SecError) in try verifyLogin(passcode, given: "to authorize another access group") }
    }

    /// The verifier (PAM) alone; a refusal is errSecAuthFailed (logged with `given`, never the passcode).
    private func verifyLogin(_ passcode: SecureBytes, given: String) throws(SecError) {
        do {
            try verifier.verify(user: userName, passcode: passcode)
        } catch {
            logger.notice("PAM refused the passcode given \(given)", metadata: ["pam": "\(error)"])
            throw .authFailed("authentication failed")
        }
    }

    /// What one passcode check of an authentication (``check(_:)``) came to.
    package enum PasscodeCheck: Equatable {
        case accepted
        /// Tried and refused (counted as a failed attempt).
        case wrong
        /// Not tried: the attempt schedule's delay has not passed (not counted); the error says how
        /// long to wait. Asking the person again cannot help before then.
        case tooSoon(SecError)
    }

    /// A passcode in an item's or LocalAuthentication's conversation: checked as ``authorize(_:)``
    /// checks it, telling an attempt the schedule refused before it ran apart from a wrong passcode.
    package func check(_ passcode: SecureBytes) -> PasscodeCheck {
        do {
            if let early = try attemptUnlessTooSoon({ () throws(SecError) in try verifyLogin(passcode, given: "to authenticate") }) {
                return .tooSoon(early)
            }
            return .accepted
        } catch {
            return .wrong
        }
    }

    /// Runs one attempt holding the gate: refused at once if the schedule's delay has not passed (not
    /// counted); else written down as failed first, then `body` runs; errSecAuthFailed keeps it failed
    /// (and may erase everything), success resets the count, any other error restores the count.
    private func attempt(_ body: () throws(SecError) -> Void) throws(SecError) {
        if let early = try attemptUnlessTooSoon(body) { throw early }
    }

    /// ``attempt(_:)``, returning the refusal of an attempt made before the schedule's delay passed
    /// (errSecAuthFailed saying when to try again) instead of throwing it.
    private func attemptUnlessTooSoon(_ body: () throws(SecError) -> Void) throws(SecError) -> SecError? {
        var failure: SecError? = nil
        var early: SecError? = nil
        var erase = false
        gate.withLock { a in
            let now = clock.now()
            let wait = a.lastFailure + schedule.delay(afterFailures: a.failures) - now
            if wait > 0 {
                early = SecError(.authFailed, "too many failed attempts (\(a.failures)): try again in \(Self.duration(wait))")
                return
            }
            let before = a
            let pending = FailedAttempts(failures: a.failures + 1, lastFailure: now)
            do throws(SecError) {
                try persist(pending)
            } catch {
                failure = error
                return
            }
            a = pending
            do throws(SecError) {
                try body()
                a = .none
                try? persist(.none)
            } catch {
                failure = error
                guard error.status == .authFailed else {
                    // Not a wrong passcode (an I/O error, a migration): nothing to count.
                    a = before
                    try? persist(before)
                    return
                }
                logger.warning("failed passcode attempt", metadata: [
                    "failures": "\(a.failures)", "next-attempt-delay-s": "\(schedule.delay(afterFailures: a.failures))"])
                if let limit = schedule.eraseAfter, a.failures >= limit { erase = true }
            }
        }
        if erase {
            logger.critical("\(schedule.eraseAfter ?? 0) failed passcode attempts in a row: erasing the keybag and every item")
            keychain.eraseEverything()
            if let attemptsFile { unlink(attemptsFile) }
            onErase()
            throw SecError(.authFailed, Self.erasedMessage)
        }
        if let failure { throw failure }
        return early
    }

    /// The refusal of the attempt that erased everything (`erase-after`).
    private static let erasedMessage = "too many failed attempts: the keychain was erased"

    private func persist(_ value: FailedAttempts) throws(SecError) {
        guard let attemptsFile else { return }
        do { try Files.writeAtomically(attemptsFile, value.encoded, mode: 0o600) } catch {
            throw SecError(.io, "cannot record the attempt: \(error)")
        }
    }

    /// "45 s", "5 min", "1 h".
    package static func duration(_ seconds: Double) -> String { ApplicationPasswordAttempts.duration(seconds) }
}

extension Keychain {
    /// Logs what the keychain migrated since the last call (counts only, never values).
    package func logMigrations(to logger: Logger) {
        for line in takeMigrationReport() { logger.notice("migrated", metadata: ["what": "\(line)"]) }
    }
}
