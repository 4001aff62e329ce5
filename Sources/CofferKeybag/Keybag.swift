package import CofferCrypto
package import CofferModel
import CofferSystem
import Glibc

/// Which index key a row's blind hashes (and primary-key hash) are computed under.
package enum IndexTier: Int, Sendable, CaseIterable {
    /// Tier D: the device-wrapped index key (slot 16), for rows of the Always classes only.
    case device = 16
    /// Tier P: the index key of every other class (slot 17): passcode-wrapped when a passcode is set,
    /// unwrapped at the first unlock and kept while locked (AfterFirstUnlock availability).
    case passcode = 17

    /// The tier that indexes rows of `protectionClass`.
    package static func of(_ protectionClass: ProtectionClass) -> IndexTier {
        protectionClass.availability == .always ? .device : .passcode
    }
}

/// The keys a rekey hands to the code that re-seals the items: the new (current) keys and the
/// previous keys they replace, for every rotated class, and the new passcode-tier index key.
///
/// Rotated: class and metadata keys of every class but the Always ones, and the tier-P index key.
/// Not rotated: the Always-class keys and the tier-D index key (they are protected by the device key
/// alone, which a passcode change does not change).
package final class RekeyKeys: Sendable {
    private let current: [Int: SecureBytes]
    private let previous: [Int: SecureBytes]

    init(current: [Int: SecureBytes], previous: [Int: SecureBytes]) {
        self.current = current
        self.previous = previous
    }

    /// The class key of `c`, new or previous (nil if it has none, e.g. WhenPasscodeSet before a passcode).
    package func classKey(_ c: ProtectionClass, previous old: Bool) -> SecureBytes? {
        (old ? previous : current)[Slot.classKey(c)]
    }

    /// The metadata key of `c`, new or previous.
    package func metadataKey(_ c: ProtectionClass, previous old: Bool) -> SecureBytes? {
        (old ? previous : current)[Slot.metadataKey(c)]
    }

    /// The new tier-P index key.
    package var passcodeIndexKey: SecureBytes { current[Slot.passcodeIndexKey]! }
}

/// Test-only crash points (debug builds): `COFFER_TEST_CRASH_POINT=name` makes the process `_exit(99)`
/// when it reaches the point of that name, so tests can show a kill at each step leaves a usable state.
package enum CrashPoint {
    /// Exits the process if `name` is the configured crash point (debug builds only; a no-op in release).
    package static func hit(_ name: String) {
        #if DEBUG
        guard !name.isEmpty, let v = unsafe getenv("COFFER_TEST_CRASH_POINT"), unsafe String(cString: v) == name else { return }
        _exit(99)
        #endif
    }
}

