import CSQLite
import CofferCrypto
import CofferKeybag
@testable import CofferKeychain
import CofferModel
import CofferTestSupport
import Foundation
import Testing

/// Reads `SELECT <column> ...` blobs or integers from a keychain database file with plain SQLite.
func sqlRows(_ path: String, _ sql: String) -> [[UInt8]] {
    var db: OpaquePointer?
    guard sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, nil) == SQLITE_OK else { return [] }
    defer { sqlite3_close(db) }
    var s: OpaquePointer?
    guard sqlite3_prepare_v2(db, sql, -1, &s, nil) == SQLITE_OK else { return [] }
    defer { sqlite3_finalize(s) }
    var out: [[UInt8]] = []
    while sqlite3_step(s) == SQLITE_ROW {
        let n = Int(sqlite3_column_bytes(s, 0))
        out.append(n > 0 ? Array(UnsafeRawBufferPointer(start: sqlite3_column_blob(s, 0), count: n)) : [])
    }
    return out
}

/// Copies the files of a state directory (those that exist) from `from` to `to`.
func copyState(_ names: [String], from: String, to: String) throws {
    for n in names where FileManager.default.fileExists(atPath: from + "/" + n) {
        try? FileManager.default.removeItem(atPath: to + "/" + n)
        try FileManager.default.copyItem(atPath: from + "/" + n, toPath: to + "/" + n)
        chmod(to + "/" + n, 0o600)
    }
}

@Suite struct RekeyTests {
    /// Issue #10 item 3: an old backup of the keybag files plus the old passcode opens nothing added
    /// after a passcode change (on the original code the class keys were only re-wrapped, so it did).
    @Test func oldKeybagBackupAndOldPasscodeCannotOpenItemsAddedAfterAChange() throws {
        let f = try Fixture(passcode: "old")
        for c in ProtectionClass.allCases {
            try f.addPassword(service: "before", account: c.shortCode, secret: "before-\(c.shortCode)", ["pdmn": .string(c.shortCode)])
        }
        let backup = TemporaryDirectory("coffer-backup")
        try copyState(["device.key", "keybag", "keybag.key"], from: f.dir.path, to: backup.path)

        try f.keychain.setPasscode(current: secret("old"), new: secret("new"), kdf: testKDF)
        for c in ProtectionClass.allCases {
            try f.addPassword(service: "after", account: c.shortCode, secret: "after-\(c.shortCode)", ["pdmn": .string(c.shortCode)])
        }
        f.keychain.checkpoint()

        // The attacker: old keybag files + the current database + the old passcode.
        let attacker = TemporaryDirectory("coffer-attacker")
        try copyState(["device.key", "keybag", "keybag.key"], from: backup.path, to: attacker.path)
        try copyState(["keychain.db"], from: f.dir.path, to: attacker.path)
        let stolen = try Keybag.openOrCreate(directory: attacker.path, deviceKey: FileDeviceKey(path: attacker.file("device.key")))
        try stolen.unlock(passcode: secret("old"))
        // Every rotated class key the old files hold differs from the one sealing the new items...
        for c in ProtectionClass.allCases where c.availability != .always {
            let old = try stolen.withClassKey(c) { Array($0) }
            let now = try f.keychain.keybag.withClassKey(c) { Array($0) }
            #expect(old != now, "\(c) class key was not rotated")
        }
        // ...so the old keychain view finds and opens none of the items added after the change.
        let oldView = try Keychain(directory: attacker.path, lockingStateDirectory: false)
        try? oldView.unlock(passcode: secret("old"))
        for c in ProtectionClass.allCases where c.availability != .always {
            let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("after"), "acct": .string(c.shortCode)], returnData: true)
            let r = status { try oldView.copyMatching(q, scope: .unrestricted) }
            #expect(r == .itemNotFound || r == .decode, "\(c): \(String(describing: r))")
        }

        // With the new passcode everything reads, before and after the change.
        try f.reboot()
        #expect(status { try f.keychain.unlock(passcode: secret("old")) } == .authFailed)
        try f.keychain.unlock(passcode: secret("new"))
        for c in ProtectionClass.allCases {
            #expect(try f.password(service: "before", account: c.shortCode) == "before-\(c.shortCode)")
            #expect(try f.password(service: "after", account: c.shortCode) == "after-\(c.shortCode)")
        }
        #expect(!f.keychain.keybag.needsRekey)
    }

    @Test func settingTheFirstPasscodeRotatesTooAndItemsSurvive() throws {
        let f = try Fixture()
        try f.addPassword(service: "s", account: "ak", secret: "x", ["pdmn": .string("ak")])
        let before = try f.keychain.keybag.withClassKey(.whenUnlocked) { Array($0) }
        try f.keychain.setPasscode(current: nil, new: secret("pin"), kdf: testKDF)
        #expect(try f.keychain.keybag.withClassKey(.whenUnlocked) { Array($0) } != before)
        #expect(try f.password(service: "s", account: "ak") == "x")
    }
}

