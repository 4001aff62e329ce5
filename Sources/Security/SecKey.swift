#if os(Linux)
// SecKey: keys in this process (made with libsodium or OpenSSL's libcrypto through CofferSSHKeys) and keys
// made in the agent (kSecAttrTokenIDSecureEnclave: the private half never leaves it).
public import Foundation
import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSSHKeys

/// A key: a private key of this process, a public key, or a private key held by the agent.
public final class SecKey: @unchecked Sendable, CustomStringConvertible {
    // @unchecked Sendable: immutable.
    enum Storage {
        case software(SSHPrivateKey)
        case publicKey(SSHPublicKey)
        /// A key item of the agent: its persistent reference, public half and attributes.
        case agent(persistentRef: [UInt8], publicKey: SSHPublicKey, attributes: Attributes)
    }
    let storage: Storage
    /// For a key held by the agent: how its signatures authenticate (the LAContext, operation prompt and
    /// kSecUseAuthenticationUI of the search or creation that gave it); nil: the process's session, no prompt.
    let authentication: KeyAuthentication?

    init(_ storage: Storage, authentication: KeyAuthentication? = nil) {
        self.storage = storage
        self.authentication = authentication
    }

    /// A SecKey for a key item a search returned (attributes and persistent reference, and the secret of a key
    /// stored in software); nil if the item is not a key this implementation reads. A key held by the agent
    /// keeps `authentication` for its signatures.
    convenience init?(item: ItemResult, authentication: KeyAuthentication? = nil) {
        guard item.itemClass == .key, let attrs = item.attributes else { return nil }
        if KeyItem.isNonExtractable(attrs) {
            guard case .data(let blob)? = attrs[KeyItem.publicKeyAttribute], let pk = SSHBlob.publicKey(blob),
                  let ref = item.persistentRef else { return nil }
            self.init(.agent(persistentRef: ref, publicKey: pk, attributes: attrs), authentication: authentication)
            return
        }
        guard case .integer(let type)? = attrs["type"], case .integer(let cls)? = attrs["kcls"], let data = item.data,
              let key = try? KeyEncoding.key(data.withUnsafeBytes { [UInt8]($0) }, type: type, keyClass: cls) else { return nil }
        self.init(key.storage)
    }

    /// The key's algorithm in Apple's terms: `type` (kSecAttrKeyType) and `bsiz`.
    var algorithm: SSHKeyAlgorithm {
        switch storage {
        case .software(let k): k.algorithm
        case .publicKey(let p): p.algorithm
        case .agent(_, let p, _): p.algorithm
        }
    }

    var isPrivate: Bool {
        if case .publicKey = storage { return false }
        return true
    }

    var publicComponents: SSHPublicKey {
        switch storage {
        case .software(let k): k.publicComponents
        case .publicKey(let p): p
        case .agent(_, let p, _): p
        }
    }

    /// What SecItemAdd stores for a software private key (class key): its attributes and its external
    /// representation as the secret; nil for a key the agent holds already, or a public key.
    var storedForm: (attributes: Attributes, secret: SecureBytes)? {
        guard case .software(let k) = storage, let type = KeyEncoding.keyType(k.algorithm) else { return nil }
        let attrs: Attributes = ["kcls": .integer(KeyItem.KeyClass.private.rawValue), "type": .integer(type.rawValue),
                                 "bsiz": .integer(Int64(KeyEncoding.bits(k.algorithm))),
                                 "klbl": .data(SHA256.hash(KeyEncoding.publicRepresentation(k.publicComponents)))]
        return (attrs, KeyEncoding.privateRepresentation(k))
    }

    public var description: String {
        let where_ = switch storage {
        case .software: "private, in this process"
        case .publicKey: "public"
        case .agent: "private, held by the agent"
        }
        return "<SecKey \(algorithm); \(where_)>"
    }
}

/// How a key held by the agent authenticates its signatures: the LAContext, operation prompt and UI choice the
/// search (or SecKeyCreateRandomKey) that gave it was made with, as Apple's key references keep them.
struct KeyAuthentication {
    let context: (any SecAuthenticationContext)?
    let prompt: String?
    let noUserInterface: Bool

