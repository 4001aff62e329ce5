import CofferCrypto
import CofferModel
import CofferSystem
import Glibc

/// What a wrapped key is wrapped under.
enum Wrapping: UInt8 {
    /// A key derived from the device key alone.
    case device = 1
    /// The passcode key.
    case passcode = 2
}

/// One wrapped key: AEAD(wrapKey, key, ad = "coffer class key v1" ‖ slot ‖ wrapping).
struct WrappedEntry: Equatable {
    var wrapping: Wrapping
    var sealed: [UInt8]

    static func ad(slot: Int, wrapping: Wrapping) -> [UInt8] {
        Array("coffer class key v1".utf8) + [UInt8(slot), wrapping.rawValue]
    }

    static func seal(_ key: SecureBytes, slot: Int, wrapping: Wrapping, key wrapKey: SecureBytes) -> WrappedEntry {
        WrappedEntry(wrapping: wrapping, sealed: AEAD.seal(key, key: wrapKey, ad: ad(slot: slot, wrapping: wrapping)))
    }

    func open(slot: Int, key wrapKey: SecureBytes) throws(SecError) -> SecureBytes {
        do {
            let k = try AEAD.open(sealed[...], key: wrapKey, ad: Self.ad(slot: slot, wrapping: wrapping))
            guard k.count == Keybag.keyBytes else { throw SecError.decode("keybag entry \(slot) has the wrong size") }
            return k
        } catch let e as SecError {
            throw e
        } catch {
            throw .decode("keybag entry \(slot) failed authentication")
        }
    }
}

/// The keybag's file names in its directory.
struct KeybagPaths {
    let keybag: String
    let next: String
    let key: String

    init(directory: String) {
        keybag = directory + "/keybag"
        next = directory + "/keybag.next"
        key = directory + "/keybag.key"
    }
}

/// The keybag file's contents and its sealed encoding.
///
/// `keybag`: "CFKB" ‖ u8 version ‖ AEAD(fileKey, body, ad = those 5 bytes), where
/// fileKey = BLAKE2b(key: device key, "coffer keybag file v1" ‖ keybag key) and
/// - version 1 body = u64 generation ‖ u8 passcodeSet ‖ [salt(16) ‖ u64 opsLimit ‖ u64 memLimit] ‖ u8 n ‖ n × (u8 slot ‖ u8 wrapping ‖ blob sealed)
/// - version 2 body = u64 generation ‖ u8 flags (bit 0 passcode set, bit 1 rekey pending) ‖ [salt ‖ opsLimit ‖ memLimit]
///   ‖ u8 n ‖ n × (u8 slot ‖ u8 wrapping ‖ blob sealed), where a slot with bit 7 set is a *previous*
///   key (rotated out by a rekey that has not finished re-sealing the items; only with the pending flag).
///
/// - version 3 body (a keybag of a TPM device key, issue #28) = version 2's, the passcode part followed by
///   blob tpmPasscodeKey (the counted TPM key's blob, see ``TPMDeviceKey``).
///
/// Version 2 adds slot 17 (the passcode-tier index key) and the rekey state; every slot's wrapping is
/// fixed by the passcode state (``Slot/expectedWrapping(_:passcodeSet:)``) and checked on load.
/// Version 3 is written exactly when the device key is the TPM's; a file device key keeps writing 2.
///
/// `keybag.key`: "CFKK" ‖ u8 version (1) ‖ u64 generation ‖ 32-byte keybag key.
///
/// Replacement is crash-safe: the new keybag goes to `keybag.next`, then the new key file replaces
/// `keybag.key` (the commit point), then `keybag.next` is renamed over `keybag`. Loading finishes an
/// interrupted rename.
struct KeybagFile {
    struct Passcode: Equatable {
        var salt: [UInt8]
        var parameters: KDFParameters
        /// The blob of the TPM key the passcode authorizes (format 3 only).
        var tpmKey: [UInt8]? = nil
    }

