import CofferCrypto
import CofferKeybag
import CofferModel
import CofferStore
import CofferSystem
import Glibc

/// The keychain: SecItem semantics (add, copyMatching, update, delete) over the keybag and the
/// encrypted item store.
///
/// Thread-safe: operations are serialised on one mutex (SQLite work is short); slow work such as
/// Argon2id in ``unlock(passcode:)`` runs outside it.
public final class Keychain: @unchecked Sendable {
    // @unchecked Sendable: `store` is only touched while holding `mutex`.
    /// The keybag holding the class keys.
    public let keybag: Keybag
    private let store: ItemStore
    private let mutex = Lock()
    /// The access group given to items added without `agrp`.
    public let defaultAccessGroup: String

    /// File names inside the state directory.
    public enum FileNames {
        /// The SQLite item database.
        public static let database = "keychain.db"
        /// The embedded default device key.
        public static let deviceKey = "device.key"
    }

    /// Opens (creating on first use) the keychain in `directory` with `deviceKey` (default: the
    /// file `device.key` in the same directory).
    public init(directory: String, deviceKey: DeviceKeySource? = nil, defaultAccessGroup: String = "coffer.default") throws(SecError) {
        let source = deviceKey ?? FileDeviceKey(path: directory + "/" + FileNames.deviceKey)
        keybag = try Keybag.openOrCreate(directory: directory, deviceKey: source)
        store = try ItemStore(path: directory + "/" + FileNames.database)
        self.defaultAccessGroup = defaultAccessGroup
    }

    // MARK: Keybag pass-through

    /// Unlocks the keybag (the passcode was checked by PAM first, in the agent).
    public func unlock(passcode: SecureBytes?) throws(SecError) { try keybag.unlock(passcode: passcode) }
    /// Locks the keybag.
    public func lock() { keybag.lock() }
    /// Sets or changes the keybag passcode.
    public func setPasscode(current: SecureBytes?, new: SecureBytes, kdf: KDFPolicy = .standard) throws(SecError) {
        try keybag.setPasscode(current: current, new: new, kdf: kdf)
    }

    /// Number of items (all classes, locked or not).
    public func count() throws(SecError) -> Int { try mutex.withLock { () throws(SecError) in try store.count() } }

    /// Runs SQLite's integrity check on the database.
    public func integrityCheck() throws(SecError) -> Bool { try mutex.withLock { () throws(SecError) in try store.integrityCheck() } }

    /// Checkpoints the write-ahead log (clean shutdown).
    public func checkpoint() { mutex.withLock { store.checkpoint() } }

    // MARK: SecItemAdd

    /// Adds an item (SecItemAdd). errSecDuplicateItem if its class's primary key exists,
    /// errSecInteractionNotAllowed if its class key is locked, errSecNotAvailable for
    /// WhenPasscodeSetThisDeviceOnly with no passcode, errSecParam for bad attributes.
    @discardableResult
    public func add(_ item: NewItem, returnData: Bool = false, returnAttributes: Bool = false,
                    returnPersistentRef: Bool = false) throws(SecError) -> ItemResult {
        try Validation.check(item.attributes, for: item.itemClass, writing: true)
        let (attrs, protection) = try completed(item.attributes)
        let ref = Random.bytes(16)
        return try mutex.withLock { () throws(SecError) in
            let content = try item.secret.withUnsafeBytes { s throws(SecError) in
                try seal(itemClass: item.itemClass, attributes: attrs, secret: s, protection: protection, ref: ref)
            }
            // The row and its index entries commit together (one transaction) or not at all.
            try store.transaction { () throws(SecError) in _ = try store.insert(content) }
            return ItemResult(itemClass: item.itemClass,
                              attributes: returnAttributes ? attrs : nil,
                              data: returnData ? SecureBytes(copying: item.secret.withUnsafeBytes { $0 }) : nil,
                              persistentRef: returnPersistentRef ? ref : nil)
        }
    }

    /// Adds many items in one transaction: all of them or none (imports, restores).
    public func add(contentsOf items: [NewItem]) throws(SecError) {
        var prepared: [(NewItem, Attributes, ProtectionClass)] = []
        for item in items {
            try Validation.check(item.attributes, for: item.itemClass, writing: true)
            let (attrs, protection) = try completed(item.attributes)
            prepared.append((item, attrs, protection))
        }
        try mutex.withLock { () throws(SecError) in
            try store.transaction { () throws(SecError) in
                for (item, attrs, protection) in prepared {
                    let content = try item.secret.withUnsafeBytes { s throws(SecError) in
                        try seal(itemClass: item.itemClass, attributes: attrs, secret: s, protection: protection, ref: Random.bytes(16))
                    }
                    try store.insert(content)
                }
            }
        }
    }

