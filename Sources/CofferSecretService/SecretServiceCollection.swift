import CSDBus
import CofferClient
import CofferCrypto
import CofferModel
import CofferSecretServiceCrypto
import CofferSystem
import Glibc

/// The org.freedesktop.Secret.Collection methods, and the `session` collection's items.
extension SecretServiceFrontEnd {
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
            noteSessionAccess(c, .add)
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
            let gone = sessionItems.removeValue(forKey: c.group) ?? [:]
            for item in gone.values { item.secret.wipe() }
            noteSessionAccess(c, .delete, count: gone.count)
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
}
