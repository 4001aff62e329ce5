@testable import CofferAgent
import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferAudit
import CofferModel
import CofferPolicy
import CofferProtocol
import CofferSystem
import CofferTestSupport
import Glibc
import Logging


/// Argon2id at libsodium's minimum: these tests exercise the agent's logic, not the KDF.
let cheapKDF = KDFPolicy.fixed(KDFParameters(opsLimit: 1, memLimit: UInt64(Argon2id.minimumMemory)))

/// A clock that moves only when told to; `sleep` advances it at once and records the wait.
final class FakeClock: MonotonicClock {
    private let state = Protected((now: 1000.0, sleeps: [Double]()))
    func now() -> Double { state.withLock { $0.now } }
    func sleep(seconds: Double) { state.withLock { $0.now += seconds; $0.sleeps.append(seconds) } }
    func advance(_ seconds: Double) { state.withLock { $0.now += seconds } }
    /// The waits `sleep` was asked for, oldest first.
    var sleeps: [Double] { state.withLock { $0.sleeps } }
}

/// Accepts one passcode and refuses every other (stands in for PAM), counting calls.
final class StubVerifier: PasscodeVerifier, @unchecked Sendable {
    /// The password PAM accepts (a test may change it: the login password changed).
    var accepted: String {
        get { current.withLock { $0 } }
        set { current.withLock { $0 = newValue } }
    }
    private let current: Protected<String>
    private let calls = Protected(0)
    init(accepting accepted: String) { current = Protected(accepted) }
    var callCount: Int { calls.withLock { $0 } }
    func verify(user: String, passcode: SecureBytes) throws(PasscodeRejected) {
        calls.withLock { $0 += 1 }
        let given = passcode.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        guard given == accepted else { throw PasscodeRejected(description: "stub: refused") }
    }
}

/// Collects broadcast lock events.
final class EventLog: Sendable {
    private let events = Protected([LockEvent]())
    func record(_ e: LockEvent) { events.withLock { $0.append(e) } }
    var all: [LockEvent] { events.withLock { $0 } }
    func clear() { events.withLock { $0.removeAll() } }
}

/// The agent's request path without a socket: a real keychain in a temporary directory, a fake
/// clock, a stub passcode verifier, and the events the schedule broadcasts.
final class AgentRig {
    static let passcode = "correct horse"
    let dir = TemporaryDirectory("coffer-agent")
    let keychain: Keychain
    let clock = FakeClock()
    let verifier = StubVerifier(accepting: AgentRig.passcode)
    let events = EventLog()
    let schedule: LockSchedule
    let unlocking: UnlockService
    let pipeline: Pipeline
    let gate: AccessGate
    let audit: AuditLog
    let peer: PeerIdentity
    private let sockets: [Int32]

    let sensor: FakeSensor
    let authenticator: Authenticator
    /// Terminal sessions whose leader the test made exit (every other session counts as live).
    let endedSessions = Protected(Set<CallerIdentity.LoginSession>())

    /// `passcodeVerifier`: what checks passcodes for `userName` (default: ``verifier``, the stub).
    init(passcodeSet: Bool = true, idleSeconds: Double = 0, graceSeconds: Double = 10, policy: AccessPolicy = AccessPolicy(),
         sensor: FakeSensor = FakeSensor(), passcodeVerifier: (any PasscodeVerifier)? = nil, userName: String = "tester") throws {
        self.sensor = sensor
        keychain = try Keychain(directory: dir.path, applicationPasswordKDF: KDFParameters(opsLimit: 1, memLimit: UInt64(Argon2id.minimumMemory)),
                                applicationPasswordDelays: AttemptSchedule.standard.delays, clock: clock)
        if passcodeSet { try keychain.setPasscode(current: nil, new: secret(Self.passcode), kdf: cheapKDF) }
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let events = self.events
        audit = AuditLog(directory: dir.path)
        let endedSessions = self.endedSessions
        let gate = AccessGate(policy: policy, audit: audit, clock: clock, logger: logger,
                              sessionIsLive: { !endedSessions.withLock { $0 }.contains($0) })
        self.gate = gate
        // As the agent wires it: every lock event goes to the gate too.
        schedule = LockSchedule(keychain: keychain, idleSeconds: idleSeconds, graceSeconds: graceSeconds, clock: clock,
                                logger: logger) { gate.observe($0); events.record($0) }
        unlocking = UnlockService(keychain: keychain, verifier: passcodeVerifier ?? verifier, userName: userName, kdfPolicy: cheapKDF,
                                  clock: clock, logger: logger, attemptsFile: dir.file("attempts"))
        authenticator = Authenticator(sensor: sensor, unlocking: unlocking, keychain: keychain, gate: gate, clock: clock, logger: logger)
        pipeline = Pipeline(keychain: keychain, unlocking: unlocking, schedule: schedule, gate: gate, authenticator: authenticator,
                            clock: clock, logger: logger, idleLockSeconds: UInt32(idleSeconds))
        // A real peer identity (this process), read from a socket pair as the agent reads a client's.
        var fds: [Int32] = [0, 0]
        precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        sockets = fds
        peer = try PeerIdentity.of(socket: fds[0])
    }