    /// Fills in the defaults an added item gets: protection, access group, sync, dates.
    private func completed(_ given: Attributes) throws(SecError) -> (Attributes, ProtectionClass) {
        var attrs = given
        let protection = try Validation.protection(of: attrs) ?? .defaultForNewItems
        attrs["pdmn"] = .string(protection.shortCode)
        if attrs["agrp"] == nil { attrs["agrp"] = .string(defaultAccessGroup) }
        if attrs["sync"] == nil { attrs["sync"] = .bool(false) }
        let now = AttributeValue.date(Self.now())
        attrs["cdat"] = now
        attrs["mdat"] = now
        return (attrs, protection)
    }

    // MARK: SecItemCopyMatching

    /// Finds items (SecItemCopyMatching): the first match unless `limit` says otherwise.
    /// errSecItemNotFound when nothing matches; errSecInteractionNotAllowed when a candidate's
    /// class key is locked (its attributes cannot even be compared).
    public func copyMatching(_ query: ItemQuery) throws(SecError) -> [ItemResult] {
        try Validation.check(query)
        return try mutex.withLock { () throws(SecError) in
            var results: [ItemResult] = []
            try store.reading { () throws(SecError) in
                try forEachMatch(query, limit: query.limit.bound) { (row, cls, attrs) throws(SecError) in
                    var r = ItemResult(itemClass: cls)
                    if query.returnAttributes { r.attributes = attrs }
                    if query.returnPersistentRef { r.persistentRef = row.persistentRef }
                    if query.returnData { r.data = try openSecret(row) }
                    results.append(r)
                }
            }
            guard !results.isEmpty else { throw .itemNotFound() }
            return results
        }
    }

    // MARK: SecItemCopyMatching, one page at a time

    /// One page of a search (``copyMatchingPage(_:after:fits:)``).
    public struct MatchPage: Sendable {
        /// The results, oldest first.
        public var items: [ItemResult]
        /// Row id of the last result (the cursor of the next page); the given cursor when empty.
        public var lastRowID: Int64
        /// True when nothing is left: the matches ran out or `query.limit` items were returned.
        public var isComplete: Bool
    }

    /// SecItemCopyMatching for a paged reply: the matches after row id `cursor` (0: from the start),
    /// oldest first, at most `query.limit`, each offered to `fits` in turn; the first result `fits`
    /// refuses ends the page (incomplete; that result is dropped). errSecItemNotFound only when
    /// nothing matches from the start (`cursor` 0); a later page may be empty and complete.
    public func copyMatchingPage(_ query: ItemQuery, after cursor: Int64,
                                 fits: (ItemResult) -> Bool) throws(SecError) -> MatchPage {
        try Validation.check(query)
        return try mutex.withLock { () throws(SecError) in
            var items: [ItemResult] = []
            var lastRowID = cursor, refused = false
            try store.reading { () throws(SecError) in
                try forEachMatch(query, limit: query.limit.bound, after: cursor, until: { refused }) { (row, cls, attrs) throws(SecError) in
                    var r = ItemResult(itemClass: cls)
                    if query.returnAttributes { r.attributes = attrs }
                    if query.returnPersistentRef { r.persistentRef = row.persistentRef }
                    if query.returnData { r.data = try openSecret(row) }
                    guard fits(r) else { refused = true; return }
                    items.append(r)
                    lastRowID = row.id
                }
            }
            guard !items.isEmpty || refused || cursor > 0 else { throw .itemNotFound() }
            return MatchPage(items: items, lastRowID: lastRowID, isComplete: !refused)
        }
    }

    // MARK: SecItemUpdate

