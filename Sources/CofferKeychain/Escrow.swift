public import CofferCrypto
import CofferKeybag
public import CofferModel
import CofferSystem
import Glibc

/// The escrow keybag (the seed's third keybag), for unattended use: a headless server that must reach
/// its items after a reboot with nobody there, or an administrator's recovery.
///
/// `createEscrow()` writes `escrow` (0600) in the state directory: the keys a passcode protects, as
/// they are now, sealed under a key derived from the device key and a fresh 32-byte secret that is
/// returned once and kept nowhere by Coffer. `unlock(escrowSecret:)` opens the keybag with it, on
/// this device only (the device key is part of the key). The record holds one keybag generation: a
/// passcode change or removal makes it stale; revoking deletes it, and the agent then rotates the keys
/// (a passcode change to the same passcode), so even a copy of the record opens nothing.
///
/// Format: "CFES" ‖ u8 version (1) ‖ u64 generation ‖ salt (16) ‖ blob AEAD(escrowKey, payload, ad =
/// the 29 bytes before the blob); escrowKey = BLAKE2b(device key, "coffer escrow v1" ‖ salt ‖ secret);
/// payload = u8 n ‖ n × (u8 slot ‖ 32-byte key).
extension Keychain {
    /// The record's file name in the state directory.
    public static let escrowFileName = "escrow"
    /// Bytes of an escrow secret.
    public static let escrowSecretBytes = 32

    private var escrowPath: String { stateDirectory + "/" + Self.escrowFileName }

    /// True if an escrow record exists.
    public var hasEscrow: Bool { Files.exists(escrowPath) }

    /// Writes a new escrow record (replacing one that exists) and returns its secret, once.
    /// errSecInteractionNotAllowed unless unlocked; errSecNotAvailable without a passcode.
    public func createEscrow() throws(SecError) -> SecureBytes {
        // A record of keys rotated elsewhere would open nothing later: refuse as every write does.
        try keybag.checkUnchanged()
        let (generation, keys) = try keybag.escrowKeys()
        let secret = SecureBytes.random(count: Self.escrowSecretBytes)
        let salt = Random.bytes(16)
        var header = ByteWriter(capacity: 29)
        header.raw(Array("CFES".utf8)); header.u8(1); header.u64(generation); header.raw(salt)
        let payload = SecureBytes(count: 1 + keys.count * (1 + 32))
        unsafe payload.withUnsafeMutableBytes { p in
            unsafe p[0] = UInt8(keys.count)
            var o = 1
            for (slot, key) in keys {
                unsafe p[o] = UInt8(slot)
                unsafe key.withUnsafeBytes { k in unsafe (p.baseAddress! + o + 1).copyMemory(from: k.baseAddress!, byteCount: 32) }
                o += 33
            }
        }
        let key = try escrowKey(secret: secret, salt: salt)
        let sealed = unsafe payload.withUnsafeBytes { pl in unsafe key.withUnsafeBytes { unsafe AEAD.seal(pl, key: $0, ad: header.bytes) } }
        var file = ByteWriter(capacity: 29 + 4 + sealed.count)
        file.raw(header.bytes); file.blob(sealed)
        do { try Files.writeAtomically(escrowPath, file.bytes, mode: 0o600) } catch { throw .io("cannot write the escrow record: \(error)") }
        return secret
    }

    /// Unlocks with an escrow secret. errSecItemNotFound without a record; errSecAuthFailed for a wrong
    /// secret, another device, or a stale record.
    public func unlock(escrowSecret secret: SecureBytes) throws(SecError) {
        let bytes: [UInt8]
        do { bytes = try Files.read(escrowPath, maxBytes: 4096) } catch {
            throw error.errno == ENOENT ? SecError(.itemNotFound, "no escrow record (coffer escrow create)") : .io("cannot read the escrow record: \(error)")
        }
        var r = ByteReader(bytes)
        let generation: UInt64, salt: [UInt8], sealed: ArraySlice<UInt8>
        do throws(DecodeError) {
            guard Array(try r.raw(4, "magic")) == Array("CFES".utf8), try r.u8("version") == 1 else {
                throw DecodeError("not an escrow record of this version")
            }
            generation = try r.u64("generation")
            salt = Array(try r.raw(16, "salt"))
            sealed = try r.blob(max: 4096, "sealed keys")
            try r.expectEnd("escrow record")
        } catch {
            throw .decode("the escrow record is damaged")
        }
        guard secret.count == Self.escrowSecretBytes else { throw .authFailed("an escrow secret is \(Self.escrowSecretBytes) bytes") }
        let key = try escrowKey(secret: secret, salt: salt)
        let payload: SecureBytes
        do {
            payload = try unsafe key.withUnsafeBytes { k throws(CryptoError) in try unsafe AEAD.open(sealed, key: k, ad: Array(bytes[0..<29])) }
        } catch {
            throw .authFailed("wrong escrow secret, or a record of another device")
        }
        var keys: [(slot: Int, key: SecureBytes)] = []
        let ok: Bool = unsafe payload.withUnsafeBytes { p in
            guard p.count >= 1, unsafe p.count == 1 + Int(p[0]) * 33 else { return false }
            for i in unsafe 0..<Int(p[0]) {
                let o = 1 + i * 33
                unsafe keys.append((Int(p[o]), SecureBytes(copying: UnsafeRawBufferPointer(rebasing: p[(o + 1)..<(o + 33)]))))
            }
            return true
        }
        guard ok else { throw .decode("the escrow record's keys are malformed") }
        // Unlocking needs no item work (the keys are the keybag's current ones): the keybag's own lock suffices.
        try keybag.unlock(escrowed: keys, generation: generation)
        try checkRollback()
    }

    /// Deletes the escrow record (the agent then rotates the keys, so a copy of it opens nothing).
    public func deleteEscrow() {
        unsafe unlink(escrowPath)
        try? Files.syncDirectory(of: escrowPath)
    }

    private func escrowKey(secret: SecureBytes, salt: [UInt8]) throws(SecError) -> SecureBytes {
        let label = Array("coffer escrow v1".utf8)
        return try unsafe keybag.withDeviceKey { dk throws(SecError) in
            unsafe label.withUnsafeBytes { l in unsafe salt.withUnsafeBytes { sa in unsafe secret.withUnsafeBytes { se in
                unsafe KeyedHash.deriveKey(key: dk, rawParts: [l, sa, se])
            } } }
        }
    }
}
