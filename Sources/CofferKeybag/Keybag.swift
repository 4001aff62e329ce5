import CofferCrypto
import CofferModel
import CofferSystem
import Glibc

/// Which class keys the keybag can hand out.
public enum LockState: UInt8, Sendable, CustomStringConvertible {
    /// Before the first unlock since start: only the Always classes.
    case boot = 0
    /// Locked after an unlock: AfterFirstUnlock and Always classes, not WhenUnlocked ones.
    case locked = 1
    /// Every class key is available.
    case unlocked = 2

    public var description: String {
        switch self {
        case .boot: "boot"
        case .locked: "locked"
        case .unlocked: "unlocked"
        }
    }
}

/// The system keybag: one class key (for secrets) and one metadata key (for attributes) per
/// protection class, plus the blind-index key.
///
/// On disk (see the Keybag article in the DocC catalog):
/// - `device.key`: the device key (``DeviceKeySource``).
/// - `keybag.key`: the disposable keybag key, replaced on every passcode change.
/// - `keybag`: the wrapped class keys, sealed under a key derived from the keybag key and the device key.
///
/// Always-class keys and the index key are wrapped under the device key alone. With a passcode set,
/// the other classes are wrapped under the passcode key (Argon2id tangled with the device key);
/// without one, under the device key, and WhenPasscodeSetThisDeviceOnly does not exist.
///
/// Unwrapped keys live in one guarded, locked allocation (the arena) and are wiped on lock.
/// All methods are thread-safe.
public final class Keybag: @unchecked Sendable {
    // @unchecked Sendable: every mutable field is guarded by `mutex`.
    private let mutex = Lock()
    private let arena: SecureBytes
    private let paths: KeybagPaths
    private var file: KeybagFile
    private var available: UInt32 = 0
    private var lockState: LockState

    /// Size of every key in the keybag.
    public static let keyBytes = 32

    private init(paths: KeybagPaths, deviceKey: SecureBytes, file: KeybagFile) throws(SecError) {
        self.paths = paths
        self.file = file
        self.arena = SecureBytes(count: Slot.count * Self.keyBytes)
        self.lockState = file.passcodeSet ? .boot : .unlocked
        deviceKey.withUnsafeBytes { src in
            arena.withUnsafeMutableBytes { dst in
                dst.baseAddress!.copyMemory(from: src.baseAddress!, byteCount: Self.keyBytes)
            }
        }
        try unwrapEntries(wrapping: .device, passcodeKey: nil)
    }

    /// Opens the keybag in `directory`, creating a new one (no passcode) on first use.
    public static func openOrCreate(directory: String, deviceKey source: DeviceKeySource) throws(SecError) -> Keybag {
        let paths = KeybagPaths(directory: directory)
        let deviceKey = try source.loadDeviceKey()
        if let file = try KeybagFile.load(paths, deviceKey: deviceKey) {
            return try Keybag(paths: paths, deviceKey: deviceKey, file: file)
        }
        let fresh = KeybagFile.generate(deviceKey: deviceKey)
        try fresh.file.save(paths, keybagKey: fresh.keybagKey, deviceKey: deviceKey)
        return try Keybag(paths: paths, deviceKey: deviceKey, file: fresh.file)
    }

    // MARK: State

    /// The current lock state.
    public var state: LockState { mutex.withLock { lockState } }

    /// True once a passcode protects the non-Always classes.
    public var isPasscodeSet: Bool { mutex.withLock { file.passcodeSet } }

    /// The Argon2id parameters chosen at passcode set (nil with no passcode).
    public var kdfParameters: KDFParameters? { mutex.withLock { file.passcode?.parameters } }

    /// True if `protectionClass`'s keys are in memory now.
    public func isAvailable(_ protectionClass: ProtectionClass) -> Bool {
        mutex.withLock { available & Slot.bit(Slot.classKey(protectionClass)) != 0 }
    }

    // MARK: Lock and unlock

