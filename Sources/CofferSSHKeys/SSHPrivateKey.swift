public import CofferCrypto
internal import COpenSSL

/// A private key's raw components. Secret numbers live in ``SecureBytes`` (libsodium's guarded memory).
public enum SSHPrivateKeyComponents: Sendable {
    /// The 32-byte seed (RFC 8032's private key) and the 32-byte public key derived from it.
    case ed25519(seed: SecureBytes, publicKey: [UInt8])
    /// The uncompressed point Q and the scalar d, big-endian in ``SSHCurve/fieldBytes`` bytes.
    case ecdsa(curve: SSHCurve, q: [UInt8], d: SecureBytes)
    /// n, e, d, p, q and iqmp (q⁻¹ mod p), big-endian without leading zero bytes (OpenSSH's fields).
    case rsa(n: [UInt8], e: [UInt8], d: SecureBytes, p: SecureBytes, q: SecureBytes, iqmp: SecureBytes)
}

/// An SSH private key: its raw components, checked to form a key, and the operations on it.
///
/// Ed25519 uses libsodium (through CofferCrypto); ECDSA and RSA use OpenSSL 3 through the CSSHCrypto.h
/// wall (in COpenSSL), which imports the key from these components for each operation and frees it after, so no copy
/// of a secret outlives a call outside ``SecureBytes``.
public struct SSHPrivateKey: Sendable {
    /// The key's components (for storing it as a keychain item; never for sending anywhere).
    public let components: SSHPrivateKeyComponents
    /// libsodium's 64-byte secret key (seed ‖ public key), kept so signing needs no derivation.
    private let ed25519SecretKey: SecureBytes?

    /// The key's algorithm (for RSA, with the modulus size in bits).
    public var algorithm: SSHKeyAlgorithm {
        switch components {
        case .ed25519: .ed25519
        case .ecdsa(let curve, _, _): curve.algorithm
        case .rsa(let n, _, _, _, _, _): .rsa(bits: Self.bitLength(n))
        }
    }

    /// The public half, as the SSH key blob encodes it.
    public var publicComponents: SSHPublicKey {
        switch components {
        case .ed25519(_, let pk): .ed25519(pk)
        case .ecdsa(let curve, let q, _): .ecdsa(curve: curve, q: q)
        case .rsa(let n, let e, _, _, _, _): .rsa(e: e, n: n)
        }
    }

    private init(checked components: SSHPrivateKeyComponents) {
        self.components = components
        if case .ed25519(let seed, _) = components {
            ed25519SecretKey = Ed25519.keyPair(seed: seed).secretKey
        } else {
            ed25519SecretKey = nil
        }
    }

    /// A new key of `algorithm` from the system's CSPRNG (libsodium's for Ed25519, OpenSSL's for the
    /// others). RSA keys have e = 65537 and a modulus of ``SSHKeyAlgorithm/rsaMinimumBits`` to
    /// ``SSHKeyAlgorithm/rsaMaximumGeneratedBits`` bits, a multiple of 16.
    public static func generate(_ algorithm: SSHKeyAlgorithm) throws(SSHKeyError) -> SSHPrivateKey {
        switch algorithm {
        case .ed25519:
            let seed = SecureBytes.random(count: Ed25519.seedBytes)
            return SSHPrivateKey(checked: .ed25519(seed: seed, publicKey: Ed25519.keyPair(seed: seed).publicKey))
        case .ecdsaP256, .ecdsaP384, .ecdsaP521:
            let curve = algorithm.curve!
            var q = [UInt8](repeating: 0, count: curve.pointBytes)
            let d = SecureBytes(count: curve.fieldBytes)
            let rc = unsafe d.withUnsafeMutableBytes { dp in
                unsafe cssh_ec_generate(curve.bits, &q, q.count, dp.baseAddress!.assumingMemoryBound(to: UInt8.self), dp.count)
            }
            guard rc == CSSH_OK else { throw .generationFailed(algorithm) }
            return SSHPrivateKey(checked: .ecdsa(curve: curve, q: q, d: d))
        case .rsa(let bits):
            guard bits >= SSHKeyAlgorithm.rsaMinimumBits, bits <= SSHKeyAlgorithm.rsaMaximumGeneratedBits, bits % 16 == 0 else {
                throw .unsupportedAlgorithm("RSA keys are generated with \(SSHKeyAlgorithm.rsaMinimumBits) to "
                    + "\(SSHKeyAlgorithm.rsaMaximumGeneratedBits) bits, a multiple of 16 (asked: \(bits))")
            }
            var n = [UInt8](repeating: 0, count: bits / 8)
            let d = SecureBytes(count: bits / 8), p = SecureBytes(count: bits / 16), q = SecureBytes(count: bits / 16)
            let iqmp = SecureBytes(count: bits / 16)
            let rc = unsafe d.withUnsafeMutableBytes { dp in
                unsafe p.withUnsafeMutableBytes { pp in
                    unsafe q.withUnsafeMutableBytes { qp in
                        unsafe iqmp.withUnsafeMutableBytes { ip in
                            unsafe cssh_rsa_generate(UInt32(bits), &n, Self.pointer(dp), Self.pointer(pp), Self.pointer(qp), Self.pointer(ip))
                        }
                    }
                }
            }
            guard rc == CSSH_OK else { throw .generationFailed(algorithm) }
            return SSHPrivateKey(checked: .rsa(n: Self.minimal(n), e: [0x01, 0x00, 0x01], d: Self.minimal(d), p: Self.minimal(p),
                                               q: Self.minimal(q), iqmp: Self.minimal(iqmp)))
        }
    }

