import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferTestSupport
import Glibc
import Testing

/// The state directory belongs to one process at a time (issue 23): programs other than the agent
/// take its lock through the keychain, and a keychain whose keybag was rewritten under it refuses
/// to write.
@Suite struct StateDirectoryTests {
    @Test func aLockingKeychainIsRefusedWhileAnotherHoldsTheLock() throws {
        let f = try Fixture()
        do {
            let first = try Keychain(directory: f.dir.path, lockingStateDirectory: true)
            do {
                _ = try Keychain(directory: f.dir.path, lockingStateDirectory: true)
                Issue.record("two keychains held the state directory's lock")
            } catch {
                #expect(error.status == .notAvailable && error.message.contains("another Coffer program already uses this state directory (pid \(getpid())"),
                        "\(error)")
            }
            withExtendedLifetime(first) {}
        }
        // Released with the keychain that held it.
        _ = try Keychain(directory: f.dir.path, lockingStateDirectory: true)
    }

    @Test func aKeybagRotatedElsewhereRefusesEveryWrite() throws {
        let f = try Fixture(passcode: "old")
        try f.addPassword(service: "s", account: "kept", secret: "one")
        #expect(!f.keychain.keybagFilesChanged)
        // Another process (ignoring the lock) changes the passcode: the keys rotate, the rows are re-sealed.
        let other = try Keychain(directory: f.dir.path)
        try other.unlock(passcode: secret("old"))
        try other.setPasscode(current: secret("old"), new: secret("new"), kdf: testKDF)
        #expect(f.keychain.keybagFilesChanged)

        func expectRefused(_ what: String, _ body: () throws -> Void) {
            do {
                try body()
                Issue.record("\(what) was written under stale keys")
            } catch let error as SecError {
                #expect(error.status == .notAvailable && error.message.contains("changed under this agent"), "\(what): \(error)")
            } catch {
                Issue.record("\(what): \(error)")
            }
        }
        expectRefused("add") { try f.addPassword(service: "s", account: "lost", secret: "two") }
        expectRefused("update") {
            try f.keychain.update(ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("kept")]),
                                  ItemChanges(attributes: ["labl": .string("x")]))
        }
        expectRefused("delete") {
            try f.keychain.delete(ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("kept")]))
        }
        expectRefused("passcode change") { try f.keychain.setPasscode(current: secret("old"), new: secret("x"), kdf: testKDF) }
        // Nothing was lost: the other keychain (the current keys) still reads the item, alone.
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("s")], limit: .all, returnAttributes: true)
        #expect(try other.copyMatching(q).count == 1)
    }
}
