import CofferKeybag
public import CofferModel
import CofferStore
import CofferSystem

// SecItemCopyMatching (whole or paged) and the match pass over the blind indexes under them.
extension Keychain {
    // MARK: SecItemCopyMatching

    /// Finds items (SecItemCopyMatching): the first match unless `limit` says otherwise.
    /// errSecItemNotFound when nothing matches; errSecInteractionNotAllowed when a candidate's
    /// class key is locked (its attributes cannot even be compared). Items outside `scope` are invisible.
    public func copyMatching(_ query: ItemQuery, scope: AccessScope,
                             authorization: AuthorizationContext = .none,
                             grants: [[UInt8]: AuthorizationContext] = [:]) throws(SecError) -> [ItemResult] {
        try Validation.check(query)
        try Validation.checkEntitled(query.attributes, in: scope)
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            var results: [ItemResult] = []
            var needs = Requirements(operation: .useSecret, authorization: authorization, grants: grants)
            let complete = try store.reading { () throws(SecError) in
                try forEachMatch(store, query, scope, limit: query.limit.bound, namingLocked: true, locked: { row in
                    results.append(ItemResult(itemClass: query.itemClass ?? .genericPassword, persistentRef: row.persistentRef, locked: true))
                }) { (row, cls, attrs) throws(SecError) in
                    if query.returnData { try Self.checkExtractable(query, cls, attrs); guard try needs.admit(attrs, row.persistentRef) else { return } }
                    var r = ItemResult(itemClass: cls)
                    if query.returnAttributes { r.attributes = attrs }
                    if query.returnPersistentRef { r.persistentRef = row.persistentRef }
                    if query.reportsAccessState { r.needsAuthentication = try needs.wouldNeedPerson(attrs, row.persistentRef) }
                    if query.returnData { r.data = try openSecret(row, cls, attrs, needs.authorization(for: row.persistentRef, attrs)) }
                    results.append(r)
                }
            }
            // Never a silent partial answer: a match may sit in a tier that could not be searched.
            guard complete || query.skipsLockedItems else { throw Self.notFound(false) }
            try needs.throwIfUnsatisfied()
            guard !results.isEmpty else { throw Self.notFound(complete) }
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
        /// Rows this page skipped because they fail authentication (only with `query.skipUnreadable`).
        public var unreadable = 0
    }