    /// The session a call runs on (the context's, or the process's) and its options.
    var session: (AgentSession, AgentSession.Options) {
        if let context { return (context.agentSession, context.agentOptions(prompt: prompt, noUserInterface: noUserInterface)) }
        return (.shared, AgentSession.Options(noUserInterface: noUserInterface, operationPrompt: prompt ?? ""))
    }
}

/// The algorithms of SecKeyCreateSignature and SecKeyVerifySignature, with Apple's names and strings.
public struct SecKeyAlgorithm: RawRepresentable, Hashable, Sendable {
    private let name: String
    public var rawValue: CFString { name as CFString }
    public init(rawValue: CFString) { name = rawValue as String }
    private init(_ s: String) { name = s }

    /// ECDSA over SHA-256 of the message, the signature DER-encoded (X9.62): P-256 keys.
    public static let ecdsaSignatureMessageX962SHA256 = SecKeyAlgorithm("algid:sign:ECDSA:message-X962:SHA256")
    /// ECDSA over SHA-384 of the message, DER: P-384 keys.
    public static let ecdsaSignatureMessageX962SHA384 = SecKeyAlgorithm("algid:sign:ECDSA:message-X962:SHA384")
    /// ECDSA over SHA-512 of the message, DER: P-521 keys.
    public static let ecdsaSignatureMessageX962SHA512 = SecKeyAlgorithm("algid:sign:ECDSA:message-X962:SHA512")
    /// ECDSA over SHA-256 of the message, the signature r ‖ s (RFC 4754): P-256 keys.
    public static let ecdsaSignatureMessageRFC4754SHA256 = SecKeyAlgorithm("algid:sign:ECDSA:message-RFC4754:SHA256")
    /// ECDSA of a digest computed by the caller: not supported (errSecUnimplemented).
    public static let ecdsaSignatureDigestX962SHA256 = SecKeyAlgorithm("algid:sign:ECDSA:digest-X962:SHA256")
    /// ECDSA of a raw digest: not supported (errSecUnimplemented).
    public static let ecdsaSignatureRFC4754 = SecKeyAlgorithm("algid:sign:ECDSA:RFC4754")
    /// ECDSA of a raw digest, DER: not supported (errSecUnimplemented).
    public static let ecdsaSignatureDigestX962 = SecKeyAlgorithm("algid:sign:ECDSA:digest-X962")
    /// RSA PKCS#1 v1.5 over SHA-256: not supported (errSecUnimplemented).
    public static let rsaSignatureMessagePKCS1v15SHA256 = SecKeyAlgorithm("algid:sign:RSA:message-PKCS1v15:SHA256")
    /// ECDH key exchange: not supported (errSecUnimplemented).
    public static let ecdhKeyExchangeStandard = SecKeyAlgorithm("algid:keyexchange:ECDH:standard")
    /// Ed25519 (RFC 8032) of the message: Coffer's own name and string (Apple's SecKey has no Ed25519).
    public static let ed25519SignatureMessage = SecKeyAlgorithm("algid:sign:EdDSA:message:Ed25519")
}

/// What a key is asked to do (SecKeyIsAlgorithmSupported).
public enum SecKeyOperationType: Int, Sendable {
    case sign = 0, verify = 1, encrypt = 2, decrypt = 3, keyExchange = 4
}

// MARK: Functions

/// Makes a key pair and returns its private key. `parameters`: kSecAttrKeyType (kSecAttrKeyTypeECSECPrimeRandom
/// with kSecAttrKeySizeInBits 256, 384 or 521; or kSecAttrKeyTypeEd25519), kSecAttrTokenID
/// (kSecAttrTokenIDSecureEnclave: made and kept in the agent, always permanent), kSecAttrIsPermanent and
/// kSecPrivateKeyAttrs (kSecAttrIsPermanent, kSecAttrApplicationTag, kSecAttrLabel, kSecAttrAccessControl,
/// kSecAttrAccessGroup). RSA: errSecUnimplemented.
public func SecKeyCreateRandomKey(_ parameters: CFDictionary, _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?) -> SecKey? {
    KeyCalls.run(error) { () throws(SecFailure) in try KeyCalls.createRandomKey(parameters) }
}

