public import CofferCrypto

/// Ways a person can authenticate when an item's access control or a LocalAuthentication
/// evaluation needs it.
public struct AuthenticationMethods: OptionSet, Sendable, Hashable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    /// The user's passcode (the login password, checked by PAM).
    public static let passcode = AuthenticationMethods(rawValue: 1)
    /// A biometric match (the agent's biometric authenticator: a finger on the sensor).
    public static let biometry = AuthenticationMethods(rawValue: 2)
    /// An application password (the item's extra key).
    public static let applicationPassword = AuthenticationMethods(rawValue: 4)
    /// Every defined bit.
    public static let all: AuthenticationMethods = [.passcode, .biometry, .applicationPassword]
}

/// What the agent asks the client for when a request needs a person (AUTH_NEEDED): the methods
/// that would do, and a prompt naming the calling app and the operation, for the client to show.
public struct AuthenticationRequest: Sendable, Equatable {
    /// What would satisfy the request (any one of them, unless the rule needs several: then the agent
    /// asks again for the next).
    public var methods: AuthenticationMethods
    /// The calling app as the agent identified it (app id, Flatpak id, or executable).
    public var app: String
    /// What to show: the agent's sentence (`APP wants to read the secret of ITEM`) and the client's
    /// operation prompt, if it gave one.
    public var prompt: String
    /// How the agent established who the app is ("signed app", "Flatpak app", "unsigned program
    /// PATH: why"), for the agent's own dialogs; nil where not known (a client's copy of the request:
    /// not on the wire).
    public var identity: String?

    public init(methods: AuthenticationMethods, app: String, prompt: String, identity: String? = nil) {
        self.methods = methods
        self.app = app
        self.prompt = prompt
        self.identity = identity
    }
}

/// What an AUTH_FEEDBACK means for the conversation (sent with protocol version 2 and later, as
/// AUTH_FEEDBACK_KIND; WireProtocol.md, Authentication): whether the agent now waits for another
/// AUTH_RESPONSE, without the client reading the text it must not parse.
public enum AuthFeedbackKind: UInt8, Sendable, Equatable {
    /// For the person only (the sensor's own message): nothing changed, no answer is due.
    case notice = 0
    /// The passcode answered was wrong: the agent waits for another AUTH_RESPONSE.
    case wrongPasscode = 1
    /// A finger did not match: the sensor waits for another touch; no answer is due (a passcode
    /// prompt, if the methods offered one, stays open).
    case noMatch = 2
    /// Biometry is out for this request (locked out, the sensor unavailable, or it ended the
    /// evaluation itself): only a passcode (or a cancel) can answer now.
    case passcodeOnly = 3
}

/// The client's answer to an ``AuthenticationRequest`` (AUTH_RESPONSE).
public enum AuthenticationAnswer: Sendable {
    /// The person cancelled (errSecUserCanceled / LAError.userCancel).
    case cancel
    /// The passcode the person typed.
    case passcode(SecureBytes)
    /// No typed credential: the client waits for the biometric sensor (the agent is already asking it).
    case waitForBiometry
    /// The person asked for the passcode instead of biometry (LAError.userFallback for biometry-only
    /// LocalAuthentication; for items, the client then sends the passcode).
    case fallback
    /// The item's application password.
    case applicationPassword(SecureBytes)

    /// True if the answer carries a secret (wiped after use).
    public var carriesSecret: Bool {
        switch self {
        case .passcode, .applicationPassword: true
        default: false
        }
    }
}

/// Per-connection authentication options (AUTH_OPTIONS), as an `LAContext` carries them:
/// `interactionNotAllowed`, the operation prompt, a credential set in advance
/// (`setCredential`), and how long an authentication may be reused
/// (`touchIDAuthenticationAllowableReuseDuration`).
public struct AuthenticationOptions: Sendable {
    /// Never ask the person: an operation that needs authentication fails at once with
    /// errSecInteractionNotAllowed (kSecUseAuthenticationUIFail).
    public var noUserInterface: Bool
    /// The client's description of the operation, shown after the agent's own sentence.
    public var operationPrompt: String
    /// The passcode given in advance (LAContext.setCredential); checked by PAM when needed.
    public var passcode: SecureBytes?
    /// Seconds a successful authentication covers later requests of this connection (0: none; at
    /// most ``maximumReuseSeconds``).
    public var reuseSeconds: UInt32
    /// The authentication covers this connection's later requests until it closes, the keybag locks or
    /// other options arrive (an evaluated LAContext, valid until `invalidate()` as on Apple platforms);
    /// ``reuseSeconds`` is then 0.
    public var keepsForConnection: Bool
    /// The application password for items that need one (kSecUseAuthenticationContext with
    /// `setCredential(_:type: .applicationPassword)`): used to make such an item and to open it.
    public var applicationPassword: SecureBytes?

