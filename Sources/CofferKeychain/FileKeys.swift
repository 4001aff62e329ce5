package import CofferCrypto
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
    package func addFileKey(path: String, protection: FileProtection, identifier: [UInt8], key: SecureBytes) throws(SecError) {
        let keybagClass = protection.keybagClass
        let wrapped = try unsafe keybag.withClassKey(keybagClass) { k in
            unsafe FileKeyCrypto.wrap(key, classKey: k, identifier, protection, keybagClass)
        }
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            try writing(store) { () throws(SecError) in
                try store.insertFileKey(ItemStore.FileKeyRow(path: Array(path.utf8), fileClass: protection.rawValue,
                                                             protectionClass: keybagClass.rawValue, identifier: identifier, wrapped: wrapped))
            }
        }
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
            try store.replaceFileKey(id: row.id, wrapped: wrapped)
            n += 1
        }
        return n
    }
}
