import CSodium

/// Failures of the cryptographic layer. None carries secret material.
public enum CryptoError: Error, Equatable, Sendable {
    /// An AEAD tag or signature did not verify: wrong key, or the bytes were altered.
    case authenticationFailed
    /// Input of the wrong size or shape (a truncated ciphertext, a short key).
    case malformedInput
    /// The key derivation could not get the memory it asked for.
    case keyDerivationFailed
}

/// libsodium initialisation (`sodium_init`), done once per process.
public enum Sodium {
    private static let initialized: Bool = sodium_init() >= 0
    /// Calls `sodium_init` the first time; traps if libsodium cannot start (no entropy source).
    public static func ensureInitialized() {
        precondition(initialized, "sodium_init failed")
    }
}

/// Random bytes from libsodium's CSPRNG.
public enum Random {
    /// `count` public random bytes (nonces, salts, identifiers).
    public static func bytes(_ count: Int) -> [UInt8] {
        Sodium.ensureInitialized()
        var out = [UInt8](repeating: 0, count: count)
        unsafe out.withUnsafeMutableBytes { unsafe randombytes_buf($0.baseAddress!, count) }
        return out
    }
}

/// XChaCha20-Poly1305 (IETF) authenticated encryption, libsodium's `crypto_aead_xchacha20poly1305_ietf_*`.
///
/// Sealed form: 24-byte random nonce ‖ ciphertext ‖ 16-byte tag.
public enum AEAD {
    /// Key size in bytes (32).
    public static let keyBytes = Int(crypto_aead_xchacha20poly1305_ietf_KEYBYTES)
    /// Nonce size in bytes (24).
    public static let nonceBytes = Int(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES)
    /// Tag size in bytes (16).
    public static let tagBytes = Int(crypto_aead_xchacha20poly1305_ietf_ABYTES)
    /// Bytes a sealed box adds to its plaintext.
    public static let overhead = nonceBytes + tagBytes

