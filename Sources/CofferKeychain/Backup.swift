public import CofferCrypto
public import CofferKeybag
public import CofferModel
import CofferSystem

/// Backups (the seed's backup keybag): `backup(password:kdf:)` writes every item a backup may hold
/// under fresh backup class keys protected by the backup password (Argon2id); ThisDeviceOnly items are
/// additionally sealed under a key from the device key, so they restore only on this device;
/// WhenPasscodeSetThisDeviceOnly items, items with an access control and non-extractable keys (`extr`
/// false: the keys the agent makes) are never included.
/// `restoreBackup(_:password:dryRun:)` merges a backup in one transaction: an item already present
/// (same primary key) is kept and the backup's copy counted as a duplicate; a wrong password, a
/// truncated or altered file is an error and changes nothing.
///
/// Protected directories' keys (FileProtectionFormat.md) go in too, sealed under the device key (their
/// classes are all ThisDeviceOnly): a backup with any is version 2, one without is version 1 as before,
/// so a release that reads only version 1 still reads every backup it could before.
///
/// Format (BackupFormat article): "CFBU" ‖ u8 version (1 or 2) ‖ salt (16) ‖ u64 opsLimit ‖ u64 memLimit ‖
/// blob AEAD(Argon2id(password, salt), payload, ad = the 37 bytes before the blob); payload = u8 n ‖
/// n × (u8 protection class ‖ 32-byte backup class key) ‖ u32 count ‖ count × (u8 protection class ‖
/// blob AEAD(class key, entry, ad = "coffer backup item v1" ‖ u8 class)); entry = u8 item class (1
/// genp, 2 inet, 3 cert, 4 keys) ‖ attributes (the wire encoding) ‖ u8 deviceBound ‖ blob secret, the
/// secret of a ThisDeviceOnly item being AEAD(BLAKE2b(device key, "coffer backup device v1" ‖ salt),
/// secret, ad = "coffer backup device v1"). Version 2 appends to the payload u32 n ‖ n × blob
/// AEAD(that device key, directory, ad = "coffer backup directory v2"), directory = u8 file protection
/// class ‖ blob path ‖ identifier (16) ‖ blob key.
extension Keychain {
    /// What a restore did (or, dry, would do).
    public struct RestoreSummary: Sendable, Equatable {
        /// Items added.
        public var added: Int
        /// Items already present (same primary key): kept, the backup's copy skipped.
        public var duplicates: Int
        /// ThisDeviceOnly items of another device's backup: skipped.
        public var otherDevice: Int
        /// The protected directories whose records and keys were restored (counted in `added`; a
        /// directory already recorded is a duplicate, another device's is counted in `otherDevice`).
        public var directories: [FileKeyRecord]
        public init(added: Int, duplicates: Int, otherDevice: Int, directories: [FileKeyRecord] = []) {
            self.added = added
            self.duplicates = duplicates
            self.otherDevice = otherDevice
            self.directories = directories
        }
    }

    static let backupMagic = Array("CFBU".utf8)
    static let itemAD = Array("coffer backup item v1".utf8)
    static let deviceLabel = Array("coffer backup device v1".utf8)
    static let directoryAD = Array("coffer backup directory v2".utf8)
    static let itemClassCodes: [ItemClass] = [.genericPassword, .internetPassword, .certificate, .key]

