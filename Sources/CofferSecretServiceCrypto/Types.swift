public import CofferCrypto

/// The transport-encryption algorithms of the Secret Service API 0.2 (`OpenSession`'s first argument).
public enum SecretServiceAlgorithm: String, Hashable, Sendable, CaseIterable {
    /// `plain`: secrets cross the bus as they are (parameters empty).
    case plain = "plain"
    /// `dh-ietf1024-sha256-aes128-cbc-pkcs7`: Diffie-Hellman over RFC 2409's 1024-bit MODP group,
    /// HKDF-SHA256 to a 16-byte key, AES-128-CBC with PKCS#7 padding and a fresh IV per secret.
    case dhIETF1024SHA256AES128CBCPKCS7 = "dh-ietf1024-sha256-aes128-cbc-pkcs7"
}

/// Why a session could not be opened or a secret not be encrypted or decrypted. Each case names the
/// D-Bus error the Secret Service front end answers with (``dbusErrorName``); descriptions give
/// sizes and algorithm names, never a secret or a key.
public enum SecretServiceSessionError: Error, Hashable, Sendable, CustomStringConvertible {
    /// `OpenSession` named an algorithm this module does not implement (the name, at most 64 characters of it).
    case unsupportedAlgorithm(String)
    /// The client's DH public value is not one of the group: empty, longer than 128 bytes, 0, 1,
    /// p − 1, at least p, or outside the prime-order subgroup. The reason says which kind.
    case invalidPublicValue(String)
    /// A secret's parameters are not this session's: not 16 bytes (the IV) for the DH session,
    /// not empty for `plain`.
    case invalidParameters(expected: Int, actual: Int)
    /// A DH session's encrypted value is not a non-zero multiple of 16 bytes.
    case invalidValueLength(Int)
    /// The decrypted value does not end in valid PKCS#7 padding: encrypted under another key or IV,
    /// or altered.
    case invalidPadding
    /// A client-side handshake got a server output of the wrong kind (not empty for `plain`).
    case invalidServerOutput(String)
    /// OpenSSL failed (out of memory, key generation); nothing about the input.
    case cryptoFailed(String)

    /// The D-Bus error name the Secret Service spec gives this failure:
    /// `org.freedesktop.DBus.Error.NotSupported` for an unsupported algorithm,
    /// `org.freedesktop.DBus.Error.InvalidArgs` for bad input, `org.freedesktop.DBus.Error.Failed`
    /// when the crypto library failed.
    public var dbusErrorName: String {
        switch self {
        case .unsupportedAlgorithm: "org.freedesktop.DBus.Error.NotSupported"
        case .invalidPublicValue, .invalidParameters, .invalidValueLength, .invalidPadding, .invalidServerOutput:
            "org.freedesktop.DBus.Error.InvalidArgs"
        case .cryptoFailed: "org.freedesktop.DBus.Error.Failed"
        }
    }

    public var description: String {
        switch self {
        case .unsupportedAlgorithm(let name): "unsupported Secret Service session algorithm \"\(name)\""
        case .invalidPublicValue(let reason): "invalid DH public value: \(reason)"
        case .invalidParameters(let expected, let actual):
            "invalid secret parameters: \(actual) bytes, the session's algorithm takes \(expected)"
        case .invalidValueLength(let n): "invalid encrypted secret length \(n): not a non-zero multiple of 16 bytes"
        case .invalidPadding: "the secret does not decrypt under this session's key (bad PKCS#7 padding)"
        case .invalidServerOutput(let reason): "invalid OpenSession output: \(reason)"
        case .cryptoFailed(let what): "the crypto library failed: \(what)"
        }
    }
}

/// A secret as the Secret Service carries it (the `Secret` struct's `parameters` and `value`; the
/// session path and content type are the front end's): for the DH session the IV and the
/// ciphertext, for `plain` no parameters and the secret itself, so ``value`` lives in secure memory.
public struct SecretServiceEncryptedSecret: Sendable {
    /// The IV (16 bytes) for the DH session; empty for `plain`.
    public let parameters: [UInt8]
    /// The ciphertext (a non-zero multiple of 16 bytes) for the DH session; the secret for `plain`.
    public let value: SecureBytes
}
