#if os(Linux)
// SecItemAdd, SecItemCopyMatching, SecItemUpdate, SecItemDelete: Apple's dictionaries in, the agent's ADD,
// COPY_MATCHING(_PAGE), UPDATE and DELETE out, Apple's result shapes back.
public import Foundation
import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol

/// An LAContext as the Security calls use it (LocalAuthentication's class conforms): the session its
/// evaluation lives on and the options a call through it runs with.
package protocol SecAuthenticationContext: AnyObject {
    /// The context's own agent session.
    var agentSession: AgentSession { get }
    /// The options for a call with `prompt` (kSecUseOperationPrompt) that may not ask when `noUserInterface`.
    func agentOptions(prompt: String?, noUserInterface: Bool) -> AgentSession.Options
}

/// Adds an item (kSecClass, its attributes, kSecValueData or, for a key, kSecValueRef); `result`, if given and
/// the dictionary asks with kSecReturn…, gets the new item's parts.
public func SecItemAdd(_ attributes: CFDictionary, _ result: UnsafeMutablePointer<CFTypeRef?>?) -> OSStatus {
    result?.pointee = nil
    return SecItemCall.status { () throws(SecFailure) in
        let r = try SecItemCall.Request(parsing: attributes, for: .add)
        let made = try r.add()
        result?.pointee = made
    }
}

/// Searches (kSecMatchLimit, kSecReturn…): `result` gets the match's requested part, a dictionary of parts, or
/// an array of them for a limit other than one; errSecItemNotFound when nothing matches.
public func SecItemCopyMatching(_ query: CFDictionary, _ result: UnsafeMutablePointer<CFTypeRef?>?) -> OSStatus {
    result?.pointee = nil
    return SecItemCall.status { () throws(SecFailure) in
        let r = try SecItemCall.Request(parsing: query, for: .search)
        // Not `result?.pointee = try …`: with no result pointer, optional chaining would skip the search itself.
        let found = try r.copyMatching()
        result?.pointee = found
    }
}

/// Changes every item matching `query`: attributes, and the secret with kSecValueData.
public func SecItemUpdate(_ query: CFDictionary, _ attributesToUpdate: CFDictionary) -> OSStatus {
    SecItemCall.status { () throws(SecFailure) in
        let r = try SecItemCall.Request(parsing: query, for: .search)
        let changes = try SecItemCall.Request(parsing: attributesToUpdate, for: .changes)
        try r.update(changes)
    }
}

/// Deletes every item matching `query`.
public func SecItemDelete(_ query: CFDictionary) -> OSStatus {
    SecItemCall.status { () throws(SecFailure) in
        let r = try SecItemCall.Request(parsing: query, for: .search)
        try r.delete()
    }
}

enum SecItemCall {
    static func status(_ body: () throws(SecFailure) -> Void) -> OSStatus {
        do {
            try body()
            return errSecSuccess
        } catch {
            return error.status
        }
    }

    enum Use { case add, search, changes }
    enum UI { case allow, fail, skip }

    /// One Security dictionary, read and checked.
    struct Request {
        var itemClass: ItemClass?
        var attributes: Attributes = [:]
        var limit: MatchLimit = .one
        var returnData = false, returnAttributes = false, returnRef = false, returnPersistentRef = false
        /// kSecValueData, copied straight into secure memory (never into an array of its own).
        var valueData: SecureBytes?
        /// kSecValueRef: a SecKey or a SecCertificate.
        var valueRef: ValueRef?
        var persistentRef: [UInt8]?
        var context: (any SecAuthenticationContext)?
        var prompt: String?
        var ui = UI.allow
        var synchronizableAny = false
        let use: Use

