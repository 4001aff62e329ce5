import CofferModel

/// Checks attribute dictionaries and queries before anything touches keys or storage.
enum Validation {
    /// Longest string attribute accepted (bytes).
    static let maxStringBytes = 4096

    /// Checks names, kinds and class applicability; `writing` also refuses read-only attributes.
    static func check(_ attrs: Attributes, for cls: ItemClass?, writing: Bool) throws(SecError) {
        guard attrs.count <= AttributeCodec.maxCount else { throw .param("too many attributes") }
        // Messages name attributes only by their catalog names (constants of this program, never bytes
        // from the caller): an unknown name is not quoted, nor its length, nor any value.
        try checkGeneral(attrs)
        for (name, value) in attrs where !GeneralAttributes.isGeneral(name) {
            guard let kind = AttributeCatalog.kinds[name] else { throw .param("unknown attribute name (not in the attribute catalog, and not a general attribute: those start with @)") }
            guard value.kind == kind else { throw .param("attribute '\(name)' must be a \(kind.rawValue), not a \(value.kind.rawValue)") }
            if writing, AttributeCatalog.readOnly.contains(name) { throw .param("attribute '\(name)' is set by the keychain") }
            if let cls, !cls.allowedAttributes.contains(name) {
                throw .param("attribute '\(name)' does not apply to \(cls.rawValue) items")
            }
            switch value {
            case .integer(let n) where name == KeyItem.reuseAttribute && !(0...Int64(AuthenticationOptions.maximumReuseSeconds)).contains(n):
                throw .param("attribute '\(name)' is a number of seconds from 0 to \(AuthenticationOptions.maximumReuseSeconds)")
            case .string(let s) where s.utf8.count > maxStringBytes: throw .param("attribute '\(name)' is too long")
            case .data(let d) where d.count > AttributeCodec.maxValueBytes: throw .param("attribute '\(name)' is too long")
            default: break
            }
        }
        _ = try protection(of: attrs)
    }

    /// The limits of general attributes (``GeneralAttributes``), in an item or a query: each a string
    /// with a valid name and a value of at most ``GeneralAttributes/maxValueBytes``, at most
    /// ``GeneralAttributes/maxCount`` of them holding at most ``GeneralAttributes/maxTotalBytes``
    /// together. errSecParam naming the limit, never the caller's name or value.
    static func checkGeneral(_ attrs: Attributes) throws(SecError) {
        var count = 0, total = 0
        for (key, value) in attrs {
            guard let name = GeneralAttributes.name(ofKey: key) else { continue }
            guard GeneralAttributes.isValidName(name) else {
                throw .param("a general attribute's name must be 1 to \(GeneralAttributes.maxNameBytes) bytes of UTF-8 after the @, without control characters")
            }
            guard case .string(let s) = value else { throw .param("a general attribute's value must be a string") }
            guard s.utf8.count <= GeneralAttributes.maxValueBytes else {
                throw .param("a general attribute's value is too long (the limit is \(GeneralAttributes.maxValueBytes) bytes)")
            }
            count += 1
            total += name.utf8.count + s.utf8.count
        }
        guard count <= GeneralAttributes.maxCount else { throw .param("too many general attributes (the limit is \(GeneralAttributes.maxCount))") }
        guard total <= GeneralAttributes.maxTotalBytes else {
            throw .param("the general attributes are too large together (the limit is \(GeneralAttributes.maxTotalBytes) bytes of names and values)")
        }
    }

    /// Checks a query's attributes and options.
    static func check(_ q: ItemQuery) throws(SecError) {
        try check(q.attributes, for: q.itemClass, writing: false)
        if q.attributes[AccessControl.attributeName] != nil { throw .param("an access control (accc) cannot be searched for") }
        if case .count(let n) = q.limit, n < 1 { throw .param("kSecMatchLimit must be at least 1") }
        if let r = q.persistentRef {
            guard !r.isEmpty, r.count % 16 == 0, r.count / 16 <= ItemQuery.maximumPersistentRefs else {
                throw .param("a persistent reference is 16 bytes (several: at most \(ItemQuery.maximumPersistentRefs), one after the other)")
            }
            let refs = q.persistentRefs
            if Set(refs).count != refs.count { throw .param("a persistent reference is named twice") }
        }
        if q.listsLockedItems {
            // A locked match is told by its blind-index entries alone: every attribute must have one.
            guard q.itemClass != nil, q.returnPersistentRef else {
                throw .param("a search naming locked matches must name the item class and return persistent references")
            }
            guard !q.skipUnreadable else { throw .param("a search naming locked matches cannot also skip unreadable items") }
            if let name = q.attributes.keys.sorted().first(where: { $0 != "pdmn" && !AttributeCatalog.isIndexed($0) }) {
                throw .param("a search naming locked matches can only use indexed attributes (not \(name))")
            }
        }
    }

    /// The access control an added item carries (`accc`), checked: a canonical encoding, and a
    /// domain state for biometryCurrentSet (the agent records the enrolled set's). Nil without one.
    static func accessControl(of attrs: Attributes) throws(SecError) -> AccessControl? {
        guard let v = attrs[AccessControl.attributeName] else { return nil }
        guard case .data(let bytes) = v, let acl = AccessControl(encoded: bytes) else {
            throw .param("malformed access control (accc)")
        }
        if acl.factors.contains(.biometryCurrentSet) && acl.domainState.isEmpty {
            throw .param("biometry-current-set needs the enrolled set's domain state (the agent records it)")
        }
        if acl.factors.contains(.applicationPassword) && acl.factors.count > 1 && acl.combination == .or {
            // The password wraps the item's key: no other factor could open it instead.
            throw .param("application-password can only be combined with other factors by ,and,")
        }
        return acl
    }

    /// The protection class named by `pdmn`, if any.
    static func protection(of attrs: Attributes) throws(SecError) -> ProtectionClass? {
        guard let v = attrs["pdmn"] else { return nil }
        guard case .string(let s) = v, let c = ProtectionClass(parsing: s) else {
            throw .param("unknown accessibility (pdmn) value")
        }
        return c
    }

    /// errSecMissingEntitlement if `attrs` names an access group (`agrp`) outside `scope` (names the
    /// attribute, never its value).
    static func checkEntitled(_ attrs: Attributes, in scope: AccessScope) throws(SecError) {
        guard let group = attrs.accessGroup, !scope.contains(group) else { return }
        throw SecError(.missingEntitlement, "the access group (agrp) is not one of this caller's access groups")
    }
}
