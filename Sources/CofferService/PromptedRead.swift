package import CofferModel
import CofferSystem

extension KeychainService {
    /// The service core's rule for the requests a front end sends so that the agent's own prompter
    /// asks the person for its client (PROMPT_READ, WireProtocol.md, Prompting for a front end): only
    /// a conversation delegated to the client's process (DELEGATE) may, so the dialog always names the
    /// process the agent identified; any other caller gets errSecMissingEntitlement and nobody is asked.
    package func requireDelegated(_ context: CallerContext, for request: String) throws(SecError) {
        guard context.isDelegated else {
            throw SecError(.missingEntitlement, "\(request) is answered only on a delegated connection (DELEGATE)")
        }
    }
}

extension KeychainService {
    /// COUNTERS' rule: the agent's counts move with every client's activity, so they are for the
    /// owner's own tools (the shell helper, unsigned callers where they share the keychain), never a
    /// sandboxed or other signed app, which could watch other apps' reads through them.
    package func mayReadCounters(_ context: CallerContext) throws(SecError) {
        try mayManageKeychain(context.caller, "read the agent's counters")
    }

    /// PROMPT_UNLOCK's rules, checked before anybody is asked: a delegated conversation, and a caller
    /// that may try the passcode (a Flatpak app may not: no dialog asks a person for a password that
    /// would then be refused).
    func mayPromptUnlock(_ context: CallerContext) throws(SecError) {
        try requireDelegated(context, for: "PROMPT_UNLOCK")
        try mayTryPasscode(context.caller, "unlock the keychain")
    }
}

extension KeychainService {
    /// The prompted unlock (PROMPT_UNLOCK, and any front end that unlocks for a client that cannot ask
    /// the person itself): the core's one loop. Already unlocked: returns without asking. Otherwise the
    /// passcode is asked through the channel `open` makes (the agent's own prompter, naming the caller as the agent
    /// identified it) and checked exactly as UNLOCK checks one (PAM, the attempt schedule); at most
    /// ``Authenticator/passcodeAttempts`` answers, each wrong one told with the attempts left before a
    /// wait, and none once the schedule would make the next one wait. The person cancelling, the
    /// prompter's own deadline or the channel going away end it errSecUserCanceled (`gone` says why for
    /// the last: a front end whose client hung up). `open` is called only once the rules allowed the
    /// unlock and the keybag is locked: no prompter is opened for nothing.
    package func unlockPrompted(_ context: CallerContext, channel open: () throws(SecError) -> any AuthChannel,
                                gone: () -> String = { "the person cancelled" }) throws(SecError) {
        try mayPromptUnlock(context)
        guard try status().lockState != .unlocked else { return }
        let channel = try open()
        let app = Authenticator.appName(context.caller)
        channel.ask(AuthenticationRequest(methods: .passcode, app: app, prompt: "\(app) wants to unlock the keychain",
                                          identity: Authenticator.identityDescription(context.caller)))
        // The prompter's own deadline (authentication-timeout) ends the wait first.
        let deadline = Threads.monotonicSeconds() + 24 * 3600
        var wrong = 0
        while true {
            switch channel.awaitAnswer(stop: { false }, wake: -1, deadline: deadline) {
            case .answer(.passcode(let passcode)):
                do {
                    try unlock(passcode, context)
                    return
                } catch where error.status == .authFailed && wrong + 1 < Authenticator.passcodeAttempts && unlocking.retryAfter == 0 {
                    wrong += 1
                    channel.feedback(unlocking.wrongPasscodeFeedback, kind: .wrongPasscode)
                }
            case .stopped:
                continue
            case .timedOut:
                throw SecError(.userCanceled, "nobody answered the passcode prompt in time")
            case .answer, .gone:
                throw SecError(.userCanceled, gone())
            }
        }
    }
}
