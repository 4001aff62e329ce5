import CSQLite
package import CofferModel
import Glibc

/// One encrypted item row as stored. Nothing in it is plaintext: `meta` and `secret` are sealed
/// by the keychain layer; `protectionClass` names which class key unwraps them.
package struct StoredRow: Sendable {
    /// SQLite row id.
    package var id: Int64
    /// Random 16-byte persistent reference.
    package var persistentRef: [UInt8]
    /// ``CofferModel/ProtectionClass`` raw value.
    package var protectionClass: UInt8
    /// Sealed attributes.
    package var meta: [UInt8]
    /// Sealed secret.
    package var secret: [UInt8]
}

/// What the keychain writes for an item: sealed blobs plus blind hashes.
package struct RowContent: Sendable {
    /// Keyed hash of the item's primary-key attributes (UNIQUE: duplicate detection).
    package var primaryKeyHash: [UInt8]
    /// Random persistent reference.
    package var persistentRef: [UInt8]
    /// Protection class raw value.
    package var protectionClass: UInt8
    /// Sealed attributes.
    package var meta: [UInt8]
    /// Sealed secret.
    package var secret: [UInt8]
    /// Blind index entries, one per indexed attribute.
    package var indexHashes: [[UInt8]]

    /// Makes row content.
    package init(primaryKeyHash: [UInt8], persistentRef: [UInt8], protectionClass: UInt8, meta: [UInt8],
                secret: [UInt8], indexHashes: [[UInt8]]) {
        self.primaryKeyHash = primaryKeyHash
        self.persistentRef = persistentRef
        self.protectionClass = protectionClass
        self.meta = meta
        self.secret = secret
        self.indexHashes = indexHashes
    }
}

