import CofferModel
import CofferSSHKeyItems
import CofferService
import CofferSSHAgentProtocol
import Logging

/// KEY_SIGN (WireProtocol.md, Keys): SecKeyCreateSignature with a key made or imported in the agent, on the
/// native protocol. The same core call as a signature on the ssh-agent socket (``KeychainService/useKey``:
/// the caller's scope, the lock, the key's access control, its reuse window), but the person is asked on
/// this connection (AUTH_NEEDED to the client, as for an item), so an LAContext's evaluation on the
/// connection covers the signature. Audited as `use-key` (the core) and as a signature (`reason`
/// `keychain-key`, no destination).
extension Pipeline {
    func signWithKey(_ query: ItemQuery, data: [UInt8], flags: UInt32, _ context: inout CallerContext,
                     _ channel: (any AuthChannel)?) throws(SecError) -> [UInt8] {
        var q = query
        q.itemClass = .key
        // Which key, from its attributes alone (no secret opened, nobody asked): only a key the agent holds
        // in its SSH form signs here; a key item of the caller's own (SecItemAdd) is the caller's to use.
        let listed = (try? service.keys(matching: q, &context))?.first?.attributes
        if let attributes = listed, !Self.signsInAgent(attributes) {
            throw .param("KEY_SIGN signs with a key made or imported in the agent (KEY_CREATE), not with this key item")
        }
        let publicKey = listed.flatMap(SSHKeyItems.publicKey)
        var label: String? = nil
        if case .string(let l)? = listed?["labl"], !l.isEmpty { label = l }
        let what = "sign with the key " + (label.map { "\u{201C}\(TerminalSafeText.escaped($0))\u{201D}" } ?? publicKey?.fingerprint ?? "it names")
        do {
            let signature = try service.useKey(matching: q, what: what, &context, channel) { (secret, attributes) throws(SecError) in
                guard Self.signsInAgent(attributes), let key = SSHKeyItems.publicKey(attributes) else {
                    throw .param("KEY_SIGN signs with a key made or imported in the agent (KEY_CREATE), not with this key item")
                }
                return (try SSHKeyItems.sign(stored: secret, attributes: attributes, data: data, flags: flags, publicKey: key), key)
            }
            logger.info("signed with a keychain key", metadata: ["key": "\(signature.1.fingerprint)", "algorithm": "\(signature.0.algorithm)"])
            service.auditSignature(context, key: signature.1.fingerprint, destination: nil, status: .success, reason: "keychain-key")
            return signature.0.blob
        } catch {
            if let publicKey, error.status != .itemNotFound {
                service.auditSignature(context, key: publicKey.fingerprint, destination: nil, status: error.status, reason: "refused")
            }
            throw error
        }
    }

    /// True for a private key item the agent made or imported: non-extractable, with its public key blob.
    static func signsInAgent(_ attributes: Attributes) -> Bool {
        KeyItem.isNonExtractable(attributes) && SSHKeyItems.publicKey(attributes) != nil
    }
}
