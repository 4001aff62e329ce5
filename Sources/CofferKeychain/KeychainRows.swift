import CofferCrypto
import CofferKeybag
import CofferModel
import CofferStore

// An item sealed into its row and opened from it; its primary-key and blind-index hashes.
extension Keychain {
    // MARK: Internals (hold the keychain mutex: `store` comes from its state)

    /// Seals an item for its row; also returns its primary-key hash under the other index tiers in
    /// memory (for ``checkNoDuplicate(_:_:except:)``).
    func seal(itemClass: ItemClass, attributes: Attributes, secret: UnsafeRawBufferPointer,
                      protection: ProtectionClass, ref: [UInt8], applicationPassword: SecureBytes? = nil) throws(SecError) -> (RowContent, [[UInt8]]) {
        let appPassword = try Self.accessControl(attributes)?.factors.contains(.applicationPassword) == true
        if appPassword && applicationPassword == nil { throw .authFailed("this item needs its application password") }
        var full = attributes
        full["class"] = .string(itemClass.rawValue)
        var encoded = AttributeCodec.encode(full)
        defer { secureZero(&encoded) }
        let meta = try unsafe keybag.withMetadataKey(protection) { k in
            unsafe encoded.withUnsafeBytes { unsafe ItemCrypto.sealMeta($0, classKey: k, ref: ref, protection: protection) }
        }
        let kdf = appPasswordKDF
        let sealedSecret = try unsafe keybag.withClassKey(protection) { k throws(SecError) in
            if appPassword, let applicationPassword {
                return try unsafe ItemCrypto.sealSecret(secret, classKey: k, ref: ref, protection: protection,
                                                 applicationPassword: applicationPassword, kdf: kdf)
            }
            return unsafe ItemCrypto.sealSecret(secret, classKey: k, ref: ref, protection: protection)
        }
        let tier = IndexTier.of(protection)
        let (pk, index) = try unsafe keybag.withIndexKey(tier) { k throws(SecError) in unsafe Self.hashes(k, itemClass, full) }
        let others = try unsafe keybag.withIndexKeys { keys throws(SecError) in
            unsafe keys.filter { unsafe $0.0 != tier }.map { unsafe Self.primaryKeyHash($0.1, itemClass, full) }
        }
        return (RowContent(primaryKeyHash: pk, persistentRef: ref, protectionClass: protection.rawValue,
                           meta: meta, secret: sealedSecret, indexHashes: index), others)
    }

    /// A row's primary-key hash and blind-index entries under index key `k` (`full` includes `class`).
    static func hashes(_ k: UnsafeRawBufferPointer, _ itemClass: ItemClass, _ full: Attributes) -> ([UInt8], [[UInt8]]) {
        unsafe (primaryKeyHash(k, itemClass, full),
         full.filter { AttributeCatalog.isIndexed($0.key) }.map { unsafe blindHash(k, $0.key, $0.value) } + compoundHashes(k, full))
    }

    func openAttributes(_ row: StoredRow) throws(SecError) -> (ItemClass, Attributes) {
        guard let protection = ProtectionClass(rawValue: row.protectionClass), row.persistentRef.count == 16 else {
            throw .decode("an item row has an invalid protection class or reference")
        }
        let plain = try unsafe keybag.withMetadataKey(protection) { k throws(SecError) in
            try unsafe ItemCrypto.openMeta(row.meta, classKey: k, ref: row.persistentRef, protection: protection)
        }
        return try Self.decodeAttributes(plain, protection)
    }

    static func decodeAttributes(_ plain: SecureBytes, _ protection: ProtectionClass) throws(SecError) -> (ItemClass, Attributes) {
        var attrs: Attributes
        do {
            var bytes = unsafe plain.withUnsafeBytes { unsafe Array($0) }
            defer { secureZero(&bytes) }
            var r = ByteReader(bytes)
            attrs = try AttributeCodec.decodeAttributes(from: &r)
            try r.expectEnd("attributes")
        } catch {
            throw .decode("an item's attributes are malformed: \(error)")
        }
        guard case .string(let c)? = attrs.removeValue(forKey: "class"), let cls = ItemClass(rawValue: c),
              attrs["pdmn"] == .string(protection.shortCode) else {
            throw .decode("an item's class or protection does not match its row")
        }
        return (cls, attrs)
    }

    /// Opens a row's secret with the request's application password, if any. Opening an item that
    /// needs one with one given is a counted attempt on that item (``ApplicationPasswordAttempts``):
    /// refused early while its delay runs, reported to `authorization` when failed or refused.
    func openSecret(_ row: StoredRow, _ cls: ItemClass, _ attrs: Attributes,
                            _ authorization: AuthorizationContext) throws(SecError) -> SecureBytes {
        let protection = ProtectionClass(rawValue: row.protectionClass)!
        let open = { () throws(SecError) -> SecureBytes in
            try unsafe self.keybag.withClassKey(protection) { k throws(SecError) in
                try unsafe ItemCrypto.openSecret(row.secret, classKey: k, ref: row.persistentRef, protection: protection,
                                          applicationPassword: authorization.applicationPassword)
            }
        }
        guard authorization.hasApplicationPassword, ItemCrypto.needsApplicationPassword(row.secret) else { return try open() }
        let group = attrs.accessGroup
        return try appPasswordAttempts.attempt(ref: row.persistentRef, report: { outcome in
            authorization.onApplicationPasswordAttempt?(ApplicationPasswordAttempt(outcome: outcome, accessGroup: group, itemClass: cls))
        }, open)
    }

    /// Attribute pairs that get a combined blind-index entry, for the lookups scripts make most.
    static let compoundKeys: [(String, String)] = [("svce", "acct"), ("srvr", "acct")]

    /// Combined entries for every pair in ``compoundKeys`` that `attrs` holds in full.
    static func compoundHashes(_ key: UnsafeRawBufferPointer, _ attrs: Attributes) -> [[UInt8]] {
        compoundKeys.compactMap { a, b in
            guard let va = attrs[a], let vb = attrs[b] else { return nil }
            var w = ByteWriter()
            AttributeCodec.encode(va, into: &w)
            AttributeCodec.encode(vb, into: &w)
            return unsafe KeyedHash.hash(key: key, parts: [Array("coffer index v1".utf8), Array("\(a)+\(b)".utf8), [0], w.bytes], outputBytes: 16)
        }
    }

    /// Blind index entry: 16 bytes of BLAKE2b(indexKey, "coffer index v1" ‖ name ‖ 0 ‖ value).
    static func blindHash(_ key: UnsafeRawBufferPointer, _ name: String, _ value: AttributeValue) -> [UInt8] {
        var w = ByteWriter()
        AttributeCodec.encode(value, into: &w)
        return unsafe KeyedHash.hash(key: key, parts: [Array("coffer index v1".utf8), Array(name.utf8), [0], w.bytes], outputBytes: 16)
    }

    /// Uniqueness key: BLAKE2b(indexKey, "coffer pk v1" ‖ canonical encoding of the class's primary-key attributes).
    static func primaryKeyHash(_ key: UnsafeRawBufferPointer, _ cls: ItemClass, _ attrs: Attributes) -> [UInt8] {
        var pk: Attributes = ["class": .string(cls.rawValue)]
        for name in cls.primaryKey { if let v = attrs[name] { pk[name] = v } }
        return unsafe KeyedHash.hash(key: key, parts: [Array("coffer pk v1".utf8), AttributeCodec.encode(pk)])
    }
}