    deinit { for fd in sockets { close(fd) } }

    /// This process as an unsigned caller (what it is to a real agent without manifests).
    var unsignedCaller: CallerIdentity {
        CallerIdentity(pid: peer.pid, uid: peer.uid, establishedBy: .unsigned(executablePath: peer.executable ?? "", reason: .noMatchingManifest),
                       accessGroups: [])
    }

    /// A signed caller with `groups` (default first), as a verified manifest would make it.
    /// With a session id, the caller is in that terminal session, whose leader started at tick
    /// `leaderStart` (another start time is another session with the same id).
    func signedCaller(_ app: String, _ groups: [String], sessionID: Int32? = nil, leaderStart: UInt64 = 4242) -> CallerIdentity {
        CallerIdentity(pid: peer.pid, uid: peer.uid, establishedBy: .signedManifest(appID: app), accessGroups: groups,
                       executable: "/opt/\(app)/bin/app",
                       session: sessionID.map { CallerIdentity.LoginSession(id: $0, leaderStartTime: leaderStart, auditSessionID: nil) })
    }

    /// A new session that has not said HELLO (an unsigned caller unless told otherwise).
    func newSession(as caller: CallerIdentity? = nil) -> Session { Session(peer: peer, caller: caller ?? unsignedCaller) }

    /// A session past HELLO.
    func greetedSession(as caller: CallerIdentity? = nil) -> Session {
        var s = newSession(as: caller)
        let r = pipeline.handle(.hello(minVersion: WireFormat.version, maxVersion: WireFormat.version, clientName: "test"), session: &s)
        precondition(s.isGreeted, "HELLO refused: \(r)")
        return s
    }
}

/// The status of an error response (nil for any other response).
func errorStatus(_ r: AgentResponse) -> SecStatus? {
    if case .error(let e) = r { return e.status }
    return nil
}

/// A biometric sensor driven by the test: enrolled or not, a domain state, and the outcomes of the
/// next evaluations in order; with none queued, an evaluation waits until cancelled.
final class FakeSensor: BiometricSensor, @unchecked Sendable {
    private let lock = Protected((available: true, enrolled: true, domainState: [UInt8](repeating: 1, count: 32),
                                  outcomes: [BiometricOutcome](), cancelled: Set<UInt64>(), evaluations: 0))
    init(available: Bool = true, enrolled: Bool = true) {
        lock.withLock { $0.available = available; $0.enrolled = enrolled }
    }
    func state() -> BiometryState {
        lock.withLock { BiometryState(available: $0.available, enrolled: $0.enrolled, domainState: $0.domainState) }
    }
    /// Queues what the next evaluations return.
    func queue(_ outcomes: BiometricOutcome...) { lock.withLock { $0.outcomes += outcomes } }
    /// A new finger enrolled: the domain state changes.
    func enrollAnother() { lock.withLock { $0.domainState = (0..<32).map { _ in UInt8.random(in: 0...255) }; $0.enrolled = true } }
    var evaluations: Int { lock.withLock { $0.evaluations } }
    /// Messages the next evaluation sends before its outcome ("try again").
    func say(_ messages: String...) { said.withLock { $0 += messages } }
    private let said = Protected([String]())

