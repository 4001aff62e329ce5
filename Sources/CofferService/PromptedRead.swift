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
