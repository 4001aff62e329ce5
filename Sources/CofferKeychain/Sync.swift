public import CofferCrypto
public import CofferModel
import CofferKeybag
import CofferStore
import CofferSystem

/// Which items sync and how one travels (SyncFormat.md, "The keychain's side"): Apple's rules, the
/// item key that names an item on every machine, and the payload that carries it. Pure functions;
/// ``Keychain`` applies pulls and collects local changes with them.
public enum SyncItem {
    /// Version byte that starts every item key.
    public static let itemKeyVersion: UInt8 = 1
    /// Version byte that starts every payload.
    public static let payloadVersion: UInt8 = 1

    /// Apple's rule: `sync` true, a class without ThisDeviceOnly (so never WhenPasscodeSet), no access
    /// control, and never a key made non-extractable.
    public static func isSyncable(_ cls: ItemClass, _ attrs: Attributes) -> Bool {
        guard attrs["sync"] == .bool(true), case .string(let p)? = attrs["pdmn"], let protection = ProtectionClass(parsing: p),
              !protection.isThisDeviceOnly, attrs[AccessControl.attributeName] == nil else { return false }
        return !(cls == .key && KeyItem.isNonExtractable(attrs))
    }

    /// The item key: version 1 ‖ the canonical attribute encoding of `class` and the class's primary-key
    /// attributes except `sync` (so the access group is in it). Equal on every machine for one item.
    public static func itemKey(_ cls: ItemClass, _ attrs: Attributes) -> [UInt8] {
        var pk: Attributes = ["class": .string(cls.rawValue)]
        for name in cls.primaryKey where name != "sync" { if let v = attrs[name] { pk[name] = v } }
        return [itemKeyVersion] + AttributeCodec.encode(pk)
    }

    /// The class and primary-key attributes an item key names (with `sync` true: the synced item's).
    public static func decodeItemKey(_ key: [UInt8]) throws(SecError) -> (ItemClass, Attributes) {
        do {
            var r = ByteReader(key)
            guard try r.u8("item key version") == itemKeyVersion else { throw DecodeError("unknown item key version") }
            var attrs = try AttributeCodec.decodeAttributes(from: &r)
            try r.expectEnd("item key")
            guard case .string(let c)? = attrs.removeValue(forKey: "class"), let cls = ItemClass(rawValue: c),
                  attrs.keys.allSatisfy({ cls.primaryKey.contains($0) && $0 != "sync" }) else {
                throw DecodeError("an item key names no class or an attribute outside its primary key")
            }
            attrs["sync"] = .bool(true)
            return (cls, attrs)
        } catch {
            throw .decode("a sync item key is malformed: \(error)")
        }
    }

    /// The payload of a version of an item, built in secure memory: version 1 ‖ u32 n ‖ n bytes of the
    /// canonical encoding of its attributes with `class` ‖ the secret (the rest).
    public static func payload(_ cls: ItemClass, _ attrs: Attributes, secret: UnsafeRawBufferPointer) -> SecureBytes {
        var full = attrs
        full["class"] = .string(cls.rawValue)
        var encoded = AttributeCodec.encode(full)
        defer { secureZero(&encoded) }
        let out = SecureBytes(count: 5 + encoded.count + secret.count)
        unsafe out.withUnsafeMutableBytes { b in
            let n = UInt32(encoded.count)
            unsafe b[0] = payloadVersion
            for i in 0..<4 { unsafe b[1 + i] = UInt8(truncatingIfNeeded: n >> UInt32(24 - 8 * i)) }
            for (i, byte) in encoded.enumerated() { unsafe b[5 + i] = byte }
            if secret.count > 0 { unsafe (b.baseAddress! + 5 + encoded.count).copyMemory(from: secret.baseAddress!, byteCount: secret.count) }
        }
        return out
    }

