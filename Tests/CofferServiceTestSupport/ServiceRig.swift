package import CofferAudit
import CofferCrypto
package import CofferKeybag
package import CofferKeychain
package import CofferModel
package import CofferPolicy
package import CofferService
package import CofferSystem
package import CofferTestSupport
import Glibc
import Logging

/// Argon2id at libsodium's minimum: these tests exercise the agent's logic, not the KDF.
package let cheapKDF = KDFPolicy.fixed(KDFParameters(opsLimit: 1, memLimit: UInt64(Argon2id.minimumMemory)))

/// The service core in-process, composed as `cofferd` composes it (``KeychainService/compose``): a
/// real keychain in a temporary directory, a fake clock, a stub passcode verifier, a fake (or given)
/// biometric sensor, the audit log, and the lock events the schedule broadcasts.
package final class ServiceRig {
    package static let passcode = "correct horse"
    package let dir = TemporaryDirectory("coffer-service")
    package let keychain: Keychain
    package let clock = FakeClock()
    package let verifier = StubVerifier(accepting: ServiceRig.passcode)
    package let events = EventLog()
    package let audit: AuditLog
    package let service: KeychainService
    /// The fake sensor (a rig made with a real one still has one, unused).
    package let sensor: FakeSensor
    /// Terminal sessions whose leader the test made exit (every other session counts as live).
    package let endedSessions = Protected(Set<CallerIdentity.LoginSession>())
    /// Pids of processes the test made exit (every other process counts as live).
    package let exitedProcesses = Protected(Set<Int32>())
    /// The process the rig's callers are (this one unless told otherwise).
    package let process: (pid: Int32, uid: UInt32, executable: String?)

    package var schedule: LockSchedule { service.schedule }
    package var unlocking: UnlockService { service.unlocking }
    package var gate: AccessGate { service.gate }
    package var authenticator: Authenticator { service.authenticator }

    package init(passcodeSet: Bool = true, idleSeconds: UInt32 = 0, graceSeconds: Double = 10, policy: AccessPolicy = AccessPolicy(),
                 sensor: FakeSensor = FakeSensor(), using realSensor: (any BiometricSensor)? = nil,
                 process: (pid: Int32, uid: UInt32, executable: String?)? = nil,
                 passcodeVerifier: (any PasscodeVerifier)? = nil, userName: String = "tester") throws {
        self.sensor = sensor
        self.process = process ?? (getpid(), getuid(), ThisProcess.executablePath())
        keychain = try Keychain(directory: dir.path, applicationPasswordKDF: KDFParameters(opsLimit: 1, memLimit: UInt64(Argon2id.minimumMemory)),
                                applicationPasswordDelays: AttemptSchedule.standard.delays, clock: clock, lockingStateDirectory: false)
        if passcodeSet { try keychain.setPasscode(current: nil, new: secret(Self.passcode), kdf: cheapKDF) }
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        audit = AuditLog(directory: dir.path)
        var settings = ServiceSettings(policy: policy, audit: audit, userName: userName, kdfPolicy: cheapKDF)
        settings.attemptsFile = dir.file("attempts")
        settings.idleLockSeconds = idleSeconds
        settings.lockGraceSeconds = graceSeconds
        let (events, endedSessions, exitedProcesses) = (self.events, self.endedSessions, self.exitedProcesses)
        service = KeychainService.compose(keychain: keychain, verifier: passcodeVerifier ?? verifier, sensor: realSensor ?? sensor, settings: settings,
                                          clock: clock, wallClock: clock, logger: logger,
                                          sessionIsLive: { !endedSessions.withLock { $0 }.contains($0) },
                                          processIsLive: { pid, _ in !exitedProcesses.withLock { $0 }.contains(pid) },
                                          onEvent: { events.record($0) })
    }

    /// This process as an unsigned caller (what it is to a real agent without manifests).
    package var unsignedCaller: CallerIdentity {
        CallerIdentity(pid: process.pid, uid: process.uid,
                       establishedBy: .unsigned(executablePath: process.executable ?? "", reason: .noMatchingManifest), accessGroups: [])
    }

    /// A signed caller with `groups` (default first), as a verified manifest would make it.
    /// With a session id, the caller is in that terminal session, whose leader started at tick
    /// `leaderStart` (another start time is another session with the same id).
    package func signedCaller(_ app: String, _ groups: [String], sessionID: Int32? = nil, leaderStart: UInt64 = 4242) -> CallerIdentity {
        CallerIdentity(pid: process.pid, uid: process.uid, establishedBy: .signedManifest(appID: app), accessGroups: groups,
                       executable: "/opt/\(app)/bin/app",
                       session: sessionID.map { CallerIdentity.LoginSession(id: $0, leaderStartTime: leaderStart, auditSessionID: nil) })
    }
}
