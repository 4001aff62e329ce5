import CSecretServiceBus
import CofferClient
import CofferCrypto
import CofferModel
import CofferSecretServiceCrypto
import CofferSystem
import Glibc

/// The Secret Service's collections, items, searches, aliases and secrets (SecretServiceMapping.md),
/// every one a keychain operation on the sender's delegated agent connection: a Secret Service item
/// is a `genp` item (service `org.freedesktop.secrets`, a random account, its attributes general
/// attributes, its collection and content type reserved `coffer:` ones); a collection other than
/// `login` and an alias are small `genp` items of their own. Nothing here holds a key or a secret
/// beyond the call that carries it.
extension SecretServiceFrontEnd {
    static let collectionPrefix = "/org/freedesktop/secrets/collection"
    static let aliasPrefix = "/org/freedesktop/secrets/aliases"
    /// Items named by their persistent reference: what a search finds while the item's class key is
    /// locked away (its collection and id are sealed then).
    static let referencePrefix = "/org/freedesktop/secrets/item"
    static let promptPrefix = "/org/freedesktop/secrets/prompt"
    static let noPrompt = "/"
    static let serviceInterface = "org.freedesktop.Secret.Service"
    static let collectionInterface = "org.freedesktop.Secret.Collection"
    static let itemInterface = "org.freedesktop.Secret.Item"
    /// Coffer's own read-only item properties (`AccessControl`).
    static let cofferItemInterface = "io.coffer.Item"

    /// The keychain services of Secret Service items, collection records and alias records.
    static let itemService = "org.freedesktop.secrets"
    static let collectionService = "org.freedesktop.secrets.collection"
    static let aliasService = "org.freedesktop.secrets.alias"
    /// The collection every access group has, and what the `default` alias names unless set.
    static let loginCollection = "login"
    /// The collection in the front end's memory (per identity, gone when the front end exits).
    static let sessionCollection = "session"
    /// How many items one identity's `session` collection holds at most.
    static let sessionItemsPerIdentity = 1024
    /// Reserved general attributes (never taken from or shown to a caller).
    static let reservedPrefix = "coffer:"
    /// Most attributes a client gives one item (the agent's limit on general attributes leaves room
    /// for the two this front end adds: collection and content type).
    static let maximumAttributes = 128
    static let collectionKey = GeneralAttributes.key("coffer:collection")
    static let contentTypeKey = GeneralAttributes.key("coffer:content-type")
    static let defaultContentType = "text/plain"
    /// The collection of one of the caller's access groups other than its default one is named
    /// `group:` and the group (a name CreateCollection never makes): that group's `login` collection.
    static let groupCollectionPrefix = "group:"

    // MARK: Paths

    /// What an object path names.
    enum ObjectRef: Equatable {
        case collection(String)
        case alias(String)
        case item(collection: String, id: String)
        /// An item by its persistent reference (16 bytes).
        case reference([UInt8])
    }

    static func encode(_ prefix: String, _ name: String) -> String {
        guard let p = ssb_path_encode(prefix, name) else { return prefix + "/_" }
        defer { free(p) }
        return String(cString: p)
    }

    static func decode(_ path: String, _ prefix: String) -> String? {
        guard let p = ssb_path_decode(path, prefix) else { return nil }
        defer { free(p) }
        return String(cString: p)
    }

    static func collectionPath(_ name: String) -> String { encode(collectionPrefix, name) }
    static func itemPath(collection: String, id: String) -> String { collectionPath(collection) + "/" + id }
    static func referencePath(_ ref: [UInt8]) -> String { referencePrefix + "/" + Hex.encode(ref) }

    /// An item's identifier: its account, 32 lowercase hex digits (128 random bits).
    static func isItemID(_ s: Substring) -> Bool {
        s.utf8.count == 32 && s.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    static func parse(_ path: String) -> ObjectRef? {
        if path.hasPrefix(referencePrefix + "/") {
            // 32 lowercase hex digits, as an item id.
            return Hex.decodeLowercase(Array(path.utf8.dropFirst(referencePrefix.utf8.count + 1))[...], byteCount: 16).map(ObjectRef.reference)
        }
        for (prefix, isAlias) in [(collectionPrefix, false), (aliasPrefix, true)] where path.hasPrefix(prefix + "/") {
            let parts = path.dropFirst(prefix.count + 1).split(separator: "/", omittingEmptySubsequences: false)
            guard let name = decode(prefix + "/" + parts[0], prefix), !name.isEmpty else { return nil }
            if parts.count == 1 { return isAlias ? .alias(name) : .collection(name) }
            if parts.count == 2, !isAlias, isItemID(parts[1]) { return .item(collection: name, id: String(parts[1])) }
            return nil
        }
        return nil
    }

    /// Whether `path` may hold an object with `interface` (fallback vtables; whether it exists for
    /// the caller is the method's question, answered NoSuchObject when not). A call is taken for
    /// every path under the service's prefixes, however malformed, so that a call to an object that
    /// does not exist is answered `org.freedesktop.Secret.Error.NoSuchObject` as the specification
    /// asks, never sd-bus's `org.freedesktop.DBus.Error.UnknownObject` (which python-secretstorage
    /// 3.3, Debian 12's, does not read as "no such object"): a call to one of the service's object
    /// interfaces on any path is taken (the wall registers them on `/` too), and its handler answers
    /// NoSuchObject for a path that is not such an object.
    /// Introspection (`introspecting`) shows only what is there: collections and items by the shape
    /// of their paths (whether one exists for the caller takes the agent), prompts and sessions that
    /// exist (sessions are objects of their own; the session fallback shows nothing).
    /// True if `path` is under one of the prefixes whose objects this front end serves (collections,
    /// aliases, items by reference, prompts, sessions): there the prefix's own rule above decides.
    /// Any other path holds none of the service's objects: a call there is answered NoSuchObject.
    static func isServed(_ path: String) -> Bool {
        [collectionPrefix, aliasPrefix, referencePrefix, promptPrefix].contains { path.hasPrefix($0 + "/") } || path.hasPrefix(sessionPathPrefix)
    }

    func find(_ path: String, interface: String, introspecting: Bool) -> Bool {
        if introspecting {
            switch (Self.parse(path), interface) {
            case (.collection?, Self.collectionInterface), (.alias?, Self.collectionInterface), (.item?, Self.itemInterface),
                 (.item?, Self.cofferItemInterface), (.reference?, Self.itemInterface), (.reference?, Self.cofferItemInterface): return true
            case (_, "org.freedesktop.Secret.Prompt"): return prompts[path] != nil
            default: return false
            }
        }
        func depth(under prefix: String) -> Int? {
            guard path.hasPrefix(prefix + "/") else { return nil }
            return path.dropFirst(prefix.count + 1).split(separator: "/", omittingEmptySubsequences: false).count
        }
        let underCollections = depth(under: Self.collectionPrefix) ?? depth(under: Self.aliasPrefix)
        switch interface {
        case Self.collectionInterface: return underCollections == 1 || !Self.isServed(path)
        case Self.itemInterface, Self.cofferItemInterface:
            return (underCollections ?? 0) >= 2 || depth(under: Self.referencePrefix) != nil || !Self.isServed(path)
        case "org.freedesktop.Secret.Prompt": return depth(under: Self.promptPrefix) != nil || !Self.isServed(path)
        case "org.freedesktop.Secret.Session": return path.hasPrefix(Self.sessionPathPrefix) || !Self.isServed(path)
        default: return false
        }
    }

    // MARK: The caller

    /// The sender of a call, its delegated peer and its collections' group.
    struct Caller {
        let sender: String
        let peer: Peer
        var agent: AgentConnection { peer.agent }
        var group: String { peer.group }

        /// Where a collection the caller names lives: its access group and the collection's name
        /// there (`group:G` is group G's `login`).
        func location(_ collection: String) -> (group: String, name: String) {
            if collection.hasPrefix(SecretServiceFrontEnd.groupCollectionPrefix) {
                let g = String(collection.dropFirst(SecretServiceFrontEnd.groupCollectionPrefix.count))
                if g != group, peer.groups.contains(g) { return (g, SecretServiceFrontEnd.loginCollection) }
            }
            return (group, collection)
        }

        /// What the caller calls collection `name` of access group `g`; nil for one it cannot reach (a
        /// group not its own, or a collection other than `login` of a group other than its default one).
        func visible(group g: String, _ name: String) -> String? {
            if g == group { return name }
            guard name == SecretServiceFrontEnd.loginCollection, peer.groups.contains(g) else { return nil }
            return SecretServiceFrontEnd.groupCollectionPrefix + g
        }
    }

    /// The sender of call `m`; with no call (a property read for a signal), the sender the signal is
    /// addressed to (``emittingTo``), which is served already.
    func caller(_ m: OpaquePointer?) throws(BusError) -> Caller {
        if m == nil, let s = emittingTo, let peer = peers[s] { return Caller(sender: s, peer: peer) }
        guard let s = ssb_message_sender(m) else { throw BusError(name: BusError.failed, message: "no sender") }
        let sender = String(cString: s)
        return Caller(sender: sender, peer: try peer(for: sender))
    }

    /// The D-Bus error for a keychain answer (the article's table).
    static func busError(_ e: SecError) -> BusError {
        let name: String
        switch e.status {
        case .itemNotFound: name = BusError.noSuchObject
        case .interactionNotAllowed, .notAvailable: name = BusError.isLocked
        case .param: name = BusError.invalidArgs
        case .missingEntitlement: name = BusError.accessDenied
        default: name = BusError.failed
        }
        return BusError(name: name, message: "\(e.status.name) (\(e.status.rawValue)): \(e.message)")
    }

    func agentCall<R>(_ body: () throws(SecError) -> R) throws(BusError) -> R {
        do { return try body() } catch { throw Self.busError(error) }
    }

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
        guard let last = c.peer.lastSearch, last.paths.contains(path), let mark = last.mark, mark == changeMark() else { return nil }
        return last.byRef.values.first { $0.path == path }
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
        if let posted = completions.current, !completions.watchIsBehind { return posted }
        return try freshLockState(c)
    }

