import CofferCrypto
import CofferKeychain
import CofferModel
import CofferTestSupport
import Foundation
import Testing

/// The keychain's side of sync (SyncFormat.md, "The keychain's side"): which items sync, item keys and
/// payloads with their vectors, a pull applied with its state in one transaction, and local changes
/// noted in the transaction that makes them so a crash cannot lose them.
@Suite struct SyncKeychainTests {
    static let base: Attributes = ["svce": .string("mail"), "acct": .string("alice"), "agrp": .string("unsigned"),
                                   "sync": .bool(true), "pdmn": .string("ak")]

    @Test func applesRulesSayWhichItemsSync() {
        #expect(SyncItem.isSyncable(.genericPassword, Self.base))
        #expect(SyncItem.isSyncable(.genericPassword, Self.base.merging(["pdmn": .string("dk")]) { $1 }))
        #expect(!SyncItem.isSyncable(.genericPassword, Self.base.merging(["sync": .bool(false)]) { $1 }))
        #expect(!SyncItem.isSyncable(.genericPassword, Self.base.filter { $0.key != "sync" }))
        for thisDeviceOnly in ["aku", "cku", "dku", "akpu"] {
            #expect(!SyncItem.isSyncable(.genericPassword, Self.base.merging(["pdmn": .string(thisDeviceOnly)]) { $1 }), "\(thisDeviceOnly)")
        }
        #expect(!SyncItem.isSyncable(.genericPassword, Self.base.merging([AccessControl.attributeName: .data([1])]) { $1 }))
        let key: Attributes = ["kcls": .integer(1), "extr": .bool(false), "sync": .bool(true), "pdmn": .string("ak"), "agrp": .string("g")]
        #expect(!SyncItem.isSyncable(.key, key))
    }

    /// The vectors in SyncFormat.md.
    @Test func itemKeyAndPayloadVectors() throws {
        let attrs = Self.base.merging(["labl": .string("Mail")]) { $1 }
        let key = SyncItem.itemKey(.genericPassword, attrs)
        #expect(Hex.encode(key) == Self.itemKeyVector)
        // Attributes outside the primary key, and `sync`, are not in the key: an edit keeps the key.
        #expect(SyncItem.itemKey(.genericPassword, attrs.merging(["labl": .string("other"), "desc": .string("d")]) { $1 }) == key)
        #expect(SyncItem.itemKey(.genericPassword, attrs.merging(["agrp": .string("other")]) { $1 }) != key)
        let (cls, pk) = try SyncItem.decodeItemKey(key)
        #expect(cls == .genericPassword && pk == ["svce": .string("mail"), "acct": .string("alice"), "agrp": .string("unsigned"), "sync": .bool(true)])
        let payload = Array("pw".utf8).withUnsafeBytes { SyncItem.payload(.genericPassword, attrs, secret: $0) }
        #expect(payload.withUnsafeBytes { Hex.encode(Array($0)) } == Self.payloadVector)
        let (c2, a2, s2) = try SyncItem.decodePayload(payload)
        #expect(c2 == .genericPassword && a2 == attrs && text(s2) == "pw")
    }

    /// SyncFormat.md's `keychain-vector` block.
    static var vector: [String: String] {
        specVectorBlocks("Sources/CofferSync/CofferSync.docc/SyncFormat.md", fence: "keychain-vector").first ?? [:]
    }
    static var itemKeyVector: String? { vector["item-key"] }
    static var payloadVector: String? { vector["payload"] }

