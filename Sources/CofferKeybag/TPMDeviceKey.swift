public import CofferCrypto
public import CofferModel
import CofferSystem
import CofferTPM
import Glibc

/// The device key sealed by this machine's TPM 2.0, and the passcode bound to it (issue #28; the
/// design and its MUST rules are in the TPMDeviceKey article of the CofferKeychain catalog).
///
/// `device-key.tpm` in the state directory holds a `noDA` HMAC key only this TPM can load (kind 2,
/// authorized by a random seed kept beside it) and the 32-byte device key sealed (XChaCha20-Poly1305)
/// under that key's HMAC of a fixed label: the device key exists in the clear only in this process's
/// secure memory, and a copy of the state directory on another machine opens nothing.
///
/// The passcode key (``bindsPasscode``) is also tangled with a second, counted HMAC key whose
/// authorization derives from the passcode (kind 1, its blob in the keybag): every guess needs this
/// TPM and a wrong one is counted by its dictionary-attack lockout.
public final class TPMDeviceKey: DeviceKeySource, @unchecked Sendable {
    // @unchecked Sendable: `connection` is reached only inside `lock`.
    /// The file's path.
    public let path: String
    /// The TCTI configuration string (``TPM/defaultTCTI`` by default).
    public let tcti: String
    /// The device key to seal when the file is created (a migration from ``FileDeviceKey`` keeps its
    /// key); nil: a fresh random one.
    private let adopting: SecureBytes?
    /// Keep one connection (and its storage primary) between calls: an unlock then costs no
    /// TPM2_CreatePrimary. For the agent (one source, a resource manager in front of a real TPM);
    /// off by default, so that many sources in one process do not fill a TPM without one (swtpm).
    private let keepsConnection: Bool
    private let lock = PThreadMutex()
    private var connection: TPM?

    /// The kernel's resource manager (``TPM/defaultTCTI``).
    public static let defaultTCTI = TPM.defaultTCTI
    /// The file name in the state directory.
    public static let fileName = "device-key.tpm"
    static let magic = Array("CFTD".utf8) + [1]
    static let sealLabel = Array("coffer tpm device key v1".utf8)

    /// A source reading (or creating) `path` through the TPM at `tcti`. `adopting`: the key a new file
    /// seals (a migration); without it a new file seals a fresh random key.
    public init(path: String, tcti: String = TPMDeviceKey.defaultTCTI, adopting: SecureBytes? = nil, keepsConnection: Bool = false) {
        self.path = path
        self.tcti = tcti
        self.adopting = adopting
        self.keepsConnection = keepsConnection
    }

    public var description: String { "TPM 2.0 at \(tcti) (\(path))" }
    public var kind: DeviceKeyKind { .tpm }

    public func loadDeviceKey() throws(SecError) -> SecureBytes {
        if !Files.exists(path) { try create() }
        let bytes: [UInt8]
        do { bytes = try Files.read(path, maxBytes: 16 << 10) } catch {
            throw .io("cannot read the TPM device key \(path): \(error)")
        }
        let parsed = try Self.decode(bytes, path: path)
        return try withTPM { (tpm) throws(TPMError) -> SecureBytes in
            let key = try TPMHMACKey.load(blob: parsed.blob, on: tpm)
            let wrap = try key.hmac(Self.sealLabel, authorization: parsed.seed, on: tpm)
            do {
                let d = try AEAD.open(parsed.sealed[...], key: wrap, ad: Self.magic)
                guard d.count == FileDeviceKey.keyBytes else { throw TPMError.corruptBlob("the sealed device key has the wrong size") }
                return d
            } catch {
                throw TPMError.corruptBlob("the sealed device key in \(path) failed authentication")
            }
        }
    }

    /// Writes a new file: a fresh `noDA` key, its seed, and the device key sealed under its HMAC.
    private func create() throws(SecError) {
        let seed = SecureBytes.random(count: 32)
        let deviceKey: SecureBytes
        if let adopting { deviceKey = unsafe adopting.withUnsafeBytes { unsafe SecureBytes(copying: $0) } } else {
            deviceKey = .random(count: FileDeviceKey.keyBytes)
        }
        var file: [UInt8] = try withTPM { (tpm) throws(TPMError) -> [UInt8] in
            let key = try TPMHMACKey.create(authorization: seed, countingWrongAuthorizations: false, on: tpm)
            let wrap = try key.hmac(Self.sealLabel, authorization: seed, on: tpm)
            var w = ByteWriter(capacity: 512)
            w.raw(Self.magic)
            w.u32(UInt32(seed.count))
            unsafe seed.withUnsafeBytes { unsafe w.raw($0) } // by pointer; the seed opens nothing without this TPM
            w.blob(key.blob.encoded())
            w.blob(AEAD.seal(deviceKey, key: wrap, ad: Self.magic))
            return w.bytes
        }
        defer { secureZero(&file) }
        do { try Files.writeAtomically(path, file, mode: 0o600) } catch {
            throw .io("cannot write the TPM device key \(path): \(error)")
        }
    }

