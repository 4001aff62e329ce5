public import CofferCrypto

/// The key types of FIDO authenticators (OpenSSH PROTOCOL.u2f): the key lives on the device, the
/// agent holds only its key handle and names the application it was made for.
public enum SSHSecurityKeyAlgorithm: String, Sendable, CaseIterable {
    case ed25519 = "sk-ssh-ed25519@openssh.com"
    case ecdsaP256 = "sk-ecdsa-sha2-nistp256@openssh.com"

    /// The key type name that opens the blob (also the signature algorithm's name).
    public var keyType: String { rawValue }

    /// The algorithm number of OpenSSH's middleware interface (sk-api.h: `SSH_SK_ECDSA` 0, `SSH_SK_ED25519` 1).
    public var middlewareAlgorithm: UInt32 {
        switch self {
        case .ecdsaP256: 0
        case .ed25519: 1
        }
    }

    /// The algorithm a key type names, if it is a FIDO one.
    public init?(keyType: String) { self.init(rawValue: keyType) }
}

/// The flags a FIDO key carries (sk-api.h), and the authenticator reports in each signature.
public enum SSHSecurityKeyFlags {
    /// `SSH_SK_USER_PRESENCE_REQD`: the device wants a touch for each signature.
    public static let userPresenceRequired: UInt8 = 0x01
    /// `SSH_SK_USER_VERIFICATION_REQD` (`ssh-keygen -O verify-required`): the device wants a PIN or
    /// a fingerprint for each signature.
    public static let userVerificationRequired: UInt8 = 0x04
    /// `SSH_SK_FORCE_OPERATION`.
    public static let forceOperation: UInt8 = 0x10
    /// `SSH_SK_RESIDENT_KEY`: the key handle is stored on the device too.
    public static let residentKey: UInt8 = 0x20
}

/// A FIDO key's public key blob (PROTOCOL.u2f): its type's fields as for the plain key, then
/// `string application`:
/// - `sk-ssh-ed25519@openssh.com`: `string pub (32)`, `string application`
/// - `sk-ecdsa-sha2-nistp256@openssh.com`: `string "nistp256"`, `string Q (65)`, `string application`
public struct SSHSecurityKeyPublicKey: Hashable, Sendable, SSHPublicKeyBlob {
    public let algorithm: SSHSecurityKeyAlgorithm
    /// The authenticator's public key: 32 ed25519 bytes, or the uncompressed P-256 point Q.
    public let key: [UInt8]
    /// The FIDO application (relying party) the key was made for: `ssh:` unless chosen otherwise.
    public let application: String

    /// Checks the key's size (and Q's form) and that the application is a C string (no NUL) that is not empty.
    public init(algorithm: SSHSecurityKeyAlgorithm, key: [UInt8], application: String) throws(SSHAgentWireError) {
        switch algorithm {
        case .ed25519: guard key.count == SSHWirePublicKey.ed25519Bytes else { throw .badLength }
        case .ecdsaP256: try SSHECDSACurve.checkPoint(key, .nistp256)
        }
        guard !application.isEmpty, !application.utf8.contains(0) else { throw .badApplication }
        self.algorithm = algorithm
        self.key = key
        self.application = application
    }

    /// Decodes a whole key blob (no trailing bytes); a blob of another type is ``SSHAgentWireError/unknownKeyType(_:)``.
    public init(blob: [UInt8]) throws(SSHAgentWireError) {
        var r = SSHWireReader(blob)
        let name = try r.readText()
        guard let algorithm = SSHSecurityKeyAlgorithm(keyType: name) else { throw .unknownKeyType(name) }
        self = try Self.readBody(algorithm, from: &r)
        try r.finish()
    }

    /// Reads the fields after the type name (shared with the private key, which starts the same way).
    static func readBody(_ algorithm: SSHSecurityKeyAlgorithm, from r: inout SSHWireReader) throws(SSHAgentWireError) -> SSHSecurityKeyPublicKey {
        let key: [UInt8]
        switch algorithm {
        case .ed25519:
            key = try r.readString()
        case .ecdsaP256:
            guard try r.readString() == Array(SSHECDSACurve.nistp256.rawValue.utf8) else { throw .badCurve }
            key = try r.readString()
        }
        return try SSHSecurityKeyPublicKey(algorithm: algorithm, key: key, application: try r.readText())
    }

    /// Writes the blob's fields (not length-prefixed).
    public func write(to w: inout SSHWireWriter) {
        w.writeText(algorithm.keyType)
        if algorithm == .ecdsaP256 { w.writeText(SSHECDSACurve.nistp256.rawValue) }
        w.writeString(key)
        w.writeText(application)
    }

    /// The key type name.
    public var keyType: String { algorithm.keyType }
}

/// A FIDO key as ADD_IDENTITY carries it (OpenSSH's `sshkey_private_serialize`,
/// `sshkey_serialize_private_sk`): the public key's fields, then `byte flags`, `string key handle`,
/// `string reserved`. There is no private key here: the key handle is what the authenticator needs to
/// find (or unwrap) its key, and only the device signs. The handle is still treated as a secret, as
/// OpenSSH keeps it in the private key file: it lives in guarded memory and is never logged.
public struct SSHSecurityKeyPrivateKey: Sendable {
    public let publicKey: SSHSecurityKeyPublicKey
    /// ``SSHSecurityKeyFlags`` bits, given to the middleware with each signature.
    public let flags: UInt8
    public let keyHandle: SecureBytes
    /// Reserved by OpenSSH (empty today); kept as it came, so the key re-encodes to the same bytes.
    public let reserved: [UInt8]