    @Test func malformedAndNeverSyncingPayloadsAreRefused() {
        func payload(_ a: Attributes) -> SecureBytes { Array("pw".utf8).withUnsafeBytes { SyncItem.payload(.genericPassword, a, secret: $0) } }
        #expect(status { _ = try SyncItem.decodePayload(payload(Self.base.merging(["pdmn": .string("aku")]) { $1 })) } == .decode)
        #expect(status { _ = try SyncItem.decodePayload(payload(Self.base.merging(["srvr": .string("h")]) { $1 })) } == .decode)
        let good = payload(Self.base)
        let cut = good.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[0..<8])) }
        #expect(status { _ = try SyncItem.decodePayload(cut) } == .decode)
        #expect(status { _ = try SyncItem.decodeItemKey([2] + Array(SyncItem.itemKey(.genericPassword, Self.base).dropFirst())) } == .decode)
    }

    /// A syncable item's add, update and delete are noted with it (and survive a restart before they are
    /// recorded); items that never sync are not; turning `sync` off is a deletion for the others.
    @Test func localChangesAreNotedWithTheirItemAndSurviveARestart() throws {
        let f = try Fixture()
        try f.keychain.commitSyncRecorded(through: 0, state: [7])   // sync set up
        try f.addPassword(service: "mail", account: "alice", secret: "pw1", ["sync": .bool(true)])
        try f.addPassword(service: "local", account: "bob", secret: "x", ["sync": .bool(true), "pdmn": .string("aku")])
        try f.addPassword(service: "plain", account: "carol", secret: "x")
        try f.reboot()   // a crash before the records were written
        var pending = try f.keychain.pendingSyncChanges()
        #expect(pending.changes.count == 1)
        // Added without a group in the unrestricted scope: the default group.
        let key = SyncItem.itemKey(.genericPassword, Self.base.merging(["agrp": .string("coffer.default")]) { $1 })
        #expect(pending.changes.first?.itemKey == key)
        guard let payload = pending.changes.first?.payload else { Issue.record("no payload"); return }
        let (_, attrs, secret) = try SyncItem.decodePayload(payload)
        #expect(attrs["svce"] == .string("mail") && text(secret) == "pw1")
        try f.keychain.commitSyncRecorded(through: pending.through, state: [8])
        #expect(try f.keychain.pendingSyncChanges().changes.isEmpty)
        #expect(text(try f.keychain.syncState()) == "\u{8}")
        // Turning sync off: the others delete their copy.
        #expect(try f.keychain.update(ItemQuery(attributes: ["svce": .string("mail")]), ItemChanges(attributes: ["sync": .bool(false)]), scope: .unrestricted) == 1)
        pending = try f.keychain.pendingSyncChanges()
        #expect(pending.changes.count == 1 && pending.changes.first?.itemKey == key && pending.changes.first?.payload == nil)
        // And on again, then deleted: the latest state of the item is what is recorded.
        #expect(try f.keychain.update(ItemQuery(attributes: ["svce": .string("mail")]), ItemChanges(attributes: ["sync": .bool(true)]), scope: .unrestricted) == 1)
        pending = try f.keychain.pendingSyncChanges()
        #expect(pending.changes.count == 1 && pending.changes.first?.payload != nil)
        #expect(try f.keychain.delete(ItemQuery(attributes: ["svce": .string("mail")]), scope: .unrestricted) == 1)
        pending = try f.keychain.pendingSyncChanges()
        #expect(pending.changes.count == 1 && pending.changes.first?.payload == nil)
    }

    /// Without sync set up (no state stored) nothing is noted: the first recording takes every item.
    @Test func nothingIsNotedBeforeSyncIsSetUp() throws {
        let f = try Fixture()
        try f.addPassword(service: "mail", account: "alice", secret: "pw1", ["sync": .bool(true)])
        #expect(try f.keychain.pendingSyncChanges().changes.isEmpty)
        #expect(try f.keychain.syncState() == nil)
    }

    /// A pull's puts and deletes land on another keychain with the state; the applied items are not noted as local changes.
    @Test func aPullAppliesPutsAndDeletesWithItsState() throws {
        let a = try Fixture(), b = try Fixture()
        try a.keychain.commitSyncRecorded(through: 0, state: [1])
        try b.keychain.commitSyncRecorded(through: 0, state: [1])
        try a.addPassword(service: "mail", account: "alice", secret: "pw1", ["sync": .bool(true)])
        var pending = try a.keychain.pendingSyncChanges()
        #expect(try b.keychain.applySync(pending.changes, state: [2]).applied == 1)
        #expect(try b.password(service: "mail", account: "alice") == "pw1")
        #expect(text(try b.keychain.syncState()) == "\u{2}")
        #expect(try b.keychain.pendingSyncChanges().changes.isEmpty)
        try a.keychain.commitSyncRecorded(through: pending.through, state: [2])
        // An edit replaces it in place; a delete removes it.
        #expect(try a.keychain.update(ItemQuery(attributes: ["svce": .string("mail")]), ItemChanges(secret: secret("pw2")), scope: .unrestricted) == 1)
        pending = try a.keychain.pendingSyncChanges()
        try b.keychain.applySync(pending.changes, state: [3])
        #expect(try b.password(service: "mail", account: "alice") == "pw2")
        #expect(try b.keychain.count() == 1)
        try a.keychain.commitSyncRecorded(through: pending.through, state: [3])
        #expect(try a.keychain.delete(ItemQuery(attributes: ["svce": .string("mail")]), scope: .unrestricted) == 1)
        try b.keychain.applySync(try a.keychain.pendingSyncChanges().changes, state: [4])
        #expect(status { try b.password(service: "mail", account: "alice") } == .itemNotFound)
        #expect(try b.keychain.count() == 0)
    }

    /// A payload under another item's key (a replayed record) and one of an item that never syncs are
    /// refused; nothing of theirs lands, the rest and the state do.
    @Test func replayedAndNeverSyncingChangesAreRefused() throws {
        let b = try Fixture()
        let other = SyncItem.itemKey(.genericPassword, Self.base.merging(["acct": .string("mallory")]) { $1 })
        let payload = Array("pw".utf8).withUnsafeBytes { SyncItem.payload(.genericPassword, Self.base, secret: $0) }
        let local = Array("pw".utf8).withUnsafeBytes {
            SyncItem.payload(.genericPassword, Self.base.merging(["pdmn": .string("aku")]) { $1 }, secret: $0)
        }
        let r = try b.keychain.applySync([(other, payload), (SyncItem.itemKey(.genericPassword, Self.base), local)], state: [5])
        #expect(r.applied == 0 && r.refused.count == 2)
        #expect(try b.keychain.count() == 0)
        #expect(text(try b.keychain.syncState()) == "\u{5}")
    }

    /// The changes and the state commit together: a failure after the first change was written (here
    /// the state cannot be sealed: the keybag is locked) leaves neither, not half of them.
    @Test func aPullIsAppliedWholeOrNotAtAll() throws {
        let b = try Fixture(passcode: "pw")
        try b.keychain.commitSyncRecorded(through: 0, state: [1])
        let always = Self.base.merging(["pdmn": .string("dk")]) { $1 }
        let payload = Array("pw".utf8).withUnsafeBytes { SyncItem.payload(.genericPassword, always, secret: $0) }
        #expect(b.keychain.lock())
        #expect(status { try b.keychain.applySync([(SyncItem.itemKey(.genericPassword, always), payload)], state: [2]) } == .interactionNotAllowed)
        try b.keychain.unlock(passcode: secret("pw"))
        #expect(try b.keychain.count() == 0)
        #expect(text(try b.keychain.syncState()) == "\u{1}")
    }

    /// This device's sync secret keys are kept sealed (their bytes appear nowhere in the database),
    /// survive a restart, stay readable while the keybag is locked after the first unlock
    /// (AfterFirstUnlockThisDeviceOnly), and are unreadable before it.
    @Test func deviceKeysAreKeptSealedInTheStore() throws {
        let f = try Fixture(passcode: "pw")
        #expect(try f.keychain.syncDeviceSecret() == nil)
        let raw = (0..<64).map { UInt8(0xA0 &+ $0) }
        try f.keychain.setSyncDeviceSecret(raw.withUnsafeBytes { SecureBytes(copying: $0) })
        func read() throws -> [UInt8]? { try f.keychain.syncDeviceSecret()?.withUnsafeBytes { Array($0) } }
        #expect(try read() == raw)
        f.keychain.checkpoint()
        let db = fileBytes(f.dir.file("keychain.db")) + fileBytes(f.dir.file("keychain.db-wal"))
        #expect(db.count > 64 && !(0...(db.count - 64)).contains { Array(db[$0..<$0 + 64]) == raw })
        #expect(f.keychain.lock())
        #expect(try read() == raw)
        try f.reboot()
        #expect(status { try read() } == .interactionNotAllowed)
        try f.keychain.unlock(passcode: secret("pw"))
        #expect(try read() == raw)
        #expect(f.keychain.syncDirectory == f.dir.path + "/sync")
    }

    /// A passcode change rotates the class keys: the sync state, the device keys and the pending notes
    /// are re-sealed with the items, and read back afterwards.
    @Test func aPasscodeChangeKeepsTheSyncBookkeeping() throws {
        let f = try Fixture(passcode: "pw")
        let raw = (0..<64).map { UInt8($0) }
        try f.keychain.startSync(deviceSecret: raw.withUnsafeBytes { SecureBytes(copying: $0) }, state: [1])
        try f.addPassword(service: "mail", account: "alice", secret: "pw1", ["sync": .bool(true)])
        try f.keychain.setPasscode(current: secret("pw"), new: secret("pw2"), kdf: testKDF)
        try f.reboot()
        try f.keychain.unlock(passcode: secret("pw2"))
        #expect(try f.keychain.syncDeviceSecret()?.withUnsafeBytes { Array($0) } == raw)
        #expect(text(try f.keychain.syncState()) == "\u{1}")
        let pending = try f.keychain.pendingSyncChanges()
        #expect(pending.changes.count == 1 && pending.changes.first?.payload != nil)
    }
}
