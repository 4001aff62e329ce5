import COpenSSL
public import CofferCrypto

/// One Secret Service session's transport encryption: what `OpenSession` negotiates and every
/// `Secret` struct of the session is encrypted with (Secret Service API 0.2, "Transfer of Secrets").
///
/// ``open(algorithm:input:)`` is the server's side: the client's algorithm name and input in, the
/// output to send back and the session out. ``SecretServiceClientHandshake`` is the client's side
/// (for importing from another provider). A session holds only its AES key, in secure memory; the
/// DH private value and the shared secret are wiped before ``open(algorithm:input:)`` returns.
public final class SecretServiceSession: Sendable {
    /// The session's algorithm.
    public let algorithm: SecretServiceAlgorithm
    /// The AES-128 key (DH session only).
    private let key: SecureBytes?

    private init(algorithm: SecretServiceAlgorithm, key: SecureBytes?) {
        self.algorithm = algorithm
        self.key = key
    }

    /// Opens a session for a client: `algorithm` as the client named it, `input` the client's
    /// input (for the DH session its public value, big-endian, 1 to 128 bytes; ignored for `plain`).
    /// Returns the output for the client (our public value, 128 bytes; empty for `plain`).
    public static func open(algorithm name: String, input: [UInt8]) throws(SecretServiceSessionError)
        -> (output: [UInt8], session: SecretServiceSession) {
        let algorithm = try SecretServiceAlgorithm.named(name)
        switch algorithm {
        case .plain:
            return ([], SecretServiceSession(algorithm: .plain, key: nil))
        case .dhIETF1024SHA256AES128CBCPKCS7:
            try DHKeyPair.checkPublic(input) // before spending a key generation on it
            let pair = try DHKeyPair.generate()
            defer { pair.privateValue.wipe() } // now, not whenever the buffer is released
            return (pair.publicValue, try SecretServiceSession(privateValue: pair.privateValue, peer: input))
        }
    }

    /// ``open(algorithm:input:)`` for the DH session with the server's key pair generated ahead by
    /// ``DHKeyPair/generate()`` (off the caller's critical path), for this one session only: its
    /// private value is wiped here, whatever happens. One modular exponentiation (the agreement, with a
    /// 256-bit exponent) remains on the call. Other algorithms ignore the pair.
    package static func open(algorithm name: String, input: [UInt8], keyPair: (privateValue: SecureBytes, publicValue: [UInt8]))
        throws(SecretServiceSessionError) -> (output: [UInt8], session: SecretServiceSession) {
        defer { keyPair.privateValue.wipe() }
        guard try SecretServiceAlgorithm.named(name) == .dhIETF1024SHA256AES128CBCPKCS7 else { return try open(algorithm: name, input: input) }
        // The agreement checks the peer's value first (the same range and subgroup test, the same error).
        let shared = try DHKeyPair.sharedSecret(privateValue: keyPair.privateValue, publicValue: keyPair.publicValue, peer: input)
        defer { shared.wipe() }
        return (keyPair.publicValue, SecretServiceSession(algorithm: .dhIETF1024SHA256AES128CBCPKCS7, key: try deriveKey(shared)))
    }

    /// ``open(algorithm:input:)`` with a fixed server private value (1 to 128 bytes), for the spec's
    /// test vectors only: a real session's value is fresh from OpenSSL's generator.
    package static func open(algorithm name: String, input: [UInt8], serverPrivateValue: SecureBytes) throws(SecretServiceSessionError)
        -> (output: [UInt8], session: SecretServiceSession) {
        guard try SecretServiceAlgorithm.named(name) == .dhIETF1024SHA256AES128CBCPKCS7 else { return try open(algorithm: name, input: input) }
        let output = try DHKeyPair.publicValue(of: serverPrivateValue)
        return (output, try SecretServiceSession(privateValue: serverPrivateValue, peer: input))
    }