    /// Opens a payload: its class, attributes and secret (in secure memory). errSecDecode if it is
    /// malformed, not of a syncable item, or carries attributes its class does not have.
    public static func decodePayload(_ payload: SecureBytes) throws(SecError) -> (ItemClass, Attributes, SecureBytes) {
        let (header, attrBytesCount): (UInt8, Int) = unsafe payload.withUnsafeBytes { b in
            guard b.count >= 5 else { return (0, -1) }
            var n = 0
            for i in 1...4 { n = n << 8 | Int(unsafe b[i]) }
            return unsafe (b[0], n)
        }
        guard header == payloadVersion, attrBytesCount >= 0, attrBytesCount <= payload.count - 5 else {
            throw .decode("a sync payload is malformed or of an unknown version")
        }
        var attrBytes = unsafe payload.withUnsafeBytes { unsafe Array($0[5..<5 + attrBytesCount]) }
        defer { secureZero(&attrBytes) }
        var attrs: Attributes
        do {
            var r = ByteReader(attrBytes)
            attrs = try AttributeCodec.decodeAttributes(from: &r)
            try r.expectEnd("attributes")
        } catch {
            throw .decode("a sync payload's attributes are malformed: \(error)")
        }
        guard case .string(let c)? = attrs.removeValue(forKey: "class"), let cls = ItemClass(rawValue: c) else {
            throw .decode("a sync payload names no item class")
        }
        do throws(SecError) { try Validation.check(attrs, for: cls, writing: false) } catch { throw .decode("a sync payload's attributes are invalid: \(error.message)") }
        guard isSyncable(cls, attrs) else { throw .decode("a sync payload carries an item that never syncs (ThisDeviceOnly, access control, or sync off)") }
        let secret = unsafe payload.withUnsafeBytes { b in
            unsafe SecureBytes(copying: UnsafeRawBufferPointer(rebasing: b[(5 + attrBytesCount)...]))
        }
        return (cls, attrs, secret)
    }
}

/// A change for the sync engine: an item key and the item's payload (nil: deleted).
public typealias SyncItemChange = (itemKey: [UInt8], payload: SecureBytes?)

extension Keychain {
    /// The class whose metadata key seals the sync state (the agent syncs only while unlocked).
    static let syncStateProtection = ProtectionClass.whenUnlockedThisDeviceOnly

    /// The class whose metadata key seals this device's sync secret keys: available from the first
    /// unlock to shutdown (the agent syncs in the background while the screen is locked), never
    /// in a backup, never on another machine.
    static let syncDeviceKeyProtection = ProtectionClass.afterFirstUnlockThisDeviceOnly

    /// Seals sync bookkeeping under `protection`'s metadata key (copied into secure memory first).
    func sealSyncBlob(_ plain: [UInt8], _ protection: ProtectionClass) throws(SecError) -> [UInt8] {
        try sealSyncBlob(unsafe plain.withUnsafeBytes { unsafe SecureBytes(copying: $0) }, protection)
    }

    /// Seals sync bookkeeping under `protection`'s metadata key: class ‖ 16-byte random reference ‖ sealed.
    func sealSyncBlob(_ plain: SecureBytes, _ protection: ProtectionClass) throws(SecError) -> [UInt8] {
        let ref = Random.bytes(16)
        let sealed = try unsafe keybag.withMetadataKey(protection) { k in
            unsafe plain.withUnsafeBytes { unsafe ItemCrypto.sealMeta($0, classKey: k, ref: ref, protection: protection) }
        }
        return [protection.rawValue] + ref + sealed
    }

    /// Opens what ``sealSyncBlob(_:_:)`` sealed; errSecDecode if it was altered.
    func openSyncBlob(_ blob: [UInt8]) throws(SecError) -> SecureBytes {
        guard blob.count > 17, let p = ProtectionClass(rawValue: blob[0]) else { throw .decode("the keychain's sync bookkeeping is malformed") }
        let ref = Array(blob[1..<17]), sealed = Array(blob[17...])
        return try unsafe keybag.withMetadataKey(p) { k throws(SecError) in
            try unsafe ItemCrypto.openMeta(sealed, classKey: k, ref: ref, protection: p)
        }
    }

    /// Step 2 of a rekey, for sync: re-wraps the sync state, the device keys and the pending notes sealed
    /// under a rotated class's metadata key (inside the rekey's transaction; idempotent, as rows are).
    func resealSyncBlobs(_ store: ItemStore, _ keys: RekeyKeys) throws(SecError) {
        func reseal(_ blob: [UInt8]) throws(SecError) -> [UInt8]? {
            guard blob.count > 17, let p = ProtectionClass(rawValue: blob[0]) else { throw .decode("the keychain's sync bookkeeping is malformed") }
            guard p.availability != .always, let newMK = keys.metadataKey(p, previous: false) else { return nil }
            let ref = Array(blob[1..<17]), sealed = Array(blob[17...])
            if unsafe newMK.withUnsafeBytes({ unsafe ItemCrypto.unwraps(sealed, classKey: $0, ref: ref, protection: p, keyRole: .metaKey) }) {
                return nil   // re-sealed by an earlier run of this rekey
            }
            guard let oldMK = keys.metadataKey(p, previous: true) else { throw .decode("the sync bookkeeping is sealed under neither the new nor the previous keys") }
            let rewrapped = try unsafe oldMK.withUnsafeBytes { o throws(SecError) in
                try unsafe newMK.withUnsafeBytes { n throws(SecError) in
                    try unsafe ItemCrypto.rewrap(sealed, from: o, to: n, ref: ref, protection: p, keyRole: .metaKey)
                }
            }
            return [p.rawValue] + ref + rewrapped
        }
        for row in [ItemStore.SyncRow.state, .deviceKeys] {
            if let blob = try store.syncState(row), let new = try reseal(blob) { try store.setSyncState(new, row) }
        }
        for note in try store.pendingSync() {
            if let new = try reseal(note.item) { try store.replacePendingSync(id: note.id, with: new) }
        }
    }