    /// The lock state from the agent itself (STATUS): where a stale answer would ask the person for
    /// nothing (Unlock).
    func freshLockState(_ c: Caller) throws(BusError) -> LockState {
        try agentCall { () throws(SecError) in try c.agent.status().lockState }
    }

    /// Whether the item's class key is unavailable in `state`, or reading its secret needs the person
    /// (as the agent said: an access control the caller's process holds no grant for).
    static func isLocked(_ r: Record, _ state: LockState) -> Bool {
        guard !r.needsAuthentication else { return true }
        return switch r.protection.availability {
        case .whenUnlocked: state != .unlocked
        case .afterFirstUnlock: state == .boot
        case .always: false
        }
    }

    /// The caller's session at `path`, or NoSession (closed, unknown, or another sender's).
    func session(_ c: Caller, _ path: String) throws(BusError) -> SecretServiceSession {
        guard owners[path] == c.sender, let s = c.peer.sessions[path] else {
            throw BusError(name: BusError.noSession, message: "\(path) is not a session of \(c.sender)")
        }
        return s.session
    }

    // MARK: Dispatch

    func method(_ m: OpaquePointer?) -> Int32 {
        let interface = ssb_message_interface(m).map { String(cString: $0) } ?? ""
        let member = ssb_message_member(m).map { String(cString: $0) } ?? ""
        let path = ssb_message_path(m).map { String(cString: $0) } ?? ""
        do throws(BusError) {
            let c = try caller(m)
            switch (interface, member) {
            case (Self.serviceInterface, "SearchItems"): return try serviceSearchItems(m, c)
            case (Self.serviceInterface, "GetSecrets"): return try getSecrets(m, c)
            case (Self.serviceInterface, "ReadAlias"): return try readAlias(m, c)
            case (Self.serviceInterface, "SetAlias"): return try setAlias(m, c)
            case (Self.serviceInterface, "CreateCollection"): return try createCollection(m, c)
            case (Self.serviceInterface, "Lock"): return try lock(m, c)
            case (Self.serviceInterface, "Unlock"): return try unlock(m, c)
            case (Self.collectionInterface, "SearchItems"): return try collectionSearchItems(m, c, path)
            case (Self.collectionInterface, "CreateItem"): return try createItem(m, c, path)
            case (Self.collectionInterface, "Delete"): return try deleteCollection(m, c, path)
            case (Self.itemInterface, "GetSecret"): return try getSecret(m, c, path)
            case (Self.itemInterface, "SetSecret"): return try setSecret(m, c, path)
            case (Self.itemInterface, "Delete"): return try deleteItem(m, c, path)
            case ("org.freedesktop.Secret.Prompt", "Prompt"): return try prompt(m, c, path)
            case ("org.freedesktop.Secret.Prompt", "Dismiss"): return try dismiss(m, c, path)
            default: throw BusError(name: BusError.notSupported, message: "\(interface).\(member) is not served")
            }
        } catch {
            return reply(m, error)
        }
    }

    // MARK: Reading and replying