        init(parsing dictionary: CFDictionary, for use: Use) throws(SecFailure) {
            self.use = use
            var accessControl: SecAccessControl?
            var unknown: [String] = []
            var keyClassGiven: AnyObject?, keyTypeGiven: AnyObject?
            // Room for every attribute given and the `sync` a search adds: no rehashing while filling (made at
            // that size: `reserveCapacity` on the empty dictionary goes through the unspecialized library code).
            attributes = Attributes(minimumCapacity: dictionary.count + 1)
            // The classes every attribute the loop adds belongs to, and whether it gave kSecAttrAccessible or
            // kSecAttrSynchronizable: checked below without looking each name up again.
            var classes = ClassSet.all
            var protectionGiven = false, syncGiven = false
            let roles = RoleTable.shared
            try ValueConversion.forEachEntry(dictionary) { key, value throws(SecFailure) in
                // One lookup says what the key is (Apple's dictionary keys and Coffer's catalog, which is Apple's).
                guard let role = roles.role(key) else {
                    unknown.append(key)
                    return
                }
                switch role {
                case .itemClass:
                    guard use != .changes else { throw .param("kSecClass cannot be changed") }
                    guard let s = ValueConversion.string(value) else { throw .param("kSecClass is not a string") }
                    if s == "idnt" { throw .unimplemented("Coffer stores no identities (kSecClassIdentity)") }
                    guard let c = ItemClass(rawValue: s) else { throw .param("unknown kSecClass \(s)") }
                    itemClass = c
                case .matchLimit:
                    guard use == .search else { throw .param("kSecMatchLimit belongs in a search") }
                    if let s = ValueConversion.string(value) {
                        switch s {
                        case "m_LimitOne": limit = .one
                        case "m_LimitAll": limit = .all
                        default: throw .param("unknown kSecMatchLimit \(s)")
                        }
                    } else if let n = ValueConversion.integer(value), n >= 1 {
                        limit = n == 1 ? .one : .count(Int(n))
                    } else {
                        throw .param("kSecMatchLimit is neither kSecMatchLimitOne, kSecMatchLimitAll nor a positive number")
                    }
                case .returnData, .returnAttributes, .returnRef, .returnPersistentRef:
                    guard use != .changes else { throw .param("\(key) does not belong in the changes") }
                    guard let b = ValueConversion.bool(value) else { throw .param("\(key) is not a boolean") }
                    switch role {
                    case .returnData: returnData = b
                    case .returnAttributes: returnAttributes = b
                    case .returnRef: returnRef = b
                    default: returnPersistentRef = b
                    }
                case .valueData:
                    guard use != .search else { throw .param("kSecValueData does not belong in a search") }
                    guard let d = ValueConversion.secret(value) else { throw .param("kSecValueData is not Data") }
                    valueData = d
                case .valueRef:
                    guard use != .changes else { throw .param("kSecValueRef cannot be changed") }
                    switch ValueConversion.unwrapped(value) {
                    case let k as SecKey: valueRef = .key(k)
                    case let c as SecCertificate: valueRef = .certificate(c)
                    default: throw .param("kSecValueRef is neither a SecKey nor a SecCertificate")
                    }
                case .valuePersistentRef:
                    guard use == .search, let d = ValueConversion.data(value) else { throw .param("kSecValuePersistentRef is not Data") }
                    persistentRef = d
                case .authenticationContext:
                    guard use != .changes else { throw .param("kSecUseAuthenticationContext does not belong in the changes") }
                    guard let c = ValueConversion.unwrapped(value) as? any SecAuthenticationContext else {
                        throw .param("kSecUseAuthenticationContext is not an LAContext")
                    }
                    context = c
                case .operationPrompt:
                    guard let s = ValueConversion.string(value) else { throw .param("kSecUseOperationPrompt is not a string") }
                    prompt = s
                case .authenticationUI:
                    switch ValueConversion.string(value) {
                    case "u_AuthUIA": ui = .allow
                    case "u_AuthUIF": ui = .fail
                    case "u_AuthUIS": ui = .skip
                    default: throw .param("kSecUseAuthenticationUI is not kSecUseAuthenticationUIAllow, …Fail or …Skip")
                    }
                case .noAuthenticationUI:
                    guard let b = ValueConversion.bool(value) else { throw .param("kSecUseNoAuthenticationUI is not a boolean") }
                    if b { ui = .fail }
                case .dataProtectionKeychain:
                    // kSecUseDataProtectionKeychain: Coffer's keychain is the data protection keychain.
                    guard ValueConversion.bool(value) != nil else { throw .param("kSecUseDataProtectionKeychain is not a boolean") }
                case .accessControl:
                    guard let a = ValueConversion.unwrapped(value) as? SecAccessControl else {
                        throw .param("kSecAttrAccessControl is not a SecAccessControl")
                    }
                    accessControl = a
                case .synchronizable:
                    if ValueConversion.string(value) == "syna" {
                        guard use == .search else { throw .param("kSecAttrSynchronizableAny belongs in a search") }
                        synchronizableAny = true
                    } else if let b = ValueConversion.bool(value) {
                        attributes["sync"] = .bool(b)
                        syncGiven = true
                    } else {
                        throw .param("kSecAttrSynchronizable is not a boolean")
                    }
                case .tokenID:
                    // kSecAttrTokenID: only SecKeyCreateRandomKey makes keys in the agent; a search names none.
                    guard ValueConversion.string(value) == "com.apple.setoken" else { throw .param("unknown kSecAttrTokenID") }
                case .keyClass: keyClassGiven = value
                case .keyType: keyTypeGiven = value
                case .attribute(let kind, let belongsTo, let readOnly):
                    guard use == .search || !readOnly else { throw .param("\(key) is set by the keychain") }
                    guard let v = ValueConversion.attribute(kind, value) else { throw .param("\(key) is not a \(kind.rawValue)") }
                    attributes[key] = v
                    classes.formIntersection(belongsTo)
                    if key == "pdmn" { protectionGiven = true }
                }
            }
            guard unknown.isEmpty else { throw .param("unknown attribute \(unknown.sorted().joined(separator: ", "))") }
            // Attributes added from here on (rare: a reference, a key class or type, an access control) are checked
            // with the whole class check below.
            var addedLater = false
            if let ref = valueRef {
                // As Apple's: the reference brings its class (kSecClass may be left out) and, in a search, what
                // identifies its item; attributes the dictionary gives win.
                guard itemClass == nil || itemClass == ref.itemClass else {
                    throw .param("kSecValueRef is a \(ref.itemClass == .key ? "SecKey" : "SecCertificate"), not an item of kSecClass \(itemClass!.rawValue)")
                }
                itemClass = ref.itemClass
                if use == .search {
                    let (match, reference) = try ref.searchAttributes()
                    for (k, v) in match where attributes[k] == nil {
                        attributes[k] = v
                        addedLater = true
                    }
                    if persistentRef == nil { persistentRef = reference }
                }
            }
            // kSecAttrKeyClass and kSecAttrKeyType come as Apple's strings ("1", "73") or numbers.
            if let v = keyClassGiven {
                guard let n = ValueConversion.integer(v) else { throw .param("kSecAttrKeyClass is not a key class") }
                attributes["kcls"] = .integer(n)
                addedLater = true
            }
            if let v = keyTypeGiven {
                guard let n = ValueConversion.integer(v) else { throw .param("kSecAttrKeyType / kSecAttrType is not a number") }
                attributes["type"] = .integer(n)
                addedLater = true
            }
            // An access control in a search (Apple's samples put one there) is not a search criterion.
            if let a = accessControl, use != .search {
                if case .string(let given)? = attributes["pdmn"], given != a.protection.shortCode {
                    throw .param("kSecAttrAccessible and kSecAttrAccessControl's protection disagree")
                }
                attributes["pdmn"] = .string(a.protection.shortCode)
                if let rule = a.rule { attributes["accc"] = .data(rule.encoded()) }
                addedLater = true
            }
            if protectionGiven || addedLater, case .string(let p)? = attributes["pdmn"], ProtectionClass(parsing: p)?.shortCode != p {
                throw .param("kSecAttrAccessible is not one of its values")
            }
            if let c = itemClass, addedLater ? !attributes.keys.allSatisfy(Self.allowed[c]!.contains) : !classes.contains(c) {
                let allowed = Self.allowed[c]!
                let wrong = attributes.keys.filter { !allowed.contains($0) }
                throw .param("attribute \(wrong.sorted().joined(separator: ", ")) does not belong to kSecClass \(c.rawValue)")
            }
            if use == .search && !synchronizableAny && !syncGiven && (!addedLater || attributes["sync"] == nil) {
                // As on Apple platforms: a search without kSecAttrSynchronizable matches local items only.
                attributes["sync"] = .bool(false)
            }
        }

