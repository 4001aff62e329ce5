import CofferAgentPrompt
import CofferModel
import CofferPrompt
import CofferSSHAgentProtocol
import CofferSSHKeyItems
import CofferSSHKeys
import CofferService
import Glibc
import Logging

/// A key as the signature policy sees it: what names it to the person and what it was constrained to.
/// A key added with `ssh-add` gives its constraints; a keychain item key gives its own.
struct SSHSigningKey: Sendable {
    /// The public key blob (how the client named it, and what a userauth request must embed).
    let blob: [UInt8]
    /// `SHA256:…` of the blob.
    let fingerprint: String
    /// The key type's name (`ssh-ed25519`, `ecdsa-sha2-nistp256`, `ssh-rsa`).
    let keyType: String
    let comment: String
    /// `ssh-add -c`: each signature asks the person.
    let confirm: Bool
    /// `ssh-add -h`: the hops the key may be used on (empty: unconstrained).
    let destinations: [SSHDestinationConstraint]
}

extension SSHAgentFrontEnd {
    /// Authorizes one signature by `key` over `data` for this connection's caller, as OpenSSH 9.x's
    /// ssh-agent does (`process_sign_request2`): a destination-constrained key signs only a userauth
    /// request on a connection whose session-binds its hops permit (``destinationPermits(_:data:state:)``,
    /// the ssh protocol's own rules, read here); everything else — a confirm key's dialog, its wording, the
    /// audit record — is the core's signature witness (``KeychainService/witnessSignature``). Locking and key
    /// lookup are the caller's: this sees only a key that exists.
    func authorizeSignature(_ key: SSHSigningKey, data: [UInt8], state: ConnectionState) -> SignatureDecision {
        var destination = Self.boundDestination(state)
        var refusal: SignatureDecision? = nil
        if !key.destinations.isEmpty {
            switch destinationPermits(key, data: data, state: state) {
            case .success(let host):
                destination = host
            case .failure(let r):
                refusal = .refused(reason: r.reason, status: .missingEntitlement)
            }
        }
        let subject = SignatureSubject(keyType: key.keyType, fingerprint: key.fingerprint, comment: key.comment, destination: destination)
        return service.witnessSignature(subject, confirm: key.confirm, refusal: refusal, state.context) {
            promptChannel().map { AgentConfirmation(channel: $0, client: state.clientDescriptor) }
        }
    }

    /// Writes the audit record of a signature refused before its key was found usable (a locked agent,
    /// a key gone): the witness's record, with no dialog.
    func auditSignature(_ key: SSHSigningKey, destination: String?, _ decision: SignatureDecision, state: ConnectionState) {
        let subject = SignatureSubject(keyType: key.keyType, fingerprint: key.fingerprint, comment: key.comment, destination: destination)
        _ = service.witnessSignature(subject, confirm: false, refusal: decision, state.context) { nil }
    }

    /// The destination this connection's session-binds name, when no constraint gives a host name:
    /// the last bound host key's fingerprint (nil: none bound, the agent is used locally).
    static func boundDestination(_ state: ConnectionState) -> String? {
        guard let last = state.sessionBinds.last else { return nil }
        let fingerprint = (try? SSHWirePublicKey(blob: last.hostKey))?.fingerprint ?? "an unknown host key"
        return "the host with key \(fingerprint)" + (state.sessionBinds.count > 1 ? " (through \(state.sessionBinds.count - 1) forwarding hops)" : "")
    }

    // MARK: restrict-destination (OpenSSH ssh-agent.c: process_sign_request2, identity_permitted)

    /// A destination-constrained key signs only (a) on a connection with session-binds, (b) a
    /// well-formed public-key userauth request for that very key, (c) whose session id is the last
    /// bind's, (d) whose embedded host key (publickey-hostbound) is the last bind's, required past the
    /// first hop, (e) when every bound hop is permitted by a constraint, the last one for the request's
    /// user and not a forwarding. Success: the destination's host name.
    func destinationPermits(_ key: SSHSigningKey, data: [UInt8], state: ConnectionState) -> Result<String?, SSHDestinationRefusal> {
        let refuse = { (reason: String) in Result<String?, SSHDestinationRefusal>.failure(SSHDestinationRefusal(reason: reason)) }
        guard let last = state.sessionBinds.last else { return refuse("destination-unbound-connection") }
        guard let request = SSHUserauthRequest(data, expecting: key) else { return refuse("destination-not-userauth") }
        guard let host = SSHDestinationPolicy.permitted(key.destinations, binds: state.sessionBinds, bindAttempted: state.bindAttempted,
                                                        user: request.user) else {
            return refuse("destination-not-permitted")
        }
        guard SSHDestinationPolicy.constantTimeEqual(request.sessionIdentifier, last.sessionIdentifier) else {
            return refuse("destination-session-mismatch")
        }
        if state.sessionBinds.count > 1 && request.hostKey == nil { return refuse("destination-no-hostkey") }
        if let hostKey = request.hostKey, hostKey != last.hostKey { return refuse("destination-hostkey-mismatch") }
        return .success(host.map { "user \u{201C}\(request.user)\u{201D} at \($0)" })
    }
}