    static func strings(_ strv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> [String] {
        guard let strv else { return [] }
        var out: [String] = []
        var i = 0
        while let s = strv[i] {
            out.append(String(cString: s))
            i += 1
        }
        return out
    }

    static func readString(_ m: OpaquePointer?, _ type: CChar = CChar(UInt8(ascii: "s"))) throws(BusError) -> String {
        var s: UnsafePointer<CChar>?
        guard ssb_read_string(m, type, &s) >= 0, let s else { throw BusError(name: BusError.invalidArgs, message: "bad arguments") }
        return String(cString: s)
    }

    static func readPaths(_ m: OpaquePointer?) throws(BusError) -> [String] {
        var strv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        guard ssb_read_strings(m, CChar(UInt8(ascii: "o")), &strv) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad arguments") }
        defer { ssb_strv_free(strv) }
        return strings(strv)
    }

    static func dictionary(_ pairs: [String]) -> [String: String] {
        var out: [String: String] = [:]
        var i = 0
        while i + 1 < pairs.count {
            out[pairs[i]] = pairs[i + 1]
            i += 2
        }
        return out
    }

    static func readDictionary(_ m: OpaquePointer?) throws(BusError) -> [String: String] {
        var strv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
        guard ssb_read_string_dict(m, &strv) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad arguments") }
        defer { ssb_strv_free(strv) }
        return dictionary(strings(strv))
    }

    /// A Secret struct decrypted with the caller's session: the secret and its content type.
    func readSecret(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> (SecureBytes, String) {
        var sessionC: UnsafePointer<CChar>?, contentC: UnsafePointer<CChar>?
        var params: UnsafeRawPointer?, value: UnsafeRawPointer?
        var np = 0, nv = 0
        guard ssb_read_secret(m, &sessionC, &params, &np, &value, &nv, &contentC) >= 0, let sessionC, let contentC else {
            throw BusError(name: BusError.invalidArgs, message: "a secret is (oayays)")
        }
        let session = try session(c, String(cString: sessionC))
        let parameters = np > 0 ? [UInt8](UnsafeRawBufferPointer(start: params, count: np)) : []
        let secret: SecureBytes
        do {
            secret = try session.decrypt(parameters: parameters, value: UnsafeRawBufferPointer(start: nv > 0 ? value : nil, count: nv))
        } catch {
            throw BusError(name: error.dbusErrorName, message: error.description)
        }
        // Refused here, by name and limit, not by the agent closing a connection over a frame too
        // large to send (the client then saw an I/O error).
        guard secret.count <= SecretInput.maxBytes else {
            secret.wipe()
            throw BusError(name: BusError.invalidArgs, message: "a secret is at most \(SecretInput.maxBytes) bytes")
        }
        return (secret, String(cString: contentC))
    }

    /// Replies with `body` appending to a new reply.
    func replyWith(_ m: OpaquePointer?, _ body: (OpaquePointer?) -> Int32) -> Int32 {
        var r: OpaquePointer?
        var rc = ssb_new_reply(m, &r)
        guard rc >= 0 else { return rc }
        rc = body(r)
        guard rc >= 0 else {
            ssb_release(r)
            return rc
        }
        return ssb_send(r)
    }

    static func appendStrings(_ m: OpaquePointer?, _ type: Character, _ items: [String]) -> Int32 {
        let cs = items.map { strdup($0) }
        defer { cs.forEach { free($0) } }
        return cs.map { UnsafePointer($0) }.withUnsafeBufferPointer { ssb_append_strings(m, CChar(type.asciiValue!), $0.baseAddress, $0.count) }
    }

    static func appendDictionary(_ m: OpaquePointer?, _ d: [String: String]) -> Int32 {
        let sorted = d.sorted { $0.key < $1.key }
        let keys = sorted.map { strdup($0.key) }, values = sorted.map { strdup($0.value) }
        defer { (keys + values).forEach { free($0) } }
        return keys.map { UnsafePointer($0) }.withUnsafeBufferPointer { k in
            values.map { UnsafePointer($0) }.withUnsafeBufferPointer { v in ssb_append_string_dict(m, k.baseAddress, v.baseAddress, k.count) }
        }
    }

    static func appendString(_ m: OpaquePointer?, _ type: Character, _ s: String) -> Int32 {
        ssb_append_string(m, CChar(type.asciiValue!), s)
    }

    /// Appends `secret` encrypted for `session` (at `sessionPath`) as a Secret struct, or as
    /// GetSecrets' entry for `itemPath`.
    static func appendSecret(_ m: OpaquePointer?, itemPath: String? = nil, sessionPath: String, _ session: SecretServiceSession,
                             _ secret: SecureBytes, contentType: String) throws(BusError) -> Int32 {
        let e: SecretServiceEncryptedSecret
        do { e = try session.encrypt(secret) } catch { throw BusError(name: error.dbusErrorName, message: error.description) }
        defer { e.value.wipe() }
        return e.parameters.withUnsafeBytes { p in
            e.value.withUnsafeBytes { v in
                if let itemPath {
                    ssb_append_secrets_entry(m, itemPath, sessionPath, p.baseAddress, p.count, v.baseAddress, v.count, contentType)
                } else {
                    ssb_append_secret(m, sessionPath, p.baseAddress, p.count, v.baseAddress, v.count, contentType)
                }
            }
        }
    }

    func replyPaths(_ m: OpaquePointer?, _ a: [String], then b: String) -> Int32 {
        replyWith(m) { r in
            let rc = Self.appendStrings(r, "o", a)
            return rc < 0 ? rc : Self.appendString(r, "o", b)
        }
    }

    func replyPath(_ m: OpaquePointer?, _ a: String, _ b: String? = nil) -> Int32 {
        replyWith(m) { r in
            let rc = Self.appendString(r, "o", a)
            guard rc >= 0, let b else { return rc }
            return Self.appendString(r, "o", b)
        }
    }

    // MARK: Signals
    //
    // Every signal is addressed to the senders that see what changed (SecretServiceMapping.md,
    // Signals), each in its own view (its collections' names and paths), never to the whole bus:
    // another app on the bus learns nothing of when an access group it cannot see changes.

    /// The senders served now, each as a caller (in a stable order).
    var callers: [Caller] { peers.keys.sorted().map { Caller(sender: $0, peer: peers[$0]!) } }

    func emit(to c: Caller, _ path: String, _ interface: String, _ member: String, _ object: String) {
        _ = ssb_emit_path_signal(bus, c.sender, path, interface, member, object)
    }

    /// PropertiesChanged of `names` to `c`, the values read as `c` sees them.
    func propertiesChanged(to c: Caller, _ path: String, _ interface: String, _ names: [String]) {
        var cs: [UnsafeMutablePointer<CChar>?] = names.map { strdup($0) }
        cs.append(nil)
        defer { cs.forEach { free($0) } }
        emittingTo = c.sender
        defer { emittingTo = nil }
        _ = cs.withUnsafeMutableBufferPointer { ssb_emit_properties_changed(bus, handlers, c.sender, path, interface, $0.baseAddress) }
    }

    /// `member` (ItemCreated, ItemChanged, ItemDeleted) for `c`'s item in `c`'s `collection`, with
    /// PropertiesChanged of the collection, to every sender that sees the collection: `c` at the path
    /// it used (`alias`), the others at the item's own path in their view.
    func itemEvent(_ member: String, by c: Caller, collection: String, id: String, alias: String? = nil) {
        let (group, stored) = c.location(collection)
        for peer in callers {
            guard let name = peer.visible(group: group, stored) else { continue }
            let path = Self.collectionPath(name)
            let item = (peer.sender == c.sender ? alias : nil) ?? Self.itemPath(collection: name, id: id)
            emit(to: peer, path, Self.collectionInterface, member, item)
            propertiesChanged(to: peer, path, Self.collectionInterface, member == "ItemChanged" ? ["Modified"] : ["Items", "Modified"])
        }
    }

    func itemEvent(_ member: String, _ record: Record, by c: Caller) {
        itemEvent(member, by: c, collection: record.collection, id: record.id, alias: record.alias)
    }

    /// `member` (CollectionCreated, CollectionDeleted, CollectionChanged) for `c`'s collection `name`
    /// to every sender that sees it (Collections too when one came or went).
    func collectionEvent(_ member: String, _ name: String, by c: Caller) {
        let (group, stored) = c.location(name)
        for peer in callers {
            guard let seen = peer.visible(group: group, stored) else { continue }
            emit(to: peer, Self.servicePath, Self.serviceInterface, member, Self.collectionPath(seen))
            if member != "CollectionChanged" { propertiesChanged(to: peer, Self.servicePath, Self.serviceInterface, ["Collections"]) }
        }
    }

    // MARK: Service

    func serviceSearchItems(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let attributes = try Self.callerAttributes(Self.readDictionary(m))
        let mark = changeMark()
        let (found, lockedAway) = try search(c, attributes: attributes)
        rememberSearch(c, attributes: attributes, found: found, mark: mark)
        let state = try lockState(c)
        var locked: [String] = [], unlocked: [String] = []
        for r in found { if Self.isLocked(r, state) { locked.append(r.path) } else { unlocked.append(r.path) } }
        locked += lockedAway
        return replyWith(m) { r in
            let rc = Self.appendStrings(r, "o", unlocked)
            return rc < 0 ? rc : Self.appendStrings(r, "o", locked)
        }
    }

    func getSecrets(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let paths = try Self.readPaths(m)
        let sessionPath = try Self.readString(m, CChar(UInt8(ascii: "o")))
        let session = try session(c, sessionPath)
        var found: [(Record, SecureBytes)] = []
        defer { found.forEach { $0.1.wipe() } }
        var seen = Set<String>()
        var batch = batchSecrets(c, paths)
        defer { batch.values.forEach { $0.1.wipe() } }
        for path in paths where seen.insert(path).inserted {
            if let hit = batch.removeValue(forKey: path) {
                found.append(hit)
                continue
            }
            // Locked and unknown items are left out (the spec's GetSecrets).
            do {
                let (record, secret) = try item(c, path, withSecret: true)
                if let secret { found.append((record, secret)) }
            } catch where error.name == BusError.noSuchObject || error.name == BusError.isLocked {
                continue
            }
        }
        var failure: BusError?
        let rc = replyWith(m) { r in
            var rc = ssb_open_secrets(r)
            for (record, secret) in found where rc >= 0 {
                do throws(BusError) { rc = try Self.appendSecret(r, itemPath: record.path, sessionPath: sessionPath, session, secret, contentType: record.contentType) } catch {
                    failure = error
                    return -EINVAL
                }
            }
            return rc < 0 ? rc : ssb_close_container(r)
        }
        if let failure { throw failure }
        return rc
    }

    func readAlias(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let alias = try Self.readString(m)
        guard let name = try aliasTarget(c, alias), try collectionNames(c).contains(name) else { return replyPath(m, Self.noPrompt) }
        return replyPath(m, Self.collectionPath(name))
    }

    func setAlias(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let alias = try Self.readString(m)
        let path = try Self.readString(m, CChar(UInt8(ascii: "o")))
        guard !alias.isEmpty, GeneralAttributes.isValidName(alias) else {
            throw BusError(name: BusError.invalidArgs, message: "an alias is 1 to \(GeneralAttributes.maxNameBytes) bytes")
        }
        if path == Self.noPrompt {
            try deleteRecords(c, recordQuery(c, service: Self.aliasService, account: alias))
        } else {
            let name = try collection(c, path)
            try putRecord(c, service: Self.aliasService, account: alias, [Self.collectionKey: .string(name)])
        }
        return ssb_reply_empty(m)
    }

    /// CreateCollection: an existing collection with the alias is returned as it is; else a new
    /// collection named after its label (lowercase letters and digits, a number added when taken).
    func createCollection(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        var label = ""
        guard ssb_enter_properties(m) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad properties") }
        var key: UnsafePointer<CChar>?, contents: UnsafePointer<CChar>?
        while true {
            let r = ssb_next_property(m, &key, &contents)
            guard r >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad properties") }
            if r == 0 { break }
            if let key, String(cString: key) == "org.freedesktop.Secret.Collection.Label" {
                var s: UnsafePointer<CChar>?
                guard ssb_read_variant_string(m, &s) >= 0, let s else {
                    throw BusError(name: BusError.invalidArgs, message: "org.freedesktop.Secret.Collection.Label is a string")
                }
                label = String(cString: s)
            } else {
                guard ssb_skip_variant(m) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad properties") }
            }
            guard ssb_end_property(m) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad properties") }
        }
        let alias = try Self.readString(m)
        let names = try collectionNames(c)
        if !alias.isEmpty, let existing = try aliasTarget(c, alias), names.contains(existing) {
            return replyPath(m, Self.collectionPath(existing), Self.noPrompt)
        }
        let kept = label.lowercased().unicodeScalars.filter { $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0)) }
        var base = String(String(kept).prefix(24))
        if base.isEmpty || base == "session" { base = "collection" }
        var name = base, n = 1
        while names.contains(name) {
            n += 1
            name = base + String(n)
        }
        try putRecord(c, service: Self.collectionService, account: name, ["labl": .string(label)])
        if !alias.isEmpty, GeneralAttributes.isValidName(alias) {
            try putRecord(c, service: Self.aliasService, account: alias, [Self.collectionKey: .string(name)])
        }
        collectionEvent("CollectionCreated", name, by: c)
        return replyPath(m, Self.collectionPath(name), Self.noPrompt)
    }