    /// Notes a local change of an item that syncs (called in the change's transaction, with the item's
    /// attributes before and after it): the pending change is committed with the item or not at all.
    func notePendingSync(_ store: ItemStore, _ cls: ItemClass, _ attrs: Attributes) throws(SecError) {
        guard SyncItem.isSyncable(cls, attrs), let protection = try Validation.protection(of: attrs) else { return }
        // Before sync is set up (no state stored) nothing is noted: setting it up records every item.
        guard try store.syncState() != nil else { return }
        var key = SyncItem.itemKey(cls, attrs)
        defer { secureZero(&key) }
        let blob = try sealSyncBlob(key, protection)
        try store.addPendingSync(blob)
    }

    /// The row of the synced item `itemKey` names, if any (its primary-key hash under every index key in memory).
    private func syncedRow(_ store: ItemStore, _ cls: ItemClass, _ pk: Attributes) throws(SecError) -> StoredRow? {
        var full = pk
        full["class"] = .string(cls.rawValue)
        let hashes = try unsafe keybag.withIndexKeys { keys in unsafe keys.map { unsafe Self.primaryKeyHash($0.1, cls, full) } }
        for h in hashes { if let id = try store.rowID(primaryKey: h) { return try store.row(id: id) } }
        return nil
    }

    /// This device's sync secret keys (`SyncDeviceKeys.exported`, 64 bytes), kept sealed under the
    /// AfterFirstUnlockThisDeviceOnly metadata key in the store; nil if sync was never set up.
    /// errSecInteractionNotAllowed before the first unlock.
    public func syncDeviceSecret() throws(SecError) -> SecureBytes? {
        try guarded.withLock { (s: inout State) throws(SecError) in
            guard let blob = try s.store.syncState(.deviceKeys) else { return nil }
            return try openSyncBlob(blob)
        }
    }

