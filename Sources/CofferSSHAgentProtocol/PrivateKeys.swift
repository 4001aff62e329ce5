public import CofferCrypto

/// A private key as ADD_IDENTITY carries it (OpenSSH's `sshkey_private_serialize`, PROTOCOL.agent
/// §"Adding keys to the agent"), with every secret part in guarded memory:
/// - ed25519: `string "ssh-ed25519", string pub(32), string seed ‖ pub (64)`
/// - ECDSA: `string "ecdsa-sha2-<curve>", string <curve>, string Q, mpint d`
/// - RSA: `string "ssh-rsa", mpint n, mpint e, mpint d, mpint iqmp, mpint p, mpint q`
///
/// Public parts are raw as in ``SSHWirePublicKey``; secret mpints are big-endian magnitudes (decoding
/// yields them without leading zeros; pad d to ``SSHECDSACurve/scalarBytes`` where a fixed width is needed). The same encoding behind a version byte is the stored form (``encodeStored()``).
public enum SSHWirePrivateKey: Sendable {
    /// `secret` is the 64-byte libsodium secret key: the 32-byte seed, then the public key.
    case ed25519(publicKey: [UInt8], secret: SecureBytes)
    case ecdsa(SSHECDSACurve, q: [UInt8], d: SecureBytes)
    case rsa(n: [UInt8], e: [UInt8], d: SecureBytes, iqmp: SecureBytes, p: SecureBytes, q: SecureBytes)

    /// Bytes of an ed25519 secret key (seed ‖ public key).
    public static let ed25519SecretBytes = 64
    /// The only stored-form version this codec writes and reads.
    public static let storedVersion: UInt8 = 1

    /// The public half.
    public var publicKey: SSHWirePublicKey {
        switch self {
        case .ed25519(let pk, _): .ed25519(pk)
        case .ecdsa(let c, let q, _): .ecdsa(c, q: q)
        case .rsa(let n, let e, _, _, _, _): .rsa(exponent: e, modulus: n)
        }
    }

    /// Checks sizes and consistency: an ed25519 key of 32 + 64 bytes whose secret ends with its
    /// public key; an ECDSA Q of the curve's size and a non-zero d of at most scalarBytes bytes
    /// (leading zeros allowed here: a fixed-width d from the crypto layer is fine; decoding yields
    /// it without them). RSA parts are not judged here (key size and consistency are the crypto layer's).
    public func validate() throws(SSHAgentWireError) {
        switch self {
        case .ed25519(let pk, let sk):
            guard pk.count == SSHWirePublicKey.ed25519Bytes, sk.count == Self.ed25519SecretBytes else { throw .badLength }
            let tail = unsafe sk.withUnsafeBytes { unsafe Array($0[32..<64]) }
            guard tail == pk else { throw .inconsistentKey }
        case .ecdsa(let c, let q, let d):
            try SSHECDSACurve.checkPoint(q, c)
            let nonZero = unsafe d.withUnsafeBytes { unsafe $0.contains { $0 != 0 } }
            guard d.count <= c.scalarBytes, nonZero else { throw .badLength }
        case .rsa(let n, let e, _, _, _, _):
            guard !n.isEmpty, !e.isEmpty else { throw .badLength }
        }
    }

    /// Reads the key's fields from `r` and validates them.
    static func read(from r: inout SSHWireReader) throws(SSHAgentWireError) -> SSHWirePrivateKey {
        let type = try r.readString()
        let name = String(decoding: type, as: UTF8.self)
        let key: SSHWirePrivateKey
        switch name {
        case "ssh-ed25519":
            key = .ed25519(publicKey: try r.readString(), secret: try r.readSecretString())
        case "ssh-rsa":
            let n = try r.readPositiveMPInt(), e = try r.readPositiveMPInt()
            let d = try r.readSecretMPInt(), iqmp = try r.readSecretMPInt(), p = try r.readSecretMPInt(), q = try r.readSecretMPInt()
            key = .rsa(n: n, e: e, d: d, iqmp: iqmp, p: p, q: q)
        default:
            guard case .ecdsa(let c, let q) = try SSHWirePublicKey.readBody(type: type, from: &r) else { throw .unknownKeyType(name) }
            key = .ecdsa(c, q: q, d: try r.readSecretMPInt())
        }
        try key.validate()
        return key
    }

    /// An upper bound of the encoded size (so a writer never reallocates over secret bytes).
    var encodedSizeBound: Int {
        let secrets: Int
        switch self {
        case .ed25519(_, let sk): secrets = sk.count
        case .ecdsa(_, _, let d): secrets = d.count
        case .rsa(_, _, let d, let iqmp, let p, let q): secrets = d.count + iqmp.count + p.count + q.count
        }
        return publicKey.blob.count + secrets + 64
    }

    /// Writes the key's fields.
    func write(to w: inout SSHWireWriter) {
        switch self {
        case .ed25519(let pk, let sk):
            w.writeText("ssh-ed25519"); w.writeString(pk); w.writeSecretString(sk)
        case .ecdsa(let c, let q, let d):
            w.writeText(c.keyType); w.writeText(c.rawValue); w.writeString(q); w.writeSecretMPInt(d)
        case .rsa(let n, let e, let d, let iqmp, let p, let q):
            w.writeText("ssh-rsa"); w.writePositiveMPInt(n); w.writePositiveMPInt(e)
            w.writeSecretMPInt(d); w.writeSecretMPInt(iqmp); w.writeSecretMPInt(p); w.writeSecretMPInt(q)
        }
    }

