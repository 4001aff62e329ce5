public import CofferCrypto

/// Framing (draft-miller-ssh-agent §3): `uint32 length ‖ body`, the body's first byte its type.
public enum SSHAgentFraming {
    /// The largest body a peer may send or receive: 256 KiB, OpenSSH's `AGENT_MAX_LEN`.
    public static let maximumBodyBytes = 256 * 1024

    /// The body length announced by a 4-byte prefix: throws ``SSHAgentWireError/oversize(_:)``
    /// above ``maximumBodyBytes`` and ``SSHAgentWireError/emptyMessage`` for 0, before any body is read.
    public static func bodyLength(prefix: [UInt8]) throws(SSHAgentWireError) -> Int {
        var r = SSHWireReader(prefix)
        let n = Int(try r.readUInt32())
        try r.finish()
        guard n <= maximumBodyBytes else { throw .oversize(n) }
        guard n > 0 else { throw .emptyMessage }
        return n
    }

    /// The body of one whole frame (its length prefix must match the bytes that follow).
    public static func body(ofFrame frame: [UInt8]) throws(SSHAgentWireError) -> [UInt8] {
        let n = try bodyLength(prefix: Array(frame.prefix(4)))
        guard frame.count - 4 >= n else { throw .truncated }
        guard frame.count - 4 == n else { throw .trailingBytes(frame.count - 4 - n) }
        return Array(frame[4...])
    }

    /// `body` with its length prefix; throws ``SSHAgentWireError/oversize(_:)`` if it is too long to send.
    public static func frame(_ body: [UInt8]) throws(SSHAgentWireError) -> [UInt8] {
        guard body.count <= maximumBodyBytes else { throw .oversize(body.count) }
        var w = SSHWireWriter(capacity: body.count + 4)
        w.writeUInt32(UInt32(body.count))
        w.writeRaw(body)
        return w.bytes
    }
}

/// Message numbers (draft-miller-ssh-agent §6.1).
public enum SSHAgentMessageType {
    public static let failure: UInt8 = 5
    public static let success: UInt8 = 6
    public static let requestIdentities: UInt8 = 11
    public static let identitiesAnswer: UInt8 = 12
    public static let signRequest: UInt8 = 13
    public static let signResponse: UInt8 = 14
    public static let addIdentity: UInt8 = 17
    public static let removeIdentity: UInt8 = 18
    public static let removeAllIdentities: UInt8 = 19
    public static let addSmartcardKey: UInt8 = 20
    public static let removeSmartcardKey: UInt8 = 21
    public static let lock: UInt8 = 22
    public static let unlock: UInt8 = 23
    public static let addIDConstrained: UInt8 = 25
    public static let addSmartcardKeyConstrained: UInt8 = 26
    public static let `extension`: UInt8 = 27
    public static let extensionFailure: UInt8 = 28
    public static let extensionResponse: UInt8 = 29
}

/// SIGN_REQUEST flags (draft-miller-ssh-agent §4.5.1).
public enum SSHAgentSignFlags {
    public static let rsaSHA2_256: UInt32 = 2
    public static let rsaSHA2_512: UInt32 = 4
}

/// One hop of a `restrict-destination-v00@openssh.com` constraint: a user (empty: any), a host name
/// (empty: the origin, for a `from` hop) and the host keys that identify it.
public struct SSHDestinationHop: Hashable, Sendable {
    public var user: String
    public var hostname: String
    /// Host key blobs (kept raw: a hop may name a certificate authority), each with whether it is a CA key.
    public var keys: [HostKey]

    /// A host key of a hop.
    public struct HostKey: Hashable, Sendable {
        public var blob: [UInt8]
        public var isCA: Bool
        public init(blob: [UInt8], isCA: Bool) { self.blob = blob; self.isCA = isCA }
    }

    public init(user: String, hostname: String, keys: [HostKey]) { self.user = user; self.hostname = hostname; self.keys = keys }