/// The public key of `key` (itself for a public key).
public func SecKeyCopyPublicKey(_ key: SecKey) -> SecKey? {
    SecKey(.publicKey(key.publicComponents))
}

/// Apple's external representation: for ECDSA 04 ‖ X ‖ Y (public) or 04 ‖ X ‖ Y ‖ D (private); for Ed25519 the
/// 32-byte public key or the 32-byte seed. A key held by the agent: nil, errSecNotAvailable (it never leaves).
public func SecKeyCopyExternalRepresentation(_ key: SecKey, _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?) -> CFData? {
    KeyCalls.run(error) { () throws(SecFailure) -> CFData in
        switch key.storage {
        case .publicKey(let p): return Data(KeyEncoding.publicRepresentation(p)) as CFData
        case .software(let k): return KeyEncoding.privateRepresentation(k).withUnsafeBytes { Data($0) } as CFData
        case .agent: throw SecFailure(errSecNotAvailable, "the key is held by the agent and never leaves it")
        }
    }
}

/// A key from its external representation; `attributes` give kSecAttrKeyType and kSecAttrKeyClass.
public func SecKeyCreateWithData(_ keyData: CFData, _ attributes: CFDictionary,
                                 _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?) -> SecKey? {
    KeyCalls.run(error) { () throws(SecFailure) -> SecKey in
        var type: Int64?, cls: Int64?
        for (k, v) in try ValueConversion.entries(attributes) {
            switch k {
            case "type": type = ValueConversion.integer(v)
            case "kcls": cls = ValueConversion.integer(v)
            case "bsiz": break
            default: throw .param("SecKeyCreateWithData takes kSecAttrKeyType, kSecAttrKeyClass and kSecAttrKeySizeInBits, not \(k)")
            }
        }
        guard let type, let cls else { throw .param("SecKeyCreateWithData needs kSecAttrKeyType and kSecAttrKeyClass") }
        return try KeyEncoding.key([UInt8](keyData as Data), type: type, keyClass: cls)
    }
}

/// The key's attributes (kSecAttrKeyType, kSecAttrKeyClass, kSecAttrKeySizeInBits, and for an agent key its item's).
public func SecKeyCopyAttributes(_ key: SecKey) -> CFDictionary? {
    var d: [String: Any] = [:]
    if case .agent(_, _, let attrs) = key.storage { d = SecItemCall.Request.dictionary(attrs, itemClass: .key) }
    if let t = KeyEncoding.keyType(key.algorithm) { d["type"] = Int(t.rawValue) }
    d["kcls"] = key.isPrivate ? 1 : 0
    d["bsiz"] = KeyEncoding.bits(key.algorithm)
    d["class"] = "keys"
    return d as NSDictionary
}

/// True if `key` can do `operation` with `algorithm` here: signing (a private key) and verifying with the
/// ECDSA message algorithms of the key's curve and with Ed25519; nothing else.
public func SecKeyIsAlgorithmSupported(_ key: SecKey, _ operation: SecKeyOperationType, _ algorithm: SecKeyAlgorithm) -> Bool {
    switch operation {
    case .sign: key.isPrivate && KeyCalls.signatureForm(key.algorithm, algorithm) != nil
    case .verify: KeyCalls.signatureForm(key.algorithm, algorithm) != nil
    case .encrypt, .decrypt, .keyExchange: false
    }
}