/// The system keybag: one class key (for secrets) and one metadata key (for attributes) per
/// protection class, plus two blind-index keys (tier D for Always rows, tier P for the others).
///
/// On disk (see the Keybag article in the DocC catalog):
/// - `device.key`: the device key (``DeviceKeySource``); with ``TPMDeviceKey``, `device-key.tpm` instead.
/// - `keybag.key`: the disposable keybag key, replaced on every passcode change.
/// - `keybag`: the wrapped class keys, sealed under a key derived from the keybag key and the device key.
///
/// Always-class keys and the tier-D index key are wrapped under the device key alone. With a passcode
/// set, the other classes and the tier-P index key are wrapped under the passcode key (Argon2id
/// tangled with the device key); without one, under the device key, and WhenPasscodeSetThisDeviceOnly
/// does not exist.
///
/// Every passcode change rotates the keys of the non-Always classes and the tier-P index key (a
/// *rekey*, see ``setPasscode(current:new:kdf:reseal:)``), so an old keybag backup and the old
/// passcode open nothing added after the change.
///
/// Unwrapped keys live in one guarded, locked allocation (the arena) and are wiped on lock.
/// All methods are thread-safe: the arena, the file image and the lock state are owned by one
/// ``Protected`` and reached only inside its `withLock`; the slow parts (Argon2id) run outside it.
package final class Keybag: Sendable {
    /// Everything mutable, owned by the keybag's lock.
    private let guarded: Protected<State>

    /// Size of every key in the keybag.
    package static let keyBytes = 32

    /// Re-seals every item under the keys of a rekey (one database transaction); given by the keychain.
    package typealias Reseal = (RekeyKeys) throws(SecError) -> Void

    /// The reseal of a bare keybag (no items to re-seal).
    private static func noItems(_ keys: RekeyKeys) throws(SecError) {}

    /// A passcode key derived (slowly) outside every lock, for ``unlock(derived:reseal:)``.
    package struct DerivedPasscodeKey: Sendable {
        let key: SecureBytes
        let salt: [UInt8]
    }

    /// True if this keybag was created by ``openOrCreate(directory:deviceKey:)`` (there was none):
    /// records made for an earlier keybag in the directory (an escrow) belong to nothing now.
    package let isNew: Bool

    private init(paths: KeybagPaths, deviceKey: SecureBytes, file: KeybagFile, isNew: Bool, source: DeviceKeySource) throws(SecError) {
        var state = State(paths: paths, file: file, source: source)
        state.recordFiles()
        state.setSlot(Slot.deviceKey, deviceKey)
        try state.unwrapEntries(wrapping: .device, passcodeKey: nil)
        guarded = Protected(state)
        self.isNew = isNew
    }

    /// Opens the keybag in `directory`, creating a new one (no passcode) on first use.
    ///
    /// A keybag written by an older Coffer (format 1) or left by an interrupted rekey opens with
    /// ``needsRekey`` true; the keychain finishes the rekey at open (no passcode) or at the first unlock.
    ///
    /// The keybag's format must match the source: format 3 (a TPM-bound passcode) only with a TPM
    /// device key, and a TPM device key only with format 3, unless `migrating` is true (a
    /// ``migrateDeviceKey(passcode:reseal:)`` that a crash interrupted is being finished).
    package static func openOrCreate(directory: String, deviceKey source: DeviceKeySource,
                                     migrating: Bool = false) throws(SecError) -> Keybag {
        let paths = KeybagPaths(directory: directory)
        let deviceKey = try source.loadDeviceKey()
        if let file = try KeybagFile.load(paths, deviceKey: deviceKey) {
            if file.tpmDeviceKey && source.kind != .tpm {
                throw .notAvailable("the keybag in \(directory) is bound to the TPM (keybag format 3) and the agent is configured for the "
                    + "\(source.kind.rawValue) device key: set 'device-key = tpm' in cofferd.conf")
            }
            if !file.tpmDeviceKey && source.kind == .tpm && !migrating {
                throw .notAvailable("the keybag in \(directory) still uses the file device key (keybag format \(file.version)) and the "
                    + "agent is configured for the TPM: run 'coffer device-key migrate --to tpm' with the agent stopped, or set 'device-key = file'")
            }
            return try Keybag(paths: paths, deviceKey: deviceKey, file: file, isNew: false, source: source)
        }
        let fresh = KeybagFile.generate(deviceKey: deviceKey, kind: source.kind)
        try fresh.file.save(paths, keybagKey: fresh.keybagKey, deviceKey: deviceKey)
        return try Keybag(paths: paths, deviceKey: deviceKey, file: fresh.file, isNew: true, source: source)
    }

    /// Releases what the device key source holds (``DeviceKeySource/release()``).
    package func releaseDeviceKey() { guarded.withLock { $0.source }.release() }

    /// Where the device key lives (the source this keybag was opened with, or migrated to).
    package var deviceKeyKind: DeviceKeyKind { guarded.withLock { $0.source.kind } }

    /// True if wrong passcodes are counted by the TPM (a passcode bound to it is set).
    package var attemptsCountedByTPM: Bool { guarded.withLock { $0.file.passcode?.tpmKey != nil } }

    /// Whether the counting TPM's lockout authorization is set (``DeviceKeySource/lockoutAuthorizationSet()``,
    /// asked outside the keybag's lock); nil without a TPM device key or when the TPM never answered.
    package var lockoutAuthorizationSet: Bool? { guarded.withLock { $0.source }.lockoutAuthorizationSet() }

    // MARK: State

    /// The current lock state.
    package var state: LockState { guarded.withLock { $0.lockState } }

    /// The lock state and the passcode flag, read in one critical section.
    package var status: LockStatus { guarded.withLock { LockStatus(lockState: $0.lockState, passcodeSet: $0.file.passcodeSet) } }

    /// True once a passcode protects the non-Always classes.
    package var isPasscodeSet: Bool { guarded.withLock { $0.file.passcodeSet } }

    /// The Argon2id parameters chosen at passcode set (nil with no passcode).
    package var kdfParameters: KDFParameters? { guarded.withLock { $0.file.passcode?.parameters } }

    /// The keybag file's format as read (1: written by an older Coffer, migrated by the next rekey).
    package var formatVersion: Int { guarded.withLock { Int($0.file.version) } }

    /// True while a rekey must run or finish (a format-1 keybag, or one a crash left mid-rekey).
    package var needsRekey: Bool { guarded.withLock { $0.needsRekey } }

    /// True if `protectionClass`'s keys are in memory now.
    package func isAvailable(_ protectionClass: ProtectionClass) -> Bool {
        guarded.withLock { $0.isAvailable(Slot.classKey(protectionClass)) }
    }

    /// True if the index key of `tier` is in memory now.
    package func isAvailable(_ tier: IndexTier) -> Bool {
        guarded.withLock { $0.isAvailable(tier.rawValue) }
    }

    // MARK: Lock and unlock

    /// Unlocks: unwraps the passcode-protected class keys. With no passcode set, `passcode` is ignored.
    ///
    /// A wrong passcode throws errSecAuthFailed and changes nothing (neither memory nor files). A keybag
    /// that needs a rekey (``needsRekey``) can only be unlocked through the keychain, which re-seals the items.
    package func unlock(passcode: SecureBytes?) throws(SecError) {
        try unlock(derived: derivePasscodeKey(passcode), reseal: nil)
    }

    /// The slow half of an unlock (Argon2id), run without holding any lock; nil with no passcode set.
    package func derivePasscodeKey(_ passcode: SecureBytes?) throws(SecError) -> DerivedPasscodeKey? {
        let job: (passcode: KeybagFile.Passcode, source: DeviceKeySource)? = guarded.withLock { s in s.file.passcode.map { ($0, s.source) } }
        guard let job else { return nil }
        guard let passcode, passcode.count > 0 else { throw .authFailed("a passcode is required to unlock") }
        let pk = try Self.passcodeKey(passcode, job.passcode, job.source, deviceKeyCopy())
        return DerivedPasscodeKey(key: pk, salt: job.passcode.salt)
    }

    /// The passcode key of `passcode` for the keybag's passcode record `p` (bound to `source`'s TPM key
    /// when the record holds one).
    private static func passcodeKey(_ passcode: SecureBytes, _ p: KeybagFile.Passcode, _ source: DeviceKeySource,
                                    _ deviceKey: SecureBytes) throws(SecError) -> SecureBytes {
        guard let blob = p.tpmKey else {
            return try PasscodeKDF.derive(passcode: passcode, salt: p.salt, parameters: p.parameters, deviceKey: deviceKey)
        }
        guard source.bindsPasscode else { throw .notAvailable("the passcode is bound to a TPM and the device key is not the TPM's") }
        return try PasscodeKDF.derive(passcode: passcode, salt: p.salt, parameters: p.parameters, deviceKey: deviceKey,
                                      binding: (source, blob)).key
    }

    /// A new passcode record and its key (a new TPM key for it when `source` binds passcodes).
    private static func newPasscode(_ passcode: SecureBytes, _ params: KDFParameters, _ source: DeviceKeySource,
                                    _ deviceKey: SecureBytes) throws(SecError) -> (KeybagFile.Passcode, SecureBytes) {
        let salt = Random.bytes(Argon2id.saltBytes)
        let derived = try PasscodeKDF.derive(passcode: passcode, salt: salt, parameters: params, deviceKey: deviceKey,
                                             binding: source.bindsPasscode ? (source, nil) : nil)
        return (KeybagFile.Passcode(salt: salt, parameters: params, tpmKey: derived.tpmKey), derived.key)
    }

    /// The fast half of an unlock. If a rekey is pending (or the keybag is in format 1), `reseal` runs it
    /// to the end before the keys are handed out: nothing reads an item under a half-finished rekey.
    package func unlock(derived: DerivedPasscodeKey?, reseal: Reseal?) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            let pending = s.needsRekey
            guard let derived else {
                guard !s.file.passcodeSet else { throw .authFailed("a passcode is required to unlock") }
                if pending {
                    guard let reseal else { throw .interactionNotAllowed("the keybag needs a rekey; open it through the keychain") }
                    try s.rekey(newPasscode: nil, reseal: reseal)
                }
                try s.unwrapEntries(wrapping: .device, passcodeKey: nil)
                s.lockState = .unlocked
                return
            }
            guard s.file.passcode?.salt == derived.salt else { throw .authFailed("the passcode changed during unlock; try again") }
            if pending {
                guard let reseal else { throw .interactionNotAllowed("the keybag needs a rekey; open it through the keychain") }
                // Checks the passcode first (opening every entry), so a wrong passcode changes nothing.
                _ = try s.openAll(passcodeKey: derived.key)
                try s.rekey(newPasscode: s.file.passcode.map { ($0, derived.key) }, oldPasscodeKey: derived.key, reseal: reseal)
            }
            try s.unwrapEntries(wrapping: .passcode, passcodeKey: derived.key)
            s.lockState = .unlocked
        }
    }

    /// Finishes a rekey at open when no passcode is set (everything is under the device key).
    package func finishRekeyWithoutPasscode(reseal: Reseal) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            guard !s.file.passcodeSet, s.needsRekey else { return }
            try s.rekey(newPasscode: nil, reseal: reseal)
            try s.unwrapEntries(wrapping: .device, passcodeKey: nil)
        }
    }

    /// errSecNotAvailable if the keybag files are not those this keybag last loaded or wrote (another
    /// process rewrote them): the keychain calls it before every write, so nothing is sealed under
    /// keys that were rotated elsewhere. A rekey checks it itself.
    package func checkUnchanged() throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in try s.checkFilesUnchanged() }
    }

    /// Locks: wipes the WhenUnlocked, WhenUnlockedThisDeviceOnly and WhenPasscodeSet keys from memory.
    /// The tier-P index key stays (AfterFirstUnlock items stay searchable while locked).
    ///
    /// Returns true if this call locked the keybag (it was unlocked), in the same critical section as
    /// the wipe: of two concurrent callers exactly one sees true.
    @discardableResult
    package func lock() -> Bool {
        guarded.withLock { s in
            for c in ProtectionClass.allCases where c.availability == .whenUnlocked {
                s.wipeSlot(Slot.classKey(c))
                s.wipeSlot(Slot.metadataKey(c))
            }
            guard s.lockState == .unlocked else { return false }
            s.lockState = .locked
            return true
        }
    }

    // MARK: Escrow

    /// The keys a passcode protects (every non-Always class, its metadata key, the tier-P index key) and
    /// the keybag generation they belong to: what an escrow record holds. Only while unlocked (every
    /// such key in memory); errSecInteractionNotAllowed otherwise, errSecNotAvailable without a passcode.
    package func escrowKeys() throws(SecError) -> (generation: UInt64, keys: [(slot: Int, key: SecureBytes)]) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            guard s.file.passcodeSet else { throw .notAvailable("no passcode is set: nothing needs an escrow") }
            guard s.lockState == .unlocked else { throw .interactionNotAllowed("unlock first: an escrow holds the keys an unlock opens") }
            var out: [(slot: Int, key: SecureBytes)] = []
            for (slot, entry) in s.file.entries.sorted(by: { $0.key < $1.key }) where entry.wrapping == .passcode {
                guard s.isAvailable(slot) else { throw .interactionNotAllowed("a key is not in memory; unlock first") }
                out.append((slot, unsafe SecureBytes(copying: s.slotBytes(slot))))
            }
            return (s.file.generation, out)
        }
    }

    /// Unlocks with the keys of an escrow record made for keybag generation `generation` (its AEAD,
    /// under a key only the escrow secret and the device key give, vouches for them): stale after any
    /// passcode change, removal or rekey (errSecAuthFailed).
    package func unlock(escrowed keys: [(slot: Int, key: SecureBytes)], generation: UInt64) throws(SecError) {
        try guarded.withLock { (s: inout State) throws(SecError) in
            guard s.file.passcodeSet, !s.file.rekeyPending, s.file.generation == generation else {
                throw .authFailed("the escrow record is stale (the keys changed since it was made): create a new one")
            }
            let expected = Set(s.file.entries.filter { $0.value.wrapping == .passcode }.map(\.key))
            guard Set(keys.map(\.slot)) == expected, keys.allSatisfy({ $0.key.count == Keybag.keyBytes }) else {
                throw .decode("the escrow record does not hold this keybag's keys")
            }
            try s.unwrapEntries(wrapping: .device, passcodeKey: nil)
            for (slot, key) in keys { s.setSlot(slot, key) }
            s.lockState = .unlocked
        }
    }

    /// A copy of the device key (for escrow records: they only open on this device).
    package func withDeviceKey<R>(_ body: (UnsafeRawBufferPointer) throws(SecError) -> R) throws(SecError) -> R {
        let k = deviceKeyCopy()
        return unsafe try k.withUnsafeBytes { (b) throws(SecError) -> R in unsafe try body(b) }
    }

    /// Destroys the keybag: every unwrapped key is wiped and the keybag files are deleted, so every
    /// item sealed under it is unrecoverable (a cryptographic erase; the device key stays). This
    /// object is then locked for good: a new keybag appears only when the directory is opened again.
    package func destroy() {
        guarded.withLock { s in
            s.wipeArena()
            s.lockState = .locked
            for path in [s.paths.key, s.paths.keybag, s.paths.next] { unsafe unlink(path) }
        }
    }

    /// Removes the passcode (`current` must be right): a rekey to device-key wrapping with fresh keys for
    /// every class a passcode protected, except WhenPasscodeSetThisDeviceOnly, whose keys are destroyed
    /// (`reseal` deletes its items: cryptographically unrecoverable, as the seeds say). Crash-safe like
    /// a change: a crash leaves the rekey pending, finished at the next open. Leaves the keybag unlocked
    /// (without a passcode it always is).
    package func removePasscode(current: SecureBytes, reseal: Reseal? = nil) throws(SecError) {
        let deviceKey = deviceKeyCopy()
        let snapshot = guarded.withLock { (generation: $0.file.generation, passcode: $0.file.passcode, source: $0.source) }
        guard let old = snapshot.passcode else { throw .notAvailable("no passcode is set") }
        guard current.count > 0 else { throw .authFailed("the current passcode is required") }
        let oldKey = try Self.passcodeKey(current, old, snapshot.source, deviceKey)
        try guarded.withLock { (s: inout State) throws(SecError) in
            guard s.file.generation == snapshot.generation else { throw .authFailed("the keybag changed meanwhile; try again") }
            do throws(SecError) {
                _ = try s.openAll(passcodeKey: oldKey)
            } catch {
                throw error.status == .authFailed ? .authFailed("wrong current passcode") : error
            }
            var resealItems: Reseal = Self.noItems
            if let reseal { resealItems = reseal }
            if s.file.rekeyPending {
                try s.rekey(newPasscode: s.file.passcode.map { ($0, oldKey) }, oldPasscodeKey: oldKey, reseal: resealItems)
            }
            try s.rekey(newPasscode: nil, oldPasscodeKey: oldKey, reseal: resealItems)
            try s.unwrapEntries(wrapping: .device, passcodeKey: nil)
            s.lockState = .unlocked
        }
    }

    /// Sets the passcode (`current` nil when none is set) or changes it (`current` must be right).
    ///
    /// A rekey: fresh keys for every non-Always class (creating WhenPasscodeSetThisDeviceOnly's) and
    /// a fresh tier-P index key, wrapped under the new passcode key; `reseal` re-seals every item under
    /// them; the keybag key file is replaced at each step, so an old keybag file with an old passcode
    /// opens nothing, and items added later are under keys no old file holds. Crash-safe: see the
    /// KeybagFormat article. Leaves the keybag unlocked. Without `reseal` (a bare keybag, no items)
    /// the rotation still happens.
    package func setPasscode(current: SecureBytes?, new: SecureBytes, kdf policy: KDFPolicy = .standard,
                            reseal: Reseal? = nil) throws(SecError) {
        guard new.count > 0 else { throw .param("the new passcode is empty") }
        let params = try PasscodeKDF.parameters(for: policy)
        guard params.memLimit >= UInt64(Argon2id.minimumMemory), params.opsLimit >= 1 else {
            throw .param("Argon2id parameters below libsodium's minimum")
        }
        let deviceKey = deviceKeyCopy()
        let snapshot = guarded.withLock { (generation: $0.file.generation, passcode: $0.file.passcode, source: $0.source) }
        var oldKey: SecureBytes? = nil
        if let old = snapshot.passcode {
            guard let current, current.count > 0 else { throw .authFailed("the current passcode is required") }
            // The current passcode first: with a TPM, a wrong one is refused (and counted) before a new TPM key is made.
            oldKey = try Self.passcodeKey(current, old, snapshot.source, deviceKey)
        }
        let (record, newKey) = try Self.newPasscode(new, params, snapshot.source, deviceKey)
        try guarded.withLock { (s: inout State) throws(SecError) in
            guard s.file.generation == snapshot.generation else { throw .authFailed("the keybag changed meanwhile; try again") }
            do throws(SecError) {
                _ = try s.openAll(passcodeKey: oldKey)
            } catch {
                throw error.status == .authFailed ? .authFailed("wrong current passcode") : error
            }
            var resealItems: Reseal = Self.noItems
            if let reseal { resealItems = reseal }
            if s.file.rekeyPending {
                // An earlier rekey never finished: finish it under the current passcode first.
                try s.rekey(newPasscode: s.file.passcode.map { ($0, oldKey!) }, oldPasscodeKey: oldKey, reseal: resealItems)
            }
            try s.rekey(newPasscode: (record, newKey), oldPasscodeKey: oldKey, reseal: resealItems)
            try s.unwrapEntries(wrapping: .device, passcodeKey: nil)
            try s.unwrapEntries(wrapping: .passcode, passcodeKey: newKey)
            s.lockState = .unlocked
        }
    }

    /// Finishes a device-key migration (``openOrCreate(directory:deviceKey:migrating:)`` with the TPM
    /// source and `migrating`): a rekey that writes keybag format 3, with the passcode (`passcode`,
    /// which must be right) bound to a new counted TPM key. The device key itself is the same (the
    /// TPM source sealed the file key's), so the Always classes and escrow records keep their keys.
    /// Crash-safe like a passcode change: before the commit the format-2 keybag and `device.key` still
    /// open everything; after it only the TPM does, and a crash before the items are re-sealed leaves
    /// the rekey pending (finished at the next unlock, or at open without a passcode). Nothing to do
    /// for a keybag that is in format 3 already.
    package func migrateDeviceKey(passcode: SecureBytes?, reseal: Reseal? = nil) throws(SecError) {
        let deviceKey = deviceKeyCopy()
        let snapshot = guarded.withLock { (generation: $0.file.generation, passcode: $0.file.passcode, source: $0.source,
                                           tpm: $0.file.tpmDeviceKey, pending: $0.file.rekeyPending) }
        guard snapshot.source.kind == .tpm else { throw .param("open the keybag with the TPM device key to migrate it") }
        if snapshot.tpm { return }
        guard !snapshot.pending else {
            throw .notAvailable("an earlier passcode change was interrupted: unlock the keychain once with the file device key "
                + "(device-key = file) so it finishes, then migrate")
        }
        var oldKey: SecureBytes? = nil
        var next: (KeybagFile.Passcode, SecureBytes)? = nil
        if let old = snapshot.passcode {
            guard let passcode, passcode.count > 0 else { throw .authFailed("the passcode is required to move it to the TPM") }
            oldKey = try Self.passcodeKey(passcode, old, snapshot.source, deviceKey)
            next = try Self.newPasscode(passcode, old.parameters, snapshot.source, deviceKey)
        }
        try guarded.withLock { (s: inout State) throws(SecError) in
            guard s.file.generation == snapshot.generation else { throw .authFailed("the keybag changed meanwhile; try again") }
            do throws(SecError) {
                _ = try s.openAll(passcodeKey: oldKey)
            } catch {
                throw error.status == .authFailed ? .authFailed("wrong passcode") : error
            }
            var resealItems: Reseal = Self.noItems
            if let reseal { resealItems = reseal }
            try s.rekey(newPasscode: next, oldPasscodeKey: oldKey, reseal: resealItems)
            try s.unwrapEntries(wrapping: .device, passcodeKey: nil)
            if let next { try s.unwrapEntries(wrapping: .passcode, passcodeKey: next.1) }
            s.lockState = .unlocked
        }
    }

    /// True if the keybag on disk is in format 3 (bound to the TPM).
    package var isTPMBound: Bool { guarded.withLock { $0.file.tpmDeviceKey } }

    // MARK: Key access

    /// Runs `body` with `protectionClass`'s class key (secrets), holding the keybag lock so the key
    /// cannot be wiped meanwhile. Throws errSecInteractionNotAllowed when locked, errSecNotAvailable
    /// for WhenPasscodeSetThisDeviceOnly with no passcode.
    package func withClassKey<R>(_ protectionClass: ProtectionClass,
                                _ body: (UnsafeRawBufferPointer) throws(SecError) -> R) throws(SecError) -> R {
        unsafe try withSlot(Slot.classKey(protectionClass), protectionClass, body)
    }

    /// Like ``withClassKey(_:_:)`` for the class's metadata key (attributes).
    package func withMetadataKey<R>(_ protectionClass: ProtectionClass,
                                   _ body: (UnsafeRawBufferPointer) throws(SecError) -> R) throws(SecError) -> R {
        unsafe try withSlot(Slot.metadataKey(protectionClass), protectionClass, body)
    }

    /// Runs `body` with the tier-D blind-index key (available in every state).
    package func withIndexKey<R>(_ body: (UnsafeRawBufferPointer) throws(SecError) -> R) throws(SecError) -> R {
        unsafe try withIndexKey(.device, body)
    }

    /// Runs `body` with the index key of `tier`; errSecInteractionNotAllowed if it is not in memory
    /// (tier P before the first unlock).
    package func withIndexKey<R>(_ tier: IndexTier, _ body: (UnsafeRawBufferPointer) throws(SecError) -> R) throws(SecError) -> R {
        try guarded.withLock { (s: inout State) throws(SecError) in
            guard s.isAvailable(tier.rawValue) else {
                throw .interactionNotAllowed("the passcode-tier index key is not available before the first unlock")
            }
            return unsafe try body(s.slotBytes(tier.rawValue))
        }
    }

    /// Runs `body` with every index key in memory now (tier D always; tier P after the first unlock).
    package func withIndexKeys<R>(_ body: ([(IndexTier, UnsafeRawBufferPointer)]) throws(SecError) -> R) throws(SecError) -> R {
        try guarded.withLock { (s: inout State) throws(SecError) in
            unsafe try body(IndexTier.allCases.filter { s.isAvailable($0.rawValue) }.map { unsafe ($0, s.slotBytes($0.rawValue)) })
        }
    }

    private func withSlot<R>(_ slot: Int, _ c: ProtectionClass,
                             _ body: (UnsafeRawBufferPointer) throws(SecError) -> R) throws(SecError) -> R {
        try guarded.withLock { (s: inout State) throws(SecError) in
            guard s.isAvailable(slot) else {
                if c.requiresPasscode && !s.file.passcodeSet {
                    throw .notAvailable("\(c.cliName) items need a passcode, and none is set")
                }
                throw .interactionNotAllowed("the \(c.cliName) class key is not available (keybag \(s.lockState))")
            }
            return unsafe try body(s.slotBytes(slot))
        }
    }

    /// A copy of the device key (for Argon2id, which runs outside the lock).
    private func deviceKeyCopy() -> SecureBytes {
        guarded.withLock { unsafe SecureBytes(copying: $0.slotBytes(Slot.deviceKey)) }
    }

    deinit {
        guarded.withLock { $0.wipeArena() }
    }

    // MARK: State owned by the lock

    /// The keybag's mutable state. Reachable only inside `guarded.withLock`, so every method here runs
    /// holding the keybag lock: the compiler, not a comment, keeps the arena, the file image and the
    /// lock state under it.
    private struct State {
        /// The unwrapped keys (``Slot`` layout). An immutable reference, written only through
        /// ``setSlot(_:_:)``, ``wipeSlot(_:)`` and ``wipeArena()``.
        private let arena = SecureBytes(count: Slot.count * Keybag.keyBytes)
        /// Which slots of `arena` hold a key (bit ``Slot/bit(_:)``).
        private var available: UInt32 = 0
        let paths: KeybagPaths
        /// The keybag file as last loaded or committed.
        var file: KeybagFile
        var lockState: LockState
        /// The identities of `keybag.key` and `keybag` as this process last loaded or wrote them.
        private var files: [FileIdentity?] = []
        /// SHA-256 of their contents then (nil: the file was missing or unreadable).
        private var digests: [[UInt8]?] = []

        /// Where the device key comes from (changed only by a device-key migration).
        var source: DeviceKeySource

        init(paths: KeybagPaths, file: KeybagFile, source: DeviceKeySource) {
            self.paths = paths
            self.file = file
            self.source = source
            self.lockState = file.passcodeSet ? .boot : .unlocked
        }

        /// A format-1 keybag, or one a crash left mid-rekey.
        var needsRekey: Bool { file.version < KeybagFile.currentVersion || file.rekeyPending }

        func isAvailable(_ slot: Int) -> Bool { available & Slot.bit(slot) != 0 }

        // MARK: Files changed under this process

        /// Notes the keybag files' identities (after loading or committing them).
        mutating func recordFiles() {
            files = [FileIdentity.of(paths.key), FileIdentity.of(paths.keybag)]
            digests = [Self.digest(paths.key), Self.digest(paths.keybag)]
        }

        /// SHA-256 of a file's bytes (the buffer wiped after), nil if it cannot be read.
        private static func digest(_ path: String) -> [UInt8]? {
            guard var bytes = try? Files.read(path, maxBytes: 1 << 20) else { return nil }
            defer { for i in bytes.indices { bytes[i] = 0 } }
            return SHA256.hash(bytes)
        }

        /// errSecNotAvailable if `keybag.key` or `keybag` is not what this process last loaded or
        /// wrote: another process rewrote the keybag (a passcode change rotating the keys), and
        /// anything sealed now under the keys in memory could become unreadable.
        ///
        /// The status is compared first (cheap); when it differs, the contents decide: a `chmod`, a
        /// `chown`, a hard link or a backup tool restoring times changes the status but no byte, and
        /// must not stop every write until a restart. The new status is then recorded.
        mutating func checkFilesUnchanged() throws(SecError) {
            let now = [FileIdentity.of(paths.key), FileIdentity.of(paths.keybag)]
            guard now != files else { return }
            if [Self.digest(paths.key), Self.digest(paths.keybag)] == digests && !digests.contains(where: { $0 == nil }) {
                files = now
                return
            }
            throw .notAvailable("the keybag files in \(Files.directoryName(paths.key)) changed under this agent (another process "
                + "rewrote them); nothing is written with keys that may be stale: restart the agent")
        }

        // MARK: Rekey

        /// The one rekey mechanism (passcode set/change, migration from format 1, finishing a crashed rekey).
        ///
        /// 1. Unless `file` is already pending: commit a keybag holding fresh keys as current and the
        ///    rotated-out keys as previous (all under the new passcode key), marked pending.
        /// 2. `reseal` re-seals every item (one transaction; idempotent: new keys first, then previous).
        /// 3. Commit the keybag without the previous keys and the mark.
        /// On failure after step 1 the keybag is left pending and its rotated keys are wiped from memory
        /// (state boot), so the next unlock finishes it.
        mutating func rekey(newPasscode: (KeybagFile.Passcode, SecureBytes)?, oldPasscodeKey: SecureBytes? = nil,
                            reseal: Reseal) throws(SecError) {
            try checkFilesUnchanged()
            let deviceKey = unsafe SecureBytes(copying: slotBytes(Slot.deviceKey))
            let dwk = deviceWrapKey()
            let opened = try openAll(passcodeKey: oldPasscodeKey)
            var current = opened.current
            var previous = opened.previous
            let passcode = newPasscode?.0
            func wrapKey(_ slot: Int) -> SecureBytes {
                Slot.expectedWrapping(slot, passcodeSet: passcode != nil) == .device ? dwk : newPasscode!.1
            }
            func seal(_ keys: [Int: SecureBytes], previousFlag: Int) -> [Int: WrappedEntry] {
                var out: [Int: WrappedEntry] = [:]
                for (slot, key) in keys {
                    let w = Slot.expectedWrapping(slot, passcodeSet: passcode != nil)
                    out[slot] = .seal(key, slot: slot | previousFlag, wrapping: w, key: wrapKey(slot))
                }
                return out
            }
            if passcode == nil {
                // No passcode (removed): WhenPasscodeSetThisDeviceOnly's keys are destroyed, not kept
                // under the device key (their items are deleted by the reseal: unrecoverable).
                for c in ProtectionClass.allCases where c.requiresPasscode {
                    for slot in [Slot.classKey(c), Slot.metadataKey(c)] {
                        current[slot] = nil
                        previous[slot] = nil
                        wipeSlot(slot)
                    }
                }
            }
            let version = KeybagFile.version(for: source.kind)
            if !(file.rekeyPending && file.version == version && file.passcode == passcode) {
                // Step 1: rotate. The previous keys are those the items are sealed under now.
                previous = [:]
                for slot in Slot.rotated where current[slot] != nil { previous[slot] = current[slot] }
                for slot in Slot.required(passcodeSet: passcode != nil) where Slot.isRotated(slot) {
                    current[slot] = .random(count: Keybag.keyBytes)
                }
                var next = file
                next.version = version
                next.generation += 1
                next.passcode = passcode
                next.entries = seal(current, previousFlag: 0)
                next.previous = seal(previous, previousFlag: KeybagFile.previousFlag)
                next.rekeyPending = true
                CrashPoint.hit("rekey-start")
                try next.save(paths, keybagKey: .random(count: Keybag.keyBytes), deviceKey: deviceKey, crashPoint: "rekey-next-written")
                file = next
                recordFiles()
                CrashPoint.hit("rekey-committed")
            }
            do throws(SecError) {
                // Step 2.
                try reseal(RekeyKeys(current: current, previous: previous))
                CrashPoint.hit("rekey-resealed")
                // Step 3.
                var done = file
                done.generation += 1
                done.previous = [:]
                done.rekeyPending = false
                try done.save(paths, keybagKey: .random(count: Keybag.keyBytes), deviceKey: deviceKey, crashPoint: "rekey-final-next-written")
                file = done
                recordFiles()
                CrashPoint.hit("rekey-done")
            } catch {
                for slot in Slot.rotated { wipeSlot(slot) }
                lockState = .boot
                throw error
            }
        }

        /// Every key of the file in plaintext (current and previous), from the file, not memory (the keybag
        /// may be locked). errSecAuthFailed if `passcodeKey` is wrong; changes nothing.
        func openAll(passcodeKey: SecureBytes?) throws(SecError) -> (current: [Int: SecureBytes], previous: [Int: SecureBytes]) {
            let dwk = deviceWrapKey()
            func open(_ entries: [Int: WrappedEntry], flag: Int) throws(SecError) -> [Int: SecureBytes] {
                var out: [Int: SecureBytes] = [:]
                for (slot, entry) in entries {
                    let wrapKey = entry.wrapping == .device ? dwk : passcodeKey
                    guard let wrapKey else { throw .authFailed("a passcode is required") }
                    do throws(SecError) {
                        out[slot] = try entry.open(slot: slot | flag, key: wrapKey)
                    } catch {
                        throw entry.wrapping == .passcode ? .authFailed("wrong passcode") : error
                    }
                }
                return out
            }
            return (try open(file.entries, flag: 0), try open(file.previous, flag: KeybagFile.previousFlag))
        }

        /// Unwraps every current entry with `wrapping` into temporaries first, so a failure changes nothing.
        mutating func unwrapEntries(wrapping: Wrapping, passcodeKey: SecureBytes?) throws(SecError) {
            let key = wrapping == .device ? deviceWrapKey() : passcodeKey!
            var opened: [(Int, SecureBytes)] = []
            for (slot, entry) in file.entries where entry.wrapping == wrapping {
                do {
                    opened.append((slot, try entry.open(slot: slot, key: key)))
                } catch {
                    // A wrong passcode and a tampered entry look alike by design.
                    throw wrapping == .passcode ? .authFailed("wrong passcode") : error
                }
            }
            for (slot, k) in opened { setSlot(slot, k) }
        }

        // MARK: Key arena

        /// The key in `slot`, borrowed from the arena: valid only while the lock is held.
        func slotBytes(_ slot: Int) -> UnsafeRawBufferPointer {
            unsafe arena.withUnsafeBytes { unsafe UnsafeRawBufferPointer(rebasing: $0[slot * Keybag.keyBytes ..< (slot + 1) * Keybag.keyBytes]) }
        }

        mutating func setSlot(_ slot: Int, _ key: SecureBytes) {
            precondition(key.count == Keybag.keyBytes)
            unsafe arena.withUnsafeMutableBytes { dst in
                unsafe key.withUnsafeBytes { src in
                    unsafe (dst.baseAddress! + slot * Keybag.keyBytes).copyMemory(from: src.baseAddress!, byteCount: Keybag.keyBytes)
                }
            }
            available |= Slot.bit(slot)
        }

        mutating func wipeSlot(_ slot: Int) {
            arena.wipe(slot * Keybag.keyBytes ..< (slot + 1) * Keybag.keyBytes)
            available &= ~Slot.bit(slot)
        }

        /// Wipes every key (the keybag is going away).
        mutating func wipeArena() {
            arena.wipe()
            available = 0
        }

        func deviceWrapKey() -> SecureBytes {
            unsafe Slot.deviceWrapKey(slotBytes(Slot.deviceKey))
        }
    }
}

