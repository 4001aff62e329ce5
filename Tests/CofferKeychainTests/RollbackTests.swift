import CSQLite
import CofferKeychain
import CofferModel
import CofferTestSupport
import Testing

/// Without rollback detection (no TPM, or `rollback-detection = off`), the limit the threat model
/// states under "Rollback": sealing binds each blob to its row and class, but nothing records which
/// *version* of a row is the latest, so an attacker who can write the database file can put back an
/// earlier sealed version of a row (or a deleted row) and the agent serves it. These tests pin that
/// documented behaviour next to what sealing does guarantee; ``RollbackDetectionTests`` shows the
/// same attacks refused where a TPM (swtpm) anchors the keychain.
@Suite struct RollbackTests {
    /// Copies the rows table as it is now; `restore` puts one row's columns back later.
    final class Snapshot {
        var rows: [Int64: (pref: [UInt8], pk: [UInt8], pclass: Int64, meta: [UInt8], secret: [UInt8])] = [:]
        var index: [(h: [UInt8], item: Int64)] = []
    }

    func withDatabase<R>(_ f: Fixture, _ body: (OpaquePointer) throws -> R) rethrows -> R {
        try Self.withDatabase(f.dir, body)
    }

    static func withDatabase<R>(_ dir: TemporaryDirectory, _ body: (OpaquePointer) throws -> R) rethrows -> R {
        var db: OpaquePointer?
        #expect(sqlite3_open(dir.file("keychain.db"), &db) == SQLITE_OK)
        defer { sqlite3_close(db) }
        return try body(db!)
    }

    /// The integer the first row of `sql` starts with, in the keychain.db of `dir`.
    static func sqlCount(_ dir: TemporaryDirectory, _ sql: String) -> Int64 {
        withDatabase(dir) { db in
            var s: OpaquePointer?
            sqlite3_prepare_v2(db, sql, -1, &s, nil)
            defer { sqlite3_finalize(s) }
            return sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1
        }
    }

    /// Every row of items, attr_index and rollback in `dir`'s keychain.db, as SQL literals.
    static func dump(_ dir: TemporaryDirectory) -> [String] {
        ["SELECT quote(id) || quote(pref) || quote(pk) || pclass || quote(meta) || quote(secret) FROM items ORDER BY id",
         "SELECT quote(h) || item FROM attr_index ORDER BY item, h",
         "SELECT bucket || quote(root) || n || ' ' || epoch || quote(tag) FROM rollback ORDER BY bucket"].flatMap { sql in
            withDatabase(dir) { db -> [String] in
                var s: OpaquePointer?
                sqlite3_prepare_v2(db, sql, -1, &s, nil)
                defer { sqlite3_finalize(s) }
                var out: [String] = []
                while sqlite3_step(s) == SQLITE_ROW { out.append(String(cString: sqlite3_column_text(s, 0))) }
                return out
            }
        }
    }

    static func blob(_ s: OpaquePointer, _ i: Int32) -> [UInt8] {
        let n = Int(sqlite3_column_bytes(s, i))
        guard n > 0, let p = sqlite3_column_blob(s, i) else { return [] }
        return Array(UnsafeRawBufferPointer(start: p, count: n))
    }

    func snapshot(_ f: Fixture) -> Snapshot { Self.snapshot(f.dir) }

    static func snapshot(_ dir: TemporaryDirectory) -> Snapshot {
        let snap = Snapshot()
        withDatabase(dir) { db in
            var s: OpaquePointer?
            sqlite3_prepare_v2(db, "SELECT id, pref, pk, pclass, meta, secret FROM items", -1, &s, nil)
            while sqlite3_step(s) == SQLITE_ROW {
                snap.rows[sqlite3_column_int64(s, 0)] = (Self.blob(s!, 1), Self.blob(s!, 2), sqlite3_column_int64(s, 3), Self.blob(s!, 4), Self.blob(s!, 5))
            }
            sqlite3_finalize(s)
            sqlite3_prepare_v2(db, "SELECT h, item FROM attr_index", -1, &s, nil)
            while sqlite3_step(s) == SQLITE_ROW { snap.index.append((Self.blob(s!, 0), sqlite3_column_int64(s, 1))) }
            sqlite3_finalize(s)
        }
        return snap
    }

    /// Writes row `id` (and its index entries) back as the snapshot had it, as an offline attacker would.
    func restore(_ f: Fixture, _ snap: Snapshot, id: Int64) { Self.restore(f.dir, snap, id: id) }

