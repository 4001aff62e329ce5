import CofferAgentPrompt
import CofferModel
import CofferPrompt
import CofferService
import CofferSystem
import Glibc

/// The agent's prompter as the configuration chooses it: which pinentry, on which display.
extension AgentPromptChannel {
    /// The channel `configuration` asks for (its ``AgentConfiguration/pinentryChoice``), its dialog on
    /// the person's login session (``promptDisplay(_:loginctl:)``). Fails when nobody can be asked: no
    /// pinentry, or no display the dialog may appear on. `failed` is told when the pinentry cannot be
    /// started or breaks off during a dialog, with the program's path.
    static func open(configuration: AgentConfiguration, clock: any MonotonicClock, loginctl: String = LoginSessions.loginctl,
                     failed: (@Sendable (PinentryFailure, String) -> Void)? = nil) -> Result<AgentPromptChannel, PromptUnavailable> {
        let choice = configuration.pinentryChoice
        guard let program = choice.program else { return .failure(.noPinentry(choice.reason)) }
        switch promptDisplay(configuration, loginctl: loginctl) {
        case .failure(let why): return .failure(.noDisplay(why))
        case .success(let display):
            var told: (@Sendable (PinentryFailure) -> Void)? = nil
            if let failed { told = { why in failed(why, program) } }
            return .success(AgentPromptChannel(program: program, environment: PinentryEnvironment.current(on: display), clock: clock,
                                               timeoutSeconds: configuration.authenticationTimeoutSeconds, failed: told))
        }
    }

    /// Where the agent's dialogs appear: the display `prompt-display` names if the configuration has
    /// one, else the agent's user's active, local, graphical login session as systemd-logind reports
    /// it now (read with `loginctl`). Never the display of the agent's environment, the user manager's
    /// or a client's: any process of the user can set those.
    static func promptDisplay(_ configuration: AgentConfiguration,
                              loginctl: String = LoginSessions.loginctl) -> Result<PromptDisplay, LoginSessions.LookupError> {
        if let configured = configuration.promptDisplay { return .success(configured) }
        return LoginSessions.promptDisplay(uid: getuid(), loginctl: loginctl)
    }

    /// What PROMPTER answers (`coffer status`): the pinentry `configuration` chooses and why, and
    /// where its dialogs appear now (or why nowhere).
    static func report(configuration: AgentConfiguration, loginctl: String = LoginSessions.loginctl) -> PrompterReply {
        let choice = configuration.pinentryChoice
        switch promptDisplay(configuration, loginctl: loginctl) {
        case .success(let display):
            return PrompterReply(program: choice.program, reason: choice.reason, hasDisplay: true, display: display.description)
        case .failure(let why):
            return PrompterReply(program: choice.program, reason: choice.reason, hasDisplay: false,
                                 display: "\(why); prompt-display = DISPLAY in cofferd.conf names one")
        }
    }
}
