public import CofferCrypto
import CTPM
import CofferSystem
import Glibc

/// An HMAC-SHA256 key that never leaves the TPM: created under the owner hierarchy's storage primary
/// key, kept as a ``TPMKeyBlob`` (its public part and its private part, encrypted by the TPM under
/// that primary) that only this TPM can load, authorized by a value derived from bytes the caller
/// gives (the keybag passes a value derived from the passcode), and subject to the TPM's
/// dictionary-attack lockout (no `noDA`): every wrong authorization is counted by the TPM.
///
/// The byte-level rules are in <doc:TPMKeyBlobFormat>.
public struct TPMHMACKey: Equatable, Sendable {
    /// The key's blob, as saved and loaded.
    public let blob: TPMKeyBlob

    /// The size of an HMAC (SHA-256): 32 bytes.
    public static let hmacBytes = 32
    /// The largest input ``hmac(_:authorization:on:)`` takes in one TPM2_HMAC (TPM2B_MAX_BUFFER): 1024 bytes.
    public static let maxInputBytes = 1024
    /// The sizes of authorization seed ``create(authorization:on:)`` and ``hmac(_:authorization:on:)`` take: 16 to 64 bytes.
    public static let authorizationSeedBytes = 16...64

    /// Wraps a blob (``load(from:on:)`` and ``TPMKeyBlob/decode(_:)`` check it first).
    public init(blob: TPMKeyBlob) { self.blob = blob }

    /// Creates a new key in `tpm` whose authorization is derived from `authorization` (16 to 64
    /// secret bytes; see ``authValue(for:)``). TPM2_CreatePrimary (once per connection) and TPM2_Create.
    ///
    /// `countingWrongAuthorizations` false makes a key with `noDA` (blob kind 2): the TPM does not count
    /// its wrong authorizations and serves it even in lockout. Only for keys whose authorization is a
    /// random secret, never one derived from a passcode (the device key's sealing key, see
    /// CofferKeybag's TPM device key).
    public static func create(authorization: SecureBytes, countingWrongAuthorizations: Bool = true,
                              on tpm: TPM) throws(TPMError) -> TPMHMACKey {
        let auth = try authValue(for: authorization)
        let kind = countingWrongAuthorizations ? TPMKeyBlob.kindHMACSHA256 : TPMKeyBlob.kindHMACSHA256NoDA
        return try unsafe tpm.withContext { ctx throws(TPMError) -> TPMHMACKey in
            let parent = try unsafe tpm.primaryKey(ctx)
            var pub = [UInt8](repeating: 0, count: 1024), priv = [UInt8](repeating: 0, count: 1024)
            var pubLength = pub.count, privLength = priv.count
            let template = keyTemplate(kind: kind)
            let rc = unsafe auth.withUnsafeBytes { a in
                unsafe ctpm_create(ctx, parent.handle, template, template.count, a.baseAddress!.assumingMemoryBound(to: UInt8.self), a.count,
                                   &pub, &pubLength, &priv, &privLength)
            }
            try tpm.check(rc, "TPM2_Create")
            return TPMHMACKey(blob: TPMKeyBlob(parentName: parent.name, publicArea: Array(pub[..<pubLength]),
                                               privateArea: Array(priv[..<privLength]), kind: kind))
        }
    }

    /// Reads the blob file at `path` (``TPMKeyBlob/decode(_:)``) and checks that `tpm` can load it
    /// (its storage primary's Name is the blob's, TPM2_Load accepts it), flushing it again.
    /// `kind` is the key kind the caller expects (``TPMKeyBlob/kindHMACSHA256``, counted, by default):
    /// a blob of another kind is ``TPMError/corruptBlob(_:)``, so a `noDA` key cannot stand in for a
    /// counted one.
    public static func load(from path: String, kind: UInt16 = TPMKeyBlob.kindHMACSHA256, on tpm: TPM) throws(TPMError) -> TPMHMACKey {
        let bytes: [UInt8]
        do {
            bytes = try Files.read(path, maxBytes: TPMKeyBlob.maxBytes)
        } catch where error.errno == EFBIG {
            throw .corruptBlob("\(path) is larger than \(TPMKeyBlob.maxBytes) bytes")
        } catch {
            throw .file("cannot read the TPM key blob: \(error)")
        }
        return try load(blob: try TPMKeyBlob.decode(bytes, kind: kind), on: tpm)
    }

    /// Checks that `tpm` can load `blob` (as ``load(from:kind:on:)`` does for a file) and returns its key.
    public static func load(blob: TPMKeyBlob, on tpm: TPM) throws(TPMError) -> TPMHMACKey {
        let key = TPMHMACKey(blob: blob)
        try unsafe tpm.withContext { ctx throws(TPMError) in
            let handle = try unsafe key.loaded(ctx, tpm)
            _ = unsafe ctpm_flush(ctx, handle)
        }
        return key
    }

