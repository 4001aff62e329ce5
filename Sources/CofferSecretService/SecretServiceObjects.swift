import CSDBus
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
///
/// This file holds the names, paths, the caller, dispatch, properties and signals; each D-Bus object
/// has a file of its own (SecretServiceService.swift, SecretServiceCollection.swift,
/// SecretServiceItem.swift, SecretServiceSessions.swift, SecretServicePrompt.swift), over the keychain
/// records (SecretServiceRecords.swift) and the reading and replying (SecretServiceMarshalling.swift).
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
                // The sender's search just gave the item (a client makes a proxy of every item a search
                // finds and reads its properties): its record then, if nothing changed since — unless
                // reading it needed the person then (a grant since, from a prompt, changes that: the
                // agent says).
                // Locked is the agent's answer (``Record/needsAuthentication``), never derived here.
                if let searched = searchedRecordForLockState(c, path), !searched.needsAuthentication {
                    return ssb_append_bool(reply, 0)
                }
                // An item whose attributes the agent cannot read now is locked.
                do {
                    let (record, _) = try item(c, path)
                    return ssb_append_bool(reply, record.needsAuthentication ? 1 : 0)
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
                    // As for Locked: the search's record while nothing changed and the item is readable
                    // now (a locked one's properties come from the agent, which reads them empty).
                    if let searched = searchedRecordForLockState(c, path), !searched.needsAuthentication {
                        record = searched
                    } else {
                        record = try item(c, path).0
                    }
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
}
