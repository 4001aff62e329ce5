import CSDBus
import CofferClient
import CofferCrypto
import CofferModel
import CofferSecretServiceCrypto
import CofferSystem
import Glibc

/// Secret Service items and the small record items (collections, aliases) as the keychain holds
/// them: the queries on the caller's delegated agent connection, the listings kept while nothing
/// changed, and the keybag's lock state as the front end knows it.
extension SecretServiceFrontEnd {
    // MARK: Keychain records

    /// A Secret Service item as the keychain holds it.
    struct Record {
        /// The collection as the caller names it (``Caller/visible(group:_:)``), and as the item holds it.
        let collection: String
        var stored: String
        let id: String
        let label: String
        /// The caller's attributes (without the reserved ones).
        let attributes: [String: String]
        let contentType: String
        let created: UInt64
        let modified: UInt64
        let protection: ProtectionClass
        /// The item's access control in the CLI's `--access-control` form (one made through the
        /// native API), or nil. Such an item is locked: its secret is read only through a prompt.
        var accessControl: String? = nil
        /// Reading its secret now would need the person: the agent tells it per match (the access-state
        /// flag), from the item's control and what the caller's process holds (a prompt's grant among
        /// it). An item found without that flag, with a control, counts as needing the person.
        /// This is the item's `Locked` on the bus: the front end derives nothing from the item's class
        /// and the lock state. A match whose class key is locked away has no record (the agent names
        /// it by reference: ``search(_:collection:attributes:)``), and a record stands only while no
        /// lock state was posted since its search (``ChangeMark``) or comes from the agent now.
        var needsAuthentication = false
        /// The path the caller named the item by, when that is its reference path (``referencePrefix``).
        var alias: String? = nil
        /// The item's persistent reference, when the search that found it asked for it.
        var ref: [UInt8]? = nil
        var path: String { alias ?? itemPath }
        /// The item's path in its collection, made once (a bulk read names each item several times).
        let itemPath: String

        /// A `session` collection item (never locked: it is in the front end's memory, not the keybag's care).
        init(session item: SessionItem, id: String) {
            collection = SecretServiceFrontEnd.sessionCollection
            stored = collection
            self.id = id
            itemPath = SecretServiceFrontEnd.itemPath(collection: collection, id: id)
            label = item.label
            attributes = item.attributes
            contentType = item.contentType
            created = item.created
            modified = item.modified
            protection = .always
        }

        /// The record of a search result that carried its attributes (and the agent's access state).
        init?(_ r: ItemResult, for c: Caller) {
            guard let a = r.attributes else { return nil }
            self.init(a, for: c)
            needsAuthentication = r.needsAuthentication
        }

        init?(_ a: Attributes, for c: Caller) {
            // Only items made through the Secret Service have a path: a collection and a random id.
            let general = a.generalAttributes
            guard case .string(let id)? = a["acct"], SecretServiceFrontEnd.isItemID(id[...]), let stored = general["coffer:collection"],
                  !stored.isEmpty else { return nil }
            let group = a.accessGroup ?? c.group
            guard let collection = c.visible(group: group, stored) else { return nil }
            self.id = id
            self.collection = collection
            self.stored = stored
            itemPath = SecretServiceFrontEnd.itemPath(collection: collection, id: id)
            contentType = general["coffer:content-type"] ?? SecretServiceFrontEnd.defaultContentType
            attributes = general.filter { !$0.key.hasPrefix(SecretServiceFrontEnd.reservedPrefix) }
            if case .string(let l)? = a["labl"] { label = l } else { label = "" }
            created = Self.seconds(a["cdat"])
            modified = Self.seconds(a["mdat"])
            if case .string(let p)? = a["pdmn"], let c = ProtectionClass(parsing: p) { protection = c } else { protection = .defaultForNewItems }
            if let v = a[AccessControl.attributeName] {
                // An access control the front end cannot decode still guards the item.
                if case .data(let b) = v, let acl = AccessControl(encoded: b) { accessControl = acl.description } else { accessControl = "?" }
                needsAuthentication = true
            }
        }

        static func seconds(_ v: AttributeValue?) -> UInt64 {
            if case .date(let d)? = v, d > 0 { return UInt64(d) }
            return 0
        }

        /// Every general attribute the item must keep on an update that names general attributes
        /// (such an update replaces the whole set).
        func general(attributes: [String: String]? = nil, contentType: String? = nil) -> Attributes {
            var out: Attributes = [SecretServiceFrontEnd.collectionKey: .string(stored),
                                   SecretServiceFrontEnd.contentTypeKey: .string(contentType ?? self.contentType)]
            for (k, v) in attributes ?? self.attributes { out[GeneralAttributes.key(k)] = .string(v) }
            return out
        }
    }