@Suite struct IndexTierTests {
    /// Issue #10 item 4: with device.key and the keybag files but no passcode, an attacker derives the
    /// tier-D index key; it must not reproduce the blind hashes of a WhenUnlocked item (it does for Always).
    @Test func deviceKeyAloneCannotRecomputeBlindHashesOfPasscodeClasses() throws {
        let f = try Fixture(passcode: "pw")
        try f.addPassword(service: "payroll", account: "alice", secret: "s1", ["pdmn": .string("ak")])
        try f.addPassword(service: "wifi", account: "bob", secret: "s2", ["pdmn": .string("dk")])
        f.keychain.checkpoint()
        let attacker = TemporaryDirectory("coffer-attacker")
        try copyState(["device.key", "keybag", "keybag.key"], from: f.dir.path, to: attacker.path)
        let bag = try Keybag.openOrCreate(directory: attacker.path, deviceKey: FileDeviceKey(path: attacker.file("device.key")))
        #expect(bag.state == .boot)
        let stored = Set(sqlRows(f.dir.file("keychain.db"), "SELECT h FROM attr_index"))
        let pks = Set(sqlRows(f.dir.file("keychain.db"), "SELECT pk FROM items"))
        func guesses(_ svce: String, _ acct: String) throws -> ([[UInt8]], [UInt8]) {
            let attrs: Attributes = ["svce": .string(svce), "acct": .string(acct), "agrp": .string(AccessScope.defaultAccessGroup),
                                     "sync": .bool(false)]
            return try bag.withIndexKey(.device) { k in
                (Keychain.compoundHashes(k, attrs) + [Keychain.blindHash(k, "svce", .string(svce)), Keychain.blindHash(k, "acct", .string(acct))],
                 Keychain.primaryKeyHash(k, .genericPassword, attrs))
            }
        }
        let (ak, akPK) = try guesses("payroll", "alice")
        let (dk, dkPK) = try guesses("wifi", "bob")
        #expect(ak.allSatisfy { !stored.contains($0) }, "a WhenUnlocked item's blind hash is computable from the device key")
        #expect(!pks.contains(akPK))
        #expect(dk.allSatisfy { stored.contains($0) }) // the Always tier is the device key's, as documented
        #expect(pks.contains(dkPK))
        // The passcode-tier key is not in a keybag opened without the passcode.
        #expect(!bag.isAvailable(.passcode))
        #expect(throws: SecError.self) { try bag.withIndexKey(.passcode) { _ in () } }
    }

