import CofferCrypto
import CofferKeybag
import CofferModel

/// How one item is sealed (Apple's current keychain format, mapped to libsodium):
///
/// - attributes: `meta` = u8 version (1) ‖ blob AEAD(classMetadataKey, itemMetaKey) ‖ blob AEAD(itemMetaKey, attributes)
/// - secret: `secret` = u8 version (2) ‖ blob AEAD(classKey, itemSecretKey) ‖ blob AEAD(itemSecretKey, padded secret),
///   padded secret = u32 length ‖ secret ‖ zeros up to ``paddedSize(_:)``. Version 1 secrets (written before
///   the padding, unpadded) are still read until the migration re-seals them.
///
/// - secret protected by an application password (version 3): as version 2, but the wrapped item key is
///   itself `u8 1 ‖ salt (16) ‖ u64 opsLimit ‖ u64 memLimit ‖ blob AEAD(appKey, itemSecretKey)`, where
///   appKey = Argon2id(application password, salt); that whole inner blob is what the class key wraps.
///   Neither the class key alone (a stolen database with the device key and the passcode) nor the
///   application password alone opens the secret.
///
/// Every AEAD binds the item's persistent reference, protection class, role and format version
/// ("coffer item vN ROLE") as associated data, so a blob moved to another row, relabelled to another
/// class, or relabelled to another version (to skip the unpadding) fails authentication.
enum ItemCrypto {
    /// The format of sealed attributes (unchanged since the first release).
    static let metaVersion: UInt8 = 1
    /// The format of sealed secrets: 2 = padded.
    static let secretVersion: UInt8 = 2
    /// The format of secrets also protected by an application password.
    static let appPasswordSecretVersion: UInt8 = 3

    enum Role: String {
        case metaKey = "meta-key", meta, secretKey = "secret-key", secret, appKey = "app-key"
    }

    /// Argon2id settings for an application password (stored with each item, so they can change).
    struct AppPasswordKDF: Sendable, Equatable {
        var opsLimit: UInt64
        var memLimit: UInt64
        /// libsodium's interactive settings: about 0.1 s here.
        static let standard = AppPasswordKDF(opsLimit: 2, memLimit: 64 << 20)
    }

    /// "coffer item vN ROLE" in UTF-8, the start of every associated-data string (built once).
    private static let prefixes: [UInt8: [Role: [UInt8]]] = {
        var out: [UInt8: [Role: [UInt8]]] = [:]
        for v: UInt8 in [1, 2, 3] {
            for r in [Role.metaKey, .meta, .secretKey, .secret, .appKey] { out[v, default: [:]][r] = Array("coffer item v\(v) \(r.rawValue)".utf8) }
        }
        return out
    }()

    static func ad(_ role: Role, ref: [UInt8], protection: ProtectionClass, version: UInt8 = 1) -> [UInt8] {
        let prefix = prefixes[version]![role]!
        var out: [UInt8] = []
        out.reserveCapacity(prefix.count + ref.count + 1)
        out += prefix
        out += ref
        out.append(protection.rawValue)
        return out
    }

    /// The padded plaintext size of a `secretBytes`-byte secret (with its 4-byte length): the next power
    /// of two from 64 bytes to 4 KiB, then the next multiple of 4 KiB. A sealed secret thus reveals only
    /// its bucket (1 and 40 bytes look alike; so do 5,000 and 8,000), at a cost of < 2× below 4 KiB and
    /// < 4 KiB above.
    static func paddedSize(_ secretBytes: Int) -> Int {
        let n = secretBytes + 4
        if n > 4096 { return (n + 4095) / 4096 * 4096 }
        var size = 64
        while size < n { size *= 2 }
        return size
    }

    /// Seals attributes (version 1 format) under a fresh per-item key wrapped by `classKey`.
    static func sealMeta(_ plaintext: UnsafeRawBufferPointer, classKey: UnsafeRawBufferPointer, ref: [UInt8],
                         protection: ProtectionClass) -> [UInt8] {
        unsafe seal(plaintext, classKey: classKey, ref: ref, protection: protection, keyRole: .metaKey, dataRole: .meta, version: metaVersion)
    }