    /// Writes the blob to `path` crash-safely (a temporary file, fsync, rename, fsync of the
    /// directory: the old file or the new one, never a mix), mode 0600.
    public func save(to path: String) throws(TPMError) {
        do {
            try Files.writeAtomically(path, blob.encoded(), mode: 0o600)
        } catch {
            throw .file("cannot write the TPM key blob: \(error)")
        }
    }

    /// HMAC-SHA256 of `input` (at most ``maxInputBytes``) under this key in `tpm`, authorized by
    /// `authorization` (TPM2_Load, TPM2_StartAuthSession of an HMAC session salted to the storage
    /// primary, TPM2_HMAC in it with the response encrypted, TPM2_FlushContext). A wrong
    /// authorization throws ``TPMError/wrongAuthorization`` and is counted by the TPM; in lockout
    /// every call throws ``TPMError/lockout``.
    public func hmac(_ input: [UInt8], authorization: SecureBytes, on tpm: TPM) throws(TPMError) -> SecureBytes {
        guard input.count <= Self.maxInputBytes else {
            throw .invalidArgument("an HMAC input of \(input.count) bytes (at most \(Self.maxInputBytes))")
        }
        let auth = try Self.authValue(for: authorization)
        return try unsafe tpm.withContext { ctx throws(TPMError) -> SecureBytes in
            let handle = try unsafe loaded(ctx, tpm)
            defer { _ = unsafe ctpm_flush(ctx, handle) }
            let salt = try unsafe tpm.primaryKey(ctx).handle
            let out = SecureBytes(count: Self.hmacBytes)
            var outLength = out.count
            let rc = unsafe auth.withUnsafeBytes { a in
                unsafe out.withUnsafeMutableBytes { o in
                    unsafe input.withUnsafeBufferPointer { i in
                        unsafe ctpm_hmac(ctx, handle, salt, a.baseAddress!.assumingMemoryBound(to: UInt8.self), a.count, TPMAlgorithm.sha256,
                                         i.baseAddress, i.count, o.baseAddress!.assumingMemoryBound(to: UInt8.self), &outLength)
                    }
                }
            }
            try tpm.check(rc, "TPM2_HMAC")
            guard outLength == Self.hmacBytes else {
                throw .tpmFailure(command: "TPM2_HMAC", code: 0, text: "an HMAC of \(outLength) bytes, not \(Self.hmacBytes)")
            }
            return out
        }
    }

    /// The key's authValue for an authorization seed: keyed BLAKE2b-256 (libsodium's
    /// `crypto_generichash`) under the seed of the label `coffer tpm hmac key auth v1`, 32 bytes in
    /// secure memory. Throws ``TPMError/invalidArgument(_:)`` for a seed outside ``authorizationSeedBytes``.
    static func authValue(for seed: SecureBytes) throws(TPMError) -> SecureBytes {
        guard authorizationSeedBytes.contains(seed.count) else {
            throw .invalidArgument("an authorization seed of \(seed.count) bytes (\(authorizationSeedBytes.lowerBound) to \(authorizationSeedBytes.upperBound))")
        }
        return unsafe seed.withUnsafeBytes { s in
            unsafe authLabel.withUnsafeBytes { l in unsafe KeyedHash.deriveKey(key: s, rawParts: [l]) }
        }
    }

    static let authLabel = Array("coffer tpm hmac key auth v1".utf8)

    /// Loads the blob under the storage primary (under the lock); the caller flushes the handle.
    private func loaded(_ ctx: OpaquePointer, _ tpm: TPM) throws(TPMError) -> UInt32 {
        let parent = try unsafe tpm.primaryKey(ctx)
        guard parent.name == blob.parentName else {
            func short(_ name: [UInt8]) -> String { name.prefix(6).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() + "…" }
            throw .foreignBlob("the key's storage key is \(short(blob.parentName)), this TPM's is \(short(parent.name))")
        }
        var handle: UInt32 = 0
        let rc = unsafe blob.publicArea.withUnsafeBufferPointer { p in
            unsafe blob.privateArea.withUnsafeBufferPointer { q in
                unsafe ctpm_load(ctx, parent.handle, p.baseAddress, p.count, q.baseAddress, q.count, &handle)
            }
        }
        if rc != 0 {
            let response = TPMResponse(rc)
            // The parent matches, so a refusal of the key's own parts (a format-one code: a parameter,
            // handle or session error) means they were altered; a warning (the TPM's object memory
            // full, TPM_RC_OBJECT_MEMORY) is not the blob's fault.
            if response.tpmCode.map({ $0 & 0x80 != 0 }) == true || response.layer == 9 {
                throw .corruptBlob("TPM2_Load refused it (\(response.text))")
            }
            try tpm.check(rc, "TPM2_Load")
        }
        return handle
    }