/// The item table in one SQLite file (WAL mode, synchronous FULL, secure_delete), with blind
/// indexes so equality searches are index seeks. Stores only opaque bytes; knows no keys.
///
/// Not thread-safe: the keychain serialises access.
package final class ItemStore {
    let db: SQLiteConnection
    /// Keeps the rollback records current (nil: rollback detection off, the records are not touched).
    package var ledger: (any RowLedger)?
    /// The rollback-record changes of the open transaction, by bucket (written just before COMMIT).
    var pending: [Int64: LedgerDelta] = [:]
    /// Item count kept in step with inserts and deletes (nil: recount; a rollback forgets it).
    private var cachedCount: Int?
    /// The database file.
    package let path: String

    /// Schema version this code writes (PRAGMA user_version). Migrations never change once shipped.
    package static let schemaVersion: Int64 = 7

    private static let schemaV1 = """
        CREATE TABLE items(
            id INTEGER PRIMARY KEY,
            pref BLOB NOT NULL UNIQUE CHECK(length(pref) = 16),
            pk BLOB NOT NULL UNIQUE,
            pclass INTEGER NOT NULL CHECK(pclass BETWEEN 1 AND 7),
            meta BLOB NOT NULL,
            secret BLOB NOT NULL
        );
        CREATE TABLE attr_index(
            h BLOB NOT NULL,
            item INTEGER NOT NULL REFERENCES items(id) ON DELETE CASCADE,
            PRIMARY KEY(h, item)
        ) WITHOUT ROWID;
        CREATE INDEX attr_index_item ON attr_index(item);
        PRAGMA user_version = 1;
        """

    /// Version 2: rows `coffer check --quarantine` set aside (they failed authentication), kept
    /// whole (every column, the index entries concatenated, 16 bytes each) so they can be restored.
    private static let schemaV2 = """
        CREATE TABLE quarantine(
            id INTEGER PRIMARY KEY,
            pref BLOB NOT NULL UNIQUE CHECK(length(pref) = 16),
            pk BLOB NOT NULL,
            pclass INTEGER NOT NULL,
            meta BLOB NOT NULL,
            secret BLOB NOT NULL,
            idx BLOB NOT NULL,
            reason TEXT NOT NULL,
            qtime REAL NOT NULL
        );
        PRAGMA user_version = 2;
        """

    /// Version 3: a quarantined row keeps why it was set aside as a ``CheckFinding/Reason`` code
    /// (rows quarantined by version 2 all failed authentication: code 1).
    private static let schemaV3 = """
        ALTER TABLE quarantine ADD COLUMN rcode INTEGER NOT NULL DEFAULT 1;
        PRAGMA user_version = 3;
        """

    /// Version 4: items may carry general attributes (`@NAME`, ``CofferModel/GeneralAttributes``), each
    /// with a blind-index entry in `attr_index` that only this version writes. Nothing of a version-3
    /// file changes (none of its items has one: version 3 refused their names); the version is what
    /// keeps an older Coffer from opening the file, whose updates would drop those entries and with
    /// them the items from every search by a general attribute.
    private static let schemaV4 = """
        PRAGMA user_version = 4;
        """

    /// Version 5: the rollback records (the RollbackAnchor article): per bucket of rows, the keyed set
    /// hash of its rows, their count, the anchor epoch (the TPM counter value it was sealed at) and a
    /// tag. Empty until rollback detection anchors the keychain; nothing else of a version-4 file changes.
    private static let schemaV5 = """
        CREATE TABLE rollback(
            bucket INTEGER PRIMARY KEY,
            root BLOB NOT NULL CHECK(length(root) = 32),
            n INTEGER NOT NULL,
            epoch INTEGER NOT NULL,
            tag BLOB NOT NULL
        );
        PRAGMA user_version = 5;
        """

    /// Version 6: sync (issue #29, SyncFormat.md "The keychain's side"). `sync_state` holds the sync state
    /// sealed by the keychain (row 1), written in the same transaction as the changes a pull applies, and
    /// this device's sealed sync secret keys (row 2);
    /// `sync_pending` holds the local changes of syncable items not yet recorded (each a sealed item key),
    /// written in the transaction of the change and deleted in the one that stores the state counting
    /// their records. Nothing of a version-5 file changes.
    private static let schemaV6 = """
        CREATE TABLE sync_state(
            id INTEGER PRIMARY KEY CHECK(id IN (1, 2)),
            state BLOB NOT NULL
        );
        CREATE TABLE sync_pending(
            id INTEGER PRIMARY KEY,
            item BLOB NOT NULL
        );
        PRAGMA user_version = 6;
        """

    /// Version 7: protected directories (issue #45, FileProtectionFormat.md): one row per directory, its
    /// path (UTF-8), its file protection class, the keybag class whose class key wraps its fscrypt key,
    /// the key's identifier (not secret) and the wrapped key; for a CompleteUnlessOpen directory its drop
    /// key pair (the public key, the secret key wrapped; empty for the others). `file_drops`: files
    /// written into such a directory while locked, sealed to its drop key until the next unlock.
    /// Nothing of a version-6 file changes.
    private static let schemaV7 = """
        CREATE TABLE file_keys(
            id INTEGER PRIMARY KEY,
            path BLOB NOT NULL UNIQUE,
            fclass INTEGER NOT NULL CHECK(fclass BETWEEN 1 AND 4),
            pclass INTEGER NOT NULL CHECK(pclass BETWEEN 1 AND 7),
            keyid BLOB NOT NULL UNIQUE CHECK(length(keyid) = 16),
            wrapped BLOB NOT NULL,
            droppk BLOB NOT NULL DEFAULT x'' CHECK(length(droppk) IN (0, 32)),
            dropsk BLOB NOT NULL DEFAULT x''
        );
        CREATE TABLE file_drops(
            id INTEGER PRIMARY KEY,
            dir BLOB NOT NULL,
            sealed BLOB NOT NULL
        );
        PRAGMA user_version = 7;
        """

    /// The longest reason a quarantined row keeps (bytes of UTF-8, cut at a character boundary).
    package static let maximumReasonBytes = 512

    /// Opens (creating if needed) the database at `path`; the file is created with mode 0600.
    package init(path: String) throws(SecError) {
        self.path = path
        let oldMask = umask(0o077)
        defer { umask(oldMask) }
        db = try SQLiteConnection(path: path)
        do {
            try db.exec("PRAGMA foreign_keys = ON; PRAGMA secure_delete = ON;")
            try db.exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;")
            // A 2 MiB page cache: a lookup touches a few B-tree pages, and pages beyond the cache come
            // from the OS page cache. Measured at 100,000 items: 16 MiB gave the same 23 µs round trip
            // as 4 MiB for 12 MiB more RSS; 4 MiB left the agent at 16.2–16.5 MiB after the peers
            // workload at 10,000 items, 2 MiB at 15.5–15.9 (issue #25's budget: 16). (A memory map was
            // tried: no gain, and it counts the file in RSS.)
            try db.exec("PRAGMA cache_size = -2048;")
            let version = try db.statement("PRAGMA user_version").scalarInt()
            if version < Self.schemaVersion && version >= 0 {
                // Each migration in one transaction with the version it sets: a crash leaves the old
                // version or the new one, never a half-migrated file.
                let steps = [Self.schemaV1, Self.schemaV2, Self.schemaV3, Self.schemaV4, Self.schemaV5, Self.schemaV6, Self.schemaV7]
                try transaction { () throws(SecError) in for step in steps.dropFirst(Int(version)) { try db.exec(step) } }
            } else if version > Self.schemaVersion {
                throw SecError.decode("the keychain database \(path) has format \(version), newer than this Coffer (\(Self.schemaVersion))")
            }
            // Reading the table catches a file that is not a database at all. (Not count(*): that
            // walks a whole index, 20 ms of start-up at a million items; the count is taken on demand.)
            _ = try db.statement("SELECT id FROM items LIMIT 1").scalarInt()
        }
    }

    /// Runs `body` in one read transaction: one consistent snapshot and one round of file locking
    /// for all its statements (a search runs several).
    package func reading<R>(_ body: () throws(SecError) -> R) throws(SecError) -> R {
        // Prepared once (sqlite3_exec would parse the SQL on every lookup).
        try db.statement("BEGIN").run()
        defer { try? db.statement("COMMIT").run() }
        return try body()
    }

    /// Runs `body` in one transaction: all of it is committed, or none.
    package func transaction<R>(_ body: () throws(SecError) -> R) throws(SecError) -> R {
        try db.exec("BEGIN IMMEDIATE")
        do {
            let r = try body()
            try commitLedger()
            try db.exec("COMMIT")
            return r
        } catch {
            try? db.exec("ROLLBACK")
            cachedCount = nil
            pending = [:]
            throw error
        }
    }

    /// Number of items.
    package func count() throws(SecError) -> Int {
        if let n = cachedCount { return n }
        let n = Int(try db.statement("SELECT count(*) FROM items").scalarInt())
        cachedCount = n
        return n
    }

    /// Whether any item has one of `protectionClasses` (the clear `pclass` column): before the first
    /// unlock, whether a search that cannot read the passcode tier's index could miss a match.
    package func hasItem(inProtectionClasses protectionClasses: [Int]) throws(SecError) -> Bool {
        guard !protectionClasses.isEmpty else { return false }
        let list = protectionClasses.map(String.init).joined(separator: ",")
        return try db.statement("SELECT EXISTS(SELECT 1 FROM items WHERE pclass IN (\(list)))").scalarInt() != 0
    }

    /// Inserts an item and its index entries; errSecDuplicateItem if its primary key or reference
    /// exists. Call inside ``transaction(_:)`` so the row and its index entries commit together.
    @discardableResult
    package func insert(_ c: RowContent) throws(SecError) -> Int64 {
        let s = try db.statement("INSERT INTO items(pref, pk, pclass, meta, secret) VALUES (?1, ?2, ?3, ?4, ?5)")
        Self.bindColumns(s, c)
        try s.run()
        let id = db.lastInsertRowID
        try account(added: LedgerRow(id: id, persistentRef: c.persistentRef, primaryKeyHash: c.primaryKeyHash,
                                     protectionClass: Int64(c.protectionClass), meta: c.meta, secret: c.secret))
        try insertIndex(id: id, c.indexHashes)
        cachedCount = cachedCount.map { $0 + 1 }
        return id
    }

    /// Replaces the row `id` with new content (same or new primary key).
    package func replace(id: Int64, with c: RowContent) throws(SecError) {
        try account(removed: ledgerRow(id: id))
        try account(added: LedgerRow(id: id, persistentRef: c.persistentRef, primaryKeyHash: c.primaryKeyHash,
                                     protectionClass: Int64(c.protectionClass), meta: c.meta, secret: c.secret))
        let s = try db.statement("UPDATE items SET pref = ?1, pk = ?2, pclass = ?3, meta = ?4, secret = ?5 WHERE id = ?6")
        Self.bindColumns(s, c)
        s.bind(6, id)
        try s.run()
        let d = try db.statement("DELETE FROM attr_index WHERE item = ?1")
        d.bind(1, id)
        try d.run()
        try insertIndex(id: id, c.indexHashes)
    }

    /// Binds an item's columns as parameters 1–5 (pref, pk, pclass, meta, secret).
    private static func bindColumns(_ s: Statement, _ c: RowContent) {
        s.bind(1, c.persistentRef)
        s.bind(2, c.primaryKeyHash)
        s.bind(3, Int64(c.protectionClass))
        s.bind(4, c.meta)
        s.bind(5, c.secret)
    }

    private func insertIndex(id: Int64, _ hashes: [[UInt8]]) throws(SecError) {
        let s = try db.statement("INSERT OR IGNORE INTO attr_index(h, item) VALUES (?1, ?2)")
        for h in hashes {
            s.bind(1, h)
            s.bind(2, id)
            try s.run()
        }
    }

    /// Deletes every item and its index entries (an erase); the rollback records go too (an erased
    /// keychain is anchored afresh).
    package func deleteAll() throws(SecError) {
        try db.statement("DELETE FROM rollback").run()
        pending = [:]
        try db.statement("DELETE FROM attr_index").run()
        try db.statement("DELETE FROM items").run()
        try db.statement("DELETE FROM quarantine").run()   // an erase leaves nothing of the old keychain
        try db.statement("DELETE FROM sync_state").run()   // nor of its sync (its device keys went with the keybag)
        try db.statement("DELETE FROM sync_pending").run()
        cachedCount = 0
    }

    /// Deletes the row `id` (its index entries go with it).
    package func delete(id: Int64) throws(SecError) {
        try account(removed: ledgerRow(id: id))
        let s = try db.statement("DELETE FROM items WHERE id = ?1")
        s.bind(1, id)
        try s.run()
        cachedCount = cachedCount.map { $0 - db.changes }
    }

    /// The id and protection class of every row, oldest first (a rekey walks them in batches of one).
    package func rowClasses() throws(SecError) -> [(id: Int64, protectionClass: UInt8)] {
        let s = try db.statement("SELECT id, pclass FROM items ORDER BY id")
        defer { unsafe sqlite3_reset(s.stmt) }
        var out: [(id: Int64, protectionClass: UInt8)] = []
        while try s.step() { out.append((s.int64(0), UInt8(clamping: s.int64(1)))) }
        return out
    }

    /// What moves with every change to the database: the rows this connection changed, and SQLite's
    /// `data_version` (a commit by any other connection). Equal stamps: nothing was written between them.
    package func changeStamp() throws(SecError) -> [Int64] {
        [db.totalChanges, try db.statement("PRAGMA data_version").scalarInt()]
    }

    /// The row with this id, if any.
    package func row(id: Int64) throws(SecError) -> StoredRow? {
        let s = try db.statement("SELECT id, pref, pclass, meta, secret FROM items WHERE id = ?1")
        s.bind(1, id)
        defer { unsafe sqlite3_reset(s.stmt) }
        return try s.step() ? Self.row(s) : nil
    }

    /// The id of the row whose primary-key hash is `pk`, if any (one seek on the UNIQUE index): the
    /// keychain's duplicate check across index tiers, whose hashes the UNIQUE constraint cannot compare.
    package func rowID(primaryKey pk: [UInt8]) throws(SecError) -> Int64? {
        let s = try db.statement("SELECT id FROM items WHERE pk = ?1")
        s.bind(1, pk)
        defer { unsafe sqlite3_reset(s.stmt) }
        return try s.step() ? s.int64(0) : nil
    }

    /// Replaces only the sealed secret of row `id` (re-padding a row in place; its keys and index stay).
    package func replaceSecret(id: Int64, with secret: [UInt8]) throws(SecError) {
        if ledger != nil, let old = try ledgerRow(id: id) {
            try account(removed: old)
            var new = old
            new.secret = secret
            try account(added: new)
        }
        let s = try db.statement("UPDATE items SET secret = ?1 WHERE id = ?2")
        s.bind(1, secret)
        s.bind(2, id)
        try s.run()
    }

    /// The row with this persistent reference, if any.
    package func row(persistentRef: [UInt8]) throws(SecError) -> StoredRow? {
        let s = try db.statement("SELECT id, pref, pclass, meta, secret FROM items WHERE pref = ?1")
        s.bind(1, persistentRef)
        defer { unsafe sqlite3_reset(s.stmt) }
        return try s.step() ? Self.row(s) : nil
    }

    /// Visits, oldest first, the rows whose blind index holds every hash in `hashes` (all rows when
    /// empty), until `body` returns false. Each hash is an index seek: no table scan unless `hashes` is empty.
    /// With a `cursor` (a row id, 0 for none) only rows with a larger id are visited: the next page
    /// of a paged search starts with a seek past the last row the previous page returned.
    package func forEachRow(matchingAll hashes: [[UInt8]], after cursor: Int64 = 0,
                           _ body: (StoredRow) throws(SecError) -> Bool) throws(SecError) {
        var ordered = hashes
        if hashes.count > 1 {
            // Drive the search from the most selective entry and probe the others per candidate, so the
            // cost follows the smallest set, not the largest (a service shared by thousands of items).
            var sized: [(Int64, [UInt8])] = []
            for h in hashes {
                let n = try estimatedCount(h)
                if n == 0 { return }
                sized.append((n, h))
            }
            ordered = sized.sorted { $0.0 < $1.0 }.map(\.1)
        }
        let sql = Self.searchSQL(entries: ordered.count, afterCursor: cursor > 0)
        let s = try db.statement(sql)
        for (i, h) in ordered.enumerated() { s.bind(Int32(i + 1), h) }
        if cursor > 0 { s.bind(Int32(ordered.count + 1), cursor) }
        defer { unsafe sqlite3_reset(s.stmt) }
        while try s.step() {
            guard try body(Self.row(s)) else { return }
        }
    }

    /// The search statement for `entries` blind-index entries (the first drives, the rest are probed);
    /// `afterCursor` adds a last parameter, the row id to start after.
    static func searchSQL(entries: Int, afterCursor: Bool = false) -> String {
        let cols = "i.id, i.pref, i.pclass, i.meta, i.secret"
        guard entries > 0 else {
            return "SELECT \(cols) FROM items i\(afterCursor ? " WHERE i.id > ?1" : "") ORDER BY i.id"
        }
        let probes = (1..<entries).map {
            " AND EXISTS (SELECT 1 FROM attr_index b WHERE b.h = ?\($0 + 1) AND b.item = a.item)"
        }.joined()
        let after = afterCursor ? " AND a.item > ?\(entries + 1)" : ""
        return "SELECT \(cols) FROM attr_index a JOIN items i ON i.id = a.item WHERE a.h = ?1\(after)\(probes) ORDER BY a.item"
    }

    /// The blind-index entries of row `id` (through the index on `item`).
    package func indexHashes(item id: Int64) throws(SecError) -> [[UInt8]] {
        let s = try db.statement("SELECT h FROM attr_index WHERE item = ?1")
        s.bind(1, id)
        defer { unsafe sqlite3_reset(s.stmt) }
        var out: [[UInt8]] = []
        while try s.step() { out.append(s.blob(0)) }
        return out
    }

    /// How many items carry index entry `h`, counted up to a small cap (cheap: an index range scan).
    private func estimatedCount(_ h: [UInt8]) throws(SecError) -> Int64 {
        let s = try db.statement("SELECT count(*) FROM (SELECT 1 FROM attr_index WHERE h = ?1 LIMIT 64)")
        s.bind(1, h)
        return try s.scalarInt()
    }

    private static func row(_ s: Statement) -> StoredRow {
        StoredRow(id: s.int64(0), persistentRef: s.blob(1), protectionClass: UInt8(clamping: s.int64(2)),
                  meta: s.blob(3), secret: s.blob(4))
    }

    // MARK: Quarantine

    /// A row set aside by ``quarantine(id:reason:code:)``.
    package struct QuarantinedRow: Sendable {
        /// Its place in the quarantine (the cursor of a paged listing).
        package var quarantineID: Int64
        /// The item's persistent reference.
        package var persistentRef: [UInt8]
        /// Why it was set aside.
        package var reason: String
        /// The ``CheckFinding/Reason`` code it was set aside for.
        package var code: UInt8
    }

    /// The primary-key hash of row `id`, if it exists.
    package func primaryKeyHash(id: Int64) throws(SecError) -> [UInt8]? {
        let s = try db.statement("SELECT pk FROM items WHERE id = ?1")
        s.bind(1, id)
        defer { unsafe sqlite3_reset(s.stmt) }
        return try s.step() ? s.blob(0) : nil
    }

    /// Moves row `id` with its index entries into the quarantine table (nothing is deleted: see
    /// ``restoreQuarantined(persistentRef:)``), keeping `reason` (cut to ``maximumReasonBytes``) and
    /// its `code`. False, and nothing moved, if the row's reference is not 16 bytes long or a
    /// quarantined row already has it (a forged row reusing it): the row stays where it is, so one such
    /// row never rolls back the rest of a quarantine. Index entries that are not 16 bytes long (no blind
    /// hash is) are not kept. Call inside ``transaction(_:)``.
    package func quarantine(id: Int64, reason: String, code: UInt8) throws(SecError) -> Bool {
        let probe = try db.statement("""
            SELECT 1 FROM items WHERE id = ?1 AND length(pref) = 16 AND pref NOT IN (SELECT pref FROM quarantine)
            """)
        probe.bind(1, id)
        let movable: Bool
        do {
            defer { unsafe sqlite3_reset(probe.stmt) }
            movable = try probe.step()
        }
        guard movable else { return false }
        let idx = try indexHashes(item: id).filter { $0.count == Self.indexEntryBytes }.joined()
        let s = try db.statement("""
            INSERT INTO quarantine(pref, pk, pclass, meta, secret, idx, reason, qtime, rcode)
            SELECT pref, pk, pclass, meta, secret, ?2, ?3, (julianday('now') - 2440587.5) * 86400.0, ?4 FROM items WHERE id = ?1
            """)
        s.bind(1, id)
        s.bind(2, Array(idx))
        s.bind(3, Array(reason.clampedToUTF8(Self.maximumReasonBytes).utf8))
        s.bind(4, Int64(code))
        try s.run()
        try delete(id: id)
        return true
    }

    /// Bytes of one blind-index entry.
    private static let indexEntryBytes = 16

    /// The quarantined rows after quarantine id `cursor` (0: from the first), oldest first, at most
    /// `limit`. Reasons are cut to ``maximumReasonBytes`` whatever the file holds.
    package func quarantined(after cursor: Int64 = 0, limit: Int = Int.max) throws(SecError) -> [QuarantinedRow] {
        let s = try db.statement("SELECT id, pref, substr(reason, 1, ?2), rcode FROM quarantine WHERE id > ?1 ORDER BY id LIMIT ?3")
        s.bind(1, cursor)
        s.bind(2, Int64(Self.maximumReasonBytes))
        s.bind(3, Int64(clamping: limit))
        defer { unsafe sqlite3_reset(s.stmt) }
        var out: [QuarantinedRow] = []
        while try s.step() {
            out.append(QuarantinedRow(quarantineID: s.int64(0), persistentRef: s.blob(1),
                                      reason: String(decoding: s.blob(2), as: UTF8.self).clampedToUTF8(Self.maximumReasonBytes),
                                      code: UInt8(clamping: s.int64(3))))
        }
        return out
    }

    /// Puts a quarantined row back among the items (with its index entries; as a new row, so it sorts
    /// last). False if no quarantined row has that reference; errSecDuplicateItem if an item with its
    /// primary key exists now. Call inside ``transaction(_:)``.
    package func restoreQuarantined(persistentRef: [UInt8]) throws(SecError) -> Bool {
        let q = try db.statement("SELECT pk, pclass, meta, secret, idx FROM quarantine WHERE pref = ?1")
        q.bind(1, persistentRef)
        let found: RowContent?
        do {
            defer { unsafe sqlite3_reset(q.stmt) }
            if try q.step() {
                let idx = q.blob(4)
                guard idx.count % Self.indexEntryBytes == 0 else { throw .decode("the quarantined item's index entries are damaged") }
                found = RowContent(primaryKeyHash: q.blob(0), persistentRef: persistentRef, protectionClass: UInt8(clamping: q.int64(1)),
                                   meta: q.blob(2), secret: q.blob(3),
                                   indexHashes: stride(from: 0, to: idx.count - idx.count % 16, by: 16).map { Array(idx[$0..<$0 + 16]) })
            } else {
                found = nil
            }
        }
        guard let found else { return false }
        if try rowID(primaryKey: found.primaryKeyHash) != nil { throw .duplicateItem("an item with the same primary key exists; delete it first") }
        try insert(found)
        let d = try db.statement("DELETE FROM quarantine WHERE pref = ?1")
        d.bind(1, persistentRef)
        try d.run()
        return true
    }

    // MARK: Sync (schema 6)

    /// Row 1 of `sync_state`: the sync state. Row 2: this device's sync secret keys.
    package enum SyncRow: Int64, Sendable { case state = 1, deviceKeys = 2 }

    /// The stored (sealed) sync state or device keys, if any.
    package func syncState(_ row: SyncRow = .state) throws(SecError) -> [UInt8]? {
        let s = try db.statement("SELECT state FROM sync_state WHERE id = ?1")
        s.bind(1, row.rawValue)
        defer { unsafe sqlite3_reset(s.stmt) }
        return try s.step() ? s.blob(0) : nil
    }

    /// Replaces the stored sync state (call inside ``transaction(_:)`` with the changes it counts) or device keys.
    package func setSyncState(_ bytes: [UInt8], _ row: SyncRow = .state) throws(SecError) {
        let s = try db.statement("INSERT OR REPLACE INTO sync_state(id, state) VALUES (?2, ?1)")
        s.bind(1, bytes)
        s.bind(2, row.rawValue)
        try s.run()
    }

    /// Notes a local change not yet recorded (a sealed item key). Call inside the change's ``transaction(_:)``.
    package func addPendingSync(_ item: [UInt8]) throws(SecError) {
        let s = try db.statement("INSERT INTO sync_pending(item) VALUES (?1)")
        s.bind(1, item)
        try s.run()
    }

    /// The pending local changes, oldest first, at most `limit`.
    package func pendingSync(limit: Int = Int.max) throws(SecError) -> [(id: Int64, item: [UInt8])] {
        let s = try db.statement("SELECT id, item FROM sync_pending ORDER BY id LIMIT ?1")
        s.bind(1, Int64(clamping: limit))
        defer { unsafe sqlite3_reset(s.stmt) }
        var out: [(id: Int64, item: [UInt8])] = []
        while try s.step() { out.append((s.int64(0), s.blob(1))) }
        return out
    }

    /// Replaces the sealed item key of pending change `id` (a rekey re-seals it). Call inside ``transaction(_:)``.
    package func replacePendingSync(id: Int64, with item: [UInt8]) throws(SecError) {
        let s = try db.statement("UPDATE sync_pending SET item = ?1 WHERE id = ?2")
        s.bind(1, item)
        s.bind(2, id)
        try s.run()
    }

    /// Forgets the pending changes up to `id` (recorded). Call inside ``transaction(_:)`` with the state.
    package func removePendingSync(through id: Int64) throws(SecError) {
        let s = try db.statement("DELETE FROM sync_pending WHERE id <= ?1")
        s.bind(1, id)
        try s.run()
    }

    /// Forgets sync entirely: the state, the device keys and the pending changes (call inside
    /// ``transaction(_:)``).
    package func clearSync() throws(SecError) {
        try db.statement("DELETE FROM sync_state").run()
        try db.statement("DELETE FROM sync_pending").run()
    }

    /// Runs SQLite's `PRAGMA integrity_check`; true when it answers "ok".
    package func integrityCheck() throws(SecError) -> Bool {
        let s = try db.statement("PRAGMA integrity_check")
        defer { unsafe sqlite3_reset(s.stmt) }
        guard try s.step() else { return false }
        guard let text = unsafe sqlite3_column_text(s.stmt, 0) else { return false }
        return unsafe String(cString: text) == "ok"
    }

    /// Checkpoints the WAL into the main file (on clean shutdown).
    package func checkpoint() {
        try? db.exec("PRAGMA wal_checkpoint(TRUNCATE)")
    }

    // MARK: Protected directories (schema 7)

    /// One `file_keys` row.
    package struct FileKeyRow: Sendable, Equatable {
        package var id: Int64
        package var path: [UInt8]
        package var fileClass: UInt8
        package var protectionClass: UInt8
        package var identifier: [UInt8]
        package var wrapped: [UInt8]
        /// The drop key pair: the public key and the wrapped secret key (empty: none).
        package var dropPublicKey: [UInt8]
        package var dropSecret: [UInt8]

        package init(id: Int64 = 0, path: [UInt8], fileClass: UInt8, protectionClass: UInt8, identifier: [UInt8], wrapped: [UInt8],
                     dropPublicKey: [UInt8] = [], dropSecret: [UInt8] = []) {
            self.id = id
            self.path = path
            self.fileClass = fileClass
            self.protectionClass = protectionClass
            self.identifier = identifier
            self.wrapped = wrapped
            self.dropPublicKey = dropPublicKey
            self.dropSecret = dropSecret
        }
    }

    /// Every protected directory's row, by path.
    package func fileKeys() throws(SecError) -> [FileKeyRow] {
        let s = try db.statement("SELECT id, path, fclass, pclass, keyid, wrapped, droppk, dropsk FROM file_keys ORDER BY path")
        defer { unsafe sqlite3_reset(s.stmt) }
        var out: [FileKeyRow] = []
        while try s.step() {
            out.append(FileKeyRow(id: s.int64(0), path: s.blob(1), fileClass: UInt8(clamping: s.int64(2)),
                                  protectionClass: UInt8(clamping: s.int64(3)), identifier: s.blob(4), wrapped: s.blob(5),
                                  dropPublicKey: s.blob(6), dropSecret: s.blob(7)))
        }
        return out
    }

    /// Adds a protected directory's row (errSecDuplicateItem for a path or key identifier already there).
    package func insertFileKey(_ row: FileKeyRow) throws(SecError) {
        let s = try db.statement("INSERT INTO file_keys(path, fclass, pclass, keyid, wrapped, droppk, dropsk) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")
        s.bind(1, row.path)
        s.bind(2, Int64(row.fileClass))
        s.bind(3, Int64(row.protectionClass))
        s.bind(4, row.identifier)
        s.bind(5, row.wrapped)
        s.bind(6, row.dropPublicKey)
        s.bind(7, row.dropSecret)
        do {
            try s.run()
        } catch {
            throw SecError(.duplicateItem, "a protected directory with this path or key is already recorded")
        }
    }

    /// Replaces row `id`'s wrapped key and wrapped drop secret key (a rekey re-wraps them). Call inside ``transaction(_:)``.
    package func replaceFileKey(id: Int64, wrapped: [UInt8], dropSecret: [UInt8]) throws(SecError) {
        let s = try db.statement("UPDATE file_keys SET wrapped = ?1, dropsk = ?3 WHERE id = ?2")
        s.bind(1, wrapped)
        s.bind(2, id)
        s.bind(3, dropSecret)
        try s.run()
    }

    /// Keeps a file written into the protected directory `dir` while locked (sealed to its drop key);
    /// returns its id.
    package func insertDrop(dir: [UInt8], sealed: [UInt8]) throws(SecError) -> Int64 {
        let s = try db.statement("INSERT INTO file_drops(dir, sealed) VALUES (?1, ?2)")
        s.bind(1, dir)
        s.bind(2, sealed)
        try s.run()
        return db.lastInsertRowID
    }

    /// The files waiting to be written into protected directories, oldest first.
    package func drops() throws(SecError) -> [(id: Int64, dir: [UInt8], sealed: [UInt8])] {
        let s = try db.statement("SELECT id, dir, sealed FROM file_drops ORDER BY id")
        defer { unsafe sqlite3_reset(s.stmt) }
        var out: [(id: Int64, dir: [UInt8], sealed: [UInt8])] = []
        while try s.step() { out.append((s.int64(0), s.blob(1), s.blob(2))) }
        return out
    }

    /// The drops waiting, oldest first, without their contents: row and directory.
    package func dropRows() throws(SecError) -> [(id: Int64, dir: [UInt8])] {
        let s = try db.statement("SELECT id, dir FROM file_drops ORDER BY id")
        defer { unsafe sqlite3_reset(s.stmt) }
        var out: [(id: Int64, dir: [UInt8])] = []
        while try s.step() { out.append((s.int64(0), s.blob(1))) }
        return out
    }

    /// Drop `id`'s directory and sealed contents; nil when there is no such row.
    package func drop(id: Int64) throws(SecError) -> (dir: [UInt8], sealed: [UInt8])? {
        let s = try db.statement("SELECT dir, sealed FROM file_drops WHERE id = ?1")
        defer { unsafe sqlite3_reset(s.stmt) }
        s.bind(1, id)
        guard try s.step() else { return nil }
        return (s.blob(0), s.blob(1))
    }

    /// The bytes every waiting drop's sealed contents take together.
    package func dropBytes() throws(SecError) -> Int64 {
        let s = try db.statement("SELECT COALESCE(SUM(length(sealed)), 0) FROM file_drops")
        defer { unsafe sqlite3_reset(s.stmt) }
        guard try s.step() else { return 0 }
        return s.int64(0)
    }

    /// Forgets drop `id` (written into its directory and synced).
    package func deleteDrop(id: Int64) throws(SecError) {
        let s = try db.statement("DELETE FROM file_drops WHERE id = ?1")
        s.bind(1, id)
        try s.run()
    }

    /// Deletes the row of the directory `path`; false if there was none.
    package func deleteFileKey(path: [UInt8]) throws(SecError) -> Bool {
        let s = try db.statement("DELETE FROM file_keys WHERE path = ?1")
        s.bind(1, path)
        try s.run()
        let deleted = db.changes > 0
        let drops = try db.statement("DELETE FROM file_drops WHERE dir = ?1")
        drops.bind(1, path)
        try drops.run()
        return deleted
    }
}