    /// Refuses reserved names (`coffer:…`); the agent checks the rest of the general attributes' limits.
    static func callerAttributes(_ pairs: [String: String]) throws(BusError) -> Attributes {
        guard pairs.count <= maximumAttributes else {
            throw BusError(name: BusError.invalidArgs, message: "an item has at most \(maximumAttributes) attributes")
        }
        var out: Attributes = [:]
        for (k, v) in pairs {
            guard !k.hasPrefix(reservedPrefix) else {
                throw BusError(name: BusError.invalidArgs, message: "attribute names beginning \(reservedPrefix) are reserved")
            }
            guard GeneralAttributes.isValidName(k) else {
                throw BusError(name: BusError.invalidArgs,
                               message: "an attribute name must be 1 to \(GeneralAttributes.maxNameBytes) bytes without control characters")
            }
            out[GeneralAttributes.key(k)] = .string(v)
        }
        return out
    }

    func itemQuery(_ c: Caller, collection: String? = nil, id: String? = nil, attributes: Attributes = [:],
                   returnData: Bool = false) -> ItemQuery {
        var a = attributes
        a["svce"] = .string(Self.itemService)
        // Without a collection every group of the caller's is searched (Record leaves out what it cannot reach).
        if let collection {
            let (group, name) = c.location(collection)
            a["agrp"] = .string(group)
            a[Self.collectionKey] = .string(name)
        } else if c.peer.groups.count == 1 {
            a["agrp"] = .string(c.group)
        }
        if let id { a["acct"] = .string(id) }
        var q = ItemQuery(itemClass: .genericPassword, attributes: a, limit: id == nil ? .all : .one, returnData: returnData,
                          returnAttributes: true)
        // Whether each match needs the person is the agent's to say (its control, the caller's grants);
        // an agent older than protocol 3 cannot, and its items with a control read as locked.
        q.reportsAccessState = c.agent.grantsPromptReads
        return q
    }

    /// The caller's `session` collection items that have every general attribute of `attributes`, oldest first.
    func sessionMatches(_ c: Caller, attributes: Attributes) -> [Record] {
        let wanted = attributes.generalAttributes
        return (sessionItems[c.group] ?? [:]).filter { _, item in wanted.allSatisfy { item.attributes[$0.key] == $0.value } }
            .sorted { ($0.value.created, $0.key) < ($1.value.created, $1.key) }.map { Record(session: $0.value, id: $0.key) }
    }

    func items(_ c: Caller, collection: String? = nil, attributes: Attributes = [:]) throws(BusError) -> [Record] {
        let inMemory = sessionMatches(c, attributes: attributes)
        if collection == Self.sessionCollection { return inMemory }
        if collection == nil { return try keychainItems(c, attributes: attributes) + inMemory }
        return try keychainItems(c, collection: collection, attributes: attributes)
    }

    func keychainItems(_ c: Caller, collection: String? = nil, attributes: Attributes) throws(BusError) -> [Record] {
        do {
            return try c.agent.copyMatching(itemQuery(c, collection: collection, attributes: attributes)).compactMap { Record($0, for: c) }
        } catch where error.status == .itemNotFound {
            return []
        } catch {
            throw Self.busError(error)
        }
    }

    /// A SearchItems: the caller's matching items, and the reference paths of the matches whose class
    /// key is locked away (the agent names them by persistent reference: WireProtocol.md, Locked
    /// matches by reference), so a locked keychain answers with locked paths a client can unlock.
    func search(_ c: Caller, collection: String? = nil, attributes: Attributes) throws(BusError) -> (open: [Record], locked: [String]) {
        let inMemory = sessionMatches(c, attributes: attributes)
        if !inMemory.isEmpty && (collection == nil || collection == Self.sessionCollection) { noteSessionAccess(c, .find) }
        if collection == Self.sessionCollection { return (inMemory, []) }
        var q = itemQuery(c, collection: collection, attributes: attributes)
        q.listsLockedItems = true
        q.returnPersistentRef = true
        let results: [ItemResult]
        do {
            results = try c.agent.copyMatching(q)
        } catch where error.status == .itemNotFound {
            results = []
        } catch {
            throw Self.busError(error)
        }
        var open: [Record] = [], locked: [String] = []
        for r in results {
            if r.locked, let ref = r.persistentRef {
                locked.append(Self.referencePath(ref))
            } else if var record = Record(r, for: c) {
                record.ref = r.persistentRef
                open.append(record)
            }
        }
        for path in locked where c.peer.lockedShown.count < Self.maxLockedShown { c.peer.lockedShown.insert(path) }
        return (open + (collection == nil ? inMemory : []), locked)
    }