    func lock(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let paths = try Self.readPaths(m)
        // Only persistent collections and items lock (the keybag); the session collection never does.
        let persistent = paths.filter {
            switch Self.parse($0) {
            case .collection(let n)?: n != Self.sessionCollection
            case .item(let n, _)?: n != Self.sessionCollection
            case .reference?: true
            case .alias(let a)?: ((try? aliasTarget(c, a)) ?? nil).map { $0 != Self.sessionCollection } ?? false
            case nil: false
            }
        }
        guard !persistent.isEmpty else { return replyPaths(m, [], then: Self.noPrompt) }
        let events = completions.eventCount
        try agentCall { () throws(SecError) in try c.agent.lock() }
        // Locked now: the client's next call finds it so, whether or not the watch has heard the event.
        completions.post(inferred: .locked, ifNoEventSince: events)
        return replyPaths(m, persistent, then: Self.noPrompt)
    }

    func unlock(_ m: OpaquePointer?, _ c: Caller) throws(BusError) -> Int32 {
        let paths = try Self.readPaths(m)
        // The agent's events say unlocked: so it is (a lock since only costs the prompt an unlock).
        // Locked: asked of the agent itself, so that a stale event never asks the person for nothing.
        var state = try lockState(c)
        if state != .unlocked { state = try freshLockState(c) }
        var unlocked: [String] = [], locked: [String] = []
        var reads: [String: ItemQuery] = [:], probes: Set<String> = []
        for path in paths {
            switch Self.parse(path) {
            case .item?, .reference?:
                // An item the agent cannot read while locked is locked; one that is not there is left out.
                // An item with an access control is read by the prompt (the person answers its control).
                do {
                    // The sender's search just named it (libsecret unlocks what SearchItems said is
                    // locked): its record then, if nothing changed since, else the agent's.
                    let record: Record
                    if let searched = searchedRecord(c, path) { record = searched } else { record = try item(c, path).0 }
                    if Self.isLocked(record, state) { locked.append(path) } else { unlocked.append(path) }
                    if record.needsAuthentication {
                        var read = try itemQuery(c, path: path, returnData: true)
                        // The prompt's read opens that row by reference (no index search), checked
                        // against the path's query as well.
                        if let ref = record.ref { read.persistentRef = ref }
                        reads[path] = read
                    }
                } catch where error.name == BusError.isLocked {
                    locked.append(path)
                    // Whether it has an access control cannot be read while the keybag is locked: the
                    // prompt looks once it has unlocked it.
                    if let query = try? itemQuery(c, path: path, returnData: true) {
                        reads[path] = query
                        probes.insert(path)
                    }
                } catch {
                    continue
                }
            case .collection?, .alias?:
                guard let name = try? collection(c, path) else { continue }
                if state == .unlocked || name == Self.sessionCollection { unlocked.append(path) } else { locked.append(path) }
            case nil: continue
            }
        }
        guard !locked.isEmpty else { return replyPaths(m, unlocked, then: Self.noPrompt) }
        return replyPaths(m, unlocked, then: try newPrompt(c, unlocking: locked, reading: reads, probing: probes,
                                                           keybagUnlocked: state == .unlocked))
    }

    // MARK: Collection

    func collectionSearchItems(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        let attributes = try Self.callerAttributes(Self.readDictionary(m))
        let name = try collection(c, path)
        let (found, lockedAway) = try search(c, collection: name, attributes: attributes)
        return replyWith(m) { Self.appendStrings($0, "o", found.map(\.path) + lockedAway) }
    }

    /// CreateItem's properties: the label, the attributes and Coffer's own.
    struct ItemProperties {
        var label = ""
        var attributes: [String: String] = [:]
        var protection: ProtectionClass?
        var synchronizable: Bool?
        /// `io.coffer.Item.AccessControl`: guards reading the secret, updating and deleting.
        var accessControl: AccessControl?

        /// Puts the Coffer properties given into a keychain item's attributes (the access control
        /// only into a new item's: the keychain refuses it in an update).
        func apply(to a: inout Attributes, new: Bool = false) {
            if let protection { a["pdmn"] = .string(protection.shortCode) }
            if let synchronizable { a["sync"] = .bool(synchronizable) }
            if new, let accessControl { a[AccessControl.attributeName] = .data(accessControl.encoded()) }
        }
    }

