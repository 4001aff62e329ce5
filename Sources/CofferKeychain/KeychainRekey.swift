public import CofferCrypto
public import CofferKeybag
public import CofferModel
import CofferStore
import CofferSystem

// Device-key migration, the migrations at open, passcode changes and the rekey they run.
extension Keychain {
    // MARK: Device-key migration and passcode changes

    /// Moves this keychain (opened with a ``TPMDeviceKey`` that sealed the file key, `migratingDeviceKey`)
    /// to the TPM: the keybag rekey of ``Keybag/migrateDeviceKey(passcode:reseal:)`` (every non-Always
    /// item re-sealed under fresh keys, as at a passcode change), then `device.key` removed, only once
    /// the format-3 keybag is durable. A keybag already in format 3 (an earlier run a crash stopped)
    /// is finished: its pending rekey at this unlock, then the file key removed.
    public func migrateDeviceKey(passcode: SecureBytes?) throws(SecError) {
        guard keybag.deviceKeyKind == .tpm else { throw .param("open the keychain with the TPM device key to migrate it") }
        if keybag.isTPMBound {
            if keybag.needsRekey, keybag.isPasscodeSet { try unlock(passcode: passcode) }
        } else {
            try guarded.withLock { (s: inout State) throws(SecError) in
                let version = keybag.formatVersion
                let store = s.store
                var line: String? = nil
                defer { if let line { s.migrations.append(line) } }
                // The rekey re-seals the rollback records under the new passcode tier (resealRows), as a
                // passcode change does; without the counter they would no longer open after the move.
                try verifyBeforeRekey(store)
                defer { rollback?.ledger.load(from: keybag) }
                try keybag.migrateDeviceKey(passcode: passcode) { keys throws(SecError) in
                    line = try self.resealRows(store, keys, from: version)
                }
                // Sealed at value + 1: counted now, or at the next unlock after a crash (rule 5's value + 1).
                if let rollback, (try? rollback.records(store))??.device.epoch ?? 0 > 0 { _ = try? rollback.counter.increment() }
            }
        }
        CrashPoint.hit("migrate-committed")
        try Self.removeFileDeviceKey(stateDirectory)
        CrashPoint.hit("migrate-done")
    }

    /// What the migrations of this process did (one line each, no attribute values), for the agent's log.
    public var migrationReport: [String] { guarded.withLock { $0.migrations } }

    /// The lines of ``migrationReport`` not taken before (the agent logs each once).
    public func takeMigrationReport() -> [String] {
        guarded.withLock { s in
            defer { s.reported = s.migrations.count }
            return Array(s.migrations[s.reported...])
        }
    }