    /// The query reading the item at `path` (a collection's item or a reference), for the caller.
    func itemQuery(_ c: Caller, path: String, returnData: Bool = false) throws(BusError) -> ItemQuery {
        switch Self.parse(path) {
        case .item(let collection, let id)?:
            return itemQuery(c, collection: collection, id: id, returnData: returnData)
        case .reference(let ref)?:
            var q = itemQuery(c, returnData: returnData)
            q.persistentRef = ref
            q.limit = .one
            return q
        default:
            throw BusError(name: BusError.noSuchObject, message: "\(path) is not an item")
        }
    }

    /// The item at `path` for the caller, with its secret when `withSecret`.
    func item(_ c: Caller, _ path: String, withSecret: Bool = false) throws(BusError) -> (Record, SecureBytes?) {
        if case .item(let collection, let id)? = Self.parse(path), collection == Self.sessionCollection {
            guard let i = sessionItems[c.group]?[id] else { throw BusError(name: BusError.noSuchObject, message: "no item \(path)") }
            if withSecret { noteSessionAccess(c, .get) }
            return (Record(session: i, id: id), withSecret ? i.secret.slice(0..<i.secret.count) : nil)
        }
        let query = try itemQuery(c, path: path, returnData: withSecret)
        let found = try agentCall { () throws(SecError) in try c.agent.copyMatching(query) }
        guard let first = found.first, var r = Record(first, for: c) else {
            found.first?.data?.wipe()
            throw BusError(name: BusError.noSuchObject, message: "no item \(path)")
        }
        if case .reference? = Self.parse(path) { r.alias = path }
        return (r, first.data)
    }

    /// The record of the item at `path` as the sender's last search found it, if it did and nothing
    /// changed since as far as the front end knows (``changeMark()``).
    func searchedRecord(_ c: Caller, _ path: String) -> Record? {
        guard let last = c.peer.lastSearch, let ref = last.refByPath[path], let mark = last.mark, mark == changeMark() else { return nil }
        return last.byRef[ref]
    }

    /// ``searchedRecord(_:_:)`` where the answer is whether the item is locked (the agent's answer in
    /// that search, which a lock state posted since voids): nil also while a lock event waits unread
    /// (``PromptCompletions/watchIsBehind``: the agent sends it before it answers the request that
    /// locked), so the item is asked of the agent instead.
    func searchedRecordForLockState(_ c: Caller, _ path: String) -> Record? {
        // Behind first, then the change mark (``PromptCompletions/watchIsBehind`` says why).
        guard !completions.watchIsBehind else { return nil }
        return searchedRecord(c, path)
    }

    /// A small record item (a collection's or an alias's): its service, account and group (the
    /// caller's default one unless given).
    func recordQuery(_ c: Caller, service: String, account: String?, group: String? = nil) -> ItemQuery {
        var a: Attributes = ["svce": .string(service), "agrp": .string(group ?? c.group)]
        if let account { a["acct"] = .string(account) }
        return ItemQuery(itemClass: .genericPassword, attributes: a, limit: account == nil ? .all : .one, returnAttributes: true)
    }

    func records(_ c: Caller, service: String, account: String? = nil, group: String? = nil) throws(BusError) -> [Attributes] {
        let listing = ListingKey(group: group ?? c.group, service: service)
        let mark = recordsMark(group: listing.group)
        if let mark, let known = recordListings[listing], known.mark == mark {
            guard let account else { return known.records }
            return known.records.filter { $0["acct"] == .string(account) }
        }
        let found: [Attributes]
        do {
            found = try c.agent.copyMatching(recordQuery(c, service: service, account: account, group: group)).compactMap(\.attributes)
        } catch where error.status == .itemNotFound {
            found = []
        } catch {
            throw Self.busError(error)
        }
        // A whole listing is kept for the next caller of the group while nothing may have changed it.
        if account == nil, let mark, mark == recordsMark(group: listing.group) {
            if recordListings.count >= Self.maxRecordListings { recordListings.removeAll() }
            recordListings[listing] = RecordListing(records: found, mark: mark)
        }
        return found
    }

    /// How many groups' record listings are kept at most.
    static let maxRecordListings = 256

