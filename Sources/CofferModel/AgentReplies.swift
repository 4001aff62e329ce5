/// The agent's answers as values of the model, with no wire in them: lock events, the status, the
/// caller's identity, LocalAuthentication's result, the biometric authenticator's state. The native
/// protocol (CofferProtocol) encodes them; any other front end may present them its own way.

/// The events the agent pushes to subscribed clients (EVENT, request id 0): the lock state's, and,
/// for a subscriber that asked for them (``EventTopics/items``), that items changed.
public enum LockEvent: Sendable, Equatable {
    /// Protected data will become unavailable in `graceMillis`.
    case willLock(graceMillis: UInt32)
    /// WhenUnlocked keys were wiped.
    case locked
    /// The keybag was unlocked.
    case unlocked
    /// Items were added, changed or deleted (by any caller, or by a sync). It says nothing of which
    /// items, or who changed them: a subscriber learns only that it should look again. `groups`: the
    /// access groups whose items changed, ascending, when the agent knows them and the subscriber
    /// asked for them (``EventTopics/itemGroups``); nil: any group may have changed.
    case itemsChanged(groups: [String]?)

    /// At most this many groups are named; a change touching more is announced without groups.
    public static let maxNamedGroups = 256
    /// At most this many bytes of names (each with its 2-byte length) are named, so that an event
    /// stays far inside a frame whatever its groups' lengths (an attribute string may be 4 KiB);
    /// a change whose groups' names take more is announced without groups.
    public static let maxNamedGroupBytes = 65536

    /// Items changed in `groups` (nil, empty, more than ``maxNamedGroups``, or names longer than
    /// ``maxNamedGroupBytes`` in all: any group may have).
    public static func itemsChanged(in groups: Set<String>?) -> LockEvent {
        guard let groups, !groups.isEmpty, groups.count <= maxNamedGroups,
              groups.reduce(0, { $0 + 2 + $1.utf8.count }) <= maxNamedGroupBytes else { return .itemsChanged(groups: nil) }
        return .itemsChanged(groups: groups.sorted { $0.precedesInUTF8($1) })
    }

    /// The topic a subscriber names to receive the event.
    public var topic: EventTopics {
        if case .itemsChanged = self { return .items }
        return .lock
    }

    /// The event as a subscriber to `topics` receives it: nil if it asked for none of the event's
    /// topics; an item change without its groups unless it asked for them.
    public func delivered(to topics: EventTopics) -> LockEvent? {
        guard case .itemsChanged(let groups) = self else { return topics.contains(.lock) ? self : nil }
        if topics.contains(.itemGroups) { return self }
        return topics.contains(.items) ? (groups == nil ? self : .itemsChanged(groups: nil)) : nil
    }
}

/// What a subscriber receives (SUBSCRIBE's topics byte).
public struct EventTopics: OptionSet, Sendable, Hashable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    /// willLock, locked, unlocked: what an empty SUBSCRIBE gives.
    public static let lock = EventTopics(rawValue: 1)
    /// itemsChanged: only for a caller whose manifest grants `delegate-identity`.
    public static let items = EventTopics(rawValue: 2)
    /// itemsChanged naming the access groups that changed, when the agent knows them (what `.items`
    /// gives, plus the groups): only for a caller whose manifest grants `delegate-identity`.
    public static let itemGroups = EventTopics(rawValue: 4)
    /// Every topic this version knows; any other bit is refused.
    public static let known: EventTopics = [.lock, .items, .itemGroups]
    /// The topics that carry item changes.
    public static let itemChanges: EventTopics = [.items, .itemGroups]
}

/// STATUS_REPLY contents.
public struct StatusReply: Sendable, Equatable {
    /// The keybag's state (on the wire one byte: 0 boot, before the first unlock; 1 locked; 2 unlocked).
    public var lockState: LockState
    /// True once a passcode protects the keybag.
    public var passcodeSet: Bool
    /// Number of items.
    public var itemCount: UInt64
    /// The agent's version.
    public var agentVersion: String
    /// Bytes of memory the agent has locked (VmLck).
    public var lockedMemoryBytes: UInt64
    /// Idle lock timeout in seconds (0: never).
    public var idleLockSeconds: UInt32

    /// Makes a status reply.
    public init(lockState: LockState, passcodeSet: Bool, itemCount: UInt64, agentVersion: String,
                lockedMemoryBytes: UInt64, idleLockSeconds: UInt32) {
        self.lockState = lockState
        self.passcodeSet = passcodeSet
        self.itemCount = itemCount
        self.agentVersion = agentVersion
        self.lockedMemoryBytes = lockedMemoryBytes
        self.idleLockSeconds = idleLockSeconds
    }
}

/// COUNTERS_REPLY contents: what the agent has done since it started, counted by the agent itself, so
/// that what one client action costs (round trips, identity resolutions, keychain searches) is
/// measured, never estimated (issue #42). Counts only: nothing about any item or caller.
public struct AgentCounters: Sendable, Equatable {
    /// Native connections whose HELLO was accepted.
    public var connections: UInt64
    /// Native requests handled (each is one round trip; HELLO and refused ones included).
    public var requests: UInt64
    /// Identity resolutions (a connecting process, a delegated one).
    public var identifications: UInt64
    /// Keychain match passes (a search, an update's or a delete's matching).
    public var searches: UInt64

    public init(connections: UInt64, requests: UInt64, identifications: UInt64, searches: UInt64) {
        self.connections = connections
        self.requests = requests
        self.identifications = identifications
        self.searches = searches
    }
}