    /// A DH session with a given AES key (16 bytes), for the spec's test vectors only.
    package static func withKey(_ key: SecureBytes) -> SecretServiceSession {
        precondition(key.count == Int(CSS_AES_KEY_BYTES), "an AES-128 key is 16 bytes")
        return SecretServiceSession(algorithm: .dhIETF1024SHA256AES128CBCPKCS7, key: key.slice(0..<key.count))
    }

    /// A DH session with our private value and the peer's public value (checked by the C wall before
    /// any arithmetic): the shared secret (128 bytes, big-endian, left-padded) through HKDF-SHA256 to
    /// the AES key; the shared secret wiped.
    fileprivate convenience init(privateValue: SecureBytes, peer: [UInt8]) throws(SecretServiceSessionError) {
        let shared = try DHKeyPair.sharedSecret(privateValue: privateValue, peer: peer)
        defer { shared.wipe() }
        self.init(algorithm: .dhIETF1024SHA256AES128CBCPKCS7, key: try Self.deriveKey(shared))
    }

    /// HKDF-SHA256 of the shared secret, no salt, empty info, 16 bytes (what libsecret and gnome-keyring do).
    package static func deriveKey(_ shared: SecureBytes) throws(SecretServiceSessionError) -> SecureBytes {
        let key = SecureBytes(count: Int(CSS_AES_KEY_BYTES))
        let rc = unsafe shared.withCBytes { ikm in
            unsafe key.withUnsafeMutableBytes { out in unsafe css_hkdf_sha256(ikm, out.bytePointer, out.count) }
        }
        guard rc == CSS_OK else { throw .cryptoFailed("HKDF-SHA256") }
        return key
    }

    /// Encrypts `secret` for the client: for the DH session a fresh random IV (libsodium's CSPRNG)
    /// and AES-128-CBC with PKCS#7 padding; for `plain` a copy of the secret.
    public func encrypt(_ secret: SecureBytes) throws(SecretServiceSessionError) -> SecretServiceEncryptedSecret {
        guard key != nil else { return SecretServiceEncryptedSecret(parameters: [], value: secret.slice(0..<secret.count)) }
        return try encrypt(secret, iv: Random.bytes(Int(CSS_AES_BLOCK_BYTES)))
    }

    /// ``encrypt(_:)`` with a given IV (16 bytes), for the spec's test vectors only: a real secret's
    /// IV is fresh and random.
    package func encrypt(_ secret: SecureBytes, iv: [UInt8]) throws(SecretServiceSessionError) -> SecretServiceEncryptedSecret {
        guard let key else { return SecretServiceEncryptedSecret(parameters: [], value: secret.slice(0..<secret.count)) }
        guard iv.count == Int(CSS_AES_BLOCK_BYTES) else { throw .invalidParameters(expected: Int(CSS_AES_BLOCK_BYTES), actual: iv.count) }
        let block = Int(CSS_AES_BLOCK_BYTES)
        let out = SecureBytes(count: secret.count + block)
        var written = 0
        let rc = unsafe key.withCBytes { k in
            unsafe iv.withCBytes { v in
                unsafe secret.withCBytes { p in
                    unsafe out.withUnsafeMutableBytes { o in unsafe css_aes128_cbc_encrypt(k, v, p, o.bytePointer, o.count, &written) }
                }
            }
        }
        guard rc == CSS_OK else { throw .cryptoFailed("AES-128-CBC encryption") }
        return SecretServiceEncryptedSecret(parameters: iv, value: out.slice(0..<written))
    }