    /// The backup file's bytes and how many items it holds. Needs every class key (unlocked).
    public func backup(password: SecureBytes, kdf: KDFParameters) throws(SecError) -> (bytes: [UInt8], count: Int) {
        guard password.count > 0 else { throw .param("the backup password is empty") }
        // Which items: listed with their attributes first, then each eligible one's secret.
        // (A keychain of protected directories and no items has nothing to list: not an error.)
        let listed: [ItemResult]
        do {
            listed = try copyMatching(ItemQuery(limit: .all, returnAttributes: true, returnPersistentRef: true), scope: .unrestricted)
        } catch where error.status == .itemNotFound {
            listed = []
        }
        let salt = Random.bytes(16)
        let deviceKey = try unsafe keybag.withDeviceKey { dk throws(SecError) in
            unsafe Self.deviceLabel.withUnsafeBytes { l in unsafe salt.withUnsafeBytes { s in unsafe KeyedHash.deriveKey(key: dk, rawParts: [l, s]) } }
        }
        var classKeys: [ProtectionClass: SecureBytes] = [:]
        var entries: [(ProtectionClass, [UInt8])] = []
        for item in listed {
            guard let attrs = item.attributes, let ref = item.persistentRef,
                  case .string(let code)? = attrs["pdmn"], let p = ProtectionClass(parsing: code) else { continue }
            // Never in a backup: WhenPasscodeSet items, items with an access control, and non-extractable
            // keys (made in the agent, they never leave this device, as Secure Enclave keys do not).
            if p.requiresPasscode || attrs[AccessControl.attributeName] != nil { continue }
            if item.itemClass == .key && KeyItem.isNonExtractable(attrs) { continue }
            guard let secret = try copyMatching(ItemQuery(limit: .one, returnData: true, persistentRef: ref), scope: .unrestricted).first?.data else {
                continue
            }
            var w = ByteWriter(capacity: 256)
            w.u8(UInt8(Self.itemClassCodes.firstIndex(of: item.itemClass)! + 1))
            AttributeCodec.encode(attrs, into: &w)
            // A ThisDeviceOnly secret goes in sealed under the device key; any other goes in as it is,
            // copied from secure memory straight into the secure entry (never an ordinary array).
            let sealedSecret: [UInt8]?
            if p.isThisDeviceOnly {
                w.u8(1)
                sealedSecret = unsafe secret.withUnsafeBytes { s in unsafe deviceKey.withUnsafeBytes { unsafe AEAD.seal(s, key: $0, ad: Self.deviceLabel) } }
            } else {
                w.u8(0)
                sealedSecret = nil
            }
            // The entry holds the secret in the clear until it is sealed: build it in secure memory.
            let secretBytes = sealedSecret?.count ?? secret.count
            let plain = SecureBytes(count: w.bytes.count + 4 + secretBytes)
            unsafe plain.withUnsafeMutableBytes { o in
                var i = 0
                for b in w.bytes { unsafe o[i] = b; i += 1 }
                let n = UInt32(secretBytes)
                for k in 0..<4 { unsafe o[i] = UInt8(truncatingIfNeeded: n >> UInt32(24 - 8 * k)); i += 1 }
                guard secretBytes > 0 else { return }
                if let sealedSecret {
                    unsafe sealedSecret.withUnsafeBytes { unsafe (o.baseAddress! + i).copyMemory(from: $0.baseAddress!, byteCount: secretBytes) }
                } else {
                    unsafe secret.withUnsafeBytes { unsafe (o.baseAddress! + i).copyMemory(from: $0.baseAddress!, byteCount: secretBytes) }
                }
            }
            let key = classKeys[p] ?? { let k = SecureBytes.random(count: 32); classKeys[p] = k; return k }()
            let sealed = unsafe plain.withUnsafeBytes { pl in unsafe key.withUnsafeBytes { unsafe AEAD.seal(pl, key: $0, ad: Self.itemAD + [p.rawValue]) } }
            entries.append((p, sealed))
        }
        // Each protected directory's record and key, sealed under the device key (built in secure memory).
        var directories: [[UInt8]] = []
        for record in try fileKeyRecords() {
            let key = try fileKey(record)
            defer { key.wipe() }
            let path = Array(record.path.utf8)
            let plain = SecureBytes(count: 1 + 4 + path.count + record.identifier.count + 4 + key.count)
            unsafe plain.withUnsafeMutableBytes { o in
                var i = 0
                func put(_ bytes: UnsafeRawBufferPointer) {
                    if bytes.count > 0 { unsafe (o.baseAddress! + i).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
                    i += bytes.count
                }
                func length(_ n: Int) { unsafe withUnsafeBytes(of: UInt32(n).bigEndian) { unsafe put($0) } }
                unsafe o[0] = record.protection.rawValue
                i = 1
                length(path.count)
                unsafe path.withUnsafeBytes { unsafe put($0) }
                unsafe record.identifier.withUnsafeBytes { unsafe put($0) }
                length(key.count)
                unsafe key.withUnsafeBytes { unsafe put($0) }
            }
            defer { plain.wipe() }
            directories.append(unsafe plain.withUnsafeBytes { pl in unsafe deviceKey.withUnsafeBytes { unsafe AEAD.seal(pl, key: $0, ad: Self.directoryAD) } })
        }
        let version: UInt8 = directories.isEmpty ? 1 : 2
        var body = ByteWriter(capacity: 64 + entries.reduce(0) { $0 + $1.1.count + 5 } + directories.reduce(0) { $0 + $1.count + 4 })
        body.u32(UInt32(entries.count))
        for (p, sealed) in entries { body.u8(p.rawValue); body.blob(sealed) }
        if version == 2 {
            body.u32(UInt32(directories.count))
            for d in directories { body.blob(d) }
        }
        let keysPart = SecureBytes(count: 1 + classKeys.count * 33)
        unsafe keysPart.withUnsafeMutableBytes { o in
            unsafe o[0] = UInt8(classKeys.count)
            var i = 1
            for (p, k) in classKeys.sorted(by: { $0.key.rawValue < $1.key.rawValue }) {
                unsafe o[i] = p.rawValue
                unsafe k.withUnsafeBytes { kb in unsafe (o.baseAddress! + i + 1).copyMemory(from: kb.baseAddress!, byteCount: 32) }
                i += 33
            }
        }
        let payload = SecureBytes(count: keysPart.count + body.bytes.count)
        unsafe payload.withUnsafeMutableBytes { o in
            unsafe keysPart.withUnsafeBytes { unsafe (o.baseAddress!).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
            unsafe body.bytes.withUnsafeBytes { unsafe (o.baseAddress! + keysPart.count).copyMemory(from: $0.baseAddress!, byteCount: $0.count) }
        }
        var header = ByteWriter(capacity: 37)
        header.raw(Self.backupMagic); header.u8(version); header.raw(salt); header.u64(kdf.opsLimit); header.u64(kdf.memLimit)
        let passwordKey = try Self.backupKey(password, salt: salt, kdf: kdf)
        let sealed = unsafe payload.withUnsafeBytes { pl in unsafe passwordKey.withUnsafeBytes { unsafe AEAD.seal(pl, key: $0, ad: header.bytes) } }
        var file = ByteWriter(capacity: 41 + sealed.count)
        file.raw(header.bytes); file.blob(sealed)
        return (file.bytes, entries.count + directories.count)
    }

    /// Merges a backup (see the type's documentation). errSecAuthFailed for a wrong password or an
    /// altered file, errSecDecode for one that is not a backup; the keychain is then untouched.
    public func restoreBackup(_ bytes: [UInt8], password: SecureBytes, dryRun: Bool) throws(SecError) -> RestoreSummary {
        var r = ByteReader(bytes)
        let salt: [UInt8], kdf: KDFParameters, sealed: ArraySlice<UInt8>, version: UInt8
        do throws(DecodeError) {
            guard Array(try r.raw(4, "magic")) == Self.backupMagic else { throw DecodeError("not a Coffer backup") }
            version = try r.u8("version")
            guard version == 1 || version == 2 else { throw DecodeError("a backup of an unknown version") }
            salt = Array(try r.raw(16, "salt"))
            kdf = KDFParameters(opsLimit: try r.u64("ops"), memLimit: try r.u64("mem"))
            sealed = try r.blob(max: 1 << 30, "sealed payload")
            try r.expectEnd("backup")
        } catch {
            throw .decode("not a Coffer backup, or a truncated one (\(error.reason))")
        }
        guard kdf.opsLimit >= 1, kdf.opsLimit <= 64, kdf.memLimit >= UInt64(Argon2id.minimumMemory), kdf.memLimit <= 1 << 30 else {
            throw .decode("the backup's key-derivation settings are out of range")
        }
        let passwordKey = try Self.backupKey(password, salt: salt, kdf: kdf)
        let payload: SecureBytes
        do {
            payload = try unsafe passwordKey.withUnsafeBytes { k throws(CryptoError) in try unsafe AEAD.open(sealed, key: k, ad: Array(bytes[0..<37])) }
        } catch {
            throw .authFailed("wrong backup password, or the file was altered")
        }
        let deviceKey = try unsafe keybag.withDeviceKey { dk throws(SecError) in
            unsafe Self.deviceLabel.withUnsafeBytes { l in unsafe salt.withUnsafeBytes { s in unsafe KeyedHash.deriveKey(key: dk, rawParts: [l, s]) } }
        }
        var items: [NewItem] = []
        var directories: [RestoredDirectory] = []
        defer { for d in directories { d.key.wipe() } }
        var otherDevice = 0
        // Plaintext copies are wiped once parsed (each parse runs in a function of its own, so that its
        // reader is gone and the wipe reaches the one buffer).
        var plain = unsafe payload.withUnsafeBytes { unsafe Array($0) }
        defer { secureZero(&plain) }
        do throws(DecodeError) {
            let (classKeys, sealedEntries, sealedDirectories) = try Self.parsePayload(plain, version: version)
            for blob in sealedDirectories {
                let entry: SecureBytes
                do {
                    entry = try unsafe deviceKey.withUnsafeBytes { k throws(CryptoError) in try unsafe AEAD.open(blob, key: k, ad: Self.directoryAD) }
                } catch {
                    // Sealed under another device's key (or altered, which the file's own seal rules out).
                    otherDevice += 1
                    continue
                }
                defer { entry.wipe() }
                directories.append(try unsafe entry.withUnsafeBytes { b throws(DecodeError) in try unsafe Self.parseDirectory(b) })
            }
            for (c, blob) in sealedEntries {
                guard let key = classKeys[c], ProtectionClass(rawValue: c) != nil else { throw DecodeError("an entry of an unknown class") }
                let entry: SecureBytes
                do {
                    entry = try unsafe key.withUnsafeBytes { k throws(CryptoError) in try unsafe AEAD.open(blob, key: k, ad: Self.itemAD + [c]) }
                } catch {
                    throw DecodeError("an entry failed authentication")
                }
                var entryBytes = unsafe entry.withUnsafeBytes { unsafe Array($0) }
                defer { secureZero(&entryBytes) }
                var parsed = try Self.parseEntry(entryBytes)
                defer { secureZero(&parsed.3) }
                let cls = parsed.0, bound = parsed.2
                var attrs = parsed.1
                let secret: SecureBytes
                if bound {
                    do {
                        secret = try unsafe deviceKey.withUnsafeBytes { k throws(CryptoError) in try unsafe AEAD.open(parsed.3[...], key: k, ad: Self.deviceLabel) }
                    } catch {
                        otherDevice += 1
                        continue
                    }
                } else {
                    secret = unsafe parsed.3.withUnsafeBytes { unsafe SecureBytes(copying: $0) }
                }
                attrs["cdat"] = nil
                attrs["mdat"] = nil
                items.append(NewItem(itemClass: cls, attributes: attrs, secret: secret))
            }
        } catch {
            throw .decode("the backup is malformed: \(error.reason)")
        }
        let done = try restore(items, directories: directories, dryRun: dryRun)
        return RestoreSummary(added: done.added, duplicates: done.duplicates, otherDevice: otherDevice, directories: done.directories)
    }

    /// A protected directory read from a backup: its record's parts and its key (wiped by the reader).
    struct RestoredDirectory {
        let path: String
        let protection: FileProtection
        let identifier: [UInt8]
        let key: SecureBytes
    }

    /// One decrypted directory entry (version 2): u8 file protection class ‖ blob path ‖ identifier (16)
    /// ‖ blob key. The path is absolute, UTF-8, at most 4,096 bytes; the key 32 to 64 bytes (fscrypt's).
    static func parseDirectory(_ b: UnsafeRawBufferPointer) throws(DecodeError) -> RestoredDirectory {
        var i = 0
        func take(_ n: Int, _ what: String) throws(DecodeError) -> UnsafeRawBufferPointer {
            guard n >= 0, b.count - i >= n else { throw DecodeError("a directory entry is truncated (\(what))") }
            defer { i += n }
            return unsafe UnsafeRawBufferPointer(rebasing: b[i..<i + n])
        }
        func length(_ what: String) throws(DecodeError) -> Int {
            let l = try unsafe take(4, what)
            return unsafe l.reduce(0) { $0 << 8 | Int($1) }
        }
        guard let protection = FileProtection(rawValue: try unsafe take(1, "class")[0]) else {
            throw DecodeError("a directory entry of an unknown file protection class")
        }
        let pathLength = try length("path length")
        guard pathLength >= 1, pathLength <= 4096 else { throw DecodeError("a directory entry's path is empty or too long") }
        let pathBytes = try unsafe Array(take(pathLength, "path"))
        guard let path = String(validating: pathBytes, as: UTF8.self), path.hasPrefix("/"), !pathBytes.contains(0) else {
            throw DecodeError("a directory entry's path is not an absolute UTF-8 path")
        }
        let identifier = try unsafe Array(take(16, "identifier"))
        let keyLength = try length("key length")
        guard keyLength >= 32, keyLength <= 64 else { throw DecodeError("a directory entry's key has a wrong length") }
        let key = try unsafe SecureBytes(copying: take(keyLength, "key"))
        guard i == b.count else {
            key.wipe()
            throw DecodeError("a directory entry has bytes after its end")
        }
        return RestoredDirectory(path: path, protection: protection, identifier: identifier, key: key)
    }

    /// The class keys, the sealed item entries and (version 2) the sealed directories of a decrypted payload.
    static func parsePayload(_ bytes: [UInt8], version: UInt8) throws(DecodeError)
        -> ([UInt8: SecureBytes], [(UInt8, ArraySlice<UInt8>)], [ArraySlice<UInt8>]) {
        var r = ByteReader(bytes)
        var keys: [UInt8: SecureBytes] = [:]
        for _ in 0..<Int(try r.u8("key count")) {
            let c = try r.u8("class")
            keys[c] = try unsafe r.raw(32, "class key").withUnsafeBytes { unsafe SecureBytes(copying: $0) }
        }
        var entries: [(UInt8, ArraySlice<UInt8>)] = []
        for _ in 0..<Int(try r.u32("count")) {
            let c = try r.u8("class")
            entries.append((c, try r.blob(max: 1 << 24, "entry")))
        }
        var directories: [ArraySlice<UInt8>] = []
        if version >= 2 {
            for _ in 0..<Int(try r.u32("directory count")) { directories.append(ArraySlice(Array(try r.blob(max: 1 << 16, "directory")))) }
        }
        try r.expectEnd("payload")
        return (keys, entries.map { ($0.0, ArraySlice(Array($0.1))) }, directories)
    }

    /// One decrypted entry: its class, attributes, whether its secret is device-bound, and the secret
    /// (sealed under the device key when bound). The returned secret bytes are a copy the caller wipes.
    static func parseEntry(_ bytes: [UInt8]) throws(DecodeError) -> (ItemClass, Attributes, Bool, [UInt8]) {
        var r = ByteReader(bytes)
        let code = Int(try r.u8("item class"))
        guard code >= 1, code <= itemClassCodes.count else { throw DecodeError("unknown item class") }
        let attrs = try AttributeCodec.decodeAttributes(from: &r)
        let bound = try r.u8("device bound")
        guard bound <= 1 else { throw DecodeError("bad device flag") }
        let secret = Array(try r.blob(max: 1 << 24, "secret"))
        try r.expectEnd("entry")
        return (itemClassCodes[code - 1], attrs, bound == 1, secret)
    }

    static func backupKey(_ password: SecureBytes, salt: [UInt8], kdf: KDFParameters) throws(SecError) -> SecureBytes {
        guard password.count > 0 else { throw .param("the backup password is empty") }
        do {
            return try unsafe password.withUnsafeBytes { pw throws(CryptoError) in
                try unsafe Argon2id.deriveKey(password: pw, salt: salt, opsLimit: kdf.opsLimit, memLimit: Int(kdf.memLimit))
            }
        } catch {
            throw SecError(.allocate, "backup key derivation failed")
        }
    }
}
