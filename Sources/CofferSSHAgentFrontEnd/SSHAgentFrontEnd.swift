package import CofferAgentPrompt
import CofferCrypto
package import CofferModel
import CofferSSHAgentProtocol
import CofferSSHKeyItems
import CofferSSHKeys
package import CofferService
package import CofferSocketServer
import CofferSystem
package import Logging

/// The ssh-agent protocol's framing (draft-miller-ssh-agent §3): a 4-byte big-endian length, then a
/// body of 1 to ``CofferSSHAgentProtocol/SSHAgentFraming/maximumBodyBytes`` bytes. Any other length
/// closes the connection (``Connection/ReadEnd/badLength``).
package struct SSHAgentFraming: Framing {
    package init() {}

    package func readFrame(from conn: Connection, greeted: Bool, budget: FrameBudget, bufferedOnly: Bool) -> Result<Connection.Frame, Connection.ReadEnd> {
        conn.readLengthPrefixedFrame(headerBytes: 4, bodyLength: { header in
            try? CofferSSHAgentProtocol.SSHAgentFraming.bodyLength(prefix: Array(header))
        }, greeted: greeted, budget: budget, bufferedOnly: bufferedOnly)
    }
}

/// The ssh-agent protocol as a front end of a ``SocketServer`` (issue #27): OpenSSH ssh-agent's
/// semantics for keys added with `ssh-add`, kept in memory in the agent's ``SSHAgentKeyStore``.
///
/// Every well-framed message gets an answer: a malformed one, an unknown type, a smartcard request, a
/// constraint this agent cannot enforce get SSH_AGENT_FAILURE (a constraint is never ignored: that
/// would silently weaken what the person asked for). Refused constraints: max-signatures, associated
/// certificates, and sk-provider on a key that is not a FIDO key. FIDO keys (``SSHSecurityKeySigner``)
/// sign through the middleware their sk-provider names, in a helper process. Honoured: lifetime (`ssh-add -t`), confirm (`ssh-add -c`: the person
/// allows each signature in the agent's own pinentry) and restrict-destination (`ssh-add -h`, as
/// OpenSSH 9.x enforces it against the connection's `session-bind@openssh.com` records): both decided
/// by ``authorizeSignature(_:data:state:)``, which also audits every signature. A frame-level
/// violation closes the connection. Each add, removal and signature is logged at info with the key's
/// fingerprint and the caller's pid, never a secret.
///
/// With a keychain passcode set, LOCK and UNLOCK are the keychain's lock (``KeychainService/lock(requestedBy:)``,
/// and ``KeychainService/unlock(_:_:)`` with the passcode, under the attempt schedule), and while the keybag
/// is locked (``keybagLocked``) the keys added with ssh-add are unusable and unlisted, as in OpenSSH's locked
/// agent, while the keychain's keys whose class a locked keybag still opens (AfterFirstUnlock, Always) are
/// listed and sign (the others fail cleanly); UNLOCK is served, the rest is FAILURE. Without one, LOCK and
/// UNLOCK lock the ``SSHAgentKeyStore`` alone with a passphrase. Either way, which callers may send them is
/// the service core's decision (``KeychainService/maySendSSHAgentLock(_:unlocking:)``: not a sandboxed app,
/// nor any caller that may not manage the whole keychain), and refusals, which a client can repeat at will,
/// are logged at most once per `log-repeat-interval` with a count (``RefusalLog``).
///
/// Keys that are keychain items (``SSHKeyItems``) come after the ssh-add keys in a listing, as the
/// caller's access groups see them, and sign through the service core (``signWithItem(blob:data:flags:_:)``).
package struct SSHAgentFrontEnd: ConnectionHandler {
    let keys: SSHAgentKeyStore
    /// FIDO keys' middlewares: which a key may name, and the helper process each signature runs in.
    let securityKeys: SSHSecurityKeySigner
    /// The protocol-free service core: the keychain, its lock and the authentication every front end shares.
    let service: KeychainService
    /// Opens the channel through which the agent itself asks a person (its pinentry), one per
    /// request that needs one; nil when nobody can be asked (no pinentry configured).
    let promptChannel: @Sendable () -> AgentPromptChannel?
    /// Where refused LOCKs and UNLOCKs are logged, at most one line per kind and interval.
    let refusals: RefusalLog
    let logger: Logger

    package init(keys: SSHAgentKeyStore, securityKeys: SSHSecurityKeySigner, service: KeychainService,
                 promptChannel: @escaping @Sendable () -> AgentPromptChannel?, refusals: RefusalLog, logger: Logger) {
        self.keys = keys
        self.securityKeys = securityKeys
        self.service = service
        self.promptChannel = promptChannel
        self.refusals = refusals
        self.logger = logger
    }

    /// The extensions `query` reports.
    static let supportedExtensions = ["query", "session-bind@openssh.com"]
    /// Most session-binds one connection records (OpenSSH's AGENT_MAX_SESSION_IDS).
    static let maximumSessionBinds = 16

    /// What one connection has told the agent.
    struct ConnectionState {
        /// The caller and what this connection has been authorized for (reuse windows), for the service core.
        var context: CallerContext
        var caller: CallerIdentity { context.caller }
        /// The `session-bind@openssh.com` bindings received (verified), oldest first.
        var sessionBinds: [SSHSessionBind] = []
        /// A session-bind came on this connection (recorded or not): if none was recorded, it is not
        /// local use, and destination-constrained keys are not listed (OpenSSH's `session_bind_attempted`).
        var bindAttempted = false
        /// The client's socket, watched for a hang-up while the person is asked (-1: none).
        var clientDescriptor: Int32 = -1
    }

    package func serve(_ conn: Connection, caller: CallerIdentity, server: SocketServer) {
        var state = ConnectionState(context: CallerContext(caller: caller))
        state.clientDescriptor = conn.fd
        server.serveRequests(conn, firstFrame: "request") { body in send(handle(body: body, state: &state), on: conn) }
    }

    /// Decodes one body and answers it. The plain copy of the body (it may hold a private key or a
    /// passphrase) is wiped before this returns.
    func handle(body secureBody: SecureBytes, state: inout ConnectionState) -> SSHAgentReply {
        var body = secureBody.withUnsafeBytes { Array($0) }
        defer { secureZero(&body) }
        let request: SSHAgentRequest
        do {
            request = try SSHAgentRequest.decode(body: body)
        } catch {
            logger.debug("ssh-agent: malformed request", metadata: ["error": "\(error)", "pid": "\(state.caller.pid)"])
            return .failure
        }
        return answer(request, state: &state)
    }

    /// The keychain is locked (``KeychainService/isLocked``, `ssh-add -x` among the ways): the agent
    /// is locked as `ssh-add -x` locks it.
    var keybagLocked: Bool { service.isLocked }

    private func answer(_ request: SSHAgentRequest, state: inout ConnectionState) -> SSHAgentReply {
        let pid = "\(state.caller.pid)"
        let keybagLocked = self.keybagLocked
        if keybagLocked {
            // Locked, the keys added with ssh-add are unusable and unlisted (OpenSSH's locked agent);
            // the keychain's keys whose class a locked keybag still opens (AfterFirstUnlock, Always)
            // are listed and sign, the others fail cleanly. UNLOCK is served; the rest is FAILURE.
            switch request {
            case .requestIdentities: return .identities(Self.fitting(itemIdentities(&state), logger: logger))
            case .unlock: break
            case .signRequest(let blob, let data, let flags):
                if let key = keys.key(blob: blob) {
                    auditSignature(key.signing, destination: Self.boundDestination(state),
                                   .refused(reason: "keychain-locked", status: .interactionNotAllowed), state: state)
                    return .failure
                }
                return signWithItem(blob: blob, data: data, flags: flags, &state) ?? .failure
            default: return .failure
            }
        }
        switch request {
        case .requestIdentities:
            // A destination-constrained key is listed only where it could be used (OpenSSH's identity_permitted).
            // ssh-add's keys first (as OpenSSH lists them), then the keychain's the caller may see.
            let inMemory = keys.identities().filter {
                SSHDestinationPolicy.permitted($0.destinations, binds: state.sessionBinds, bindAttempted: state.bindAttempted, user: nil) != nil
            }.map { SSHAgentIdentity(keyBlob: $0.blob, comment: $0.comment) }
            guard !keys.isLocked else { return .identities(inMemory) }
            let known = Set(keys.identities().map(\.blob))
            return .identities(Self.fitting(inMemory + itemIdentities(&state).filter { !known.contains($0.keyBlob) }, logger: logger))

        case .signRequest(let blob, let data, let flags):
            if keys.key(blob: blob) == nil, !keys.isLocked, let reply = signWithItem(blob: blob, data: data, flags: flags, &state) {
                return reply
            }
            guard let key = keys.key(blob: blob) else {
                // debug, not info: a client asking again and again must not grow the log.
                logger.debug("ssh-agent: refused to sign", metadata: ["reason": "\(keys.isLocked ? "locked" : "unknown key")", "pid": "\(pid)"])
                if keys.isLocked, let fingerprint = Self.fingerprint(ofBlob: blob) {
                    service.auditSignature(state.context, key: fingerprint, destination: Self.boundDestination(state),
                                           status: .interactionNotAllowed, reason: "locked")
                }
                return .failure
            }
            // A FIDO key made for a web site signs only what ssh signs (OpenSSH's restrict_websafe).
            if case .securityKey(let skKey, _) = key.signer,
               !SSHSecurityKeySigner.webSafe(key.signing, application: skKey.publicKey.application, data: data) {
                logger.info("ssh-agent: refused to sign: a FIDO key of a web application asked to sign a non-ssh message",
                            metadata: ["key": "\(key.fingerprint)", "pid": "\(pid)"])
                auditSignature(key.signing, destination: Self.boundDestination(state),
                               .refused(reason: "web-origin-key", status: .missingEntitlement), state: state)
                return .failure
            }
            // The person (ssh-add -c), the destination (ssh-add -h), and the audit record.
            guard case .allowed = authorizeSignature(key.signing, data: data, state: state) else { return .failure }
            switch key.signer {
            case .software(let privateKey, let publicKey):
                // OpenSSH: the RSA flags pick the hash; no flag means ssh-rsa (SHA-1). Other types ignore them.
                let hash = SSHRSASignatureAlgorithm(signFlags: flags).cryptoHash
                let signature: SSHWireSignature
                do {
                    guard let s = SSHWireSignature(try privateKey.sign(data: data, hash: hash, allowSHA1: true), by: publicKey)
                    else { return .failure }
                    signature = s
                } catch {
                    logger.error("ssh-agent: signing failed", metadata: ["key": "\(key.fingerprint)", "error": "\(error)", "pid": "\(pid)"])
                    return .failure
                }
                logger.info("ssh-agent: signed", metadata: ["key": "\(key.fingerprint)", "algorithm": "\(signature.algorithm)", "pid": "\(pid)"])
                return .signResponse(signatureBlob: signature.blob)
            case .securityKey(let skKey, let middleware):
                // The authenticator signs (a touch on a real device), in a process of its own.
                switch securityKeys.sign(skKey, middleware: middleware, data: data) {
                case .success(let signature):
                    logger.info("ssh-agent: signed", metadata: ["key": "\(key.fingerprint)", "algorithm": "\(signature.algorithm.keyType)",
                                                              "counter": "\(signature.counter)", "pid": "\(pid)"])
                    return .signResponse(signatureBlob: signature.blob)
                case .failure(let failure):
                    logger.info("ssh-agent: the authenticator did not sign", metadata: ["key": "\(key.fingerprint)", "middleware": "\(middleware)",
                                                                                       "error": "\(failure)", "pid": "\(pid)"])
                    return .failure
                }
            }

        case .addIdentity(let wireKey, let comment, let constraints):
            return add(wireKey, listedAs: wireKey.publicKey.blob, comment: comment, constraints: constraints, pid: pid)

        case .addCertificate(let certified, let comment, let constraints):
            // Listed by its certificate, signing with the certified key (OpenSSH's agent keeps the two apart).
            return add(certified.key, listedAs: certified.certificate.blob, comment: comment, constraints: constraints, pid: pid,
                       certificate: certified.certificate.certificateType)

        case .addSecurityKey(let skKey, let comment, let constraints):
            return addSecurityKey(skKey, comment: comment, constraints: constraints, pid: pid)

        case .removeIdentity(let blob):
            guard let key = keys.remove(blob: blob) else { return .failure }
            logger.info("ssh-agent: removed a key", metadata: ["key": "\(key.fingerprint)", "pid": "\(pid)"])
            return .success

        case .removeAllIdentities:
            guard let count = keys.removeAll() else { return .failure }
            logger.info("ssh-agent: removed all keys", metadata: ["count": "\(count)", "pid": "\(pid)"])
            return .success

        case .lock(let passphrase):
            guard mayLock(unlocking: false, state) else { return .failure }
            guard !keys.isLocked else { return .failure }
            if service.passcodeSet {
                // ssh-add -x locks the keychain itself (the passphrase is not kept: UNLOCK needs the passcode).
                do {
                    try service.lock(requestedBy: "ssh-add -x (pid \(pid))")
                } catch {
                    return .failure
                }
                logger.info("ssh-agent: locked the keychain", metadata: ["pid": "\(pid)"])
                return .success
            }
            guard keys.lock(passphrase: passphrase) else { return .failure }
            logger.info("ssh-agent: locked", metadata: ["pid": "\(pid)"])
            return .success

        case .unlock(let passphrase) where keybagLocked && !keys.isLocked:
            // ssh-add -X unlocks the keychain with the passcode: PAM, the attempt schedule and the
            // audit record of the native unlock.
            guard mayLock(unlocking: true, state) else { return .failure }
            do {
                try service.unlock(passphrase, state.context)
            } catch {
                refusals.log("ssh-keychain-unlock", "ssh-agent: keychain unlock refused", peer: nil, level: .info,
                             metadata: ["status": "\(error.status.name)", "pid": "\(pid)"])
                return .failure
            }
            logger.info("ssh-agent: unlocked the keychain", metadata: ["pid": "\(pid)"])
            return .success

        case .unlock(let passphrase):
            guard mayLock(unlocking: true, state) else { return .failure }
            switch keys.unlock(passphrase: passphrase) {
            case .unlocked:
                logger.info("ssh-agent: unlocked", metadata: ["pid": "\(pid)"])
                return .success
            case .notLocked:
                return .failure
            case .wrongPassphrase(let failures):
                refusals.log("ssh-agent-unlock", "ssh-agent: unlock refused: wrong passphrase", peer: nil, level: .info,
                             metadata: ["failures": "\(failures)", "pid": "\(pid)"])
                return .failure
            }

        case .addSmartcardKey, .removeSmartcardKey:
            return .failure

        case .extension(let ext):
            // Locked, OpenSSH answers only REQUEST_IDENTITIES (empty) and UNLOCK; so does this agent.
            guard !keys.isLocked else { return .failure }
            switch ext {
            case .query: return .queryResponse(Self.supportedExtensions)
            case .sessionBind(let bind):
                return Self.record(bind, in: &state) ? .success : .failure
            case .other:
                return .failure
            }

        case .unknown:
            return .failure
        }
    }

    /// True if the service core lets this connection's caller send LOCK (`unlocking` false) or
    /// UNLOCK (``KeychainService/maySendSSHAgentLock(_:unlocking:)``); a refusal is logged, at most
    /// once per interval with a count of the ones left out.
    private func mayLock(unlocking: Bool, _ state: ConnectionState) -> Bool {
        do {
            try service.maySendSSHAgentLock(state.context, unlocking: unlocking)
            return true
        } catch {
            refusals.log(unlocking ? "ssh-unlock-denied" : "ssh-lock-denied", "ssh-agent: \(unlocking ? "unlock" : "lock") refused: \(error.message)",
                         peer: nil, level: .info, metadata: ["status": "\(error.status.name)", "caller": "\(state.caller)"])
            return false
        }
    }

    /// Most bytes of a session identifier (OpenSSH's AGENT_MAX_SID_LEN).
    static let maximumSessionIdentifierBytes = 128

    /// Records a `session-bind@openssh.com` as OpenSSH's `process_ext_session_bind` does: refused if
    /// its signature does not verify, if the session id is too long, if an earlier bind on the
    /// connection was for authentication (only forwardings are followed by more binds), if the session
    /// id was bound to another host key, or past ``maximumSessionBinds``; the same bind again is
    /// accepted once. Every attempt marks the connection (``ConnectionState/bindAttempted``).
    static func record(_ bind: SSHSessionBind, in state: inout ConnectionState) -> Bool {
        state.bindAttempted = true
        guard bind.sessionIdentifier.count <= maximumSessionIdentifierBytes, verify(bind) else { return false }
        for earlier in state.sessionBinds {
            guard earlier.isForwarding else { return false }
            if SSHDestinationPolicy.constantTimeEqual(earlier.sessionIdentifier, bind.sessionIdentifier) {
                return earlier.hostKey == bind.hostKey
            }
        }
        guard state.sessionBinds.count < maximumSessionBinds else { return false }
        state.sessionBinds.append(bind)
        return true
    }

    /// True if the session-bind's host key (a certificate's certified key) signed its session identifier.
    static func verify(_ bind: SSHSessionBind) -> Bool {
        guard let hostKey = SSHDestinationPolicy.signingKey(ofHostKey: bind.hostKey),
              let signature = try? SSHWireSignature(blob: bind.signature) else { return false }
        return hostKey.cryptoKey.verify(signature.cryptoSignature, data: bind.sessionIdentifier)
    }

    /// The identities, in order, that fit in one reply (256 KiB: thousands of Ed25519 keys, about 450
    /// RSA-4096 ones); the rest are left out and logged, rather than the whole listing failing.
    static func fitting(_ identities: [SSHAgentIdentity], logger: Logger) -> [SSHAgentIdentity] {
        var size = 1 + 4, kept = 0
        for id in identities {
            let next = size + 8 + id.keyBlob.count + id.comment.utf8.count
            guard next <= CofferSSHAgentProtocol.SSHAgentFraming.maximumBodyBytes else { break }
            size = next
            kept += 1
        }
        if kept < identities.count {
            logger.warning("ssh-agent: the key listing holds only the keys that fit in one reply",
                           metadata: ["listed": "\(kept)", "left-out": "\(identities.count - kept)"])
        }
        return Array(identities.prefix(kept))
    }

    /// The fingerprint of a key blob the agent can read (a plain key or a FIDO key), for logs and audit records.
    static func fingerprint(ofBlob blob: [UInt8]) -> String? {
        if let key = try? SSHWirePublicKey(blob: blob) { return key.fingerprint }
        return (try? SSHSecurityKeyPublicKey(blob: blob))?.fingerprint
    }

    /// A constraint's name in logs (never its contents).
    static func name(of constraint: SSHKeyConstraint) -> String {
        switch constraint {
        case .lifetime: "lifetime"
        case .confirm: "confirm"
        case .maxSignatures: "max-signatures"
        case .restrictDestination: "restrict-destination-v00@openssh.com"
        case .skProvider: "sk-provider@openssh.com"
        case .associatedCerts: "associated-certs-v00@openssh.com"
        }
    }

    /// Sends `reply`; a reply too large to frame (an identity list past 256 KiB) goes as FAILURE.
    private func send(_ reply: SSHAgentReply, on conn: Connection) -> Bool {
        let frame = (try? reply.encodeFrame()) ?? ((try? SSHAgentReply.failure.encodeFrame()) ?? [])
        return conn.send(frame)
    }
}