    /// SecItemCopyMatching for a paged reply: the matches after row id `cursor` (0: from the start),
    /// oldest first, at most `query.limit`, each offered to `fits` in turn; the first result `fits`
    /// refuses ends the page (incomplete; that result is dropped). errSecItemNotFound only when
    /// nothing matches from the start (`cursor` 0); a later page may be empty and complete. Items
    /// outside `scope` are invisible.
    ///
    /// A first page (cursor 0) that needs authentication fails with a ``MatchHandle`` of every match
    /// (unless `fits` cut it short or unreadable rows are skipped); given back as `handle` while the
    /// database is unchanged, the page opens those rows instead of searching the indexes again.
    public func copyMatchingPage(_ query: ItemQuery, scope: AccessScope, after cursor: Int64,
                                 authorization: AuthorizationContext = .none,
                                 grants: [[UInt8]: AuthorizationContext] = [:],
                                 matching handle: MatchHandle? = nil,
                                 fits: (ItemResult) -> Bool) throws(SecError) -> MatchPage {
        try Validation.check(query)
        try Validation.checkEntitled(query.attributes, in: scope)
        return try guarded.withLock { (s: inout State) throws(SecError) in
            let store = s.store
            var items: [ItemResult] = []
            var lastRowID = cursor, refused = false, skippedIDs: [Int64] = [], matched: [Int64] = []
            // A handle from this store, with nothing written since it was made.
            var only: MatchHandle? = nil
            if let handle, handle.store == ObjectIdentifier(store), handle.stamp == (try store.changeStamp()) { only = handle }
            let skip: ((StoredRow) throws(SecError) -> Void)? = query.skipUnreadable ? { [keybag] row throws(SecError) in
                // Counted for the caller unless its index says another group's (a row without index
                // entries, forged or damaged, may be anyone's: counted).
                if let groups = scope.groups, let p = ProtectionClass(rawValue: row.protectionClass) {
                    let mine = try unsafe keybag.withIndexKey(IndexTier.of(p)) { k in Set(groups.map { unsafe Self.blindHash(k, "agrp", .string($0)) }) }
                    let index = try store.indexHashes(item: row.id)
                    if !index.isEmpty && mine.isDisjoint(with: index) { return }
                }
                skippedIDs.append(row.id)
            } : nil
            var needs = Requirements(operation: .useSecret, authorization: authorization, grants: grants)
            let complete = try store.reading { () throws(SecError) in
                try forEachMatch(store, query, scope, limit: query.limit.bound, after: cursor, until: { refused },
                                 unreadable: skip, only: only, namingLocked: true, locked: { row in
                    matched.append(row.id)
                    let r = ItemResult(itemClass: query.itemClass ?? .genericPassword, persistentRef: row.persistentRef, locked: true)
                    guard fits(r) else { refused = true; return }
                    items.append(r)
                    lastRowID = row.id
                }) { (row, cls, attrs) throws(SecError) in
                    matched.append(row.id)
                    if query.returnData { try Self.checkExtractable(query, cls, attrs); guard try needs.admit(attrs, row.persistentRef) else { return } }
                    var r = ItemResult(itemClass: cls)
                    if query.returnAttributes { r.attributes = attrs }
                    if query.returnPersistentRef { r.persistentRef = row.persistentRef }
                    if query.reportsAccessState { r.needsAuthentication = try needs.wouldNeedPerson(attrs, row.persistentRef) }
                    if query.returnData {
                        do throws(SecError) {
                            r.data = try openSecret(row, cls, attrs, needs.authorization(for: row.persistentRef, attrs))
                        } catch where error.status == .decode && skip != nil {
                            // A secret that fails authentication is damage like an attribute block's: a
                            // listing that tolerates damage skips the row and reports it.
                            try skip?(row)
                            return
                        }
                    }
                    guard fits(r) else { refused = true; return }
                    items.append(r)
                    lastRowID = row.id
                }
            }
            do throws(SecError) { try needs.throwIfUnsatisfied() } catch {
                // The attempt of a first page saw every match: the retry may open just those.
                guard error.needsAuthentication, cursor == 0, !refused, skip == nil else { throw error }
                throw error.withMatchHandle(MatchHandle(rowIDs: matched, complete: complete, store: ObjectIdentifier(store),
                                                        stamp: try store.changeStamp()))
            }
            // A page cut short by `fits` is resumed after its last item: rows skipped beyond it are met
            // (and counted) again by the next page, so this one does not count them.
            let unreadable = refused ? skippedIDs.count(where: { $0 < lastRowID }) : skippedIDs.count
            guard complete || query.skipsLockedItems else { throw Self.notFound(false) }
            guard !items.isEmpty || refused || cursor > 0 || unreadable > 0 else { throw Self.notFound(complete) }
            return MatchPage(items: items, lastRowID: lastRowID, isComplete: !refused, unreadable: unreadable)
        }
    }

    // MARK: Internals (hold the keychain mutex: `store` comes from its state)