    /// The file's fields: the seed, the blob (kind 2), the sealed device key.
    static func decode(_ bytes: [UInt8], path: String) throws(SecError) -> (seed: SecureBytes, blob: TPMKeyBlob, sealed: [UInt8]) {
        var r = ByteReader(bytes)
        do {
            guard Array(try r.raw(magic.count, "magic")) == magic else { throw DecodeError("not a Coffer TPM device key (magic or version)") }
            var seed = Array(try r.blob(max: 64, "seed"))
            defer { secureZero(&seed) }
            guard seed.count == 32 else { throw DecodeError("a seed of \(seed.count) bytes") }
            let blob = Array(try r.blob(max: TPMKeyBlob.maxBytes, "key blob"))
            let sealed = Array(try r.blob(max: 256, "sealed key"))
            try r.expectEnd("TPM device key")
            let parsed: TPMKeyBlob
            do { parsed = try TPMKeyBlob.decode(blob, kind: TPMKeyBlob.kindHMACSHA256NoDA) } catch { throw DecodeError("\(error)") }
            return (unsafe seed.withUnsafeBytes { unsafe SecureBytes(copying: $0) }, parsed, sealed)
        } catch {
            throw Self.error(.corruptBlob("\(path): \(error)"), tcti: "")
        }
    }

    // MARK: The passcode bound to the TPM

    public var bindsPasscode: Bool { true }

    /// Closes the kept connection (flushing its storage primary); the next call opens a new one.
    public func release() { lock.withLock { connection = nil } }

    /// A new counted HMAC key authorized by `authorization` (derived from the passcode); its blob.
    public func createPasscodeKey(authorization: SecureBytes) throws(SecError) -> [UInt8] {
        try withTPM { (tpm) throws(TPMError) -> [UInt8] in try TPMHMACKey.create(authorization: authorization, on: tpm).blob.encoded() }
    }

    /// The HMAC of `input` under the counted key `blob`, authorized by `authorization`: a wrong one is
    /// errSecAuthFailed and counted by the TPM.
    public func passcodeHMAC(blob: [UInt8], input: [UInt8], authorization: SecureBytes) throws(SecError) -> SecureBytes {
        let parsed: TPMKeyBlob
        do { parsed = try TPMKeyBlob.decode(blob, kind: TPMKeyBlob.kindHMACSHA256) } catch { throw Self.error(error, tcti: tcti) }
        return try withTPM { (tpm) throws(TPMError) -> SecureBytes in try TPMHMACKey(blob: parsed).hmac(input, authorization: authorization, on: tpm) }
    }

    /// Runs `body` on a connection to this source's TPM, turning a ``TPMError`` into a ``SecError``:
    /// opened for the call and released after it (every transient object flushed: a TPM without a
    /// resource manager, like swtpm, has three slots), or kept (``keepsConnection``) until a failure
    /// other than a wrong authorization drops it, so that a TPM that restarted is reached again.
    private func withTPM<R>(_ body: (TPM) throws(TPMError) -> R) throws(SecError) -> R {
        let result: Result<R, Failure> = lock.withLock {
            var opened: TPM? = nil
            do throws(TPMError) {
                let tpm: TPM
                if let connection { tpm = connection } else { tpm = try TPM(tcti: tcti) }
                opened = tpm
                if keepsConnection { connection = tpm }
                return .success(try body(tpm))
            } catch {
                // At lockout the TPM's own state says how long the person waits.
                var state: TPMLockoutState? = nil
                if case .lockout = error { state = try? opened?.lockoutState() }
                if case .wrongAuthorization = error {} else { connection = nil }
                return .failure(Failure(error: error, lockout: state))
            }
        }
        switch result {
        case .success(let r): return r
        case .failure(let f): throw Self.error(f.error, tcti: tcti, lockout: f.lockout)
        }
    }

    private struct Failure: Error { let error: TPMError; let lockout: TPMLockoutState? }

    /// Coffer expects the TPM to allow at least this many wrong authorizations before its lockout
    /// (`TPM2_PT_MAX_AUTH_FAIL`), so that one person's typos stay under it with Coffer's own schedule.
    public static let expectedMaxTries: UInt32 = 5

    /// The TPM's lockoutAuthSet as last read (nil: not read yet).
    private let lastLockoutAuthorizationSet = Protected<Bool?>(nil)

    /// Whether the TPM's lockout authorization is set (TPMA_PERMANENT.lockoutAuthSet), asked now:
    /// false means that anyone who can send this TPM a command can reset its count of wrong passcodes
    /// (`tpm2_dictionarylockout --clear-lockout`). When the TPM cannot be asked, the value it gave last
    /// (nil if it never answered).
    public func lockoutAuthorizationSet() -> Bool? {
        if let state = try? withTPM({ (tpm) throws(TPMError) -> TPMLockoutState in try tpm.lockoutState() }) {
            lastLockoutAuthorizationSet.withLock { $0 = state.lockoutAuthSet }
            return state.lockoutAuthSet
        }
        return lastLockoutAuthorizationSet.withLock { $0 }
    }

