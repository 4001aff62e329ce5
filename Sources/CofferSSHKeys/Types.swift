/// An SSH key type this module generates, imports and signs with.
public enum SSHKeyAlgorithm: Hashable, Sendable, CustomStringConvertible {
    /// `ssh-ed25519` (libsodium).
    case ed25519
    /// `ecdsa-sha2-nistp256` (OpenSSL), signed over SHA-256.
    case ecdsaP256
    /// `ecdsa-sha2-nistp384` (OpenSSL), signed over SHA-384.
    case ecdsaP384
    /// `ecdsa-sha2-nistp521` (OpenSSL), signed over SHA-512.
    case ecdsaP521
    /// RSA with a modulus of `bits` bits and PKCS#1 v1.5 signatures (OpenSSL).
    case rsa(bits: Int)

    /// The smallest RSA modulus accepted, generated or imported (OpenSSH refuses smaller ones too).
    public static let rsaMinimumBits = 2048
    /// The largest RSA modulus generated: bigger keys take minutes to make.
    public static let rsaMaximumGeneratedBits = 8192
    /// The largest RSA modulus imported (OpenSSH's own limit, SSHBUF_MAX_BIGNUM).
    public static let rsaMaximumBits = 16384

    /// The curve of an ECDSA algorithm; nil for the others.
    public var curve: SSHCurve? {
        switch self {
        case .ecdsaP256: .p256
        case .ecdsaP384: .p384
        case .ecdsaP521: .p521
        case .ed25519, .rsa: nil
        }
    }

    public var description: String {
        switch self {
        case .ed25519: "Ed25519"
        case .ecdsaP256: "ECDSA P-256"
        case .ecdsaP384: "ECDSA P-384"
        case .ecdsaP521: "ECDSA P-521"
        case .rsa(let bits): "RSA \(bits)"
        }
    }
}

/// A NIST curve of ECDSA keys (RFC 5656).
public enum SSHCurve: Hashable, Sendable {
    case p256, p384, p521

    /// The size of a coordinate and of the private scalar d: 32, 48 or 66 bytes.
    public var fieldBytes: Int {
        switch self {
        case .p256: 32
        case .p384: 48
        case .p521: 66
        }
    }

    /// The size of an uncompressed point Q (0x04 ‖ X ‖ Y): 65, 97 or 133 bytes.
    public var pointBytes: Int { 2 * fieldBytes + 1 }

    /// The key algorithm on this curve.
    public var algorithm: SSHKeyAlgorithm {
        switch self {
        case .p256: .ecdsaP256
        case .p384: .ecdsaP384
        case .p521: .ecdsaP521
        }
    }

    /// The curve's size in bits, as the C wall names curves.
    var bits: Int32 {
        switch self {
        case .p256: 256
        case .p384: 384
        case .p521: 521
        }
    }
}

/// The hash of an RSA signature: what the SSH_AGENTC_SIGN_REQUEST flags ask for.
public enum SSHRSAHash: Hashable, Sendable {
    /// `ssh-rsa` (no flag): SHA-1, verified but signed only when the caller allows it.
    case sha1
    /// `rsa-sha2-256` (SSH_AGENT_RSA_SHA2_256).
    case sha256
    /// `rsa-sha2-512` (SSH_AGENT_RSA_SHA2_512).
    case sha512
}

/// A public key in raw components: what the SSH key blob encodes.
public enum SSHPublicKey: Hashable, Sendable {
    /// The 32-byte Ed25519 public key.
    case ed25519([UInt8])
    /// The uncompressed point Q (0x04 ‖ X ‖ Y) on `curve`.
    case ecdsa(curve: SSHCurve, q: [UInt8])
    /// The public exponent and the modulus, big-endian, without leading zero bytes.
    case rsa(e: [UInt8], n: [UInt8])
}

/// A signature in raw components: what the SSH signature blob encodes.
public enum SSHSignature: Hashable, Sendable {
    /// The 64-byte Ed25519 signature.
    case ed25519([UInt8])
    /// ECDSA's r and s, big-endian, unsigned, without leading zero bytes.
    case ecdsa(r: [UInt8], s: [UInt8])
    /// A PKCS#1 v1.5 signature with `hash`, exactly as long as the modulus.
    case rsa(hash: SSHRSAHash, signature: [UInt8])
}

/// Why a key could not be made, imported or used. No case carries secret material: the associated
/// values are algorithm names, component names and sizes.
public enum SSHKeyError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The algorithm or size is not one this module supports (an RSA modulus out of range, say).
    case unsupportedAlgorithm(String)
    /// A component has the wrong size or shape (a truncated point, an empty number).
    case malformedComponent(String)
    /// The components do not form a key: a point off the curve, d·G ≠ Q, p·q ≠ n, a public key that is
    /// not the seed's.
    case inconsistentKey(SSHKeyAlgorithm)
    /// An `ssh-rsa` (SHA-1) signature was asked for and the caller did not allow SHA-1.
    case sha1Refused
    /// The crypto library could not generate the key.
    case generationFailed(SSHKeyAlgorithm)
    /// The crypto library could not sign.
    case signingFailed(SSHKeyAlgorithm)

    public var description: String {
        switch self {
        case .unsupportedAlgorithm(let what): "unsupported SSH key algorithm: \(what)"
        case .malformedComponent(let name): "malformed SSH key component: \(name)"
        case .inconsistentKey(let algorithm): "the \(algorithm) key components do not form a valid key"
        case .sha1Refused: "ssh-rsa (SHA-1) signatures are refused; ask for rsa-sha2-256 or rsa-sha2-512"
        case .generationFailed(let algorithm): "could not generate an \(algorithm) key"
        case .signingFailed(let algorithm): "could not sign with the \(algorithm) key"
        }
    }
}
