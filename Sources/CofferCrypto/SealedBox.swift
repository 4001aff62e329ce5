import CSodium

/// Anonymous public-key encryption to an X25519 key: libsodium's sealed boxes (`crypto_box_seal`),
/// for wrapping a key for one recipient device (sync's circle key, issue #29). The sender is not
/// authenticated by the box itself; whoever needs to know the sender signs around it.
///
/// Sealed form: ephemeral public key (32) ‖ XSalsa20-Poly1305 ciphertext ‖ tag (16).
public enum SealedBox {
    /// X25519 public and secret key size (32).
    public static let publicKeyBytes = Int(crypto_box_PUBLICKEYBYTES)
    public static let secretKeyBytes = Int(crypto_box_SECRETKEYBYTES)
    /// Bytes a sealed box adds to its plaintext (48).
    public static let overhead = Int(crypto_box_sealbytes())

    /// A new X25519 key pair; the secret key in secure memory.
    public static func generateKeyPair() -> (publicKey: [UInt8], secretKey: SecureBytes) {
        Sodium.ensureInitialized()
        var pk = [UInt8](repeating: 0, count: publicKeyBytes)
        let sk = SecureBytes(count: secretKeyBytes)
        unsafe sk.withUnsafeMutableBytes { _ = unsafe crypto_box_keypair(&pk, $0.baseAddress!.assumingMemoryBound(to: UInt8.self)) }
        return (pk, sk)
    }

    /// The public key of an X25519 secret key (`crypto_scalarmult_base`).
    public static func publicKey(secretKey: SecureBytes) -> [UInt8] {
        precondition(secretKey.count == secretKeyBytes, "X25519 secret key must be 32 bytes")
        Sodium.ensureInitialized()
        var pk = [UInt8](repeating: 0, count: publicKeyBytes)
        unsafe secretKey.withUnsafeBytes { _ = unsafe crypto_scalarmult_base(&pk, $0.baseAddress!.assumingMemoryBound(to: UInt8.self)) }
        return pk
    }

    /// Seals `plaintext` (a secret) for the holder of `publicKey`; nil if the key is not a usable
    /// X25519 public key (wrong size, or libsodium refuses it).
    public static func seal(_ plaintext: SecureBytes, to publicKey: [UInt8]) -> [UInt8]? {
        guard publicKey.count == publicKeyBytes else { return nil }
        Sodium.ensureInitialized()
        var out = [UInt8](repeating: 0, count: plaintext.count + overhead)
        let rc: Int32 = unsafe plaintext.withUnsafeBytes { p in
            unsafe out.withUnsafeMutableBufferPointer { o in
                unsafe crypto_box_seal(o.baseAddress!, p.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(p.count), publicKey)
            }
        }
        return rc == 0 ? out : nil
    }

    /// Opens a box sealed for this key pair into secure memory; throws `.authenticationFailed` if it
    /// was sealed for another key or altered, `.malformedInput` if it is too short.
    public static func open(_ sealed: ArraySlice<UInt8>, publicKey: [UInt8], secretKey: SecureBytes) throws(CryptoError) -> SecureBytes {
        guard sealed.count >= overhead, publicKey.count == publicKeyBytes, secretKey.count == secretKeyBytes else { throw .malformedInput }
        let out = SecureBytes(count: sealed.count - overhead)
        let rc: Int32 = unsafe sealed.withUnsafeBufferPointer { s in
            unsafe secretKey.withUnsafeBytes { k in
                unsafe out.withUnsafeMutableBytes { o in
                    unsafe crypto_box_seal_open(o.baseAddress!.assumingMemoryBound(to: UInt8.self), s.baseAddress!, UInt64(s.count),
                                                publicKey, k.baseAddress!.assumingMemoryBound(to: UInt8.self))
                }
            }
        }
        guard rc == 0 else { throw .authenticationFailed }
        return out
    }
}
