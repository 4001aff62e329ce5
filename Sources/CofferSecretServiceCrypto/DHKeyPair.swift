import COpenSSL
package import CofferCrypto

/// Diffie-Hellman over RFC 2409's Second Oakley Group (1024-bit MODP, g = 2) through the C wall:
/// values big-endian, 128 bytes, private values in secure memory. Package-visible for the spec's
/// test vectors; sessions use it through ``SecretServiceSession``.
package enum DHKeyPair {
    package static let bytes = Int(CSS_DH_BYTES)

    /// The group's prime p, 128 bytes (OpenSSL's copy of RFC 2409 §6.2).
    package static func prime() throws(SecretServiceSessionError) -> [UInt8] {
        var p = [UInt8](repeating: 0, count: bytes)
        guard unsafe css_dh_prime(&p, p.count) == CSS_OK else { throw .cryptoFailed("the RFC 2409 prime") }
        return p
    }

    /// A fresh key pair from OpenSSL's generator.
    package static func generate() throws(SecretServiceSessionError) -> (privateValue: SecureBytes, publicValue: [UInt8]) {
        let x = SecureBytes(count: bytes)
        var y = [UInt8](repeating: 0, count: bytes)
        let rc = unsafe x.withUnsafeMutableBytes { xp in unsafe css_dh_generate(xp.bytePointer, xp.count, &y, y.count) }
        guard rc == CSS_OK else { throw .cryptoFailed("DH key generation") }
        return (x, y)
    }

    /// g^x mod p for a given private value (1 to 128 bytes, 0 < x < p − 1).
    package static func publicValue(of x: SecureBytes) throws(SecretServiceSessionError) -> [UInt8] {
        var y = [UInt8](repeating: 0, count: bytes)
        let rc = unsafe x.withCBytes { xb in unsafe css_dh_public(xb, &y, y.count) }
        guard rc == CSS_OK else { throw .cryptoFailed(rc == CSS_ERR_ARGUMENT ? "DH private value out of range" : "DH public value") }
        return y
    }

    /// Throws ``SecretServiceSessionError/invalidPublicValue(_:)`` with the kind of fault unless
    /// `y` is a public value of the group.
    package static func checkPublic(_ y: [UInt8]) throws(SecretServiceSessionError) {
        guard !y.isEmpty, y.count <= bytes else { throw .invalidPublicValue(try faultKind(y)) }
        switch unsafe y.withCBytes({ unsafe css_dh_check_public($0) }) {
        case CSS_OK: return
        case CSS_ERR_BAD_PUBLIC: throw .invalidPublicValue(try faultKind(y))
        default: throw .cryptoFailed("DH public value check")
        }
    }

    /// What is wrong with a value OpenSSL refused, by comparison with the prime (public values only).
    private static func faultKind(_ y: [UInt8]) throws(SecretServiceSessionError) -> String {
        if y.isEmpty { return "empty" }
        if y.count > bytes { return "\(y.count) bytes, longer than the 128-byte prime" }
        let v = Array(y.drop { $0 == 0 })
        let padded = [UInt8](repeating: 0, count: bytes - v.count) + v
        let p = try prime()
        var pMinus1 = p
        pMinus1[bytes - 1] -= 1 // p is odd
        if v.isEmpty || v == [1] { return "0 or 1" }
        if padded == pMinus1 { return "p − 1" }
        if !padded.lexicographicallyPrecedes(p) { return "not less than the prime" }
        return "not in the prime-order subgroup"
    }

    /// The shared secret y^x mod p, 128 bytes left-padded, in secure memory. `publicValue`: ours, as
    /// ``generate()`` gave it with `x` (not computed again; nil computes it).
    package static func sharedSecret(privateValue x: SecureBytes, publicValue: [UInt8]? = nil, peer y: [UInt8]) throws(SecretServiceSessionError) -> SecureBytes {
        let shared = SecureBytes(count: bytes)
        let rc = unsafe x.withCBytes { xb in
            unsafe y.withCBytes { yb in
                unsafe shared.withUnsafeMutableBytes { out in
                    guard let publicValue else { return unsafe css_dh_shared_secret(xb, yb, out.bytePointer, out.count) }
                    return unsafe publicValue.withCBytes { pb in unsafe css_dh_shared_secret_pair(xb, pb, yb, out.bytePointer, out.count) }
                }
            }
        }
        switch rc {
        case CSS_OK: return shared
        case CSS_ERR_BAD_PUBLIC: throw .invalidPublicValue(try faultKind(y))
        case CSS_ERR_ARGUMENT: throw .cryptoFailed("DH private value out of range")
        default: throw .cryptoFailed("DH key agreement")
        }
    }
}

extension [UInt8] {
    /// Runs `body` with the bytes as the C wall's `css_bytes`.
    func withCBytes<R>(_ body: (css_bytes) -> R) -> R {
        unsafe withUnsafeBufferPointer { unsafe body(css_bytes(ptr: $0.baseAddress, len: $0.count)) }
    }
}

extension SecureBytes {
    /// Runs `body` with the secret bytes as the C wall's `css_bytes` (borrowed, never copied).
    func withCBytes<R>(_ body: (css_bytes) -> R) -> R {
        unsafe withUnsafeBytes { unsafe body(css_bytes(ptr: $0.baseAddress?.assumingMemoryBound(to: UInt8.self), len: $0.count)) }
    }
}

extension UnsafeRawBufferPointer {
    /// The first byte, typed for the C wall.
    var bytePointer: UnsafePointer<UInt8>? { unsafe baseAddress?.assumingMemoryBound(to: UInt8.self) }
}

extension UnsafeMutableRawBufferPointer {
    /// The first byte, typed for the C wall.
    var bytePointer: UnsafeMutablePointer<UInt8>? { unsafe baseAddress?.assumingMemoryBound(to: UInt8.self) }
}
