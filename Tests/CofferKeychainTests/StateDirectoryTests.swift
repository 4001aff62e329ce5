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
        // Released with the keychain that held it: the kernel frees the lock when the last descriptor
        // of its open file goes, and a child another test thread is spawning holds a copy of every
        // descriptor until its exec closes it (O_CLOEXEC), so on a loaded machine the release may
        // take a moment to be seen (a CI run under ASan saw it). A lock that stays held fails here.
        func takesTheLock() throws -> Bool {
            do {
                _ = try Keychain(directory: f.dir.path, lockingStateDirectory: true)
                return true
            } catch {
                guard error.status == .notAvailable else { throw error }
                return false
            }
        }
        let deadline = nowMillis() + 10_000
        while try !takesTheLock() {
            guard nowMillis() < deadline else {
                _ = try Keychain(directory: f.dir.path, lockingStateDirectory: true)   // fails, with the holder's name
                return
            }
            usleep(20_000)
        }
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
    /// `currentHolder` took LOCK_EX for an instant, and a starting agent could lose that race. The
    /// takers are `flock -n` processes (another process, as an agent would be; in this process a
    /// concurrent test's fork could hold a copy of a released lock for a moment).
    @Test(.enabled(if: access("/usr/bin/flock", X_OK) == 0, "needs util-linux's flock(1)"))
    func askingWhoHoldsTheLockNeverRefusesATaker() throws {
        let dir = TemporaryDirectory("coffer-lockprobe")
        _ = try StateDirectoryLock.acquire(directory: dir.path, socket: nil)   // creates the file; released at once
        let stop = Protected(false), probes = Protected(0)
        let prober = Thread {
            while !stop.withLock({ $0 }) {
                _ = StateDirectoryLock.currentHolder(of: dir.path)
                probes.withLock { $0 += 1 }
            }
        }
        prober.start()
        defer { stop.withLock { $0 = true } }
        let takers = Process()
        takers.executableURL = URL(fileURLWithPath: "/bin/sh")
        takers.arguments = ["-c", "i=0; n=0; while [ $i -lt 1000 ]; do /usr/bin/flock -n -x \"$1\" true || n=$((n+1)); i=$((i+1)); done; echo $n",
                            "sh", dir.path + "/" + StateDirectoryLock.fileName]
        let out = Pipe()
        takers.standardOutput = out
        try takers.run()
        let refused = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        takers.waitUntilExit()
        #expect(takers.terminationStatus == 0)
        #expect(refused.trimmingCharacters(in: .whitespacesAndNewlines) == "0", "takers refused while only probes ran")
        #expect(probes.withLock { $0 } > 0)
        #expect(StateDirectoryLock.currentHolder(of: dir.path) == nil)
    }

    /// A holder on its way out (here: the record names a process that is gone, the lock held a moment
    /// longer by flock(1), as a killed agent holds it until the kernel closes its files) makes a start
    /// wait for the release instead of refusing; a live holder is refused at once.
    @Test(.enabled(if: access("/usr/bin/flock", X_OK) == 0, "needs util-linux's flock(1)"))
    func aStartWaitsForAnExitingHolderAndRefusesALiveOne() throws {
        let dir = TemporaryDirectory("coffer-lockexit")
        let file = dir.path + "/" + StateDirectoryLock.fileName
        func hold(recording pid: Int32, for seconds: String) throws -> Process {
            try "coffer-lock 1\npid \(pid)\n".write(toFile: file, atomically: false, encoding: .utf8)
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/usr/bin/flock")
            p.arguments = ["-x", file, "sleep", seconds]
            try p.run()
            let deadline = Date().addingTimeInterval(30)
            while StateDirectoryLock.currentHolder(of: dir.path) == nil && Date() < deadline { usleep(10_000) }
            return p
        }
        // Gone: pid_max is at most 2^22, so this pid never exists.
        let exiting = try hold(recording: Int32(1 << 23), for: "0.5")
        let started = Date()
        do {
            _ = try StateDirectoryLock.acquire(directory: dir.path, socket: nil)
        } catch {
            Issue.record("refused while the holder was exiting: \(error)")
        }
        #expect(Date().timeIntervalSince(started) >= 0.2, "taken while flock(1) still held it")
        exiting.waitUntilExit()

        // Live (this process): refused at once; had it been waited for, the lock would be taken once
        // flock(1) lets go after 3 s, inside the 5 s of patience, and nothing would be thrown.
        let live = try hold(recording: getpid(), for: "3")
        defer { live.waitUntilExit() }
        #expect(throws: StateDirectoryLock.Failure.self) { _ = try StateDirectoryLock.acquire(directory: dir.path, socket: nil) }
    }
}