        /// What a key of a Security dictionary is.
        enum Role {
            case itemClass, matchLimit, returnData, returnAttributes, returnRef, returnPersistentRef, valueData, valueRef,
                 valuePersistentRef, authenticationContext, operationPrompt, authenticationUI, noAuthenticationUI,
                 dataProtectionKeychain, accessControl, synchronizable, tokenID, keyClass, keyType
            /// An attribute of Coffer's catalog (not one of the above): its kind, the classes it belongs to, and
            /// whether only the keychain sets it.
            case attribute(AttributeValue.Kind, belongsTo: ClassSet, readOnly: Bool)

            /// Every key by its string (Apple's; the attributes' are Coffer's catalog's names, general attributes
            /// excepted).
            static let all: [String: Role] = {
                var r: [String: Role] = [:]
                for (name, kind) in AttributeCatalog.kinds where !GeneralAttributes.isGeneral(name) {
                    let belongsTo = ClassSet(ItemClass.allCases.filter { allowed[$0]!.contains(name) })
                    r[name] = .attribute(kind, belongsTo: belongsTo, readOnly: AttributeCatalog.readOnly.contains(name))
                }
                let special: [String: Role] = [
                    "class": .itemClass, "m_Limit": .matchLimit, "r_Data": .returnData, "r_Attributes": .returnAttributes,
                    "r_Ref": .returnRef, "r_PersistentRef": .returnPersistentRef, "v_Data": .valueData, "v_Ref": .valueRef,
                    "v_PersistentRef": .valuePersistentRef, "u_AuthCtx": .authenticationContext, "u_OpPrompt": .operationPrompt,
                    "u_AuthUI": .authenticationUI, "u_NoAuthUI": .noAuthenticationUI, "nleg": .dataProtectionKeychain,
                    "accc": .accessControl, "sync": .synchronizable, "tkid": .tokenID, "kcls": .keyClass, "type": .keyType,
                ]
                r.merge(special) { _, given in given }
                return r
            }()
        }

