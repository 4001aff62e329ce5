import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferTestSupport
import CofferSystem
import Foundation
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
        let other = try Keychain(directory: f.dir.path, lockingStateDirectory: false)
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
                                  ItemChanges(attributes: ["labl": .string("x")]), scope: .unrestricted)
        }
        expectRefused("delete") {
            try f.keychain.delete(ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("kept")]), scope: .unrestricted)
        }
        expectRefused("passcode change") { try f.keychain.setPasscode(current: secret("old"), new: secret("x"), kdf: testKDF) }
        // Nothing was lost: the other keychain (the current keys) still reads the item, alone.
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("s")], limit: .all, returnAttributes: true)
        #expect(try other.copyMatching(q, scope: .unrestricted).count == 1)
    }

    /// A library caller opening the state directory takes its lock without asking (the default): it
    /// cannot open a running agent's keychain by accident.
    @Test func theDefaultKeychainTakesTheLock() throws {
        let dir = TemporaryDirectory("coffer-lockdefault")
        let first = try Keychain(directory: dir.path)
        do {
            _ = try Keychain(directory: dir.path)
            Issue.record("a second default keychain opened beside the first")
        } catch {
            #expect(error.status == .notAvailable, "\(error)")
        }
        withExtendedLifetime(first) {}
    }

    /// `chmod`, `chown` or a hard link change the keybag files' status but no byte: writes go on (the
    /// contents are compared). Before: every write was refused until a restart.
    @Test func aStatusOnlyChangeOfTheKeybagFilesRefusesNothing() throws {
        let f = try Fixture(passcode: "old")
        try f.addPassword(service: "s", account: "one", secret: "1")
        for name in ["keybag", "keybag.key"] {
            let path = f.dir.file(name)
            #expect(chmod(path, 0o400) == 0 && chmod(path, 0o600) == 0)
            #expect(link(path, path + ".hardlink") == 0)
            #expect(unlink(path + ".hardlink") == 0)
        }
        #expect(!f.keychain.keybagFilesChanged)
        try f.addPassword(service: "s", account: "two", secret: "2")
        #expect(try f.password(service: "s", account: "two") == "2")
    }

    /// Asking who holds the lock takes none: an agent starting at that moment is never refused. Before,
    /// `currentHolder` took LOCK_EX for an instant, and a starting agent could lose that race.
    @Test func askingWhoHoldsTheLockNeverRefusesATaker() throws {
        let dir = TemporaryDirectory("coffer-lockprobe")
        let stop = Protected(false)
        let prober = Thread { while !stop.withLock({ $0 }) { _ = StateDirectoryLock.currentHolder(of: dir.path) } }
        prober.start()
        defer { stop.withLock { $0 = true } }
        var refused = 0
        for _ in 0..<2_000 {
            do {
                let lock = try StateDirectoryLock.acquire(directory: dir.path, socket: nil)
                #expect(StateDirectoryLock.currentHolder(of: dir.path)?.pid == getpid())
                withExtendedLifetime(lock) {}
            } catch {
                refused += 1
            }
        }
        #expect(refused == 0)
        #expect(StateDirectoryLock.currentHolder(of: dir.path) == nil)
    }
}
