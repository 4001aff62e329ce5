import CSQLite
import CofferCrypto
import CofferKeychain
import CofferModel
import CofferTestSupport
import Foundation
import Testing

/// Rollback detection (the RollbackAnchor article) against a software TPM: the attacks
/// ``RollbackTests`` shows succeed without a TPM — an earlier row, a deleted row put back, an earlier
/// keychain.db, an older keybag — are refused at unlock with errSecDecode and a message saying what was
/// found, and the refusal changes nothing. Real SQLite files, a real swtpm reached through its TCTI.
@Suite(.enabled(if: SoftwareTPM.available, "\(SoftwareTPM.unavailableReason)"))
struct RollbackDetectionTests {
    static let passcode = "rollback pw"

    /// A keychain anchored to a fresh swtpm, in a fresh directory.
    final class Anchored {
        let dir: TemporaryDirectory
        let tpm: SoftwareTPM
        let counter: any RollbackCounter
        let interval: Double
        var keychain: Keychain!

        init(passcode: String? = RollbackDetectionTests.passcode, interval: Double = 3600,
             dir: TemporaryDirectory = TemporaryDirectory("coffer-rollback"), counter: ((String) -> any RollbackCounter)? = nil) throws {
            self.dir = dir
            tpm = try SoftwareTPM()
            self.counter = counter?(tpm.tcti) ?? TPMRollbackCounter(tcti: tpm.tcti)
            self.interval = interval
            try reopen()
            if let passcode { try keychain.setPasscode(current: nil, new: secret(passcode), kdf: testKDF) }
        }

        /// A new Keychain over the same files (an agent restart; a crash when nothing locked first).
        func reopen() throws(SecError) {
            keychain = nil
            keychain = try Keychain(directory: dir.path, rollbackCounter: counter, rollbackInterval: interval, lockingStateDirectory: false)
        }

        /// Closes the keychain (its SQLite connection) before files are put back under it.
        func close() { keychain = nil }

        func unlock(_ p: String = RollbackDetectionTests.passcode) throws(SecError) { try keychain.unlock(passcode: secret(p)) }

