import CofferCrypto
package import CofferSSHAgentProtocol
package import CofferSSHKeys

// The one place the wire codec's SSH types (CofferSSHAgentProtocol) and the crypto layer's
// (CofferSSHKeys) meet: both name their types SSHPublicKey, SSHSignature and SSHPrivateKey, so each
// is spelled with its module here.

extension SSHECDSACurve {
    /// The crypto layer's curve.
    package var cryptoCurve: SSHCurve {
        switch self {
        case .nistp256: .p256
        case .nistp384: .p384
        case .nistp521: .p521
        }
    }
}

extension SSHWirePrivateKey {
    /// The key as the crypto layer holds it, checked to form a key (``CofferSSHKeys/SSHPrivateKey/init(components:)``).
    /// Secret parts move from secure memory to secure memory.
    package func cryptoKey() throws(SSHKeyError) -> SSHPrivateKey {
        switch self {
        case .ed25519(let publicKey, let secret):
            // The wire secret is seed ‖ public key; the crypto layer takes the seed.
            return try SSHPrivateKey(components: .ed25519(seed: secret.slice(0..<Ed25519.seedBytes), publicKey: publicKey))
        case .ecdsa(let curve, let q, let d):
            return try SSHPrivateKey(components: .ecdsa(curve: curve.cryptoCurve, q: q, d: d))
        case .rsa(let n, let e, let d, let iqmp, let p, let q):
            return try SSHPrivateKey(components: .rsa(n: n, e: e, d: d, p: p, q: q, iqmp: iqmp))
        }
    }
}

extension SSHWirePublicKey {
    /// The key as the crypto layer verifies with it.
    package var cryptoKey: SSHPublicKey {
        switch self {
        case .ed25519(let pk): .ed25519(pk)
        case .ecdsa(let curve, let q): .ecdsa(curve: curve.cryptoCurve, q: q)
        case .rsa(let e, let n): .rsa(e: e, n: n)
        }
    }

    /// The ECDSA curve of the key; nil for the others.
    package var ecdsaCurve: SSHECDSACurve? {
        if case .ecdsa(let curve, _) = self { return curve }
        return nil
    }
}

extension SSHWireSignature {
    /// A signature the crypto layer made with a key whose public half is `key`, as the wire carries
    /// it; nil if the two disagree (never for a signature this key made).
    package init?(_ signature: SSHSignature, by key: SSHWirePublicKey) {
        switch signature {
        case .ed25519(let s):
            guard let wire = try? Self.ed25519(validating: s) else { return nil }
            self = wire
        case .ecdsa(let r, let s):
            guard let curve = key.ecdsaCurve, let wire = try? Self.ecdsa(validating: curve, r: r, s: s) else { return nil }
            self = wire
        case .rsa(let hash, let s):
            let algorithm: SSHRSASignatureAlgorithm = switch hash {
            case .sha1: .sha1
            case .sha256: .sha256
            case .sha512: .sha512
            }
            guard let wire = try? Self.rsa(validating: algorithm, s) else { return nil }
            self = wire
        }
    }

    /// The signature as the crypto layer verifies it.
    package var cryptoSignature: SSHSignature {
        switch self {
        case .ed25519(let s): .ed25519(s)
        case .ecdsa(_, let r, let s): .ecdsa(r: r, s: s)
        case .rsa(let algorithm, let s): .rsa(hash: algorithm.cryptoHash, signature: s)
        }
    }
}

extension SSHRSASignatureAlgorithm {
    /// The hash the crypto layer signs with.
    package var cryptoHash: SSHRSAHash {
        switch self {
        case .sha1: .sha1
        case .sha256: .sha256
        case .sha512: .sha512
        }
    }
}

extension SSHCurve {
    /// The wire codec's curve.
    package var wireCurve: SSHECDSACurve {
        switch self {
        case .p256: .nistp256
        case .p384: .nistp384
        case .p521: .nistp521
        }
    }
}

extension SSHPrivateKey {
    /// The key in the wire codec's form (to store it as a keychain item). Secret parts move from
    /// secure memory to secure memory.
    package var wireKey: SSHWirePrivateKey {
        switch components {
        case .ed25519(let seed, let publicKey):
            // The wire secret is seed ‖ public key (libsodium's secret key).
            let secret = SecureBytes(concatenating: [seed, publicKey.withUnsafeBytes { SecureBytes(copying: $0) }])
            return .ed25519(publicKey: publicKey, secret: secret)
        case .ecdsa(let curve, let q, let d):
            return .ecdsa(curve.wireCurve, q: q, d: d)
        case .rsa(let n, let e, let d, let p, let q, let iqmp):
            return .rsa(n: n, e: e, d: d, iqmp: iqmp, p: p, q: q)
        }
    }
}
