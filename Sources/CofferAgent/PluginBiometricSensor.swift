import CofferCrypto
import CofferModel
import CofferPluginClient
import CofferPluginProtocol
import CofferPolicy
import CofferService
import CofferSystem
import Logging

/// The biometric sensor served by a plugin in the plugin host (`coffer-plugin-host`): the agent never
/// loads plugin code itself. A crash or hang of the plugin fails only the pending evaluation
/// (systemCancel); the host is restarted by ``PluginHost``.
final class PluginBiometricSensor: BiometricSensor {
    let host: PluginHost
    /// The plugin that serves biometry (config key `biometry`).
    let plugin: String
    private let logger: Logger
    /// Our evaluation ids → the host's tickets; ids cancelled before they started.
    private let tickets = Protected((running: [UInt64: EvaluationTicket](), cancelled: Set<UInt64>()))

    init(host: PluginHost, plugin: String, logger: Logger) {
        self.host = host
        self.plugin = plugin
        self.logger = logger
    }

    func state() -> BiometryState {
        do {
            let s = try host.state(plugin: plugin)
            // A plugin that cannot read its enrolment (fprintd absent or stopped) is not available;
            // one that has none to report (unsupported) has nothing enrolled.
            guard s.code == 0 else { return s.code == 4 ? BiometryState(available: true, enrolled: false) : .unavailable }
            return BiometryState(available: true, enrolled: s.enrolledCount > 0, domainState: s.domainState ?? [], enrolledCount: s.enrolledCount)
        } catch {
            return .unavailable
        }
    }

    func evaluate(id: UInt64, reason: String, app: String, timeoutSeconds: Double,
                  feedback: @escaping @Sendable (String) -> Void) -> BiometricOutcome {
        let ticket = host.makeTicket()
        let cancelledEarly = tickets.withLock { t -> Bool in
            if t.cancelled.remove(id) != nil { return true }
            t.running[id] = ticket
            return false
        }
        if cancelledEarly { return .cancelled }
        defer { _ = tickets.withLock { $0.running.removeValue(forKey: id) } }
        let result: EvaluationResult
        do {
            result = try host.evaluate(plugin: plugin, reason: reason, app: app, timeout: timeoutSeconds, ticket: ticket, feedback: feedback)
        } catch {
            logger.warning("the biometric plugin failed; the evaluation is cancelled", metadata: ["plugin": "\(plugin)", "error": "\(error)"])
            return .unavailable(LAError(.systemCancel, "the biometric authenticator failed (\(error))"))
        }
        switch result.code {
        case .success: return .match(domainState: result.domainState)
        case .authenticationFailed: return .noMatch
        case .userCancel, .systemCancel, .userFallback: return .cancelled
        case .biometryNotEnrolled: return .unavailable(LAError(.biometryNotEnrolled, "no finger is enrolled"))
        case .biometryLockout: return .unavailable(LAError(.biometryLockout, "the sensor is locked out"))
        case .passcodeNotSet, .biometryNotAvailable: return .unavailable(LAError(.biometryNotAvailable, "the sensor is not available"))
        }
    }

    func cancel(_ id: UInt64) {
        let ticket: EvaluationTicket? = tickets.withLock { t in
            if let ticket = t.running[id] { return ticket }
            t.cancelled.insert(id)
            return nil
        }
        if let ticket { host.cancel(ticket, reason: .system) }
    }

    var name: String { plugin }

    /// The host's round trips (every plugin's: the passcode plugin's too).
    var roundTrips: Int { host.roundTrips }

    /// `coffer bio …`: a control command of the plugin (its status code and reply text).
    func control(_ command: String, _ arguments: [String]) throws(SecError) -> (code: Int32, text: String) {
        do {
            return try host.control(plugin: plugin, command: command, arguments: arguments)
        } catch {
            throw SecError(.notAvailable, "the biometric authenticator did not answer: \(error)")
        }
    }
}

/// Passcodes checked by the `passcode` plugin in the plugin host (`passcode-verifier = plugin`): PAM
/// and its modules run there, never in the agent. Without a running host every passcode is refused.
struct PluginPasscodeVerifier: PasscodeVerifier {
    let host: PluginHost?
    /// The plugin's name.
    static let plugin = "passcode"

    func verify(user: String, passcode: SecureBytes) throws(PasscodeRejected) {
        guard let host else { throw PasscodeRejected(description: "the plugin host is not running") }
        let result: EvaluationResult
        do {
            result = try host.evaluate(plugin: Self.plugin, reason: "passcode", app: "cofferd", timeout: 30, credential: passcode)
        } catch {
            throw PasscodeRejected(description: "the passcode plugin did not answer: \(error)")
        }
        guard result.code == .success else { throw PasscodeRejected(description: "the passcode plugin refused (\(result.code))") }
    }
}