    /// Encrypts `plaintext` under `key` with associated data `ad`, using a fresh random nonce.
    public static func seal(_ plaintext: UnsafeRawBufferPointer, key: UnsafeRawBufferPointer, ad: [UInt8]) -> [UInt8] {
        precondition(key.count == keyBytes, "AEAD key must be 32 bytes")
        Sodium.ensureInitialized()
        var out = [UInt8](repeating: 0, count: nonceBytes + plaintext.count + tagBytes)
        unsafe out.withUnsafeMutableBufferPointer { o in
            unsafe randombytes_buf(o.baseAddress!, nonceBytes)
            var clen: UInt64 = 0
            _ = unsafe crypto_aead_xchacha20poly1305_ietf_encrypt(
                o.baseAddress! + nonceBytes, &clen,
                plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plaintext.count),
                ad, UInt64(ad.count), nil,
                o.baseAddress!, key.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        return out
    }

    /// Encrypts a secret under a key held in secure memory.
    public static func seal(_ plaintext: SecureBytes, key: SecureBytes, ad: [UInt8]) -> [UInt8] {
        unsafe plaintext.withUnsafeBytes { p in unsafe key.withUnsafeBytes { k in unsafe seal(p, key: k, ad: ad) } }
    }

    /// Decrypts a sealed box into secure memory; throws `.authenticationFailed` if anything was altered.
    public static func open(_ sealed: ArraySlice<UInt8>, key: UnsafeRawBufferPointer, ad: [UInt8]) throws(CryptoError) -> SecureBytes {
        precondition(key.count == keyBytes, "AEAD key must be 32 bytes")
        guard sealed.count >= overhead else { throw .malformedInput }
        let out = SecureBytes(count: sealed.count - overhead)
        let rc: Int32 = unsafe sealed.withUnsafeBufferPointer { s in
            unsafe out.withUnsafeMutableBytes { o in
                var mlen: UInt64 = 0
                return unsafe crypto_aead_xchacha20poly1305_ietf_decrypt(
                    o.baseAddress!.assumingMemoryBound(to: UInt8.self), &mlen, nil,
                    s.baseAddress! + nonceBytes, UInt64(s.count - nonceBytes),
                    ad, UInt64(ad.count),
                    s.baseAddress!, key.baseAddress!.assumingMemoryBound(to: UInt8.self))
            }
        }
        guard rc == 0 else { throw .authenticationFailed }
        return out
    }

    /// Decrypts a sealed box under a key held in secure memory.
    public static func open(_ sealed: ArraySlice<UInt8>, key: SecureBytes, ad: [UInt8]) throws(CryptoError) -> SecureBytes {
        unsafe try key.withUnsafeBytes { k throws(CryptoError) in unsafe try open(sealed, key: k, ad: ad) }
    }
}

/// Keyed BLAKE2b (`crypto_generichash`): blind indexes and key tangling.
public enum KeyedHash {
    /// Hashes the concatenation of `parts` under `key` into `outputBytes` public bytes.
    public static func hash(key: UnsafeRawBufferPointer, parts: [[UInt8]], outputBytes: Int = 32) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: outputBytes)
        unsafe out.withUnsafeMutableBytes { unsafe run(key: key, parts: parts, into: $0) }
        return out
    }

    /// Derives a 32-byte secret from `key` and `parts` straight into secure memory.
    public static func deriveKey(key: UnsafeRawBufferPointer, parts: [[UInt8]]) -> SecureBytes {
        let out = SecureBytes(count: 32)
        unsafe out.withUnsafeMutableBytes { unsafe run(key: key, parts: parts, into: $0) }
        return out
    }

    /// Derives a 32-byte secret from `key` and `parts` given by pointer (secret inputs that live in
    /// secure memory are never copied into an ordinary array). The buffers must stay valid for the call.
    public static func deriveKey(key: UnsafeRawBufferPointer, rawParts: [UnsafeRawBufferPointer]) -> SecureBytes {
        Sodium.ensureInitialized()
        precondition(key.count >= Int(crypto_generichash_KEYBYTES_MIN) && key.count <= Int(crypto_generichash_KEYBYTES_MAX))
        unsafe precondition(rawParts.count <= 16)
        let out = SecureBytes(count: 32)
        unsafe out.withUnsafeMutableBytes { o in
            unsafe withUnsafeTemporaryAllocation(of: UnsafePointer<UInt8>?.self, capacity: rawParts.count) { ptrs in
                unsafe withUnsafeTemporaryAllocation(of: Int.self, capacity: rawParts.count) { lens in
                    for unsafe (i, b) in unsafe rawParts.enumerated() {
                        unsafe ptrs[i] = b.baseAddress.map { unsafe $0.assumingMemoryBound(to: UInt8.self) } ?? UnsafePointer(bitPattern: 1)
                        unsafe lens[i] = b.count
                    }
                    let rc = unsafe coffer_keyed_hash(o.baseAddress!.assumingMemoryBound(to: UInt8.self), o.count,
                                               key.baseAddress!.assumingMemoryBound(to: UInt8.self), key.count,
                                               ptrs.baseAddress!, lens.baseAddress!, rawParts.count)
                    precondition(rc == 0, "crypto_generichash failed")
                }
            }
        }
        return out
    }

    private static func run(key: UnsafeRawBufferPointer, parts: [[UInt8]], into out: UnsafeMutableRawBufferPointer) {
        Sodium.ensureInitialized()
        precondition(key.count >= Int(crypto_generichash_KEYBYTES_MIN) && key.count <= Int(crypto_generichash_KEYBYTES_MAX))
        precondition(parts.count <= 16)
        // Arrays keep their storage alive for the call; collect base pointers without copying.
        unsafe withUnsafeTemporaryAllocation(of: UnsafePointer<UInt8>?.self, capacity: parts.count) { ptrs in
            unsafe withUnsafeTemporaryAllocation(of: Int.self, capacity: parts.count) { lens in
                func go(_ i: Int) {
                    if i == parts.count {
                        let rc = unsafe coffer_keyed_hash(out.baseAddress!.assumingMemoryBound(to: UInt8.self), out.count,
                                                   key.baseAddress!.assumingMemoryBound(to: UInt8.self), key.count,
                                                   ptrs.baseAddress!, lens.baseAddress!, parts.count)
                        precondition(rc == 0, "crypto_generichash failed")
                        return
                    }
                    unsafe parts[i].withUnsafeBufferPointer { b in
                        unsafe ptrs[i] = b.baseAddress ?? UnsafePointer(bitPattern: 1)
                        unsafe lens[i] = b.count
                        go(i + 1)
                    }
                }
                go(0)
            }
        }
    }
}