        /// ``Role/all`` looked up without hashing a String (Swift's SipHash of the name was most of a lookup in
        /// the dictionary, some 360 instructions a key): a name of up to 16 UTF-8 bytes (every one of Apple's keys
        /// and the catalog's) is packed into two words and found by open addressing with a multiplicative hash;
        /// a longer one (none now) in a dictionary beside it.
        struct RoleTable {
            private struct Slot {
                var low: UInt64 = 0, high: UInt64 = 0
                var length = -1
                var role: Role?
            }
            private let slots: [Slot]
            private let mask: Int
            private let long: [String: Role]

            static let shared = RoleTable(Role.all)

            init(_ all: [String: Role]) {
                var size = 16
                while size < all.count * 4 { size *= 2 }
                var slots = [Slot](repeating: Slot(), count: size)
                var long: [String: Role] = [:]
                for (name, role) in all {
                    guard let (low, high, length) = Self.packed(name) else {
                        long[name] = role
                        continue
                    }
                    var i = Self.hash(low, high, length) & (size - 1)
                    while slots[i].length >= 0 { i = (i + 1) & (size - 1) }
                    slots[i] = Slot(low: low, high: high, length: length, role: role)
                }
                self.slots = slots
                self.mask = size - 1
                self.long = long
            }

            func role(_ name: String) -> Role? {
                guard let (low, high, length) = Self.packed(name) else { return long.isEmpty ? nil : long[name] }
                var i = Self.hash(low, high, length) & mask
                while true {
                    let s = slots[i]
                    if s.length < 0 { return nil }
                    if s.low == low && s.high == high && s.length == length { return s.role }
                    i = (i + 1) & mask
                }
            }

            /// The name's UTF-8 bytes in two little-endian words and its length; nil if longer than 16 bytes.
            private static func packed(_ name: String) -> (UInt64, UInt64, Int)? {
                if let r = name.utf8.withContiguousStorageIfAvailable(packed) { return r }
                // A string without contiguous UTF-8 (none on Linux): packed from a copy.
                var copy = name
                copy.makeContiguousUTF8()
                return copy.utf8.withContiguousStorageIfAvailable(packed) ?? nil
            }

            private static func packed(_ bytes: UnsafeBufferPointer<UInt8>) -> (UInt64, UInt64, Int)? {
                guard bytes.count <= 16 else { return nil }
                var low: UInt64 = 0, high: UInt64 = 0
                for i in 0..<bytes.count {
                    if i < 8 { low |= UInt64(bytes[i]) << (8 * UInt64(i)) } else { high |= UInt64(bytes[i]) << (8 * UInt64(i - 8)) }
                }
                return (low, high, bytes.count)
            }