/// Signs `dataToSign` with `key` (a private key) and `algorithm` (SecKeyIsAlgorithmSupported says which).
public func SecKeyCreateSignature(_ key: SecKey, _ algorithm: SecKeyAlgorithm, _ dataToSign: CFData,
                                  _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?) -> CFData? {
    KeyCalls.run(error) { () throws(SecFailure) -> CFData in
        guard let form = KeyCalls.signatureForm(key.algorithm, algorithm) else {
            throw .unimplemented("\(algorithm.rawValue) is not supported with this key (\(key.algorithm))")
        }
        let message = [UInt8](dataToSign as Data)
        let signature: SSHSignature
        switch key.storage {
        case .publicKey: throw SecFailure(errSecInvalidKeyRef, "a public key does not sign")
        case .software(let k):
            do throws(SSHKeyError) { signature = try k.sign(data: message) } catch { throw SecFailure(errSecInternalComponent, error.description) }
        case .agent(let persistentRef, _, let attributes):
            guard case .data(let blob)? = attributes[KeyItem.publicKeyAttribute] else { throw SecFailure(errSecInvalidKeyRef, "no public key") }
            signature = try AgentSigning.sign(persistentRef: persistentRef, blob: blob, data: message, authentication: key.authentication)
        }
        return Data(try KeyCalls.encode(signature, form)) as CFData
    }
}

/// True if `signature` is `key`'s signature of `signedData` with `algorithm`; false (and `error`
/// errSecVerifyFailed) otherwise.
public func SecKeyVerifySignature(_ key: SecKey, _ algorithm: SecKeyAlgorithm, _ signedData: CFData, _ signature: CFData,
                                  _ error: UnsafeMutablePointer<Unmanaged<CFError>?>?) -> Bool {
    KeyCalls.run(error) { () throws(SecFailure) -> Bool in
        guard let form = KeyCalls.signatureForm(key.algorithm, algorithm) else {
            throw .unimplemented("\(algorithm.rawValue) is not supported with this key (\(key.algorithm))")
        }
        guard let sig = KeyCalls.decode([UInt8](signature as Data), form),
              key.publicComponents.verify(sig, data: [UInt8](signedData as Data)) else {
            throw SecFailure(errSecVerifyFailed, "the signature does not verify")
        }
        return true
    } ?? false
}

/// The source of SecRandomCopyBytes (only the default exists).
public typealias SecRandomRef = OpaquePointer
/// The default random source (libsodium's CSPRNG).
nonisolated(unsafe) public let kSecRandomDefault: SecRandomRef? = nil

/// Fills `bytes` with `count` random bytes from libsodium's CSPRNG; errSecSuccess.
public func SecRandomCopyBytes(_ rnd: SecRandomRef?, _ count: Int, _ bytes: UnsafeMutableRawPointer) -> Int32 {
    guard count > 0 else { return errSecSuccess }
    let r = SecureBytes.random(count: count)
    r.withUnsafeBytes { src in bytes.copyMemory(from: src.baseAddress!, byteCount: count) }
    return errSecSuccess
}

enum KeyCalls {
    /// Runs a key function: its value, or nil with `error` set.
    static func run<T>(_ out: UnsafeMutablePointer<Unmanaged<CFError>?>?, _ body: () throws(SecFailure) -> T) -> T? {
        do { return try body() } catch {
            SecurityErrors.store(error, in: out)
            return nil
        }
    }

    enum SignatureForm { case der, rawRS(width: Int), ed25519 }

    /// How `algorithm` encodes a signature of a key of `key`'s algorithm; nil if they do not go together.
    static func signatureForm(_ key: SSHKeyAlgorithm, _ algorithm: SecKeyAlgorithm) -> SignatureForm? {
        switch (key, algorithm) {
        case (.ecdsaP256, .ecdsaSignatureMessageX962SHA256), (.ecdsaP384, .ecdsaSignatureMessageX962SHA384),
             (.ecdsaP521, .ecdsaSignatureMessageX962SHA512): .der
        case (.ecdsaP256, .ecdsaSignatureMessageRFC4754SHA256): .rawRS(width: 32)
        case (.ed25519, .ed25519SignatureMessage): .ed25519
        default: nil
        }
    }

