import CTPM
import CofferSystem

/// A connection to a TPM 2.0 through tpm2-tss's ESAPI and a TCTI chosen by its configuration string.
///
/// One ESAPI context, used by one call at a time (a lock serialises them). The storage primary key
/// (``TPMHMACKey/primaryTemplate``) is created on first use and stays loaded until the connection is
/// released, when every transient object this connection loaded is flushed (swtpm and `/dev/tpm0`
/// have no resource manager to do it).
@safe public final class TPM: @unchecked Sendable {
    // @unchecked Sendable: `context` and `primary` are touched only inside `lock`.
    /// The kernel's resource manager, the default TCTI.
    public static let defaultTCTI = "device:/dev/tpmrm0"

    /// The TCTI configuration string this connection was opened with.
    public let tcti: String
    private let lock = PThreadMutex()
    private let context: OpaquePointer
    private var primary: (handle: UInt32, name: [UInt8])?

    /// Opens `tcti` (Tss2_TctiLdr_Initialize: `device:/dev/tpmrm0`, `swtpm:host=127.0.0.1,port=2321`, …).
    /// Throws ``TPMError/unavailable(tcti:reason:)`` when nothing answers there.
    public init(tcti: String = TPM.defaultTCTI) throws(TPMError) {
        self.tcti = tcti
        var ctx: OpaquePointer?
        let rc = unsafe ctpm_open(tcti, &ctx)
        guard rc == 0, let ctx = unsafe ctx else { throw .unavailable(tcti: tcti, reason: TPMResponse(rc).text) }
        unsafe context = ctx
        // A TCTI that opens does not prove a TPM answers (a socket TCTI connects lazily): ask once.
        do { _ = try properties(first: TPMProperty.permanent, count: 1) } catch {
            unsafe ctpm_close(ctx)
            throw error
        }
    }

    deinit {
        if let primary { _ = unsafe ctpm_flush(context, primary.handle) }
        unsafe ctpm_close(context)
    }

    /// The TPM's dictionary-attack state (TPM2_GetCapability of the TPM properties).
    public func lockoutState() throws(TPMError) -> TPMLockoutState {
        let values = try properties(first: TPMProperty.permanent, count: TPMProperty.lockoutRecovery - TPMProperty.permanent + 1)
        func value(_ p: UInt32) throws(TPMError) -> UInt32 {
            guard let v = values[p] else {
                throw .tpmFailure(command: "TPM2_GetCapability", code: 0, text: "the TPM did not report property 0x\(String(p, radix: 16))")
            }
            return v
        }
        let permanent = try value(TPMProperty.permanent)
        return TPMLockoutState(failedTries: try value(TPMProperty.lockoutCounter), maxTries: try value(TPMProperty.maxAuthFail),
                               recoveryInterval: try value(TPMProperty.lockoutInterval),
                               lockoutRecovery: try value(TPMProperty.lockoutRecovery),
                               inLockout: permanent & TPMProperty.inLockoutBit != 0,
                               lockoutAuthSet: permanent & TPMProperty.lockoutAuthSetBit != 0)
    }

    /// TPM properties from `first`, at most `count` of them, by tag.
    func properties(first: UInt32, count: UInt32) throws(TPMError) -> [UInt32: UInt32] {
        var props = [UInt32](repeating: 0, count: Int(count)), values = props
        var got: UInt32 = 0
        let rc = lock.withLock { unsafe ctpm_get_properties(context, first, count, &props, &values, &got) }
        try check(rc, "TPM2_GetCapability")
        var out: [UInt32: UInt32] = [:]
        for i in 0..<Int(got) { out[props[i]] = values[i] }
        return out
    }

    /// Runs `body` with the context under the lock.
    func withContext<R>(_ body: (OpaquePointer) throws(TPMError) -> R) throws(TPMError) -> R {
        try lock.withLock { () throws(TPMError) -> R in try unsafe body(context) }
    }

    /// The storage primary's handle and Name, created from ``TPMHMACKey/primaryTemplate`` on first use. Call under the lock.
    func primaryKey(_ ctx: OpaquePointer) throws(TPMError) -> (handle: UInt32, name: [UInt8]) {
        if let primary { return primary }
        var handle: UInt32 = 0
        var name = [UInt8](repeating: 0, count: 128)
        var nameLength = name.count
        let template = TPMHMACKey.primaryTemplate
        let rc = unsafe ctpm_create_primary(ctx, ctpm_owner_hierarchy(), template, template.count, &handle, &name, &nameLength)
        try check(rc, "TPM2_CreatePrimary")
        name.removeSubrange(nameLength...)
        primary = (handle, name)
        return (handle, name)
    }

    /// Throws the ``TPMError`` for `rc` unless it is success.
    func check(_ rc: UInt32, _ command: String) throws(TPMError) {
        guard rc != 0 else { return }
        throw TPMResponse(rc).error(command: command, tcti: tcti)
    }
}

