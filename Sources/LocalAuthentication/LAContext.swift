#if os(Linux)
// LAContext: an authentication session with the agent. Each context has a connection of its own: what it
// evaluates, and the credential it is given, live there, and a SecItem call passed the context (in
// kSecUseAuthenticationContext) runs on that connection, so the evaluation carries into it.
public import Foundation
public import Security
import CofferClient
import CofferCrypto
import CofferModel

/// Apple's LAContext over the agent.
///
/// An evaluation covers later SecItem calls through this context as on Apple platforms: until
/// ``invalidate()`` (or until the keychain locks, which ends every reuse), however long that is; a
/// ``touchIDAuthenticationAllowableReuseDuration`` above 0 bounds it to that many seconds instead (an
/// agent from before the keep-for-the-connection option keeps it 5 minutes). Changing a property that changes what the agent is told (``interactionNotAllowed``,
/// ``localizedReason``, the reuse duration, a credential) after an evaluation ends that reuse.
open class LAContext: NSObject, @unchecked Sendable, SecAuthenticationContext {
    // @unchecked Sendable: the settable properties are guarded by `mutex`; the session has its own lock.
    private let mutex = NSLock()
    private var _localizedReason = ""
    private var _reuse: TimeInterval = 0
    private var _interactionNotAllowed = false
    private var _invalidated = false
    private var _biometryType = LABiometryType.none
    private var _domainState: Data?
    private var _applicationPasswordSet = false

    /// The context's own connection to the agent (opened on first use).
    package let agentSession = AgentSession(keepsReuse: true)

    public override init() { super.init() }

    private func locked<T>(_ body: () -> T) -> T {
        mutex.lock()
        defer { mutex.unlock() }
        return body()
    }

    /// What the prompt says when a SecItem call through this context needs the person and gives no
    /// kSecUseOperationPrompt.
    open var localizedReason: String {
        get { locked { _localizedReason } }
        set { locked { _localizedReason = newValue } }
    }
    /// The title of the fallback button: a pinentry or terminal prompt has none (kept for source compatibility).
    open var localizedFallbackTitle: String?
    /// The title of the cancel button: kept for source compatibility (the pinentry's own is shown).
    open var localizedCancelTitle: String?
    /// How long (seconds, at most 300) an authentication of this context covers its later calls; 0: the agent's
    /// most, 300.
    open var touchIDAuthenticationAllowableReuseDuration: TimeInterval {
        get { locked { _reuse } }
        set { locked { _reuse = max(0, min(newValue, Double(LATouchIDAuthenticationMaximumAllowableReuseDuration))) } }
    }
    /// True: never ask the person; what would need it fails (notInteractive, errSecInteractionNotAllowed).
    open var interactionNotAllowed: Bool {
        get { locked { _interactionNotAllowed } }
        set { locked { _interactionNotAllowed = newValue } }
    }
    /// The biometry the agent offers (set by canEvaluatePolicy and evaluatePolicy).
    open var biometryType: LABiometryType { locked { _biometryType } }
    /// The enrolled fingers' state after a successful evaluation (changes when the set changes); nil before.
    open var evaluatedPolicyDomainState: Data? { locked { _domainState } }
    /// The domain state (Apple's newer form of ``evaluatedPolicyDomainState``).
    open var domainState: LADomainState {
        locked { LADomainState(biometry: LADomainStateBiometry(biometryType: _biometryType, stateHash: _domainState)) }
    }

    package func agentOptions(prompt: String?, noUserInterface: Bool) -> AgentSession.Options {
        locked {
            AgentSession.Options(noUserInterface: noUserInterface || _interactionNotAllowed,
                                 operationPrompt: prompt ?? _localizedReason,
                                 reuseSeconds: _reuse > 0 ? UInt32(_reuse.rounded(.up)) : 0,
                                 keepsForConnection: _reuse == 0)
        }
    }

    /// True if `policy` can be evaluated now; else false and `error` says why (an LAError in LAErrorDomain).
    open func canEvaluatePolicy(_ policy: LAPolicy, error: UnsafeMutablePointer<NSError?>?) -> Bool {
        do {
            try check(policy)
            return true
        } catch let failure {
            error?.pointee = failure as NSError
            return false
        }
    }

    private func check(_ policy: LAPolicy) throws(LAError) {
        guard !locked({ _invalidated }) else { throw LAError(.invalidContext, message: "the context was invalidated") }
        guard let p = policy.coffer else { throw LAError(.watchNotAvailable, message: "there is no watch here") }
        let r: LAResult
        do {
            r = try agentSession.run(options: agentOptions(prompt: nil, noUserInterface: false)) { c throws(SecError) in try c.canEvaluate(p) }
        } catch {
            throw LAError(.biometryNotAvailable, message: "the keychain agent cannot be reached (start it with cofferd)")
        }
        locked { _biometryType = r.biometryType == 1 ? .touchID : .none }
        if let e = r.error { throw LAError(e, r.message) }
    }

