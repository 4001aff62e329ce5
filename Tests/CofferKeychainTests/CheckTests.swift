import CofferCrypto
import CofferKeybag
@testable import CofferKeychain
import CofferModel
import CofferTestSupport
import CSQLite
import Testing

/// The keychain's side of `coffer check` on real SQLite files: the quarantine table arrives by the
/// store's versioned migration (from a committed database of the previous format), and rows move
/// into it and back whole.
@Suite struct CheckTests {
    /// Runs one statement that changes the database (as damage would, outside the keychain).
    static func damage(_ path: String, _ sql: String) {
        var db: OpaquePointer?
        guard sqlite3_open(path, &db) == SQLITE_OK else { Issue.record("cannot open \(path)"); return }
        defer { sqlite3_close(db) }
        #expect(sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK)
    }

    @Test func theQuarantineTableArrivesByMigrationFromTheVersion1Format() throws {
        let dir = try Fixtures.copy("v1-nopasscode")
        let path = dir.file("keychain.db")
        let before = sqlRows(path, "SELECT name FROM sqlite_master WHERE name = 'quarantine'")
        #expect(before.isEmpty, "the fixture is the old format")
        let kc = try Keychain(directory: dir.path)
        let rows = { sqlRows(path, "SELECT pref FROM items").count }
        let n = rows()
        var report = try kc.check(.verify)
        #expect(report.findings.isEmpty && Int(report.checked) == n && report.skipped == 0, "\(report)")
        #expect(sqlRows(path, "SELECT name FROM sqlite_master WHERE name = 'quarantine'").count == 1)

        // A forged row: found, quarantined with its index entries, restored whole.
        let ref: [UInt8] = Array(0..<16)
        Self.damage(path, "INSERT INTO items(pref, pk, pclass, meta, secret) VALUES (X'\(Hex.encode(ref))', randomblob(32), 3, randomblob(99), randomblob(99))")
        report = try kc.check(.verify)
        #expect(report.findings == [CheckFinding(persistentRef: ref, reason: .authentication, quarantined: false, detail: report.findings.first?.detail ?? "")])
        report = try kc.check(.quarantine)
        #expect(report.findings.map(\.quarantined) == [true])
        #expect(rows() == n)
        #expect(try kc.check(.listQuarantine).findings.map(\.persistentRef) == [ref])
        #expect(try kc.check(.verify).findings.isEmpty)
        _ = try kc.check(.restore(persistentRef: ref))
        #expect(rows() == n + 1)
        #expect(try kc.check(.listQuarantine).findings.isEmpty)
        do {
            _ = try kc.check(.restore(persistentRef: ref))
            Issue.record("restored twice")
        } catch {
            #expect(error.status == .itemNotFound)
        }

        // An index entry gone: reported as such (not quarantined: the item itself opens).
        Self.damage(path, "DELETE FROM items WHERE pref = X'\(Hex.encode(ref))'")
        Self.damage(path, "DELETE FROM attr_index WHERE item = (SELECT min(item) FROM attr_index) AND h = (SELECT min(h) FROM attr_index WHERE item = (SELECT min(item) FROM attr_index))")
        report = try kc.check(.quarantine)
        #expect(report.findings.map(\.reason) == [.index] && report.findings.map(\.quarantined) == [false], "\(report)")
    }

    @Test func aListingSkipsAndCountsUnreadableRows() throws {
        let f = try Fixture()
        try f.addPassword(service: "s", account: "a", secret: "1")
        try f.addPassword(service: "s", account: "b", secret: "2")
        Self.damage(f.dir.file("keychain.db"), "UPDATE items SET meta = randomblob(length(meta)) WHERE id = 1")
        var q = ItemQuery(itemClass: .genericPassword, limit: .all, returnAttributes: true)
        do {
            _ = try f.keychain.copyMatchingPage(q, after: 0) { _ in true }
            Issue.record("a plain listing read a damaged row")
        } catch {
            #expect(error.status == .decode)
        }
        q.skipUnreadable = true
        let page = try f.keychain.copyMatchingPage(q, after: 0) { _ in true }
        #expect(page.items.count == 1 && page.unreadable == 1 && page.isComplete)
    }
}