    /// Evaluation number `n` (1: the first this sensor started) takes no queued outcome: it waits
    /// until ``answer(evaluation:_:)`` (or a cancel), so a test decides when it ends.
    func hold(evaluation n: Int) { held.withLock { $0[n] = .some(nil) } }
    /// Ends held evaluation `n` with `outcome`.
    func answer(evaluation n: Int, _ outcome: BiometricOutcome) { held.withLock { $0[n] = .some(outcome) } }
    private let held = Protected([Int: BiometricOutcome?]())
    /// Like ``hold(evaluation:)``, and a cancel does not end it either (a sensor slow to stop): only
    /// ``answer(evaluation:_:)`` does.
    func holdThroughCancel(evaluation n: Int) { hold(evaluation: n); deaf.withLock { _ = $0.insert(n) } }
    private let deaf = Protected(Set<Int>())

    func evaluate(id: UInt64, reason: String, app: String, timeoutSeconds: Double,
                  feedback: @escaping @Sendable (String) -> Void) -> BiometricOutcome {
        let number = lock.withLock { $0.evaluations += 1; return $0.evaluations }
        for m in said.withLock({ s in defer { s = [] }; return s }) { feedback(m) }
        for _ in 0..<30_000 {
            let next: BiometricOutcome?? = lock.withLock { s in
                if s.cancelled.contains(id), !deaf.withLock({ $0.contains(number) }) { return .some(.cancelled) }
                if let h = held.withLock({ $0[number] }) { return .some(h) }
                return s.outcomes.isEmpty ? .some(nil) : .some(s.outcomes.removeFirst())
            }
            if let outcome = next ?? nil { return outcome }
            usleep(1000)
        }
        return .cancelled
    }
    func cancel(_ id: UInt64) { lock.withLock { _ = $0.cancelled.insert(id) } }
    var name: String { "fake-sensor" }
    /// `enroll NAME` changes the domain state (like a real enrolment); `present` queues a match.
    func control(_ command: String, _ arguments: [String]) throws(SecError) -> (code: Int32, text: String) {
        switch command {
        case "enroll", "remove": enrollAnother(); return (0, "ok")
        case "present": queue(arguments == ["--unknown"] ? .noMatch : .match); return (0, "ok")
        case "status": return (0, "fake")
        default: return (1, "unknown command")
        }
    }
}

/// The client side of an authentication, scripted: each step answers the next AUTH_NEEDED wait.
final class ScriptedChannel: AuthChannel {
    enum Step {
        /// Answer at once.
        case answer(AuthenticationAnswer)
        /// Wait for the agent to stop waiting (the biometric evaluation finished).
        case waitForStop
    }
    var steps: [Step]
    private(set) var asked: [AuthenticationRequest] = []
    private(set) var feedbacks: [String] = []
    /// The kind of each of ``feedbacks``.
    private(set) var feedbackKinds: [AuthFeedbackKind] = []
    init(_ steps: [Step]) { self.steps = steps }
    func ask(_ request: AuthenticationRequest) { asked.append(request) }
    func feedback(_ text: String, kind: AuthFeedbackKind) { feedbacks.append(text); feedbackKinds.append(kind) }
    func awaitAnswer(stop: () -> Bool, wake: Int32, deadline: Double) -> ChannelEvent {
        if stop() {
            // The evaluation finished before the agent came to wait: that is the step's stop, so the
            // script stays in step with the outcomes however the threads are scheduled.
            if case .waitForStop? = steps.first { steps.removeFirst() }
            return .stopped
        }
        guard !steps.isEmpty else { return .gone }
        switch steps.removeFirst() {
        case .answer(let a): return .answer(a)
        case .waitForStop:
            // Generous: a sanitizer build on a busy machine can take seconds to start a thread.
            for _ in 0..<30_000 {
                if stop() { return .stopped }
                usleep(1000)
            }
            return .timedOut
        }
    }
}