    static func encode(_ s: SSHSignature, _ form: SignatureForm) throws(SecFailure) -> [UInt8] {
        switch (s, form) {
        case (.ed25519(let sig), .ed25519): return sig
        case (.ecdsa(let r, let s), .der): return DER.signature(r: r, s: s)
        case (.ecdsa(let r, let s), .rawRS(let w)):
            return [UInt8](repeating: 0, count: w - r.count) + r + [UInt8](repeating: 0, count: w - s.count) + s
        default: throw SecFailure(errSecInternalComponent, "a signature of another kind than asked for")
        }
    }

    static func decode(_ bytes: [UInt8], _ form: SignatureForm) -> SSHSignature? {
        switch form {
        case .ed25519: return bytes.count == 64 ? .ed25519(bytes) : nil
        case .der: return DER.parseSignature(bytes).map { .ecdsa(r: $0.r, s: $0.s) }
        case .rawRS(let w):
            guard bytes.count == 2 * w else { return nil }
            return .ecdsa(r: Array(bytes[..<w].drop { $0 == 0 }), s: Array(bytes[w...].drop { $0 == 0 }))
        }
    }

    static func createRandomKey(_ parameters: CFDictionary) throws(SecFailure) -> SecKey {
        var type: Int64?, bits: Int64?, token: String?, permanent = false
        var privateAttrs: [(String, Any)] = []
        var shared: [(String, Any)] = []
        for (k, v) in try ValueConversion.entries(parameters) {
            switch k {
            case "type": type = ValueConversion.integer(v)
            case "bsiz": bits = ValueConversion.integer(v)
            case "tkid": token = ValueConversion.string(v)
            case "perm": permanent = ValueConversion.bool(v) ?? false
            case "private":
                guard let d = ValueConversion.unwrapped(v) as? NSDictionary else { throw .param("kSecPrivateKeyAttrs is not a dictionary") }
                privateAttrs = try ValueConversion.entries(d)
            case "public": break // the public half is never an item of its own here (it is the private key's `pubk`)
            default: shared.append((k, v))
            }
        }
        let algorithm: SSHKeyAlgorithm
        switch (type, bits) {
        case (73, 256?), (73, nil): algorithm = .ecdsaP256
        case (73, 384?): algorithm = .ecdsaP384
        case (73, 521?): algorithm = .ecdsaP521
        case (2100, 256?), (2100, nil): algorithm = .ed25519
        case (42, _): throw .unimplemented("SecKeyCreateRandomKey does not make RSA keys here")
        case (nil, _): throw .param("SecKeyCreateRandomKey needs kSecAttrKeyType")
        default: throw .param("kSecAttrKeyType \(type!) with kSecAttrKeySizeInBits \(bits.map(String.init) ?? "none") is not a key this makes")
        }
        // The item's attributes: the private key's, over the shared ones.
        let dict = NSMutableDictionary()
        for (k, v) in shared + privateAttrs where k != "perm" { dict[k] = v }
        for (k, v) in privateAttrs where k == "perm" { permanent = ValueConversion.bool(v) ?? permanent }
        if let token {
            guard token == "com.apple.setoken" else { throw .param("unknown kSecAttrTokenID \(token)") }
            return try agentKey(algorithm, dict)
        }
        let key: SSHPrivateKey
        do throws(SSHKeyError) { key = try SSHPrivateKey.generate(algorithm) } catch { throw SecFailure(errSecInternalComponent, error.description) }
        let made = SecKey(.software(key))
        guard permanent else {
            guard dict.count == 0 || dict.allKeys.allSatisfy({ ["atag", "labl", "accc", "agrp", "pdmn", "nleg", "sync"].contains(ValueConversion.string($0) ?? "") }) else {
                throw .param("unknown key attribute among \(dict.allKeys)")
            }
            return made
        }
        dict["class"] = "keys"
        dict["v_Ref"] = made
        let status = SecItemAdd(dict, nil)
        guard status == errSecSuccess else { throw SecFailure(status, "the key could not be stored in the keychain") }
        return made
    }