    /// Seals a secret (version 2: padded) under a fresh per-item key wrapped by `classKey`.
    static func sealSecret(_ secret: UnsafeRawBufferPointer, classKey: UnsafeRawBufferPointer, ref: [UInt8],
                           protection: ProtectionClass) -> [UInt8] {
        let padded = SecureBytes(count: paddedSize(secret.count)) // zero-filled
        unsafe padded.withUnsafeMutableBytes { p in
            let n = UInt32(secret.count)
            for i in 0..<4 { unsafe p[i] = UInt8(truncatingIfNeeded: n >> UInt32(24 - 8 * i)) }
            if secret.count > 0 { unsafe (p.baseAddress! + 4).copyMemory(from: secret.baseAddress!, byteCount: secret.count) }
        }
        return unsafe padded.withUnsafeBytes {
            unsafe seal($0, classKey: classKey, ref: ref, protection: protection, keyRole: .secretKey, dataRole: .secret, version: secretVersion)
        }
    }

    /// Seals a secret (version 3) whose item key also needs `applicationPassword` (Argon2id with a fresh salt).
    static func sealSecret(_ secret: UnsafeRawBufferPointer, classKey: UnsafeRawBufferPointer, ref: [UInt8], protection: ProtectionClass,
                           applicationPassword: SecureBytes, kdf: AppPasswordKDF) throws(SecError) -> [UInt8] {
        let padded = SecureBytes(count: paddedSize(secret.count))
        unsafe padded.withUnsafeMutableBytes { p in
            let n = UInt32(secret.count)
            for i in 0..<4 { unsafe p[i] = UInt8(truncatingIfNeeded: n >> UInt32(24 - 8 * i)) }
            if secret.count > 0 { unsafe (p.baseAddress! + 4).copyMemory(from: secret.baseAddress!, byteCount: secret.count) }
        }
        let v = appPasswordSecretVersion
        let salt = Random.bytes(Argon2id.saltBytes)
        let appKey = try appPasswordKey(applicationPassword, salt: salt, kdf: kdf)
        let itemKey = SecureBytes.random(count: AEAD.keyBytes)
        var inner = ByteWriter(capacity: 128)
        inner.u8(1); inner.raw(salt); inner.u64(kdf.opsLimit); inner.u64(kdf.memLimit)
        unsafe inner.blob(itemKey.withUnsafeBytes { k in unsafe appKey.withUnsafeBytes { unsafe AEAD.seal(k, key: $0, ad: ad(.appKey, ref: ref, protection: protection, version: v)) } })
        let wrapped = unsafe inner.bytes.withUnsafeBytes { unsafe AEAD.seal($0, key: classKey, ad: ad(.secretKey, ref: ref, protection: protection, version: v)) }
        let sealed = unsafe itemKey.withUnsafeBytes { k in unsafe padded.withUnsafeBytes { unsafe AEAD.seal($0, key: k, ad: ad(.secret, ref: ref, protection: protection, version: v)) } }
        return assemble(v, wrapped, sealed)
    }

    private static func appPasswordKey(_ password: SecureBytes, salt: [UInt8], kdf: AppPasswordKDF) throws(SecError) -> SecureBytes {
        guard password.count > 0 else { throw .authFailed("the application password is empty") }
        guard kdf.memLimit <= 1 << 30, kdf.opsLimit >= 1, kdf.opsLimit <= 64 else { throw .decode("an item's application-password settings are out of range") }
        do {
            return try unsafe password.withUnsafeBytes { pw throws(CryptoError) in
                try unsafe Argon2id.deriveKey(password: pw, salt: salt, opsLimit: kdf.opsLimit, memLimit: Int(kdf.memLimit))
            }
        } catch {
            throw SecError(.allocate, "application password key derivation failed")
        }
    }

    /// True if `blob` is a secret that needs an application password.
    static func needsApplicationPassword(_ blob: [UInt8]) -> Bool { blob.first == appPasswordSecretVersion }

