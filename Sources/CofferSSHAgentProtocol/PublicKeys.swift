import CofferCrypto

/// The NIST curves of `ecdsa-sha2-*` keys (RFC 5656).
public enum SSHECDSACurve: String, Sendable, CaseIterable {
    case nistp256, nistp384, nistp521

    /// The key type name, `ecdsa-sha2-<curve>`.
    public var keyType: String { "ecdsa-sha2-" + rawValue }
    /// Bytes of a scalar (a private key d, a signature's r or s) at full width.
    public var scalarBytes: Int {
        switch self { case .nistp256: 32; case .nistp384: 48; case .nistp521: 66 }
    }
    /// Bytes of an uncompressed point Q: 0x04 ‖ x ‖ y.
    public var pointBytes: Int { 1 + 2 * scalarBytes }

    init?(keyType: String) {
        guard keyType.hasPrefix("ecdsa-sha2-"), let c = SSHECDSACurve(rawValue: String(keyType.dropFirst(11))) else { return nil }
        self = c
    }

    /// Reads a Q and checks its size and uncompressed form.
    static func checkPoint(_ q: [UInt8], _ curve: SSHECDSACurve) throws(SSHAgentWireError) {
        guard q.count == curve.pointBytes else { throw .badLength }
        guard q.first == 0x04 else { throw .badCurve }
    }
}

/// A public key as the agent protocol carries it (a key blob, RFC 4253 §6.6 / RFC 5656 §3.1), in raw
/// components: ed25519's 32 bytes, ECDSA's curve and uncompressed Q, RSA's e and n as big-endian
/// magnitudes without leading zeros.
public enum SSHWirePublicKey: Hashable, Sendable, SSHPublicKeyBlob {
    case ed25519([UInt8])
    case ecdsa(SSHECDSACurve, q: [UInt8])
    case rsa(e: [UInt8], n: [UInt8])

    /// Bytes of an ed25519 public key.
    public static let ed25519Bytes = 32

    /// The key type name that opens the blob.
    public var keyType: String {
        switch self {
        case .ed25519: "ssh-ed25519"
        case .ecdsa(let c, _): c.keyType
        case .rsa: "ssh-rsa"
        }
    }

    /// An ed25519 key; throws ``SSHAgentWireError/badLength`` unless it is 32 bytes.
    public static func ed25519(validating key: [UInt8]) throws(SSHAgentWireError) -> SSHWirePublicKey {
        guard key.count == ed25519Bytes else { throw .badLength }
        return .ed25519(key)
    }

    /// An ECDSA key; Q must be uncompressed (0x04) and of the curve's size (65/97/133 bytes).
    public static func ecdsa(validating curve: SSHECDSACurve, q: [UInt8]) throws(SSHAgentWireError) -> SSHWirePublicKey {
        try SSHECDSACurve.checkPoint(q, curve)
        return .ecdsa(curve, q: q)
    }

    /// An RSA key from big-endian e and n of any width (leading zeros dropped, as decoding yields them).
    public static func rsa(exponent e: [UInt8], modulus n: [UInt8]) -> SSHWirePublicKey { .rsa(e: minimalMagnitude(e), n: minimalMagnitude(n)) }

    /// Decodes a whole key blob (no trailing bytes).
    public init(blob: [UInt8]) throws(SSHAgentWireError) {
        var r = SSHWireReader(blob)
        self = try SSHWirePublicKey.read(from: &r)
        try r.finish()
    }

    /// Reads the blob's fields (not length-prefixed) from `r`.
    static func read(from r: inout SSHWireReader) throws(SSHAgentWireError) -> SSHWirePublicKey {
        let type = try r.readString()
        return try readBody(type: type, from: &r)
    }

    /// Reads the fields after the type name (shared with private keys, which start the same way).
    static func readBody(type: [UInt8], from r: inout SSHWireReader) throws(SSHAgentWireError) -> SSHWirePublicKey {
        let name = String(decoding: type, as: UTF8.self)
        switch name {
        case "ssh-ed25519":
            return try .ed25519(validating: r.readString())
        case "ssh-rsa":
            let e = try r.readPositiveMPInt()
            let n = try r.readPositiveMPInt()
            return .rsa(e: e, n: n)
        default:
            guard let curve = SSHECDSACurve(keyType: name), Array(name.utf8) == type else { throw .unknownKeyType(name) }
            guard try r.readString() == Array(curve.rawValue.utf8) else { throw .badCurve }
            return try .ecdsa(validating: curve, q: r.readString())
        }
    }

    /// Writes the blob's fields (not length-prefixed).
    public func write(to w: inout SSHWireWriter) {
        w.writeText(keyType)
        switch self {
        case .ed25519(let k): w.writeString(k)
        case .ecdsa(let c, let q): w.writeText(c.rawValue); w.writeString(q)
        case .rsa(let e, let n): w.writePositiveMPInt(e); w.writePositiveMPInt(n)
        }
    }

}

/// A public key as its blob shows it, whatever its type (a plain key or a FIDO key): what the blob,
/// its fingerprint and its `authorized_keys` line are made from.
public protocol SSHPublicKeyBlob {
    /// The key type name, the blob's first field.
    var keyType: String { get }
    /// Writes the blob's fields (not length-prefixed).
    func write(to w: inout SSHWireWriter)
}

extension SSHPublicKeyBlob {
    /// The key blob.
    public var blob: [UInt8] {
        var w = SSHWireWriter()
        write(to: &w)
        return w.bytes
    }

    /// The SHA-256 fingerprint as `ssh-keygen -l` prints it: `SHA256:` and the unpadded base64 of
    /// the blob's digest.
    public var fingerprint: String { "SHA256:" + Base64.encode(SHA256.hash(blob), padding: false) }

    /// The `authorized_keys` line: type, base64 blob and (when not empty) the comment.
    public func authorizedKeysLine(comment: String) -> String {
        let head = keyType + " " + Base64.encode(blob, padding: true)
        return comment.isEmpty ? head : head + " " + comment
    }
}

/// RFC 4648 base64 (public data only: key blobs and fingerprints; no decoder is needed).
enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    static func encode(_ bytes: [UInt8], padding: Bool) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var i = 0
        while i < bytes.count {
            let n = min(3, bytes.count - i)
            let b0 = UInt32(bytes[i]), b1 = n > 1 ? UInt32(bytes[i + 1]) : 0, b2 = n > 2 ? UInt32(bytes[i + 2]) : 0
            let v = b0 << 16 | b1 << 8 | b2
            out.append(alphabet[Int(v >> 18 & 63)])
            out.append(alphabet[Int(v >> 12 & 63)])
            if n > 1 { out.append(alphabet[Int(v >> 6 & 63)]) } else if padding { out.append(UInt8(ascii: "=")) }
            if n > 2 { out.append(alphabet[Int(v & 63)]) } else if padding { out.append(UInt8(ascii: "=")) }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }
}