            private static func hash(_ low: UInt64, _ high: UInt64, _ length: Int) -> Int {
                let h = (low &* 0x9E37_79B9_7F4A_7C15) ^ ((high &+ UInt64(length)) &* 0xC2B2_AE3D_27D4_EB4F)
                return Int(truncatingIfNeeded: h >> 32)
            }
        }

        /// A set of item classes, as bits.
        struct ClassSet {
            private var bits: UInt8
            /// Every class (not a `static let`: no once-check on each call).
            static var all: ClassSet { ClassSet(bits: 0b1111) }
            private init(bits: UInt8) { self.bits = bits }
            init(_ classes: [ItemClass]) { bits = classes.reduce(0) { $0 | Self.bit($1) } }
            func contains(_ c: ItemClass) -> Bool { bits & Self.bit(c) != 0 }
            mutating func formIntersection(_ other: ClassSet) { bits &= other.bits }
            private static func bit(_ c: ItemClass) -> UInt8 {
                switch c {
                case .genericPassword: 1
                case .internetPassword: 2
                case .key: 4
                case .certificate: 8
                }
            }
        }

        /// The attributes each class takes (Coffer's catalog, which is Apple's), computed once.
        static let allowed: [ItemClass: Set<String>] = Dictionary(uniqueKeysWithValues: ItemClass.allCases.map {
            ($0, $0.allowedAttributes.union(["pdmn", "sync", "agrp"]))
        })

        /// The call's LAContext, prompt and UI choice (a key reference it returns keeps them for its signatures).
        var authentication: KeyAuthentication { KeyAuthentication(context: context, prompt: prompt, noUserInterface: ui != .allow) }

        /// The options this call runs with, and its session (the context's, or the process's).
        private var session: (AgentSession, AgentSession.Options) { authentication.session }

        private var returnFlags: ReturnFlags {
            var f: ReturnFlags = []
            if returnData { f.insert(.data) }
            if returnAttributes || returnRef { f.insert(.attributes) }
            if returnPersistentRef || returnRef { f.insert(.persistentRef) }
            return f
        }

        private var query: ItemQuery {
            // A certificate's reference is made from its data: asked for with the search.
            ItemQuery(itemClass: itemClass, attributes: attributes, limit: limit, returnData: returnData || (returnRef && itemClass == .certificate),
                      returnAttributes: returnAttributes || returnRef, returnPersistentRef: returnPersistentRef || returnRef,
                      persistentRef: persistentRef)
        }

        func add() throws(SecFailure) -> CFTypeRef? {
            guard let itemClass else { throw .param("SecItemAdd needs kSecClass") }
            var attrs = attributes
            let secret: SecureBytes
            switch valueRef {
            case .key(let key)?:
                guard let stored = key.storedForm else {
                    throw SecFailure(errSecDuplicateItem, "the key is already an item of the keychain (made in the agent)")
                }
                for (k, v) in stored.attributes where attrs[k] == nil { attrs[k] = v }
                secret = stored.secret
            case .certificate(let certificate)?:
                guard valueData == nil else { throw .param("kSecValueRef and kSecValueData both give the certificate") }
                // Apple's attributes of a certificate item; those the dictionary gives win.
                for (k, v) in certificate.itemAttributes where attrs[k] == nil { attrs[k] = v }
                secret = certificate.der.withUnsafeBytes { SecureBytes(copying: $0) }
            case nil:
                if itemClass == .certificate && valueData == nil {
                    throw .param("a certificate item needs kSecValueRef (a SecCertificate) or kSecValueData (its DER bytes)")
                }
                secret = valueData ?? SecureBytes(count: 0)
            }
            let item = NewItem(itemClass: itemClass, attributes: attrs, secret: secret)
            let flags = returnFlags
            let (s, options) = session
            let made = try s.run(options: options, retry: false) { c throws(SecError) in try c.add(item, returning: flags) }
            guard !flags.isEmpty, var made else { return nil }
            // A reference is made from what was added (the agent need not send the secret back for it).
            if returnRef && made.data == nil && (itemClass == .certificate || itemClass == .key) { made.data = secret }
            return try shape([made], single: true)
        }

        /// kSecReturnRef gives a SecKey for a key item and a SecCertificate for a certificate item. A password item
        /// has no reference on Apple's data protection keychain (Apple's SecItem makes none for genp and inet):
        /// as there, the request is ignored for it — alone it gives no value (nil for kSecMatchLimitOne, an
        /// empty array otherwise) and errSecSuccess when something matched; beside other return types, the
        /// other parts.
        func copyMatching() throws(SecFailure) -> CFTypeRef? {
            try search()
        }

