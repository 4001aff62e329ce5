/// The RSA signature algorithms (RFC 8332): which hash the PKCS#1 v1.5 signature uses.
public enum SSHRSASignatureAlgorithm: String, Sendable, CaseIterable {
    /// SHA-1 (`ssh-rsa`): what a SIGN_REQUEST without an RSA flag asks for.
    case sha1 = "ssh-rsa"
    case sha256 = "rsa-sha2-256"
    case sha512 = "rsa-sha2-512"

    /// The algorithm a SIGN_REQUEST's flags select (SHA-512 wins if both bits are set, as in OpenSSH).
    public init(signFlags: UInt32) {
        if signFlags & SSHAgentSignFlags.rsaSHA2_512 != 0 { self = .sha512 }
        else if signFlags & SSHAgentSignFlags.rsaSHA2_256 != 0 { self = .sha256 }
        else { self = .sha1 }
    }
}

/// A signature blob (`string algorithm, string signature`) in raw components: ed25519's 64 bytes;
/// ECDSA's r and s as big-endian magnitudes without leading zeros (RFC 5656 §3.1.2 puts them in
/// the inner string as two mpints); RSA's PKCS#1 v1.5 signature bytes.
public enum SSHWireSignature: Hashable, Sendable {
    case ed25519([UInt8])
    case ecdsa(SSHECDSACurve, r: [UInt8], s: [UInt8])
    case rsa(SSHRSASignatureAlgorithm, [UInt8])

    /// Bytes of an ed25519 signature.
    public static let ed25519Bytes = 64

    /// An ed25519 signature; it must be 64 bytes.
    public static func ed25519(validating sig: [UInt8]) throws(SSHAgentWireError) -> SSHWireSignature {
        guard sig.count == ed25519Bytes else { throw .badLength }
        return .ed25519(sig)
    }

    /// An ECDSA signature from big-endian r and s of any width (leading zeros dropped); each must be
    /// non-zero and fit the curve's scalar size.
    public static func ecdsa(validating curve: SSHECDSACurve, r: [UInt8], s: [UInt8]) throws(SSHAgentWireError) -> SSHWireSignature {
        let r = minimalMagnitude(r), s = minimalMagnitude(s)
        guard !r.isEmpty, !s.isEmpty, r.count <= curve.scalarBytes, s.count <= curve.scalarBytes else { throw .badLength }
        return .ecdsa(curve, r: r, s: s)
    }

    /// An RSA signature; it must not be empty.
    public static func rsa(validating algorithm: SSHRSASignatureAlgorithm, _ sig: [UInt8]) throws(SSHAgentWireError) -> SSHWireSignature {
        guard !sig.isEmpty else { throw .badLength }
        return .rsa(algorithm, sig)
    }

    /// The algorithm name that opens the blob.
    public var algorithm: String {
        switch self {
        case .ed25519: "ssh-ed25519"
        case .ecdsa(let c, _, _): c.keyType
        case .rsa(let a, _): a.rawValue
        }
    }

    /// Decodes a whole signature blob (no trailing bytes, in the blob or in ECDSA's inner string).
    public init(blob: [UInt8]) throws(SSHAgentWireError) {
        var rd = SSHWireReader(blob)
        let nameBytes = try rd.readString()
        let inner = try rd.readString()
        try rd.finish()
        let name = String(decoding: nameBytes, as: UTF8.self)
        guard Array(name.utf8) == nameBytes else { throw .unknownKeyType(name) }
        if name == "ssh-ed25519" {
            self = try .ed25519(validating: inner)
        } else if let a = SSHRSASignatureAlgorithm(rawValue: name) {
            self = try .rsa(validating: a, inner)
        } else if let c = SSHECDSACurve(keyType: name) {
            var ir = SSHWireReader(inner)
            let r = try ir.readPositiveMPInt()
            let s = try ir.readPositiveMPInt()
            try ir.finish()
            self = try .ecdsa(validating: c, r: r, s: s)
        } else {
            throw .unknownKeyType(name)
        }
    }

    /// The signature blob.
    public var blob: [UInt8] {
        var w = SSHWireWriter()
        w.writeText(algorithm)
        switch self {
        case .ed25519(let s): w.writeString(s)
        case .rsa(_, let s): w.writeString(s)
        case .ecdsa(_, let r, let s):
            var inner = SSHWireWriter()
            inner.writePositiveMPInt(r)
            inner.writePositiveMPInt(s)
            w.writeString(inner.bytes)
        }
        return w.bytes
    }

    /// ECDSA's r and s left-padded to the curve's scalar width (what a verifier taking fixed-size
    /// r ‖ s wants); nil for other types.
    public var fixedWidthECDSA: (r: [UInt8], s: [UInt8])? {
        guard case .ecdsa(let c, let r, let s) = self else { return nil }
        return ([UInt8](repeating: 0, count: c.scalarBytes - r.count) + r, [UInt8](repeating: 0, count: c.scalarBytes - s.count) + s)
    }
}