/// Why a destination-constrained key may not sign here (the audit record's reason).
struct SSHDestinationRefusal: Error, Equatable {
    let reason: String
}

/// A public-key userauth request as ssh signs it (RFC 4252 §7, OpenSSH's `parse_userauth_request`):
/// `string session-id ‖ byte 50 ‖ string user ‖ string "ssh-connection" ‖ string method ‖ bool TRUE ‖
/// string algorithm ‖ string key [‖ string host key, for publickey-hostbound-v00@openssh.com]`.
struct SSHUserauthRequest: Equatable {
    let sessionIdentifier: [UInt8]
    let user: String
    /// The server's host key (publickey-hostbound-v00@openssh.com only).
    let hostKey: [UInt8]?

    /// Parses `data`; nil unless it is exactly such a request for `key` (its blob and a signature
    /// algorithm of its type).
    init?(_ data: [UInt8], expecting key: SSHSigningKey) {
        var r = SSHWireReader(data)
        do {
            let sid = try r.readString()
            guard !sid.isEmpty, try r.readByte() == 50 else { return nil }
            let user = try r.readText()
            guard try r.readText() == "ssh-connection" else { return nil }
            let method = try r.readText()
            guard try r.readByte() == 1 else { return nil }
            let algorithm = try r.readText()
            let blob = try r.readString()
            guard blob == key.blob, Self.keyType(ofAlgorithm: algorithm) == key.keyType else { return nil }
            var hostKey: [UInt8]? = nil
            switch method {
            case "publickey-hostbound-v00@openssh.com": hostKey = try r.readString()
            case "publickey": break
            default: return nil
            }
            try r.finish()
            self.sessionIdentifier = sid
            self.user = user
            self.hostKey = hostKey
        } catch {
            return nil
        }
    }

    /// The key type a signature algorithm belongs to (`rsa-sha2-512` → `ssh-rsa`).
    static func keyType(ofAlgorithm algorithm: String) -> String {
        ["rsa-sha2-256", "rsa-sha2-512"].contains(algorithm) ? "ssh-rsa" : algorithm
    }
}

/// OpenSSH's `identity_permitted` and `permitted_by_dest_constraints` over a connection's binds.
enum SSHDestinationPolicy {
    /// Longest user pattern a hop may carry (OpenSSH's AGENT_USER_CONSTRAINT_MAX_LEN).
    static let maximumUserPatternBytes = 1024

    /// True if every constraint is one this agent can enforce as OpenSSH does.
    static func acceptable(_ constraints: [SSHDestinationConstraint]) -> Bool {
        !constraints.isEmpty && constraints.allSatisfy { $0.from.user.utf8.count <= maximumUserPatternBytes && $0.to.user.utf8.count <= maximumUserPatternBytes }
    }

    /// Whether a key with `constraints` may be used on a connection with `binds` (oldest first).
    /// `user`: the userauth request's user (a signature), nil for a listing. Returns nil if not
    /// permitted, else `.some(host)`: the last hop's host name (nil when no bind: local use).
    static func permitted(_ constraints: [SSHDestinationConstraint], binds: [SSHSessionBind], bindAttempted: Bool,
                          user: String?) -> String?? {
        if constraints.isEmpty { return .some(nil) }
        if bindAttempted && binds.isEmpty { return nil }
        if binds.isEmpty { return .some(nil) }  // local use
        var from: [UInt8]? = nil
        var lastHost: String? = nil
        for (i, bind) in binds.enumerated() {
            let isLast = i == binds.count - 1
            if isLast {
                // Only a forwarding may follow a bind; a signature is never for a forwarding hop.
                if bind.isForwarding && user != nil { return nil }
            } else if !bind.isForwarding {
                return nil
            }
            guard let host = match(constraints, from: from, to: bind.hostKey, user: isLast ? user : nil) else { return nil }
            if isLast { lastHost = host }
            from = bind.hostKey
        }
        // A listing over a forwarding shows only keys usable beyond the forwarding host.
        if let last = binds.last, last.isForwarding, user == nil, match(constraints, from: last.hostKey, to: nil, user: nil) == nil {
            return nil
        }
        return .some(lastHost)
    }