    /// A key from imported components (`ssh-add`, a private key file), checked before it is accepted:
    /// Ed25519's public key must be the seed's; ECDSA's Q must lie on the curve and equal d·G
    /// (OpenSSL's `EVP_PKEY_check`); RSA's numbers must form a key (`EVP_PKEY_check`: p and q prime,
    /// p·q = n, e·d ≡ 1, iqmp = q⁻¹ mod p) with a modulus of at least 2048 bits.
    ///
    /// Numbers may come with leading zero bytes (as SSH mpints decode); they are normalised: ECDSA's d
    /// to the field size, RSA's numbers to no leading zeros. The key keeps its own copies of the
    /// secrets: the caller's buffers stay the caller's to wipe.
    public init(components: SSHPrivateKeyComponents) throws(SSHKeyError) {
        switch components {
        case .ed25519(let seed, let publicKey):
            guard seed.count == Ed25519.seedBytes else { throw .malformedComponent("Ed25519 seed (\(seed.count) bytes, not 32)") }
            guard publicKey.count == Ed25519.publicKeyBytes else {
                throw .malformedComponent("Ed25519 public key (\(publicKey.count) bytes, not 32)")
            }
            guard Ed25519.keyPair(seed: seed).publicKey == publicKey else { throw .inconsistentKey(.ed25519) }
            self.init(checked: .ed25519(seed: seed.slice(0..<seed.count), publicKey: publicKey))
        case .ecdsa(let curve, let q, let rawD):
            guard q.count == curve.pointBytes, q.first == 0x04 else {
                throw .malformedComponent("\(curve.algorithm) point Q (\(q.count) bytes; an uncompressed point has \(curve.pointBytes))")
            }
            guard let d = Self.padded(rawD, to: curve.fieldBytes) else {
                throw .malformedComponent("\(curve.algorithm) private scalar d (longer than \(curve.fieldBytes) bytes)")
            }
            let rc = unsafe q.withCBytes { qb in unsafe d.withCBytes { db in unsafe cssh_ec_check(curve.bits, qb, db) } }
            guard rc == CSSH_OK else { throw .inconsistentKey(curve.algorithm) }
            self.init(checked: .ecdsa(curve: curve, q: q, d: d))
        case .rsa(let rawN, let rawE, let rawD, let rawP, let rawQ, let rawIQMP):
            let n = Self.minimal(rawN), e = Self.minimal(rawE)
            let bits = Self.bitLength(n)
            guard bits >= SSHKeyAlgorithm.rsaMinimumBits, bits <= SSHKeyAlgorithm.rsaMaximumBits else {
                throw .unsupportedAlgorithm("RSA with a \(bits)-bit modulus (\(SSHKeyAlgorithm.rsaMinimumBits) to "
                    + "\(SSHKeyAlgorithm.rsaMaximumBits) bits are accepted)")
            }
            let d = Self.minimal(rawD), p = Self.minimal(rawP), q = Self.minimal(rawQ), iqmp = Self.minimal(rawIQMP)
            for (name, value) in [("e", e.count), ("d", d.count), ("p", p.count), ("q", q.count), ("iqmp", iqmp.count)]
            where value == 0 || value > n.count {
                throw .malformedComponent("RSA \(name) (\(value) bytes)")
            }
            let key = SSHPrivateKey(checked: .rsa(n: n, e: e, d: d, p: p, q: q, iqmp: iqmp))
            guard unsafe key.withRSAKey({ unsafe cssh_rsa_check($0) }) == CSSH_OK else { throw .inconsistentKey(.rsa(bits: bits)) }
            self = key
        }
    }

