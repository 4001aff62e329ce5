import CofferCrypto
package import CofferKeychain
package import CofferModel
package import CofferPolicy
package import CofferSystem
import Glibc
package import Logging

/// The biometric sensor as the agent sees it: the plugin host's biometric plugin in the agent, a
/// fake in tests. Lockout counting is the agent's (``Authenticator``), not the sensor's.
package protocol BiometricSensor: Sendable {
    /// Whether a sensor answers, whether a finger is enrolled, and the enrolled set's domain state.
    func state() -> BiometryState
    /// Waits for a finger until `timeoutSeconds` (or ``cancel(_:)`` with the same `id`): a match, a
    /// failed match, or why there was neither. `feedback` receives "try again"-style messages.
    func evaluate(id: UInt64, reason: String, app: String, timeoutSeconds: Double,
                  feedback: @escaping @Sendable (String) -> Void) -> BiometricOutcome
    /// Stops evaluation `id` (it returns `.cancelled`), also if it has not started yet.
    func cancel(_ id: UInt64)
    /// The authenticator's name (`biometric-emulator`; empty: none).
    var name: String { get }
    /// A control command (`enroll NAME`, `remove NAME`, `present NAME`, `status`): its status code
    /// (0 success) and reply text.
    func control(_ command: String, _ arguments: [String]) throws(SecError) -> (code: Int32, text: String)
    /// Requests sent to the sensor's process so far (the plugin host's round trips: STATE, EVALUATE,
    /// CONTROL), for the tests and the benchmark.
    var roundTrips: Int { get }
}

/// One biometric evaluation's outcome.
package enum BiometricOutcome: Sendable, Equatable {
    /// A match, with the enrolled set's domain state read as it was made (the plugin host's RESULT
    /// carries it); nil if the sensor did not say (the agent then asks it).
    case match(domainState: [UInt8]? = nil)
    case noMatch
    /// Cancelled or timed out.
    case cancelled
    /// The sensor could not evaluate (gone, busy, crashed).
    case unavailable(LAError)
}

/// No biometric sensor configured.
package struct NoBiometricSensor: BiometricSensor {
    package init() {}
    package func state() -> BiometryState { .unavailable }
    package func evaluate(id: UInt64, reason: String, app: String, timeoutSeconds: Double,
                  feedback: @escaping @Sendable (String) -> Void) -> BiometricOutcome {
        .unavailable(LAError(.biometryNotAvailable, "no biometric authenticator is configured"))
    }
    package func cancel(_ id: UInt64) {}
    package var name: String { "" }
    package var roundTrips: Int { 0 }
    package func control(_ command: String, _ arguments: [String]) throws(SecError) -> (code: Int32, text: String) {
        throw .notAvailable("no biometric authenticator is configured (biometry = none in the agent's configuration)")
    }
}

/// How the agent reaches the person behind a request: the native protocol's AUTH_NEEDED to the
/// client and its AUTH_RESPONSE back (`ConnectionAuthChannel` in CofferNativeFrontEnd), an agent-side prompter
/// for front ends whose clients cannot prompt, a script in tests.
package protocol AuthChannel {
    /// Sends `request` (AUTH_NEEDED) to the client.
    func ask(_ request: AuthenticationRequest)
    /// Waits for the client's answer, returning `.stopped` as soon as `stop()` is true (checked whenever
    /// `wake` becomes readable, and at least every second) and `.gone` if the client went away or broke
    /// the conversation.
    func awaitAnswer(stop: () -> Bool, wake: Int32, deadline: Double) -> ChannelEvent
    /// Sends AUTH_FEEDBACK (something to show the person; `kind` says whether an answer is due).
    func feedback(_ text: String, kind: AuthFeedbackKind)
}

/// What ``AuthChannel/awaitAnswer(stop:deadline:)`` saw.
package enum ChannelEvent {
    case answer(AuthenticationAnswer)
    case stopped
    case timedOut
    case gone
}

