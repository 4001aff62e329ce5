public import CofferCrypto

/// An item's access control (SecAccessControl): which authentication an operation on the item needs,
/// on top of its accessibility (`pdmn`). Stored sealed with the item as the attribute `accc`; the
/// agent's policy decides whether a request has satisfied it (``AuthorizationContext``) and the
/// keychain checks that decision for every item it touches.
///
/// Flags follow `SecAccessControlCreateFlags`: `userPresence` (biometry if enrolled, else the
/// passcode), `biometryAny`, `biometryCurrentSet` (only the fingers enrolled when the item was made),
/// `devicePasscode`, `applicationPassword` (an extra key from an app-supplied password), combined with
/// `or` (any one) or `and` (all). ``Operations`` says which operations need it: using the secret,
/// updating, deleting (all three by default; a query for attributes only never needs it, as on iOS).
public struct AccessControl: Sendable, Hashable, CustomStringConvertible {
    /// One authentication factor.
    public enum Factor: UInt8, Sendable, Hashable, CaseIterable {
        case userPresence = 1, biometryAny = 2, biometryCurrentSet = 3, devicePasscode = 4, applicationPassword = 5

        /// The CLI spelling (`user-presence`, …).
        public var name: String {
            switch self {
            case .userPresence: "user-presence"
            case .biometryAny: "biometry-any"
            case .biometryCurrentSet: "biometry-current-set"
            case .devicePasscode: "device-passcode"
            case .applicationPassword: "application-password"
            }
        }

        /// True for the factors biometry can satisfy.
        public var isBiometric: Bool { self == .biometryAny || self == .biometryCurrentSet }
    }

    /// How several factors combine.
    public enum Combination: UInt8, Sendable, Hashable {
        /// Any one factor satisfies the rule.
        case or = 1
        /// Every factor must be satisfied.
        case and = 2
    }

    /// Operations an access control can guard.
    public struct Operations: OptionSet, Sendable, Hashable {
        public let rawValue: UInt8
        public init(rawValue: UInt8) { self.rawValue = rawValue }
        /// Reading the secret (a query returning data).
        public static let useSecret = Operations(rawValue: 1)
        /// Changing the item (SecItemUpdate).
        public static let update = Operations(rawValue: 2)
        /// Deleting the item (SecItemDelete).
        public static let delete = Operations(rawValue: 4)
        /// Every operation.
        public static let all: Operations = [.useSecret, .update, .delete]
    }

    /// The factors, in the order given, without repeats; never empty.
    public let factors: [Factor]
    /// How they combine (irrelevant for one factor; stored as `or`).
    public let combination: Combination
    /// The operations that need the authentication.
    public let operations: Operations
    /// For `biometryCurrentSet`: the biometric domain state (the enrolled set) when the item was
    /// made, filled in by the agent; empty otherwise.
    public let domainState: [UInt8]

    /// The attribute that carries an access control.
    public static let attributeName = "accc"
    /// Current encoding version.
    public static let encodingVersion: UInt8 = 1
    /// Longest domain state accepted.
    public static let maximumDomainStateBytes = 64

    /// An access control; nil if `factors` is empty, repeats a factor, or `operations` is empty.
    public init?(factors: [Factor], combination: Combination = .or, operations: Operations = .all, domainState: [UInt8] = []) {
        guard !factors.isEmpty, Set(factors).count == factors.count, !operations.isEmpty, operations.rawValue & ~Operations.all.rawValue == 0,
              domainState.count <= Self.maximumDomainStateBytes else { return nil }
        self.factors = factors
        self.combination = factors.count == 1 ? .or : combination
        self.operations = operations
        self.domainState = domainState
    }

    /// The same rule with the domain state the agent recorded at creation.
    public func with(domainState: [UInt8]) -> AccessControl {
        AccessControl(factors: factors, combination: combination, operations: operations, domainState: domainState)!
    }

    /// True if an operation in `operations` needs this access control.
    public func guards(_ operation: Operations) -> Bool { !operations.isDisjoint(with: operation) }

    /// True if the rule cannot be satisfied without the application password.
    public var needsApplicationPassword: Bool {
        factors.contains(.applicationPassword) && (combination == .and || factors.count == 1)
    }

    /// Parses the CLI form: factors joined by `,`, with `or` / `and` between them
    /// (`biometry-any,or,device-passcode`); one kind of joiner per rule. Nil if malformed.
    public init?(parsing text: String, operations: Operations = .all) {
        let parts = text.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        var factors: [Factor] = []
        var combination: Combination? = nil
        for (i, p) in parts.enumerated() {
            if i % 2 == 1 {
                let c: Combination
                switch p {
                case "or": c = .or
                case "and": c = .and
                default: return nil
                }
                if let combination, combination != c { return nil }
                combination = c
            } else {
                guard let f = Factor.allCases.first(where: { $0.name == p }) else { return nil }
                factors.append(f)
            }
        }
        guard parts.count % 2 == 1 else { return nil }
        self.init(factors: factors, combination: combination ?? .or, operations: operations)
    }