    /// The format this keybag was read in (1: written by Coffer before the rekey mechanism; needs migrating).
    var version: UInt8 = currentVersion
    var generation: UInt64
    var passcode: Passcode?
    var entries: [Int: WrappedEntry]
    /// Keys rotated out by a rekey whose items are not all re-sealed yet (only with `rekeyPending`).
    var previous: [Int: WrappedEntry] = [:]
    /// A rekey committed its new keys but has not confirmed that every item was re-sealed.
    var rekeyPending = false

    var passcodeSet: Bool { passcode != nil }

    /// True for a keybag of a TPM device key (format 3).
    var tpmDeviceKey: Bool { version == Self.tpmVersion }

    /// The format a file device key's keybag is written in.
    static let currentVersion: UInt8 = 2
    /// The format a TPM device key's keybag is written in.
    static let tpmVersion: UInt8 = 3
    /// The format written for a device key of `kind`.
    static func version(for kind: DeviceKeyKind) -> UInt8 { kind == .tpm ? tpmVersion : currentVersion }
    static func magic(_ version: UInt8) -> [UInt8] { Array("CFKB".utf8) + [version] }
    static let keyMagic = Array("CFKK".utf8) + [1]
    static let keyFileBytes = keyMagic.count + 8 + Keybag.keyBytes
    /// Bit 7 of an encoded slot number marks a previous (rotated-out) key.
    static let previousFlag = 0x80

    /// A new keybag with fresh random keys, no passcode, everything under the device key.
    static func generate(deviceKey: SecureBytes, kind: DeviceKeyKind) -> (file: KeybagFile, keybagKey: SecureBytes) {
        let dwk = unsafe deviceKey.withUnsafeBytes { unsafe Slot.deviceWrapKey($0) }
        var entries: [Int: WrappedEntry] = [:]
        for slot in Slot.required(passcodeSet: false) {
            entries[slot] = .seal(.random(count: Keybag.keyBytes), slot: slot, wrapping: .device, key: dwk)
        }
        // A random first generation (not 1): records bound to a generation (an escrow) of an erased
        // keybag never match a new one's by coincidence of counting.
        return (KeybagFile(version: version(for: kind), generation: UInt64.random(in: 1...(1 << 62)), passcode: nil, entries: entries),
                .random(count: Keybag.keyBytes))
    }

    // MARK: Encoding

    /// The version-2 or version-3 body (``version``; this code never writes version 1).
    func encodeBody() -> [UInt8] {
        precondition(version >= Self.currentVersion && (passcode?.tpmKey != nil) == (tpmDeviceKey && passcode != nil))
        var w = ByteWriter(capacity: 2048)
        w.u64(generation)
        w.u8((passcode == nil ? 0 : 1) | (rekeyPending ? 2 : 0))
        if let p = passcode {
            w.raw(p.salt)
            w.u64(p.parameters.opsLimit)
            w.u64(p.parameters.memLimit)
            if let blob = p.tpmKey { w.blob(blob) }
        }
        w.u8(UInt8(entries.count + previous.count))
        for slot in entries.keys.sorted() {
            w.u8(UInt8(slot))
            w.u8(entries[slot]!.wrapping.rawValue)
            w.blob(entries[slot]!.sealed)
        }
        for slot in previous.keys.sorted() {
            w.u8(UInt8(slot | Self.previousFlag))
            w.u8(previous[slot]!.wrapping.rawValue)
            w.blob(previous[slot]!.sealed)
        }
        return w.bytes
    }