    public init(publicKey: SSHSecurityKeyPublicKey, flags: UInt8, keyHandle: SecureBytes, reserved: [UInt8] = []) throws(SSHAgentWireError) {
        guard keyHandle.count > 0 else { throw .badLength }
        self.publicKey = publicKey
        self.flags = flags
        self.keyHandle = keyHandle
        self.reserved = reserved
    }

    /// Reads the fields after the type name.
    static func read(_ algorithm: SSHSecurityKeyAlgorithm, from r: inout SSHWireReader) throws(SSHAgentWireError) -> SSHSecurityKeyPrivateKey {
        let publicKey = try SSHSecurityKeyPublicKey.readBody(algorithm, from: &r)
        let flags = try r.readByte()
        let handle = try r.readSecretString()
        return try SSHSecurityKeyPrivateKey(publicKey: publicKey, flags: flags, keyHandle: handle, reserved: try r.readString())
    }

    /// Writes the key's fields.
    func write(to w: inout SSHWireWriter) {
        publicKey.write(to: &w)
        w.writeByte(flags)
        w.writeSecretString(keyHandle)
        w.writeString(reserved)
    }

    /// An upper bound of the encoded size (so a writer never reallocates over the key handle).
    var encodedSizeBound: Int { publicKey.blob.count + keyHandle.count + reserved.count + 64 }

    /// The key as ADD_IDENTITY carries it (OpenSSH's `sshkey_private_serialize`: what OpenSSH's
    /// `ssh-sk-helper` takes), in guarded memory.
    public func encodeWire() -> SecureBytes {
        var w = SSHWireWriter(capacity: encodedSizeBound)
        write(to: &w)
        var out = w.bytes
        w = SSHWireWriter()
        return SecureBytes(consuming: &out)
    }
}

/// A FIDO key's signature blob (PROTOCOL.u2f): `string algorithm`, the signature as the plain key's
/// (ed25519: `string sig (64)`; ECDSA: `string (mpint r ‖ mpint s)`), then `byte flags` and
/// `uint32 counter` as the authenticator reported them. What the device signed is not the data but
/// ``signedBytes(application:flags:counter:data:)``.
public struct SSHSecurityKeySignature: Hashable, Sendable {
    /// The signature proper.
    public enum Body: Hashable, Sendable {
        case ed25519([UInt8])
        /// r and s as big-endian magnitudes without leading zeros.
        case ecdsa(r: [UInt8], s: [UInt8])
    }

    public let algorithm: SSHSecurityKeyAlgorithm
    public let body: Body
    /// The authenticator's flags for this signature (bit 0: the person was present).
    public let flags: UInt8
    /// The authenticator's signature counter.
    public let counter: UInt32

    /// Checks sizes as for the plain key types: an ed25519 signature of 64 bytes; r and s non-zero
    /// and at most 32 bytes each (leading zeros dropped).
    public init(algorithm: SSHSecurityKeyAlgorithm, body: Body, flags: UInt8, counter: UInt32) throws(SSHAgentWireError) {
        switch (algorithm, body) {
        case (.ed25519, .ed25519(let s)):
            guard s.count == SSHWireSignature.ed25519Bytes else { throw .badLength }
            self.body = body
        case (.ecdsaP256, .ecdsa(let r, let s)):
            guard case .ecdsa(_, let mr, let ms) = try SSHWireSignature.ecdsa(validating: .nistp256, r: r, s: s) else { throw .badLength }
            self.body = .ecdsa(r: mr, s: ms)
        default:
            throw .badLength
        }
        self.algorithm = algorithm
        self.flags = flags
        self.counter = counter
    }

    /// Decodes a whole signature blob (no trailing bytes, in the blob or in ECDSA's inner string).
    public init(blob: [UInt8]) throws(SSHAgentWireError) {
        var rd = SSHWireReader(blob)
        let name = try rd.readText()
        guard let algorithm = SSHSecurityKeyAlgorithm(keyType: name) else { throw .unknownKeyType(name) }
        let inner = try rd.readString()
        let flags = try rd.readByte()
        let counter = try rd.readUInt32()
        try rd.finish()
        switch algorithm {
        case .ed25519:
            try self.init(algorithm: algorithm, body: .ed25519(inner), flags: flags, counter: counter)
        case .ecdsaP256:
            var ir = SSHWireReader(inner)
            let r = try ir.readPositiveMPInt(), s = try ir.readPositiveMPInt()
            try ir.finish()
            try self.init(algorithm: algorithm, body: .ecdsa(r: r, s: s), flags: flags, counter: counter)
        }
    }

    /// The signature blob.
    public var blob: [UInt8] {
        var w = SSHWireWriter()
        w.writeText(algorithm.keyType)
        switch body {
        case .ed25519(let s): w.writeString(s)
        case .ecdsa(let r, let s):
            var inner = SSHWireWriter()
            inner.writePositiveMPInt(r)
            inner.writePositiveMPInt(s)
            w.writeString(inner.bytes)
        }
        w.writeByte(flags)
        w.writeUInt32(counter)
        return w.bytes
    }

    /// What the authenticator signs (OpenSSH's `ssh_ed25519_sk_verify`, `ssh_ecdsa_sk_verify`):
    /// SHA-256(application) ‖ flags ‖ uint32 counter ‖ SHA-256(data). An ed25519 key signs these 69
    /// bytes; a P-256 key signs their SHA-256 (ECDSA with SHA-256 over them).
    public static func signedBytes(application: String, flags: UInt8, counter: UInt32, data: [UInt8]) -> [UInt8] {
        var w = SSHWireWriter(capacity: 69)
        w.writeRaw(SHA256.hash(Array(application.utf8)))
        w.writeByte(flags)
        w.writeUInt32(counter)
        w.writeRaw(SHA256.hash(data))
        return w.bytes
    }
}
