import CSodium

extension Ed25519 {
    /// Seed size (32): the secret from which a key pair is derived deterministically.
    public static let seedBytes = Int(crypto_sign_SEEDBYTES)
    /// Secret key size (64, libsodium's layout: seed ‖ public key).
    public static let secretKeyBytes = Int(crypto_sign_SECRETKEYBYTES)

    /// The key pair derived from `seed` (`crypto_sign_seed_keypair`): the same seed always gives the
    /// same keys, so fixed test keys and keys restored from a backed-up seed are reproducible.
    public static func keyPair(seed: SecureBytes) -> (publicKey: [UInt8], secretKey: SecureBytes) {
        precondition(seed.count == seedBytes, "Ed25519 seed must be 32 bytes")
        Sodium.ensureInitialized()
        var pk = [UInt8](repeating: 0, count: publicKeyBytes)
        let sk = SecureBytes(count: secretKeyBytes)
        unsafe seed.withUnsafeBytes { s in
            unsafe sk.withUnsafeMutableBytes { k in
                _ = unsafe crypto_sign_seed_keypair(&pk, k.baseAddress!.assumingMemoryBound(to: UInt8.self),
                                             s.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
        }
        return (pk, sk)
    }

    /// The public key inside a 64-byte libsodium secret key (`crypto_sign_ed25519_sk_to_pk`).
    public static func publicKey(secretKey: SecureBytes) -> [UInt8] {
        precondition(secretKey.count == secretKeyBytes, "Ed25519 secret key must be 64 bytes")
        var pk = [UInt8](repeating: 0, count: publicKeyBytes)
        unsafe secretKey.withUnsafeBytes { k in
            _ = unsafe crypto_sign_ed25519_sk_to_pk(&pk, k.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        return pk
    }
}
