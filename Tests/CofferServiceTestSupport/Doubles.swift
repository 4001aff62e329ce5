package import CofferCrypto
package import CofferModel
package import CofferService
package import CofferPolicy
import CofferSystem
import Glibc

// The service core's test doubles, shared by CofferServiceTests and CofferAgentTests: a clock that
// moves when told, a passcode verifier standing in for PAM, a biometric sensor and an authentication
// channel driven by the test, and a log of lock events.

/// A clock that moves only when told to; `sleep` advances it at once and records the wait.
package final class FakeClock: MonotonicClock {
    private let state = Protected((now: 1000.0, sleeps: [Double]()))
    package init() {}
    package func now() -> Double { state.withLock { $0.now } }
    package func sleep(seconds: Double) { state.withLock { $0.now += seconds; $0.sleeps.append(seconds) } }
    package func advance(_ seconds: Double) { state.withLock { $0.now += seconds } }
    /// The waits `sleep` was asked for, oldest first.
    package var sleeps: [Double] { state.withLock { $0.sleeps } }
}


/// Accepts one passcode and refuses every other (stands in for PAM), counting calls.
package final class StubVerifier: PasscodeVerifier, @unchecked Sendable {
    /// The password PAM accepts (a test may change it: the login password changed).
    package var accepted: String {
        get { current.withLock { $0 } }
        set { current.withLock { $0 = newValue } }
    }
    private let current: Protected<String>
    private let calls = Protected(0)
    package init(accepting accepted: String) { current = Protected(accepted) }
    package var callCount: Int { calls.withLock { $0 } }
    package func verify(user: String, passcode: SecureBytes) throws(PasscodeRejected) {
        calls.withLock { $0 += 1 }
        let given = passcode.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        guard given == accepted else { throw PasscodeRejected(description: "stub: refused") }
    }
}


/// Collects broadcast lock events.
package final class EventLog: Sendable {
    private let events = Protected([LockEvent]())
    package init() {}
    package func record(_ e: LockEvent) { events.withLock { $0.append(e) } }
    package var all: [LockEvent] { events.withLock { $0 } }
    package func clear() { events.withLock { $0.removeAll() } }
}


/// A biometric sensor driven by the test: enrolled or not, a domain state, and the outcomes of the
/// next evaluations in order; with none queued, an evaluation waits until cancelled.
package final class FakeSensor: BiometricSensor, @unchecked Sendable {
    private let lock = Protected((available: true, enrolled: true, domainState: [UInt8](repeating: 1, count: 32),
                                  outcomes: [BiometricOutcome](), cancelled: Set<UInt64>(), evaluations: 0, stateReads: 0))
    package init(available: Bool = true, enrolled: Bool = true) {
        lock.withLock { $0.available = available; $0.enrolled = enrolled }
    }
    package func state() -> BiometryState {
        lock.withLock {
            $0.stateReads += 1
            return BiometryState(available: $0.available, enrolled: $0.enrolled, domainState: $0.domainState)
        }
    }
    /// How many times the agent read ``state()`` (a STATE round trip to a real plugin host).
    package var stateReads: Int { lock.withLock { $0.stateReads } }
    /// STATE reads and evaluations, as a plugin host counts its round trips.
    package var roundTrips: Int { lock.withLock { $0.stateReads + $0.evaluations } }
    /// Queues what the next evaluations return.
    package func queue(_ outcomes: BiometricOutcome...) { lock.withLock { $0.outcomes += outcomes } }
    /// A new finger enrolled: the domain state changes.
    package func enrollAnother() { lock.withLock { $0.domainState = (0..<32).map { _ in UInt8.random(in: 0...255) }; $0.enrolled = true } }
    package var evaluations: Int { lock.withLock { $0.evaluations } }
    /// Messages the next evaluation sends before its outcome ("try again").
    package func say(_ messages: String...) { said.withLock { $0 += messages } }
    private let said = Protected([String]())

    /// Evaluation number `n` (1: the first this sensor started) takes no queued outcome: it waits
    /// until ``answer(evaluation:_:)`` (or a cancel), so a test decides when it ends.
    package func hold(evaluation n: Int) { held.withLock { $0[n] = .some(nil) } }
    /// Ends held evaluation `n` with `outcome`.
    package func answer(evaluation n: Int, _ outcome: BiometricOutcome) { held.withLock { $0[n] = .some(outcome) } }
    private let held = Protected([Int: BiometricOutcome?]())
    /// Like ``hold(evaluation:)``, and a cancel does not end it either (a sensor slow to stop): only
    /// ``answer(evaluation:_:)`` does.
    package func holdThroughCancel(evaluation n: Int) { hold(evaluation: n); deaf.withLock { _ = $0.insert(n) } }
    private let deaf = Protected(Set<Int>())

    package func evaluate(id: UInt64, reason: String, app: String, timeoutSeconds: Double,
                  feedback: @escaping @Sendable (String) -> Void) -> BiometricOutcome {
        let number = lock.withLock { $0.evaluations += 1; return $0.evaluations }
        for m in said.withLock({ s in defer { s = [] }; return s }) { feedback(m) }
        for _ in 0..<30_000 {
            let next: BiometricOutcome?? = lock.withLock { s in
                if s.cancelled.contains(id), !deaf.withLock({ $0.contains(number) }) { return .some(.cancelled) }
                if let h = held.withLock({ $0[number] }) { return .some(h) }
                return s.outcomes.isEmpty ? .some(nil) : .some(s.outcomes.removeFirst())
            }
            // A match carries the domain state read with it, as the plugin host's RESULT does.
            if case .match(nil)? = next ?? nil { return .match(domainState: lock.withLock { $0.domainState }) }
            if let outcome = next ?? nil { return outcome }
            usleep(1000)
        }
        return .cancelled
    }
    package func cancel(_ id: UInt64) { lock.withLock { _ = $0.cancelled.insert(id) } }
    package var name: String { "fake-sensor" }
    /// `enroll NAME` changes the domain state (like a real enrolment); `present` queues a match.
    package func control(_ command: String, _ arguments: [String]) throws(SecError) -> (code: Int32, text: String) {
        switch command {
        case "enroll", "remove": enrollAnother(); return (0, "ok")
        case "present": queue(arguments == ["--unknown"] ? .noMatch : .match()); return (0, "ok")
        case "status": return (0, "fake")
        default: return (1, "unknown command")
        }
    }
}


/// The client side of an authentication, scripted: each step answers the next AUTH_NEEDED wait.
package final class ScriptedChannel: AuthChannel {
    package enum Step {
        /// Answer at once.
        case answer(AuthenticationAnswer)
        /// Wait for the agent to stop waiting (the biometric evaluation finished).
        case waitForStop
    }
    package var steps: [Step]
    package private(set) var asked: [AuthenticationRequest] = []
    package private(set) var feedbacks: [String] = []
    /// The kind of each of ``feedbacks``.
    package private(set) var feedbackKinds: [AuthFeedbackKind] = []
    package init(_ steps: [Step]) { self.steps = steps }
    package func ask(_ request: AuthenticationRequest) { asked.append(request) }
    package func feedback(_ text: String, kind: AuthFeedbackKind) { feedbacks.append(text); feedbackKinds.append(kind) }
    package func awaitAnswer(stop: () -> Bool, wake: Int32, deadline: Double) -> ChannelEvent {
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