    static func read(_ bytes: [UInt8]) throws(SSHAgentWireError) -> SSHDestinationHop {
        var r = SSHWireReader(bytes)
        let user = try r.readText(), host = try r.readText()
        guard try r.readString().isEmpty else { throw .badDestinationConstraint }
        var keys: [HostKey] = []
        while r.remaining > 0 { keys.append(HostKey(blob: try r.readString(), isCA: try r.readBool())) }
        return SSHDestinationHop(user: user, hostname: host, keys: keys)
    }

    var encoded: [UInt8] {
        var w = SSHWireWriter()
        w.writeText(user); w.writeText(hostname); w.writeString([])
        for k in keys { w.writeString(k.blob); w.writeBool(k.isCA) }
        return w.bytes
    }
}

/// One `from > to` hop a restricted key may be used for (OpenSSH PROTOCOL.agent, "restrict-destination").
public struct SSHDestinationConstraint: Hashable, Sendable {
    public var from: SSHDestinationHop
    public var to: SSHDestinationHop
    public init(from: SSHDestinationHop, to: SSHDestinationHop) { self.from = from; self.to = to }
}

/// A key constraint of ADD_ID_CONSTRAINED or ADD_SMARTCARD_KEY_CONSTRAINED (draft-miller-ssh-agent §4.2.6).
public enum SSHKeyConstraint: Hashable, Sendable {
    /// 1: forget the key after this many seconds.
    case lifetime(seconds: UInt32)
    /// 2: ask for confirmation before each use.
    case confirm
    /// 3 (OpenSSH): at most this many signatures (XMSS keys).
    case maxSignatures(UInt32)
    /// 255 `restrict-destination-v00@openssh.com`: the hops the key may be used on.
    case restrictDestination([SSHDestinationConstraint])
    /// 255 `sk-provider@openssh.com`: the FIDO middleware library.
    case skProvider(String)
    /// 255 `associated-certs-v00@openssh.com`: certificates for a smartcard key (blobs kept raw).
    case associatedCerts(certOnly: Bool, certificates: [[UInt8]])

    static let restrictDestinationName = "restrict-destination-v00@openssh.com"
    static let skProviderName = "sk-provider@openssh.com"
    static let associatedCertsName = "associated-certs-v00@openssh.com"

    /// The rule used to reject duplicates: each kind at most once per request.
    var kind: Int {
        switch self {
        case .lifetime: 1
        case .confirm: 2
        case .maxSignatures: 3
        case .restrictDestination: 4
        case .skProvider: 5
        case .associatedCerts: 6
        }
    }

    static func readAll(from r: inout SSHWireReader) throws(SSHAgentWireError) -> [SSHKeyConstraint] {
        var out: [SSHKeyConstraint] = []
        while r.remaining > 0 {
            let c = try read(from: &r)
            guard !out.contains(where: { $0.kind == c.kind }) else { throw .duplicateConstraint }
            out.append(c)
        }
        return out
    }

    static func read(from r: inout SSHWireReader) throws(SSHAgentWireError) -> SSHKeyConstraint {
        let type = try r.readByte()
        switch type {
        case 1: return .lifetime(seconds: try r.readUInt32())
        case 2: return .confirm
        case 3: return .maxSignatures(try r.readUInt32())
        case 255:
            let name = try r.readText()
            switch name {
            case restrictDestinationName:
                var outer = SSHWireReader(try r.readString())
                var list: [SSHDestinationConstraint] = []
                while outer.remaining > 0 {
                    var one = SSHWireReader(try outer.readString())
                    let from = try SSHDestinationHop.read(try one.readString())
                    let to = try SSHDestinationHop.read(try one.readString())
                    guard try one.readString().isEmpty else { throw .badDestinationConstraint }
                    try one.finish()
                    // PROTOCOL.agent: `from` names no user, and a host exactly when it lists keys;
                    // `to` names a host and at least one key.
                    guard from.user.isEmpty, from.hostname.isEmpty == from.keys.isEmpty,
                          !to.hostname.isEmpty, !to.keys.isEmpty else { throw .badDestinationConstraint }
                    list.append(SSHDestinationConstraint(from: from, to: to))
                }
                return .restrictDestination(list)
            case skProviderName:
                return .skProvider(try r.readText())
            case associatedCertsName:
                let certOnly = try r.readBool()
                var inner = SSHWireReader(try r.readString())
                var certs: [[UInt8]] = []
                while inner.remaining > 0 { certs.append(try inner.readString()) }
                return .associatedCerts(certOnly: certOnly, certificates: certs)
            default:
                throw .unknownConstraintExtension(name)
            }
        default:
            throw .unknownConstraint(type)
        }
    }