/// Key arena layout: slot 0 device key, 1–7 class keys, 9–15 metadata keys, 16 tier-D index key,
/// 17 tier-P index key.
enum Slot {
    static let deviceKey = 0
    static let indexKey = IndexTier.device.rawValue
    static let passcodeIndexKey = IndexTier.passcode.rawValue
    static let count = 18
    static func classKey(_ c: ProtectionClass) -> Int { Int(c.rawValue) }
    static func metadataKey(_ c: ProtectionClass) -> Int { 8 + Int(c.rawValue) }
    static func bit(_ slot: Int) -> UInt32 { 1 << UInt32(slot) }
    static func protectionClass(of slot: Int) -> ProtectionClass? {
        guard slot < indexKey else { return nil }
        return ProtectionClass(rawValue: UInt8(slot > 8 ? slot - 8 : slot))
    }
    /// True for the slots that stay under the device key even with a passcode (Always classes, tier-D index key).
    static func isDeviceWrappedWithPasscode(_ slot: Int) -> Bool {
        slot == indexKey || protectionClass(of: slot)?.availability == .always
    }
    /// The only wrapping a slot may have: with a passcode, device for the Always classes and tier D,
    /// passcode for everything else; without one, device for everything.
    static func expectedWrapping(_ slot: Int, passcodeSet: Bool) -> Wrapping {
        passcodeSet && !isDeviceWrappedWithPasscode(slot) ? .passcode : .device
    }
    /// Slots a rekey replaces: every key a passcode protects (when one is set).
    static func isRotated(_ slot: Int) -> Bool { slot > 0 && slot != 8 && slot <= passcodeIndexKey && !isDeviceWrappedWithPasscode(slot) }
    static let rotated = (1...passcodeIndexKey).filter(isRotated)
    /// The slots a format-2 keybag holds.
    static func required(passcodeSet: Bool) -> [Int] {
        var slots = [indexKey, passcodeIndexKey]
        for c in ProtectionClass.allCases where passcodeSet || !c.requiresPasscode {
            slots += [classKey(c), metadataKey(c)]
        }
        return slots
    }
    static func deviceWrapKey(_ deviceKey: UnsafeRawBufferPointer) -> SecureBytes {
        unsafe KeyedHash.deriveKey(key: deviceKey, parts: [Array("coffer device wrap v1".utf8)])
    }
}