    /// kSecAttrTokenIDSecureEnclave: the agent makes the key (KEY_CREATE) and keeps its private half.
    private static func agentKey(_ algorithm: SSHKeyAlgorithm, _ dict: NSDictionary) throws(SecFailure) -> SecKey {
        let r = try SecItemCall.Request(parsing: dict, for: .add)
        var attrs = r.attributes
        guard let type = KeyEncoding.keyType(algorithm) else { throw .unimplemented("\(algorithm) in the agent") }
        attrs["type"] = .integer(type.rawValue)
        attrs["bsiz"] = .integer(Int64(KeyEncoding.bits(algorithm)))
        if attrs["pdmn"] == nil { attrs["pdmn"] = .string(ProtectionClass.whenUnlockedThisDeviceOnly.shortCode) }
        attrs["sync"] = nil
        let a = attrs
        let made = try AgentSession.shared.run(retry: false) { c throws(SecError) in
            try c.createKey(.generate, attributes: a, returning: [.attributes, .persistentRef])
        }
        // The key signs as the creation asked (kSecUseAuthenticationContext, kSecUseOperationPrompt), as Apple's.
        guard let made, let key = SecKey(item: made, authentication: r.authentication) else {
            throw SecFailure(errSecInternalComponent, "the agent did not return the key")
        }
        return key
    }
}

/// The external representations and Apple's key attributes of the supported algorithms.
enum KeyEncoding {
    static func keyType(_ a: SSHKeyAlgorithm) -> KeyItem.KeyType? {
        switch a {
        case .ecdsaP256, .ecdsaP384, .ecdsaP521: .ecSECPrimeRandom
        case .ed25519: .ed25519
        case .rsa: .rsa
        }
    }

    static func bits(_ a: SSHKeyAlgorithm) -> Int {
        switch a {
        case .ecdsaP256, .ed25519: 256
        case .ecdsaP384: 384
        case .ecdsaP521: 521
        case .rsa(let b): b
        }
    }

    static func publicRepresentation(_ p: SSHPublicKey) -> [UInt8] {
        switch p {
        case .ed25519(let pk): pk
        case .ecdsa(_, let q): q
        case .rsa(_, let n): n
        }
    }

    static func privateRepresentation(_ k: SSHPrivateKey) -> SecureBytes {
        switch k.components {
        case .ed25519(let seed, _): return seed.slice(0..<seed.count)
        case .ecdsa(_, let q, let d):
            let out = SecureBytes(count: q.count + d.count)
            out.withUnsafeMutableBytes { dst in
                q.withUnsafeBytes { dst.copyMemory(from: $0) }
                d.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: dst[q.count...]).copyMemory(from: $0) }
            }
            return out
        case .rsa: return SecureBytes(count: 0)
        }
    }

    /// A key from Apple's external representation.
    static func key(_ bytes: [UInt8], type: Int64, keyClass: Int64) throws(SecFailure) -> SecKey {
        let curves: [SSHCurve] = [.p256, .p384, .p521]
        do {
            switch (type, keyClass) {
            case (KeyItem.KeyType.ed25519.rawValue, 0):
                guard bytes.count == 32 else { throw SecFailure(errSecDecode, "an Ed25519 public key is 32 bytes") }
                return SecKey(.publicKey(.ed25519(bytes)))
            case (KeyItem.KeyType.ed25519.rawValue, 1):
                guard bytes.count == 32 else { throw SecFailure(errSecDecode, "an Ed25519 private key is its 32-byte seed") }
                let seed = bytes.withUnsafeBytes { SecureBytes(copying: $0) }
                let pk = Ed25519.keyPair(seed: seed).publicKey
                return SecKey(.software(try SSHPrivateKey(components: .ed25519(seed: seed, publicKey: pk))))
            case (KeyItem.KeyType.ecSECPrimeRandom.rawValue, 0):
                guard let c = curves.first(where: { $0.pointBytes == bytes.count }) else {
                    throw SecFailure(errSecDecode, "an EC public key is 04 ‖ X ‖ Y")
                }
                let p = SSHPublicKey.ecdsa(curve: c, q: bytes)
                try p.validate()
                return SecKey(.publicKey(p))
            case (KeyItem.KeyType.ecSECPrimeRandom.rawValue, 1):
                guard let c = curves.first(where: { $0.pointBytes + $0.fieldBytes == bytes.count }) else {
                    throw SecFailure(errSecDecode, "an EC private key is 04 ‖ X ‖ Y ‖ D")
                }
                let q = Array(bytes[..<c.pointBytes])
                let d = bytes.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[c.pointBytes...])) }
                return SecKey(.software(try SSHPrivateKey(components: .ecdsa(curve: c, q: q, d: d))))
            case (KeyItem.KeyType.rsa.rawValue, _): throw SecFailure.unimplemented("RSA keys are not supported here")
            default: throw SecFailure.param("kSecAttrKeyType \(type) with kSecAttrKeyClass \(keyClass)")
            }
        } catch let e as SecFailure {
            throw e
        } catch {
            throw SecFailure(errSecDecode, "\(error)")
        }
    }
}