    /// Updates every matching item (SecItemUpdate); returns how many. A new `pdmn` re-wraps the item
    /// under that class; otherwise its protection is kept. All changes commit together or none do.
    @discardableResult
    public func update(_ query: ItemQuery, _ changes: ItemChanges) throws(SecError) -> Int {
        try Validation.check(query)
        try Validation.check(changes.attributes, for: nil, writing: true)
        guard !changes.attributes.isEmpty || changes.secret != nil else { throw .param("nothing to update") }
        let newProtection = try Validation.protection(of: changes.attributes)
        return try mutex.withLock { () throws(SecError) in
            var matches: [(StoredRow, ItemClass, Attributes)] = []
            try forEachMatch(query, limit: nil) { (row, cls, attrs) throws(SecError) in matches.append((row, cls, attrs)) }
            guard !matches.isEmpty else { throw .itemNotFound() }
            return try store.transaction { () throws(SecError) in
                for (row, cls, old) in matches {
                    try Validation.check(changes.attributes, for: cls, writing: true)
                    var attrs = old.merging(changes.attributes) { $1 }
                    attrs["mdat"] = .date(Self.now())
                    let oldProtection = ProtectionClass(rawValue: row.protectionClass)!
                    let protection = newProtection ?? oldProtection
                    attrs["pdmn"] = .string(protection.shortCode)
                    let secret: SecureBytes
                    if let s = changes.secret { secret = s } else { secret = try openSecret(row) }
                    let content = try secret.withUnsafeBytes { s throws(SecError) in
                        try seal(itemClass: cls, attributes: attrs, secret: s, protection: protection, ref: row.persistentRef)
                    }
                    try store.replace(id: row.id, with: content)
                }
                return matches.count
            }
        }
    }

    // MARK: SecItemDelete

    /// Deletes every matching item (SecItemDelete); returns how many.
    @discardableResult
    public func delete(_ query: ItemQuery) throws(SecError) -> Int {
        try Validation.check(query)
        return try mutex.withLock { () throws(SecError) in
            var ids: [Int64] = []
            try forEachMatch(query, limit: nil) { (row, _, _) throws(SecError) in ids.append(row.id) }
            guard !ids.isEmpty else { throw .itemNotFound() }
            try store.transaction { () throws(SecError) in
                for id in ids { try store.delete(id: id) }
            }
            return ids.count
        }
    }

    // MARK: Internals (hold `mutex`)

    /// Visits matching items oldest first. Candidates come from the blind indexes; each is decrypted
    /// and compared in full, so a tampered index can never return a wrong item.
    /// Paging: only rows after row id `cursor`, and `done` (asked after each match) ends the visit early.
    private func forEachMatch(_ q: ItemQuery, limit: Int?, after cursor: Int64 = 0, until done: () -> Bool = { false },
                              _ body: (StoredRow, ItemClass, Attributes) throws(SecError) -> Void) throws(SecError) {
        var found = 0
        func visit(_ row: StoredRow) throws(SecError) -> Bool {
            let (cls, attrs) = try openAttributes(row)
            guard Self.matches(q, cls, attrs) else { return true }
            try body(row, cls, attrs)
            found += 1
            return !done() && (limit.map { found < $0 } ?? true)
        }
        if let ref = q.persistentRef {
            if let row = try store.row(persistentRef: ref), row.id > cursor { _ = try visit(row) }
            return
        }
        var probe = q.attributes.filter { AttributeCatalog.indexed.contains($0.key) }
        if let c = q.itemClass { probe["class"] = .string(c.rawValue) }
        let hashes = try keybag.withIndexKey { k throws(SecError) -> [[UInt8]] in
            // The common lookup (service + account, server + account) has its own entry: one seek, a
            // handful of candidates at most, each compared in full after decryption anyway.
            if let compound = Self.compoundHashes(k, q.attributes).first { return [compound] }
            return probe.map { Self.blindHash(k, $0.key, $0.value) }
        }
        try store.forEachRow(matchingAll: hashes, after: cursor, visit)
    }

    private static func matches(_ q: ItemQuery, _ cls: ItemClass, _ attrs: Attributes) -> Bool {
        if let c = q.itemClass, c != cls { return false }
        for (k, v) in q.attributes where attrs[k] != v { return false }
        return true
    }

