import CSQLite
import CofferCrypto
import CofferKeybag
@testable import CofferKeychain
import CofferModel
import CofferTestSupport
import Testing

@Suite struct ProtectionClassTests {
    /// One item per class, named after the class's short code.
    func addOnePerClass(_ f: Fixture) throws {
        for c in ProtectionClass.allCases {
            try f.addPassword(service: "svc", account: c.shortCode, secret: "secret-\(c.shortCode)", ["pdmn": .string(c.shortCode)])
        }
    }

    func readable(_ f: Fixture) -> [String: SecStatus?] {
        var out: [String: SecStatus?] = [:]
        for c in ProtectionClass.allCases {
            // Each read names its class: before the first unlock a search that could reach the
            // passcode tier fails whatever tier D holds (BootSearchTests).
            let q = ItemQuery(itemClass: .genericPassword,
                              attributes: ["svce": .string("svc"), "acct": .string(c.shortCode), "pdmn": .string(c.shortCode)], returnData: true)
            out[c.shortCode] = status { _ = try f.keychain.copyMatching(q, scope: .unrestricted) }
        }
        return out
    }

    @Test func lockUnlockRebootPerClass() throws {
        let f = try Fixture(passcode: "2468")
        try addOnePerClass(f)
        #expect(readable(f).values.allSatisfy { $0 == nil })

        f.keychain.lock()
        let locked = readable(f)
        for c in ProtectionClass.allCases {
            #expect(locked[c.shortCode]! == (c.availability == .whenUnlocked ? .interactionNotAllowed : nil), "\(c)")
        }
        // Adding to a locked class fails too; to an available one works.
        #expect(status { try f.addPassword(service: "new", account: "x", secret: "x") } == .interactionNotAllowed)
        try f.addPassword(service: "new", account: "y", secret: "y", ["pdmn": .string("ck")])

        try f.reboot()
        let boot = readable(f)
        for c in ProtectionClass.allCases {
            #expect(boot[c.shortCode]! == (c.availability == .always ? nil : .interactionNotAllowed), "\(c)")
        }
        try f.keychain.unlock(passcode: secret("2468"))
        #expect(readable(f).values.allSatisfy { $0 == nil })
        #expect(try f.password(service: "svc", account: "akpu") == "secret-akpu")
    }

    @Test func whenPasscodeSetNeedsAPasscode() throws {
        let f = try Fixture()
        #expect(status { try f.addPassword(service: "s", account: "a", secret: "x", ["pdmn": .string("akpu")]) } == .notAvailable)
        try f.keychain.setPasscode(current: nil, new: secret("pin"), kdf: testKDF)
        try f.addPassword(service: "s", account: "a", secret: "x", ["pdmn": .string("akpu")])
        #expect(try f.password(service: "s", account: "a") == "x")
    }

    @Test func itemsSurvivePasscodeChange() throws {
        let f = try Fixture(passcode: "old")
        try addOnePerClass(f)
        try f.keychain.setPasscode(current: secret("old"), new: secret("new"), kdf: testKDF)
        try f.reboot()
        #expect(status { try f.keychain.unlock(passcode: secret("old")) } == .authFailed)
        try f.keychain.unlock(passcode: secret("new"))
        #expect(readable(f).values.allSatisfy { $0 == nil })
    }

    @Test func updateKeepsProtectionUnlessANewOneIsNamed() throws {
        let f = try Fixture(passcode: "pw")
        try f.addPassword(service: "svc", account: "a", secret: "A") // WhenUnlocked by default
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("a")], returnAttributes: true)
        try f.keychain.update(q, ItemChanges(attributes: ["labl": .string("x")]), scope: .unrestricted)
        #expect(try f.keychain.copyMatching(q, scope: .unrestricted)[0].attributes?["pdmn"] == .string("ak"))
        f.keychain.lock()
        #expect(status { try f.password(service: "svc", account: "a") } == .interactionNotAllowed)
        try f.keychain.unlock(passcode: secret("pw"))
        // Re-wrap under Always: readable while locked and after a reboot.
        try f.keychain.update(q, ItemChanges(attributes: ["pdmn": .string("always")]), scope: .unrestricted)
        try f.reboot()
        #expect(try f.password(service: "svc", account: "a") == "A")
        // Moving to a locked class while locked is refused.
        #expect(status { try f.keychain.update(q, ItemChanges(attributes: ["pdmn": .string("ak")]), scope: .unrestricted) } == .interactionNotAllowed)
        #expect(try f.password(service: "svc", account: "a") == "A")
    }
}

