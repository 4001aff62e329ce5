package import CofferModel

extension KeychainService {
    /// Writes the audit record of one ssh-agent signature, allowed or refused (operation `ssh-sign`):
    /// the caller as identified, the key's fingerprint, the destination when known, the result and a
    /// fixed word saying why (`confirmed`, `cancelled`, `locked`, …). Never the data signed.
    package func auditSignature(_ context: CallerContext, key: String, destination: String?, status: SecStatus, reason: String) {
        gate.record(context.caller, operation: "ssh-sign", group: nil, itemClass: nil, status: status,
                    key: key, destination: destination, reason: reason)
    }
}