        func add(_ account: String, _ s: String) throws {
            try keychain.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string(account)], secret: secret(s)),
                             scope: .unrestricted)
        }

        func update(_ account: String, _ s: String) throws {
            let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string(account)])
            try keychain.update(q, ItemChanges(secret: secret(s)), scope: .unrestricted)
        }

        func password(_ account: String) throws -> String? {
            let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string(account)], returnData: true)
            return text(try keychain.copyMatching(q, scope: .unrestricted).first?.data)
        }

        /// The counter's value now.
        var value: UInt64? { try? counter.read() }
    }

    /// Copies of files of the state directory (keychain.db with its WAL, or the keybag), put back later.
    struct Saved {
        var files: [String: [UInt8]?] = [:]
        init(_ dir: TemporaryDirectory, _ names: [String]) {
            // The WAL index (-shm) is never copied: a put-back file set has none, SQLite rebuilds it.
            for n in names { files[n] = n.hasSuffix("-shm") ? nil : FileManager.default.contents(atPath: dir.file(n)).map { Array($0) } }
        }
        func putBack(_ dir: TemporaryDirectory) {
            for (n, bytes) in files {
                unlink(dir.file(n))
                if let bytes { writeFileBytes(dir.file(n), bytes) }
            }
        }
    }
    static let database = ["keychain.db", "keychain.db-wal", "keychain.db-shm"]
    static let keybag = ["keybag", "keybag.key"]

    /// The refusal: errSecDecode, the keychain still locked, and the message naming what was found.
    func expectRefused(_ f: Anchored, saying words: String, _ comment: Comment? = nil) {
        do throws(SecError) {
            try f.unlock()
            Issue.record("the unlock was not refused (\(words))")
        } catch {
            #expect(error.status == .decode, comment)
            #expect(error.message.contains("rollback detected"), "\(error.message)")
            #expect(error.message.contains(words), "\(error.message)")
            #expect(error.message.contains("restoring a backup"), "\(error.message)")
        }
        #expect(f.keychain.status.lockState != .unlocked, "a refused unlock left the keychain unlocked")
    }

    @Test func anEarlierVersionOfARowIsRefusedAndTheRefusalChangesNothing() throws {
        let f = try Anchored()
        try f.add("a", "old secret")
        f.keychain.lock()
        let before = RollbackTests.snapshot(f.dir)
        try f.unlock()
        try f.update("a", "new secret")
        f.keychain.lock()
        let current = RollbackTests.snapshot(f.dir)
        f.close()
        RollbackTests.restore(f.dir, before, id: before.rows.keys.first!)
        let tampered = (RollbackTests.dump(f.dir), Saved(f.dir, Self.keybag))
        try f.reopen()
        expectRefused(f, saying: "rows of keychain.db were replaced")
        // Nothing changed: every row, index entry and rollback record, and the keybag, as the attacker left them.
        #expect(RollbackTests.dump(f.dir) == tampered.0)
        #expect(Saved(f.dir, Self.keybag).files == tampered.1.files)
        // Putting the right row back (the recovery) unlocks, with the latest secret.
        f.close()
        RollbackTests.restore(f.dir, current, id: current.rows.keys.first!)
        try f.reopen()
        try f.unlock()
        #expect(try f.password("a") == "new secret")
    }

    /// The rows are scanned at the first unlock of each process (a scan costs a few µs per item);
    /// later unlocks check the records and the counter. A row swapped under a running keychain is
    /// therefore found at the next start, as the RollbackAnchor article states.
    @Test func aRowSwappedUnderARunningKeychainIsFoundAtTheNextStart() throws {
        let f = try Anchored()
        try f.add("a", "old secret")
        f.keychain.lock()
        let before = RollbackTests.snapshot(f.dir)
        try f.unlock()
        try f.update("a", "new secret")
        f.keychain.lock()
        RollbackTests.restore(f.dir, before, id: before.rows.keys.first!)   // the keychain is still open
        try f.unlock()                                                      // records and counter only
        f.close()
        try f.reopen()
        expectRefused(f, saying: "rows of keychain.db were replaced")
    }

    @Test func aDeletedRowPutBackIsRefused() throws {
        let f = try Anchored()
        try f.add("keep", "kept")
        try f.add("gone", "deleted secret")
        f.keychain.lock()
        let before = RollbackTests.snapshot(f.dir)
        try f.unlock()
        try f.keychain.delete(ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("gone")]), scope: .unrestricted)
        f.keychain.lock()
        f.close()
        let id = before.rows.keys.sorted().last!
        RollbackTests.restore(f.dir, before, id: id)
        try f.reopen()
        expectRefused(f, saying: "rows of keychain.db were replaced")
    }

    @Test func anEarlierKeychainDatabaseIsRefusedPastTheWindow() throws {
        let f = try Anchored()
        try f.add("a", "first")
        f.keychain.lock()               // anchored
        let old = Saved(f.dir, Self.database)
        try f.unlock()
        try f.update("a", "second")
        try f.add("b", "later")
        f.keychain.lock()               // anchored again: the copy is now older than the counter
        f.close()
        old.putBack(f.dir)
        try f.reopen()
        expectRefused(f, saying: "keychain.db was put back from an earlier copy")
    }

    /// A rekey re-seals the records, so it checks them first: a passcode change (or an escrow revoke,
    /// which the agent does as one) on a keychain.db put back is refused, not turned into a current anchor.
    @Test func aPasscodeChangeDoesNotBlessAnEarlierKeychainDatabase() throws {
        let f = try Anchored()
        try f.add("a", "first")
        f.keychain.lock()
        let old = Saved(f.dir, Self.database)
        try f.unlock()
        try f.update("a", "second")
        f.keychain.lock()
        f.close()
        old.putBack(f.dir)
        try f.reopen()
        do throws(SecError) {
            try f.keychain.setPasscode(current: secret(Self.passcode), new: secret("another"), kdf: testKDF)
            Issue.record("the passcode change re-anchored an earlier keychain.db")
        } catch {
            #expect(error.message.contains("keychain.db was put back from an earlier copy"), "\(error.message)")
        }
        try f.reopen()
        expectRefused(f, saying: "keychain.db was put back from an earlier copy", "the passcode is unchanged, the refusal too")
    }

    /// The stated window: writes since the last anchoring (at most `rollback-interval` seconds, or until
    /// the next lock) can be undone by an earlier copy taken inside it; this pins that limit.
    @Test func withinTheWindowAnEarlierCopyGoesUnseen() throws {
        let f = try Anchored(interval: 3600)
        try f.add("a", "first")
        f.keychain.lock()
        try f.unlock()
        let old = Saved(f.dir, Self.database)
        try f.add("b", "not yet anchored")
        f.close()                       // the agent stopped without a lock (a crash): nothing anchored "b"
        old.putBack(f.dir)
        try f.reopen()
        try f.unlock()
        #expect(try f.password("a") == "first")
        #expect(status { try f.password("b") } == .itemNotFound, "the copy inside the window is accepted, as ThreatModel.md states")
    }

    @Test func anOlderKeybagAfterAPasscodeChangeIsRefused() throws {
        let f = try Anchored()
        try f.add("a", "secret")
        let oldKeybag = Saved(f.dir, Self.keybag)
        f.keychain.lock()
        let oldBoth = Saved(f.dir, Self.keybag + Self.database)
        try f.keychain.setPasscode(current: secret(Self.passcode), new: secret("new passcode"), kdf: testKDF)
        f.keychain.lock()
        f.close()
        // The keybag alone put back: the old passcode opens it, the anchor refuses it.
        oldKeybag.putBack(f.dir)
        try f.reopen()
        expectRefused(f, saying: "an older keybag was put back")
        // Keybag and database put back together: consistent with each other, older than the counter.
        f.close()
        oldBoth.putBack(f.dir)
        try f.reopen()
        expectRefused(f, saying: "keychain.db was put back from an earlier copy")
    }

    /// An escrow revoke (the agent deletes the record and rotates the keys: a passcode change to the same
    /// passcode) then the old keybag and the old escrow record put back: the escrow unlock, which the
    /// stale-generation check would let through with the old keybag, is refused by the anchor.
    @Test func anOlderKeybagAndEscrowRecordAfterAnEscrowRevokeAreRefused() throws {
        let f = try Anchored()
        try f.add("a", "secret")
        let escrowSecret = try f.keychain.createEscrow()
        f.keychain.lock()
        let old = Saved(f.dir, Self.keybag + [Keychain.escrowFileName])
        try f.keychain.setPasscode(current: secret(Self.passcode), new: secret(Self.passcode), kdf: testKDF)
        f.keychain.deleteEscrow()
        f.keychain.lock()
        f.close()
        old.putBack(f.dir)
        try f.reopen()
        do throws(SecError) {
            try f.keychain.unlock(escrowSecret: escrowSecret)
            Issue.record("the revoked escrow record unlocked an older keybag")
        } catch {
            #expect(error.status == .decode && error.message.contains("an older keybag was put back"), "\(error.message)")
        }
        #expect(f.keychain.status.lockState != .unlocked)
    }

    @Test func anOlderKeybagAfterThePasscodeIsRemovedIsRefused() throws {
        let f = try Anchored()
        try f.add("a", "secret")
        f.keychain.lock()
        let oldKeybag = Saved(f.dir, Self.keybag)
        try f.unlock()
        try f.keychain.removePasscode(current: secret(Self.passcode))
        try f.reopen()
        #expect(try f.password("a") == "secret")
        f.close()
        oldKeybag.putBack(f.dir)
        try f.reopen()
        expectRefused(f, saying: "an older keybag was put back")
    }

    @Test func theRecordsDeletedOrEditedAreRefused() throws {
        let f = try Anchored()
        try f.add("a", "secret")
        f.keychain.lock()
        let good = Saved(f.dir, Self.database)
        for (sql, words) in [("DELETE FROM rollback", "no rollback records"),
                             ("UPDATE rollback SET n = n + 1 WHERE bucket = 16", "rollback records were edited"),
                             ("UPDATE rollback SET epoch = epoch + 5 WHERE bucket = 16", "rollback records were edited"),
                             ("DELETE FROM rollback WHERE bucket = 17", "rollback records were edited"),
                             ("UPDATE rollback SET root = zeroblob(32) WHERE bucket = 17", "or that record was edited")] {
            f.close()
            good.putBack(f.dir)
            CheckTests.damage(f.dir.file("keychain.db"), sql)
            try f.reopen()
            expectRefused(f, saying: words, "\(sql)")
        }
        f.close()
        good.putBack(f.dir)
        try f.reopen()
        try f.unlock()
        #expect(try f.password("a") == "secret")
    }

    @Test func aClearedOrForeignTPMIsRefused() throws {
        let f = try Anchored()
        try f.add("a", "secret")
        f.keychain.lock()
        // Another TPM (the state directory copied to another machine, or this one cleared): no counter.
        let other = try SoftwareTPM()
        f.keychain = try Keychain(directory: f.dir.path, rollbackCounter: TPMRollbackCounter(tcti: other.tcti), lockingStateDirectory: false)
        expectRefused(f, saying: "the rollback counter is gone")
    }

    /// A counter whose next increment fails once, as if the process died between the records'
    /// commit (sealed at value + 1) and TPM2_NV_Increment.
    final class FailingOnce: RollbackCounter, @unchecked Sendable {
        let real: TPMRollbackCounter
        var failNext = false, failCreate = false
        init(_ tcti: String) { real = TPMRollbackCounter(tcti: tcti) }
        var name: String { real.name }
        func read() throws(SecError) -> UInt64? { try real.read() }
        func create() throws(SecError) -> UInt64 {
            if failCreate { failCreate = false; throw SecError(.notAvailable, "the TPM went away") }
            return try real.create()
        }
        func increment() throws(SecError) -> UInt64 {
            if failNext { failNext = false; throw SecError(.notAvailable, "the TPM went away") }
            return try real.increment()
        }
    }

    @Test func anInterruptedAnchoringIsNoFalseAlarmAndLosesNothing() throws {
        let f = try Anchored(counter: { FailingOnce($0) })
        let counter = f.counter as! FailingOnce
        try f.add("a", "written before the crash")
        let before = f.value!
        counter.failNext = true
        f.keychain.lock()               // the records commit at before + 1; the increment "crashes"
        #expect(f.value == before)
        try f.reopen()
        try f.unlock()                  // no false alarm: the unlock finishes the increment
        #expect(f.value == before + 1)
        #expect(try f.password("a") == "written before the crash")
    }

    /// Anchoring cut after its first step (the records written at epoch 0, the counter not yet made,
    /// or made and not yet incremented): the next open finishes it, and detection holds from then on.
    @Test func anInterruptedFirstAnchoringIsFinishedAtTheNextOpen() throws {
        let dir = TemporaryDirectory("coffer-rollback")
        let tpm = try SoftwareTPM()
        let counter = FailingOnce(tpm.tcti)
        do {
            let plain = try Keychain(directory: dir.path, lockingStateDirectory: false)
            try plain.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string("a")], secret: secret("kept")),
                          scope: .unrestricted)
        }
        counter.failCreate = true
        #expect(throws: SecError.self) { try Keychain(directory: dir.path, rollbackCounter: counter, lockingStateDirectory: false) }
        #expect(RollbackTests.sqlCount(dir, "SELECT count(*) FROM rollback WHERE epoch = 0") == 2, "the first step's records")
        counter.failNext = true
        #expect(throws: SecError.self) { try Keychain(directory: dir.path, rollbackCounter: counter, lockingStateDirectory: false) }
        // Records sealed at value + 1, the increment lost: this open counts it (no false alarm).
        let kc = try Keychain(directory: dir.path, rollbackCounter: counter, lockingStateDirectory: false)
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("a")], returnData: true)
        #expect(text(try kc.copyMatching(q, scope: .unrestricted).first?.data) == "kept")
        #expect(RollbackTests.sqlCount(dir, "SELECT count(*) FROM rollback WHERE epoch = 0") == 0)
        #expect(RollbackTests.sqlCount(dir, "SELECT min(epoch) FROM rollback") == Int64(try counter.read() ?? 0))
    }

    @Test func itemWritesAreAnchoredAtMostEveryIntervalAndAtLock() throws {
        let f = try Anchored(interval: 3600)
        let start = f.value!
        for i in 0..<5 { try f.add("item\(i)", "s\(i)") }
        #expect(f.value == start, "no NV write per item change")
        f.keychain.lock()
        #expect(f.value == start + 1, "the lock anchors the writes")
        f.keychain.lock()
        #expect(f.value == start + 1, "nothing to anchor: no NV write")
    }

    /// Today's format (store schema 3 → 5, written by the real agent: Fixtures/schema3) gets its
    /// anchor when detection is first on (here at open: no passcode, every key is in memory; with a
    /// passcode at the first unlock, as the other tests' keychains show), and is
    /// protected from then on.
    @Test func anExistingKeychainIsAnchoredWhenDetectionIsTurnedOn() throws {
        let dir = try Fixtures.copy("schema3")
        #expect(RollbackTests.sqlCount(dir, "SELECT count(*) FROM sqlite_master WHERE name = 'rollback'") == 0)
        let f = try Anchored(passcode: nil, dir: dir)
        #expect(f.keychain.migrationReport.contains { $0.hasPrefix("rollback detection: keychain anchored") }, "\(f.keychain.migrationReport)")
        #expect(RollbackTests.sqlCount(dir, "SELECT count(*) FROM rollback") == 2)
        #expect(try f.keychain.count() == 5)
        let before = RollbackTests.snapshot(dir)
        let first = before.rows.keys.sorted().first!
        try f.keychain.delete(ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("alice")]), scope: .unrestricted)
        f.keychain.lock()
        f.close()
        RollbackTests.restore(dir, before, id: first)
        do throws(SecError) {
            try f.reopen()
            Issue.record("a deleted row put back opened")
        } catch {
            #expect(error.status == .decode && error.message.contains("rows of keychain.db were replaced"), "\(error.message)")
        }
    }

    @Test func anErasedKeychainIsAnchoredAfresh() throws {
        let f = try Anchored()
        try f.add("a", "secret")
        f.keychain.eraseEverything()
        try f.reopen()
        try f.add("b", "new")
        #expect(try f.password("b") == "new")
        f.keychain.lock()
        try f.reopen()
        #expect(try f.password("b") == "new")
    }
}
