package import CofferModel
import CofferPolicy

extension KeychainService {
    /// Whether `context`'s caller may send the ssh-agent protocol's LOCK or UNLOCK (`ssh-add -x`,
    /// `-X`; `unlocking` says which). Either one acts on a lock every app shares: with a passcode set
    /// the keychain's (the keys of every app lock with it), without one the `ssh-add` keys' (which every
    /// client of the socket uses). And the socket is given to callers for signing, Flatpak apps among
    /// them (`--socket=ssh-auth`), not to lock anything for the others. So only a caller that may run
    /// operations on the whole keychain may send them (``AccessPolicy/mayManageKeychain(_:)``: the
    /// shell helper, and processes without a signed identity while unsigned callers share a group, as
    /// `ssh-add` in a terminal is); a sandboxed app, another signed app, and unsigned callers under
    /// `unsigned-callers = deny` are refused errSecMissingEntitlement before anything else is done (no
    /// passcode try is counted), and the refusal is audited (operation `lock` or `unlock`, reason
    /// `ssh-agent`). `coffer lock` and `coffer unlock` on the native socket are not affected.
    package func maySendSSHAgentLock(_ context: CallerContext, unlocking: Bool) throws(SecError) {
        let caller = context.caller
        guard !gate.policy.mayManageKeychain(caller) else { return }
        let shell = gate.policy.shellAppID.map { "the shell helper (app \($0))" } ?? "no app (shell-app = none)"
        let unsigned = gate.policy.unsignedCallers == .shared ? " or a process without a signed identity" : ""
        let error = SecError(.missingEntitlement, "only \(shell)\(unsigned) may \(unlocking ? "unlock" : "lock") through the ssh-agent socket "
                             + "(ssh-add \(unlocking ? "-X" : "-x")): the lock is every app's")
        gate.record(caller, operation: unlocking ? "unlock" : "lock", group: nil, itemClass: nil, status: error.status, reason: "ssh-agent")
        throw error
    }
}
