/// Why a TPM operation failed, in terms the keybag can act on. Each case has a stable OSStatus
/// (``osStatus``, one of `CofferModel.SecStatus`'s numbers, which the keybag turns into a `SecError`);
/// descriptions name commands, indices, files and the TPM's decoded response codes, never an
/// authorization value, a passcode or an HMAC.
public enum TPMError: Error, Equatable, Sendable, CustomStringConvertible {
    /// No TPM answers: the TCTI could not be loaded or opened (no `/dev/tpmrm0`, no permission on it,
    /// no swtpm listening, tpm2-tss's TCTI library missing), or the connection broke mid-command.
    case unavailable(tcti: String, reason: String)
    /// The TPM refused the key's authorization (TPM_RC_AUTH_FAIL, or TPM_RC_BAD_AUTH): a wrong
    /// passcode. For a key without `noDA`, the TPM counted it in its dictionary-attack counter.
    case wrongAuthorization
    /// The TPM is in dictionary-attack lockout (TPM_RC_LOCKOUT): it refuses every authorization of a
    /// DA-protected object, right or wrong, until its counter has decayed below the limit
    /// (one failure forgiven every `TPM2_PT_LOCKOUT_INTERVAL` seconds) or an administrator resets it.
    case lockout
    /// A key blob file that does not parse: wrong magic, truncated, trailing bytes, a public part
    /// that is not the HMAC key Coffer creates, or a private part the TPM finds altered.
    case corruptBlob(String)
    /// A key blob of a version this build does not read.
    case unsupportedBlobVersion(UInt16)
    /// A key blob made under another storage key: another TPM, or this TPM after its owner
    /// hierarchy was cleared (TPM2_Clear). Nothing can load it here.
    case foreignBlob(String)
    /// An NV index already defined with attributes, size or name algorithm other than a Coffer counter's.
    case nvIndexConflict(index: UInt32, reason: String)
    /// An argument out of range (an authorization seed of the wrong size, an input too long, an NV
    /// index outside the NV handle range).
    case invalidArgument(String)
    /// A key blob file could not be read or written (the system error, with its path).
    case file(String)
    /// Any other refusal by the TPM or the TSS: the command, the TSS2_RC and tss2-rc's text for it.
    case tpmFailure(command: String, code: UInt32, text: String)

    /// The stable OSStatus for this failure (values of `SecStatus`, never renumbered):
    /// errSecNotAvailable (-25291) when no TPM answers, errSecAuthFailed (-25293) for a wrong
    /// authorization and for lockout (like Coffer's own attempt schedule), errSecDecode (-26275) for
    /// a corrupt, foreign or unknown-version blob, errSecParam (-50) for a bad argument or a
    /// conflicting NV index, errSecIO (-36) for a file error, errSecInternalComponent (-2070) for any
    /// other TPM failure.
    public var osStatus: Int32 {
        switch self {
        case .unavailable: -25291
        case .wrongAuthorization, .lockout: -25293
        case .corruptBlob, .unsupportedBlobVersion, .foreignBlob: -26275
        case .nvIndexConflict, .invalidArgument: -50
        case .file: -36
        case .tpmFailure: -2070
        }
    }

    public var description: String {
        switch self {
        case .unavailable(let tcti, let reason): "no TPM answers at \(tcti): \(reason)"
        case .wrongAuthorization: "the TPM refused the authorization (wrong passcode); the TPM counted the failure"
        case .lockout:
            "the TPM is locked out after too many wrong passcodes (dictionary-attack protection): it allows another attempt "
                + "when its lockout interval has passed, or when an administrator resets it (tpm2_dictionarylockout --clear-lockout)"
        case .corruptBlob(let why): "the TPM key blob is corrupt: \(why)"
        case .unsupportedBlobVersion(let v): "the TPM key blob has version \(v), which this Coffer does not read (it reads version \(TPMKeyBlob.version))"
        case .foreignBlob(let why):
            "the TPM key blob was made under another storage key, by another TPM or by this TPM before its owner hierarchy "
                + "was cleared (\(why))"
        case .nvIndexConflict(let index, let reason): "NV index \(TPMNVCounter.hex(index)) is in use with other attributes: \(reason)"
        case .invalidArgument(let why): "invalid argument: \(why)"
        case .file(let why): why
        case .tpmFailure(let command, let code, let text): "\(command) failed: TPM response 0x\(String(code, radix: 16)) (\(text))"
        }
    }
}
