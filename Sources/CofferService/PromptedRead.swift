package import CofferModel

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
    /// PROMPT_UNLOCK's rules, checked before anybody is asked: a delegated conversation, and a caller
    /// that may try the passcode (a Flatpak app may not: no dialog asks a person for a password that
    /// would then be refused).
    package func mayPromptUnlock(_ context: CallerContext) throws(SecError) {
        try requireDelegated(context, for: "PROMPT_UNLOCK")
        try mayTryPasscode(context.caller, "unlock the keychain")
    }
}
