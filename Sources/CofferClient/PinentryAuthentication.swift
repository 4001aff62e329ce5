public import CofferModel
import CofferPrompt
import CofferSystem

/// Asks the person through a pinentry program (GnuPG's Assuan pinentry: `pinentry-gnome3`,
/// `pinentry-curses`, …), for clients without a terminal: a desktop app, or the CLI started from one.
/// The conversation is ``CofferPrompt/Pinentry``'s (shared with the agent's own prompter); the
/// program runs with only the display-related environment of this process.
public final class PinentryAuthentication: AuthenticationDelegate {
    private let pinentry: Pinentry

    /// `program`: the pinentry's absolute path.
    public init(program: String) {
        let env = ThisProcess.environment(Pinentry.passedEnvironment).map { "\($0.key)=\($0.value)" }
        pinentry = Pinentry(program: program, environment: env)
    }

    /// How this process can ask the person: its terminal if it has one, else the pinentry
    /// `COFFER_PINENTRY` names, else nobody (requests that need the person then fail with
    /// errSecInteractionNotAllowed at once).
    public static func standard() -> (any AuthenticationDelegate)? {
        if TerminalAuthentication.isAvailable { return TerminalAuthentication() }
        return fromEnvironment()
    }

    /// The pinentry `COFFER_PINENTRY` names (an absolute path), if any.
    public static func fromEnvironment() -> PinentryAuthentication? {
        guard let p = ThisProcess.environment(["COFFER_PINENTRY"])["COFFER_PINENTRY"], p.hasPrefix("/") else { return nil }
        return PinentryAuthentication(program: p)
    }

    public var inputDescriptor: Int32 { pinentry.inputDescriptor }
    public func begin(_ request: AuthenticationRequest) -> Bool { pinentry.begin(request) }
    public func inputReady() -> AuthenticationAnswer? { pinentry.inputReady() }
    public func feedback(_ text: String, kind: AuthFeedbackKind?) { pinentry.feedback(text, kind: kind) }
    public func end() { pinentry.end() }
}