    static func readItemProperties(_ m: OpaquePointer?) throws(BusError) -> ItemProperties {
        var p = ItemProperties()
        let bad = BusError(name: BusError.invalidArgs, message: "bad properties")
        guard ssb_enter_properties(m) >= 0 else { throw bad }
        var key: UnsafePointer<CChar>?, contents: UnsafePointer<CChar>?
        while true {
            let r = ssb_next_property(m, &key, &contents)
            guard r >= 0, let keyC = key else { throw bad }
            if r == 0 { break }
            let name = String(cString: keyC)
            let wrongType = BusError(name: BusError.invalidArgs, message: "\(name) has the wrong type")
            switch name {
            case "org.freedesktop.Secret.Item.Label":
                var s: UnsafePointer<CChar>?
                guard ssb_read_variant_string(m, &s) >= 0, let s else { throw wrongType }
                p.label = String(cString: s)
            case "org.freedesktop.Secret.Item.Attributes":
                var strv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?
                guard ssb_read_variant_string_dict(m, &strv) >= 0 else { throw wrongType }
                p.attributes = dictionary(strings(strv))
                ssb_strv_free(strv)
            case "io.coffer.Item.Accessible":
                var s: UnsafePointer<CChar>?
                guard ssb_read_variant_string(m, &s) >= 0, let s else { throw wrongType }
                guard let c = ProtectionClass(parsing: String(cString: s)) else {
                    throw BusError(name: BusError.invalidArgs, message: "io.coffer.Item.Accessible: no class \(String(cString: s))")
                }
                p.protection = c
            case "io.coffer.Item.Synchronizable":
                var b: Int32 = 0
                guard ssb_read_variant_bool(m, &b) >= 0 else { throw wrongType }
                p.synchronizable = b != 0
            case "io.coffer.Item.AccessControl":
                // The CLI's --access-control form, guarding every operation (as its default does).
                var s: UnsafePointer<CChar>?
                guard ssb_read_variant_string(m, &s) >= 0, let s else { throw wrongType }
                let text = String(cString: s)
                guard let acl = AccessControl(parsing: text) else {
                    throw BusError(name: BusError.invalidArgs, message: "io.coffer.Item.AccessControl is not a control: its factors are "
                                   + "user-presence, biometry-any, biometry-current-set and device-passcode, joined with ,or, or ,and,")
                }
                // An application password is chosen when the item is made, by the person, and the
                // front end has no way to ask for it there: `coffer add --access-control application-password`.
                guard !acl.factors.contains(.applicationPassword) else {
                    throw BusError(name: BusError.notSupported, message: "io.coffer.Item.AccessControl: an application password "
                                   + "cannot be chosen through the Secret Service; make the item with coffer add --access-control application-password")
                }
                p.accessControl = acl
            default:
                guard ssb_skip_variant(m) >= 0 else { throw bad }
            }
            guard ssb_end_property(m) >= 0 else { throw bad }
        }
        if p.accessControl != nil, p.synchronizable == true {
            throw BusError(name: BusError.invalidArgs, message: "an item with an access control never leaves this device: "
                           + "io.coffer.Item.Synchronizable cannot be true")
        }
        return p
    }

    /// Changes an item (a keychain item, or a `session` one in memory): a new label, attribute set,
    /// secret and content type, each when given.
    func change(_ c: Caller, _ record: Record, label: String? = nil, attributes: [String: String]? = nil,
                secret: SecureBytes? = nil, contentType: String? = nil, extra: Attributes = [:]) throws(BusError) {
        if record.collection == Self.sessionCollection {
            guard var item = sessionItems[c.group]?[record.id] else { throw BusError(name: BusError.noSuchObject, message: "no item \(record.path)") }
            if let label { item.label = label }
            if let attributes { item.attributes = attributes }
            if let secret {
                item.secret.wipe()
                item.secret = secret.slice(0..<secret.count)
            }
            if let contentType { item.contentType = contentType }
            item.modified = Self.now()
            sessionItems[c.group]?[record.id] = item
            return
        }
        var changes = extra
        if attributes != nil || contentType != nil { changes.merge(record.general(attributes: attributes, contentType: contentType)) { $1 } }
        if let label { changes["labl"] = .string(label) }
        _ = try agentCall { () throws(SecError) in
            try c.agent.update(itemQuery(c, collection: record.collection, id: record.id), ItemChanges(attributes: changes, secret: secret))
        }
    }

    func remove(_ c: Caller, _ record: Record) throws(BusError) {
        if record.collection == Self.sessionCollection {
            sessionItems[c.group]?.removeValue(forKey: record.id)?.secret.wipe()
            return
        }
        _ = try agentCall { () throws(SecError) in try c.agent.delete(itemQuery(c, collection: record.collection, id: record.id)) }
    }

    static func now() -> UInt64 { UInt64(max(0, time(nil))) }

    func createItem(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        let properties = try Self.readItemProperties(m)
        let attributes = try Self.callerAttributes(properties.attributes)
        let (secret, contentType) = try readSecret(m, c)
        defer { secret.wipe() }
        var replace: Int32 = 0
        guard ssb_read_bool(m, &replace) >= 0 else { throw BusError(name: BusError.invalidArgs, message: "bad arguments") }
        let name = try collection(c, path)
        if replace != 0, let old = try items(c, collection: name, attributes: attributes).first(where: { $0.attributes == properties.attributes }) {
            // An access control belongs to the item from its making (the keychain never changes
            // one): replacing keeps the old item's, so a different one asked for is refused.
            if let acl = properties.accessControl, acl.description != old.accessControl {
                throw BusError(name: BusError.notSupported, message: "io.coffer.Item.AccessControl: the item being replaced has "
                               + (old.accessControl.map { "the access control \($0)" } ?? "no access control")
                               + " and an item's control never changes; delete it first")
            }
            var extra: Attributes = [:]
            properties.apply(to: &extra)
            try change(c, old, label: properties.label, secret: secret, contentType: contentType, extra: extra)
            itemEvent("ItemChanged", old, by: c)
            return replyPath(m, old.path, Self.noPrompt)
        }
        let id = SecureBytes.random(count: 16).withUnsafeBytes { Hex.encode($0) }
        if name == Self.sessionCollection {
            guard (sessionItems[c.group]?.count ?? 0) < Self.sessionItemsPerIdentity else {
                throw BusError(name: BusError.limitsExceeded, message: "the session collection holds at most \(Self.sessionItemsPerIdentity) items")
            }
            let now = Self.now()
            sessionItems[c.group, default: [:]][id] = SessionItem(label: properties.label, attributes: properties.attributes,
                                                                  secret: secret.slice(0..<secret.count), contentType: contentType,
                                                                  created: now, modified: now)
            return itemCreated(m, c, name: name, id: id)
        }
        let (group, stored) = c.location(name)
        var a = attributes
        a["svce"] = .string(Self.itemService)
        a["acct"] = .string(id)
        a["agrp"] = .string(group)
        a["labl"] = .string(properties.label)
        a[Self.collectionKey] = .string(stored)
        a[Self.contentTypeKey] = .string(contentType)
        properties.apply(to: &a, new: true)
        do {
            _ = try c.agent.add(NewItem(itemClass: .genericPassword, attributes: a, secret: secret))
        } catch {
            // The keychain's refusal of a control without a passcode is not a locked item.
            if properties.accessControl != nil, error.status == .notAvailable {
                throw BusError(name: BusError.failed, message: "\(error.status.name) (\(error.status.rawValue)): \(error.message)")
            }
            throw Self.busError(error)
        }
        return itemCreated(m, c, name: name, id: id)
    }

    func itemCreated(_ m: OpaquePointer?, _ c: Caller, name: String, id: String) -> Int32 {
        let rc = replyPath(m, Self.itemPath(collection: name, id: id), Self.noPrompt)
        itemEvent("ItemCreated", by: c, collection: name, id: id)
        return rc
    }

    /// Delete: the collection's items, its label record and the aliases naming it; `login` comes back empty.
    func deleteCollection(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        let name = try collection(c, path)
        if name == Self.sessionCollection {
            for item in (sessionItems.removeValue(forKey: c.group) ?? [:]).values { item.secret.wipe() }
        } else {
            try deleteRecords(c, itemQuery(c, collection: name))
        }
        for r in try records(c, service: Self.aliasService) where r[Self.collectionKey] == .string(name) {
            if case .string(let alias)? = r["acct"] { try deleteRecords(c, recordQuery(c, service: Self.aliasService, account: alias)) }
        }
        let (group, stored) = c.location(name)
        try deleteRecords(c, recordQuery(c, service: Self.collectionService, account: stored, group: group))
        collectionEvent("CollectionDeleted", name, by: c)
        return replyPath(m, Self.noPrompt)
    }