extension SSHAgentFrontEnd {
    /// ADD_IDENTITY / ADD_ID_CONSTRAINED: `wireKey` kept in memory, listed and asked for by `blob` (its
    /// public key, or its certificate when `certificate` names the certificate type), with the
    /// constraints this agent enforces (any other refuses the key).
    func add(_ wireKey: SSHWirePrivateKey, listedAs blob: [UInt8], comment: String, constraints: [SSHKeyConstraint], pid: String,
             certificate: String? = nil) -> SSHAgentReply {
        guard let c = enforceable(constraints, fingerprint: wireKey.publicKey.fingerprint, pid: pid) else { return .failure }
        let crypto: SSHPrivateKey
        do {
            crypto = try wireKey.cryptoKey()
        } catch {
            logger.info("ssh-agent: refused a key", metadata: ["key": "\(wireKey.publicKey.fingerprint)", "error": "\(error)", "pid": "\(pid)"])
            return .failure
        }
        let key = SSHAgentKeyStore.Key(signer: .software(crypto, wireKey.publicKey), blob: blob, comment: comment,
                                       expiresAt: c.lifetime.map { Threads.monotonicSeconds() + Double($0) },
                                       confirm: c.confirm, destinations: c.destinations)
        return store(key, type: certificate ?? wireKey.publicKey.keyType, lifetime: c.lifetime, pid: pid)
    }