    /// Decrypts a secret the client sent: `parameters` and `value` of its `Secret` struct. The DH
    /// session checks the IV's length (16), the value's (a non-zero multiple of 16) and the padding;
    /// `plain` takes empty parameters and returns the value. The result is in secure memory.
    public func decrypt(parameters: [UInt8], value: UnsafeRawBufferPointer) throws(SecretServiceSessionError) -> SecureBytes {
        guard let key else {
            guard parameters.isEmpty else { throw .invalidParameters(expected: 0, actual: parameters.count) }
            return unsafe SecureBytes(copying: value)
        }
        let block = Int(CSS_AES_BLOCK_BYTES)
        guard parameters.count == block else { throw .invalidParameters(expected: block, actual: parameters.count) }
        guard value.count > 0, value.count % block == 0 else { throw .invalidValueLength(value.count) }
        let out = SecureBytes(count: value.count + block)
        defer { out.wipe() }
        var written = 0
        let rc = unsafe key.withCBytes { k in
            unsafe parameters.withCBytes { v in
                unsafe out.withUnsafeMutableBytes { o in
                    unsafe css_aes128_cbc_decrypt(k, v, css_bytes(ptr: value.bytePointer, len: value.count), o.bytePointer, o.count, &written)
                }
            }
        }
        switch rc {
        case CSS_OK: return out.slice(0..<written)
        case CSS_ERR_PADDING: throw .invalidPadding
        default: throw .cryptoFailed("AES-128-CBC decryption")
        }
    }

    /// ``decrypt(parameters:value:)`` for a value in an array.
    public func decrypt(parameters: [UInt8], value: [UInt8]) throws(SecretServiceSessionError) -> SecureBytes {
        try unsafe value.withUnsafeBytes { raw in Result { () throws(SecretServiceSessionError) in try unsafe decrypt(parameters: parameters, value: raw) } }.get()
    }
}

/// The client's side of `OpenSession`, for talking to another Secret Service provider (importing
/// from gnome-keyring, say): ``begin(_:)`` gives the input to send, ``complete(serverOutput:)``
/// takes the provider's output and gives the session.
public final class SecretServiceClientHandshake: Sendable {
    /// The algorithm asked for.
    public let algorithm: SecretServiceAlgorithm
    /// What `OpenSession` sends as its input: our public value (128 bytes) for the DH session, empty for `plain`.
    public let input: [UInt8]
    private let privateValue: SecureBytes?

    private init(algorithm: SecretServiceAlgorithm, input: [UInt8], privateValue: SecureBytes?) {
        self.algorithm = algorithm
        self.input = input
        self.privateValue = privateValue
    }

    /// A fresh handshake for `algorithm` (a new key pair for the DH session).
    public static func begin(_ algorithm: SecretServiceAlgorithm) throws(SecretServiceSessionError) -> SecretServiceClientHandshake {
        switch algorithm {
        case .plain: return SecretServiceClientHandshake(algorithm: .plain, input: [], privateValue: nil)
        case .dhIETF1024SHA256AES128CBCPKCS7:
            let pair = try DHKeyPair.generate()
            return SecretServiceClientHandshake(algorithm: algorithm, input: pair.publicValue, privateValue: pair.privateValue)
        }
    }

    /// A DH handshake with a fixed private value, for the spec's test vectors only.
    package static func begin(privateValue: SecureBytes) throws(SecretServiceSessionError) -> SecretServiceClientHandshake {
        SecretServiceClientHandshake(algorithm: .dhIETF1024SHA256AES128CBCPKCS7, input: try DHKeyPair.publicValue(of: privateValue),
                                     privateValue: privateValue.slice(0..<privateValue.count))
    }

    /// The session, from the provider's `OpenSession` output (its public value for the DH session,
    /// empty for `plain`). The provider's public value gets the same checks as a client's.
    public func complete(serverOutput: [UInt8]) throws(SecretServiceSessionError) -> SecretServiceSession {
        guard let privateValue else {
            guard serverOutput.isEmpty else { throw .invalidServerOutput("plain takes no output, got \(serverOutput.count) bytes") }
            return try SecretServiceSession.open(algorithm: SecretServiceAlgorithm.plain.rawValue, input: []).session
        }
        return try SecretServiceSession(privateValue: privateValue, peer: serverOutput)
    }
}

extension SecretServiceAlgorithm {
    /// The algorithm named `name` exactly (the spec's names are case-sensitive), or ``SecretServiceSessionError/unsupportedAlgorithm(_:)``.
    public static func named(_ name: String) throws(SecretServiceSessionError) -> SecretServiceAlgorithm {
        guard let a = SecretServiceAlgorithm(rawValue: name) else { throw .unsupportedAlgorithm(String(name.prefix(64))) }
        return a
    }
}