    /// The CLI form.
    public var description: String {
        factors.map(\.name).joined(separator: combination == .and ? ",and," : ",or,")
    }

    /// The stored encoding: u8 version (1) ‖ u8 combination ‖ u8 n ‖ n × u8 factor ‖ u8 operations ‖
    /// u8 m ‖ m bytes domain state.
    public func encoded() -> [UInt8] {
        var out: [UInt8] = [Self.encodingVersion, combination.rawValue, UInt8(factors.count)]
        out += factors.map(\.rawValue)
        out.append(operations.rawValue)
        out.append(UInt8(domainState.count))
        out += domainState
        return out
    }

    /// Decodes ``encoded()``; nil for anything else (a canonical form only: one encoding per rule).
    public init?(encoded bytes: [UInt8]) {
        guard bytes.count >= 6, bytes[0] == Self.encodingVersion, let c = Combination(rawValue: bytes[1]) else { return nil }
        let n = Int(bytes[2])
        guard bytes.count >= 3 + n + 2 else { return nil }
        var factors: [Factor] = []
        for b in bytes[3 ..< 3 + n] {
            guard let f = Factor(rawValue: b) else { return nil }
            factors.append(f)
        }
        let ops = Operations(rawValue: bytes[3 + n])
        let m = Int(bytes[4 + n])
        guard bytes.count == 5 + n + m else { return nil }
        guard let a = AccessControl(factors: factors, combination: c, operations: ops, domainState: Array(bytes[(5 + n)...])),
              a.encoded() == bytes else { return nil }
        self = a
    }

    /// True if `context` satisfies the rule (the application password is checked by the keychain's
    /// cryptography, so here it only needs to be present).
    public func isSatisfied(by context: AuthorizationContext) -> Bool {
        func satisfied(_ f: Factor) -> Bool {
            switch f {
            case .userPresence: context.passcodeVerified || context.biometryVerified
            case .biometryAny: context.biometryVerified
            case .biometryCurrentSet: context.biometryVerified && !domainState.isEmpty && context.biometryDomainState == domainState
            case .devicePasscode: context.passcodeVerified
            case .applicationPassword: context.hasApplicationPassword
            }
        }
        return combination == .and ? factors.allSatisfy(satisfied) : factors.contains(where: satisfied)
    }
}

/// What the agent's policy established for one request before the keychain runs it: which
/// authentications the person completed (the passcode checked by PAM, a biometric match and the
/// domain state it was made against) and whether an application password was supplied. The keychain
/// checks each protected item against it and refuses what it does not satisfy; it never evaluates
/// anything itself.
public struct AuthorizationContext: Sendable, Equatable {
    public static func == (a: AuthorizationContext, b: AuthorizationContext) -> Bool {
        a.passcodeVerified == b.passcodeVerified && a.biometryVerified == b.biometryVerified
            && a.biometryDomainState == b.biometryDomainState && a.hasApplicationPassword == b.hasApplicationPassword
    }

    /// The passcode was verified (through PAM) for this request or within its reuse window.
    public var passcodeVerified: Bool
    /// A biometric match happened for this request or within its reuse window.
    public var biometryVerified: Bool
    /// The domain state of the enrolled set the match was made against.
    public var biometryDomainState: [UInt8]
    /// The application password that came with the request: the keychain derives its key (Argon2id)
    /// and the item's cryptography checks it (a wrong one is errSecAuthFailed).
    public var applicationPassword: SecureBytes?
    /// True if an application password came with the request.
    public var hasApplicationPassword: Bool { applicationPassword != nil }
    /// Told of every application-password attempt the keychain counts or refuses for this request
    /// (the agent audits them); not part of equality.
    public var onApplicationPasswordAttempt: (@Sendable (ApplicationPasswordAttempt) -> Void)?

    public init(passcodeVerified: Bool = false, biometryVerified: Bool = false, biometryDomainState: [UInt8] = [],
                applicationPassword: SecureBytes? = nil) {
        self.passcodeVerified = passcodeVerified
        self.biometryVerified = biometryVerified
        self.biometryDomainState = biometryDomainState
        self.applicationPassword = applicationPassword
    }

    /// Nothing authenticated: what a request gets when no item it touches has an access control.
    public static let none = AuthorizationContext()
}

/// One application-password attempt on one item, as the keychain reports it (never the password).
public struct ApplicationPasswordAttempt: Sendable, Equatable {
    public enum Outcome: Sendable, Equatable {
        /// A wrong password: `failures` in a row now; the next attempt waits `nextDelay` seconds.
        case failed(failures: Int, nextDelay: Double)
        /// Refused before checking (not counted, no Argon2id): the schedule's delay has `wait` seconds to run.
        case refused(failures: Int, wait: Double)
    }
    public let outcome: Outcome
    /// The item's access group and class.
    public let accessGroup: String?
    public let itemClass: ItemClass

    public init(outcome: Outcome, accessGroup: String?, itemClass: ItemClass) {
        self.outcome = outcome
        self.accessGroup = accessGroup
        self.itemClass = itemClass
    }
}