    /// Asks the person (the agent's biometric sensor, or the passcode through a pinentry or the terminal) and
    /// calls `reply` on another thread with the outcome.
    open func evaluatePolicy(_ policy: LAPolicy, localizedReason: String, reply: @escaping @Sendable (Bool, (any Error)?) -> Void) {
        Thread.detachNewThread { [self] in
            do {
                try evaluate(policy, localizedReason)
                reply(true, nil)
            } catch {
                reply(false, error)
            }
        }
    }

    /// The async form of ``evaluatePolicy(_:localizedReason:reply:)``: true, or an LAError thrown.
    open func evaluatePolicy(_ policy: LAPolicy, localizedReason: String) async throws -> Bool {
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Bool, any Error>) in
            evaluatePolicy(policy, localizedReason: localizedReason) { ok, error in
                if let error { done.resume(throwing: error) } else { done.resume(returning: ok) }
            }
        }
    }

    private func evaluate(_ policy: LAPolicy, _ reason: String) throws(LAError) {
        guard !locked({ _invalidated }) else { throw LAError(.invalidContext, message: "the context was invalidated") }
        guard let p = policy.coffer else { throw LAError(.watchNotAvailable, message: "there is no watch here") }
        guard !reason.isEmpty else { throw LAError(.authenticationFailed, message: "evaluatePolicy needs a localized reason") }
        let r: LAResult
        do {
            r = try agentSession.run(options: agentOptions(prompt: nil, noUserInterface: false), retry: false) { c throws(SecError) in
                try c.evaluate(p, reason: reason)
            }
        } catch {
            // invalidate() cut the evaluation off: Apple's appCancel.
            if locked({ _invalidated }) { throw LAError(.appCancel, message: "the context was invalidated during the evaluation") }
            throw LAError(error.status == errSecNotAvailable ? .biometryNotAvailable : .systemCancel, message: error.detail)
        }
        locked { _biometryType = r.biometryType == 1 ? .touchID : .none }
        if let e = r.error { throw LAError(e, r.message) }
        locked { _domainState = r.domainState.isEmpty ? nil : Data(r.domainState) }
    }

    /// Evaluates what `accessControl` needs for `operation`: biometry for a biometry-only rule, else the device
    /// owner (biometry or passcode); an application password must have been given with setCredential.
    open func evaluateAccessControl(_ accessControl: SecAccessControl, operation: LAAccessControlOperation, localizedReason: String,
                                    reply: @escaping @Sendable (Bool, (any Error)?) -> Void) {
        let needs = accessControl.authenticationNeeds
        if needs.applicationPassword && !locked({ _applicationPasswordSet }) && !needs.person {
            reply(false, LAError(.authenticationFailed, message: "the access control needs an application password: setCredential"))
            return
        }
        guard needs.person else { reply(true, nil); return }
        evaluatePolicy(needs.biometryOnly ? .deviceOwnerAuthenticationWithBiometrics : .deviceOwnerAuthentication,
                       localizedReason: localizedReason, reply: reply)
    }

    /// The async form of ``evaluateAccessControl(_:operation:localizedReason:reply:)``.
    open func evaluateAccessControl(_ accessControl: SecAccessControl, operation: LAAccessControlOperation,
                                    localizedReason: String) async throws -> Bool {
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Bool, any Error>) in
            evaluateAccessControl(accessControl, operation: operation, localizedReason: localizedReason) { ok, error in
                if let error { done.resume(throwing: error) } else { done.resume(returning: ok) }
            }
        }
    }

    /// Ends the context: its connection closes (the agent forgets its evaluation), an evaluation still
    /// waiting for the person ends with appCancel, later evaluations fail with invalidContext, and a SecItem
    /// call or a signature through the context fails with errSecAuthFailed without asking anyone.
    open func invalidate() {
        locked { _invalidated = true }
        agentSession.invalidate()
    }

    /// Sets (data) or clears (nil) the application password for items whose access control has
    /// .applicationPassword: used to make such an item and to open it. Kept in secure memory; true.
    @discardableResult
    open func setCredential(_ credential: Data?, type: LACredentialType) -> Bool {
        let secret = credential.map { d in d.withUnsafeBytes { SecureBytes(copying: $0) } }
        agentSession.setCredential(passcode: nil, applicationPassword: secret)
        locked { _applicationPasswordSet = secret != nil }
        return true
    }

    /// True if a credential of `type` is set.
    open func isCredentialSet(_ type: LACredentialType) -> Bool { locked { _applicationPasswordSet } }
}

/// The most a context's reuse duration may be (5 minutes), as Apple's.
public let LATouchIDAuthenticationMaximumAllowableReuseDuration: TimeInterval = 300
#endif