    /// The signature of `data`: Ed25519 (RFC 8032), ECDSA with the curve's hash (RFC 5656: SHA-256 for
    /// P-256, SHA-384 for P-384, SHA-512 for P-521), or RSA PKCS#1 v1.5 with `hash` (ignored by the
    /// other algorithms). SHA-1 (`ssh-rsa`) is refused with ``SSHKeyError/sha1Refused`` unless
    /// `allowSHA1` is true.
    public func sign(data: [UInt8], hash: SSHRSAHash = .sha512, allowSHA1: Bool = false) throws(SSHKeyError) -> SSHSignature {
        switch components {
        case .ed25519:
            return .ed25519(Ed25519.sign(data, secretKey: ed25519SecretKey!))
        case .ecdsa(let curve, let q, let d):
            var r = [UInt8](repeating: 0, count: curve.fieldBytes), s = r
            var rLength = r.count, sLength = s.count
            let rc = unsafe q.withCBytes { qb in
                unsafe d.withCBytes { db in
                    unsafe data.withCBytes { mb in unsafe cssh_ec_sign(curve.bits, qb, db, mb, &r, &rLength, &s, &sLength) }
                }
            }
            guard rc == CSSH_OK else { throw .signingFailed(algorithm) }
            return .ecdsa(r: Array(r.prefix(rLength)), s: Array(s.prefix(sLength)))
        case .rsa(let n, _, _, _, _, _):
            guard hash != .sha1 || allowSHA1 else { throw .sha1Refused }
            var signature = [UInt8](repeating: 0, count: n.count)
            let rc = unsafe withRSAKey { key in
                unsafe data.withCBytes { mb in unsafe cssh_rsa_sign(key, hash.cssh, mb, &signature, signature.count) }
            }
            guard rc == CSSH_OK else { throw .signingFailed(algorithm) }
            return .rsa(hash: hash, signature: signature)
        }
    }

    /// True if `signature` is this key's signature of `data` (``SSHPublicKey/verify(_:data:)``).
    public func verify(_ signature: SSHSignature, data: [UInt8]) -> Bool {
        publicComponents.verify(signature, data: data)
    }

    /// Runs `body` with the RSA components as the C wall takes them.
    private func withRSAKey(_ body: (cssh_rsa_key) -> Int32) -> Int32 {
        guard case .rsa(let n, let e, let d, let p, let q, let iqmp) = components else { return CSSH_ERR_ARGUMENT }
        return unsafe n.withCBytes { nb in
            unsafe e.withCBytes { eb in
                unsafe d.withCBytes { db in
                    unsafe p.withCBytes { pb in
                        unsafe q.withCBytes { qb in
                            unsafe iqmp.withCBytes { ib in unsafe body(cssh_rsa_key(n: nb, e: eb, d: db, p: pb, q: qb, iqmp: ib)) }
                        }
                    }
                }
            }
        }
    }

    /// The number of bits of the big-endian number `n` (without leading zero bytes).
    static func bitLength(_ n: [UInt8]) -> Int {
        guard let first = n.first else { return 0 }
        return (n.count - 1) * 8 + (8 - first.leadingZeroBitCount)
    }

    /// `bytes` without its leading zero bytes.
    static func minimal(_ bytes: [UInt8]) -> [UInt8] { Array(bytes.drop { $0 == 0 }) }

    /// `secret` without its leading zero bytes, always in a new secure buffer: the key owns its copy,
    /// and the original stays its owner's to wipe.
    static func minimal(_ secret: SecureBytes) -> SecureBytes {
        let zeros = unsafe secret.withUnsafeBytes { raw in unsafe raw.prefix { $0 == 0 }.count }
        return secret.slice(zeros..<secret.count)
    }

    /// `secret` left-padded with zeros to `width` bytes (after dropping leading zeros), or nil if longer.
    static func padded(_ secret: SecureBytes, to width: Int) -> SecureBytes? {
        let value = minimal(secret)
        guard value.count <= width else { return nil }
        if value.count == width { return value }
        let out = SecureBytes(count: width)
        unsafe value.withUnsafeBytes { src in
            unsafe out.withUnsafeMutableBytes { dst in
                unsafe UnsafeMutableRawBufferPointer(rebasing: dst[(width - src.count)...]).copyMemory(from: src)
            }
        }
        return out
    }