    /// Unlocks: unwraps the passcode-protected class keys. With no passcode set, `passcode` is ignored.
    ///
    /// A wrong passcode throws errSecAuthFailed and changes nothing (neither memory nor files).
    public func unlock(passcode: SecureBytes?) throws(SecError) {
        let job: (salt: [UInt8], params: KDFParameters)? = mutex.withLock { file.passcode.map { ($0.salt, $0.parameters) } }
        guard let job else {
            try mutex.withLock { () throws(SecError) in
                try unwrapEntries(wrapping: .device, passcodeKey: nil)
                lockState = .unlocked
            }
            return
        }
        guard let passcode, passcode.count > 0 else { throw .authFailed("a passcode is required to unlock") }
        // The slow part (Argon2id) runs without holding the lock, so other requests keep flowing.
        let pk = try PasscodeKDF.derive(passcode: passcode, salt: job.salt, parameters: job.params,
                                        deviceKey: deviceKeyCopy())
        try mutex.withLock { () throws(SecError) in
            guard file.passcode?.salt == job.salt else { throw .authFailed("the passcode changed during unlock; try again") }
            try unwrapEntries(wrapping: .passcode, passcodeKey: pk)
            lockState = .unlocked
        }
    }

    /// Locks: wipes the WhenUnlocked, WhenUnlockedThisDeviceOnly and WhenPasscodeSet keys from memory.
    public func lock() {
        mutex.withLock {
            for c in ProtectionClass.allCases where c.availability == .whenUnlocked {
                wipeSlot(Slot.classKey(c))
                wipeSlot(Slot.metadataKey(c))
            }
            if lockState == .unlocked { lockState = .locked }
        }
    }

    /// Sets the passcode (`current` nil when none is set) or changes it (`current` must be right).
    ///
    /// Re-wraps every non-Always class key under the new passcode key, creates the
    /// WhenPasscodeSetThisDeviceOnly keys if they did not exist, and replaces the keybag key file, so
    /// an old keybag file with an old passcode no longer opens anything. Leaves the keybag unlocked.
    public func setPasscode(current: SecureBytes?, new: SecureBytes, kdf policy: KDFPolicy = .standard) throws(SecError) {
        guard new.count > 0 else { throw .param("the new passcode is empty") }
        let params = try PasscodeKDF.parameters(for: policy)
        guard params.memLimit >= UInt64(Argon2id.minimumMemory), params.opsLimit >= 1 else {
            throw .param("Argon2id parameters below libsodium's minimum")
        }
        let salt = Random.bytes(Argon2id.saltBytes)
        let deviceKey = deviceKeyCopy()
        let newKey = try PasscodeKDF.derive(passcode: new, salt: salt, parameters: params, deviceKey: deviceKey)
        let snapshot = mutex.withLock { file }
        var oldKey: SecureBytes? = nil
        if let old = snapshot.passcode {
            guard let current, current.count > 0 else { throw .authFailed("the current passcode is required") }
            oldKey = try PasscodeKDF.derive(passcode: current, salt: old.salt, parameters: old.parameters, deviceKey: deviceKey)
        }
        try mutex.withLock { () throws(SecError) in
            guard file.generation == snapshot.generation else { throw .authFailed("the keybag changed meanwhile; try again") }
            // Every key in plaintext, from the file (not memory: the keybag may be locked).
            var keys: [Int: SecureBytes] = [:]
            for (slot, entry) in file.entries {
                let wrapKey = entry.wrapping == .device ? deviceWrapKey() : oldKey
                guard let wrapKey else { throw .decode("keybag entry wrapped under a passcode but no passcode is set") }
                do throws(SecError) {
                    keys[slot] = try entry.open(slot: slot, key: wrapKey)
                } catch {
                    throw entry.wrapping == .passcode ? .authFailed("wrong current passcode") : error
                }
            }
            for c in [ProtectionClass.whenPasscodeSetThisDeviceOnly] {
                if keys[Slot.classKey(c)] == nil { keys[Slot.classKey(c)] = .random(count: Self.keyBytes) }
                if keys[Slot.metadataKey(c)] == nil { keys[Slot.metadataKey(c)] = .random(count: Self.keyBytes) }
            }
            var next = file
            next.generation += 1
            next.passcode = .init(salt: salt, parameters: params)
            next.entries = [:]
            let dwk = deviceWrapKey()
            for (slot, key) in keys {
                let wrapping: Wrapping = Slot.isDeviceWrappedWithPasscode(slot) ? .device : .passcode
                next.entries[slot] = .seal(key, slot: slot, wrapping: wrapping, key: wrapping == .device ? dwk : newKey)
            }
            try next.save(paths, keybagKey: .random(count: Self.keyBytes), deviceKey: deviceKey)
            file = next
            for (slot, key) in keys { setSlot(slot, key) }
            lockState = .unlocked
        }
    }

    // MARK: Key access

