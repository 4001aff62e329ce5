/// The access groups one keychain operation may see and write, and the group an added item without
/// `agrp` gets. The keychain takes a scope, never a caller: who the caller is and which groups it may
/// use is decided before the keychain (by the agent, later by its policy).
///
/// - Reading (copyMatching, update's and delete's match): rows of other groups are invisible, exactly
///   as if they did not exist (errSecItemNotFound; existence does not leak).
/// - Naming a group outside the scope (`agrp` in a query, in an added item, or set by an update) is
///   errSecMissingEntitlement, whether or not any item is in it: the answer is about the caller, never
///   about the items.
/// - Duplicates: `agrp` is part of every class's primary key (Apple's rule), so the same item in two
///   groups is two items; an add only ever collides with a row of its own group, which is in scope.
public struct AccessScope: Sendable, Hashable {
    /// The groups in scope; nil: every group.
    public let groups: Set<String>?
    /// The group an added item without `agrp` gets (always in scope).
    public let defaultGroup: String

    /// A scope of `groups`, adding to `defaultGroup` when an item names none (`defaultGroup` is in scope too).
    public init(groups: Set<String>, defaultGroup: String) {
        self.groups = groups.union([defaultGroup])
        self.defaultGroup = defaultGroup
    }

    private init(allGroupsWithDefault defaultGroup: String) {
        groups = nil
        self.defaultGroup = defaultGroup
    }

    /// The group items get when added without one (and without a narrower scope).
    public static let defaultAccessGroup = "coffer.default"

    /// Every group, default ``defaultAccessGroup``: what the agent passes until access groups arrive.
    public static let unrestricted = AccessScope(allGroupsWithDefault: defaultAccessGroup)

    /// True if `group` is in scope.
    @inlinable
    public func contains(_ group: String) -> Bool { groups?.contains(group) ?? true }

    /// True if a row with these attributes is visible (its `agrp` is in scope; a row without one, which
    /// the keychain never writes, only to an unrestricted scope).
    @inlinable
    public func admits(_ attributes: Attributes) -> Bool {
        guard let groups else { return true }
        guard let g = attributes.accessGroup else { return false }
        return groups.contains(g)
    }
}