    private static func pointer(_ raw: UnsafeMutableRawBufferPointer) -> UnsafeMutablePointer<UInt8> {
        unsafe raw.baseAddress!.assumingMemoryBound(to: UInt8.self)
    }
}

extension SSHPublicKey {
    /// The key's algorithm (for RSA, with the modulus size in bits).
    public var algorithm: SSHKeyAlgorithm {
        switch self {
        case .ed25519: .ed25519
        case .ecdsa(let curve, _): curve.algorithm
        case .rsa(_, let n): .rsa(bits: SSHPrivateKey.bitLength(SSHPrivateKey.minimal(n)))
        }
    }

    /// Checks a public key alone (one sent by a client to name a key): sizes, an ECDSA point on its
    /// curve (`EVP_PKEY_public_check`), an RSA modulus of an accepted size.
    public func validate() throws(SSHKeyError) {
        switch self {
        case .ed25519(let pk):
            guard pk.count == Ed25519.publicKeyBytes else { throw .malformedComponent("Ed25519 public key (\(pk.count) bytes, not 32)") }
        case .ecdsa(let curve, let q):
            guard q.count == curve.pointBytes, q.first == 0x04 else {
                throw .malformedComponent("\(curve.algorithm) point Q (\(q.count) bytes; an uncompressed point has \(curve.pointBytes))")
            }
            guard unsafe q.withCBytes({ unsafe cssh_ec_check_public(curve.bits, $0) }) == CSSH_OK else {
                throw .inconsistentKey(curve.algorithm)
            }
        case .rsa(let e, let n):
            let bits = SSHPrivateKey.bitLength(SSHPrivateKey.minimal(n))
            guard bits >= SSHKeyAlgorithm.rsaMinimumBits, bits <= SSHKeyAlgorithm.rsaMaximumBits else {
                throw .unsupportedAlgorithm("RSA with a \(bits)-bit modulus (\(SSHKeyAlgorithm.rsaMinimumBits) to "
                    + "\(SSHKeyAlgorithm.rsaMaximumBits) bits are accepted)")
            }
            guard !SSHPrivateKey.minimal(e).isEmpty else { throw .malformedComponent("RSA e (zero)") }
        }
    }

    /// True if `signature` is a valid signature of `data` by this key, of this key's kind (an RSA
    /// signature with SHA-1 included: verifying it is harmless).
    public func verify(_ signature: SSHSignature, data: [UInt8]) -> Bool {
        switch (self, signature) {
        case (.ed25519(let pk), .ed25519(let sig)):
            return Ed25519.verify(signature: sig, message: data, publicKey: pk)
        case (.ecdsa(let curve, let q), .ecdsa(let r, let s)):
            return unsafe q.withCBytes { qb in
                unsafe data.withCBytes { mb in
                    unsafe r.withCBytes { rb in unsafe s.withCBytes { sb in unsafe cssh_ec_verify(curve.bits, qb, mb, rb, sb) } }
                }
            } == CSSH_OK
        case (.rsa(let e, let n), .rsa(let hash, let sig)):
            return unsafe n.withCBytes { nb in
                unsafe e.withCBytes { eb in
                    unsafe data.withCBytes { mb in unsafe sig.withCBytes { sb in unsafe cssh_rsa_verify(nb, eb, hash.cssh, mb, sb) } }
                }
            } == CSSH_OK
        default:
            return false
        }
    }
}

extension SSHRSAHash {
    /// The C wall's name of the hash.
    var cssh: Int32 {
        switch self {
        case .sha1: CSSH_HASH_SHA1
        case .sha256: CSSH_HASH_SHA256
        case .sha512: CSSH_HASH_SHA512
        }
    }
}

extension [UInt8] {
    /// Runs `body` with the bytes as the C wall's `cssh_bytes`.
    func withCBytes<R>(_ body: (cssh_bytes) -> R) -> R {
        unsafe withUnsafeBufferPointer { unsafe body(cssh_bytes(ptr: $0.baseAddress, len: $0.count)) }
    }
}

extension SecureBytes {
    /// Runs `body` with the secret bytes as the C wall's `cssh_bytes` (borrowed, never copied).
    func withCBytes<R>(_ body: (cssh_bytes) -> R) -> R {
        unsafe withUnsafeBytes { unsafe body(cssh_bytes(ptr: $0.baseAddress?.assumingMemoryBound(to: UInt8.self), len: $0.count)) }
    }
}
