package import CofferModel

extension KeychainService {
    /// Writes the audit record of one DELEGATE, accepted or refused (operation `delegate`): the front
    /// end as the caller, and as the reason whom it delegated for (`for app … (signed manifest, pid …)`,
    /// `for unsigned … (pid …)`), or for a refusal the fixed word `refusal` saying why (`not-entitled`,
    /// `gone`, …).
    package func auditDelegation(by frontEnd: CallerIdentity, for delegated: CallerIdentity?, status: SecStatus, refusal: String = "") {
        gate.record(frontEnd, operation: "delegate", group: nil, itemClass: nil, status: status,
                    reason: delegated.map { "for \($0)" } ?? refusal)
    }
}
