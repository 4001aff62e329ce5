#if os(Linux)
// LocalAuthentication's policies, errors and enumerations, with Apple's names and numbers.
public import Foundation
import CofferModel

/// The error domain of LAError.
public let LAErrorDomain = "com.apple.LocalAuthentication"

/// What an evaluation asks for.
public enum LAPolicy: Int, Sendable {
    /// Biometry only (a finger on the agent's biometric authenticator); asking for the passcode gives userFallback.
    case deviceOwnerAuthenticationWithBiometrics = 1
    /// Biometry, falling back to the passcode (the login password, checked by PAM); or the passcode alone.
    case deviceOwnerAuthentication = 2
    /// A watch: there is none here (canEvaluatePolicy fails with watchNotAvailable).
    case deviceOwnerAuthenticationWithWatch = 3
    /// Biometry or a watch: biometry only here.
    case deviceOwnerAuthenticationWithBiometricsOrWatch = 4

    /// Coffer's policy for this one; nil for the watch.
    var coffer: CofferModel.LAPolicy? {
        switch self {
        case .deviceOwnerAuthenticationWithBiometrics, .deviceOwnerAuthenticationWithBiometricsOrWatch: .deviceOwnerAuthenticationWithBiometrics
        case .deviceOwnerAuthentication: .deviceOwnerAuthentication
        case .deviceOwnerAuthenticationWithWatch: nil
        }
    }
}

/// A failed evaluation, as Apple's LAError: a code, in LAErrorDomain.
public struct LAError: Error, CustomNSError, Hashable, Sendable, CustomStringConvertible {
    /// Apple's error codes (stable numbers).
    public enum Code: Int, Sendable {
        case authenticationFailed = -1
        case userCancel = -2
        case userFallback = -3
        case systemCancel = -4
        case passcodeNotSet = -5
        case biometryNotAvailable = -6
        case biometryNotEnrolled = -7
        case biometryLockout = -8
        case appCancel = -9
        case invalidContext = -10
        case watchNotAvailable = -11
        case biometryNotPaired = -12
        case biometryDisconnected = -13
        case invalidDimensions = -14
        case notInteractive = -1004

        /// Apple's older names.
        public static let touchIDNotAvailable = Code.biometryNotAvailable
        public static let touchIDNotEnrolled = Code.biometryNotEnrolled
        public static let touchIDLockout = Code.biometryLockout
    }

    /// The code.
    public let code: Code
    /// What happened, for people.
    public let message: String

    public init(_ code: Code, message: String = "") {
        self.code = code
        self.message = message
    }

    public static var errorDomain: String { LAErrorDomain }
    public var errorCode: Int { code.rawValue }
    public var errorUserInfo: [String: Any] { message.isEmpty ? [:] : [NSLocalizedDescriptionKey: message] }
    public var description: String { "LAError(\(code.rawValue)): \(message)" }

    // Apple's static members, so that `case LAError.userCancel` patterns read as on Apple platforms.
    public static let authenticationFailed = Code.authenticationFailed
    public static let userCancel = Code.userCancel
    public static let userFallback = Code.userFallback
    public static let systemCancel = Code.systemCancel
    public static let passcodeNotSet = Code.passcodeNotSet
    public static let biometryNotAvailable = Code.biometryNotAvailable
    public static let biometryNotEnrolled = Code.biometryNotEnrolled
    public static let biometryLockout = Code.biometryLockout
    public static let appCancel = Code.appCancel
    public static let invalidContext = Code.invalidContext
    public static let notInteractive = Code.notInteractive


    /// The agent's LocalAuthentication result code as Apple's.
    init(_ c: LAErrorCode, _ message: String) {
        self.init(Code(rawValue: Int(c.rawValue)) ?? .authenticationFailed, message: message)
    }
}

/// Lets `catch LAError.userCancel` match an LAError of that code, as on Apple platforms.
public func ~= (code: LAError.Code, error: any Error) -> Bool { (error as? LAError)?.code == code }

/// The biometry the machine offers.
public enum LABiometryType: Int, Sendable {
    case none = 0
    /// A fingerprint reader (Coffer's biometric authenticator).
    case touchID = 1
    case faceID = 2
    case opticID = 4
}

/// The credentials setCredential takes.
public enum LACredentialType: Int, Sendable {
    /// The application password of items whose access control has .applicationPassword.
    case applicationPassword = 0
}

/// The operations evaluateAccessControl checks an access control for.
public enum LAAccessControlOperation: Int, Sendable {
    case createItem = 0, useItem = 1, createKey = 2, useKeySign = 3, useKeyDecrypt = 4, useKeyKeyExchange = 5
}

/// The state of the enrolled biometry (LAContext.domainState).
public final class LADomainState: @unchecked Sendable {
    // @unchecked Sendable: immutable.
    /// The biometry part.
    public let biometry: LADomainStateBiometry
    /// A hash of the whole state: the biometric domain state here.
    public var stateHash: Data? { biometry.stateHash }
    init(biometry: LADomainStateBiometry) { self.biometry = biometry }
}

/// The enrolled biometry's state.
public final class LADomainStateBiometry: @unchecked Sendable {
    // @unchecked Sendable: immutable.
    public let biometryType: LABiometryType
    /// Changes when a finger is enrolled or removed; nil without biometry.
    public let stateHash: Data?
    init(biometryType: LABiometryType, stateHash: Data?) {
        self.biometryType = biometryType
        self.stateHash = stateHash
    }
}
#endif