    /// Keeps this device's sync secret keys (sealed; they never reach the disk in clear). Replaces any.
    public func setSyncDeviceSecret(_ secret: SecureBytes) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            let blob = try sealSyncBlob(secret, Self.syncDeviceKeyProtection)
            try writing(store) { () throws(SecError) in try store.setSyncState(blob, .deviceKeys) }
        }
    }

    /// The sync directory of this keychain's state directory (``FileNames/syncDirectory``).
    public var syncDirectory: String { stateDirectory + "/" + FileNames.syncDirectory }

    /// Sets sync up: keeps this device's sync secret keys and the first state, and notes every item that
    /// syncs now as a local change (recorded at the device's first sync as a member), all in one
    /// transaction. Items whose keys are locked away are not noted (the agent sets sync up unlocked).
    public func startSync(deviceSecret: SecureBytes, state: [UInt8]) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            let keysBlob = try sealSyncBlob(deviceSecret, Self.syncDeviceKeyProtection)
            let stateBlob = try sealSyncBlob(state, Self.syncStateProtection)
            var notes: [[UInt8]] = []
            for (id, _) in try store.rowClasses() {
                guard let row = try store.row(id: id), let opened = try? openAttributes(row), SyncItem.isSyncable(opened.0, opened.1),
                      let protection = try Validation.protection(of: opened.1) else { continue }
                notes.append(try sealSyncBlob(SyncItem.itemKey(opened.0, opened.1), protection))
            }
            try writing(store) { () throws(SecError) in
                try store.setSyncState(keysBlob, .deviceKeys)
                try store.setSyncState(stateBlob)
                for note in notes { try store.addPendingSync(note) }
            }
        }
    }

    /// Forgets sync on this machine (a setup that failed, or a pairing started again): the state, the
    /// device keys and the pending changes in one transaction, then the sync clone. Items stay.
    public func stopSync() throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            try writing(store) { () throws(SecError) in try store.clearSync() }
        }
        try? Files.removeTree(syncDirectory)
    }

    /// The sync state stored with the last pull or recording (nil: none yet).
    public func syncState() throws(SecError) -> SecureBytes? {
        try guarded.withLock { (s: inout State) throws(SecError) in
            guard let blob = try s.store.syncState() else { return nil }
            return try openSyncBlob(blob)
        }
    }

    /// Local changes not yet recorded, oldest first (at most `limit` notes, one change per item): each
    /// the item's current version, or a deletion if it is gone or no longer syncs. Record them, then
    /// ``commitSyncRecorded(through:state:)`` with `through`.
    public func pendingSyncChanges(limit: Int = 512) throws(SecError) -> (through: Int64, changes: [SyncItemChange]) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            let notes = try store.reading { () throws(SecError) in try store.pendingSync(limit: limit) }
            var seen = Set<[UInt8]>(), changes: [SyncItemChange] = []
            for note in notes {
                let key = unsafe try openSyncBlob(note.item).withUnsafeBytes { unsafe Array($0) }
                guard seen.insert(key).inserted else { continue }
                let (cls, pk) = try SyncItem.decodeItemKey(key)
                var payload: SecureBytes? = nil
                if let row = try syncedRow(store, cls, pk) {
                    let (rowClass, attrs) = try openAttributes(row)
                    if rowClass == cls, SyncItem.isSyncable(cls, attrs) {
                        let secret = try openSecret(row, cls, attrs, .none)
                        payload = unsafe secret.withUnsafeBytes { unsafe SyncItem.payload(cls, attrs, secret: $0) }
                    }
                }
                changes.append((key, payload))
            }
            return (notes.last?.id ?? 0, changes)
        }
    }

    /// Forgets the pending changes up to `through` and stores `state` (the one counting their records),
    /// in one transaction.
    public func commitSyncRecorded(through: Int64, state: [UInt8]) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            let blob = try sealSyncBlob(state, Self.syncStateProtection)
            try writing(store) { () throws(SecError) in
                try store.removePendingSync(through: through)
                try store.setSyncState(blob)
            }
        }
    }

    /// Applies a pull: every change (a put adds or replaces the item by its primary key, a delete removes
    /// it) and the new sync `state`, in ONE transaction: a crash leaves all of it or none. A change that
    /// is malformed, names another item than its payload (a record replayed under another key), or
    /// carries an item that never syncs is refused (listed, without attribute values) and changes
    /// nothing; the others apply. Applied changes are not noted as local ones.
    @discardableResult
    public func applySync(_ changes: [SyncItemChange], state: [UInt8]) throws(SecError) -> (applied: Int, refused: [String]) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            var applied = 0, refused: [String] = []
            try writing(store) { () throws(SecError) in
                for (n, change) in changes.enumerated() {
                    let (cls, pk): (ItemClass, Attributes)
                    do throws(SecError) { (cls, pk) = try SyncItem.decodeItemKey(change.itemKey) } catch {
                        refused.append("change \(n): \(error.message)")
                        continue
                    }
                    let existing = try syncedRow(store, cls, pk)
                    guard let payload = change.payload else {
                        if let existing { try store.delete(id: existing.id) }
                        applied += 1
                        continue
                    }
                    let decoded: (ItemClass, Attributes, SecureBytes)
                    do throws(SecError) { decoded = try SyncItem.decodePayload(payload) } catch {
                        refused.append("change \(n): \(error.message)")
                        continue
                    }
                    let (payloadClass, attrs, secret) = decoded
                    guard SyncItem.itemKey(payloadClass, attrs) == change.itemKey else {
                        refused.append("change \(n): its payload is of another item than its key (a record replayed under another item)")
                        continue
                    }
                    let protection = try Validation.protection(of: attrs) ?? .defaultForNewItems
                    let ref = existing?.persistentRef ?? Random.bytes(16)
                    let (content, otherTiers) = try unsafe secret.withUnsafeBytes { sb throws(SecError) in
                        try unsafe seal(itemClass: cls, attributes: attrs, secret: sb, protection: protection, ref: ref)
                    }
                    if let existing {
                        try store.replace(id: existing.id, with: content)
                        try checkNoDuplicate(store, otherTiers, except: existing.id)
                    } else {
                        try checkNoDuplicate(store, otherTiers, except: nil)
                        try store.insert(content)
                    }
                    applied += 1
                    if n == changes.count / 2 { CrashPoint.hit("sync-apply-half") }
                }
                // Sealed last, inside the transaction: if it cannot be, none of the changes stay either.
                try store.setSyncState(try sealSyncBlob(state, Self.syncStateProtection))
            }
            return (applied, refused)
        }
    }
}