    /// Visits matching items oldest first. Candidates come from the blind indexes; each is decrypted
    /// and compared in full, so a tampered index can never return a wrong item.
    ///
    /// The blind hashes are computed under every index key in memory (tier D, and tier P after the
    /// first unlock) and the union visited in row-id order: at most twice today's index seeks. Returns
    /// false if a tier that could hold matches was not searchable (tier P before the first unlock).
    ///
    /// Paging: only rows after row id `cursor`, and `done` (asked after each match) ends the visit early.
    /// With `only` (a valid ``MatchHandle``), the handle's rows are visited instead of the indexes: no search.
    /// The visit is lazy (a page decrypts what it returns plus at most ``mergeChunk`` rows per tier),
    /// so listing a large keychain page by page stays linear.
    @discardableResult
    func forEachMatch(_ store: ItemStore, _ q: ItemQuery, _ scope: AccessScope, limit: Int?, after cursor: Int64 = 0, until done: () -> Bool = { false },
                              unreadable: ((StoredRow) throws(SecError) -> Void)? = nil, only: MatchHandle? = nil,
                              namingLocked: Bool = false, locked lockedMatch: (StoredRow) throws(SecError) -> Void = { _ in },
                              _ body: (StoredRow, ItemClass, Attributes) throws(SecError) -> Void) throws(SecError) -> Bool {
        var found = 0
        /// A locked row a ``ItemQuery/listsLockedItems`` search names (to `lockedMatch`): its index
        /// entries, under its own tier's key, hold the query's class, every attribute it names, and
        /// one of the scope's groups; `pdmn` is the row's clear protection class. The index is all
        /// that can be read of it: a tampered index can make a row be named, never be read.
        func lockedRowMatches(_ row: StoredRow) throws(SecError) -> Bool {
            guard let protection = ProtectionClass(rawValue: row.protectionClass), let cls = q.itemClass else { return false }
            if let wanted = try Validation.protection(of: q.attributes), wanted != protection { return false }
            let (needed, groups) = try unsafe keybag.withIndexKey(IndexTier.of(protection)) { k in
                unsafe (q.attributes.filter { $0.key != "pdmn" }.map { unsafe Self.blindHash(k, $0.key, $0.value) }
                        + [Self.blindHash(k, "class", .string(cls.rawValue))],
                        scope.groups.map { Set($0.map { unsafe Self.blindHash(k, "agrp", .string($0)) }) })
            }
            let index = Set(try store.indexHashes(item: row.id))
            guard needed.allSatisfy(index.contains) else { return false }
            return groups.map { !$0.isDisjoint(with: index) } ?? true
        }
        enum Candidate { case item(ItemClass, Attributes), locked }
        /// A candidate's attributes; nil for one whose class key is locked away and whose access
        /// group (by its blind-index entry) is outside `scope`: a locked keychain must not tell an
        /// app, by errSecInteractionNotAllowed, that another group holds an item matching its query.
        ///
        /// A row's index entries are under its own tier's key only. Before the first unlock the
        /// passcode tier's key is not in memory, so such a row's group cannot be told: it stays
        /// errSecInteractionNotAllowed (it may be the caller's own; skipping it would turn a listing
        /// into a silent partial answer). That reveals nothing: before the first unlock every query
        /// that could reach the passcode tier is answered errSecInteractionNotAllowed anyway.
        func open(_ row: StoredRow) throws(SecError) -> Candidate? {
            do {
                let (cls, attrs) = try openAttributes(row)
                return .item(cls, attrs)
            } catch where error.status == .decode && unreadable != nil {
                // A listing that tolerates damage: the row is skipped and reported (`coffer check`).
                try unreadable?(row)
                return nil
            } catch where error.status == .interactionNotAllowed {
                if q.skipsLockedItems { return nil }
                if q.listsLockedItems, namingLocked { return try lockedRowMatches(row) ? .locked : nil }
                guard let groups = scope.groups, let protection = ProtectionClass(rawValue: row.protectionClass),
                      let inScope = try scopeHashes(IndexTier.of(protection), groups) else { throw error }   // tier not searchable yet
                if !inScope.isDisjoint(with: try store.indexHashes(item: row.id)) { throw error }
                return nil
            }
        }
        /// The row as a match of the query: opened and compared in full, or a locked match; nil if it
        /// does not match (or is left out).
        func candidate(_ row: StoredRow) throws(SecError) -> Candidate? {
            switch try open(row) {
            case .item(let cls, let attrs)?: Self.matches(q, scope, cls, attrs) ? .item(cls, attrs) : nil
            case .locked?: .locked
            case nil: nil
            }
        }
        /// The `agrp` blind hashes of the scope's groups under each tier's index key, computed once per
        /// visit (a locked keychain may hold many rows of other groups); nil for a tier whose key is not
        /// in memory.
        var tierHashes: [IndexTier: Set<[UInt8]>?] = [:]
        func scopeHashes(_ tier: IndexTier, _ groups: Set<String>) throws(SecError) -> Set<[UInt8]>? {
            if let known = tierHashes[tier] { return known }
            let hashes = try unsafe keybag.withIndexKeys { keys throws(SecError) -> Set<[UInt8]>? in
                guard let k = unsafe keys.first(where: { unsafe $0.0 == tier })?.1 else { return nil }
                return Set(groups.map { unsafe Self.blindHash(k, "agrp", .string($0)) })
            }
            tierHashes[tier] = .some(hashes)
            return hashes
        }
        /// Hands one match to `body` (a locked one to `lockedMatch`); false once the visit must stop.
        func deliver(_ row: StoredRow, _ match: Candidate) throws(SecError) -> Bool {
            switch match {
            case .item(let cls, let attrs): try body(row, cls, attrs)
            case .locked: try lockedMatch(row)
            }
            found += 1
            return !done() && (limit.map { found < $0 } ?? true)
        }
        if let ref = q.persistentRef, ref.count == 16 {
            if let row = try store.row(persistentRef: ref), row.id > cursor, let match = try candidate(row) {
                _ = try deliver(row, match)
            }
            return true
        }
        if q.persistentRef != nil {
            // Several items by reference: each row opened by its reference, oldest first as always.
            var rows: [StoredRow] = []
            for ref in q.persistentRefs { if let row = try store.row(persistentRef: ref), row.id > cursor { rows.append(row) } }
            for row in rows.sorted(by: { $0.id < $1.id }) {
                guard let match = try candidate(row) else { continue }
                guard try deliver(row, match) else { break }
            }
            return true
        }
        if let only {
            for id in only.rowIDs {
                guard let row = try store.row(id: id), row.id > cursor, let match = try candidate(row) else { continue }
                guard try deliver(row, match) else { break }
            }
            return only.complete
        }
        // A search of the blind indexes (what the agent's counters call a search); opening one row by
        // its reference is not one.
        searches.withLock { $0 += 1 }
        var probe = q.attributes.filter { AttributeCatalog.isIndexed($0.key) }
        if let c = q.itemClass { probe["class"] = .string(c.rawValue) }
        // The tiers that can hold a match: the one of the query's protection class, or both.
        let wanted = try Validation.protection(of: q.attributes).map { [IndexTier.of($0)] } ?? IndexTier.allCases
        let tiers = try unsafe keybag.withIndexKeys { keys throws(SecError) -> [[[UInt8]]] in
            unsafe keys.filter { unsafe wanted.contains($0.0) }.map { _, k in
                // The common lookup (service + account, server + account) has its own entry: one seek, a
                // handful of candidates at most, each compared in full after decryption anyway.
                if let compound = unsafe Self.compoundHashes(k, q.attributes).first { return [compound] }
                return probe.map { unsafe Self.blindHash(k, $0.key, $0.value) }
            }
        }
        // A tier whose index key is not in memory (tier P before the first unlock) is searched only
        // if it holds no row at all: otherwise any of its rows may match, and the search is incomplete.
        let unsearched = ProtectionClass.allCases.filter { wanted.contains(IndexTier.of($0)) && IndexTier.of($0) != .device }
        let unsearchedHasRows = tiers.count == wanted.count ? false : try store.hasItem(inProtectionClasses: unsearched.map { Int($0.rawValue) })
        let complete = !unsearchedHasRows
        let scans = Array(tiers.prefix(probe.isEmpty ? 1 : tiers.count)) // no hashes: one scan covers every row
        if scans.count == 1 {
            try store.forEachRow(matchingAll: scans[0], after: cursor) { (row) throws(SecError) -> Bool in
                guard let match = try candidate(row) else { return true }
                return try deliver(row, match)
            }
            return complete
        }
        // Several tiers: merged by row id a chunk at a time. Each tier yields up to `mergeChunk` matches
        // after `from`; every match up to the lowest id where a tier stopped short is in order and final.
        var from = cursor
        while true {
            var batch: [(StoredRow, Candidate)] = []
            var boundary = Int64.max
            for hashes in scans {
                var n = 0
                try store.forEachRow(matchingAll: hashes, after: from) { (row) throws(SecError) -> Bool in
                    guard let match = try candidate(row) else { return true }
                    batch.append((row, match))
                    n += 1
                    guard n < Self.mergeChunk else { boundary = min(boundary, row.id); return false }
                    return true
                }
            }
            batch.sort { $0.0.id < $1.0.id }
            for (row, match) in batch where row.id <= boundary {
                guard try deliver(row, match) else { return complete }
            }
            guard boundary != .max else { return complete }
            from = boundary
        }
    }