    private static func seal(_ plaintext: UnsafeRawBufferPointer, classKey: UnsafeRawBufferPointer, ref: [UInt8],
                             protection: ProtectionClass, keyRole: Role, dataRole: Role, version: UInt8) -> [UInt8] {
        let itemKey = SecureBytes.random(count: AEAD.keyBytes)
        let wrapped = unsafe itemKey.withUnsafeBytes { unsafe AEAD.seal($0, key: classKey, ad: ad(keyRole, ref: ref, protection: protection, version: version)) }
        let sealed = unsafe itemKey.withUnsafeBytes { unsafe AEAD.seal(plaintext, key: $0, ad: ad(dataRole, ref: ref, protection: protection, version: version)) }
        return assemble(version, wrapped, sealed)
    }

    private static func assemble(_ version: UInt8, _ wrapped: [UInt8], _ sealed: ArraySlice<UInt8>) -> [UInt8] {
        var w = ByteWriter(capacity: 1 + 8 + wrapped.count + sealed.count)
        w.u8(version)
        w.blob(wrapped)
        w.blob(sealed)
        return w.bytes
    }

    private static func assemble(_ version: UInt8, _ wrapped: [UInt8], _ sealed: [UInt8]) -> [UInt8] {
        assemble(version, wrapped, sealed[...])
    }

    /// The format version of a sealed blob (its first byte), nil if empty.
    static func version(of blob: [UInt8]) -> UInt8? { blob.first }

    private struct Parts {
        var version: UInt8
        var wrapped: ArraySlice<UInt8>
        var sealed: ArraySlice<UInt8>
    }

    private static func parse(_ blob: [UInt8], allowed: ClosedRange<UInt8>) throws -> Parts {
        var r = ByteReader(blob)
        let v = try r.u8("version")
        guard allowed.contains(v) else { throw SecError.decode("unknown item format version") }
        let wrapped = try r.blob(max: 256, "wrapped item key")
        let sealed = try r.blob(max: 1 << 24, "sealed item")
        try r.expectEnd("item")
        return Parts(version: v, wrapped: wrapped, sealed: sealed)
    }

    private static func unwrapItemKey(_ p: Parts, classKey: UnsafeRawBufferPointer, ref: [UInt8], protection: ProtectionClass,
                                      keyRole: Role) throws -> SecureBytes {
        let itemKey = try unsafe AEAD.open(p.wrapped, key: classKey, ad: ad(keyRole, ref: ref, protection: protection, version: p.version))
        // Version 3: the class key unwraps the application-password layer, not the key itself.
        guard itemKey.count == AEAD.keyBytes || (p.version == appPasswordSecretVersion && keyRole == .secretKey) else {
            throw SecError.decode("item key has the wrong size")
        }
        return itemKey
    }

    /// Version 3: the item key from the application-password layer; errSecAuthFailed for a missing or
    /// wrong password.
    private static func unwrapApplicationLayer(_ inner: SecureBytes, applicationPassword: SecureBytes?, ref: [UInt8],
                                               protection: ProtectionClass) throws(SecError) -> SecureBytes {
        let bytes = unsafe inner.withUnsafeBytes { unsafe Array($0) }
        var r = ByteReader(bytes)
        let salt: [UInt8], kdf: AppPasswordKDF, wrapped: ArraySlice<UInt8>
        do throws(DecodeError) {
            guard try r.u8("layer version") == 1 else { throw DecodeError("unknown application-password layer") }
            salt = Array(try r.raw(Argon2id.saltBytes, "salt"))
            kdf = AppPasswordKDF(opsLimit: try r.u64("ops"), memLimit: try r.u64("mem"))
            wrapped = try r.blob(max: 128, "wrapped key")
            try r.expectEnd("application-password layer")
        } catch {
            throw .decode("an item's application-password layer is malformed")
        }
        guard let applicationPassword else { throw .authFailed("this item needs its application password") }
        let appKey = try appPasswordKey(applicationPassword, salt: salt, kdf: kdf)
        do {
            let key = try unsafe appKey.withUnsafeBytes { k throws(CryptoError) in
                try unsafe AEAD.open(wrapped, key: k, ad: ad(.appKey, ref: ref, protection: protection, version: appPasswordSecretVersion))
            }
            guard key.count == AEAD.keyBytes else { throw SecError.decode("item key has the wrong size") }
            return key
        } catch let e as SecError {
            throw e
        } catch {
            throw .authFailed("wrong application password")
        }
    }