    func write(to w: inout SSHWireWriter) {
        switch self {
        case .lifetime(let s): w.writeByte(1); w.writeUInt32(s)
        case .confirm: w.writeByte(2)
        case .maxSignatures(let n): w.writeByte(3); w.writeUInt32(n)
        case .restrictDestination(let list):
            w.writeByte(255); w.writeText(Self.restrictDestinationName)
            var outer = SSHWireWriter()
            for c in list {
                var one = SSHWireWriter()
                one.writeString(c.from.encoded); one.writeString(c.to.encoded); one.writeString([])
                outer.writeString(one.bytes)
            }
            w.writeString(outer.bytes)
        case .skProvider(let p): w.writeByte(255); w.writeText(Self.skProviderName); w.writeText(p)
        case .associatedCerts(let certOnly, let certs):
            w.writeByte(255); w.writeText(Self.associatedCertsName); w.writeBool(certOnly)
            var inner = SSHWireWriter()
            for c in certs { inner.writeString(c) }
            w.writeString(inner.bytes)
        }
    }
}

/// `session-bind@openssh.com` (OpenSSH PROTOCOL.agent): the host key and session of the connection
/// a forwarded or local agent is serving, signed by that host key.
public struct SSHSessionBind: Hashable, Sendable {
    /// The server's host key blob (kept raw; parse with ``SSHWirePublicKey/init(blob:)``).
    public var hostKey: [UInt8]
    public var sessionIdentifier: [UInt8]
    /// The host key's signature blob over the session identifier.
    public var signature: [UInt8]
    public var isForwarding: Bool
    public init(hostKey: [UInt8], sessionIdentifier: [UInt8], signature: [UInt8], isForwarding: Bool) {
        self.hostKey = hostKey; self.sessionIdentifier = sessionIdentifier; self.signature = signature; self.isForwarding = isForwarding
    }
}

/// An EXTENSION (27) request.
public enum SSHAgentExtensionRequest: Hashable, Sendable {
    /// `query`: which extensions the agent supports.
    case query
    case sessionBind(SSHSessionBind)
    /// Any other extension: its name and the bytes after it, uninterpreted.
    case other(name: String, contents: [UInt8])
}

/// A client's request to the agent (draft-miller-ssh-agent §4).
///
/// Requests that carry secrets (ADD_IDENTITY's key, LOCK's passphrase, a smartcard PIN) hold them as
/// ``SecureBytes``; the caller wipes the frame buffer it decoded them from (``secureZero(_:)``).
public enum SSHAgentRequest: Sendable {
    case requestIdentities
    /// The key blob is kept raw (the agent looks it up; an unknown one gets FAILURE).
    case signRequest(keyBlob: [UInt8], data: [UInt8], flags: UInt32)
    /// ADD_IDENTITY (17) when `constraints` is empty, else ADD_ID_CONSTRAINED (25).
    case addIdentity(SSHWirePrivateKey, comment: String, constraints: [SSHKeyConstraint])
    /// ADD_IDENTITY / ADD_ID_CONSTRAINED of a certificate key (`*-cert-v01@openssh.com`): the key is
    /// listed by its certificate and signs with the certified key.
    case addCertificate(SSHCertifiedPrivateKey, comment: String, constraints: [SSHKeyConstraint])
    /// ADD_IDENTITY / ADD_ID_CONSTRAINED of a FIDO key (`sk-ssh-ed25519@openssh.com`,
    /// `sk-ecdsa-sha2-nistp256@openssh.com`): its key handle, which an authenticator signs with
    /// through the middleware the `sk-provider@openssh.com` constraint names.
    case addSecurityKey(SSHSecurityKeyPrivateKey, comment: String, constraints: [SSHKeyConstraint])
    case removeIdentity(keyBlob: [UInt8])
    case removeAllIdentities
    case lock(passphrase: SecureBytes)
    case unlock(passphrase: SecureBytes)
    /// ADD_SMARTCARD_KEY (20) when `constraints` is empty, else ADD_SMARTCARD_KEY_CONSTRAINED (26).
    case addSmartcardKey(provider: String, pin: SecureBytes, constraints: [SSHKeyConstraint])
    case removeSmartcardKey(provider: String, pin: SecureBytes)
    case `extension`(SSHAgentExtensionRequest)
    /// A message type this codec does not know (its body is ignored; the agent answers FAILURE).
    case unknown(type: UInt8)

