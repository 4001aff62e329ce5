import Glibc
import CofferCrypto
import CofferKeybag
@testable import CofferKeychain
import CofferModel
import CofferTestSupport
import Testing

/// Protected directories' keys in the keychain (store schema 7, FileProtectionFormat.md): the migration
/// from schema 6, wrapping by the class key, and a passcode change (a rekey) that keeps every key.
@Suite struct FileKeyTests {
    static let identifier = [UInt8](repeating: 0xA5, count: 16)

    @Test func aSchema6KeychainMigratesAndKeepsItsItems() throws {
        let dir = try Fixtures.copy("schema6")
        let path = dir.file("keychain.db")
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("6".utf8)])
        #expect(sqlRows(path, "SELECT name FROM sqlite_master WHERE name = 'file_keys'").isEmpty)
        var kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("7".utf8)])
        #expect(sqlRows(path, "SELECT name FROM sqlite_master WHERE name = 'file_keys'") == [Array("file_keys".utf8)])
        #expect(try kc.count() == 4)
        for account in ["alice", "bob", "dave"] {
            let got = try kc.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string(account)], returnData: true),
                                          scope: .unrestricted)
            #expect(got.count == 1 && text(got.first?.data) == "pw-" + account, "\(account)")
        }
        #expect(try kc.fileKeyRecords().isEmpty)
        // The migrated keychain records a directory; a reopen finds it (and migrates nothing again).
        let key = secret(count: 64)
        try kc.addFileKey(path: "/home/p/Private", protection: .complete, identifier: Self.identifier, key: key)
        kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(try kc.fileKeyRecords() == [FileKeyRecord(path: "/home/p/Private", protection: .complete, identifier: Self.identifier, version: 1)])
        #expect(try kc.fileKey(kc.fileKeyRecords()[0]).withUnsafeBytes { Array($0) } == key.withUnsafeBytes { Array($0) })
    }

    @Test func directoryKeysAreWrappedByTheirClassKeyAndSurviveAPasscodeChange() throws {
        let dir = TemporaryDirectory("coffer-filekeys")
        var kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        try kc.setPasscode(current: nil, new: secret("one"), kdf: testKDF)
        var keys: [FileProtection: [UInt8]] = [:]
        for (i, p) in FileProtection.allCases.enumerated() {
            let key = secret(count: 64)
            keys[p] = key.withUnsafeBytes { Array($0) }
            try kc.addFileKey(path: "/d/\(p.cliName)", protection: p, identifier: [UInt8](repeating: UInt8(i), count: 16), key: key)
        }
        // The key is in the store wrapped, never in the clear.
        let stored = sqlRows(dir.file("keychain.db"), "SELECT wrapped FROM file_keys")
        #expect(stored.count == 4)
        for w in stored { for k in keys.values { #expect(!containsSubsequence(w, Array(k[0..<16]))) } }
        // A duplicate path is refused.
        #expect(status { try kc.addFileKey(path: "/d/none", protection: .none, identifier: [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9], key: secret(count: 64)) } == .duplicateItem)

        func expectKeys(_ kc: Keychain, available: Set<FileProtection>) throws {
            for r in try kc.fileKeyRecords() {
                if available.contains(r.protection) {
                    #expect(try kc.fileKey(r).withUnsafeBytes { Array($0) } == keys[r.protection], "\(r.path)")
                } else {
                    #expect(status { try kc.fileKey(r) } == .interactionNotAllowed, "\(r.path)")
                }
            }
        }
        try expectKeys(kc, available: Set(FileProtection.allCases))
        // Locked: Complete and CompleteUnlessOpen keys are out of reach; the others stay.
        #expect(kc.lock())
        try expectKeys(kc, available: [.untilFirstUserAuthentication, .none])
        // A restart before the first unlock: only None.
        kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        try expectKeys(kc, available: [.none])
        try kc.unlock(passcode: secret("one"))
        // A passcode change rotates the class keys and re-wraps every directory key.
        let before = sqlRows(dir.file("keychain.db"), "SELECT wrapped FROM file_keys ORDER BY path")
        try kc.setPasscode(current: secret("one"), new: secret("two"), kdf: testKDF)
        let after = sqlRows(dir.file("keychain.db"), "SELECT wrapped FROM file_keys ORDER BY path")
        #expect(zip(before, after).filter { $0 != $1 }.count == 3, "the three rotated classes re-wrapped, None unchanged")
        try expectKeys(kc, available: Set(FileProtection.allCases))
        kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(status { try kc.unlock(passcode: secret("one")) } == .authFailed)
        try kc.unlock(passcode: secret("two"))
        try expectKeys(kc, available: Set(FileProtection.allCases))
        // Forgetting a directory.
        #expect(try kc.removeFileKey(path: "/d/complete"))
        #expect(try !kc.removeFileKey(path: "/d/complete"))
        #expect(try kc.fileKeyRecords().count == 3)
    }

    @Test func aWrappedKeyMovedToAnotherClassDoesNotOpen() throws {
        let dir = TemporaryDirectory("coffer-filekeys")
        let kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        try kc.addFileKey(path: "/d/a", protection: .complete, identifier: Self.identifier, key: secret(count: 64))
        let sealed = sqlRows(dir.file("keychain.db"), "SELECT wrapped FROM file_keys")[0]
        try unsafe kc.keybag.withClassKey(.whenUnlockedThisDeviceOnly) { k throws(SecError) in
            _ = try unsafe FileKeyCrypto.unwrap(sealed, classKey: k, Self.identifier, .complete, .whenUnlockedThisDeviceOnly)
            #expect(throws: SecError.self) { try unsafe FileKeyCrypto.unwrap(sealed, classKey: k, Self.identifier, .completeUnlessOpen, .whenUnlockedThisDeviceOnly) }
            #expect(throws: SecError.self) { try unsafe FileKeyCrypto.unwrap(sealed, classKey: k, [UInt8](repeating: 0, count: 16), .complete, .whenUnlockedThisDeviceOnly) }
        }
    }

    /// A CompleteUnlessOpen directory takes files while locked: sealed to its drop key (no class key
    /// needed), opened only after the unlock, and the drop key survives a passcode change.
    @Test func filesWrittenWhileLockedOpenOnlyAfterTheUnlock() throws {
        let dir = TemporaryDirectory("coffer-filekeys")
        var kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        try kc.setPasscode(current: nil, new: secret("one"), kdf: testKDF)
        try kc.addFileKey(path: "/d/cuo", protection: .completeUnlessOpen, identifier: Self.identifier, key: secret(count: 64))
        try kc.addFileKey(path: "/d/c", protection: .complete, identifier: [UInt8](repeating: 1, count: 16), key: secret(count: 64))
        #expect(kc.lock())
        try kc.addDrop(path: "/d/cuo", name: "note.txt", data: secret("written while locked"))
        #expect(status { try kc.addDrop(path: "/d/c", name: "x", data: secret("y")) } == .param)
        #expect(status { try kc.addDrop(path: "/d/none", name: "x", data: secret("y")) } == .itemNotFound)
        let sealed = sqlRows(dir.file("keychain.db"), "SELECT sealed FROM file_drops")
        #expect(sealed.count == 1 && !containsSubsequence(sealed[0], Array("written while locked".utf8)))
        #expect(status { try kc.openDrops() } == .interactionNotAllowed, "locked: the drop does not open")
        kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        try kc.unlock(passcode: secret("one"))
        try kc.setPasscode(current: secret("one"), new: secret("two"), kdf: testKDF)
        let drops = try kc.openDrops()
        #expect(drops.count == 1 && drops.first?.path == "/d/cuo" && drops.first?.name == "note.txt")
        #expect(text(drops.first?.data) == "written while locked")
        try kc.removeDrop(id: drops[0].id)
        #expect(try kc.openDrops().isEmpty)
        // Forgetting a directory forgets what waits for it.
        try kc.addDrop(path: "/d/cuo", name: "again", data: secret("z"))
        #expect(try kc.dropCount(path: "/d/cuo") == 1)
        try kc.removeFileKey(path: "/d/cuo")
        #expect(try kc.dropCount(path: "/d/cuo") == 0)
    }
}

/// Protected directories in backups (BackupFormat.md, version 2): each directory's record and key,
/// sealed under the device key; a backup without directories stays version 1.
@Suite struct FileKeyBackupTests {
    static let kdf = KDFParameters(opsLimit: 1, memLimit: UInt64(Argon2id.minimumMemory))

    @Test func directoriesRestoreOnTheirDeviceOnlyAndABackupWithoutThemIsVersionOne() throws {
        let dir = TemporaryDirectory("coffer-filekeys-backup")
        let kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        try kc.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s"), "acct": .string("a")], secret: secret("pw")),
                   scope: .unrestricted)
        let plain = try kc.backup(password: secret("backup pw"), kdf: Self.kdf)
        #expect(plain.bytes[4] == 1 && plain.count == 1, "no directories: version 1, as every release reads")
        var keys: [String: [UInt8]] = [:]
        for (i, p) in FileProtection.allCases.enumerated() {
            let key = secret(count: 64)
            keys["/d/\(p.cliName)"] = key.withUnsafeBytes { Array($0) }
            try kc.addFileKey(path: "/d/\(p.cliName)", protection: p, identifier: [UInt8](repeating: UInt8(i + 1), count: 16), key: key)
        }
        let (bytes, count) = try kc.backup(password: secret("backup pw"), kdf: Self.kdf)
        #expect(bytes[4] == 2 && count == 1 + FileProtection.allCases.count)
        for k in keys.values { #expect(!containsSubsequence(bytes, Array(k[0..<16])), "a directory key in the clear") }

        // The same device (its device key), a new keychain: every record and key back, in one restore.
        let same = TemporaryDirectory("coffer-filekeys-backup-same")
        writeFileBytes(same.file("device.key"), fileBytes(dir.file("device.key")))
        chmod(same.file("device.key"), 0o600)
        let restored = try Keychain(directory: same.path, lockingStateDirectory: false)
        #expect(try restored.restoreBackup(bytes, password: secret("backup pw"), dryRun: true).directories.isEmpty)
        #expect(try restored.fileKeyRecords().isEmpty, "a dry run recorded a directory")
        let r = try restored.restoreBackup(bytes, password: secret("backup pw"), dryRun: false)
        #expect(r.added == 5 && r.duplicates == 0 && r.otherDevice == 0 && r.directories.count == 4, "\(r)")
        #expect(try restored.fileKeyRecords().sorted { $0.path < $1.path } == kc.fileKeyRecords().sorted { $0.path < $1.path })
        for record in try restored.fileKeyRecords() {
            #expect(try restored.fileKey(record).withUnsafeBytes { Array($0) } == keys[record.path], "\(record.path)")
        }
        // Again: every entry is already there.
        let again = try restored.restoreBackup(bytes, password: secret("backup pw"), dryRun: false)
        #expect(again == Keychain.RestoreSummary(added: 0, duplicates: 5, otherDevice: 0))

        // Another device: the item restores, the directories are skipped and counted.
        let otherDir = TemporaryDirectory("coffer-filekeys-backup-other")
        let other = try Keychain(directory: otherDir.path, lockingStateDirectory: false)
        #expect(try other.restoreBackup(bytes, password: secret("backup pw"), dryRun: false)
                == Keychain.RestoreSummary(added: 1, duplicates: 0, otherDevice: 4))
        #expect(try other.fileKeyRecords().isEmpty)
        // The version 1 fixture still restores (BackupFixtureTests), and version 3 is refused by name.
        var future = bytes
        future[4] = 3
        #expect(status { try other.restoreBackup(future, password: secret("backup pw"), dryRun: true) } == .decode)
    }
}