/// The TPM's dictionary-attack state, for status output.
public struct TPMLockoutState: Equatable, Sendable {
    /// TPM2_PT_LOCKOUT_COUNTER: authorization failures counted now.
    public let failedTries: UInt32
    /// TPM2_PT_MAX_AUTH_FAIL: failures at which the TPM locks out.
    public let maxTries: UInt32
    /// TPM2_PT_LOCKOUT_INTERVAL: seconds after which one failure is forgotten (0: never decays).
    public let recoveryInterval: UInt32
    /// TPM2_PT_LOCKOUT_RECOVERY: seconds after a failed lockoutAuth before lockoutAuth may be tried again.
    public let lockoutRecovery: UInt32
    /// TPMA_PERMANENT's inLockout bit: DA-protected objects are refused now.
    public let inLockout: Bool
    /// TPMA_PERMANENT's lockoutAuthSet bit: the lockout hierarchy has an authorization value. When it
    /// is clear (the default: most machines never set one), anyone who can send the TPM a command can
    /// reset ``failedTries`` (TPM2_DictionaryAttackLockReset, `tpm2_dictionarylockout --clear-lockout`),
    /// so the count binds nobody who can reach the TPM.
    public let lockoutAuthSet: Bool

    /// Makes a state from the TPM's properties.
    public init(failedTries: UInt32, maxTries: UInt32, recoveryInterval: UInt32, lockoutRecovery: UInt32, inLockout: Bool,
                lockoutAuthSet: Bool) {
        self.failedTries = failedTries
        self.maxTries = maxTries
        self.recoveryInterval = recoveryInterval
        self.lockoutRecovery = lockoutRecovery
        self.inLockout = inLockout
        self.lockoutAuthSet = lockoutAuthSet
    }
}

/// TPM property tags (TPM 2.0 Part 2, TPM_PT).
enum TPMProperty {
    /// TPM2_PT_PERMANENT (PT_VAR + 0): TPMA_PERMANENT.
    static let permanent: UInt32 = 0x200
    /// TPM2_PT_LOCKOUT_COUNTER (PT_VAR + 14).
    static let lockoutCounter: UInt32 = 0x20E
    /// TPM2_PT_MAX_AUTH_FAIL (PT_VAR + 15).
    static let maxAuthFail: UInt32 = 0x20F
    /// TPM2_PT_LOCKOUT_INTERVAL (PT_VAR + 16).
    static let lockoutInterval: UInt32 = 0x210
    /// TPM2_PT_LOCKOUT_RECOVERY (PT_VAR + 17).
    static let lockoutRecovery: UInt32 = 0x211
    /// TPMA_PERMANENT.inLockout (bit 9).
    static let inLockoutBit: UInt32 = 1 << 9
    /// TPMA_PERMANENT.lockoutAuthSet (bit 2; bit 0 is ownerAuthSet, bit 1 endorsementAuthSet): set by
    /// TPM2_HierarchyChangeAuth of TPM_RH_LOCKOUT to a non-empty value, cleared by TPM2_Clear.
    static let lockoutAuthSetBit: UInt32 = 1 << 2
}

/// A TSS2_RC: its layer and, for the TPM's own codes, the code without parameter, handle or session numbers.
struct TPMResponse: Equatable {
    let raw: UInt32
    init(_ raw: UInt32) { self.raw = raw }

    /// The TSS layer (bits 16–23, TSS2_*_RC_LAYER): 0 the TPM, 7 ESAPI, 9 tss2-mu, 10 a TCTI, 12 a TPM code relayed by a resource manager.
    var layer: UInt32 { (raw >> 16) & 0xFF }
    /// The TPM's code: format-one codes without the P and N fields (TPM_RC_FMT1 + error number), format-zero codes as they are.
    var tpmCode: UInt32? {
        guard layer == 0 || layer == 12 else { return nil }
        return raw & 0x80 != 0 ? raw & 0xBF : raw & 0xFFF
    }
    /// tss2-rc's text for the code.
    var text: String { unsafe String(cString: ctpm_rc_text(raw)) }

    /// TPM_RC_AUTH_FAIL (FMT1 + 0x00E), TPM_RC_BAD_AUTH (FMT1 + 0x022), TPM_RC_LOCKOUT (RC_WARN + 0x021),
    /// TPM_RC_HANDLE (FMT1 + 0x00B), TPM_RC_INTEGRITY (FMT1 + 0x01F), TPM_RC_NV_DEFINED (RC_VER1 + 0x04C).
    static let authFail: UInt32 = 0x08E, badAuth: UInt32 = 0x0A2, lockout: UInt32 = 0x921, handle: UInt32 = 0x08B,
               integrity: UInt32 = 0x09F, nvDefined: UInt32 = 0x14C

    func error(command: String, tcti: String) -> TPMError {
        switch tpmCode {
        case Self.authFail, Self.badAuth: return .wrongAuthorization
        case Self.lockout: return .lockout
        default: break
        }
        // The TCTI layer (10): the TPM went away or never answered.
        if layer == 10 { return .unavailable(tcti: tcti, reason: "\(command): \(text)") }
        return .tpmFailure(command: command, code: raw, text: text)
    }
}
