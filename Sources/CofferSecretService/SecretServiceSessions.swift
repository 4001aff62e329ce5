import CSDBus
import CofferClient
import CofferCrypto
import CofferModel
import CofferSecretServiceCrypto
import CofferSystem
import Glibc

/// The caller's open sessions (opened and closed in SecretServiceFrontEnd.swift) and the Secret
/// structs they decrypt and encrypt.
extension SecretServiceFrontEnd {
    /// The caller's session at `path`, or NoSession (closed, unknown, or another sender's).
    func session(_ c: Caller, _ path: String) throws(BusError) -> SecretServiceSession {
        guard owners[path] == c.sender, let s = c.peer.sessions[path] else {
            throw BusError(name: BusError.noSession, message: "\(path) is not a session of \(c.sender)")
        }
        return s.session
    }

    /// A Secret struct decrypted with the caller's session: the secret and its content type.
    func readSecret(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> (SecureBytes, String) {
        var sessionC: UnsafePointer<CChar>?, contentC: UnsafePointer<CChar>?
        var params: UnsafeRawPointer?, value: UnsafeRawPointer?
        var np = 0, nv = 0
        guard ssb_read_secret(m, &sessionC, &params, &np, &value, &nv, &contentC) >= 0, let sessionC, let contentC else {
            throw BusError(name: BusError.invalidArgs, message: "a secret is (oayays)")
        }
        let session = try session(c, String(cString: sessionC))
        let parameters = np > 0 ? [UInt8](UnsafeRawBufferPointer(start: params, count: np)) : []
        let secret: SecureBytes
        do {
            secret = try session.decrypt(parameters: parameters, value: UnsafeRawBufferPointer(start: nv > 0 ? value : nil, count: nv))
        } catch {
            throw BusError(name: error.dbusErrorName, message: error.description)
        }
        // Refused here, by name and limit, not by the agent closing a connection over a frame too
        // large to send (the client then saw an I/O error).
        guard secret.count <= SecretInput.maxBytes else {
            secret.wipe()
            throw BusError(name: BusError.invalidArgs, message: "a secret is at most \(SecretInput.maxBytes) bytes")
        }
        return (secret, String(cString: contentC))
    }

    /// Appends `secret` encrypted for `session` (at `sessionPath`) as a Secret struct, or as
    /// GetSecrets' entry for `itemPath`.
    static func appendSecret(_ m: OpaquePointer?, itemPath: String? = nil, sessionPath: String, _ session: SecretServiceSession,
                             _ secret: SecureBytes, contentType: String) throws(BusError) -> Int32 {
        let e: SecretServiceEncryptedSecret
        do { e = try session.encrypt(secret) } catch { throw BusError(name: error.dbusErrorName, message: error.description) }
        defer { e.value.wipe() }
        return e.parameters.withUnsafeBytes { p in
            e.value.withUnsafeBytes { v in
                if let itemPath {
                    ssb_append_secrets_entry(m, itemPath, sessionPath, p.baseAddress, p.count, v.baseAddress, v.count, contentType)
                } else {
                    ssb_append_secret(m, sessionPath, p.baseAddress, p.count, v.baseAddress, v.count, contentType)
                }
            }
        }
    }
}