    /// Matches each index tier contributes per round when several are merged (see ``forEachMatch``).
    static let mergeChunk = 64

    /// Nothing matched: errSecItemNotFound, or errSecInteractionNotAllowed if a tier could not be searched
    /// (before the first unlock, an item of a non-Always class can be neither found nor ruled out).
    static func notFound(_ complete: Bool) -> SecError {
        complete ? .itemNotFound()
            : .interactionNotAllowed("items of the non-Always classes cannot be searched before the first unlock; "
                                     + "a search naming an Always class (pdmn dk or dku) can")
    }

    private static func matches(_ q: ItemQuery, _ scope: AccessScope, _ cls: ItemClass, _ attrs: Attributes) -> Bool {
        if let c = q.itemClass, c != cls { return false }
        guard scope.admits(attrs) else { return false }
        for (k, v) in q.attributes {
            if GeneralAttributes.isGeneral(k) {
                guard Self.sameBytes(attrs, k, v) else { return false }
            } else if attrs[k] != v {
                return false
            }
        }
        return true
    }

    /// True if `attrs` has attribute `name` with string value `value`, both byte for byte (Swift's
    /// `String` equality is canonical equivalence: a general attribute matches exactly, as its
    /// blind-index entry does, whichever way a search reaches the item).
    private static func sameBytes(_ attrs: Attributes, _ name: String, _ value: AttributeValue) -> Bool {
        guard let i = attrs.index(forKey: name), attrs[i].key.utf8.elementsEqual(name.utf8),
              case .string(let have) = attrs[i].value, case .string(let want) = value else { return false }
        return have.utf8.elementsEqual(want.utf8)
    }

    /// A non-extractable key's private half never leaves the agent: a search returning data that meets
    /// one fails (before anyone is asked to authenticate), unless the agent itself uses the key in place.
    private static func checkExtractable(_ query: ItemQuery, _ cls: ItemClass, _ attrs: Attributes) throws(SecError) {
        guard cls == .key, KeyItem.isNonExtractable(attrs), !query.usesKeyInPlace else { return }
        throw .notAvailable("a non-extractable key's private half is never returned: the agent uses it in place (e.g. coffer ssh)")
    }
}