        private func search() throws(SecFailure) -> CFTypeRef? {
            let q = query
            let (s, options) = session
            var items: [ItemResult]
            do {
                items = try s.run(options: options) { c throws(SecError) in try c.copyMatching(q) }
            } catch where ui == .skip && error.status == errSecInteractionNotAllowed {
                // kSecUseAuthenticationUISkip: what would need the person is left out.
                items = try skippingProtected(q, session: s, options: options)
            }
            // A search asking for nothing back only tells whether something matched.
            guard !items.isEmpty else { throw SecFailure(errSecItemNotFound, "no item matches") }
            if returnRef { items = try withReferenceData(items, session: s, options: options) }
            guard returnData || returnAttributes || returnRef || returnPersistentRef else { return nil }
            return try shape(items, single: limit == .one)
        }

        /// kSecUseAuthenticationUISkip: the matches listed by attributes (which never need the person), then
        /// each one's data asked for alone, without asking anyone; those that would need the person are left out.
        private func skippingProtected(_ q: ItemQuery, session s: AgentSession, options: AgentSession.Options) throws(SecFailure) -> [ItemResult] {
            var listing = q
            listing.limit = .all
            listing.returnData = false
            listing.returnAttributes = true
            listing.returnPersistentRef = true
            let all = try s.run(options: options) { c throws(SecError) in try c.copyMatching(listing) }
            var out: [ItemResult] = []
            for var item in all {
                if let bound = q.limit.bound, out.count >= bound { break }
                guard let ref = item.persistentRef else { continue }
                if q.returnData {
                    let one = ItemQuery(itemClass: item.itemClass, returnData: true, persistentRef: ref)
                    do {
                        item.data = try s.run(options: options) { c throws(SecError) in try c.copyMatching(one) }.first?.data
                    } catch where error.status == errSecInteractionNotAllowed {
                        continue
                    }
                }
                if !q.returnAttributes { item.attributes = nil }
                if !q.returnPersistentRef { item.persistentRef = nil }
                out.append(item)
            }
            return out
        }

        /// Items asked for as references whose reference needs their data: a certificate (its DER bytes) and a
        /// key stored in software (its secret), each read by persistent reference when the search did not return it.
        private func withReferenceData(_ items: [ItemResult], session s: AgentSession, options: AgentSession.Options) throws(SecFailure) -> [ItemResult] {
            var out: [ItemResult] = []
            out.reserveCapacity(items.count)
            for var item in items {
                let needsData = switch item.itemClass {
                case .certificate: true
                case .key: item.attributes.map { !KeyItem.isNonExtractable($0) } ?? false
                default: false
                }
                if needsData, item.data == nil, let ref = item.persistentRef {
                    let q = ItemQuery(itemClass: item.itemClass, returnData: true, persistentRef: ref)
                    item.data = try s.run(options: options) { c throws(SecError) in try c.copyMatching(q) }.first?.data
                }
                out.append(item)
            }
            return out
        }

        func update(_ changes: Request) throws(SecFailure) {
            guard changes.valueRef == nil else { throw .param("kSecValueRef cannot be changed") }
            let c = ItemChanges(attributes: changes.attributes, secret: changes.valueData)
            guard !c.attributes.isEmpty || c.secret != nil else { throw .param("SecItemUpdate with nothing to change") }
            var q = query
            q.limit = .all
            q.returnData = false; q.returnAttributes = false; q.returnPersistentRef = false
            let query = q
            let (s, options) = session
            _ = try s.run(options: options, retry: false) { conn throws(SecError) in try conn.update(query, c) }
        }

        func delete() throws(SecFailure) {
            var q = query
            q.limit = .all
            q.returnData = false; q.returnAttributes = false; q.returnPersistentRef = false
            let query = q
            let (s, options) = session
            _ = try s.run(options: options, retry: false) { conn throws(SecError) in try conn.delete(query) }
        }

