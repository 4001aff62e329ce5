#if os(Linux)
// Signing with a key the agent holds (kSecAttrTokenIDSecureEnclave): the native wire has no signing message; the
// agent signs with its key items on its ssh-agent socket (SSH_AGENTC_SIGN_REQUEST), after the caller's access
// groups, the keybag's lock and the key's access control allowed it. The private half never leaves the agent.
import CofferClient
import CofferSSHAgentProtocol
import CofferSSHKeys
import CofferSystem
import Glibc

enum AgentSigning {
    /// The agent's ssh-agent socket: `ssh-agent.sock` beside the native socket (the agent's default).
    static var socketPath: String {
        let native = AgentConnection.socketPath(explicit: AgentSession.socket)
        let dir = native.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        return dir + "/ssh-agent.sock"
    }

    /// The agent's signature of `data` with the key item whose SSH public key blob is `blob`.
    static func sign(blob: [UInt8], data: [UInt8]) throws(SecFailure) -> SSHSignature {
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
        switch try? SSHWireSignature(blob: signatureBlob) {
        case .ed25519(let s)?: return .ed25519(s)
        case .ecdsa(_, let r, let s)?: return .ecdsa(r: Array(r.drop { $0 == 0 }), s: Array(s.drop { $0 == 0 }))
        default: throw SecFailure(errSecDecode, "the agent's signature is not of the key's kind")
        }
    }
}
#endif
