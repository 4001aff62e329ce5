@testable import CofferNativeFrontEnd
import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferAudit
import CofferModel
import CofferPolicy
import CofferProtocol
import CofferService
import CofferServiceTestSupport
import CofferSystem
import CofferTestSupport
import Glibc
import Logging

/// The agent's request path without a socket: the service core as ``ServiceRig`` composes it (as
/// `cofferd` does), the native protocol's `Pipeline` on it, and a real peer identity.
final class AgentRig {
    static let passcode = ServiceRig.passcode
    let base: ServiceRig
    let pipeline: Pipeline
    let peer: PeerIdentity
    private let sockets: [Int32]

    var dir: TemporaryDirectory { base.dir }
    var keychain: Keychain { base.keychain }
    var clock: FakeClock { base.clock }
    var verifier: StubVerifier { base.verifier }
    var events: EventLog { base.events }
    var audit: AuditLog { base.audit }
    var sensor: FakeSensor { base.sensor }
    var endedSessions: Protected<Set<CallerIdentity.LoginSession>> { base.endedSessions }
    var schedule: LockSchedule { base.schedule }
    var unlocking: UnlockService { base.unlocking }
    var gate: AccessGate { base.gate }
    var authenticator: Authenticator { base.authenticator }

    /// A rig whose authenticator uses `realSensor` (the plugin host's), not a fake.
    convenience init(realSensor: any BiometricSensor) throws {
        try self.init(sensor: FakeSensor(), using: realSensor)
    }

    /// `passcodeVerifier`: what checks passcodes for `userName` (default: ``verifier``, the stub).
    init(passcodeSet: Bool = true, idleSeconds: UInt32 = 0, graceSeconds: Double = 10, policy: AccessPolicy = AccessPolicy(),
         sensor: FakeSensor = FakeSensor(), using realSensor: (any BiometricSensor)? = nil,
         passcodeVerifier: (any PasscodeVerifier)? = nil, userName: String = "tester") throws {
        // A real peer identity (this process), read from a socket pair as the agent reads a client's.
        var fds: [Int32] = [0, 0]
        precondition(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        sockets = fds
        let peer = try PeerIdentity.of(socket: fds[0])
        self.peer = peer
        base = try ServiceRig(passcodeSet: passcodeSet, idleSeconds: idleSeconds, graceSeconds: graceSeconds, policy: policy,
                              sensor: sensor, using: realSensor, process: (peer.pid, peer.uid, peer.executable),
                              passcodeVerifier: passcodeVerifier, userName: userName)
        pipeline = Pipeline(service: base.service)
    }

    deinit { for fd in sockets { close(fd) } }

    /// This process as an unsigned caller (what it is to a real agent without manifests).
    var unsignedCaller: CallerIdentity { base.unsignedCaller }

    /// A signed caller with `groups` (default first), as a verified manifest would make it.
    func signedCaller(_ app: String, _ groups: [String], sessionID: Int32? = nil, leaderStart: UInt64 = 4242) -> CallerIdentity {
        base.signedCaller(app, groups, sessionID: sessionID, leaderStart: leaderStart)
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


/// The message of an error response (nil for any other response).
func errorMessage(_ r: AgentResponse) -> String? {
    if case .error(let e) = r { return e.message }
    return nil
}
