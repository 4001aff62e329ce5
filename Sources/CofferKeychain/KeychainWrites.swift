public import CofferCrypto
import CofferKeybag
public import CofferModel
import CofferStore
import CofferSystem

// SecItemAdd (and restore), SecItemUpdate, SecItemDelete and their write transaction.
extension Keychain {
    // MARK: SecItemAdd

    /// Adds an item (SecItemAdd) to its `agrp`, or to `scope`'s default group. errSecDuplicateItem if
    /// its class's primary key exists (`agrp` is part of it), errSecMissingEntitlement if its group is
    /// outside `scope`, errSecInteractionNotAllowed if its class key is locked, errSecNotAvailable for
    /// WhenPasscodeSetThisDeviceOnly with no passcode, errSecParam for bad attributes.
    @discardableResult
    public func add(_ item: NewItem, scope: AccessScope, returnData: Bool = false, returnAttributes: Bool = false,
                    returnPersistentRef: Bool = false, applicationPassword: SecureBytes? = nil) throws(SecError) -> ItemResult {
        try Validation.check(item.attributes, for: item.itemClass, writing: true)
        let (attrs, protection) = try completed(item.attributes, scope)
        let ref = Random.bytes(16)
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            let (content, otherTiers) = try unsafe item.secret.withUnsafeBytes { s throws(SecError) in
                try unsafe seal(itemClass: item.itemClass, attributes: attrs, secret: s, protection: protection, ref: ref,
                         applicationPassword: applicationPassword)
            }
            // The row and its index entries commit together (one transaction) or not at all.
            try writing(store) { () throws(SecError) in
                try checkNoDuplicate(store, otherTiers, except: nil)
                _ = try store.insert(content)
                try notePendingSync(store, item.itemClass, attrs)
            }
            return unsafe ItemResult(itemClass: item.itemClass,
                              attributes: returnAttributes ? attrs : nil,
                              data: returnData ? SecureBytes(copying: item.secret.withUnsafeBytes { unsafe $0 }) : nil,
                              persistentRef: returnPersistentRef ? ref : nil)
        }
    }

    /// Adds many items in one transaction: all of them or none (imports, restores).
    public func add(contentsOf items: [NewItem], scope: AccessScope) throws(SecError) {
        var prepared: [(NewItem, Attributes, ProtectionClass)] = []
        for item in items {
            try Validation.check(item.attributes, for: item.itemClass, writing: true)
            let (attrs, protection) = try completed(item.attributes, scope)
            prepared.append((item, attrs, protection))
        }
        try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            try writing(store) { () throws(SecError) in
                for (item, attrs, protection) in prepared {
                    let (content, otherTiers) = try unsafe item.secret.withUnsafeBytes { s throws(SecError) in
                        try unsafe seal(itemClass: item.itemClass, attributes: attrs, secret: s, protection: protection, ref: Random.bytes(16))
                    }
                    try checkNoDuplicate(store, otherTiers, except: nil)
                    try store.insert(content)
                    try notePendingSync(store, item.itemClass, attrs)
                }
            }
        }
    }

    /// Restores items from a backup in one transaction (all of them or none): an item whose primary key
    /// is already present is kept as it is and the backup's copy counted as a duplicate (the documented
    /// policy). `dryRun` does the same work and rolls it back: what a restore would do, changing nothing.
    public func restore(_ items: [NewItem], dryRun: Bool) throws(SecError) -> (added: Int, duplicates: Int) {
        let r = try restore(items, directories: [], dryRun: dryRun)
        return (r.added, r.duplicates)
    }

    /// Restores `items` and the protected directories `directories` in one transaction: a directory
    /// whose path is already recorded is kept as it is and counted as a duplicate. Returns the records
    /// of the directories restored.
    func restore(_ items: [NewItem], directories: [RestoredDirectory], dryRun: Bool) throws(SecError)
        -> (added: Int, duplicates: Int, directories: [FileKeyRecord]) {
        var prepared: [(NewItem, Attributes, ProtectionClass)] = []
        for item in items {
            try Validation.check(item.attributes, for: item.itemClass, writing: true)
            let (attrs, protection) = try completed(item.attributes, .unrestricted)
            prepared.append((item, attrs, protection))
        }
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            // Wrapped under the class keys inside the lock: a passcode change (a rekey of the class keys)
            // cannot slip between the wrap and the insert and leave a key wrapped under the old class key.
            var directoryRows: [ItemStore.FileKeyRow] = []
            for d in directories {
                directoryRows.append(try fileKeyRow(path: d.path, protection: d.protection, identifier: d.identifier, key: d.key))
            }
            var added = 0, duplicates = 0
            var restoredDirectories: [FileKeyRecord] = []
            do throws(SecError) {
                try writing(store) { () throws(SecError) in
                    let recorded = Set(try store.fileKeys().map(\.path))
                    for row in directoryRows {
                        if recorded.contains(row.path) {
                            duplicates += 1
                            continue
                        }
                        try store.insertFileKey(row)
                        restoredDirectories.append(FileKeyRecord(path: String(decoding: row.path, as: UTF8.self),
                                                                 protection: FileProtection(rawValue: row.fileClass)!,
                                                                 identifier: row.identifier, version: row.wrapped.first ?? 0))
                        added += 1
                    }
                    for (item, attrs, protection) in prepared {
                        let (content, otherTiers) = try unsafe item.secret.withUnsafeBytes { s throws(SecError) in
                            try unsafe seal(itemClass: item.itemClass, attributes: attrs, secret: s, protection: protection, ref: Random.bytes(16))
                        }
                        if try store.rowID(primaryKey: content.primaryKeyHash) != nil {
                            duplicates += 1
                            continue
                        }
                        do throws(SecError) {
                            try checkNoDuplicate(store, otherTiers, except: nil)
                        } catch {
                            duplicates += 1
                            continue
                        }
                        _ = try store.insert(content)
                        try notePendingSync(store, item.itemClass, attrs)
                        added += 1
                    }
                    if dryRun { throw SecError(.userCanceled, "dry run") }
                }
            } catch {
                // A dry run rolls back on purpose; anything else is a failure (nothing was written).
                guard dryRun && error.status == .userCanceled && error.message == "dry run" else { throw error }
                restoredDirectories = []
            }
            return (added, duplicates, restoredDirectories)
        }
    }

    /// Fills in the defaults an added item gets: protection, access group, sync, dates; checks the group is in scope.
    private func completed(_ given: Attributes, _ scope: AccessScope) throws(SecError) -> (Attributes, ProtectionClass) {
        var attrs = given
        let given = try Validation.protection(of: attrs)
        var protection = given ?? .defaultForNewItems
        if try Validation.accessControl(of: attrs) != nil {
            // An item with an access control needs a passcode (the seeds' WhenPasscodeSet rule: without
            // one there is nobody to authenticate) and never leaves this device.
            guard keybag.isPasscodeSet else {
                throw .notAvailable("an item with an access control needs a passcode; set one with 'coffer passcode set'")
            }
            if let given, !given.isThisDeviceOnly {
                throw .param("an item with an access control must be ThisDeviceOnly (it never goes into a backup)")
            }
            protection = given ?? .whenUnlockedThisDeviceOnly
        }
        attrs["pdmn"] = .string(protection.shortCode)
        if attrs["agrp"] == nil { attrs["agrp"] = .string(scope.defaultGroup) }
        try Validation.checkEntitled(attrs, in: scope)
        if attrs["sync"] == nil { attrs["sync"] = .bool(false) }
        let now = AttributeValue.date(Self.now())
        attrs["cdat"] = now
        attrs["mdat"] = now
        return (attrs, protection)
    }

    // MARK: SecItemUpdate

    /// Updates every matching item (SecItemUpdate); returns how many. A new `pdmn` re-wraps the item
    /// under that class; otherwise its protection is kept. All changes commit together or none do.
    /// Items outside `scope` are invisible; moving items to a group outside it is errSecMissingEntitlement.
    /// `touched` hears, while the changes are written, each changed item's access group (and the
    /// group it moved to): called again for the same group, and for the writes of a transaction that
    /// then fails (the caller counts them only once the update returns).
    @discardableResult
    public func update(_ query: ItemQuery, _ changes: ItemChanges, scope: AccessScope,
                       authorization: AuthorizationContext = .none, touched: (String) -> Void = { _ in }) throws(SecError) -> Int {
        var changes = changes
        let clearsGeneral = changes.attributes[GeneralAttributes.noneKey] == .string("")
        if clearsGeneral { changes.attributes.removeValue(forKey: GeneralAttributes.noneKey) }
        try Validation.check(query)
        try Validation.checkEntitled(query.attributes, in: scope)
        try Validation.check(changes.attributes, for: nil, writing: true)
        if changes.attributes[AccessControl.attributeName] != nil {
            throw .param("an item's access control (accc) cannot be changed; delete the item and add it again")
        }
        guard !changes.attributes.isEmpty || changes.secret != nil || clearsGeneral else { throw .param("nothing to update") }
        try Validation.checkEntitled(changes.attributes, in: scope)
        let newProtection = try Validation.protection(of: changes.attributes)
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            try keybag.checkUnchanged() // before matching: rows re-sealed elsewhere would not even be found
            var matches: [(StoredRow, ItemClass, Attributes)] = []
            let complete = try forEachMatch(store, query, scope, limit: nil) { (row, cls, attrs) throws(SecError) in matches.append((row, cls, attrs)) }
            // An update acts on every match: not on some while others may sit in a tier not searchable.
            guard complete, !matches.isEmpty else { throw Self.notFound(complete) }
            // Every match's rule before anything is written, so that an authentication-needed answer
            // names them all (the agent asks once, then updates).
            var needs = Requirements(operation: .update, authorization: authorization)
            for (_, cls, old) in matches {
                try Validation.check(changes.attributes, for: cls, writing: true)
                if cls == .key, KeyItem.isNonExtractable(old) { try Self.checkKeyChanges(changes, newProtection) }
                _ = try needs.admit(old)
            }
            try needs.throwIfUnsatisfied()
            return try writing(store) { () throws(SecError) in
                for (row, cls, old) in matches {
                    try Validation.check(changes.attributes, for: cls, writing: true)
                    try Self.checkAuthorized(old, .update, authorization)
                    let oldProtection = ProtectionClass(rawValue: row.protectionClass)!
                    // The protection class of an item with an access control is part of that control (as
                    // on iOS, where kSecAttrAccessControl carries it): changing it with the update right
                    // alone could move the secret to a class the device key opens offline, around a read
                    // rule that asks for biometry or the passcode.
                    if old[AccessControl.attributeName] != nil, let p = newProtection, p != oldProtection {
                        throw .param("the protection class (pdmn) of an item with an access control cannot be changed; delete the item and add it again")
                    }
                    // General attributes are replaced as a set (as the Secret Service's Attributes
                    // property is): an update naming any of them leaves the item exactly those.
                    let replacesGeneral = clearsGeneral || changes.attributes.keys.contains(where: GeneralAttributes.isGeneral)
                    let base = replacesGeneral ? old.withoutGeneralAttributes : old
                    var attrs = base.merging(changes.attributes) { $1 }
                    attrs["mdat"] = .date(Self.now())
                    let protection = newProtection ?? oldProtection
                    attrs["pdmn"] = .string(protection.shortCode)
                    let secret: SecureBytes
                    if let s = changes.secret {
                        try proveApplicationPassword(row, cls, old, .update, authorization)
                        secret = s
                    } else {
                        secret = try openSecret(row, cls, old, authorization)
                    }
                    let (content, otherTiers) = try unsafe secret.withUnsafeBytes { s throws(SecError) in
                        try unsafe seal(itemClass: cls, attributes: attrs, secret: s, protection: protection, ref: row.persistentRef,
                                 applicationPassword: authorization.applicationPassword)
                    }
                    try store.replace(id: row.id, with: content)
                    try checkNoDuplicate(store, otherTiers, except: row.id)
                    // Both versions: a changed primary key or `sync` turned off is a deletion of the old one.
                    try notePendingSync(store, cls, old)
                    try notePendingSync(store, cls, attrs)
                    for version in [old, attrs] { if let g = version.accessGroup { touched(g) } }
                }
                return matches.count
            }
        }
    }

    /// What an UPDATE may not do to a non-extractable key: replace its private half, change what the
    /// agent set when it made the key (its type, size, public half, `extr`), or move it to a class that
    /// goes into backups (it would leave the device that way).
    private static func checkKeyChanges(_ changes: ItemChanges, _ newProtection: ProtectionClass?) throws(SecError) {
        if changes.secret != nil { throw .param("a non-extractable key's private half cannot be replaced; create another key") }
        if let name = changes.attributes.keys.sorted().first(where: { KeyItem.agentSet.contains($0) }) {
            throw .param("attribute '\(name)' of a non-extractable key is set by the agent and cannot be changed")
        }
        if let p = newProtection, !p.isThisDeviceOnly {
            throw .param("a non-extractable key stays in a ThisDeviceOnly class (it never goes into a backup)")
        }
    }

    // MARK: SecItemDelete

    /// Deletes every matching item (SecItemDelete); returns how many. Items outside `scope` are invisible.
    /// `touched` hears each deleted item's access group, as in ``update(_:_:scope:authorization:touched:)``.
    @discardableResult
    public func delete(_ query: ItemQuery, scope: AccessScope,
                       authorization: AuthorizationContext = .none, touched: (String) -> Void = { _ in }) throws(SecError) -> Int {
        try Validation.check(query)
        try Validation.checkEntitled(query.attributes, in: scope)
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            try keybag.checkUnchanged() // before matching, as in an update
            var ids: [Int64] = []
            var refs: [[UInt8]] = []
            var deleted: [(ItemClass, Attributes)] = []
            var needs = Requirements(operation: .delete, authorization: authorization)
            let complete = try forEachMatch(store, query, scope, limit: nil) { (row, cls, attrs) throws(SecError) in
                guard try needs.admit(attrs) else { return }
                try proveApplicationPassword(row, cls, attrs, .delete, authorization)
                ids.append(row.id)
                refs.append(row.persistentRef)
                deleted.append((cls, attrs))
            }
            try needs.throwIfUnsatisfied()
            // A delete acts on every match: not on some while others may sit in a tier not searchable.
            guard complete, !ids.isEmpty else { throw Self.notFound(complete) }
            try writing(store) { () throws(SecError) in
                for id in ids { try store.delete(id: id) }
                for (cls, attrs) in deleted {
                    try notePendingSync(store, cls, attrs)
                    if let g = attrs.accessGroup { touched(g) }
                }
            }
            appPasswordAttempts.forget(refs: refs)
            return ids.count
        }
    }

    // MARK: Internals (hold the keychain mutex: `store` comes from its state)

    /// A write transaction, refused first (errSecNotAvailable) if the keybag files changed under this
    /// process: its keys in memory may have been rotated elsewhere, and what it sealed now would be lost.
    func writing<R>(_ store: ItemStore, _ body: () throws(SecError) -> R) throws(SecError) -> R {
        try keybag.checkUnchanged()
        let r = try store.transaction(body)
        if let rollback {
            rollback.markDirty()
            if rollback.due(now: Self.now()) { flushRollback(store) }
        }
        return r
    }

    /// errSecDuplicateItem if a row other than `except` has one of `primaryKeys` (the item's primary-key
    /// hash under the index tiers other than its own; its own tier is the UNIQUE constraint's).
    ///
    /// Limit: in boot state only tier D is in memory, so an Always item added then cannot be compared
    /// with passcode-tier rows (a later unlock does not detect that pair either; both rows stay readable).
    func checkNoDuplicate(_ store: ItemStore, _ primaryKeys: [[UInt8]], except: Int64?) throws(SecError) {
        for pk in primaryKeys {
            if let id = try store.rowID(primaryKey: pk), id != except { throw .duplicateItem() }
        }
    }
}
