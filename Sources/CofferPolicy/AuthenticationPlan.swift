package import CofferModel

/// The biometric authenticator's state, as the agent last read it from its plugin.
package struct BiometryState: Sendable, Equatable {
    /// A biometric authenticator is configured and answering.
    package var available: Bool
    /// At least one finger is enrolled.
    package var enrolled: Bool
    /// Five failed matches in a row: only the passcode is accepted until it succeeds.
    package var lockedOut: Bool
    /// The enrolled set's domain state (changes whenever a finger is enrolled or removed).
    package var domainState: [UInt8]
    /// How many fingers are enrolled (as the authenticator reports it).
    package var enrolledCount: UInt32

    package init(available: Bool, enrolled: Bool, lockedOut: Bool = false, domainState: [UInt8] = [], enrolledCount: UInt32? = nil) {
        self.available = available
        self.enrolled = enrolled
        self.lockedOut = lockedOut
        self.domainState = domainState
        self.enrolledCount = enrolledCount ?? (enrolled ? 1 : 0)
    }

    /// No biometric authenticator.
    package static let unavailable = BiometryState(available: false, enrolled: false)

    /// True if a biometric evaluation can be started now.
    package var usable: Bool { available && enrolled && !lockedOut }

    /// Why biometry cannot be used now (nil if it can).
    package var unusableReason: LAError? {
        if !available { return LAError(.biometryNotAvailable, "no biometric authenticator is available") }
        if !enrolled { return LAError(.biometryNotEnrolled, "no finger is enrolled") }
        if lockedOut { return LAError(.biometryLockout, "biometry is locked out after too many failed matches; authenticate with your passcode to re-enable it") }
        return nil
    }
}

/// What an operation that touches protected items needs next, decided from the rules alone (the
/// seeds' policy table): pure, so every row of the table is a unit test.
package enum AuthenticationStep: Sendable, Equatable {
    /// What is established satisfies every rule: run the operation with it.
    case satisfied
    /// Ask the person for one of `methods` (biometry preferred when it is among them).
    case ask(AuthenticationMethods)
    /// No way to satisfy a rule now.
    case fail(LAError)
}

package enum AuthenticationPlanner {
    /// The next step for `rules` (every one must be satisfied), given what `established` already holds.
    ///
    /// Per factor: `userPresence` prefers biometry with the passcode as fallback, and takes the
    /// passcode alone without usable biometry; `biometryAny` and `biometryCurrentSet` take biometry
    /// only (a locked-out, unenrolled or missing sensor fails with its LAError; a currentSet rule
    /// whose enrolled set changed since the item was made fails too: `authenticationFailed`, the
    /// item is unusable, as on iOS); `devicePasscode` the passcode; `applicationPassword` the
    /// application password. An `or` rule offers the union of its factors' methods; an `and` rule
    /// asks for its first unsatisfied factor, then the next.
    package static func next(rules: [AccessControl], established: AuthorizationContext, biometry: BiometryState,
                             passcodeSet: Bool) -> AuthenticationStep {
        for rule in rules where !rule.isSatisfied(by: established) {
            if !passcodeSet { return .fail(LAError(.passcodeNotSet, "no passcode is set, so nobody can authenticate")) }
            let candidates = rule.combination == .and
                ? rule.factors.filter { !factorSatisfied($0, rule, established) }.prefix(1).map { $0 }
                : rule.factors
            var methods: AuthenticationMethods = []
            var firstFailure: LAError? = nil
            for f in candidates {
                switch methodsFor(f, rule, biometry) {
                case .success(let m): methods.formUnion(m)
                case .failure(let e): firstFailure = firstFailure ?? e
                }
            }
            if methods.isEmpty { return .fail(firstFailure ?? LAError(.authenticationFailed, "the item's access control cannot be satisfied")) }
            return .ask(methods)
        }
        return .satisfied
    }

    static func factorSatisfied(_ f: AccessControl.Factor, _ rule: AccessControl, _ c: AuthorizationContext) -> Bool {
        AccessControl(factors: [f], domainState: rule.domainState)!.isSatisfied(by: c)
    }

    static func methodsFor(_ f: AccessControl.Factor, _ rule: AccessControl, _ biometry: BiometryState) -> Result<AuthenticationMethods, LAError> {
        switch f {
        case .userPresence:
            return .success(biometry.usable ? [.biometry, .passcode] : [.passcode])
        case .biometryAny, .biometryCurrentSet:
            if let why = biometry.unusableReason { return .failure(why) }
            if f == .biometryCurrentSet && biometry.domainState != rule.domainState {
                return .failure(LAError(.authenticationFailed,
                                        "the enrolled fingers changed since this item was made (biometry-current-set): it can no longer be used"))
            }
            return .success([.biometry])
        case .devicePasscode:
            return .success([.passcode])
        case .applicationPassword:
            return .success([.applicationPassword])
        }
    }

    /// What a LocalAuthentication policy needs: biometrics-only takes biometry (its unusable reason
    /// otherwise); device-owner prefers biometry with passcode fallback, else the passcode.
    package static func methods(for policy: LAPolicy, biometry: BiometryState, passcodeSet: Bool) -> Result<AuthenticationMethods, LAError> {
        switch policy {
        case .deviceOwnerAuthenticationWithBiometrics:
            if let why = biometry.unusableReason { return .failure(why) }
            return .success([.biometry])
        case .deviceOwnerAuthentication:
            if !passcodeSet { return .failure(LAError(.passcodeNotSet, "no passcode is set")) }
            return .success(biometry.usable ? [.biometry, .passcode] : [.passcode])
        }
    }
}

/// Consecutive failed biometric matches, and the lockout after ``limit`` of them that only a
/// successful passcode lifts (the seeds: five failures, then the passcode). A value: the agent keeps
/// it under a lock.
package struct BiometricLockout: Sendable, Equatable {
    /// Failures that lock biometry out.
    package static let limit = 5
    package private(set) var failures = 0
    package init() {}
    package var isLockedOut: Bool { failures >= Self.limit }
    /// A failed match; true if it locked biometry out.
    package mutating func recordFailure() -> Bool {
        failures += 1
        return failures == Self.limit
    }
    /// A successful match (below the limit) resets the count.
    package mutating func recordMatch() { if !isLockedOut { failures = 0 } }
    /// A successful passcode lifts a lockout.
    package mutating func recordPasscode() { failures = 0 }
}
