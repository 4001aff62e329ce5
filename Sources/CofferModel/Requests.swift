public import CofferCrypto

/// A SecItemCopyMatching / SecItemUpdate / SecItemDelete query.
public struct ItemQuery: Sendable, Equatable {
    /// kSecClass; nil matches every class.
    public var itemClass: ItemClass?
    /// Attributes that must all be equal (AND).
    public var attributes: Attributes
    /// kSecMatchLimit (default: the first match only).
    public var limit: MatchLimit
    /// kSecReturnData: return each item's secret.
    public var returnData: Bool
    /// kSecReturnAttributes: return each item's attributes.
    public var returnAttributes: Bool
    /// kSecReturnPersistentRef: return each item's persistent reference.
    public var returnPersistentRef: Bool
    /// kSecValuePersistentRef: match exactly this item; or several 16-byte references one after the
    /// other (at most ``maximumPersistentRefs``, distinct): match any of these items
    /// (``persistentRefs``), as a Secret Service GetSecrets of several items asks.
    public var persistentRef: [UInt8]?
    /// The references ``persistentRef`` holds, 16 bytes each (empty for none).
    public var persistentRefs: [[UInt8]] {
        guard let p = persistentRef else { return [] }
        return stride(from: 0, to: p.count, by: 16).map { Array(p[$0..<min($0 + 16, p.count)]) }
    }
    /// The most items one query may name by reference.
    public static let maximumPersistentRefs = 256
    /// A listing that skips items failing authentication (counting them) instead of failing
    /// (COPY_MATCHING_PAGE only; `coffer check` reports and quarantines them).
    public var skipUnreadable = false
    /// A search by the agent itself for a key it uses in place (to sign), never one a request asked
    /// for: only such a search may open the secret of a non-extractable key (``KeyItem``). No wire
    /// decoder sets it.
    public var usesKeyInPlace = false
    /// A listing by the agent itself that leaves out the items whose class key is locked away (what
    /// `ssh-add -l` shows of a locked keybag), never a request's: no wire decoder sets it.
    public var skipsLockedItems = false
    /// A search that names the matches whose class key is locked away by their persistent reference
    /// (``ItemResult/locked``) instead of failing with errSecInteractionNotAllowed: what a Secret
    /// Service front end answers SearchItems with while the keybag is locked. Such a match is told
    /// by its blind-index entries alone, so the query must name its class, ask for the persistent
    /// reference, and have only indexed attributes (and `pdmn`); wire return-flags bit 4.
    public var listsLockedItems = false
    /// Tell, for each match, whether reading its secret now would need the person
    /// (``ItemResult/needsAuthentication``): an access control that neither the caller's held
    /// authorization nor a grant it holds for the item satisfies. A front end shows such an item locked
    /// without deriving it from the item's attributes (WireProtocol.md, the access-state flag).
    public var reportsAccessState = false

    /// A query; with no return flags, copyMatching only tells whether something matched.
    public init(itemClass: ItemClass? = nil, attributes: Attributes = [:], limit: MatchLimit = .one,
                returnData: Bool = false, returnAttributes: Bool = false, returnPersistentRef: Bool = false,
                persistentRef: [UInt8]? = nil) {
        self.itemClass = itemClass
        self.attributes = attributes
        self.limit = limit
        self.returnData = returnData
        self.returnAttributes = returnAttributes
        self.returnPersistentRef = returnPersistentRef
        self.persistentRef = persistentRef
    }
}

/// What SecItemAdd takes: a class, attributes (including `pdmn`) and the secret (kSecValueData).
public struct NewItem: Sendable {
    /// kSecClass.
    public var itemClass: ItemClass
    /// The item's attributes; `pdmn` picks its protection class (default WhenUnlocked).
    public var attributes: Attributes
    /// The secret, in secure memory.
    public var secret: SecureBytes

    /// Makes an item to add.
    public init(itemClass: ItemClass, attributes: Attributes, secret: SecureBytes) {
        self.itemClass = itemClass
        self.attributes = attributes
        self.secret = secret
    }
}

/// What SecItemUpdate changes: attributes to set and, optionally, a new secret.
public struct ItemChanges: Sendable {
    /// Attributes to set (a new `pdmn` re-wraps the item under that class).
    public var attributes: Attributes
    /// A new secret, or nil to keep the old one.
    public var secret: SecureBytes?

    /// Makes a change set.
    public init(attributes: Attributes = [:], secret: SecureBytes? = nil) {
        self.attributes = attributes
        self.secret = secret
    }
}

/// One item returned by copyMatching: the parts the query asked for.
public struct ItemResult: Sendable {
    /// The item's class.
    public var itemClass: ItemClass
    /// Attributes (with `class` omitted), if kSecReturnAttributes.
    public var attributes: Attributes?
    /// The secret, if kSecReturnData.
    public var data: SecureBytes?
    /// The persistent reference, if kSecReturnPersistentRef.
    public var persistentRef: [UInt8]?
    /// A match of a ``ItemQuery/listsLockedItems`` search whose class key is locked away: only its
    /// class and persistent reference are given (no attributes, no data).
    public var locked = false
    /// With ``ItemQuery/reportsAccessState``: reading this item's secret now would need the person
    /// (its access control is not satisfied by what the caller holds).
    public var needsAuthentication = false

    /// Makes a result.
    public init(itemClass: ItemClass, attributes: Attributes? = nil, data: SecureBytes? = nil, persistentRef: [UInt8]? = nil,
                locked: Bool = false) {
        self.itemClass = itemClass
        self.attributes = attributes
        self.data = data
        self.persistentRef = persistentRef
        self.locked = locked
    }
}