    // MARK: Item

    func getSecret(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        let sessionPath = try Self.readString(m, CChar(UInt8(ascii: "o")))
        let session = try session(c, sessionPath)
        let (record, secret) = try item(c, path, withSecret: true)
        guard let secret else { throw BusError(name: BusError.failed, message: "the agent sent no secret") }
        defer { secret.wipe() }
        var failure: BusError?
        let rc = replyWith(m) { r in
            do throws(BusError) { return try Self.appendSecret(r, sessionPath: sessionPath, session, secret, contentType: record.contentType) } catch {
                failure = error
                return -EINVAL
            }
        }
        if let failure { throw failure }
        return rc
    }

    func setSecret(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        let (secret, contentType) = try readSecret(m, c)
        defer { secret.wipe() }
        let (record, _) = try item(c, path)
        try change(c, record, secret: secret, contentType: contentType)
        itemEvent("ItemChanged", record, by: c)
        return ssb_reply_empty(m)
    }

    func deleteItem(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        let (record, _) = try item(c, path)
        try remove(c, record)
        itemEvent("ItemDeleted", record, by: c)
        return replyPath(m, Self.noPrompt)
    }

    // MARK: Properties

    func getProperty(_ call: OpaquePointer?, _ pathC: UnsafePointer<CChar>?, _ interfaceC: UnsafePointer<CChar>?,
                     _ propertyC: UnsafePointer<CChar>?, _ reply: OpaquePointer?, _ busError: OpaquePointer?) -> Int32 {
        let path = pathC.map { String(cString: $0) } ?? "", interface = interfaceC.map { String(cString: $0) } ?? ""
        let property = propertyC.map { String(cString: $0) } ?? ""
        // Sent in PropertiesChanged when the keybag locks or unlocks (no call, so no caller): the
        // state every persistent collection shares.
        if call == nil, interface == Self.collectionInterface, property == "Locked", let state = watchedLockState {
            return ssb_append_bool(reply, state == .unlocked ? 0 : 1)
        }
        do throws(BusError) {
            let c = try caller(call)
            switch (interface, property) {
            case (Self.serviceInterface, "Collections"):
                return Self.appendStrings(reply, "o", try collectionNames(c).map(Self.collectionPath))
            case (Self.collectionInterface, _):
                let name = try collection(c, path)
                if name == Self.sessionCollection {
                    let items = try items(c, collection: name)
                    switch property {
                    case "Items": return Self.appendStrings(reply, "o", items.map(\.path))
                    case "Locked": return ssb_append_bool(reply, 0)
                    case "Label": return Self.appendString(reply, "s", "Session")
                    default: return ssb_append_u64(reply, items.map { property == "Created" ? $0.created : $0.modified }.min() ?? 0)
                    }
                }
                switch property {
                case "Items":
                    // Locked items too, by reference (as SearchItems names them).
                    let (open, locked) = try search(c, collection: name, attributes: [:])
                    return Self.appendStrings(reply, "o", open.map(\.path) + locked)
                case "Locked": return ssb_append_bool(reply, try lockState(c) == .unlocked ? 0 : 1)
                default:
                    let (group, stored) = c.location(name)
                    let record = try records(c, service: Self.collectionService, account: stored, group: group).first
                    switch property {
                    case "Label":
                        if case .string(let l)? = record?["labl"] { return Self.appendString(reply, "s", l) }
                        // Another group's collection is labelled with the group until its label is set.
                        return Self.appendString(reply, "s", name == Self.loginCollection ? "Login" : group != c.group ? group : name)
                    case "Created": return ssb_append_u64(reply, Record.seconds(record?["cdat"]))
                    default: return ssb_append_u64(reply, Record.seconds(record?["mdat"]))
                    }
                }
            case (Self.itemInterface, "Locked"):
                // An item whose attributes the agent cannot read now is locked.
                do {
                    let (record, _) = try item(c, path)
                    return ssb_append_bool(reply, Self.isLocked(record, try lockState(c)) ? 1 : 0)
                } catch where error.name == BusError.isLocked {
                    return ssb_append_bool(reply, 1)
                }
            case (Self.cofferItemInterface, "AccessControl"):
                do {
                    return Self.appendString(reply, "s", try item(c, path).0.accessControl ?? "")
                } catch where error.name == BusError.isLocked {
                    return Self.appendString(reply, "s", "")
                }
            case (Self.itemInterface, _):
                let record: Record
                do {
                    record = try item(c, path).0
                } catch where error.name == BusError.isLocked {
                    // The keybag holds a locked item's label, attributes and dates sealed: they read
                    // empty until it is unlocked (a client's GetAll of a locked item must not fail:
                    // libsecret's search makes a proxy of every item it finds, locked or not).
                    switch property {
                    case "Attributes": return Self.appendDictionary(reply, [:])
                    case "Label", "Type": return Self.appendString(reply, "s", "")
                    default: return ssb_append_u64(reply, 0)
                    }
                }
                switch property {
                case "Attributes": return Self.appendDictionary(reply, record.attributes)
                case "Label": return Self.appendString(reply, "s", record.label)
                case "Type": return Self.appendString(reply, "s", record.attributes["xdg:schema"] ?? "")
                case "Created": return ssb_append_u64(reply, record.created)
                default: return ssb_append_u64(reply, record.modified)
                }
            default:
                throw BusError(name: BusError.notSupported, message: "no property \(interface).\(property)")
            }
        } catch {
            return ssb_error_set(busError, error.name, error.message)
        }
    }

    func setProperty(_ call: OpaquePointer?, _ pathC: UnsafePointer<CChar>?, _ interfaceC: UnsafePointer<CChar>?,
                     _ propertyC: UnsafePointer<CChar>?, _ value: OpaquePointer?, _ busError: OpaquePointer?) -> Int32 {
        let path = pathC.map { String(cString: $0) } ?? "", interface = interfaceC.map { String(cString: $0) } ?? ""
        let property = propertyC.map { String(cString: $0) } ?? ""
        do throws(BusError) {
            let c = try caller(call)
            switch (interface, property) {
            case (Self.collectionInterface, "Label"):
                let label = try Self.readString(value)
                let name = try collection(c, path)
                guard name != Self.sessionCollection else {
                    throw BusError(name: BusError.notSupported, message: "the session collection's label cannot be set")
                }
                let (group, stored) = c.location(name)
                try putRecord(c, service: Self.collectionService, account: stored, group: group, ["labl": .string(label)])
                collectionEvent("CollectionChanged", name, by: c)
            case (Self.itemInterface, "Label"):
                let label = try Self.readString(value)
                let (record, _) = try item(c, path)
                try change(c, record, label: label)
                itemEvent("ItemChanged", record, by: c)
            case (Self.itemInterface, "Attributes"):
                let pairs = try Self.readDictionary(value)
                _ = try Self.callerAttributes(pairs)
                let (record, _) = try item(c, path)
                try change(c, record, attributes: pairs)
                itemEvent("ItemChanged", record, by: c)
            default:
                throw BusError(name: BusError.notSupported, message: "\(interface).\(property) cannot be set")
            }
            return 0
        } catch {
            return ssb_error_set(busError, error.name, error.message)
        }
    }

    /// The caller's collections and items, for introspection (as any call, it makes the sender's
    /// delegated connection; nothing when the agent does not know the sender).
    ///
    /// Only the children of `prefix`, the path introspected: sd-bus lists every path it is given as a
    /// child node, so a collection's items handed to the introspection of `…/collection` would appear
    /// there as `login/ID` nodes beside `login` (each child once, and only children).
    func enumerate(_ call: OpaquePointer?, prefix: String) -> UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? {
        guard let c = try? caller(call), let names = try? collectionNames(c) else { return nil }
        var paths: [String]
        if prefix == Self.collectionPrefix {
            paths = names.map(Self.collectionPath)
        } else if let name = Self.parse(prefix).flatMap({ if case .collection(let n) = $0 { n } else { nil } }), names.contains(name) {
            paths = ((try? items(c, collection: name)) ?? []).map(\.path)
        } else {
            paths = []
        }
        // malloc'ed: sd-bus frees the array and its strings.
        guard let raw = malloc((paths.count + 1) * MemoryLayout<UnsafeMutablePointer<CChar>?>.stride) else { return nil }
        let out = raw.bindMemory(to: UnsafeMutablePointer<CChar>?.self, capacity: paths.count + 1)
        for (i, p) in paths.enumerated() { out[i] = strdup(p) }
        out[paths.count] = nil
        return out
    }