    /// Decodes a frame body (type byte first). Never traps; throws ``SSHAgentWireError``.
    public static func decode(body: [UInt8]) throws(SSHAgentWireError) -> SSHAgentRequest {
        var r = SSHWireReader(body)
        let type = try r.readByte()
        let request: SSHAgentRequest
        switch type {
        case SSHAgentMessageType.requestIdentities: request = .requestIdentities
        case SSHAgentMessageType.signRequest:
            request = .signRequest(keyBlob: try r.readString(), data: try r.readString(), flags: try r.readUInt32())
        case SSHAgentMessageType.addIdentity, SSHAgentMessageType.addIDConstrained:
            // A certificate key type names the certificate that follows.
            var peek = r
            let keyType = String(decoding: try peek.readString(), as: UTF8.self)
            if let algorithm = SSHSecurityKeyAlgorithm(keyType: keyType) {
                r = peek
                let key = try SSHSecurityKeyPrivateKey.read(algorithm, from: &r)
                let comment = try r.readText()
                let constraints = type == SSHAgentMessageType.addIDConstrained ? try SSHKeyConstraint.readAll(from: &r) : []
                request = .addSecurityKey(key, comment: comment, constraints: constraints)
            } else if SSHCertificate.plainKeyType(of: keyType) != nil {
                r = peek
                let certified = try SSHCertifiedPrivateKey.read(certificateType: keyType, from: &r)
                let comment = try r.readText()
                let constraints = type == SSHAgentMessageType.addIDConstrained ? try SSHKeyConstraint.readAll(from: &r) : []
                request = .addCertificate(certified, comment: comment, constraints: constraints)
            } else {
                let key = try SSHWirePrivateKey.read(from: &r)
                let comment = try r.readText()
                let constraints = type == SSHAgentMessageType.addIDConstrained ? try SSHKeyConstraint.readAll(from: &r) : []
                request = .addIdentity(key, comment: comment, constraints: constraints)
            }
        case SSHAgentMessageType.removeIdentity: request = .removeIdentity(keyBlob: try r.readString())
        case SSHAgentMessageType.removeAllIdentities: request = .removeAllIdentities
        case SSHAgentMessageType.lock: request = .lock(passphrase: try r.readSecretString())
        case SSHAgentMessageType.unlock: request = .unlock(passphrase: try r.readSecretString())
        case SSHAgentMessageType.addSmartcardKey, SSHAgentMessageType.addSmartcardKeyConstrained:
            let provider = try r.readText(), pin = try r.readSecretString()
            let constraints = type == SSHAgentMessageType.addSmartcardKeyConstrained ? try SSHKeyConstraint.readAll(from: &r) : []
            request = .addSmartcardKey(provider: provider, pin: pin, constraints: constraints)
        case SSHAgentMessageType.removeSmartcardKey:
            request = .removeSmartcardKey(provider: try r.readText(), pin: try r.readSecretString())
        case SSHAgentMessageType.extension:
            let name = try r.readText()
            switch name {
            case "query": request = .extension(.query)
            case "session-bind@openssh.com":
                request = .extension(.sessionBind(SSHSessionBind(hostKey: try r.readString(), sessionIdentifier: try r.readString(),
                                                                 signature: try r.readString(), isForwarding: try r.readBool())))
            default:
                request = .extension(.other(name: name, contents: try r.readBytes(r.remaining)))
            }
        default:
            return .unknown(type: type)
        }
        try r.finish()
        return request
    }