@Suite struct AtRestTests {
    @Test func noPlaintextInDatabaseWalOrKeybag() throws {
        let f = try Fixture(passcode: "correct horse battery")
        let secretValue = "SECRET-VALUE-0123456789"
        let account = "account-name-alice@example.org"
        let service = "service-name-payroll"
        try f.addPassword(service: service, account: account, secret: secretValue, ["labl": .string("label-text-xyz")])
        try f.keychain.add(NewItem(itemClass: .key, attributes: ["atag": .data(Array("key-tag-abc".utf8))], secret: secret("PRIVATE-KEY-BYTES-987")), scope: .unrestricted)
        var keys: [[UInt8]] = []
        for c in ProtectionClass.allCases {
            try f.keychain.keybag.withClassKey(c) { keys.append(Array($0)) }
            try f.keychain.keybag.withMetadataKey(c) { keys.append(Array($0)) }
        }
        try f.keychain.keybag.withIndexKey { keys.append(Array($0)) }
        let needles = [secretValue, account, service, "label-text-xyz", "key-tag-abc", "PRIVATE-KEY-BYTES-987", "correct horse battery"]
            .map { Array($0.utf8) } + keys + [fileBytes(f.dir.file("device.key"))]
        // Before and after a checkpoint: the WAL and the main file are both scanned.
        for phase in ["wal", "checkpointed"] {
            let files = ["keychain.db", "keychain.db-wal", "keychain.db-shm", "keybag", "keybag.key"].map { f.dir.file($0) }
            #expect(fileBytes(files[0]).count + fileBytes(files[1]).count > 4096, "\(phase): database is empty?")
            for path in files {
                let bytes = fileBytes(path)
                for (i, n) in needles.enumerated() {
                    #expect(!containsSubsequence(bytes, n), "\(phase): needle \(i) found in \(path)")
                }
            }
            f.keychain.checkpoint()
        }
    }

    func withDatabase(_ f: Fixture, _ body: (OpaquePointer) -> Void) {
        var db: OpaquePointer?
        #expect(sqlite3_open(f.dir.file("keychain.db"), &db) == SQLITE_OK)
        body(db!)
        sqlite3_close(db)
    }

    @Test func tamperedRowsFailAuthenticationNeverWrongData() throws {
        let f = try Fixture()
        try f.addPassword(service: "svc", account: "a", secret: "AAAA")
        try f.addPassword(service: "svc", account: "b", secret: "BBBB")
        // Flip a byte inside the sealed secret of item a.
        withDatabase(f) { db in
            sqlite3_exec(db, "UPDATE items SET secret = substr(secret, 1, 60) || X'FF' || substr(secret, 62) WHERE id = 1", nil, nil, nil)
        }
        #expect(status { try f.password(service: "svc", account: "a") } == .decode)
        #expect(try f.password(service: "svc", account: "b") == "BBBB")
        // Swap the sealed secrets of two rows: associated data binds each to its row.
        withDatabase(f) { db in
            sqlite3_exec(db, "UPDATE items SET secret = (SELECT secret FROM items WHERE id = 2) WHERE id = 1", nil, nil, nil)
        }
        #expect(status { try f.password(service: "svc", account: "a") } == .decode)
        // Relabel a row's protection class: its blobs no longer authenticate.
        withDatabase(f) { db in sqlite3_exec(db, "UPDATE items SET pclass = 3 WHERE id = 2", nil, nil, nil) }
        #expect(status { try f.password(service: "svc", account: "b") } == .decode)
    }

    @Test func tamperedBlindIndexCannotReturnAnotherItem() throws {
        let f = try Fixture()
        try f.addPassword(service: "svc", account: "a", secret: "AAAA")
        try f.addPassword(service: "svc", account: "b", secret: "BBBB")
        // Point every index entry of item a at item b as well.
        withDatabase(f) { db in
            sqlite3_exec(db, "INSERT OR IGNORE INTO attr_index(h, item) SELECT h, 2 FROM attr_index WHERE item = 1", nil, nil, nil)
        }
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string("a")], limit: .all, returnData: true)
        #expect(try f.keychain.copyMatching(q, scope: .unrestricted).map { text($0.data) } == ["AAAA"])
    }

    @Test func corruptDatabaseFileIsACleanError() throws {
        let dir = TemporaryDirectory()
        writeFileBytes(dir.file("keychain.db"), Array(repeating: 0x41, count: 8192))
        do { _ = try Keychain(directory: dir.path, lockingStateDirectory: false); Issue.record("opened garbage") } catch {
            #expect(error.status == .decode)
        }
    }
}
