public import CofferCrypto
import CofferKeybag
public import CofferModel
import CofferStore
import CofferSystem

/// A protected directory as the keychain records it (FileProtectionFormat.md, "The record"): what is
/// readable while locked (path, classes, key identifier), never the key.
public struct FileKeyRecord: Sendable, Equatable {
    /// The directory's absolute path.
    public var path: String
    /// Its file protection class.
    public var protection: FileProtection
    /// The fscrypt key identifier (16 bytes).
    public var identifier: [UInt8]
    /// The format version of its wrapped key.
    public var version: UInt8

    public init(path: String, protection: FileProtection, identifier: [UInt8], version: UInt8) {
        self.path = path
        self.protection = protection
        self.identifier = identifier
        self.version = version
    }
}

/// A file written into a CompleteUnlessOpen directory while locked, opened at the unlock.
public struct FileDrop: Sendable {
    /// Its row.
    public var id: Int64
    /// The directory it goes into.
    public var path: String
    /// Its file name there.
    public var name: String
    /// Its contents.
    public var data: SecureBytes
    /// For a file written in several requests (FILES drop part): which part this is.
    public var part: FileDropPart? = nil
}

/// A waiting drop as its sealed header says (its contents are not kept): which file, which part.
public struct FileDropEntry: Sendable {
    public var id: Int64
    public var path: String
    public var name: String
    public var part: FileDropPart?
}

/// How a directory key is wrapped (FileProtectionFormat.md): `u8 version (1) ‖ AEAD(classKey, key)`
/// with associated data "coffer fscrypt key v1" ‖ identifier (16) ‖ file class ‖ keybag class, so a
/// wrapped key moved to another row, or relabelled to another class, fails authentication.
enum FileKeyCrypto {
    static let version: UInt8 = 1

    static func ad(_ identifier: [UInt8], _ protection: FileProtection, _ keybagClass: ProtectionClass) -> [UInt8] {
        Array("coffer fscrypt key v1".utf8) + identifier + [protection.rawValue, keybagClass.rawValue]
    }

    static func wrap(_ key: SecureBytes, classKey: UnsafeRawBufferPointer, _ identifier: [UInt8], _ protection: FileProtection,
                     _ keybagClass: ProtectionClass) -> [UInt8] {
        let sealed = unsafe key.withUnsafeBytes { unsafe AEAD.seal($0, key: classKey, ad: ad(identifier, protection, keybagClass)) }
        return [version] + sealed
    }

    /// The drop secret key's associated data: as the key's, with the role "drop".
    static func dropAD(_ identifier: [UInt8], _ protection: FileProtection, _ keybagClass: ProtectionClass) -> [UInt8] {
        Array("coffer fscrypt drop key v1".utf8) + identifier + [protection.rawValue, keybagClass.rawValue]
    }

    static func unwrap(_ wrapped: [UInt8], classKey: UnsafeRawBufferPointer, _ identifier: [UInt8], _ protection: FileProtection,
                       _ keybagClass: ProtectionClass) throws(SecError) -> SecureBytes {
        guard wrapped.first == version else { throw .decode("a protected directory's wrapped key has an unknown format") }
        do {
            return try unsafe AEAD.open(wrapped[1...], key: classKey, ad: ad(identifier, protection, keybagClass))
        } catch {
            throw .decode("a protected directory's key does not open under its class key")
        }
    }
}

extension Keychain {
    /// Every protected directory's record (readable while locked: nothing here is secret).
    package func fileKeyRecords() throws(SecError) -> [FileKeyRecord] {
        try guarded.withLock { (s: inout State) throws(SecError) in
            try s.store.fileKeys().compactMap { row in
                guard let p = FileProtection(rawValue: row.fileClass) else { return nil }
                return FileKeyRecord(path: String(decoding: row.path, as: UTF8.self), protection: p, identifier: row.identifier,
                                     version: row.wrapped.first ?? 0)
            }
        }
    }