    static func restore(_ dir: TemporaryDirectory, _ snap: Snapshot, id: Int64) {
        guard let r = snap.rows[id] else { Issue.record("row \(id) not in the snapshot"); return }
        withDatabase(dir) { db in
            var s: OpaquePointer?
            sqlite3_exec(db, "DELETE FROM attr_index WHERE item = \(id)", nil, nil, nil)
            sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO items(id, pref, pk, pclass, meta, secret) VALUES (?1, ?2, ?3, ?4, ?5, ?6)", -1, &s, nil)
            sqlite3_bind_int64(s, 1, id)
            for (i, b) in [r.pref, r.pk].enumerated() { _ = b.withUnsafeBytes { sqlite3_bind_blob(s, Int32(i + 2), $0.baseAddress, Int32(b.count), nil) } }
            sqlite3_bind_int64(s, 4, r.pclass)
            for (i, b) in [r.meta, r.secret].enumerated() { _ = b.withUnsafeBytes { sqlite3_bind_blob(s, Int32(i + 5), $0.baseAddress, Int32(b.count), nil) } }
            #expect(sqlite3_step(s) == SQLITE_DONE)
            sqlite3_finalize(s)
            for e in snap.index where e.item == id {
                sqlite3_prepare_v2(db, "INSERT OR IGNORE INTO attr_index(h, item) VALUES (?1, ?2)", -1, &s, nil)
                _ = e.h.withUnsafeBytes { sqlite3_bind_blob(s, 1, $0.baseAddress, Int32(e.h.count), nil) }
                sqlite3_bind_int64(s, 2, id)
                sqlite3_step(s)
                sqlite3_finalize(s)
            }
        }
    }

    @Test func anEarlierVersionOfARowIsServedAsTheThreatModelStates() throws {
        let f = try Fixture()
        try f.addPassword(service: "svc", account: "a", secret: "old secret")
        f.keychain.checkpoint()
        let before = snapshot(f)
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string("a")])
        try f.keychain.update(q, ItemChanges(secret: secret("new secret")), scope: .unrestricted)
        #expect(try f.password(service: "svc", account: "a") == "new secret")
        f.keychain.checkpoint()
        // Offline: the row's earlier sealed version is written back. It still authenticates.
        try f.reboot()
        restore(f, before, id: before.rows.keys.first!)
        #expect(try f.password(service: "svc", account: "a") == "old secret",
                "without a TPM, rollback is not detected (ThreatModel.md, Rollback): update it and this test together")
    }

    @Test func aDeletedRowPutBackIsServedAsTheThreatModelStates() throws {
        let f = try Fixture()
        try f.addPassword(service: "svc", account: "gone", secret: "deleted secret")
        f.keychain.checkpoint()
        let before = snapshot(f)
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string("gone")])
        try f.keychain.delete(q, scope: .unrestricted)
        #expect(status { try f.password(service: "svc", account: "gone") } == .itemNotFound)
        try f.reboot()
        restore(f, before, id: before.rows.keys.first!)
        #expect(try f.password(service: "svc", account: "gone") == "deleted secret",
                "without a TPM, a deleted row put back is not detected (ThreatModel.md, Rollback)")
    }

    @Test func aRowsEarlierVersionUnderAnotherReferenceStillFails() throws {
        // What sealing does guarantee: an earlier version is bound to its own row (reference and class),
        // so it cannot stand in for a different item.
        let f = try Fixture()
        try f.addPassword(service: "svc", account: "a", secret: "AAAA")
        try f.addPassword(service: "svc", account: "b", secret: "BBBB")
        f.keychain.checkpoint()
        let before = snapshot(f)
        let ids = before.rows.keys.sorted()
        withDatabase(f) { db in
            var s: OpaquePointer?
            sqlite3_prepare_v2(db, "UPDATE items SET meta = ?1, secret = ?2 WHERE id = ?3", -1, &s, nil)
            let other = before.rows[ids[0]]!
            _ = other.meta.withUnsafeBytes { sqlite3_bind_blob(s, 1, $0.baseAddress, Int32(other.meta.count), nil) }
            _ = other.secret.withUnsafeBytes { sqlite3_bind_blob(s, 2, $0.baseAddress, Int32(other.secret.count), nil) }
            sqlite3_bind_int64(s, 3, ids[1])
            sqlite3_step(s)
            sqlite3_finalize(s)
        }
        #expect(status { try f.password(service: "svc", account: "b") } == .decode)
        #expect(try f.password(service: "svc", account: "a") == "AAAA")
    }
}
