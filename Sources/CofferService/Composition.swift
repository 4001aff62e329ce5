package import CofferAudit
package import CofferKeybag
package import CofferKeychain
package import CofferModel
package import CofferPolicy
package import CofferSystem
import CofferIdentity
package import Logging

/// What a service is made with besides its parts: the settings `cofferd` reads from its configuration
/// and the tests choose.
package struct ServiceSettings: Sendable {
    /// Who may use which access groups.
    package var policy: AccessPolicy
    /// The audit log (nil: none).
    package var audit: AuditLog?
    /// The user whose login password the passcode is.
    package var userName: String
    /// Argon2id settings for the keybag's passcode.
    package var kdfPolicy: KDFPolicy
    /// The schedule of failed passcode attempts, and where they are persisted.
    package var attemptSchedule: AttemptSchedule = .standard
    package var attemptsFile: String? = nil
    /// Idle lock timeout (0: never) and the warning before a lock.
    package var idleLockSeconds: UInt32 = 0
    package var lockGraceSeconds: Double = 10
    /// How long a person has to authenticate.
    package var authenticationTimeoutSeconds: Double = 120
    /// The version ``KeychainService/status()`` reports.
    package var agentVersion: String = CofferVersion.current

    package init(policy: AccessPolicy, audit: AuditLog?, userName: String, kdfPolicy: KDFPolicy) {
        self.policy = policy
        self.audit = audit
        self.userName = userName
        self.kdfPolicy = kdfPolicy
    }
}

extension KeychainService {
    /// The one composition of the service core, for `cofferd` and for the in-process tests alike: the
    /// gate, the lock schedule (every lock event goes to the gate, then to `onEvent`), the unlock
    /// service and the authenticator around `keychain`, `verifier` and `sensor`. `clock` drives the
    /// schedules and reuse windows, `wallClock` the persisted attempt schedule.
    package static func compose(keychain: Keychain, verifier: any PasscodeVerifier, sensor: any BiometricSensor,
                                settings: ServiceSettings, clock: any MonotonicClock, wallClock: any MonotonicClock, logger: Logger,
                                sessionIsLive: @escaping @Sendable (CallerIdentity.LoginSession) -> Bool = LoginSessions.isLive,
                                processIsLive: @escaping @Sendable (Int32, UInt64) -> Bool = CallerSessions.processIsLive,
                                onEvent: @escaping @Sendable (LockEvent) -> Void = { _ in },
                                onErase: @escaping @Sendable () -> Void = {}) -> KeychainService {
        let gate = AccessGate(policy: settings.policy, audit: settings.audit, clock: clock, logger: logger, sessionIsLive: sessionIsLive)
        let schedule = LockSchedule(keychain: keychain, idleSeconds: Double(settings.idleLockSeconds), graceSeconds: settings.lockGraceSeconds,
                                    clock: clock, logger: logger,
                                    sessions: CallerSessions(sessionIsLive: sessionIsLive, processIsLive: processIsLive)) { event in
            gate.observe(event)
            onEvent(event)
        }
        let unlocking = UnlockService(keychain: keychain, verifier: verifier, userName: settings.userName, kdfPolicy: settings.kdfPolicy,
                                      clock: wallClock, logger: logger, schedule: settings.attemptSchedule,
                                      attemptsFile: settings.attemptsFile, onErase: onErase)
        let authenticator = Authenticator(sensor: sensor, unlocking: unlocking, keychain: keychain, gate: gate, clock: clock,
                                          logger: logger, timeoutSeconds: settings.authenticationTimeoutSeconds)
        return KeychainService(keychain: keychain, unlocking: unlocking, schedule: schedule, gate: gate, authenticator: authenticator,
                               clock: clock, logger: logger, idleLockSeconds: settings.idleLockSeconds, agentVersion: settings.agentVersion)
    }
}