    /// Records the directory `path` of class `protection` with its fscrypt key `key` (identifier
    /// `identifier`), the key wrapped by the class key of ``FileProtection/keybagClass`` (which must be
    /// available: errSecInteractionNotAllowed while locked). errSecDuplicateItem for a path already recorded.
    /// A CompleteUnlessOpen directory also gets a drop key pair (X25519): files written into it while
    /// locked are sealed to the public key (``addDrop(path:name:data:)``) and opened at the next unlock.
    package func addFileKey(path: String, protection: FileProtection, identifier: [UInt8], key: SecureBytes) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            // Wrapped inside the lock, for the reason given in restore(_:directories:dryRun:).
            let row = try fileKeyRow(path: path, protection: protection, identifier: identifier, key: key)
            try writing(store) { () throws(SecError) in try store.insertFileKey(row) }
        }
    }

    /// The row recording the directory `path`: its key wrapped by the class key of
    /// ``FileProtection/keybagClass`` (errSecInteractionNotAllowed while that is unavailable) and, for
    /// CompleteUnlessOpen, a new drop key pair.
    func fileKeyRow(path: String, protection: FileProtection, identifier: [UInt8], key: SecureBytes) throws(SecError) -> ItemStore.FileKeyRow {
        let keybagClass = protection.keybagClass
        var dropPublicKey: [UInt8] = [], dropSecret: [UInt8] = []
        let wrapped = try unsafe keybag.withClassKey(keybagClass) { k in
            if protection == .completeUnlessOpen {
                let pair = SealedBox.generateKeyPair()
                defer { pair.secretKey.wipe() }
                dropPublicKey = pair.publicKey
                let sealed = unsafe pair.secretKey.withUnsafeBytes { unsafe AEAD.seal($0, key: k, ad: FileKeyCrypto.dropAD(identifier, protection, keybagClass)) }
                dropSecret = [FileKeyCrypto.version] + sealed
            }
            return unsafe FileKeyCrypto.wrap(key, classKey: k, identifier, protection, keybagClass)
        }
        return ItemStore.FileKeyRow(path: Array(path.utf8), fileClass: protection.rawValue, protectionClass: keybagClass.rawValue,
                                    identifier: identifier, wrapped: wrapped, dropPublicKey: dropPublicKey, dropSecret: dropSecret)
    }

    /// The most a drop carries (its name and contents): what one request can carry.
    package static let maximumDropBytes = 192 * 1024 - 512
    /// The most the files written while locked take together until the next unlock writes them in.
    package static let maximumPendingDropBytes: Int64 = 256 << 20

    /// Keeps `data` as the file `name` of the CompleteUnlessOpen directory `path`, sealed to the
    /// directory's drop public key (no class key needed: this works while locked). Sealed plaintext:
    /// u16 name length ‖ name (UTF-8) ‖ contents.
    package func addDrop(path: String, name: String, data: SecureBytes, part: FileDropPart? = nil) throws(SecError) {
        let nameBytes = Array(name.utf8)
        guard nameBytes.count <= 255, data.count <= Self.maximumDropBytes else {
            throw SecError(.param, "a file written while locked holds at most \(Self.maximumDropBytes) bytes per request")
        }
        guard part.map({ $0.dropID.count == 16 }) ?? true else { throw SecError(.param, "a drop identifier is 16 bytes") }
        let header: [UInt8] = part.map { p in
            [0xFF, 0xFF, 1] + p.dropID + [UInt8(p.index >> 24), UInt8(p.index >> 16 & 0xff), UInt8(p.index >> 8 & 0xff), UInt8(p.index & 0xff)]
                + [p.final ? 1 : 0]
        } ?? []
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            guard let row = try store.fileKeys().first(where: { $0.path == Array(path.utf8) }) else {
                throw .itemNotFound("\(path) is not a protected directory")
            }
            guard row.dropPublicKey.count == SealedBox.publicKeyBytes else {
                throw .param("only a complete-unless-open directory takes files while locked")
            }
            guard try store.dropBytes() + Int64(header.count + 2 + nameBytes.count + data.count) <= Self.maximumPendingDropBytes else {
                throw SecError(.allocate, "the files written while locked already take \(Self.maximumPendingDropBytes >> 20) MiB: unlock to write them in first")
            }
            let h = header.count
            let plain = SecureBytes(count: h + 2 + nameBytes.count + data.count)
            unsafe plain.withUnsafeMutableBytes { p in
                for (i, b) in header.enumerated() { unsafe p[i] = b }
                unsafe p[h] = UInt8(nameBytes.count >> 8)
                unsafe p[h + 1] = UInt8(nameBytes.count & 0xff)
                for (i, b) in nameBytes.enumerated() { unsafe p[h + 2 + i] = b }
                unsafe data.withUnsafeBytes { d in
                    if d.count > 0 { unsafe (p.baseAddress! + h + 2 + nameBytes.count).copyMemory(from: d.baseAddress!, byteCount: d.count) }
                }
            }
            defer { plain.wipe() }
            guard let sealed = SealedBox.seal(plain, to: row.dropPublicKey) else { throw .decode("a protected directory's drop key is unusable") }
            try writing(store) { () throws(SecError) in _ = try store.insertDrop(dir: row.path, sealed: sealed) }
        }
    }

    /// The files waiting for their directory (oldest first), opened (their class key must be available).
    /// Whole files only: the parts of a file written in several requests are ``dropEntries()``'s.
    package func openDrops() throws(SecError) -> [FileDrop] {
        var out: [FileDrop] = []
        for e in try dropEntries() where e.part == nil {
            if let d = try openDrop(id: e.id) { out.append(d) }
        }
        return out
    }

    /// Every waiting drop's directory, name and part, oldest first (each opened in turn for its header,
    /// its contents wiped at once: their class keys must be available).
    package func dropEntries() throws(SecError) -> [FileDropEntry] {
        let rows = try guarded.withLock { (s: inout State) throws(SecError) in try s.store.dropRows() }
        var out: [FileDropEntry] = []
        for row in rows {
            // One that does not open (damaged) is left where it is: it must not stop every other delivery.
            // A class key not available (locked) is the caller's to hear.
            let opened: FileDrop?
            do {
                opened = try openDrop(id: row.id)
            } catch where error.status == .interactionNotAllowed {
                throw error
            } catch {
                continue
            }
            guard let d = opened else { continue }
            d.data.wipe()
            out.append(FileDropEntry(id: d.id, path: d.path, name: d.name, part: d.part))
        }
        return out
    }

    /// Drop `id`, opened (its class key must be available); nil when it is gone or its directory is
    /// no longer recorded.
    package func openDrop(id: Int64) throws(SecError) -> FileDrop? {
        let found = try guarded.withLock { (s: inout State) throws(SecError) in
            (try s.store.drop(id: id), try s.store.fileKeys())
        }
        guard let d = found.0 else { return nil }
        let rows = found.1
        guard let row = rows.first(where: { $0.path == d.dir }), let p = FileProtection(rawValue: row.fileClass),
              let c = ProtectionClass(rawValue: row.protectionClass), row.dropSecret.first == FileKeyCrypto.version else { return nil }
        let secretKey = try unsafe keybag.withClassKey(c) { k throws(SecError) in
            do {
                return try unsafe AEAD.open(row.dropSecret[1...], key: k, ad: FileKeyCrypto.dropAD(row.identifier, p, c))
            } catch {
                throw .decode("a protected directory's drop key does not open under its class key")
            }
        }
        defer { secretKey.wipe() }
        let plain: SecureBytes
        do {
            plain = try SealedBox.open(d.sealed[...], publicKey: row.dropPublicKey, secretKey: secretKey)
        } catch {
            throw .decode("a file written while locked does not open under its directory's drop key")
        }
        defer { plain.wipe() }
        // u16 name length ‖ name ‖ contents; a part: 0xFFFF ‖ u8 1 ‖ drop id (16) ‖ u32 index ‖ u8 final, then the same.
        let parsed: (String, FileDropPart?, SecureBytes)? = unsafe plain.withUnsafeBytes { b in
            var at = 0
            var part: FileDropPart? = nil
            if b.count >= 2, unsafe b[0] == 0xFF, unsafe b[1] == 0xFF {
                guard b.count >= 24, unsafe b[2] == 1, unsafe b[23] <= 1 else { return nil }
                var index: UInt32 = 0
                for k in 19..<23 { index = index << 8 | UInt32(unsafe b[k]) }
                part = unsafe FileDropPart(dropID: Array(b[3..<19]), index: index, final: b[23] == 1)
                at = 24
            }
            guard b.count >= at + 2 else { return nil }
            let n = unsafe Int(b[at]) << 8 | Int(b[at + 1])
            guard n <= 255, b.count >= at + 2 + n else { return nil }
            let name = unsafe String(decoding: UnsafeRawBufferPointer(rebasing: b[(at + 2)..<(at + 2 + n)]), as: UTF8.self)
            return unsafe (name, part, SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[(at + 2 + n)...])))
        }
        guard let (name, part, data) = parsed else { throw .decode("a file written while locked is malformed") }
        return FileDrop(id: id, path: String(decoding: d.dir, as: UTF8.self), name: name, data: data, part: part)
    }

    /// Forgets drop `id` (once written into its directory and synced).
    package func removeDrop(id: Int64) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            try writing(store) { () throws(SecError) in try store.deleteDrop(id: id) }
        }
    }

    /// How many files wait for the directory `path`.
    package func dropCount(path: String) throws(SecError) -> Int {
        try guarded.withLock { (s: inout State) throws(SecError) in try s.store.drops().filter { $0.dir == Array(path.utf8) }.count }
    }

    /// The fscrypt key of the recorded directory `record` (its class key must be available).
    package func fileKey(_ record: FileKeyRecord) throws(SecError) -> SecureBytes {
        let row = try guarded.withLock { (s: inout State) throws(SecError) in
            try s.store.fileKeys().first { $0.path == Array(record.path.utf8) }
        }
        guard let row, let p = FileProtection(rawValue: row.fileClass), let c = ProtectionClass(rawValue: row.protectionClass) else {
            throw .itemNotFound("\(record.path) is not a protected directory")
        }
        return try unsafe keybag.withClassKey(c) { k throws(SecError) in
            try unsafe FileKeyCrypto.unwrap(row.wrapped, classKey: k, row.identifier, p, c)
        }
    }

    /// Forgets the directory `path`'s record (and with it its key); false if there was none.
    @discardableResult
    package func removeFileKey(path: String) throws(SecError) -> Bool {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            return try writing(store) { () throws(SecError) in try store.deleteFileKey(path: Array(path.utf8)) }
        }
    }

    /// Step 2 of a rekey, for protected directories: re-wraps every directory key of a rotated class
    /// from the previous class key to the new one (inside the rekey's transaction). Idempotent: a key
    /// that already opens under the new class key is left alone.
    func rewrapFileKeys(_ store: ItemStore, _ keys: RekeyKeys) throws(SecError) -> Int {
        var n = 0
        for row in try store.fileKeys() {
            guard let p = FileProtection(rawValue: row.fileClass), let c = ProtectionClass(rawValue: row.protectionClass),
                  c.availability != .always else { continue }
            guard let newKey = keys.classKey(c, previous: false) else { continue }
            let opensUnderNew = unsafe newKey.withUnsafeBytes { k in
                unsafe (try? FileKeyCrypto.unwrap(row.wrapped, classKey: k, row.identifier, p, c)) != nil
            }
            if opensUnderNew { continue }
            guard let oldKey = keys.classKey(c, previous: true) else {
                throw .decode("a protected directory's key is wrapped under neither the new nor the previous key of its class")
            }
            let key = try unsafe oldKey.withUnsafeBytes { k throws(SecError) in
                try unsafe FileKeyCrypto.unwrap(row.wrapped, classKey: k, row.identifier, p, c)
            }
            let wrapped = unsafe newKey.withUnsafeBytes { k in unsafe FileKeyCrypto.wrap(key, classKey: k, row.identifier, p, c) }
            key.wipe()
            var dropSecret = row.dropSecret
            if dropSecret.first == FileKeyCrypto.version {
                let ad = FileKeyCrypto.dropAD(row.identifier, p, c)
                let sk = try unsafe oldKey.withUnsafeBytes { k throws(SecError) in
                    do { return try unsafe AEAD.open(row.dropSecret[1...], key: k, ad: ad) } catch {
                        throw .decode("a protected directory's drop key does not open under its class key")
                    }
                }
                let sealed = unsafe newKey.withUnsafeBytes { k in unsafe sk.withUnsafeBytes { unsafe AEAD.seal($0, key: k, ad: ad) } }
                sk.wipe()
                dropSecret = [FileKeyCrypto.version] + sealed
            }
            try store.replaceFileKey(id: row.id, wrapped: wrapped, dropSecret: dropSecret)
            n += 1
        }
        return n
    }
}