    /// Warnings for the agent's log at start (each once), empty when the TPM's dictionary-attack
    /// setup is what Coffer expects or when the TPM cannot be asked (the unlock then says why): an empty
    /// lockout authorization (anyone can reset the count), fewer than ``expectedMaxTries`` tries, or no
    /// lockout at all.
    public func lockoutWarnings() -> [String] {
        guard let state = try? withTPM({ (tpm) throws(TPMError) -> TPMLockoutState in try tpm.lockoutState() }) else { return [] }
        lastLockoutAuthorizationSet.withLock { $0 = state.lockoutAuthSet }
        var out: [String] = []
        if !state.lockoutAuthSet {
            out.append("the TPM at \(tcti) has an empty lockout authorization (TPMA_PERMANENT.lockoutAuthSet is clear): any local process "
                + "that can reach it can reset its count of wrong passcodes (tpm2_dictionarylockout --clear-lockout), so the bound on "
                + "passcode guesses through this agent is Coffer's own attempts file, and code running as this user (which can delete "
                + "that file, or ask the TPM itself) is bound by neither; an administrator sets a lockout authorization once, as root "
                + "('tpm2_changeauth -c lockout', see docs/tpm.md for what it costs)")
        }
        if state.maxTries == 0 {
            out.append("the TPM at \(tcti) has no dictionary-attack lockout (TPM2_PT_MAX_AUTH_FAIL is 0): wrong passcodes are delayed by "
                + "Coffer's own schedule only; an administrator sets one with 'tpm2_dictionarylockout --setup-parameters --max-tries N'")
        } else if state.maxTries < Self.expectedMaxTries {
            out.append("the TPM at \(tcti) locks out after \(state.maxTries) wrong authorizations (TPM2_PT_MAX_AUTH_FAIL); Coffer expects at "
                + "least \(Self.expectedMaxTries), or a person's typos lock the TPM out for every user of it: an administrator raises it with "
                + "'tpm2_dictionarylockout --setup-parameters --max-tries N'")
        }
        return out
    }

    /// The keychain's error for a TPM failure: what happened, and what the person can do. `lockout`:
    /// the TPM's lockout state, read when it refused at lockout.
    static func error(_ e: TPMError, tcti: String, lockout: TPMLockoutState? = nil) -> SecError {
        switch e {
        case .wrongAuthorization:
            return .authFailed("wrong passcode (the TPM counted the failure toward its dictionary-attack lockout)")
        case .lockout:
            // Not errSecAuthFailed: the passcode may be right, and this is no new failed attempt.
            let wait = lockout.map { s in
                s.recoveryInterval > 0
                    ? " (\(s.failedTries) failures counted, \(s.maxTries) allowed; the TPM forgives one every \(s.recoveryInterval) s of "
                        + "powered-on time: try again in about \(s.recoveryInterval) s)"
                    : " (\(s.failedTries) failures counted, \(s.maxTries) allowed; this TPM forgives none with time: only the administrator can end it)"
            } ?? ""
            return SecError(.notAvailable, "the TPM is locked out after too many wrong passcodes (dictionary-attack protection)\(wait): "
                + "it accepts a passcode again once its lockout interval has forgiven enough failures (tpm2_getcap properties-variable: "
                + "TPM2_PT_LOCKOUT_INTERVAL), or at once when an administrator runs 'tpm2_dictionarylockout --clear-lockout'")
        case .unavailable(let t, let reason):
            return SecError(.notAvailable, "this keychain's device key is in the TPM and no TPM answers at \(t) (\(reason)): nothing was "
                + "changed; make the TPM reachable (or fix 'tpm-tcti' in cofferd.conf) and try again")
        case .foreignBlob(let why):
            // One statement: what happened (the keys are another storage key's), the two ways it comes
            // about, and the one way back (escrow records need this device key, so they are none).
            return SecError(.decode, "this TPM cannot open the keychain, now or later: its TPM keys were made under another storage "
                + "key, so either the TPM was cleared or replaced since (tpm2_clear, a firmware reset, a new motherboard) or the state "
                + "directory was copied from another machine. Move the state directory aside and restore your latest backup ('coffer "
                + "backup restore'; ThisDeviceOnly items are not in backups); escrow records need the device key too, so they cannot "
                + "help (\(why))")
        case .corruptBlob, .unsupportedBlobVersion:
            return SecError(.decode, "the TPM cannot open this keychain's device key: \(e). The key file or the keybag is damaged, or "
                + "was written by another Coffer version: move the state directory aside and restore your latest backup ('coffer backup "
                + "restore'; ThisDeviceOnly items are not in backups). Escrow records need the device key too, so they cannot help")
        case .file(let why): return .io(why)
        case .invalidArgument(let why), .nvIndexConflict(_, let why): return .param(why)
        case .tpmFailure: return SecError(.internalComponent, "the TPM failed: \(e)")
        }
    }
}