    /// What a record listing (a group's collections or aliases) rests on: the watch's connection, the
    /// item changes it heard in the group that were not the front end's own writes (nor any that named
    /// no group), and the front end's own record writes. Nil (nothing kept) without a watch of item
    /// changes that names groups. The front end's own other writes (an item stored through it) leave
    /// it as it is: the collections did not change. As with a search's reuse, "nothing changed" is as
    /// far as the front end knows: a change the agent has not yet told it of is not seen.
    func recordsMark(group: String) -> RecordsMark? {
        guard let (generation, heard) = completions.heardSoFar, generation == itemWatch.generation else { return nil }
        let own = ownWritesByGroup()
        let others = heard.byGroup[group, default: 0] - ((own.byGroup[group] ?? 0) - (itemWatch.ownAtStart.byGroup[group] ?? 0))
        return RecordsMark(generation: generation, others: others, anywhere: heard.anywhere, recordWrites: recordWrites)
    }

    /// Sets a record's attributes, adding the record if there is none. Record items are
    /// *AfterFirstUnlock*, so a collection's label and an alias stay readable while the keybag is locked.
    func putRecord(_ c: Caller, service: String, account: String, group: String? = nil, _ attributes: Attributes) throws(BusError) {
        recordWrites += 1
        let q = recordQuery(c, service: service, account: account, group: group)
        do {
            _ = try c.agent.update(q, ItemChanges(attributes: attributes))
        } catch where error.status == .itemNotFound {
            var a = attributes
            a["svce"] = .string(service)
            a["acct"] = .string(account)
            a["agrp"] = .string(group ?? c.group)
            a["pdmn"] = .string(ProtectionClass.afterFirstUnlock.shortCode)
            try agentCall { () throws(SecError) in _ = try c.agent.add(NewItem(itemClass: .genericPassword, attributes: a, secret: SecureBytes(count: 0))) }
        } catch {
            throw Self.busError(error)
        }
    }

    func deleteRecords(_ c: Caller, _ query: ItemQuery) throws(BusError) {
        recordWrites += 1
        do { _ = try c.agent.delete(query) } catch where error.status == .itemNotFound {} catch { throw Self.busError(error) }
    }

    /// The caller's persistent collections: `login`, those made by CreateCollection, then one for
    /// each of its other access groups (`group:G`).
    func collectionNames(_ c: Caller) throws(BusError) -> [String] {
        var names = [Self.loginCollection]
        for r in try records(_: c, service: Self.collectionService) {
            if case .string(let n)? = r["acct"], n != Self.loginCollection, n != Self.sessionCollection,
               !n.hasPrefix(Self.groupCollectionPrefix) { names.append(n) }
        }
        names += c.peer.groups.dropFirst().filter { $0 != c.group }.map { Self.groupCollectionPrefix + $0 }
        c.peer.shown.formUnion(names)
        return names + [Self.sessionCollection]
    }

    /// The collection `ref` names for the caller (an alias resolved), or NoSuchObject.
    func collection(_ c: Caller, _ path: String) throws(BusError) -> String {
        let name: String
        switch Self.parse(path) {
        case .collection(let n)?: name = n
        case .alias(let a)?:
            guard let n = try aliasTarget(c, a) else { throw BusError(name: BusError.noSuchObject, message: "no collection \(path)") }
            name = n
        default: throw BusError(name: BusError.noSuchObject, message: "\(path) is not a collection")
        }
        guard try collectionNames(c).contains(name) else { throw BusError(name: BusError.noSuchObject, message: "no collection \(path)") }
        return name
    }

    /// The collection an alias names: a set alias's record, else `login` for `default`.
    func aliasTarget(_ c: Caller, _ alias: String) throws(BusError) -> String? {
        if let r = try records(c, service: Self.aliasService, account: alias).first, case .string(let n)? = r[Self.collectionKey] { return n }
        return alias == "default" ? Self.loginCollection : nil
    }

    /// The keybag's lock state as the agent's lock events last told it (posted by the watch thread,
    /// announced or not yet); STATUS only before the watch has heard any: no call of a client costs a
    /// STATUS round trip otherwise. (The agent sends a lock event before it answers the request that
    /// locked or unlocked, so a client that saw `coffer unlock` return finds it here.)
    func lockState(_ c: Caller) throws(BusError) -> LockState {
        // Behind first, then what was posted (``PromptCompletions/watchIsBehind`` says why).
        if !completions.watchIsBehind, let posted = completions.current { return posted }
        return try freshLockState(c)
    }

    /// The lock state from the agent itself (STATUS): where a stale answer would ask the person for
    /// nothing (Unlock).
    func freshLockState(_ c: Caller) throws(BusError) -> LockState {
        try agentCall { () throws(SecError) in try c.agent.status().lockState }
    }

}