/// PROMPTER_REPLY contents: how the agent reaches the person for its own dialogs (issue #43; what
/// `coffer status` shows): the pinentry it runs and why, and the display the dialogs appear on.
public struct PrompterReply: Sendable, Equatable {
    /// The pinentry's absolute path; nil: the agent shows no dialogs.
    public var program: String?
    /// Why this pinentry, or why none (for the person).
    public var reason: String
    /// True when the agent knows a display its dialogs may appear on.
    public var hasDisplay: Bool
    /// The display (with `hasDisplay`), or why there is none.
    public var display: String

    /// Makes a reply.
    public init(program: String?, reason: String, hasDisplay: Bool, display: String) {
        self.program = program
        self.reason = reason
        self.hasDisplay = hasDisplay
        self.display = display
    }
}

/// PROTECTIONS_REPLY contents: which protections of issue #28 are active (what `coffer status` shows).
public struct ProtectionsReply: Sendable, Equatable {
    /// The device key is sealed by the TPM 2.0 (else: the file `device.key`).
    public var deviceKeyInTPM: Bool
    /// Wrong passcodes are counted by the TPM's dictionary-attack lockout (else: the `attempts` file only).
    public var attemptsCountedByTPM: Bool
    /// With ``attemptsCountedByTPM``: the TPM's lockout authorization is empty, so any local process
    /// that reaches the TPM can reset its count, and the bound on guesses is the `attempts` file.
    public var tpmLockoutAuthorizationEmpty: Bool
    /// Rolled-back keybags or databases are detected.
    public var rollbackDetection: Bool

    /// Makes a reply. `tpmLockoutAuthorizationEmpty` counts only with `attemptsCountedByTPM`.
    public init(deviceKeyInTPM: Bool, attemptsCountedByTPM: Bool, tpmLockoutAuthorizationEmpty: Bool = false, rollbackDetection: Bool) {
        self.deviceKeyInTPM = deviceKeyInTPM
        self.attemptsCountedByTPM = attemptsCountedByTPM
        self.tpmLockoutAuthorizationEmpty = attemptsCountedByTPM && tpmLockoutAuthorizationEmpty
        self.rollbackDetection = rollbackDetection
    }
}

/// WHOAMI_REPLY contents: the identity the agent gives the calling process and the access groups its
/// item requests run with (what `coffer whoami` prints).
public struct WhoAmIReply: Sendable, Equatable {
    /// How the identity was established (on the wire one byte).
    public enum Kind: UInt8, Sendable, Equatable {
        /// No manifest or sandbox vouches for the caller.
        case unsigned = 0
        /// A trusted, verified manifest names the caller's executable and its SHA-256.
        case signedManifest = 1
        /// A Flatpak sandbox (`.flatpak-info`).
        case flatpak = 2
    }
    /// How the identity was established.
    public var kind: Kind
    /// The app id (empty when unsigned).
    public var appID: String
    /// The caller's pid as the agent sees it.
    public var pid: UInt32
    /// The caller's executable (`/proc/PID/exe`; empty if unknown).
    public var executable: String
    /// Why the caller is unsigned, or why it is denied (empty when neither).
    public var note: String
    /// The groups the caller's item requests may use, default first (empty: every item request is
    /// refused with errSecMissingEntitlement).
    public var accessGroups: [String]
    /// True if the caller may ask the user to authorize another group (AUTHORIZE): the shell helper.
    public var mayAuthorize: Bool

    /// Makes a reply.
    public init(kind: Kind, appID: String, pid: UInt32, executable: String, note: String, accessGroups: [String], mayAuthorize: Bool) {
        self.kind = kind
        self.appID = appID
        self.pid = pid
        self.executable = executable
        self.note = note
        self.accessGroups = accessGroups
        self.mayAuthorize = mayAuthorize
    }
}

/// LA_RESULT contents: the outcome of LA_CAN_EVALUATE or LA_EVALUATE.
public struct LAResult: Sendable, Equatable {
    /// nil: success (the policy can be / was evaluated).
    public var error: LAErrorCode?
    /// The biometry the agent offers: 0 none, 1 fingerprint (LABiometryType).
    public var biometryType: UInt8
    /// The enrolled set's domain state (evaluatedPolicyDomainState; empty without biometry).
    public var domainState: [UInt8]
    /// Why it failed (for people; empty on success).
    public var message: String

    public init(error: LAErrorCode?, biometryType: UInt8, domainState: [UInt8], message: String) {
        self.error = error
        self.biometryType = biometryType
        self.domainState = domainState
        self.message = message
    }
}

/// What `coffer bio` asks of the biometric authenticator (BIO).
public enum BioOperation: UInt8, Sendable, Equatable {
    /// Enroll a finger by name (needs the passcode).
    case enroll = 1
    /// Remove an enrolled finger (needs the passcode).
    case remove = 2
    /// A finger touches the sensor (the biometric emulator only).
    case present = 3
    /// An unknown finger touches the sensor (the emulator only).
    case presentUnknown = 4
    /// Report the authenticator's state (BIO_STATUS).
    case status = 5
}

/// BIO_STATUS: the biometric authenticator as the agent sees it.
public struct BioStatus: Sendable, Equatable {
    /// The plugin serving biometry (empty: none configured).
    public var authenticator: String
    public var available: Bool
    public var enrolledCount: UInt32
    /// Five failed matches: only the passcode is accepted until it succeeds.
    public var lockedOut: Bool
    public var domainState: [UInt8]
    /// The plugin's own status line (escaped text).
    public var detail: String

    public init(authenticator: String, available: Bool, enrolledCount: UInt32, lockedOut: Bool, domainState: [UInt8], detail: String) {
        self.authenticator = authenticator
        self.available = available
        self.enrolledCount = enrolledCount
        self.lockedOut = lockedOut
        self.domainState = domainState
        self.detail = detail
    }
}