    /// Decodes a whole frame (length prefix and body).
    public static func decode(frame: [UInt8]) throws(SSHAgentWireError) -> SSHAgentRequest {
        try decode(body: SSHAgentFraming.body(ofFrame: frame))
    }

    /// The message body. Wipe it after sending if the request carries a secret.
    public func encodeBody() -> [UInt8] {
        var w = SSHWireWriter(capacity: sizeBound)
        switch self {
        case .requestIdentities: w.writeByte(SSHAgentMessageType.requestIdentities)
        case .signRequest(let blob, let data, let flags):
            w.writeByte(SSHAgentMessageType.signRequest); w.writeString(blob); w.writeString(data); w.writeUInt32(flags)
        case .addIdentity(let key, let comment, let constraints):
            w.writeByte(constraints.isEmpty ? SSHAgentMessageType.addIdentity : SSHAgentMessageType.addIDConstrained)
            key.write(to: &w)
            w.writeText(comment)
            for c in constraints { c.write(to: &w) }
        case .addCertificate(let certified, let comment, let constraints):
            w.writeByte(constraints.isEmpty ? SSHAgentMessageType.addIdentity : SSHAgentMessageType.addIDConstrained)
            certified.write(to: &w)
            w.writeText(comment)
            for c in constraints { c.write(to: &w) }
        case .addSecurityKey(let key, let comment, let constraints):
            w.writeByte(constraints.isEmpty ? SSHAgentMessageType.addIdentity : SSHAgentMessageType.addIDConstrained)
            key.write(to: &w)
            w.writeText(comment)
            for c in constraints { c.write(to: &w) }
        case .removeIdentity(let blob): w.writeByte(SSHAgentMessageType.removeIdentity); w.writeString(blob)
        case .removeAllIdentities: w.writeByte(SSHAgentMessageType.removeAllIdentities)
        case .lock(let p): w.writeByte(SSHAgentMessageType.lock); w.writeSecretString(p)
        case .unlock(let p): w.writeByte(SSHAgentMessageType.unlock); w.writeSecretString(p)
        case .addSmartcardKey(let provider, let pin, let constraints):
            w.writeByte(constraints.isEmpty ? SSHAgentMessageType.addSmartcardKey : SSHAgentMessageType.addSmartcardKeyConstrained)
            w.writeText(provider); w.writeSecretString(pin)
            for c in constraints { c.write(to: &w) }
        case .removeSmartcardKey(let provider, let pin):
            w.writeByte(SSHAgentMessageType.removeSmartcardKey); w.writeText(provider); w.writeSecretString(pin)
        case .extension(let e):
            w.writeByte(SSHAgentMessageType.extension)
            switch e {
            case .query: w.writeText("query")
            case .sessionBind(let b):
                w.writeText("session-bind@openssh.com"); w.writeString(b.hostKey); w.writeString(b.sessionIdentifier)
                w.writeString(b.signature); w.writeBool(b.isForwarding)
            case .other(let name, let contents): w.writeText(name); w.writeRaw(contents)
            }
        case .unknown(let type): w.writeByte(type)
        }
        return w.bytes
    }

    /// The whole frame; throws ``SSHAgentWireError/oversize(_:)`` past the limit.
    public func encodeFrame() throws(SSHAgentWireError) -> [UInt8] {
        var body = encodeBody()
        defer { secureZero(&body) }
        return try SSHAgentFraming.frame(body)
    }

    /// Room for the body, so a secret-carrying writer never reallocates.
    private var sizeBound: Int {
        switch self {
        case .addIdentity(let key, let comment, _): key.encodedSizeBound + comment.utf8.count + 4096
        case .addCertificate(let certified, let comment, _): certified.encodedSizeBound + comment.utf8.count + 4096
        case .addSecurityKey(let key, let comment, _): key.encodedSizeBound + comment.utf8.count + 4096
        case .lock(let p), .unlock(let p), .removeSmartcardKey(_, let p), .addSmartcardKey(_, let p, _): p.count + 4096
        default: 0
        }
    }
}

