import CofferAgentPrompt
import CofferCrypto
import CofferModel
import CofferSSHKeyItems
import CofferService
import CofferSSHAgentProtocol
import CofferSSHKeys
import CofferSystem
import Glibc
import Logging

/// The ssh-agent front end's keys that are keychain items (``SSHKeyItems``): listed to a caller as its
/// access groups allow, and used to sign through the service core, which checks the caller's scope,
/// the keybag's lock and the key's access control (asking the person through the agent's own prompter
/// or the sensor, with the connection's reuse window) before it lends the private half for the one
/// signature. The private half never leaves the agent.
extension SSHAgentFrontEnd {
    /// The key items the caller may see, oldest first, as identities (their label as the comment). A
    /// locked keybag leaves out the WhenUnlocked ones.
    func itemIdentities(_ state: inout ConnectionState) -> [SSHAgentIdentity] {
        let query = ItemQuery(itemClass: .key, attributes: ["kcls": .integer(KeyItem.KeyClass.private.rawValue)])
        let items: [ItemResult]
        do {
            items = try service.keys(matching: query, &state.context)
        } catch {
            logger.debug("ssh-agent: listing the keychain's keys failed", metadata: ["error": "\(error)", "pid": "\(state.caller.pid)"])
            return []
        }
        return items.compactMap { item in
            guard let attributes = item.attributes, let key = SSHKeyItems.publicKey(attributes) else { return nil }
            var label = ""
            if case .string(let l)? = attributes["labl"] { label = l }
            return SSHAgentIdentity(keyBlob: key.blob, comment: label)
        }
    }

    /// Signs `data` with the key item whose public key is `blob`: nil if the caller sees no such item
    /// (the request is then not for a keychain key), else the reply (FAILURE when the keybag is locked,
    /// the person did not authenticate, nobody could be asked, or the key is unusable).
    func signWithItem(blob: [UInt8], data: [UInt8], flags: UInt32, _ state: inout ConnectionState) -> SSHAgentReply? {
        guard let publicKey = try? SSHWirePublicKey(blob: blob) else { return nil }
        // Opened only if the key's access control needs the person: finding the display environment
        // the pinentry gets starts programs (loginctl, systemctl), which a plain key must not pay for.
        let channel = LazyPromptChannel(promptChannel, client: state.clientDescriptor)
        defer { channel.end() }
        let pid = "\(state.caller.pid)"
        let destination = Self.boundDestination(state)
        do {
            // A key's reuse window (its `reus`) is the core's: it keeps the grant per caller and key.
            let signature = try service.useKey(matching: SSHKeyItems.query(blob: blob), what: Self.describeUse(publicKey, state),
                                               &state.context, channel) { (secret, attributes) throws(SecError) in
                try SSHKeyItems.sign(stored: secret, attributes: attributes, data: data, flags: flags, publicKey: publicKey)
            }
            logger.info("ssh-agent: signed with a keychain key", metadata: ["key": "\(publicKey.fingerprint)", "algorithm": "\(signature.algorithm)",
                                                                        "pid": "\(pid)"])
            service.auditSignature(state.context, key: publicKey.fingerprint, destination: destination, status: .success, reason: "keychain-key")
            return .signResponse(signatureBlob: signature.blob)
        } catch where error.status == .itemNotFound {
            return nil
        } catch {
            let reason: String = switch error.status {
            case _ where channel.clientHungUp: "client-gone"
            case .userCanceled: "cancelled"
            case .authFailed: "authentication-failed"
            case .interactionNotAllowed: keybagLocked ? "keychain-locked" : "not-authorized"
            default: "refused"
            }
            logger.info("ssh-agent: refused to sign with a keychain key", metadata: ["key": "\(publicKey.fingerprint)", "status": "\(error.status)",
                                                                                 "reason": "\(error.message)", "pid": "\(pid)"])
            service.auditSignature(state.context, key: publicKey.fingerprint, destination: destination, status: error.status, reason: reason)
            return .failure
        }
    }

    /// What the person authorizes, as the prompt shows it: the key, and the server when the connection
    /// was bound to one (``boundDestination(_:)``: `session-bind@openssh.com`'s host key).
    static func describeUse(_ key: SSHWirePublicKey, _ state: ConnectionState) -> String {
        "sign with the SSH key \(key.fingerprint)" + (boundDestination(state).map { " for \($0)" } ?? "")
    }
}