/// The SSH public key blob (RFC 4253 §6.6) an agent key carries in `pubk`.
enum SSHBlob {
    static func publicKey(_ blob: [UInt8]) -> SSHPublicKey? {
        var i = 0
        func string() -> [UInt8]? {
            guard i + 4 <= blob.count else { return nil }
            let n = Int(blob[i]) << 24 | Int(blob[i + 1]) << 16 | Int(blob[i + 2]) << 8 | Int(blob[i + 3])
            i += 4
            guard n <= blob.count - i else { return nil }
            defer { i += n }
            return Array(blob[i ..< i + n])
        }
        guard let type = string().map({ String(decoding: $0, as: UTF8.self) }) else { return nil }
        let curves: [String: SSHCurve] = ["ecdsa-sha2-nistp256": .p256, "ecdsa-sha2-nistp384": .p384, "ecdsa-sha2-nistp521": .p521]
        if type == "ssh-ed25519", let pk = string(), pk.count == 32, i == blob.count { return .ed25519(pk) }
        if let c = curves[type], string() != nil, let q = string(), i == blob.count { return .ecdsa(curve: c, q: q) }
        return nil
    }
}

/// The DER form of an ECDSA signature (X9.62: SEQUENCE { INTEGER r, INTEGER s }).
enum DER {
    static func signature(r: [UInt8], s: [UInt8]) -> [UInt8] {
        func integer(_ v: [UInt8]) -> [UInt8] {
            var b = Array(v.drop { $0 == 0 })
            if b.isEmpty { b = [0] }
            if b[0] & 0x80 != 0 { b.insert(0, at: 0) }
            return [0x02] + length(b.count) + b
        }
        let body = integer(r) + integer(s)
        return [0x30] + length(body.count) + body
    }

    private static func length(_ n: Int) -> [UInt8] { n < 0x80 ? [UInt8(n)] : [0x81, UInt8(n)] }

    static func parseSignature(_ d: [UInt8]) -> (r: [UInt8], s: [UInt8])? {
        var i = 0
        func len() -> Int? {
            guard i < d.count else { return nil }
            let b = d[i]; i += 1
            if b < 0x80 { return Int(b) }
            guard b == 0x81, i < d.count, d[i] >= 0x80 else { return nil }
            defer { i += 1 }
            return Int(d[i])
        }
        func integer() -> [UInt8]? {
            guard i < d.count, d[i] == 0x02 else { return nil }
            i += 1
            guard let n = len(), n >= 1, n <= d.count - i else { return nil }
            defer { i += n }
            let v = Array(d[i ..< i + n])
            // Minimal, non-negative: a leading zero only before a byte with the top bit set.
            if v[0] & 0x80 != 0 { return nil }
            if v.count > 1 && v[0] == 0 && v[1] & 0x80 == 0 { return nil }
            return Array(v.drop { $0 == 0 })
        }
        guard d.first == 0x30 else { return nil }
        i = 1
        guard let total = len(), total == d.count - i, let r = integer(), let s = integer(), i == d.count else { return nil }
        return (r, s)
    }
}
#endif
