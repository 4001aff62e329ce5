#if os(Linux)
// The result codes of the Security functions: Apple's numbers (stable; the agent's wire carries the same ones).
public import Foundation
import CofferModel

/// No error.
public let errSecSuccess: OSStatus = 0
/// A function or an option this implementation does not provide (identities, RSA key generation, an
/// unsupported algorithm).
public let errSecUnimplemented: OSStatus = -4
/// An I/O error talking to the agent.
public let errSecIO: OSStatus = -36
/// A parameter is wrong: an unknown attribute, a value of the wrong type, a missing class.
public let errSecParam: OSStatus = -50
/// Memory could not be allocated.
public let errSecAllocate: OSStatus = -108
/// The person cancelled the authentication.
public let errSecUserCanceled: OSStatus = -128
/// A bad request.
public let errSecBadReq: OSStatus = -909
/// An internal error (an unexpected reply from the agent).
public let errSecInternalComponent: OSStatus = -2070
/// No keychain is available: no agent is running (a log line on stderr says how to start it), or the item
/// is one this machine cannot open.
public let errSecNotAvailable: OSStatus = -25291
/// The keychain is read-only.
public let errSecReadOnly: OSStatus = -25292
/// The authentication failed (a wrong passcode or application password, a changed biometric set).
public let errSecAuthFailed: OSStatus = -25293
/// The item already exists.
public let errSecDuplicateItem: OSStatus = -25299
/// No item matches.
public let errSecItemNotFound: OSStatus = -25300
/// The person would have to be asked and may not be (kSecUseAuthenticationUIFail, an LAContext with
/// interactionNotAllowed, no terminal or pinentry), or the keychain is locked.
public let errSecInteractionNotAllowed: OSStatus = -25308
/// An internal error of the Security functions (Apple's code; SecCertificateCopyCommonName without a common name).
public let errSecInternal: OSStatus = -26276
/// Data could not be decoded (a malformed key representation).
public let errSecDecode: OSStatus = -26275
/// The program is not entitled to the access group it named (its signed manifest does not grant it).
public let errSecMissingEntitlement: OSStatus = -34018
/// Data is not in the encoding expected (Apple's code; wrappers check for it).
public let errSecInvalidEncoding: OSStatus = -67853
/// A key reference is not valid for the operation.
public let errSecInvalidKeyRef: OSStatus = -67712
/// A signature did not verify.
public let errSecVerifyFailed: OSStatus = -67808

/// What `status` means, as a sentence (Apple's wording where it applies to Coffer); nil for a code this
/// implementation never returns. `reserved` must be nil, as on Apple platforms.
public func SecCopyErrorMessageString(_ status: OSStatus, _ reserved: UnsafeMutableRawPointer?) -> CFString? {
    SecurityErrors.message(status).map { $0 as CFString }
}

/// The codes' sentences and the conversion of the agent's errors.
enum SecurityErrors {
    static func message(_ status: OSStatus) -> String? {
        switch status {
        case errSecSuccess: "No error."
        case errSecUnimplemented: "Function or operation not implemented."
        case errSecIO: "I/O error."
        case errSecParam: "One or more parameters passed to a function were not valid."
        case errSecAllocate: "Failed to allocate memory."
        case errSecUserCanceled: "User canceled the operation."
        case errSecBadReq: "Bad parameter or invalid state for operation."
        case errSecInternalComponent: "An internal component failed."
        case errSecNotAvailable: "No keychain is available: the Coffer agent is not running (start it with cofferd)."
        case errSecReadOnly: "This keychain cannot be modified."
        case errSecAuthFailed: "The user name or passphrase you entered is not correct."
        case errSecDuplicateItem: "The specified item already exists in the keychain."
        case errSecItemNotFound: "The specified item could not be found in the keychain."
        case errSecInteractionNotAllowed: "User interaction is not allowed."
        case errSecInternal: "An internal error occurred in the Security framework."
        case errSecDecode: "Unable to decode the provided data."
        case errSecMissingEntitlement: "A required entitlement isn't present."
        case errSecInvalidEncoding: "The encoding is not valid."
        case errSecInvalidKeyRef: "A key reference is not valid."
        case errSecVerifyFailed: "A cryptographic verification failure has occurred."
        default: nil
        }
    }

    /// The error a CFError out-parameter gets: NSOSStatusErrorDomain with the code, as on Apple platforms;
    /// `underlying` goes under NSUnderlyingErrorKey (an LAError's domain and code).
    static func cfError(_ status: OSStatus, _ detail: String? = nil, underlying: (domain: String, code: Int)? = nil) -> CFError {
        var info: [String: Any] = [:]
        if let m = detail ?? message(status) { info[NSLocalizedDescriptionKey] = m }
        if let u = underlying { info[NSUnderlyingErrorKey] = NSError(domain: u.domain, code: u.code, userInfo: [:]) }
        return NSError(domain: "NSOSStatusErrorDomain", code: Int(status), userInfo: info)
    }

    /// Stores `error` in a CFError out-parameter (retained, as Apple's Create rule has it).
    static func store(_ status: OSStatus, _ detail: String?, in out: UnsafeMutablePointer<Unmanaged<CFError>?>?) {
        out?.pointee = Unmanaged.passRetained(cfError(status, detail))
    }

    /// Stores `failure` in a CFError out-parameter.
    static func store(_ failure: SecFailure, in out: UnsafeMutablePointer<Unmanaged<CFError>?>?) {
        out?.pointee = Unmanaged.passRetained(cfError(failure.status, failure.detail, underlying: failure.underlying))
    }
}

/// A failed call: the status to return (the agent's SecError carries Apple's number already).
package struct SecFailure: Error {
    package let status: OSStatus
    package let detail: String
    /// The error beneath (a CFError's NSUnderlyingErrorKey): an invalidated LAContext's LAError.
    package let underlying: (domain: String, code: Int)?
    package init(_ status: OSStatus, _ detail: String, underlying: (domain: String, code: Int)? = nil) {
        self.status = status
        self.detail = detail
        self.underlying = underlying
    }
    init(_ e: SecError) { self.init(e.status.rawValue, e.message) }
    static func param(_ detail: String) -> SecFailure { SecFailure(errSecParam, detail) }
    static func unimplemented(_ detail: String) -> SecFailure { SecFailure(errSecUnimplemented, detail) }
}
#endif