/// Runs the conversation an operation on protected items (or a LocalAuthentication evaluation) needs:
/// plans with ``AuthenticationPlanner`` (the seeds' table), asks the client, checks the passcode through
/// PAM (``UnlockService/check(_:)``, under the attempt schedule), waits for the biometric sensor, counts
/// failed matches into a lockout only the passcode lifts, and returns the ``AuthorizationContext`` the
/// keychain then checks. Never holds a class key.
package final class Authenticator: Sendable {
    package let sensor: any BiometricSensor
    private let unlocking: UnlockService
    private let keychain: Keychain
    private let clock: any MonotonicClock
    private let logger: Logger
    private let lockout = Protected(BiometricLockout())
    /// Counts locks: reused authentications of an earlier generation are void.
    private let gate: AccessGate
    /// How long a person has to authenticate before the request fails (systemCancel).
    package let timeoutSeconds: Double
    /// Most wrong passcodes one request accepts before errSecAuthFailed.
    package static let passcodeAttempts = 3

    package init(sensor: any BiometricSensor, unlocking: UnlockService, keychain: Keychain, gate: AccessGate, clock: any MonotonicClock,
         logger: Logger, timeoutSeconds: Double = 120) {
        self.sensor = sensor
        self.gate = gate
        self.unlocking = unlocking
        self.keychain = keychain
        self.clock = clock
        self.logger = logger
        self.timeoutSeconds = timeoutSeconds
    }

    /// The sensor's state with the agent's lockout applied (one STATE round trip to the plugin host).
    package var biometry: BiometryState { withLockout(sensor.state()) }

    /// `state` with the agent's current lockout (no round trip): what an authentication round uses
    /// after it read the sensor once.
    private func withLockout(_ state: BiometryState) -> BiometryState {
        var s = state
        s.lockedOut = lockout.withLock { $0.isLockedOut }
        return s
    }

    /// The current lock generation (reuse is void across a lock).
    package var lockGeneration: Int { gate.lockGeneration }

    /// The authorization for an operation on items whose access controls are `rules`: reused if the
    /// session holds a live one that satisfies them, else obtained from the person. Throws the SecItem
    /// form of the LocalAuthentication failure (cancel -128, failure -25293, no UI -25308, …).
    package func authorize(rules: [AccessControl], context caller: inout CallerContext, channel: (any AuthChannel)?, what: String) throws(SecError) -> AuthorizationContext {
        let now = clock.now()
        let reused = caller.reusableAuthorization(now: now, generation: lockGeneration)
        var context = reused ?? .none
        let deadline = now + timeoutSeconds
        // The reuse window runs from the person's authentication: only a new passcode or finger starts
        // it afresh. Reusing it, or adding an application password to it, keeps its end (else one
        // touch would last as long as the app keeps asking).
        var personNow = false
        // The sensor is read once for the whole round: the planner, the offer and the evaluation's
        // start all use this reading (the lockout is the agent's own and is re-read for free), and a
        // match brings its own domain state.
        let sensed = sensor.state()
        while true {
            switch AuthenticationPlanner.next(rules: rules, established: context, biometry: withLockout(sensed),
                                              passcodeSet: keychain.status.passcodeSet) {
            case .satisfied:
                if personNow || reused == nil {
                    caller.recordAuthorization(context, now: clock.now(), generation: lockGeneration)
                } else if context != reused {
                    caller.updateReusedAuthorization(context)
                }
                return context
            case .fail(let e):
                throw e.secError
            case .ask(let methods):
                let before = context
                do {
                    try obtain(methods, into: &context, context: &caller, channel: channel, prompt: prompt(caller, what), deadline: deadline,
                               sensed: sensed)
                } catch {
                    throw error.secError
                }
                if (context.passcodeVerified && !before.passcodeVerified) || (context.biometryVerified && !before.biometryVerified) {
                    personNow = true
                }
            }
        }
    }

    /// LocalAuthentication's evaluatePolicy: one successful method of `policy`.
    package func evaluate(_ policy: LAPolicy, reason: String, context caller: inout CallerContext, channel: (any AuthChannel)?) throws(LAError) {
        let methods: AuthenticationMethods
        let sensed = sensor.state()
        switch AuthenticationPlanner.methods(for: policy, biometry: withLockout(sensed), passcodeSet: keychain.status.passcodeSet) {
        case .success(let m): methods = m
        case .failure(let e): throw e
        }
        var context = AuthorizationContext.none
        let text = "\(Self.appName(caller.caller)) wants to authenticate you: \(reason)"
        try obtain(methods, into: &context, context: &caller, channel: channel, prompt: text, deadline: clock.now() + timeoutSeconds,
                   sensed: sensed, biometryOnly: policy == .deviceOwnerAuthenticationWithBiometrics)
        // The evaluation covers the conversation's later item requests for its reuse window, as an LAContext
        // passed in kSecUseAuthenticationContext carries its evaluation into them (issue #46).
        caller.recordAuthorization(context, now: clock.now(), generation: lockGeneration)
    }

    /// What `canEvaluatePolicy` answers for `caller` (no person involved): the same methods
    /// `evaluatePolicy` would offer it, so a sandboxed app is not told the passcode is available.
    package func canEvaluate(_ policy: LAPolicy, caller: CallerIdentity) -> LAError? {
        switch AuthenticationPlanner.methods(for: policy, biometry: biometry, passcodeSet: keychain.status.passcodeSet) {
        case .failure(let e): return e
        case .success(let methods):
            do { _ = try usable(methods, by: caller) } catch { return error }
            return nil
        }
    }

    /// `offered` less what `caller` may not use. A sandboxed app never tries the passcode
    /// (AccessPolicy.mayTryPasscode): every wrong try would count toward the unlock throttle and
    /// erase-after, and it would be an oracle for the login password.
    private func usable(_ offered: AuthenticationMethods, by caller: CallerIdentity) throws(LAError) -> AuthenticationMethods {
        var methods = offered
        if methods.contains(.passcode) && !gate.policy.mayTryPasscode(caller) {
            methods.remove(.passcode)
            guard !methods.isEmpty else {
                throw LAError(.passcodeNotSet, "a sandboxed app cannot authenticate you with the passcode, and no other way is available")
            }
        }
        return methods
    }

    /// The name a prompt shows for `caller`.
    package static func appName(_ caller: CallerIdentity) -> String {
        caller.appID ?? caller.executable.map { String($0.split(separator: "/").last ?? Substring($0)) } ?? "pid \(caller.pid)"
    }

    /// How the agent knows who the caller is, for the person deciding whether to answer its dialog
    /// (issue #43): "signed app" (a trusted manifest pins its executable), "Flatpak app" (sandboxed,
    /// named by its sandbox), or "unsigned program PATH: why" (nothing vouches for it).
    package static func identityDescription(_ caller: CallerIdentity) -> String {
        switch caller.establishedBy {
        case .signedManifest: "signed app: a trusted manifest pins its executable"
        case .flatpak: "Flatpak app, named by its sandbox"
        case .unsigned(let path, let reason): "unsigned program \(path.isEmpty ? "(unknown executable)" : path): \(reason)"
        }
    }

    private func prompt(_ caller: CallerContext, _ what: String) -> String {
        let base = "\(Self.appName(caller.caller)) wants to \(what)"
        return caller.authOptions.operationPrompt.isEmpty ? base : base + ": " + caller.authOptions.operationPrompt
    }

    /// One round with the person: adds the method that succeeded to `context`. `sensed` is the
    /// sensor's state read once for the round.
    private func obtain(_ offered: AuthenticationMethods, into context: inout AuthorizationContext, context caller: inout CallerContext,
                        channel: (any AuthChannel)?, prompt: String, deadline: Double, sensed: BiometryState,
                        biometryOnly: Bool = false) throws(LAError) {
        var biometry: BiometryState { withLockout(sensed) }
        // The passcode is not offered to a sandboxed app, and one it gives in advance or in an
        // answer is not tried.
        let methods = try usable(offered, by: caller.caller)
        // A passcode given in advance (LAContext.setCredential) is tried once, without asking.
        if methods.contains(.passcode), let preset = caller.takePresetPasscode() {
            if try verify(preset) {
                context.passcodeVerified = true
                return
            }
            throw LAError(.authenticationFailed, "the passcode given with the request was not accepted")
        }
        // The application password: given in advance, or asked for. Only the item's cryptography can
        // tell whether it is right (the keychain then fails with errSecAuthFailed).
        if methods.contains(.applicationPassword), let preset = caller.authOptions.applicationPassword {
            context.applicationPassword = preset
            return
        }
        guard !caller.authOptions.noUserInterface, let channel else {
            throw LAError(.notInteractive, "authentication is needed and the client asked for no user interface")
        }
        // The sensor starts before AUTH_NEEDED goes out ("the agent is already waiting for a finger"): a
        // touch the client makes on reading it finds this evaluation running (its feedback waits in the
        // evaluation until the loop below shows it, after AUTH_NEEDED).
        var evaluation: BiometricEvaluation? = methods.contains(.biometry) && biometry.usable
            ? startEvaluation(prompt, caller.caller, channel) : nil
        defer { evaluation?.stop() }
        channel.ask(AuthenticationRequest(methods: methods, app: Self.appName(caller.caller), prompt: prompt,
                                          identity: Self.identityDescription(caller.caller)))
        var wrongPasscodes = 0
        while true {
            let event = channel.awaitAnswer(stop: { (evaluation?.isDone ?? false) || (evaluation?.hasFeedback ?? false) },
                                            wake: evaluation?.wakeDescriptor ?? -1, deadline: deadline)
            switch event {
            case .stopped:
                // The sensor's own messages ("try again", "finger not centred") go to the person as they come.
                for text in evaluation?.takeFeedback() ?? [] { channel.feedback(text, kind: .notice) }
                guard let outcome = evaluation?.outcome else { continue }
                let stoppedHere = evaluation?.wasStopped ?? false
                evaluation = nil
                switch outcome {
                case .match(let domainState):
                    // Checked again as the match arrives, in the same critical section: an evaluation that
                    // started before misses elsewhere locked biometry out must not get around the lockout.
                    let accepted = lockout.withLock { l -> Bool in
                        guard !l.isLockedOut else { return false }
                        l.recordMatch()
                        return true
                    }
                    guard accepted else {
                        logger.notice("a biometric match arrived while biometry is locked out: refused", metadata: ["caller": "\(caller.caller)"])
                        try Self.passcodeAfterLockout(methods, biometryOnly: biometryOnly, channel)
                        continue
                    }
                    context.biometryVerified = true
                    context.biometryDomainState = domainState ?? sensor.state().domainState
                    return
                case .noMatch:
                    let lockedNow = lockout.withLock { $0.recordFailure() }
                    logger.notice("biometric match failed", metadata: ["caller": "\(caller.caller)", "lockout": "\(lockedNow)"])
                    if lockedNow || biometry.lockedOut {
                        try Self.passcodeAfterLockout(methods, biometryOnly: biometryOnly, channel)
                    } else {
                        // The sensor waits again before the client hears "try again" (its next touch finds it).
                        evaluation = startEvaluation(prompt, caller.caller, channel)
                        channel.feedback("No match. Try again.", kind: .noMatch)
                    }
                case .cancelled:
                    if clock.now() >= deadline { throw LAError(.systemCancel, "nobody authenticated in time") }
                    if !methods.contains(.passcode) || biometryOnly { throw LAError(.systemCancel, "the biometric evaluation ended") }
                    if stoppedHere {
                        // Stopped while a wrong passcode was checked (its feedback answered that event):
                        // the sensor goes on.
                        if methods.contains(.biometry), biometry.usable { evaluation = startEvaluation(prompt, caller.caller, channel) }
                    } else {
                        // The sensor ended the evaluation itself: only the passcode is left, and the client is told.
                        channel.feedback("The sensor stopped: type your passcode.", kind: .passcodeOnly)
                    }
                case .unavailable(let e):
                    guard methods.contains(.passcode) && !biometryOnly else { throw e }
                    channel.feedback("Biometry is not available: type your passcode.", kind: .passcodeOnly)
                }
            case .answer(.passcode(let p)):
                guard methods.contains(.passcode) && !biometryOnly else {
                    throw LAError(.userFallback, methods.contains(.biometry) || biometryOnly
                                  ? "a passcode was given where only biometry is accepted"
                                  : "a passcode was given where only the item's application password is accepted")
                }
                evaluation?.stop()
                if try verify(p) {
                    context.passcodeVerified = true
                    return
                }
                wrongPasscodes += 1
                // The dialog ends when the request's attempts are used, or when the attempt schedule
                // makes the next one wait (asking again then would only be refused); either way the
                // person learns how many attempts are left before a wait.
                if wrongPasscodes >= Self.passcodeAttempts || unlocking.retryAfter > 0 {
                    throw LAError(.authenticationFailed, unlocking.wrongPasscodeRefusal)
                }
                channel.feedback(unlocking.wrongPasscodeFeedback, kind: .wrongPasscode)
                if evaluation?.isDone ?? false, methods.contains(.biometry), biometry.usable {
                    evaluation = startEvaluation(prompt, caller.caller, channel)
                }
            case .answer(.applicationPassword(let p)):
                guard methods.contains(.applicationPassword) else {
                    throw LAError(.authenticationFailed, "an application password was given where none was asked for")
                }
                context.applicationPassword = p
                return
            case .answer(.waitForBiometry):
                if evaluation == nil { throw LAError(.userCancel, "nothing to wait for: biometry is not in use") }
            case .answer(.fallback):
                evaluation?.stop()
                evaluation = nil
                guard methods.contains(.passcode) && !biometryOnly else { throw LAError(.userFallback, "the person asked for a password") }
            case .answer(.cancel), .gone:
                throw LAError(.userCancel, "authentication was cancelled")
            case .timedOut:
                throw LAError(.systemCancel, "nobody authenticated in time")
            }
        }
    }

    /// Biometry is locked out: the round goes on with the passcode if it may use one, else fails.
    private static func passcodeAfterLockout(_ methods: AuthenticationMethods, biometryOnly: Bool, _ channel: any AuthChannel) throws(LAError) {
        guard methods.contains(.passcode) && !biometryOnly else {
            throw LAError(.biometryLockout, "too many failed matches: biometry is locked out until you authenticate with your passcode")
        }
        channel.feedback("Too many failed matches: biometry is locked out. Type your passcode.", kind: .passcodeOnly)
    }

    /// Checks a passcode through PAM (under the attempt schedule); a success lifts a biometric lockout.
    /// An attempt the schedule refuses before it runs ends the request (authenticationFailed, saying
    /// how long to wait): no answer can succeed before then, so asking again would only mislead.
    private func verify(_ passcode: SecureBytes) throws(LAError) -> Bool {
        switch unlocking.check(passcode) {
        case .accepted:
            lockout.withLock { $0.recordPasscode() }
            return true
        case .wrong:
            return false
        case .tooSoon(let refusal):
            throw LAError(.authenticationFailed, refusal.message)
        }
    }

    private func startEvaluation(_ prompt: String, _ caller: CallerIdentity, _ channel: any AuthChannel) -> BiometricEvaluation {
        let e = BiometricEvaluation(sensor: sensor)
        let remaining = timeoutSeconds
        let app = Self.appName(caller)
        e.start(reason: prompt, app: app, timeoutSeconds: remaining)
        return e
    }
}

