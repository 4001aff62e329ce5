import CofferCrypto
import CofferKeybag
import CofferModel

/// How one item is sealed (Apple's current keychain format, mapped to libsodium):
///
/// - attributes: `meta` = u8 version ‖ blob AEAD(classMetadataKey, itemMetaKey) ‖ blob AEAD(itemMetaKey, attributes)
/// - secret: `secret` = u8 version ‖ blob AEAD(classKey, itemSecretKey) ‖ blob AEAD(itemSecretKey, secret)
///
/// Every AEAD binds the item's persistent reference, protection class and role as associated data,
/// so a blob moved to another row, or relabelled to another class, fails authentication.
enum ItemCrypto {
    static let version: UInt8 = 1

    enum Role: String {
        case metaKey = "meta-key", meta, secretKey = "secret-key", secret

        /// "coffer item v1 ROLE" in UTF-8, the start of every associated-data string (built once).
        var adPrefix: [UInt8] {
            switch self {
            case .metaKey: Self.prefixes.0
            case .meta: Self.prefixes.1
            case .secretKey: Self.prefixes.2
            case .secret: Self.prefixes.3
            }
        }
        private static let prefixes = (bytes(.metaKey), bytes(.meta), bytes(.secretKey), bytes(.secret))
        private static func bytes(_ r: Role) -> [UInt8] { Array("coffer item v1 \(r.rawValue)".utf8) }
    }

    static func ad(_ role: Role, ref: [UInt8], protection: ProtectionClass) -> [UInt8] {
        let prefix = role.adPrefix
        var out: [UInt8] = []
        out.reserveCapacity(prefix.count + ref.count + 1)
        out += prefix
        out += ref
        out.append(protection.rawValue)
        return out
    }

    /// Seals `plaintext` under a fresh per-item key wrapped by `classKey`.
    static func seal(_ plaintext: UnsafeRawBufferPointer, classKey: UnsafeRawBufferPointer, ref: [UInt8],
                     protection: ProtectionClass, keyRole: Role, dataRole: Role) -> [UInt8] {
        let itemKey = SecureBytes.random(count: AEAD.keyBytes)
        let wrapped = itemKey.withUnsafeBytes { AEAD.seal($0, key: classKey, ad: ad(keyRole, ref: ref, protection: protection)) }
        let sealed = itemKey.withUnsafeBytes { AEAD.seal(plaintext, key: $0, ad: ad(dataRole, ref: ref, protection: protection)) }
        var w = ByteWriter(capacity: 1 + 8 + wrapped.count + sealed.count)
        w.u8(version)
        w.blob(wrapped)
        w.blob(sealed)
        return w.bytes
    }

    /// Opens what ``seal`` made; errSecDecode if anything was altered.
    static func open(_ blob: [UInt8], classKey: UnsafeRawBufferPointer, ref: [UInt8], protection: ProtectionClass,
                     keyRole: Role, dataRole: Role) throws(SecError) -> SecureBytes {
        do {
            var r = ByteReader(blob)
            guard try r.u8("version") == version else { throw SecError.decode("unknown item format version") }
            let wrapped = try r.blob(max: 128, "wrapped item key")
            let sealed = try r.blob(max: 1 << 24, "sealed item")
            try r.expectEnd("item")
            let itemKey = try AEAD.open(wrapped, key: classKey, ad: ad(keyRole, ref: ref, protection: protection))
            guard itemKey.count == AEAD.keyBytes else { throw SecError.decode("item key has the wrong size") }
            return try itemKey.withUnsafeBytes { k throws(CryptoError) in
                try AEAD.open(sealed, key: k, ad: ad(dataRole, ref: ref, protection: protection))
            }
        } catch let e as SecError {
            throw e
        } catch {
            throw .decode("an item failed authentication or is malformed (the database was altered or is corrupt)")
        }
    }
}