    // MARK: The session collection

    /// An item of the `session` collection: in the front end's memory only, its secret in secure memory.
    struct SessionItem {
        var label: String
        var attributes: [String: String]
        var secret: SecureBytes
        var contentType: String
        let created: UInt64
        var modified: UInt64
    }

    // MARK: Prompts

    /// A prompt for objects that are locked: what it would unlock, whose it is, and its work once
    /// *Prompt* started it.
    struct PendingPrompt {
        let sender: String
        let objects: [String]
        /// The items with an access control among `objects` (path → the query reading its secret),
        /// and those of them that may have none (locked when asked: looked at after unlocking).
        var reads: [String: ItemQuery] = [:]
        var probes: Set<String> = []
        /// The keybag was unlocked when the prompt was made: its work reads first, and unlocks only
        /// if the keybag has locked since (one round trip fewer for the usual protected read).
        var keybagUnlocked = false
        var work: PromptWork? = nil
    }

    /// A Prompt object for `objects`, the caller's (at most ``promptsPerSender`` at once); `reads`:
    /// the items with an access control among them, whose secrets the prompt reads (`probes`: those
    /// read only if they turn out to have one).
    func newPrompt(_ c: Caller, unlocking objects: [String], reading reads: [String: ItemQuery] = [:],
                   probing probes: Set<String> = [], keybagUnlocked: Bool = false) throws(BusError) -> String {
        guard prompts.values.count(where: { $0.sender == c.sender }) < Self.promptsPerSender else {
            throw BusError(name: BusError.limitsExceeded, message: "\(c.sender) already holds \(Self.promptsPerSender) prompts")
        }
        let path = Self.promptPrefix + "/p" + String(nextPrompt)
        nextPrompt += 1
        prompts[path] = PendingPrompt(sender: c.sender, objects: objects, reads: reads, probes: probes, keybagUnlocked: keybagUnlocked)
        return path
    }

    /// Prompt(window-id) returns at once. On a thread of its own, a new agent connection is delegated
    /// to the sender's process and sends PROMPT_UNLOCK, then PROMPT_READ for each item with an access
    /// control: the agent asks the person with its own prompter, naming the app as it identified the
    /// sender, and grants the items to the sender's process (CallerSessions: its GetSecret then reads
    /// them as any read, and no secret waits in the front end). *Completed* follows on the bus thread:
    /// (false, the objects) once unlocked and granted,
    /// (true, []) when the person cancelled, nobody could be asked (the agent has no pinentry or knows
    /// no display of the person's session: at once) or the agent refused. Whether a dialog can appear is
    /// the agent's to decide, from the person's session (issue #43), never from the sender's
    /// environment: Chromium rewrites its own, a non-dumpable process hides it, and any process of the
    /// user can set one. Meanwhile every other call is served; a sender has one
    /// prompt running at a time.
    func prompt(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        guard var p = prompts[path], p.sender == c.sender else { throw BusError(name: BusError.noSuchObject, message: "no prompt \(path)") }
        guard p.work == nil else { return ssb_reply_empty(m) }
        // One running prompt per sender: a person is asked one thing at a time. Prompts whose
        // threads have just ended are completed first, so a finished one never counts.
        completePrompts()
        if let running = prompts.first(where: { $0.key != path && $0.value.sender == c.sender && $0.value.work != nil })?.key {
            throw BusError(name: BusError.limitsExceeded,
                           message: "\(c.sender) already has a running prompt (\(running)): dismiss it or wait for its Completed first")
        }
        let rc = ssb_reply_empty(m)
        let work = PromptWork(path: path, process: c.peer.process, socketPath: socketPath, reads: p.reads, probes: p.probes,
                              unlockFirst: !p.keybagUnlocked || p.reads.isEmpty || !p.probes.isEmpty,
                              completions: completions)
        p.work = work
        prompts[path] = p
        // Without a wake descriptor the bus thread would never learn the end: dismissed at once.
        if completions.wake < 0 || !work.start() { complete(path, unlocked: false) }
        return rc
    }

    /// Dismiss: the prompt's agent connection closes (the agent's pinentry with it) and
    /// *Completed(true, [])* follows.
    func dismiss(_ m: OpaquePointer?, _ c: Caller, _ path: String) throws(BusError) -> Int32 {
        guard let p = prompts[path], p.sender == c.sender else { throw BusError(name: BusError.noSuchObject, message: "no prompt \(path)") }
        p.work?.cancel()
        let rc = ssb_reply_empty(m)
        complete(path, unlocked: false)
        return rc
    }

    /// The prompt at `path` ends (nothing if it already has): Completed on the bus. What its reads
    /// allowed is the agent's grant to the sender's process (CallerSessions): the front end keeps nothing.
    func complete(_ path: String, unlocked: Bool) {
        guard let p = prompts.removeValue(forKey: path) else { return }
        guard unlocked else {
            _ = ssb_emit_completed(bus, p.sender, path, 1, nil, 0)
            return
        }
        let cs: [UnsafePointer<CChar>?] = p.objects.map { UnsafePointer(strdup($0)) }
        defer { cs.forEach { free(UnsafeMutablePointer(mutating: $0)) } }
        _ = cs.withUnsafeBufferPointer { ssb_emit_completed(bus, p.sender, path, 0, $0.baseAddress, p.objects.count) }
    }

    /// On the bus thread: the prompts whose threads have ended.
    func completePrompts() {
        for e in completions.take() { complete(e.path, unlocked: e.unlocked) }
    }
}

/// What other threads hand the bus thread, an eventfd waking its loop: prompts that ended on their
/// threads, that items changed, and the keybag's lock state as the agent's events tell it (``SecretServiceFrontEnd/startLockWatch()``).
final class PromptCompletions: Sendable {
    /// The lock state: the one to announce (taken by the bus thread), the latest known, and how many
    /// the watch has posted (an event or its first STATUS).
    private let lockState = Protected<(posted: LockState?, latest: LockState?, events: UInt64)>((nil, nil, 0))

    /// The watch's post: what the agent said.
    func post(lockState state: LockState) {
        lockState.withLock { s in
            s.posted = state
            s.latest = state
            s.events &+= 1
        }
        if wake >= 0 { ssb_wake(wake) }
    }

    /// How many states the watch has posted so far (for ``post(inferred:ifNoEventSince:)``).
    var eventCount: UInt64 { lockState.withLock { $0.events } }

    /// A state the front end knows from a request of its own (its Lock, a prompt's unlock), posted only
    /// if the watch has posted nothing since `count` was read before that request: an event since is
    /// newer than the inference (a lock right after the prompt's unlock), and wins.
    func post(inferred state: LockState, ifNoEventSince count: UInt64) {
        let posted = lockState.withLock { s -> Bool in
            guard s.events == count else { return false }
            s.posted = state
            s.latest = state
            return true
        }
        if posted && wake >= 0 { ssb_wake(wake) }
    }

    /// The lock state last posted (nil: none yet), whether or not the bus thread has announced it:
    /// what a call asking for lock state is answered from, unless the watch's connection holds an
    /// event not yet read (``watchIsBehind``).
    var current: LockState? { lockState.withLock { $0.latest } }

    /// The watch's agent connection, while it is subscribed (nil otherwise).
    private let watch = Protected<AgentConnection?>(nil)

    func watching(_ connection: AgentConnection?) { watch.withLock { $0 = connection } }