/// Argon2id password hashing (`crypto_pwhash` with `crypto_pwhash_ALG_ARGON2ID13`).
public enum Argon2id {
    /// Salt size in bytes (16).
    public static let saltBytes = Int(crypto_pwhash_SALTBYTES)
    /// libsodium's floor for Argon2id memory (bytes).
    public static let minimumMemory = Int(crypto_pwhash_MEMLIMIT_MIN)

    /// Derives a 32-byte key from `password` into secure memory.
    public static func deriveKey(password: UnsafeRawBufferPointer, salt: [UInt8],
                                 opsLimit: UInt64, memLimit: Int) throws(CryptoError) -> SecureBytes {
        guard salt.count == saltBytes else { throw .malformedInput }
        Sodium.ensureInitialized()
        let out = SecureBytes(count: 32)
        var empty: CChar = 0
        let rc: Int32 = unsafe out.withUnsafeMutableBytes { o in
            unsafe withUnsafePointer(to: &empty) { emptyPtr in
                unsafe crypto_pwhash(o.baseAddress!.assumingMemoryBound(to: UInt8.self), 32,
                              password.baseAddress?.assumingMemoryBound(to: CChar.self) ?? emptyPtr,
                              UInt64(password.count), salt, opsLimit, memLimit,
                              crypto_pwhash_ALG_ARGON2ID13)
            }
        }
        guard rc == 0 else { throw .keyDerivationFailed }
        return out
    }
}

/// Ed25519 signatures (`crypto_sign_*`), for signed manifests.
public enum Ed25519 {
    /// Public key size (32).
    public static let publicKeyBytes = Int(crypto_sign_PUBLICKEYBYTES)
    /// Signature size (64).
    public static let signatureBytes = Int(crypto_sign_BYTES)

    /// A new key pair; the secret key (64 bytes, libsodium layout) is in secure memory.
    public static func generateKeyPair() -> (publicKey: [UInt8], secretKey: SecureBytes) {
        Sodium.ensureInitialized()
        var pk = [UInt8](repeating: 0, count: publicKeyBytes)
        let sk = SecureBytes(count: Int(crypto_sign_SECRETKEYBYTES))
        unsafe sk.withUnsafeMutableBytes { _ = unsafe crypto_sign_keypair(&pk, $0.baseAddress!.assumingMemoryBound(to: UInt8.self)) }
        return (pk, sk)
    }

    /// A detached signature of `message`.
    public static func sign(_ message: [UInt8], secretKey: SecureBytes) -> [UInt8] {
        var sig = [UInt8](repeating: 0, count: signatureBytes)
        unsafe secretKey.withUnsafeBytes { k in
            _ = unsafe crypto_sign_detached(&sig, nil, message, UInt64(message.count), k.baseAddress!.assumingMemoryBound(to: UInt8.self))
        }
        return sig
    }

    /// True if `signature` is a valid signature of `message` by `publicKey`.
    public static func verify(signature: [UInt8], message: [UInt8], publicKey: [UInt8]) -> Bool {
        Sodium.ensureInitialized()
        guard signature.count == signatureBytes, publicKey.count == publicKeyBytes else { return false }
        return unsafe crypto_sign_verify_detached(signature, message, UInt64(message.count), publicKey) == 0
    }
}