/// One entry of IDENTITIES_ANSWER.
public struct SSHAgentIdentity: Hashable, Sendable {
    /// The public key blob (kept raw, as a client sees it).
    public var keyBlob: [UInt8]
    public var comment: String
    public init(keyBlob: [UInt8], comment: String) { self.keyBlob = keyBlob; self.comment = comment }
}

/// The agent's reply (draft-miller-ssh-agent §4).
public enum SSHAgentReply: Hashable, Sendable {
    case failure
    case success
    case identities([SSHAgentIdentity])
    /// SIGN_RESPONSE: a signature blob (build it with ``SSHWireSignature/blob``).
    case signResponse(signatureBlob: [UInt8])
    case extensionFailure
    /// The `query` extension's answer: EXTENSION_RESPONSE (29), `string "query"`, then one string per
    /// supported extension name.
    case queryResponse([String])
    /// Any other EXTENSION_RESPONSE: the extension's name and the bytes after it.
    case extensionResponse(name: String, contents: [UInt8])

    /// Decodes a frame body. Unknown reply types throw ``SSHAgentWireError/unknownReply(_:)``.
    public static func decode(body: [UInt8]) throws(SSHAgentWireError) -> SSHAgentReply {
        var r = SSHWireReader(body)
        let type = try r.readByte()
        let reply: SSHAgentReply
        switch type {
        case SSHAgentMessageType.failure: reply = .failure
        case SSHAgentMessageType.success: reply = .success
        case SSHAgentMessageType.extensionFailure: reply = .extensionFailure
        case SSHAgentMessageType.identitiesAnswer:
            let count = try r.readUInt32()
            var list: [SSHAgentIdentity] = []
            // Each entry takes at least 8 bytes: a count beyond that is truncated, not a big allocation.
            guard Int(count) <= r.remaining / 8 else { throw .truncated }
            for _ in 0..<count { list.append(SSHAgentIdentity(keyBlob: try r.readString(), comment: try r.readText())) }
            reply = .identities(list)
        case SSHAgentMessageType.signResponse: reply = .signResponse(signatureBlob: try r.readString())
        case SSHAgentMessageType.extensionResponse:
            let name = try r.readText()
            if name == "query" {
                var names: [String] = []
                while r.remaining > 0 { names.append(try r.readText()) }
                reply = .queryResponse(names)
            } else {
                reply = .extensionResponse(name: name, contents: try r.readBytes(r.remaining))
            }
        default: throw .unknownReply(type)
        }
        try r.finish()
        return reply
    }

    /// Decodes a whole frame (length prefix and body).
    public static func decode(frame: [UInt8]) throws(SSHAgentWireError) -> SSHAgentReply {
        try decode(body: SSHAgentFraming.body(ofFrame: frame))
    }

    /// The message body.
    public func encodeBody() -> [UInt8] {
        var w = SSHWireWriter()
        switch self {
        case .failure: w.writeByte(SSHAgentMessageType.failure)
        case .success: w.writeByte(SSHAgentMessageType.success)
        case .extensionFailure: w.writeByte(SSHAgentMessageType.extensionFailure)
        case .identities(let list):
            w.writeByte(SSHAgentMessageType.identitiesAnswer); w.writeUInt32(UInt32(list.count))
            for i in list { w.writeString(i.keyBlob); w.writeText(i.comment) }
        case .signResponse(let blob): w.writeByte(SSHAgentMessageType.signResponse); w.writeString(blob)
        case .queryResponse(let names):
            w.writeByte(SSHAgentMessageType.extensionResponse); w.writeText("query")
            for n in names { w.writeText(n) }
        case .extensionResponse(let name, let contents):
            w.writeByte(SSHAgentMessageType.extensionResponse); w.writeText(name); w.writeRaw(contents)
        }
        return w.bytes
    }

    /// The whole frame; throws ``SSHAgentWireError/oversize(_:)`` past the limit (e.g. too many identities to list).
    public func encodeFrame() throws(SSHAgentWireError) -> [UInt8] { try SSHAgentFraming.frame(encodeBody()) }
}