    static func decodeBody(_ body: SecureBytes, version: UInt8) throws(DecodeError) -> KeybagFile {
        var bytes = unsafe body.withUnsafeBytes { unsafe Array($0) } // wrapped keys only: no plaintext key material
        defer { secureZero(&bytes) }
        var r = ByteReader(bytes)
        let generation = try r.u64("generation")
        let flags = try r.u8("flags")
        guard flags <= (version == 1 ? 1 : 3) else { throw DecodeError("bad flags") }
        var passcode: Passcode? = nil
        if flags & 1 != 0 {
            let salt = Array(try r.raw(Argon2id.saltBytes, "salt"))
            let ops = try r.u64("opsLimit")
            let mem = try r.u64("memLimit")
            guard ops >= 1, ops <= 1 << 20, mem >= KDFParameters.floorMemory, mem <= 1 << 40 else {
                throw DecodeError("Argon2id parameters out of range")
            }
            let tpmKey = version == tpmVersion ? Array(try r.blob(max: 4096, "TPM passcode key")) : nil
            passcode = Passcode(salt: salt, parameters: KDFParameters(opsLimit: ops, memLimit: mem), tpmKey: tpmKey)
        }
        let pending = flags & 2 != 0
        let n = Int(try r.u8("entry count"))
        var entries: [Int: WrappedEntry] = [:]
        var previous: [Int: WrappedEntry] = [:]
        for _ in 0..<n {
            let raw = Int(try r.u8("slot"))
            let isPrevious = raw & previousFlag != 0
            let slot = raw & ~previousFlag
            let maxSlot = version == 1 ? Slot.indexKey : Slot.passcodeIndexKey
            guard slot > 0, slot <= maxSlot, slot != 8, (isPrevious ? previous[slot] : entries[slot]) == nil else {
                throw DecodeError("bad or repeated slot \(slot)")
            }
            guard !isPrevious || (pending && Slot.isRotated(slot)) else { throw DecodeError("unexpected previous key in slot \(slot)") }
            guard let wrapping = Wrapping(rawValue: try r.u8("wrapping")) else { throw DecodeError("bad wrapping") }
            // With a passcode, every key of a non-Always class and the passcode-tier index key must be
            // passcode-wrapped: a slot marked device-wrapped would hand those keys to anyone with the device key.
            guard wrapping == Slot.expectedWrapping(slot, passcodeSet: passcode != nil) else {
                throw DecodeError("slot \(slot) has the wrong wrapping for this passcode state")
            }
            let sealed = Array(try r.blob(max: 256, "wrapped key"))
            if isPrevious { previous[slot] = WrappedEntry(wrapping: wrapping, sealed: sealed) } else { entries[slot] = WrappedEntry(wrapping: wrapping, sealed: sealed) }
        }
        try r.expectEnd("keybag body")
        guard entries[Slot.indexKey] != nil else { throw DecodeError("index key missing") }
        if version >= 2 {
            guard Set(entries.keys) == Set(Slot.required(passcodeSet: passcode != nil)) else {
                throw DecodeError("the keybag does not hold exactly the keys its passcode state needs")
            }
        }
        return KeybagFile(version: version, generation: generation, passcode: passcode, entries: entries,
                          previous: previous, rekeyPending: pending)
    }

    static func fileKey(deviceKey: SecureBytes, keybagKey: UnsafeRawBufferPointer) -> SecureBytes {
        unsafe deviceKey.withUnsafeBytes { dk in
            // By pointer: the keybag key never leaves secure memory.
            unsafe fileKeyLabel.withUnsafeBytes { l in unsafe KeyedHash.deriveKey(key: dk, rawParts: [l, keybagKey]) }
        }
    }
    private static let fileKeyLabel = Array("coffer keybag file v1".utf8)

    // MARK: Files