    /// A keybag of format 1 (or one a crash left mid-rekey) at open: re-pads the Always rows now (their
    /// keys never change), and without a passcode finishes the whole rekey now; with a passcode the
    /// first unlock does (see ``unlock(passcode:)``).
    func migrateAtOpen() throws(SecError) {
        let version = keybag.formatVersion
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            let repadded = try store.transaction { () throws(SecError) in try repadAlwaysRows(store) }
            if repadded > 0 { s.migrations.append("keychain: \(repadded) Always-class items re-padded (item format 2)") }
            if !keybag.isPasscodeSet {
                var line: String? = nil
                defer { if let line { s.migrations.append(line) } }
                try keybag.finishRekeyWithoutPasscode { keys throws(SecError) in line = try self.resealRows(store, keys, from: version) }
            } else {
                s.migrations.append("keybag format \(version) with a passcode: the remaining items are migrated at the first unlock")
            }
        }
    }

    /// A rekey re-seals the rollback records: first they must match the counter and the rows (what the
    /// keys in memory can check), or a passcode change would bless a keychain.db put back. Called before
    /// the keybag changes anything, and again inside the rekey (a rekey finished at unlock).
    private func verifyBeforeRekey(_ store: ItemStore) throws(SecError) {
        guard let rollback, let (d, p) = try rollback.records(store), d.epoch > 0 else { return }
        try rollback.verify(store, device: d, passcode: p, counter: try rollback.counter.read())
    }

    /// Sets or changes the keybag passcode: a rekey that re-seals every non-Always item under fresh
    /// keys (holding the keychain mutex throughout: seconds at 100,000 items).
    public func setPasscode(current: SecureBytes?, new: SecureBytes, kdf: KDFPolicy = .standard) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let version = keybag.formatVersion
            let store = s.store
            var line: String? = nil
            defer { if let line { s.migrations.append(line) } }
            try verifyBeforeRekey(store)
            defer { rollback?.ledger.load(from: keybag) }
            try keybag.setPasscode(current: current, new: new, kdf: kdf) { keys throws(SecError) in
                line = try self.resealRows(store, keys, from: version)
            }
            // The rekey sealed the records at value + 1: count it now. The change is done either way: a
            // crash or an unreachable TPM here leaves the increment to the next unlock (rule 5's value + 1).
            if let rollback, (try? rollback.records(store))??.device.epoch ?? 0 > 0 { _ = try? rollback.counter.increment() }
        }
    }

    /// Removes the passcode (`coffer passcode remove`; the agent checked it through PAM first): every
    /// WhenPasscodeSetThisDeviceOnly item is deleted (its class key is destroyed: unrecoverable), every
    /// other item is re-sealed under fresh keys the device key wraps, in one transaction (crash-safe
    /// through the rekey mechanism). Items with an access control stay but cannot be opened while no
    /// passcode is set (nobody can authenticate).
    public func removePasscode(current: SecureBytes) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let version = keybag.formatVersion
            let store = s.store
            var line: String? = nil
            defer { if let line { s.migrations.append(line) } }
            try verifyBeforeRekey(store)
            defer { rollback?.ledger.load(from: keybag) }
            try keybag.removePasscode(current: current) { keys throws(SecError) in
                line = try self.resealRows(store, keys, from: version)
            }
            // The rekey sealed the records at value + 1: count it now. The change is done either way: a
            // crash or an unreachable TPM here leaves the increment to the next unlock (rule 5's value + 1).
            if let rollback, (try? rollback.records(store))??.device.epoch ?? 0 > 0 { _ = try? rollback.counter.increment() }
        }
    }

    // MARK: Rekey and migration (hold the keychain mutex)

    /// Step 2 of a rekey: in one transaction, re-seals every row of a rotated class under the new keys
    /// (re-wrapping its item keys; re-padding a format-1 secret) and recomputes its primary-key and
    /// blind-index hashes under the new tier-P key.
    /// Idempotent: a row whose item key already unwraps under the new key is left alone.
    func resealRows(_ store: ItemStore, _ keys: RekeyKeys, from keybagVersion: Int) throws(SecError) -> String {
        let t0 = Self.now()
        var resealed = 0, deleted = 0, rewrapped = 0
        // Runs inside the keybag's mutex: nothing here may call the keybag (the keys come in `keys`).
        // The Always rows need nothing: their keys do not rotate, and `migrateAtOpen` re-padded them.
        // Rollback records: not kept incrementally here (the passcode bucket's key changes); computed
        // whole under the new key at the end, in the same transaction.
        let ledger = store.ledger
        store.ledger = nil
        defer { store.ledger = ledger }
        try verifyBeforeRekey(store)
        let previousKey = rollback?.ledger.key(RollbackLedger.passcodeBucket)
        if let rollback { unsafe keys.passcodeIndexKey.withUnsafeBytes { unsafe rollback.ledger.setKey(bucket: RollbackLedger.passcodeBucket, indexKey: $0) } }
        do {
        try store.transaction { () throws(SecError) in
            let rows = try store.rowClasses()
            for (i, (id, pclass)) in rows.enumerated() {
                if i == rows.count / 2 { CrashPoint.hit("rekey-reseal-half") }
                guard let p = ProtectionClass(rawValue: pclass), p.availability != .always else { continue }
                if p.requiresPasscode && keys.classKey(p, previous: false) == nil {
                    // The passcode was removed: its class key is gone, and so is the item.
                    try store.delete(id: id)
                    deleted += 1
                    continue
                }
                guard let row = try store.row(id: id) else { continue }
                if try resealRow(store, row, p, keys) { resealed += 1 }
            }
            try resealSyncBlobs(store, keys)
            rewrapped = try rewrapFileKeys(store, keys)
            if let rollback, let (d, _) = try rollback.records(store) {
                guard rollback.ledger.verifies(d) else { throw RollbackFinding.recordsEdited.secError }
                var epoch: Int64 = 0
                if d.epoch > 0 {
                    guard let value = try rollback.counter.read() else { throw RollbackFinding.counterMissing.secError }
                    epoch = Int64(value + 1)
                }
                try rollback.writeRecords(store, epoch: epoch)
            }
        }
        } catch {
            rollback?.ledger.restore(bucket: RollbackLedger.passcodeBucket, previousKey)
            throw error
        }
        return ("keybag rekey from format \(keybagVersion): \(resealed) items re-sealed"
            + (rewrapped > 0 ? ", \(rewrapped) protected directory keys re-wrapped" : "")
            + (deleted > 0 ? ", \(deleted) WhenPasscodeSet items deleted (passcode removed)" : "") + " in \(Int((Self.now() - t0) * 1000)) ms")
    }

    private func resealRow(_ store: ItemStore, _ row: StoredRow, _ p: ProtectionClass, _ keys: RekeyKeys) throws(SecError) -> Bool {
        guard row.persistentRef.count == 16, let newMK = keys.metadataKey(p, previous: false),
              let newCK = keys.classKey(p, previous: false) else {
            throw .decode("an item row has an invalid protection class or reference")
        }
        let ref = row.persistentRef
        if unsafe newMK.withUnsafeBytes({ unsafe ItemCrypto.unwraps(row.meta, classKey: $0, ref: ref, protection: p, keyRole: .metaKey) }) {
            return false // re-sealed by an earlier run of this rekey
        }
        guard let oldMK = keys.metadataKey(p, previous: true), let oldCK = keys.classKey(p, previous: true) else {
            throw .decode("an item is sealed under neither the new nor the previous keys of its class")
        }
        let plain = try unsafe oldMK.withUnsafeBytes { k throws(SecError) in try unsafe ItemCrypto.openMeta(row.meta, classKey: k, ref: ref, protection: p) }
        let (cls, attrs) = try Self.decodeAttributes(plain, p)
        let meta = try unsafe oldMK.withUnsafeBytes { o throws(SecError) in
            try unsafe newMK.withUnsafeBytes { n throws(SecError) in
                try unsafe ItemCrypto.rewrap(row.meta, from: o, to: n, ref: ref, protection: p, keyRole: .metaKey)
            }
        }
        let secret = try unsafe oldCK.withUnsafeBytes { o throws(SecError) -> [UInt8] in
            try unsafe newCK.withUnsafeBytes { n throws(SecError) -> [UInt8] in
                if (ItemCrypto.version(of: row.secret) ?? 0) >= ItemCrypto.secretVersion {
                    return try unsafe ItemCrypto.rewrap(row.secret, from: o, to: n, ref: ref, protection: p, keyRole: .secretKey)
                }
                let s = try unsafe ItemCrypto.openSecret(row.secret, classKey: o, ref: ref, protection: p)
                return unsafe s.withUnsafeBytes { unsafe ItemCrypto.sealSecret($0, classKey: n, ref: ref, protection: p) }
            }
        }
        var full = attrs
        full["class"] = .string(cls.rawValue)
        let (pk, index) = unsafe keys.passcodeIndexKey.withUnsafeBytes { unsafe Self.hashes($0, cls, full) }
        try store.replace(id: row.id, with: RowContent(primaryKeyHash: pk, persistentRef: ref, protectionClass: p.rawValue,
                                                      meta: meta, secret: secret, indexHashes: index))
        return true
    }

    /// Re-pads the format-1 secrets of Always-class rows (keys unchanged, so idempotent); call inside a
    /// transaction. Returns how many rows changed.
    private func repadAlwaysRows(_ store: ItemStore) throws(SecError) -> Int {
        var n = 0
        for (id, pclass) in try store.rowClasses() {
            guard let p = ProtectionClass(rawValue: pclass), p.availability == .always,
                  let row = try store.row(id: id), ItemCrypto.version(of: row.secret) == 1 else { continue }
            let sealed = try unsafe keybag.withClassKey(p) { k throws(SecError) in
                let s = try unsafe ItemCrypto.openSecret(row.secret, classKey: k, ref: row.persistentRef, protection: p)
                return unsafe s.withUnsafeBytes { unsafe ItemCrypto.sealSecret($0, classKey: k, ref: row.persistentRef, protection: p) }
            }
            try store.replaceSecret(id: id, with: sealed)
            n += 1
        }
        return n
    }
}