    /// Decodes exactly one key (no trailing bytes) from guarded memory.
    public init(wire: SecureBytes) throws(SSHAgentWireError) {
        self = try Self.decodeCopy(of: wire, stored: false)
    }

    /// The key's wire form, in guarded memory.
    public func encodeWire() -> SecureBytes {
        var w = SSHWireWriter(capacity: encodedSizeBound)
        write(to: &w)
        var out = w.bytes
        w = SSHWireWriter()
        return SecureBytes(consuming: &out)
    }

    /// The stored form of a key item's secret: the byte ``storedVersion`` (1), then the wire form.
    public func encodeStored() -> SecureBytes {
        var w = SSHWireWriter(capacity: encodedSizeBound + 1)
        w.writeByte(Self.storedVersion)
        write(to: &w)
        var out = w.bytes
        w = SSHWireWriter()
        return SecureBytes(consuming: &out)
    }

    /// Decodes a stored form; throws ``SSHAgentWireError/unsupportedStoredVersion(_:)`` for a version other than 1.
    public static func decodeStored(_ stored: SecureBytes) throws(SSHAgentWireError) -> SSHWirePrivateKey {
        try decodeCopy(of: stored, stored: true)
    }

    /// Decodes from a temporary copy of `secure`, wiped once no reader holds it (a reader alive at
    /// the wipe would make it copy-on-write a fresh, unwiped buffer).
    private static func decodeCopy(of secure: SecureBytes, stored: Bool) throws(SSHAgentWireError) -> SSHWirePrivateKey {
        var bytes = unsafe secure.withUnsafeBytes { unsafe Array($0) }
        let result = Result { () throws(SSHAgentWireError) -> SSHWirePrivateKey in try decodeAll(bytes, stored: stored) }
        secureZero(&bytes)
        return try result.get()
    }

    private static func decodeAll(_ bytes: [UInt8], stored: Bool) throws(SSHAgentWireError) -> SSHWirePrivateKey {
        var r = SSHWireReader(bytes)
        if stored {
            let version = try r.readByte()
            guard version == storedVersion else { throw .unsupportedStoredVersion(version) }
        }
        let key = try SSHWirePrivateKey.read(from: &r)
        try r.finish()
        return key
    }
}

/// A private key with its OpenSSH certificate, as ADD_IDENTITY carries a `*-cert-v01@openssh.com` key
/// (OpenSSH's `sshkey_private_serialize` of a certificate key; draft-miller-ssh-agent §4.2.4): the
/// certificate type, the certificate blob, then only the secret parts the certificate's key lacks:
/// - ed25519: `string pub(32), string seed ‖ pub (64)` (pub MUST be the certified key)
/// - ECDSA: `mpint d` (Q is the certificate's)
/// - RSA: `mpint d, mpint iqmp, mpint p, mpint q` (n and e are the certificate's)
///
/// The agent lists such a key by its certificate blob and signs with the certified key, as OpenSSH's
/// agent does; it does not judge the certificate (its CA, validity and principals are the server's).
public struct SSHCertifiedPrivateKey: Sendable {
    public let certificate: SSHCertificate
    /// The certified key with its secret parts.
    public let key: SSHWirePrivateKey

    public init(certificate: SSHCertificate, key: SSHWirePrivateKey) throws(SSHAgentWireError) {
        guard key.publicKey.blob == certificate.publicKey.blob else { throw .inconsistentKey }
        self.certificate = certificate
        self.key = key
    }

    /// Reads the fields after the certificate type `name` (already read) and validates them.
    static func read(certificateType name: String, from r: inout SSHWireReader) throws(SSHAgentWireError) -> SSHCertifiedPrivateKey {
        let certificate = try SSHCertificate(blob: try r.readString())
        guard certificate.certificateType == name else { throw .inconsistentKey }
        let key: SSHWirePrivateKey
        switch certificate.publicKey {
        case .ed25519(let certified):
            let pk = try r.readString()
            guard pk == certified else { throw .inconsistentKey }
            key = .ed25519(publicKey: pk, secret: try r.readSecretString())
        case .ecdsa(let curve, let q):
            key = .ecdsa(curve, q: q, d: try r.readSecretMPInt())
        case .rsa(let e, let n):
            let d = try r.readSecretMPInt(), iqmp = try r.readSecretMPInt(), p = try r.readSecretMPInt(), q = try r.readSecretMPInt()
            key = .rsa(n: n, e: e, d: d, iqmp: iqmp, p: p, q: q)
        }
        try key.validate()
        return try SSHCertifiedPrivateKey(certificate: certificate, key: key)
    }

    /// Writes the certificate type, the certificate and the secret parts.
    func write(to w: inout SSHWireWriter) {
        w.writeText(certificate.certificateType)
        w.writeString(certificate.blob)
        switch key {
        case .ed25519(let pk, let sk): w.writeString(pk); w.writeSecretString(sk)
        case .ecdsa(_, _, let d): w.writeSecretMPInt(d)
        case .rsa(_, _, let d, let iqmp, let p, let q):
            w.writeSecretMPInt(d); w.writeSecretMPInt(iqmp); w.writeSecretMPInt(p); w.writeSecretMPInt(q)
        }
    }

    var encodedSizeBound: Int { certificate.blob.count + key.encodedSizeBound + 64 }
}