    /// ADD_IDENTITY / ADD_ID_CONSTRAINED of a FIDO key, as OpenSSH's agent takes one: it must name its
    /// middleware (`sk-provider@openssh.com`), which is resolved and must be in the allow-list
    /// (``SSHSecurityKeySigner/resolve(provider:)``); the other constraints are as for any key. A
    /// `verify-required` key (the device wants a PIN or a fingerprint for each signature) is refused:
    /// the agent passes no PIN, as OpenSSH's does not (and its ssh-add refuses to send one).
    func addSecurityKey(_ skKey: SSHSecurityKeyPrivateKey, comment: String, constraints: [SSHKeyConstraint], pid: String) -> SSHAgentReply {
        let fingerprint = skKey.publicKey.fingerprint
        func refuse(_ reason: String) -> SSHAgentReply {
            logger.info("ssh-agent: refused a FIDO key: \(reason)", metadata: ["key": "\(fingerprint)", "pid": "\(pid)"])
            return .failure
        }
        var provider: String? = nil
        var others: [SSHKeyConstraint] = []
        for c in constraints {
            if case .skProvider(let p) = c { provider = p } else { others.append(c) }
        }
        guard let c = enforceable(others, fingerprint: fingerprint, pid: pid) else { return .failure }
        guard let provider else { return refuse("it names no middleware (sk-provider@openssh.com)") }
        guard skKey.flags & SSHSecurityKeyFlags.userVerificationRequired == 0 else {
            return refuse("it is verify-required (a PIN or fingerprint for each signature), which this agent does not support, as OpenSSH's does not")
        }
        let middleware: String
        switch securityKeys.resolve(provider: provider) {
        case .success(let path): middleware = path
        case .failure(let refusal): return refuse(refusal.reason)
        }
        let key = SSHAgentKeyStore.Key(signer: .securityKey(skKey, middleware: middleware), blob: skKey.publicKey.blob, comment: comment,
                                       expiresAt: c.lifetime.map { Threads.monotonicSeconds() + Double($0) },
                                       confirm: c.confirm, destinations: c.destinations)
        return store(key, type: skKey.publicKey.keyType, lifetime: c.lifetime, pid: pid, middleware: middleware)
    }

