/// What an OpenSSH certificate certifies (PROTOCOL.certkeys): a user's key or a host's.
public enum SSHCertificateType: UInt32, Sendable {
    case user = 1
    case host = 2
}

/// One critical option or extension of a certificate: its name and its (raw, unparsed) data.
public struct SSHCertificateOption: Hashable, Sendable {
    public let name: [UInt8]
    public let data: [UInt8]
}

/// An OpenSSH certificate (PROTOCOL.certkeys, `*-cert-v01@openssh.com`) decoded from its blob, as
/// OpenSSH's `sshkey_from_blob` / `cert_parse` reads it, without judging it: checking the CA's
/// signature, the type, the validity window and the principals is the verifier's (the agent's).
public struct SSHCertificate: Hashable, Sendable {
    /// Most principals a certificate may list (OpenSSH's SSHKEY_CERT_MAX_PRINCIPALS).
    public static let maximumPrincipals = 256

    /// The whole certificate blob, as decoded.
    public let blob: [UInt8]
    /// The certificate key type (`ssh-ed25519-cert-v01@openssh.com`, …).
    public let certificateType: String
    public let nonce: [UInt8]
    /// The certified key.
    public let publicKey: SSHWirePublicKey
    public let serial: UInt64
    public let type: SSHCertificateType
    public let keyID: String
    /// Valid principals (user or host names); empty means any.
    public let principals: [String]
    /// Seconds since the epoch: valid from `validAfter` (inclusive) until `validBefore` (exclusive).
    public let validAfter: UInt64
    public let validBefore: UInt64
    public let criticalOptions: [SSHCertificateOption]
    public let extensions: [SSHCertificateOption]
    /// The certificate authority's key, which signed the certificate.
    public let signatureKey: SSHWirePublicKey
    public let signature: SSHWireSignature
    /// The signed part: every byte of the blob before the signature field.
    public let signedBytes: [UInt8]

    /// The plain key type of a certificate key type; nil if `certificateType` names none this codec
    /// knows.
    public static func plainKeyType(of certificateType: String) -> String? {
        let suffix = "-cert-v01@openssh.com"
        guard certificateType.hasSuffix(suffix) else { return nil }
        let plain = String(certificateType.dropLast(suffix.count))
        guard plain == "ssh-ed25519" || plain == "ssh-rsa" || SSHECDSACurve(keyType: plain) != nil else { return nil }
        return plain
    }

    /// Decodes a whole certificate blob (no trailing bytes).
    public init(blob: [UInt8]) throws(SSHAgentWireError) {
        var r = SSHWireReader(blob)
        let typeBytes = try r.readString()
        let typeName = String(decoding: typeBytes, as: UTF8.self)
        guard Array(typeName.utf8) == typeBytes, let plain = Self.plainKeyType(of: typeName) else {
            throw .unknownKeyType(typeName)
        }
        nonce = try r.readString()
        publicKey = try SSHWirePublicKey.readBody(type: Array(plain.utf8), from: &r)
        serial = try r.readUInt64()
        let rawType = try r.readUInt32()
        keyID = try Self.readName(from: &r)
        var principalReader = SSHWireReader(try r.readString())
        validAfter = try r.readUInt64()
        validBefore = try r.readUInt64()
        criticalOptions = try Self.readOptions(try r.readString())
        extensions = try Self.readOptions(try r.readString())
        _ = try r.readString()  // reserved: ignored, as by OpenSSH
        let caBlob = try r.readString()
        let signedCount = blob.count - r.remaining
        let signatureBlob = try r.readString()
        try r.finish()
        guard let type = SSHCertificateType(rawValue: rawType) else { throw .badCertificate }
        var principals: [String] = []
        while principalReader.remaining > 0 {
            guard principals.count < Self.maximumPrincipals else { throw .badCertificate }
            principals.append(try Self.readName(from: &principalReader))
        }
        self.type = type
        self.principals = principals
        signatureKey = try SSHWirePublicKey(blob: caBlob)
        signature = try SSHWireSignature(blob: signatureBlob)
        signedBytes = Array(blob.prefix(signedCount))
        certificateType = typeName
        self.blob = blob
    }

    /// A key id or principal: UTF-8 text without NUL (OpenSSH reads it as a C string).
    private static func readName(from r: inout SSHWireReader) throws(SSHAgentWireError) -> String {
        let name = try r.readText()
        guard !name.utf8.contains(0) else { throw .badCertificate }
        return name
    }

    /// The `string name, string data` pairs of a critical options or extensions section.
    private static func readOptions(_ section: [UInt8]) throws(SSHAgentWireError) -> [SSHCertificateOption] {
        var r = SSHWireReader(section)
        var out: [SSHCertificateOption] = []
        while r.remaining > 0 {
            do {
                out.append(SSHCertificateOption(name: try r.readString(), data: try r.readString()))
            } catch {
                throw .badCertificate
            }
        }
        return out
    }
}
