package import CofferModel
import CofferService
package import CofferPrompt
package import CofferSystem
import Glibc

/// Why the agent cannot ask the person itself.
package enum PromptUnavailable: Error, Sendable, Equatable, CustomStringConvertible {
    /// No pinentry: `pinentry = none`, or none installed that the default search takes (the reason).
    case noPinentry(String)
    /// No display the dialog may appear on: logind reports no local graphical session of the user
    /// (or cannot be asked), and the configuration names no `prompt-display`.
    case noDisplay(LoginSessions.LookupError)

    package var description: String {
        switch self {
        case .noPinentry(let why): "no pinentry: \(why)"
        case .noDisplay(let why): "no display to show the dialog on: \(why); prompt-display = DISPLAY in cofferd.conf names one"
        }
    }

    /// The error a request that needed the person gets.
    package var error: SecError { SecError(.interactionNotAllowed, "nobody can be asked: \(description)") }
}

/// The person reached by the agent itself, through the user's pinentry: the ``AuthChannel`` for
/// front ends whose clients cannot prompt (the Secret Service bridge, the ssh-agent socket). The
/// dialog names the calling app as the agent identified it (``AuthenticationRequest/app``), never
/// as the client describes itself, and appears on the person's login session as logind reports it
/// (or the configured `prompt-display`), never on a display a process of the user chose. One
/// channel serves one request: the pinentry closes when the channel goes (or at ``end()``).
///
/// It never hangs the request: the prompter's hard deadline (``AgentConfiguration/authenticationTimeoutSeconds``)
/// and the request's own deadline both end the wait, a pinentry that does not answer is killed, and
/// one that cannot start, exits, crashes or writes garbage ends the request at once as if the
/// client went away (userCancel), and the agent logs why (a warning naming the pinentry). The answer (a passcode, an application password) arrives in
/// secure memory; nothing secret goes into the pinentry's arguments or environment.
package final class AgentPromptChannel: AuthChannel {
    private let prompter: PinentryPrompter
    private let clock: any MonotonicClock
    /// Why the last wait ended without a person's answer (nil: it did not).
    private(set) var failure: PinentryFailure? = nil
    /// Told each such failure as it happens (the agent logs it: the request itself only says cancelled).
    private let failed: (@Sendable (PinentryFailure) -> Void)?

    /// `program`: the pinentry; `environment`: its environment (``PinentryEnvironment``); `clock`:
    /// the clock the request's deadlines are on; `timeoutSeconds`: the prompter's hard deadline;
    /// `failed`: told why, when the pinentry could not be started or broke off (the log's line).
    package init(program: String, environment: [String], clock: any MonotonicClock, timeoutSeconds: Double, replyTimeout: Double = 10,
                 failed: (@Sendable (PinentryFailure) -> Void)? = nil) {
        prompter = PinentryPrompter(program: program, environment: environment, timeoutSeconds: timeoutSeconds, replyTimeout: replyTimeout)
        self.clock = clock
        self.failed = failed
    }

    func ask(_ request: AuthenticationRequest) { prompter.ask(request) }

    func awaitAnswer(stop: () -> Bool, wake: Int32, deadline: Double) -> ChannelEvent {
        switch prompter.await(stop: stop, wake: wake, within: deadline - clock.now()) {
        case .answer(let answer): return .answer(answer)
        case .stopped: return .stopped
        case .timedOut: return .timedOut
        case .failed(let why):
            failure = why
            failed?(why)
            return .gone
        }
    }

    func feedback(_ text: String, kind: AuthFeedbackKind) { prompter.feedback(text, kind: kind) }

    /// Tells the person why the request failed (`error`'s message: how long the attempt schedule
    /// makes them wait, too many wrong passcodes), as the request ends: the person who typed into the
    /// agent's dialog has no client that could show it. Bounded like every wait; the pinentry goes.
    func tell(_ error: LAError, app: String) { prompter.tell(error.message, app: app) }

    /// Asks the person to allow an operation (a CONFIRM dialog saying `description`, titled with
    /// `app` as the agent identified it), within the prompter's deadline; the dialog ends at once if
    /// the client's socket `client` is hung up. The pinentry goes before this returns.
    func confirm(_ description: String, app: String, client: Int32) -> PinentryPrompter.ConfirmationEvent {
        prompter.confirm(description, app: app, hangup: client)
    }

    /// The request ended: the pinentry goes.
    func end() { prompter.end() }
}

/// The agent's prompter as the core's ``ConfirmationChannel`` (the signature witness's dialog): the
/// dialog ends at once if the client's socket `client` hangs up.
package struct AgentConfirmation: ConfirmationChannel {
    let channel: AgentPromptChannel
    let client: Int32

    package init(channel: AgentPromptChannel, client: Int32) {
        self.channel = channel
        self.client = client
    }

    func confirm(_ description: String, app: String) -> ConfirmationOutcome {
        switch channel.confirm(description, app: app, client: client) {
        case .allowed: .allowed
        case .refused: .refused
        case .hungUp: .clientGone
        case .timedOut: .timedOut
        case .failed(let why): .failed("\(why)")
        }
    }

    func end() { channel.end() }
}