        /// Apple's result shapes: one requested part alone, several in a dictionary; an array of those for a
        /// search whose limit is not one. The values are made as the Foundation objects the caller's casts read
        /// (NSData straight from the secret's secure memory: one copy, not a Data bridged again).
        private func shape(_ items: [ItemResult], single: Bool) throws(SecFailure) -> CFTypeRef? {
            if single {
                // The first match that gives something (a certificate item that is not a certificate gives no reference).
                for item in items {
                    if let value = try shaped(item) { return value }
                }
                return nil
            }
            var values: [AnyObject] = []
            values.reserveCapacity(items.count)
            for item in items {
                if let value = try shaped(item) { values.append(value) }
            }
            return NSArray(array: values)
        }

        /// One item's requested parts: the part alone, or a dictionary of them; nil if it has none of them.
        private func shaped(_ item: ItemResult) throws(SecFailure) -> AnyObject? {
            let parts = (returnData ? 1 : 0) + (returnAttributes ? 1 : 0) + (returnRef ? 1 : 0) + (returnPersistentRef ? 1 : 0)
            let data: NSData? = returnData ? item.data.map { s in s.withUnsafeBytes { NSData(bytes: $0.baseAddress, length: $0.count) } } : nil
            let ref: AnyObject?
            switch (returnRef, item.itemClass) {
            case (true, .key):
                guard let k = SecKey(item: item, authentication: authentication) else {
                    throw SecFailure(errSecInternalComponent, "a key item that is not a key")
                }
                ref = k
            case (true, .certificate):
                // As Apple's: an item whose data is not a certificate gives no reference (it is left out).
                ref = item.data.flatMap { d in d.withUnsafeBytes { SecCertificate(der: [UInt8]($0)) } }
            default:
                ref = nil
            }
            if parts == 1 {
                if returnData { return data }
                if returnAttributes { return item.attributes.map { Self.dictionary($0, itemClass: item.itemClass) as NSDictionary } }
                if returnRef { return ref }
                return item.persistentRef.map { p in NSData(bytes: p, length: p.count) }
            }
            var d: [String: Any] = returnAttributes ? (item.attributes.map { Self.dictionary($0, itemClass: item.itemClass) } ?? [:]) : [:]
            if let data { d["v_Data"] = data }
            if let ref { d["v_Ref"] = ref }
            if returnPersistentRef, let p = item.persistentRef { d["v_PersistentRef"] = NSData(bytes: p, length: p.count) }
            return d as NSDictionary
        }

        /// An item's attributes as Apple's dictionary: short names, Foundation values, the class, the access
        /// control as a SecAccessControl; Coffer's general attributes are left out.
        static func dictionary(_ attributes: Attributes, itemClass: ItemClass) -> [String: Any] {
            var d: [String: Any] = ["class": itemClass.rawValue]
            for (k, v) in attributes where !GeneralAttributes.isGeneral(k) {
                if k == "accc", case .data(let bytes) = v, case .string(let p)? = attributes["pdmn"],
                   let pc = ProtectionClass(parsing: p), let a = SecAccessControl(stored: bytes, protection: pc) {
                    d[k] = a
                } else {
                    d[k] = ValueConversion.object(v)
                }
            }
            return d
        }
    }
}
/// kSecValueRef: what an item is made from (SecItemAdd) or what a search, an update or a delete names.
enum ValueRef {
    case key(SecKey)
    case certificate(SecCertificate)

    var itemClass: ItemClass {
        switch self {
        case .key: .key
        case .certificate: .certificate
        }
    }

    /// What identifies the reference's item in a search (as Apple's query from a reference, its attribute
    /// dictionary): a certificate's primary key; a key held by the agent its persistent reference; a key of
    /// this process its class, type and application label (the SHA-256 of its public key, as SecItemAdd
    /// stores it).
    func searchAttributes() throws(SecFailure) -> (Attributes, [UInt8]?) {
        switch self {
        case .certificate(let c):
            return (c.searchAttributes, nil)
        case .key(let k):
            if case .agent(let ref, _, _) = k.storage { return ([:], ref) }
            guard let type = KeyEncoding.keyType(k.algorithm) else { throw .param("kSecValueRef is a key of no stored type") }
            let cls: KeyItem.KeyClass = k.isPrivate ? .private : .public
            return (["kcls": .integer(cls.rawValue), "type": .integer(type.rawValue),
                     "klbl": .data(SHA256.hash(KeyEncoding.publicRepresentation(k.publicComponents)))], nil)
        }
    }
}
#endif
