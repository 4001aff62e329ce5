#if os(Linux)
// Signing with a key the agent holds (kSecAttrTokenIDSecureEnclave): the native wire's KEY_SIGN on the session
// the key came with (an LAContext's, whose evaluation then covers the signature, or the process's), after the
// caller's access groups, the keybag's lock and the key's access control allowed it; the person is asked the way
// the program asks for its items (its pinentry or terminal). An agent older than KEY_SIGN signs on its ssh-agent
// socket (SSH_AGENTC_SIGN_REQUEST), asking through its own prompter. The private half never leaves the agent.
import CofferClient
import CofferModel
import CofferSSHAgentProtocol
import CofferSSHKeys
import CofferSystem
import Glibc

enum AgentSigning {
    /// The agent's signature of `data` with its key item `persistentRef` (whose SSH public key blob is `blob`),
    /// authenticated as `authentication` says (an invalidated LAContext: errSecAuthFailed, nobody asked).
    static func sign(persistentRef: [UInt8], blob: [UInt8], data: [UInt8], authentication: KeyAuthentication?) throws(SecFailure) -> SSHSignature {
        let (session, options) = (authentication ?? KeyAuthentication(context: nil, prompt: nil, noUserInterface: false)).session
        let query = ItemQuery(itemClass: .key, persistentRef: persistentRef)
        let signatureBlob: [UInt8]
        do {
            signatureBlob = try session.run(options: options) { c throws(SecError) in try c.signWithKey(query, data: data) }
        } catch where error.status == errSecParam && error.detail.contains("unknown message type") {
            // An agent from before KEY_SIGN.
            return try sign(blob: blob, data: data)
        } catch where authentication?.context?.agentSession.isInvalidated == true {
            throw SecFailure(error.status, error.detail, underlying: (domain: "com.apple.LocalAuthentication", code: -10))
        }
        return try decode(signatureBlob)
    }

    /// An SSH signature blob as the SecKey form.
    private static func decode(_ signatureBlob: [UInt8]) throws(SecFailure) -> SSHSignature {
        switch try? SSHWireSignature(blob: signatureBlob) {
        case .ed25519(let s)?: return .ed25519(s)
        case .ecdsa(_, let r, let s)?: return .ecdsa(r: Array(r.drop { $0 == 0 }), s: Array(s.drop { $0 == 0 }))
        default: throw SecFailure(errSecDecode, "the agent's signature is not of the key's kind")
        }
    }

    /// The agent's ssh-agent socket: `ssh-agent.sock` beside the native socket (the agent's default).
    static var socketPath: String {
        let native = AgentConnection.socketPath(explicit: AgentSession.socket)
        let dir = native.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        return dir + "/ssh-agent.sock"
    }

    /// The agent's signature of `data` with the key item whose SSH public key blob is `blob`, on its ssh-agent socket.
    private static func sign(blob: [UInt8], data: [UInt8]) throws(SecFailure) -> SSHSignature {
        let path = socketPath
        let fd: Int32
        do { fd = try UnixSocket.connect(path: path) } catch {
            throw SecFailure(errSecNotAvailable, "the agent's ssh-agent socket \(path) does not answer (ssh-agent-socket = none?)")
        }
        defer { close(fd) }
        guard (try? UnixSocket.peerUID(fd)) == geteuid() else {
            throw SecFailure(errSecNotAvailable, "the socket \(path) is not served by you; refusing to use it")
        }
        let frame: [UInt8]
        do { frame = try SSHAgentRequest.signRequest(keyBlob: blob, data: data, flags: 0).encodeFrame() } catch {
            throw .param("the data to sign is too large for the agent (at most \(SSHAgentFraming.maximumBodyBytes) bytes)")
        }
        guard UnixSocket.writeAll(fd, frame), let prefix = UnixSocket.readExactly(fd, count: 4) else {
            throw SecFailure(errSecIO, "the agent closed its ssh-agent socket")
        }
        let reply: SSHAgentReply
        do {
            let n = try SSHAgentFraming.bodyLength(prefix: prefix)
            guard let body = UnixSocket.readExactly(fd, count: n) else { throw SecFailure(errSecIO, "the agent closed its ssh-agent socket") }
            reply = try SSHAgentReply.decode(body: body)
        } catch let e as SecFailure {
            throw e
        } catch {
            throw SecFailure(errSecDecode, "malformed reply on the ssh-agent socket")
        }
        guard case .signResponse(let signatureBlob) = reply else {
            // FAILURE: the key is not the caller's, the keybag is locked, or the person did not authenticate.
            throw SecFailure(errSecAuthFailed, "the agent refused to sign (the key is not this program's, the keychain is locked, "
                             + "or the authentication its access control needs did not happen)")
        }
        return try decode(signatureBlob)
    }
}
#endif