    private static func failure(_ error: Error) -> SecError {
        (error as? SecError) ?? .decode("an item failed authentication or is malformed (the database was altered or is corrupt)")
    }

    /// Opens sealed attributes; errSecDecode if anything was altered.
    static func openMeta(_ blob: [UInt8], classKey: UnsafeRawBufferPointer, ref: [UInt8], protection: ProtectionClass) throws(SecError) -> SecureBytes {
        do {
            let p = try parse(blob, allowed: metaVersion...metaVersion)
            let itemKey = try unsafe unwrapItemKey(p, classKey: classKey, ref: ref, protection: protection, keyRole: .metaKey)
            return try unsafe itemKey.withUnsafeBytes { k throws(CryptoError) in
                try unsafe AEAD.open(p.sealed, key: k, ad: ad(.meta, ref: ref, protection: protection, version: p.version))
            }
        } catch {
            throw failure(error)
        }
    }

    /// Opens a sealed secret of version 1 (unpadded), 2 (padded) or 3 (padded, behind an application
    /// password: errSecAuthFailed without the right one); errSecDecode if anything was altered.
    static func openSecret(_ blob: [UInt8], classKey: UnsafeRawBufferPointer, ref: [UInt8], protection: ProtectionClass,
                           applicationPassword: SecureBytes? = nil) throws(SecError) -> SecureBytes {
        do {
            let p = try parse(blob, allowed: 1...appPasswordSecretVersion)
            var itemKey = try unsafe unwrapItemKey(p, classKey: classKey, ref: ref, protection: protection, keyRole: .secretKey)
            if p.version == appPasswordSecretVersion {
                itemKey = try unwrapApplicationLayer(itemKey, applicationPassword: applicationPassword, ref: ref, protection: protection)
            }
            let plain = try unsafe itemKey.withUnsafeBytes { k throws(CryptoError) in
                try unsafe AEAD.open(p.sealed, key: k, ad: ad(.secret, ref: ref, protection: protection, version: p.version))
            }
            guard p.version >= 2 else { return plain }
            return try unsafe plain.withUnsafeBytes { b throws(SecError) in
                guard b.count >= 4 else { throw SecError.decode("a padded secret is too short") }
                let n = unsafe Int(b[0]) << 24 | Int(b[1]) << 16 | Int(b[2]) << 8 | Int(b[3])
                guard n <= b.count - 4, b.count == paddedSize(n) else { throw SecError.decode("a padded secret has a bad length") }
                return unsafe SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[4 ..< 4 + n]))
            }
        } catch {
            throw failure(error)
        }
    }

    /// True if the item key of `blob` unwraps under `classKey` (a cheap test of which key sealed it).
    static func unwraps(_ blob: [UInt8], classKey: UnsafeRawBufferPointer, ref: [UInt8], protection: ProtectionClass,
                        keyRole: Role) -> Bool {
        guard let p = try? parse(blob, allowed: 1...appPasswordSecretVersion) else { return false }
        return unsafe (try? unwrapItemKey(p, classKey: classKey, ref: ref, protection: protection, keyRole: keyRole)) != nil
    }

    /// Re-wraps the item key of `blob` from `oldKey` to `newKey`, leaving the sealed payload (and its
    /// format version) as it is: what a rekey does to a row already in the current format.
    static func rewrap(_ blob: [UInt8], from oldKey: UnsafeRawBufferPointer, to newKey: UnsafeRawBufferPointer, ref: [UInt8],
                       protection: ProtectionClass, keyRole: Role) throws(SecError) -> [UInt8] {
        do {
            let p = try parse(blob, allowed: 1...appPasswordSecretVersion)
            let itemKey = try unsafe unwrapItemKey(p, classKey: oldKey, ref: ref, protection: protection, keyRole: keyRole)
            let wrapped = unsafe itemKey.withUnsafeBytes { unsafe AEAD.seal($0, key: newKey, ad: ad(keyRole, ref: ref, protection: protection, version: p.version)) }
            return assemble(p.version, wrapped, p.sealed)
        } catch {
            throw failure(error)
        }
    }
}