    /// The first constraint whose `from` hop matches `from` (nil: the origin) and whose `to` hop
    /// matches `to` (nil: any) and `user`; its `to` host name.
    static func match(_ constraints: [SSHDestinationConstraint], from: [UInt8]?, to: [UInt8]?, user: String?) -> String? {
        for c in constraints {
            if let from {
                guard hopHolds(c.from, from) else { continue }
            } else {
                guard c.from.hostname.isEmpty && c.from.keys.isEmpty else { continue }
            }
            if let to, !hopHolds(c.to, to) { continue }
            if !c.to.user.isEmpty, let user, !globMatches(user, c.to.user) { continue }
            return c.to.hostname
        }
        return nil
    }

    /// OpenSSH's `match_key_hop`: a host key matches a hop that lists it as a plain key, or that lists
    /// as a certificate authority the key that signed it, a host certificate valid at `now` for the
    /// hop's host name (``hostCertificateHolds(_:for:now:)``).
    static func hopHolds(_ hop: SSHDestinationHop, _ hostKey: [UInt8], now: UInt64 = currentTime()) -> Bool {
        var certificate: SSHCertificate?? = nil  // decoded on the first CA entry
        for key in hop.keys {
            guard key.isCA else {
                if key.blob == hostKey { return true }
                continue
            }
            if certificate == nil { certificate = .some(try? SSHCertificate(blob: hostKey)) }
            guard let cert = certificate ?? nil, let ca = try? SSHWirePublicKey(blob: key.blob),
                  cert.signatureKey == ca else { continue }
            if hostCertificateHolds(cert, for: hop.hostname.isEmpty ? "(ORIGIN)" : hop.hostname, now: now) { return true }
        }
        return false
    }

    /// OpenSSH's `sshkey_cert_check_host` (with `cert_parse`'s signature check): the CA's signature
    /// over the signed part verifies, with an algorithm OpenSSH takes from a CA (SSH_ALLOWED_CA_SIGALGS:
    /// not SHA-1 `ssh-rsa`); it is a host certificate; `now` is in [valid after, valid before); and
    /// its principal list is empty or holds one matching `hostPattern` (`*`/`?`).
    static func hostCertificateHolds(_ cert: SSHCertificate, for hostPattern: String, now: UInt64) -> Bool {
        guard certificateSignatureVerifies(cert), cert.type == .host else { return false }
        guard now >= cert.validAfter, now < cert.validBefore else { return false }
        return cert.principals.isEmpty || cert.principals.contains { globMatches($0, hostPattern) }
    }

    /// The CA's signature over the certificate verifies, by an algorithm of the CA key's type that
    /// OpenSSH accepts for certificates.
    static func certificateSignatureVerifies(_ cert: SSHCertificate) -> Bool {
        let algorithm = cert.signature.algorithm
        let allowed = ["ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "rsa-sha2-256", "rsa-sha2-512"]
        guard allowed.contains(algorithm), SSHUserauthRequest.keyType(ofAlgorithm: algorithm) == cert.signatureKey.keyType else {
            return false
        }
        return cert.signatureKey.cryptoKey.verify(cert.signature.cryptoSignature, data: cert.signedBytes)
    }

    /// The key that signs for a session-bind's host key: the key itself, or a certificate's certified
    /// key when its CA's signature verifies (OpenSSH's agent parses a certificate host key with
    /// `sshkey_froms`, which checks that signature). Nil if the blob is neither.
    static func signingKey(ofHostKey blob: [UInt8]) -> SSHWirePublicKey? {
        if let key = try? SSHWirePublicKey(blob: blob) { return key }
        guard let cert = try? SSHCertificate(blob: blob), certificateSignatureVerifies(cert) else { return nil }
        return cert.publicKey
    }

    /// Seconds since the epoch.
    static func currentTime() -> UInt64 { UInt64(max(0, time(nil))) }

    /// OpenSSH's `match_pattern`: `*` any run, `?` any one character, everything else itself.
    static func globMatches(_ text: String, _ pattern: String) -> Bool {
        let t = Array(text.unicodeScalars), p = Array(pattern.unicodeScalars)
        var (ti, pi) = (0, 0)
        var star: (p: Int, t: Int)? = nil
        while ti < t.count {
            if pi < p.count, p[pi] == "*" {
                star = (pi, ti)
                pi += 1
            } else if pi < p.count, p[pi] == "?" || p[pi] == t[ti] {
                pi += 1
                ti += 1
            } else if let s = star {
                pi = s.p + 1
                ti = s.t + 1
                star = (s.p, s.t + 1)
            } else {
                return false
            }
        }
        while pi < p.count, p[pi] == "*" { pi += 1 }
        return pi == p.count
    }

    /// Byte equality that takes the same time wherever the first difference is.
    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var d: UInt8 = 0
        for i in 0..<a.count { d |= a[i] ^ b[i] }
        return d == 0
    }
}