    /// Writes this keybag under a new keybag key, crash-safely (see the type's documentation).
    /// `crashPoint` names the test crash point between writing `keybag.next` and the commit.
    func save(_ paths: KeybagPaths, keybagKey: SecureBytes, deviceKey: SecureBytes, crashPoint: String = "") throws(SecError) {
        let fk = unsafe keybagKey.withUnsafeBytes { unsafe Self.fileKey(deviceKey: deviceKey, keybagKey: $0) }
        var body = encodeBody()
        let magic = Self.magic(version)
        let sealed = unsafe body.withUnsafeBytes { b in unsafe fk.withUnsafeBytes { k in unsafe AEAD.seal(b, key: k, ad: magic) } }
        secureZero(&body)
        let keyFile = SecureBytes(count: Self.keyFileBytes)
        unsafe keyFile.withUnsafeMutableBytes { out in
            var w = ByteWriter()
            w.raw(Self.keyMagic)
            w.u64(generation)
            unsafe out.copyBytes(from: w.bytes)
            unsafe keybagKey.withUnsafeBytes { k in unsafe (out.baseAddress! + w.bytes.count).copyMemory(from: k.baseAddress!, byteCount: k.count) }
        }
        do {
            try Files.writeAtomically(paths.next, magic + sealed)
            CrashPoint.hit(crashPoint)
            unsafe try keyFile.withUnsafeBytes { b in Result { () throws(SystemError) in unsafe try Files.writeAtomically(paths.key, bytes: b) } }.get()
            try Files.renameDurably(paths.next, paths.keybag)
        } catch {
            throw .io("cannot write the keybag: \(error)")
        }
    }

    /// Loads the keybag, finishing an interrupted replacement; nil if there is no keybag yet.
    static func load(_ paths: KeybagPaths, deviceKey: SecureBytes) throws(SecError) -> KeybagFile? {
        guard Files.exists(paths.key) else {
            if Files.exists(paths.keybag) {
                throw .decode("the keybag key file \(paths.key) is missing; the keybag cannot be opened")
            }
            unsafe unlink(paths.next) // a first save that never committed
            return nil
        }
        let keyFile = SecureBytes(count: keyFileBytes)
        do {
            unsafe try keyFile.withUnsafeMutableBytes { b throws(SystemError) in unsafe try Files.readExactly(paths.key, into: b) }
        } catch {
            throw .decode("the keybag key file \(paths.key) is unreadable or has the wrong size")
        }
        let (generation, fk): (UInt64, SecureBytes) = unsafe keyFile.withUnsafeBytes { b in
            var r = unsafe ByteReader(Array(b.prefix(keyMagic.count + 8)))
            _ = try? r.raw(keyMagic.count)
            let gen = (try? r.u64()) ?? 0
            let key = unsafe UnsafeRawBufferPointer(rebasing: b[(keyMagic.count + 8)...])
            return unsafe (gen, fileKey(deviceKey: deviceKey, keybagKey: key))
        }
        let magicOK = unsafe keyFile.withUnsafeBytes { unsafe Array($0.prefix(keyMagic.count)) == keyMagic }
        guard magicOK else { throw .decode("the keybag key file \(paths.key) is not a Coffer keybag key") }

        // The committed keybag is either `keybag` or, after an interrupted rename, `keybag.next`.
        for candidate in [paths.keybag, paths.next] where Files.exists(candidate) {
            guard let file = try? open(candidate, fileKey: fk), file.generation == generation else { continue }
            if candidate == paths.next {
                do { try Files.renameDurably(paths.next, paths.keybag) } catch { throw .io("cannot finish keybag update: \(error)") }
            } else {
                unsafe unlink(paths.next) // an uncommitted replacement
            }
            return file
        }
        throw .decode("the keybag \(paths.keybag) is corrupt or does not match its key file (failed authentication)")
    }

    private static func open(_ path: String, fileKey: SecureBytes) throws -> KeybagFile {
        let bytes = try Files.read(path, maxBytes: 64 * 1024)
        guard bytes.count > 5, Array(bytes.prefix(4)) == Array("CFKB".utf8) else { throw DecodeError("bad magic") }
        let version = bytes[4]
        guard version >= 1 && version <= tpmVersion else { throw DecodeError("unknown keybag version \(version)") }
        let body = try AEAD.open(bytes[5...], key: fileKey, ad: magic(version))
        return try decodeBody(body, version: version)
    }
}