    /// The cap on ``reuseSeconds`` (LATouchIDAuthenticationMaximumAllowableReuseDuration: 5 minutes).
    public static let maximumReuseSeconds: UInt32 = 300
    /// Longest operation prompt accepted.
    public static let maximumPromptBytes = 512

    public init(noUserInterface: Bool = false, operationPrompt: String = "", passcode: SecureBytes? = nil, reuseSeconds: UInt32 = 0,
                applicationPassword: SecureBytes? = nil, keepsForConnection: Bool = false) {
        self.noUserInterface = noUserInterface
        self.operationPrompt = operationPrompt
        self.passcode = passcode
        self.reuseSeconds = keepsForConnection ? 0 : reuseSeconds
        self.keepsForConnection = keepsForConnection
        self.applicationPassword = applicationPassword
    }
}

/// LocalAuthentication policies (LAPolicy).
public enum LAPolicy: UInt8, Sendable, Hashable, CaseIterable {
    /// deviceOwnerAuthenticationWithBiometrics: biometry only (no passcode fallback: the person asking
    /// for a password gets userFallback).
    case deviceOwnerAuthenticationWithBiometrics = 1
    /// deviceOwnerAuthentication: biometry, falling back to the passcode; or the passcode alone.
    case deviceOwnerAuthentication = 2

    /// The CLI spelling.
    public var name: String {
        switch self {
        case .deviceOwnerAuthenticationWithBiometrics: "biometrics"
        case .deviceOwnerAuthentication: "device-owner"
        }
    }
}

/// LocalAuthentication's error codes (LAError.Code), with their stable numbers.
public enum LAErrorCode: Int32, Sendable, CaseIterable {
    case authenticationFailed = -1
    case userCancel = -2
    case userFallback = -3
    case systemCancel = -4
    case passcodeNotSet = -5
    case biometryNotAvailable = -6
    case biometryNotEnrolled = -7
    case biometryLockout = -8
    case notInteractive = -1004

    /// Apple's name, e.g. `LAErrorUserCancel`.
    public var name: String {
        switch self {
        case .authenticationFailed: "LAErrorAuthenticationFailed"
        case .userCancel: "LAErrorUserCancel"
        case .userFallback: "LAErrorUserFallback"
        case .systemCancel: "LAErrorSystemCancel"
        case .passcodeNotSet: "LAErrorPasscodeNotSet"
        case .biometryNotAvailable: "LAErrorBiometryNotAvailable"
        case .biometryNotEnrolled: "LAErrorBiometryNotEnrolled"
        case .biometryLockout: "LAErrorBiometryLockout"
        case .notInteractive: "LAErrorNotInteractive"
        }
    }

    /// The SecItem status the same failure gives a keychain operation.
    public var secStatus: SecStatus {
        switch self {
        case .userCancel, .systemCancel, .userFallback: .userCanceled
        case .authenticationFailed, .biometryLockout: .authFailed
        case .notInteractive: .interactionNotAllowed
        case .passcodeNotSet, .biometryNotAvailable, .biometryNotEnrolled: .notAvailable
        }
    }

    /// The `coffer la` exit status (stable; documented in docs/access-control.md): 20 + the code's position.
    public var exitCode: Int32 {
        switch self {
        case .authenticationFailed: 21
        case .userCancel: 22
        case .userFallback: 23
        case .systemCancel: 24
        case .passcodeNotSet: 25
        case .biometryNotAvailable: 26
        case .biometryNotEnrolled: 27
        case .biometryLockout: 28
        case .notInteractive: 29
        }
    }
}

/// A failed LocalAuthentication evaluation: a stable code and a message for people.
public struct LAError: Error, Sendable, Equatable, CustomStringConvertible {
    public let code: LAErrorCode
    public let message: String
    public init(_ code: LAErrorCode, _ message: String) {
        self.code = code
        self.message = message
    }
    public var description: String { "\(code.name) (\(code.rawValue)): \(message)" }
    /// The keychain form of the same failure.
    public var secError: SecError { SecError(code.secStatus, message) }
}