    /// The constraints this agent enforces for any key (lifetime, confirm, restrict-destination), or
    /// nil (logged) if one is not: a key is never accepted without a restriction the person asked for.
    private func enforceable(_ constraints: [SSHKeyConstraint], fingerprint: String, pid: String)
        -> (lifetime: UInt32?, confirm: Bool, destinations: [SSHDestinationConstraint])? {
        var lifetime: UInt32? = nil
        var confirm = false
        var destinations: [SSHDestinationConstraint] = []
        for c in constraints {
            switch c {
            case .lifetime(let seconds): lifetime = seconds
            case .confirm: confirm = true
            case .restrictDestination(let list) where SSHDestinationPolicy.acceptable(list): destinations = list
            default:
                logger.info("ssh-agent: refused a key with a constraint this agent cannot enforce",
                            metadata: ["key": "\(fingerprint)", "constraint": "\(Self.name(of: c))", "pid": "\(pid)"])
                return nil
            }
        }
        return (lifetime, confirm, destinations)
    }

    /// Puts `key` in the store and logs the outcome.
    private func store(_ key: SSHAgentKeyStore.Key, type: String, lifetime: UInt32?, pid: String, middleware: String? = nil) -> SSHAgentReply {
        switch keys.add(key) {
        case .locked:
            logger.info("ssh-agent: refused a key: the agent is locked", metadata: ["key": "\(key.fingerprint)", "pid": "\(pid)"])
            return .failure
        case .full:
            logger.warning("ssh-agent: refused a key: the agent holds \(SSHAgentKeyStore.maximumKeys) already",
                           metadata: ["key": "\(key.fingerprint)", "pid": "\(pid)"])
            return .failure
        case .added, .replaced:
            var metadata: Logger.Metadata = ["key": "\(key.fingerprint)", "type": "\(type)", "lifetime": "\(lifetime.map { "\($0) s" } ?? "none")",
                                             "confirm": "\(key.confirm)", "destinations": "\(key.destinations.count)", "pid": "\(pid)"]
            if let middleware { metadata["middleware"] = "\(middleware)" }
            logger.info("ssh-agent: added a key", metadata: metadata)
            return .success
        }
    }
}
