import CofferCrypto
public import CofferModel
import CofferStore
import CofferSystem

// What an item's access control asks of an operation, and the keychain's own check of it.
extension Keychain {
    // MARK: Access control

    /// The access controls that guard `operation` on the items `query` matches in `scope` (distinct,
    /// in match order): what the agent's policy must satisfy before running the operation. For a
    /// search, only one returning data (`.useSecret`) can need any. Empty if nothing matches or no
    /// match is protected. The same errors as a search (a locked class key, a bad query).
    public func accessRequirements(_ query: ItemQuery, scope: AccessScope,
                                   for operation: AccessControl.Operations) throws(SecError) -> [AccessControl] {
        try Validation.check(query)
        try Validation.checkEntitled(query.attributes, in: scope)
        let limit = operation == .useSecret ? query.limit.bound : nil
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            var out: [AccessControl] = []
            _ = try store.reading { () throws(SecError) in
                try forEachMatch(store, query, scope, limit: limit) { (_, _, attrs) throws(SecError) in
                    if let acl = try Self.accessControl(attrs), acl.guards(operation), !out.contains(acl) { out.append(acl) }
                }
            }
            return out
        }
    }

    /// The stored access control of an item's attributes; errSecDecode if it is there but unreadable
    /// (fail closed: a damaged rule never means "no rule").
    static func accessControl(_ attrs: Attributes) throws(SecError) -> AccessControl? {
        guard let v = attrs[AccessControl.attributeName] else { return nil }
        guard case .data(let b) = v, let acl = AccessControl(encoded: b) else {
            throw .decode("an item's access control is damaged")
        }
        return acl
    }

    /// One pass's access-control check: every match goes through ``admit(_:)``; the first whose rule
    /// `authorization` does not satisfy stops the operation's work (nothing more is opened), but the
    /// pass goes on collecting the rules of the remaining matches, so that the
    /// ``SecError/authenticationNeeded(_:requirements:)`` it ends with carries everything the agent
    /// must ask the person for: no second search for the requirements.
    struct Requirements {
        let operation: AccessControl.Operations
        let held: AuthorizationContext
        /// Per item (persistent reference): what a grant the caller holds for it carries (a Secret
        /// Service prompt's read), which stands instead of `held` for that item alone.
        let grants: [[UInt8]: AuthorizationContext]
        /// The distinct rules guarding `operation` on the matches so far.
        private(set) var rules: [AccessControl] = []
        /// The persistent references of the matches those rules guard, in match order.
        private(set) var targets: [[UInt8]] = []
        /// The first rule `authorization` does not satisfy.
        private var unsatisfied: AccessControl? = nil

        init(operation: AccessControl.Operations, authorization: AuthorizationContext, grants: [[UInt8]: AuthorizationContext] = [:]) {
            self.operation = operation
            self.held = authorization
            self.grants = grants
        }

        /// What authorizes the operation on the item `ref` guarded by `acl`: what the caller holds if
        /// that satisfies the rule, else the caller's grant for this item if it has one.
        private func authorization(for ref: [UInt8]?, _ acl: AccessControl) -> AuthorizationContext {
            guard !grants.isEmpty, !acl.isSatisfied(by: held), let ref, let g = grants[ref] else { return held }
            return g
        }

        /// What opens the secret of the item `ref` with attributes `attrs` (an application password
        /// among it): ``authorization(for:_:)`` for its rule.
        func authorization(for ref: [UInt8], _ attrs: Attributes) throws(SecError) -> AuthorizationContext {
            guard !grants.isEmpty, let acl = try Keychain.accessControl(attrs), acl.guards(operation) else { return held }
            return authorization(for: ref, acl)
        }

        /// True if the operation may go on with this match (nothing unsatisfied so far, this one included).
        mutating func admit(_ attrs: Attributes, _ ref: [UInt8]? = nil) throws(SecError) -> Bool {
            guard let acl = try Keychain.accessControl(attrs), acl.guards(operation) else { return unsatisfied == nil }
            if !rules.contains(acl) { rules.append(acl) }
            if let ref { targets.append(ref) }
            if unsatisfied == nil && !acl.isSatisfied(by: authorization(for: ref, acl)) { unsatisfied = acl }
            return unsatisfied == nil
        }

        /// True if `operation` on this match would need the person now: its rule is not satisfied by
        /// what the caller holds for it (never counted as a refusal: a listing reports it).
        func wouldNeedPerson(_ attrs: Attributes, _ ref: [UInt8]) throws(SecError) -> Bool {
            guard let acl = try Keychain.accessControl(attrs), acl.guards(operation) else { return false }
            return !acl.isSatisfied(by: authorization(for: ref, acl))
        }

        /// errSecInteractionNotAllowed (needs authentication, with the rules) if a match was not admitted.
        func throwIfUnsatisfied() throws(SecError) {
            guard let acl = unsatisfied else { return }
            throw .authenticationNeeded("the item's access control (\(acl)) needs authentication for this operation",
                                        requirements: rules, targets: targets)
        }
    }

    /// errSecInteractionNotAllowed unless `authorization` satisfies the item's access control for
    /// `operation` (the policy decided before; this is the keychain's own check of that decision).
    static func checkAuthorized(_ attrs: Attributes, _ operation: AccessControl.Operations,
                                        _ authorization: AuthorizationContext) throws(SecError) {
        guard let acl = try accessControl(attrs), acl.guards(operation), !acl.isSatisfied(by: authorization) else { return }
        throw .authenticationNeeded("the item's access control (\(acl)) needs authentication for this operation")
    }

    /// For an operation the item's rule lets through only because an application password was given,
    /// and that never opens the old secret (a delete, an update replacing the secret), proves the
    /// password by opening the secret: a wrong one is errSecAuthFailed, as on a read, so a party that
    /// does not know it can neither delete the item nor replace its secret.
    func proveApplicationPassword(_ row: StoredRow, _ cls: ItemClass, _ attrs: Attributes, _ operation: AccessControl.Operations,
                                          _ authorization: AuthorizationContext) throws(SecError) {
        guard authorization.hasApplicationPassword, let acl = try Self.accessControl(attrs), acl.guards(operation) else { return }
        var without = authorization
        without.applicationPassword = nil
        guard !acl.isSatisfied(by: without) else { return }
        try openSecret(row, cls, attrs, authorization).wipe()
    }
}