/// One biometric evaluation running on its own thread, so the connection thread can wait for the
/// client at the same time.
package final class BiometricEvaluation: Sendable {
    private let sensor: any BiometricSensor
    private let result = Protected<BiometricOutcome?>(nil)
    private let stopped = Protected(false)
    /// This evaluation's id (for ``BiometricSensor/cancel(_:)``).
    package let id: UInt64
    private static let ids = Protected<UInt64>(0)

    /// Readable once the outcome is in (a pipe the evaluation thread writes to), so the connection
    /// thread waiting for the client wakes at once.
    private let wake: (read: Int32, write: Int32)

    package init(sensor: any BiometricSensor) {
        self.sensor = sensor
        id = Self.ids.withLock { $0 += 1; return $0 }
        // Close-on-exec (spawned children close every descriptor but their own anyway: close_range in
        // the shim), and non-blocking: a full pipe is readable already, an empty one is drained.
        if let pipe = try? DescriptorPair.pipe("the biometric wake pipe") {
            try? pipe.first.setNonBlocking(true)
            try? pipe.second.setNonBlocking(true)
            let (read, write) = pipe.release()
            wake = (read, write)
        } else {
            wake = (-1, -1)
        }
    }

    deinit {
        if wake.read >= 0 { close(wake.read) }
        if wake.write >= 0 { close(wake.write) }
    }

    /// See ``wake``.
    package var wakeDescriptor: Int32 { wake.read }

    /// The sensor's messages not yet shown (bounded: a chatty plugin cannot fill the agent's memory).
    private let feedback = Protected([String]())

    /// How many evaluations run in this agent now (started, not yet ended): a touch of the emulator that
    /// finds none waiting in the plugin while one is starting waits for it (``KeychainService/presentFinger(_:)``).
    package static var running: Int { runningCount.withLock { $0 } }
    private static let runningCount = Protected(0)

    package func start(reason: String, app: String, timeoutSeconds: Double) {
        let id = self.id
        Self.runningCount.withLock { $0 += 1 }
        let started = Threads.detach { [self] in
            let outcome = sensor.evaluate(id: id, reason: reason, app: app, timeoutSeconds: timeoutSeconds) { [self] text in
                let added = feedback.withLock { f -> Bool in
                    guard f.count < 16 else { return false }
                    f.append(String(text.prefix(200)))
                    return true
                }
                if added { wakeUp() }
            }
            result.withLock { $0 = outcome }
            result.broadcast()
            Self.runningCount.withLock { $0 -= 1 }
            wakeUp()
        }
        if !started {
            result.withLock { $0 = .unavailable(LAError(.biometryNotAvailable, "cannot start an evaluation")) }
            Self.runningCount.withLock { $0 -= 1 }
        }
    }

    /// Makes ``wakeDescriptor`` readable (one byte; a full pipe is readable already).
    private func wakeUp() {
        guard wake.write >= 0 else { return }
        _ = Syscall.result { var b: UInt8 = 1; return write(wake.write, &b, 1) }
    }

    package var isDone: Bool { result.withLock { $0 != nil } }
    /// True if the sensor said something not yet shown.
    package var hasFeedback: Bool { feedback.withLock { !$0.isEmpty } }
    /// The sensor's messages so far (and drains the wake pipe).
    package func takeFeedback() -> [String] {
        var b = [UInt8](repeating: 0, count: 64)
        while wake.read >= 0, Syscall.result({ read(wake.read, &b, b.count) }).value > 0 {}
        return feedback.withLock { f in defer { f = [] }; return f }
    }
    package var outcome: BiometricOutcome? { result.withLock { $0 } }

    /// True once ``stop()`` was called (the agent, not the sensor, ended it).
    package var wasStopped: Bool { stopped.withLock { $0 } }

    /// Cancels a running evaluation (once), and waits (at most ``stopWaitSeconds``) until the sensor has
    /// ended it: the request's answer goes out only then, so the client's next request never starts an
    /// evaluation while this one still waits in the plugin for a touch (which would take it, and lose it).
    package func stop() {
        let first = stopped.withLock { s in defer { s = true }; return !s }
        guard first && !isDone else { return }
        sensor.cancel(id)
        _ = result.withLock(waitingUntil: { $0 != nil }, timeout: Self.stopWaitSeconds) { _ in () }
    }

    /// The longest ``stop()`` waits for the sensor to end a cancelled evaluation: long enough for a
    /// loaded machine (2 s was not: a busy 2-core machine let a cancelled evaluation outlive it and
    /// take the next request's touch), short enough that a hung plugin host delays one answer only.
    package static let stopWaitSeconds = 10.0
}