    /// Runs `body` with `protectionClass`'s class key (secrets), holding the keybag lock so the key
    /// cannot be wiped meanwhile. Throws errSecInteractionNotAllowed when locked, errSecNotAvailable
    /// for WhenPasscodeSetThisDeviceOnly with no passcode.
    public func withClassKey<R>(_ protectionClass: ProtectionClass,
                                _ body: (UnsafeRawBufferPointer) throws(SecError) -> R) throws(SecError) -> R {
        try withSlot(Slot.classKey(protectionClass), protectionClass, body)
    }

    /// Like ``withClassKey(_:_:)`` for the class's metadata key (attributes).
    public func withMetadataKey<R>(_ protectionClass: ProtectionClass,
                                   _ body: (UnsafeRawBufferPointer) throws(SecError) -> R) throws(SecError) -> R {
        try withSlot(Slot.metadataKey(protectionClass), protectionClass, body)
    }

    /// Runs `body` with the blind-index key (available in every state).
    public func withIndexKey<R>(_ body: (UnsafeRawBufferPointer) throws(SecError) -> R) throws(SecError) -> R {
        try mutex.withLock { () throws(SecError) in try body(slotBytes(Slot.indexKey)) }
    }

    private func withSlot<R>(_ slot: Int, _ c: ProtectionClass,
                             _ body: (UnsafeRawBufferPointer) throws(SecError) -> R) throws(SecError) -> R {
        try mutex.withLock { () throws(SecError) in
            guard available & Slot.bit(slot) != 0 else {
                if c.requiresPasscode && !file.passcodeSet {
                    throw .notAvailable("\(c.cliName) items need a passcode, and none is set")
                }
                throw .interactionNotAllowed("the \(c.cliName) class key is not available (keybag \(lockState))")
            }
            return try body(slotBytes(slot))
        }
    }

    // MARK: Internals (callers hold `mutex`, except during init)

    private func slotBytes(_ slot: Int) -> UnsafeRawBufferPointer {
        arena.withUnsafeBytes { UnsafeRawBufferPointer(rebasing: $0[slot * Self.keyBytes ..< (slot + 1) * Self.keyBytes]) }
    }

    private func setSlot(_ slot: Int, _ key: SecureBytes) {
        precondition(key.count == Self.keyBytes)
        arena.withUnsafeMutableBytes { dst in
            key.withUnsafeBytes { src in
                (dst.baseAddress! + slot * Self.keyBytes).copyMemory(from: src.baseAddress!, byteCount: Self.keyBytes)
            }
        }
        available |= Slot.bit(slot)
    }

    private func wipeSlot(_ slot: Int) {
        arena.withUnsafeMutableBytes { dst in
            let p = dst.baseAddress! + slot * Self.keyBytes
            for i in 0..<Self.keyBytes { p.storeBytes(of: 0, toByteOffset: i, as: UInt8.self) }
        }
        available &= ~Slot.bit(slot)
    }

    private func deviceKeyCopy() -> SecureBytes {
        mutex.withLock { SecureBytes(copying: slotBytes(Slot.deviceKey)) }
    }

    private func deviceWrapKey() -> SecureBytes {
        KeyedHash.deriveKey(key: slotBytes(Slot.deviceKey), parts: [Array("coffer device wrap v1".utf8)])
    }

    /// Unwraps every entry with `wrapping` into temporaries first, so a failure changes nothing.
    private func unwrapEntries(wrapping: Wrapping, passcodeKey: SecureBytes?) throws(SecError) {
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

    deinit {
        arena.wipe()
    }
}

/// Key arena layout: slot 0 device key, 1–7 class keys, 9–15 metadata keys, 16 index key.
enum Slot {
    static let deviceKey = 0
    static let indexKey = 16
    static let count = 17
    static func classKey(_ c: ProtectionClass) -> Int { Int(c.rawValue) }
    static func metadataKey(_ c: ProtectionClass) -> Int { 8 + Int(c.rawValue) }
    static func bit(_ slot: Int) -> UInt32 { 1 << UInt32(slot) }
    static func protectionClass(of slot: Int) -> ProtectionClass? {
        ProtectionClass(rawValue: UInt8(slot > 8 ? slot - 8 : slot))
    }
    /// True for the slots that stay under the device key even with a passcode (Always classes, index key).
    static func isDeviceWrappedWithPasscode(_ slot: Int) -> Bool {
        slot == indexKey || protectionClass(of: slot)?.availability == .always
    }
}
