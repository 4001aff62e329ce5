/// Apple's OSStatus result codes that Coffer returns, with their stable numbers.
///
/// These numbers go on the wire and into scripts; they are never renumbered.
public enum SecStatus: Int32, Sendable, CaseIterable {
    /// errSecSuccess: no error.
    case success = 0
    /// errSecUnimplemented: the function or operation is not implemented.
    case unimplemented = -4
    /// errSecIO: an I/O error (the agent could not be reached, a file could not be written).
    case io = -36
    /// errSecParam: a parameter (attribute, query option, message field) is invalid.
    case param = -50
    /// errSecAllocate: a resource limit was hit.
    case allocate = -108
    /// errSecUserCanceled: the user cancelled the operation.
    case userCanceled = -128
    /// errSecInternalComponent: an internal component failed.
    case internalComponent = -2070
    /// errSecNotAvailable: the facility is not available (e.g. a WhenPasscodeSet item with no passcode set).
    case notAvailable = -25291
    /// errSecAuthFailed: authentication failed (wrong passcode, tampered keybag).
    case authFailed = -25293
    /// errSecDuplicateItem: an item with the same primary key already exists.
    case duplicateItem = -25299
    /// errSecItemNotFound: no item matched.
    case itemNotFound = -25300
    /// errSecInteractionNotAllowed: the item's protection class key is not available (the keybag is locked).
    case interactionNotAllowed = -25308
    /// errSecDecode: stored data could not be decoded or failed authentication (a corrupt row or file).
    case decode = -26275
    /// errSecMissingEntitlement: the caller may not use the requested access group.
    case missingEntitlement = -34018

    /// Apple's constant name, e.g. `errSecItemNotFound`.
    public var name: String {
        switch self {
        case .success: "errSecSuccess"
        case .unimplemented: "errSecUnimplemented"
        case .io: "errSecIO"
        case .param: "errSecParam"
        case .allocate: "errSecAllocate"
        case .userCanceled: "errSecUserCanceled"
        case .internalComponent: "errSecInternalComponent"
        case .notAvailable: "errSecNotAvailable"
        case .authFailed: "errSecAuthFailed"
        case .duplicateItem: "errSecDuplicateItem"
        case .itemNotFound: "errSecItemNotFound"
        case .interactionNotAllowed: "errSecInteractionNotAllowed"
        case .decode: "errSecDecode"
        case .missingEntitlement: "errSecMissingEntitlement"
        }
    }

    /// The `coffer` CLI's exit status for this result (documented in docs/cli.md; stable).
    public var exitCode: Int32 {
        switch self {
        case .success: 0
        case .param: 2
        case .itemNotFound: 3
        case .duplicateItem: 4
        case .authFailed: 5
        case .interactionNotAllowed: 6
        case .notAvailable: 7
        case .decode: 8
        case .io: 9
        case .userCanceled: 10
        case .missingEntitlement: 11
        case .unimplemented: 12
        case .allocate: 13
        case .internalComponent: 14
        }
    }
}

/// A failed keychain operation: a stable ``SecStatus`` code plus a human explanation.
///
/// The message never contains a secret, passcode or key; attribute names may appear, attribute
/// values do not.
public struct SecError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The OSStatus-style code.
    public let status: SecStatus
    /// What went wrong, for people (no secrets).
    public let message: String
    /// True if the operation touched an item whose access control the request's authorization does
    /// not satisfy (errSecInteractionNotAllowed): the agent then asks the person and tries again. Not
    /// on the wire (a client sees errSecInteractionNotAllowed).
    public private(set) var needsAuthentication = false
    /// With ``needsAuthentication``: the access controls that guard the operation on every item the
    /// request matched (distinct, in match order), found in the same pass that met the unsatisfied
    /// one, so the agent plans the person's authentication without searching again. Not on the wire.
    public private(set) var accessRequirements: [AccessControl] = []
    /// With ``needsAuthentication``: the persistent references of the matches whose access control
    /// guards the operation (in match order), so the agent can grant the caller exactly those items
    /// once the person authenticated (a Secret Service prompt). Not on the wire.
    public private(set) var accessTargets: [[UInt8]] = []
    /// With ``needsAuthentication``, from a search: the rows the attempt matched (``MatchHandle``), so
    /// that the operation, run again once the person authenticated, opens those rows instead of
    /// searching again. Not on the wire.
    package private(set) var matchHandle: MatchHandle? = nil
    /// What the person can do next (`coffer unlock`, how to start the agent, …), printed by the CLI
    /// on the line after the error. Not on the wire: a client adds it where it knows the answer.
    public private(set) var hint: String? = nil

    /// This error with the search's `handle` attached (``matchHandle``).
    package func withMatchHandle(_ handle: MatchHandle) -> SecError {
        var e = self
        e.matchHandle = handle
        return e
    }

    /// This error with `hint` attached.
    public func withHint(_ hint: String) -> SecError {
        var e = self
        e.hint = hint
        return e
    }

    /// errSecInteractionNotAllowed because an item's access control needs authentication;
    /// `requirements` are the rules the request's matches need (``accessRequirements``).
    public static func authenticationNeeded(_ m: String, requirements: [AccessControl] = [], targets: [[UInt8]] = []) -> SecError {
        var e = SecError(.interactionNotAllowed, m)
        e.needsAuthentication = true
        e.accessRequirements = requirements
        e.accessTargets = targets
        return e
    }

    /// Makes an error with `status` and `message`.
    public init(_ status: SecStatus, _ message: String) {
        precondition(status != .success, "success is not an error")
        self.status = status
        self.message = message
    }

    /// `errSecName (code): message`, the form the CLI prints.
    public var description: String { "\(status.name) (\(status.rawValue)): \(message)" }

    public static func param(_ m: String) -> SecError { SecError(.param, m) }
    public static func itemNotFound(_ m: String = "no matching item") -> SecError { SecError(.itemNotFound, m) }
    public static func duplicateItem(_ m: String = "an item with the same primary key exists") -> SecError { SecError(.duplicateItem, m) }
    public static func interactionNotAllowed(_ m: String) -> SecError { SecError(.interactionNotAllowed, m) }
    public static func authFailed(_ m: String = "authentication failed") -> SecError { SecError(.authFailed, m) }
    public static func decode(_ m: String) -> SecError { SecError(.decode, m) }
    public static func notAvailable(_ m: String) -> SecError { SecError(.notAvailable, m) }
    public static func io(_ m: String) -> SecError { SecError(.io, m) }
}

/// What a search that stopped for authentication matched: its rows, in match order, and whether the
/// search was complete, valid only while the keychain's database reads as it did then (the same store,
/// no change since: `stamp`). The agent runs the operation again with it once the person
/// authenticated, and the keychain then opens these rows (each compared with the query in full
/// again) instead of searching its indexes a second time; a handle that is no longer valid is
/// ignored and the search runs again (issue #42: a protected read costs one search).
public struct MatchHandle: Sendable, Equatable {
    package let rowIDs: [Int64]
    package let complete: Bool
    package let store: ObjectIdentifier
    package let stamp: [Int64]

    package init(rowIDs: [Int64], complete: Bool, store: ObjectIdentifier, stamp: [Int64]) {
        self.rowIDs = rowIDs
        self.complete = complete
        self.store = store
        self.stamp = stamp
    }
}