    // MARK: Templates

    /// The storage primary's template (a marshalled TPM2B_PUBLIC): ECC NIST P-256, SHA-256 name,
    /// AES-128-CFB for its children, `fixedTPM|fixedParent|sensitiveDataOrigin|userWithAuth|noDA|restricted|decrypt`,
    /// no policy, empty unique. The same template `tpm2_createprimary -C o -g sha256 -G ecc256:aes128cfb` makes
    /// with these attributes; the TPM derives the same key from it until the owner hierarchy is cleared.
    public static let primaryTemplate: [UInt8] = tpm2b(
        be16(TPMAlgorithm.ecc) + be16(TPMAlgorithm.sha256) + be32(TPMObjectAttributes.storagePrimary) + be16(0)
            + be16(TPMAlgorithm.aes) + be16(128) + be16(TPMAlgorithm.cfb) + be16(TPMAlgorithm.null) + be16(TPMAlgorithm.nistP256)
            + be16(TPMAlgorithm.null) + be16(0) + be16(0))

    /// The HMAC key's template without its unique field: keyed hash, SHA-256 name,
    /// `fixedTPM|fixedParent|sensitiveDataOrigin|userWithAuth|sign` (no `noDA`), no policy, scheme HMAC-SHA256.
    static let keyTemplateBody: [UInt8] = keyTemplateBody(kind: TPMKeyBlob.kindHMACSHA256)

    /// The template body of a key kind: kind 2 (``TPMKeyBlob/kindHMACSHA256NoDA``) adds `noDA`.
    static func keyTemplateBody(kind: UInt16) -> [UInt8] {
        let attributes = TPMObjectAttributes.hmacKey | (kind == TPMKeyBlob.kindHMACSHA256NoDA ? TPMObjectAttributes.noDA : 0)
        return be16(TPMAlgorithm.keyedHash) + be16(TPMAlgorithm.sha256) + be32(attributes) + be16(0) + be16(TPMAlgorithm.hmac) + be16(TPMAlgorithm.sha256)
    }

    /// The HMAC key's template (a marshalled TPM2B_PUBLIC, unique empty).
    public static let keyTemplate: [UInt8] = keyTemplate(kind: TPMKeyBlob.kindHMACSHA256)

    /// The template of a key kind (a marshalled TPM2B_PUBLIC, unique empty).
    static func keyTemplate(kind: UInt16) -> [UInt8] { tpm2b(keyTemplateBody(kind: kind) + be16(0)) }
}

/// The blob of a ``TPMHMACKey``: what the TPM returned from TPM2_Create, and the Name of the storage
/// key it was made under. Versioned; see <doc:TPMKeyBlobFormat>.
public struct TPMKeyBlob: Equatable, Sendable {
    /// The file's magic: `COFTPMK` and a zero byte.
    public static let magic: [UInt8] = Array("COFTPMK\0".utf8)
    /// The version this build writes and reads.
    public static let version: UInt16 = 1
    /// The key kind field for an HMAC-SHA256 key whose wrong authorizations the TPM counts.
    public static let kindHMACSHA256: UInt16 = 1
    /// The key kind field for an HMAC-SHA256 key with `noDA` (its authorization a random secret).
    public static let kindHMACSHA256NoDA: UInt16 = 2
    /// The largest blob file read.
    public static let maxBytes = 4096

    /// The storage primary's Name (nameAlg and digest) when the key was made.
    public let parentName: [UInt8]
    /// The key's TPM2B_PUBLIC, marshalled.
    public let publicArea: [UInt8]
    /// The key's TPM2B_PRIVATE, marshalled (encrypted and integrity-protected by the TPM).
    public let privateArea: [UInt8]
    /// The key kind (``kindHMACSHA256`` or ``kindHMACSHA256NoDA``).
    public let kind: UInt16

    /// A blob from its parts.
    public init(parentName: [UInt8], publicArea: [UInt8], privateArea: [UInt8], kind: UInt16 = TPMKeyBlob.kindHMACSHA256) {
        self.parentName = parentName
        self.publicArea = publicArea
        self.privateArea = privateArea
        self.kind = kind
    }

    /// The file's bytes: magic, version, kind, then the parent Name, the public and the private part,
    /// each as a TPM2B (a big-endian 16-bit size and that many bytes).
    public func encoded() -> [UInt8] {
        Self.magic + be16(Self.version) + be16(kind) + tpm2b(parentName) + publicArea + privateArea
    }