    @Test func searchesAndDuplicatesWorkAcrossTiersInEveryLockState() throws {
        let f = try Fixture(passcode: "pw")
        try f.addPassword(service: "svc", account: "dk", secret: "D", ["pdmn": .string("dk"), "labl": .string("L")])
        try f.addPassword(service: "svc", account: "ck", secret: "C", ["pdmn": .string("ck"), "labl": .string("L")])
        try f.addPassword(service: "svc", account: "ak", secret: "A", ["pdmn": .string("ak"), "labl": .string("L")])
        let all = ItemQuery(itemClass: .genericPassword, attributes: ["labl": .string("L")], limit: .all, returnData: true)
        // Unlocked: the union of both tiers, oldest first.
        #expect(try f.keychain.copyMatching(all, scope: .unrestricted).map { text($0.data) } == ["D", "C", "A"])
        var one = all
        one.limit = .one
        #expect(try f.keychain.copyMatching(one, scope: .unrestricted).map { text($0.data) } == ["D"])
        // Duplicates across tiers: the same primary key in another class is a duplicate (Apple's rule).
        #expect(status { try f.addPassword(service: "svc", account: "dk", secret: "x", ["pdmn": .string("ak")]) } == .duplicateItem)
        #expect(status { try f.addPassword(service: "svc", account: "ak", secret: "x", ["pdmn": .string("always")]) } == .duplicateItem)
        #expect(status { try f.addPassword(service: "svc", account: "ck", secret: "x", ["pdmn": .string("aku")]) } == .duplicateItem)
        // An update into another item's primary key, across tiers, is a duplicate and changes nothing.
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("ak")])
        #expect(status { try f.keychain.update(q, ItemChanges(attributes: ["acct": .string("dk")]), scope: .unrestricted) } == .duplicateItem)
        #expect(status { try f.keychain.update(q, ItemChanges(attributes: ["acct": .string("dk"), "pdmn": .string("dku")]), scope: .unrestricted) } == .duplicateItem)
        #expect(try f.password(service: "svc", account: "ak") == "A")
        // A move between tiers keeps the item findable.
        try f.keychain.update(q, ItemChanges(attributes: ["pdmn": .string("dku")]), scope: .unrestricted)
        #expect(try f.password(service: "svc", account: "ak") == "A")
        try f.keychain.update(q, ItemChanges(attributes: ["pdmn": .string("ak")]), scope: .unrestricted)

        // Locked: AfterFirstUnlock items stay searchable (tier P stays in memory).
        f.keychain.lock()
        #expect(try f.password(service: "svc", account: "ck") == "C")
        #expect(try f.password(service: "svc", account: "dk") == "D")
        #expect(status { try f.password(service: "svc", account: "ak") } == .interactionNotAllowed)
        #expect(status { try f.addPassword(service: "svc", account: "ck", secret: "x", ["pdmn": .string("always")]) } == .duplicateItem)
        // Boot: only tier D; a non-Always item can be neither found nor ruled out, so a search that
        // could reach tier P fails even where tier D holds a match (never a silent partial answer);
        // one naming an Always class reads it.
        try f.reboot()
        #expect(status { try f.password(service: "svc", account: "dk") } == .interactionNotAllowed)
        #expect(status { try f.password(service: "svc", account: "ck") } == .interactionNotAllowed)
        #expect(status { try f.keychain.copyMatching(all, scope: .unrestricted) } == .interactionNotAllowed)
        let dk = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("dk"), "pdmn": .string("dk")], returnData: true)
        #expect(text(try f.keychain.copyMatching(dk, scope: .unrestricted).first?.data) == "D")
        let alwaysOnly = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("none"), "pdmn": .string("dk")])
        #expect(status { try f.keychain.copyMatching(alwaysOnly, scope: .unrestricted) } == .itemNotFound)
        try f.keychain.unlock(passcode: secret("pw"))
        #expect(try f.keychain.copyMatching(all, scope: .unrestricted).map { text($0.data) } == ["D", "C", "A"])
    }

    @Test func searchIsAConstantNumberOfIndexSeeks() throws {
        // Lookups stay O(1) in the item count: a lookup among 2,000 items costs about what it does among 20.
        let f = try Fixture()
        func timeLookups() throws -> Double {
            let t0 = nowMillis()
            for i in 0..<200 { _ = try f.password(service: "svc", account: "acct\(i % 20)") }
            return nowMillis() - t0
        }
        for i in 0..<20 { try f.addPassword(service: "svc", account: "acct\(i)", secret: "s", ["pdmn": .string(i % 2 == 0 ? "dk" : "ck")]) }
        let small = try timeLookups()
        try f.keychain.add(contentsOf: (20..<2000).map { i in
            NewItem(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string("acct\(i)"),
                                                              "pdmn": .string(i % 2 == 0 ? "dk" : "ck")], secret: secret("s"))
        }, scope: .unrestricted)
        let large = try timeLookups()
        #expect(large < small * 4 + 20, "lookups went from \(small) ms to \(large) ms")
    }
}

@Suite struct PaddingTests {
    /// Issue #10 item 4: the sealed secret's length no longer reveals the secret's length.
    @Test func sealedSecretsOfOneAndFortyBytesHaveTheSameLength() throws {
        let f = try Fixture()
        try f.addPassword(service: "s", account: "one", secret: "x")
        try f.addPassword(service: "s", account: "forty", secret: String(repeating: "y", count: 40))
        try f.addPassword(service: "s", account: "big", secret: String(repeating: "z", count: 5000))
        let sealed = sqlRows(f.dir.file("keychain.db"), "SELECT secret FROM items ORDER BY id")
        #expect(sealed.count == 3)
        #expect(sealed[0].count == sealed[1].count)
        #expect(sealed[2].count > sealed[1].count)
        #expect(sealed.allSatisfy { $0.first == 2 }) // item format 2
        #expect(try f.password(service: "s", account: "one") == "x")
        #expect(try f.password(service: "s", account: "forty") == String(repeating: "y", count: 40))
        #expect(try f.password(service: "s", account: "big") == String(repeating: "z", count: 5000))
        #expect(ItemCrypto.paddedSize(0) == 64 && ItemCrypto.paddedSize(60) == 64 && ItemCrypto.paddedSize(61) == 128)
        #expect(ItemCrypto.paddedSize(4092) == 4096 && ItemCrypto.paddedSize(4093) == 8192 && ItemCrypto.paddedSize(9000) == 12288)
    }

    @Test func aPaddedSecretRelabelledAsUnpaddedFailsAuthentication() throws {
        let f = try Fixture()
        try f.addPassword(service: "s", account: "a", secret: "abc")
        var db: OpaquePointer?
        #expect(sqlite3_open(f.dir.file("keychain.db"), &db) == SQLITE_OK)
        sqlite3_exec(db, "UPDATE items SET secret = X'01' || substr(secret, 2)", nil, nil, nil)
        sqlite3_close(db)
        #expect(status { try f.password(service: "s", account: "a") } == .decode)
    }
}