    private func seal(itemClass: ItemClass, attributes: Attributes, secret: UnsafeRawBufferPointer,
                      protection: ProtectionClass, ref: [UInt8]) throws(SecError) -> RowContent {
        var full = attributes
        full["class"] = .string(itemClass.rawValue)
        var encoded = AttributeCodec.encode(full)
        defer { secureZero(&encoded) }
        let meta = try keybag.withMetadataKey(protection) { k in
            encoded.withUnsafeBytes { ItemCrypto.seal($0, classKey: k, ref: ref, protection: protection, keyRole: .metaKey, dataRole: .meta) }
        }
        let sealedSecret = try keybag.withClassKey(protection) { k in
            ItemCrypto.seal(secret, classKey: k, ref: ref, protection: protection, keyRole: .secretKey, dataRole: .secret)
        }
        let (pk, index) = try keybag.withIndexKey { k throws(SecError) in
            (Self.primaryKeyHash(k, itemClass, full),
             full.filter { AttributeCatalog.indexed.contains($0.key) }.map { Self.blindHash(k, $0.key, $0.value) }
                + Self.compoundHashes(k, full))
        }
        return RowContent(primaryKeyHash: pk, persistentRef: ref, protectionClass: protection.rawValue,
                          meta: meta, secret: sealedSecret, indexHashes: index)
    }

    private func openAttributes(_ row: StoredRow) throws(SecError) -> (ItemClass, Attributes) {
        guard let protection = ProtectionClass(rawValue: row.protectionClass), row.persistentRef.count == 16 else {
            throw .decode("an item row has an invalid protection class or reference")
        }
        let plain = try keybag.withMetadataKey(protection) { k throws(SecError) in
            try ItemCrypto.open(row.meta, classKey: k, ref: row.persistentRef, protection: protection, keyRole: .metaKey, dataRole: .meta)
        }
        var attrs: Attributes
        do {
            var bytes = plain.withUnsafeBytes { Array($0) }
            defer { secureZero(&bytes) }
            var r = ByteReader(bytes)
            attrs = try AttributeCodec.decodeAttributes(from: &r)
            try r.expectEnd("attributes")
        } catch {
            throw .decode("an item's attributes are malformed: \(error)")
        }
        guard case .string(let c)? = attrs.removeValue(forKey: "class"), let cls = ItemClass(rawValue: c),
              attrs["pdmn"] == .string(protection.shortCode) else {
            throw .decode("an item's class or protection does not match its row")
        }
        return (cls, attrs)
    }

    private func openSecret(_ row: StoredRow) throws(SecError) -> SecureBytes {
        let protection = ProtectionClass(rawValue: row.protectionClass)!
        return try keybag.withClassKey(protection) { k throws(SecError) in
            try ItemCrypto.open(row.secret, classKey: k, ref: row.persistentRef, protection: protection, keyRole: .secretKey, dataRole: .secret)
        }
    }

    /// Attribute pairs that get a combined blind-index entry, for the lookups scripts make most.
    static let compoundKeys: [(String, String)] = [("svce", "acct"), ("srvr", "acct")]

    /// Combined entries for every pair in ``compoundKeys`` that `attrs` holds in full.
    static func compoundHashes(_ key: UnsafeRawBufferPointer, _ attrs: Attributes) -> [[UInt8]] {
        compoundKeys.compactMap { a, b in
            guard let va = attrs[a], let vb = attrs[b] else { return nil }
            var w = ByteWriter()
            AttributeCodec.encode(va, into: &w)
            AttributeCodec.encode(vb, into: &w)
            return KeyedHash.hash(key: key, parts: [Array("coffer index v1".utf8), Array("\(a)+\(b)".utf8), [0], w.bytes], outputBytes: 16)
        }
    }

    /// Blind index entry: 16 bytes of BLAKE2b(indexKey, "coffer index v1" ‖ name ‖ 0 ‖ value).
    static func blindHash(_ key: UnsafeRawBufferPointer, _ name: String, _ value: AttributeValue) -> [UInt8] {
        var w = ByteWriter()
        AttributeCodec.encode(value, into: &w)
        return KeyedHash.hash(key: key, parts: [Array("coffer index v1".utf8), Array(name.utf8), [0], w.bytes], outputBytes: 16)
    }

    /// Uniqueness key: BLAKE2b(indexKey, "coffer pk v1" ‖ canonical encoding of the class's primary-key attributes).
    static func primaryKeyHash(_ key: UnsafeRawBufferPointer, _ cls: ItemClass, _ attrs: Attributes) -> [UInt8] {
        var pk: Attributes = ["class": .string(cls.rawValue)]
        for name in cls.primaryKey { if let v = attrs[name] { pk[name] = v } }
        return KeyedHash.hash(key: key, parts: [Array("coffer pk v1".utf8), AttributeCodec.encode(pk)])
    }

    static func now() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return (Double(ts.tv_sec) + Double(ts.tv_nsec / 1000) / 1_000_000)
    }
}