    /// True when no watch is subscribed, or an event waits unread on its connection: the agent sends
    /// a lock event before it answers the request that locked or unlocked, so a state posted before
    /// it may be stale, and the caller asks the agent instead.
    var watchIsBehind: Bool { watch.withLock { $0?.hasUnreadBytes ?? true } }

    /// The latest lock state posted since the last call, if any.
    func takeLockState() -> LockState? { lockState.withLock { s in defer { s.posted = nil }; return s.posted } }

    /// The item-change events of the watch's agent connection: which connection (a generation),
    /// whether its events name their access groups, how many events it brought (``HeardChanges``),
    /// whether any came since the bus thread last looked, and whether it is still subscribed (`live`).
    private let itemEvents = Protected((generation: 0, heard: HeardChanges(namesGroups: false), fresh: false, live: false))

    /// The item changes one watch connection heard: every event, those naming each access group, and
    /// those naming none (any group may have changed: a sync, a restore, or an agent whose events
    /// never name groups).
    struct HeardChanges {
        let namesGroups: Bool
        var count = 0
        var byGroup: [String: Int] = [:]
        var anywhere = 0
    }

    /// The watch subscribed to item changes on a new agent connection (`namesGroups`: with their groups).
    func itemWatchStarted(namesGroups: Bool) {
        itemEvents.withLock { $0 = ($0.generation + 1, HeardChanges(namesGroups: namesGroups), true, true) }
        if wake >= 0 { ssb_wake(wake) }
    }

    /// The watch's agent connection ended (or never subscribed to item changes): changes go untold.
    func itemWatchEnded() { itemEvents.withLock { $0.live = false } }

    /// The agent said items changed, in `groups` (nil: any group may have).
    func postItemsChanged(groups: [String]?) {
        itemEvents.withLock { e in
            e.heard.count += 1
            if let groups { for g in groups { e.heard.byGroup[g, default: 0] += 1 } } else { e.heard.anywhere += 1 }
            e.fresh = true
        }
        if wake >= 0 { ssb_wake(wake) }
    }

    /// The watch's generation and what it heard, if anything came since the last call.
    func takeItemEvents() -> (generation: Int, heard: HeardChanges)? {
        itemEvents.withLock { e in
            guard e.fresh else { return nil }
            e.fresh = false
            return (e.generation, e.heard)
        }
    }

    /// The watch's generation and event count while a watch of item changes runs, nil while none
    /// does: equal values at two moments mean the agent told of no change in between.
    var itemWatchMark: (generation: Int, count: Int)? { itemEvents.withLock { $0.live ? ($0.generation, $0.heard.count) : nil } }

    /// The watch's generation and everything it heard, while a watch of item changes that names
    /// groups runs (nil otherwise); nothing is taken (``takeItemEvents()`` still reports it).
    var heardSoFar: (generation: Int, heard: HeardChanges)? {
        itemEvents.withLock { $0.live && $0.heard.namesGroups ? ($0.generation, $0.heard) : nil }
    }

    /// A prompt that ended: whether it was granted, and the secrets it read (item path → secret).
    typealias Ended = (path: String, unlocked: Bool)
    /// The eventfd (-1 if none could be made: every prompt then completes dismissed at once).
    let wake: Int32 = max(-1, ssb_wake_fd_open())
    private let ended = Protected<[Ended]>([])

    func post(_ path: String, unlocked: Bool) {
        ended.withLock { $0.append((path, unlocked)) }
        if wake >= 0 { ssb_wake(wake) }
    }

    func take() -> [Ended] { ended.withLock { e in defer { e = [] }; return e } }

    deinit {
        if wake >= 0 { close(wake) }
    }
}

/// One prompt's work off the bus thread: its own agent connection, delegated to the sender's
/// process, sending PROMPT_UNLOCK, then PROMPT_READ for each item with an access control (the agent's
/// prompter asks the person for the item's control, and the agent grants the item to the sender's
/// process: no secret comes back); ``cancel()`` (Dismiss, the sender leaving) shuts
/// it down from the bus thread, and the agent's pinentry closes.
final class PromptWork: @unchecked Sendable {
    let path: String
    let process: SecretServiceFrontEnd.DelegatedProcess
    let socketPath: String
    /// Item path → the query reading its secret; `probes`: the items read only if, once the keybag
    /// is unlocked, they turn out to have an access control.
    let reads: [String: ItemQuery]
    let probes: Set<String>
    /// Sends PROMPT_UNLOCK before the reads; false when the keybag was unlocked as the prompt was made
    /// (it is sent only if a read finds the keybag locked since).
    let unlockFirst: Bool
    let completions: PromptCompletions
    private let state = Protected<(connection: AgentConnection?, cancelled: Bool)>((connection: nil, cancelled: false))

    init(path: String, process: SecretServiceFrontEnd.DelegatedProcess, socketPath: String, reads: [String: ItemQuery] = [:],
         probes: Set<String> = [], unlockFirst: Bool = true, completions: PromptCompletions) {
        self.unlockFirst = unlockFirst
        self.path = path
        self.process = process
        self.socketPath = socketPath
        self.reads = reads
        self.probes = probes
        self.completions = completions
    }

    /// Starts the thread; false if it could not be started.
    func start() -> Bool { Threads.detach { self.run() } }

    func cancel() {
        state.withLock { s in
            s.cancelled = true
            s.connection?.cancel()
        }
    }

    private func run() {
        var unlocked = false
        do throws(SecError) {
            // HELLO goes out with DELEGATE (one round trip; the agent knows both processes already).
            let agent = try AgentConnection(path: socketPath, clientName: "coffer-secret-service", pipelineHello: true,
                                            replyTimeout: SecretServiceFrontEnd.agentReplyTimeout)
            let go = state.withLock { s -> Bool in
                s.connection = agent
                return !s.cancelled
            }
            if go {
                try agent.delegate(pidfd: process.pidfd, pid: process.pid, startTime: process.startTime)
                // An agent older than this front end (protocol 3) answers PROMPT_READ with secrets and
                // grants nothing: the front end, which keeps no secret, asks it for nothing then.
                guard agent.grantsPromptReads || reads.isEmpty else {
                    throw SecError(.notAvailable, "the agent speaks protocol \(agent.version), older than this front end: restart cofferd")
                }
                // The person takes as long as they take; the agent's prompter bounds the wait.
                agent.setReplyTimeout(0)
                // Unlocked after it: a call the client makes on Completed finds it so, whether or not
                // the watch has heard the agent's event yet.
                var unlockedNow = false
                func unlockKeybag() throws(SecError) {
                    let events = completions.eventCount
                    try agent.promptUnlock()
                    completions.post(inferred: .unlocked, ifNoEventSince: events)
                    unlockedNow = true
                }
                if unlockFirst { try unlockKeybag() }
                for (item, query) in reads.sorted(by: { $0.key < $1.key }) {
                    if probes.contains(item) {
                        var probe = query
                        probe.returnData = false
                        probe.returnAttributes = true
                        probe.reportsAccessState = true
                        let found: [ItemResult]
                        do { found = try agent.copyMatching(probe) } catch where error.status == .itemNotFound { continue }
                        guard found.first?.needsAuthentication == true else { continue }
                    }
                    // The reply names the item (no data): the grant is the sender's process's. (The
                    // access state is a search's flag, not PROMPT_READ's.)
                    var read = query
                    read.reportsAccessState = false
                    let found: [ItemResult]
                    do {
                        found = try agent.promptRead(read)
                    } catch where error.status == .interactionNotAllowed && !unlockedNow {
                        // Locked since the prompt was made (or nobody can be asked: then so answers the unlock).
                        try unlockKeybag()
                        found = try agent.promptRead(read)
                    }
                    guard !found.isEmpty else { throw SecError(.itemNotFound, "the item is gone") }
                }
                unlocked = true
            }
        } catch {}
        state.withLock { $0.connection = nil }
        completions.post(path, unlocked: unlocked)
    }
}