    /// Parses a blob file, rejecting anything but the exact layout (see <doc:TPMKeyBlobFormat>).
    /// `kind`: the key kind the caller expects; any other is refused.
    public static func decode(_ bytes: [UInt8], kind expected: UInt16 = kindHMACSHA256) throws(TPMError) -> TPMKeyBlob {
        guard bytes.count <= maxBytes else { throw .corruptBlob("\(bytes.count) bytes (at most \(maxBytes))") }
        guard bytes.count >= magic.count + 4, Array(bytes[..<magic.count]) == magic else {
            throw .corruptBlob("not a Coffer TPM key blob (bad magic)")
        }
        var r = Reader(bytes: bytes, offset: magic.count)
        let version = try r.u16()
        guard version == Self.version else { throw .unsupportedBlobVersion(version) }
        let kind = try r.u16()
        guard kind == kindHMACSHA256 || kind == kindHMACSHA256NoDA else { throw .corruptBlob("unknown key kind \(kind)") }
        guard kind == expected else { throw .corruptBlob("key kind \(kind) where kind \(expected) is expected") }
        let name = try r.sized()
        // A Name is a 2-byte nameAlg and its digest; Coffer's primaries are named with SHA-256.
        guard name.count == 2 + 32, name[0] == 0x00, name[1] == 0x0B else { throw .corruptBlob("the storage key's Name is not a SHA-256 Name") }
        let publicArea = try r.tpm2b()
        let privateArea = try r.tpm2b()
        guard r.offset == bytes.count else { throw .corruptBlob("\(bytes.count - r.offset) bytes after the private part") }
        // The public part must be the key Coffer makes: the template, and a 32-byte unique field.
        let body = TPMHMACKey.keyTemplateBody(kind: kind)
        guard publicArea.count == 2 + body.count + 2 + 32, Array(publicArea[2..<(2 + body.count)]) == body,
              publicArea[2 + body.count] == 0, publicArea[3 + body.count] == 32
        else { throw .corruptBlob("the public part is not a Coffer HMAC key (type, attributes or scheme differ)") }
        guard privateArea.count > 2 else { throw .corruptBlob("the private part is empty") }
        return TPMKeyBlob(parentName: name, publicArea: publicArea, privateArea: privateArea, kind: kind)
    }

    private struct Reader {
        let bytes: [UInt8]
        var offset: Int
        mutating func u16() throws(TPMError) -> UInt16 {
            guard offset + 2 <= bytes.count else { throw .corruptBlob("truncated at byte \(offset)") }
            defer { offset += 2 }
            return UInt16(bytes[offset]) << 8 | UInt16(bytes[offset + 1])
        }
        /// A TPM2B's body.
        mutating func sized() throws(TPMError) -> [UInt8] {
            let n = Int(try u16())
            guard offset + n <= bytes.count else { throw .corruptBlob("truncated at byte \(offset) (a part of \(n) bytes)") }
            defer { offset += n }
            return Array(bytes[offset..<(offset + n)])
        }
        /// A whole TPM2B, size included.
        mutating func tpm2b() throws(TPMError) -> [UInt8] {
            let start = offset
            _ = try sized()
            return Array(bytes[start..<offset])
        }
    }
}

/// TPM_ALG_ID values (TPM 2.0 Part 2, table 9) and TPM_ECC_CURVE.
enum TPMAlgorithm {
    static let aes: UInt16 = 0x0006, keyedHash: UInt16 = 0x0008, sha256: UInt16 = 0x000B, hmac: UInt16 = 0x0005,
               null: UInt16 = 0x0010, ecc: UInt16 = 0x0023, cfb: UInt16 = 0x0043
    /// TPM_ECC_NIST_P256.
    static let nistP256: UInt16 = 0x0003
}

/// TPMA_OBJECT bits (TPM 2.0 Part 2, table 31).
enum TPMObjectAttributes {
    static let fixedTPM: UInt32 = 1 << 1, fixedParent: UInt32 = 1 << 4, sensitiveDataOrigin: UInt32 = 1 << 5,
               userWithAuth: UInt32 = 1 << 6, noDA: UInt32 = 1 << 10, restricted: UInt32 = 1 << 16, decrypt: UInt32 = 1 << 17,
               sign: UInt32 = 1 << 18
    static let storagePrimary = fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | noDA | restricted | decrypt
    static let hmacKey = fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | sign
}

func be16(_ v: UInt16) -> [UInt8] { [UInt8(v >> 8), UInt8(v & 0xFF)] }
func be32(_ v: UInt32) -> [UInt8] { [UInt8(v >> 24), UInt8((v >> 16) & 0xFF), UInt8((v >> 8) & 0xFF), UInt8(v & 0xFF)] }
/// `body` as a TPM2B: its size (big-endian, 16 bits), then the bytes.
func tpm2b(_ body: [UInt8]) -> [UInt8] { be16(UInt16(body.count)) + body }
