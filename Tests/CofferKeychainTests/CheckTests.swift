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
        let kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
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

        // The migrated file says so, and opens again as it is.
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("7".utf8)])
        let again = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(try again.check(.listQuarantine).findings.isEmpty)
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("7".utf8)])
    }

    /// A version-2 database (the format of the previous landing: a quarantine without reason codes)
    /// with a quarantined row: version 3 adds the code in one transaction; the row lists as it was
    /// (authentication, the only reason version 2 quarantined) and restores.
    @Test func aVersion2QuarantineMigratesToVersion3() throws {
        let dir = try Fixtures.copy("v1-nopasscode")
        let path = dir.file("keychain.db")
        let ref: [UInt8] = Array(100..<116)
        // What version 2 of the store wrote (its migration statement, verbatim), then a row it quarantined.
        Self.damage(path, """
            BEGIN;
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
            INSERT INTO quarantine(pref, pk, pclass, meta, secret, idx, reason, qtime)
                VALUES (X'\(Hex.encode(ref))', randomblob(32), 3, randomblob(99), randomblob(99), randomblob(32), 'its attributes fail authentication', 0);
            COMMIT;
            """)
        let kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("7".utf8)])
        let listed = try kc.check(.listQuarantine).findings
        #expect(listed == [CheckFinding(persistentRef: ref, reason: .authentication, quarantined: true, detail: "its attributes fail authentication")])
        _ = try kc.check(.restore(persistentRef: ref))
        #expect(sqlRows(path, "SELECT count(*) FROM items WHERE pref = X'\(Hex.encode(ref))'") == [Array("1".utf8)])
    }

    /// Rows that cannot be opened for another reason than authentication (attributes that open but
    /// name another protection than their row) are quarantined too, with their reason kept; a reused
    /// reference is its own finding and does not roll back the rest; an erase empties the quarantine;
    /// damaged index entries refuse a restore instead of restoring a row under cut hashes. Before: a
    /// `class` row stayed and kept failing every search with errSecDecode.
    @Test func everyRowThatCannotBeOpenedIsQuarantinedAndNothingRollsBack() throws {
        let f = try Fixture()
        try f.addPassword(service: "s", account: "a", secret: "1")
        let path = f.dir.file("keychain.db")
        let r2: [UInt8] = Array(16..<32)
        // Forge "b": its attributes sealed properly under its class's key, but naming another protection.
        let forged = try f.addPassword(service: "s", account: "b", secret: "2")
        let r1 = try #require(forged.persistentRef)
        let pclass = try #require(sqlRows(path, "SELECT pclass FROM items WHERE pref = X'\(Hex.encode(r1))'").first)
        let protection = try #require(ProtectionClass(rawValue: UInt8(String(decoding: pclass, as: UTF8.self))!))
        let wrong = ProtectionClass.allCases.first { $0 != protection }!
        let plain = AttributeCodec.encode(["class": .string("genp"), "pdmn": .string(wrong.shortCode), "agrp": .string("g")])
        let meta = try f.keychain.keybag.withMetadataKey(protection) { k in
            plain.withUnsafeBytes { ItemCrypto.sealMeta($0, classKey: k, ref: r1, protection: protection) }
        }
        Self.damage(path, "UPDATE items SET meta = X'\(Hex.encode(meta))' WHERE pref = X'\(Hex.encode(r1))'")
        do {
            _ = try f.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, limit: .all, returnAttributes: true), scope: .unrestricted)
            Issue.record("a search read the forged row")
        } catch {
            #expect(error.status == .decode)
        }
        var report = try f.keychain.check(.quarantine)
        #expect(report.findings.map(\.reason) == [.itemClass] && report.findings.map(\.quarantined) == [true], "\(report)")
        #expect(try f.keychain.check(.listQuarantine).findings.map(\.reason) == [.itemClass])
        #expect(try f.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, limit: .all, returnAttributes: true), scope: .unrestricted).count == 1,
                "searches work again")

        // A forged row reusing r1 beside a new forged row r2: r2 is quarantined, r1's copy stays, reported.
        Self.damage(path, "INSERT INTO items(pref, pk, pclass, meta, secret) VALUES (X'\(Hex.encode(r1))', randomblob(32), 3, randomblob(99), randomblob(99))")
        Self.damage(path, "INSERT INTO items(pref, pk, pclass, meta, secret) VALUES (X'\(Hex.encode(r2))', randomblob(32), 3, randomblob(99), randomblob(99))")
        report = try f.keychain.check(.quarantine)
        #expect(Set(report.findings.filter(\.quarantined).map(\.persistentRef)) == [r2], "\(report)")
        #expect(report.findings.first { $0.persistentRef == r1 }?.detail.contains("already in the quarantine") == true, "\(report)")
        #expect(try f.keychain.check(.listQuarantine).findings.count == 2)

        // Damaged index entries: the restore is refused, nothing moves.
        Self.damage(path, "UPDATE quarantine SET idx = randomblob(17) WHERE pref = X'\(Hex.encode(r2))'")
        do {
            _ = try f.keychain.check(.restore(persistentRef: r2))
            Issue.record("restored a row with cut index entries")
        } catch {
            #expect(error.status == .decode, "\(error)")
        }
        #expect(try f.keychain.check(.listQuarantine).findings.count == 2)

        // An erase leaves nothing of the old keychain, the quarantine included.
        f.keychain.eraseEverything()
        #expect(try f.keychain.check(.listQuarantine).findings.isEmpty)
        #expect(sqlRows(path, "SELECT count(*) FROM quarantine") == [Array("0".utf8)])
    }

    /// A check paged by a reply budget: each page ends before the finding that does not fit, the next
    /// starts there, and the pages together give every finding once; a whole-or-nothing check refuses
    /// with errSecAllocate and moves nothing.
    @Test func aCheckIsPagedByTheReplyBudget() throws {
        let f = try Fixture()
        let path = f.dir.file("keychain.db")
        try f.addPassword(service: "s", account: "a", secret: "1")
        Self.damage(path, """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 7)
            INSERT INTO items(pref, pk, pclass, meta, secret) SELECT randomblob(16), randomblob(32), 3, randomblob(99), randomblob(99) FROM n
            """)
        try f.addPassword(service: "s", account: "b", secret: "2")
        func budget(_ n: Int) -> (CheckFinding) -> Bool { var left = n; return { _ in left -= 1; return left >= 0 } }
        do {
            _ = try f.keychain.check(.quarantine, wholeOrNothing: true, fits: budget(3))
            Issue.record("a report larger than the budget was answered whole")
        } catch {
            #expect(error.status == .allocate)
        }
        #expect(sqlRows(path, "SELECT count(*) FROM quarantine") == [Array("0".utf8)], "nothing moved")

        var cursor: Int64 = 0, pages = 0, findings: [CheckFinding] = [], checked: UInt32 = 0
        repeat {
            let page = try f.keychain.check(.quarantine, after: cursor, fits: budget(3))
            findings += page.findings
            checked += page.checked
            pages += 1
            cursor = Int64(page.nextCursor)
        } while cursor != 0 && pages < 10
        #expect(pages == 3 && findings.count == 7 && Set(findings.map(\.persistentRef)).count == 7 && checked == 9, "\(pages) \(findings.count) \(checked)")
        #expect(findings.allSatisfy { $0.quarantined })
        var listed: [CheckFinding] = []
        cursor = 0
        repeat {
            let page = try f.keychain.check(.listQuarantine, after: cursor, fits: budget(2))
            listed += page.findings
            cursor = Int64(page.nextCursor)
        } while cursor != 0 && listed.count < 20
        #expect(listed.map(\.persistentRef) == findings.map(\.persistentRef))
    }

    @Test func aListingSkipsAndCountsUnreadableRows() throws {
        let f = try Fixture()
        try f.addPassword(service: "s", account: "a", secret: "1")
        try f.addPassword(service: "s", account: "b", secret: "2")
        Self.damage(f.dir.file("keychain.db"), "UPDATE items SET meta = randomblob(length(meta)) WHERE id = 1")
        var q = ItemQuery(itemClass: .genericPassword, limit: .all, returnAttributes: true)
        do {
            _ = try f.keychain.copyMatchingPage(q, scope: .unrestricted, after: 0) { _ in true }
            Issue.record("a plain listing read a damaged row")
        } catch {
            #expect(error.status == .decode)
        }
        q.skipUnreadable = true
        let page = try f.keychain.copyMatchingPage(q, scope: .unrestricted, after: 0) { _ in true }
        #expect(page.items.count == 1 && page.unreadable == 1 && page.isComplete)
    }

    /// A row whose secret fails authentication (its attributes intact) is damage too: a listing that
    /// returns data and tolerates damage skips it and counts it, where a plain one fails with
    /// errSecDecode (issue #44; before, the skipping listing failed as well).
    @Test func aListingReturningDataSkipsARowWhoseSecretIsDamaged() throws {
        let f = try Fixture()
        try f.addPassword(service: "s", account: "a", secret: "1")
        try f.addPassword(service: "s", account: "b", secret: "2")
        try f.addPassword(service: "s", account: "c", secret: "3")
        Self.damage(f.dir.file("keychain.db"), "UPDATE items SET secret = randomblob(length(secret)) WHERE id = 2")
        var q = ItemQuery(itemClass: .genericPassword, limit: .all, returnData: true, returnAttributes: true)
        do {
            _ = try f.keychain.copyMatchingPage(q, scope: .unrestricted, after: 0) { _ in true }
            Issue.record("a plain listing read a damaged secret")
        } catch {
            #expect(error.status == .decode)
        }
        q.skipUnreadable = true
        let page = try f.keychain.copyMatchingPage(q, scope: .unrestricted, after: 0) { _ in true }
        #expect(page.items.compactMap { text($0.data) } == ["1", "3"] && page.unreadable == 1 && page.isComplete)
    }

    /// Pages of one item each over items and damaged rows between them: each damaged row is counted
    /// by exactly one page. Before: rows skipped after a page's last item were counted by that page and
    /// again by the next, which resumes after that item.
    @Test func skippedRowsAreCountedOnceAcrossPages() throws {
        let f = try Fixture()
        try f.addPassword(service: "s", account: "a", secret: "1")
        try f.addPassword(service: "s", account: "x", secret: "0")
        try f.addPassword(service: "s", account: "y", secret: "0")
        try f.addPassword(service: "s", account: "b", secret: "2")
        Self.damage(f.dir.file("keychain.db"), "UPDATE items SET meta = randomblob(length(meta)) WHERE id IN (2, 3)")
        var q = ItemQuery(itemClass: .genericPassword, limit: .all, returnAttributes: true)
        q.skipUnreadable = true
        var cursor: Int64 = 0, unreadable = 0, items = 0, pages = 0
        while pages < 10 {
            var first = true
            let page = try f.keychain.copyMatchingPage(q, scope: .unrestricted, after: cursor) { _ in defer { first = false }; return first }
            unreadable += page.unreadable
            items += page.items.count
            pages += 1
            if page.isComplete { break }
            cursor = page.lastRowID
        }
        #expect(items == 2 && unreadable == 2, "\(items) items, \(unreadable) unreadable over \(pages) pages")
    }
}
