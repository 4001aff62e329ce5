import CofferCrypto
import CofferKeychain
import CofferModel
import CofferService
import CofferSync
import CofferTestSupport
import Foundation
import Testing

/// Three keychains, each in its own state directory, syncing through a local bare git repository with
/// the real `git` (KeychainSync over the keychain's side and the CofferSync engine).
@Suite(.serialized) struct KeychainSyncTests {
    let tmp = TemporaryDirectory("coffer-ksync")

    func bareRemote() throws -> String {
        let remote = tmp.file("remote.git")
        let r = runProcess("/usr/bin/git", ["init", "-q", "--bare", remote])
        try #require(r.status == 0, "git init --bare: \(r)")
        return remote
    }

    func keychain(_ name: String) throws -> Keychain {
        try FileManager.default.createDirectory(atPath: tmp.file(name), withIntermediateDirectories: true)
        return try Keychain(directory: tmp.file(name), lockingStateDirectory: false)
    }

    static func add(_ kc: Keychain, _ account: String, _ pw: String, _ extra: Attributes = ["sync": .bool(true)]) throws {
        var attrs: Attributes = ["svce": .string("mail"), "acct": .string(account), "agrp": .string("unsigned")]
        attrs.merge(extra) { $1 }
        try kc.add(NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret(pw)), scope: .unrestricted)
    }

    static func password(_ kc: Keychain, _ account: String) -> String? {
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string(account), "sync": .bool(true)], returnData: true)
        return (try? kc.copyMatching(q, scope: .unrestricted)).flatMap { text($0.first?.data) }
    }

    /// `approver` approves `code` (SyncFormat.md, "Pairing") while `joiner` syncs on another thread,
    /// as its agent would: the approval waits for the joiner's confirmation. Both end showing the
    /// same circle fingerprint.
    @discardableResult
    func approve(_ approver: KeychainSync, _ code: String, joiner: KeychainSync, now: UInt64) throws -> (name: String, fingerprint: String) {
        let stop = NSLock()
        nonisolated(unsafe) var done = false
        nonisolated(unsafe) let joiner = joiner
        let syncing = Thread {
            while !stop.withLock({ done }) {
                _ = try? joiner.sync(now: now)
                usleep(50_000)
            }
        }
        syncing.start()
        defer {
            stop.withLock { done = true }
            while !syncing.isFinished { usleep(10_000) }
        }
        let approved = try approver.approve(code: code, now: now, timeout: 120, pollSeconds: 0.05)
        stop.withLock { done = true }
        while !syncing.isFinished { usleep(10_000) }
        #expect(try joiner.sync(now: now + 1).member)
        #expect(joiner.fingerprint() == approved.fingerprint && !approved.fingerprint.isEmpty)
        return approved
    }

    /// A founds, B and C join and are approved; an item A had before is on both.
    func circle() throws -> (a: KeychainSync, b: KeychainSync, c: KeychainSync) {
        let remote = try bareRemote()
        let ka = try keychain("a")
        try Self.add(ka, "before", "pw0")
        let a = try KeychainSync.initialize(keychain: ka, remote: remote, name: "laptop", now: 1_000)
        let (b, codeB) = try KeychainSync.join(keychain: try keychain("b"), remote: remote, name: "desktop", now: 1_000)
        let (c, codeC) = try KeychainSync.join(keychain: try keychain("c"), remote: remote, name: "server", now: 1_000)
        #expect(try b.sync(now: 1_001).member == false)
        let approvedB = try approve(a, codeB, joiner: b, now: 1_002)
        #expect(approvedB.name == "desktop" && approvedB.fingerprint == a.fingerprint())
        #expect(try approve(a, codeC, joiner: c, now: 1_003).name == "server")
        #expect(try b.sync(now: 1_004).member)
        #expect(try c.sync(now: 1_004).member)
        return (a, b, c)
    }

    @Test func joinApproveAndItemsReachEveryMachine() throws {
        let (a, b, c) = try circle()
        #expect(Self.password(b.keychain, "before") == "pw0" && Self.password(c.keychain, "before") == "pw0")
        #expect(try a.devices().map(\.name) == ["desktop", "laptop", "server"])
        try Self.add(b.keychain, "new", "pw1")
        #expect(try b.sync(now: 2_000).recorded == 1)
        _ = try a.sync(now: 2_001)
        _ = try c.sync(now: 2_001)
        #expect(Self.password(a.keychain, "new") == "pw1" && Self.password(c.keychain, "new") == "pw1")
        // Applied items are not sent back as local changes.
        #expect(try a.sync(now: 2_002).recorded == 0)
        // A deletion reaches the others too.
        #expect(try c.keychain.delete(ItemQuery(attributes: ["acct": .string("new"), "sync": .bool(true)]), scope: .unrestricted) == 1)
        _ = try c.sync(now: 3_000)
        _ = try a.sync(now: 3_001)
        #expect(Self.password(a.keychain, "new") == nil)
    }

    @Test func aSyncReportsItsPhasesInOrderWithTheRecordsThatArrived() throws {
        let (a, b, _) = try circle()
        for i in 0..<300 { try Self.add(a.keychain, "bulk-\(i)", "v\(i)") }
        #expect(try a.sync(now: 2_000).recorded == 300)
        var seen: [(SyncStatus.Phase, Int, Int)] = []
        #expect(try b.sync(now: 2_001) { seen.append(($0, $1, $2)) }.applied == 300)
        let phases = seen.map(\.0).reduce(into: [SyncStatus.Phase]()) { if $0.last != $1 { $0.append($1) } }
        #expect(phases == [.fetching, .verifying, .applying, .pushing], "\(phases)")
        let verifying = seen.filter { $0.0 == .verifying }
        #expect(zip(verifying, verifying.dropFirst()).allSatisfy { $0.1 <= $1.1 } && verifying.allSatisfy { $0.2 == 300 })
        #expect(verifying.last.map { $0.1 == 300 } == true)
        #expect(seen.filter { $0.0 == .applying || $0.0 == .pushing }.allSatisfy { $0.1 == 300 && $0.2 == 300 })
        #expect(Self.password(b.keychain, "bulk-299") == "v299")
    }

    @Test func thisDeviceOnlyAndUnsyncedItemsNeverLeave() throws {
        let (a, b, _) = try circle()
        try Self.add(a.keychain, "tdo-only", "x", ["sync": .bool(true), "pdmn": .string("aku")])
        try Self.add(a.keychain, "nosync", "x", [:])
        #expect(try a.sync(now: 2_000).recorded == 0)
        _ = try b.sync(now: 2_001)
        #expect(try b.keychain.count() == 1)   // only "before"
        let log = runProcess("/usr/bin/git", ["-C", a.keychain.syncDirectory, "log", "-p", "--all"])
        #expect(!log.stdout.contains("pw0") && !log.stdout.contains("tdo-only"))
    }

    /// An item whose sealed content is over a record's 1 MiB (a secret at the wire's 1 MiB limit) stays
    /// on its machine, the report says so, and the items beside it sync as ever.
    @Test func anItemLargerThanARecordStaysHereAndTheReportSaysSo() throws {
        let (a, b, _) = try circle()
        let big = String(repeating: "k", count: 1 << 20)
        try Self.add(a.keychain, "kubeconfig", big)
        try Self.add(a.keychain, "small", "pw1")
        let report = try a.sync(now: 2_000)
        #expect(report.recorded == 1 && report.refused.count == 1 && report.refused[0].contains("1 changed item is larger"),
                "\(report.recorded) \(report.refused)")
        _ = try b.sync(now: 2_001)
        #expect(Self.password(b.keychain, "small") == "pw1" && Self.password(b.keychain, "kubeconfig") == nil)
        #expect(Self.password(a.keychain, "kubeconfig") == big)
        // Reported once, not at every sync.
        #expect(try a.sync(now: 2_002).refused.isEmpty)
    }

    @Test func concurrentEditsKeepTheLaterWriterAndTheLoser() throws {
        let (a, b, c) = try circle()
        let q = ItemQuery(attributes: ["acct": .string("before"), "sync": .bool(true)])
        #expect(try a.keychain.update(q, ItemChanges(secret: secret("from-a")), scope: .unrestricted) == 1)
        #expect(try b.keychain.update(q, ItemChanges(secret: secret("from-b")), scope: .unrestricted) == 1)
        _ = try a.sync(now: 5_000)
        let rb = try b.sync(now: 6_000)   // b's edit is later by the clock: it wins, a's is the loser
        #expect(rb.conflicts == 1)
        _ = try a.sync(now: 6_001)
        _ = try c.sync(now: 6_001)
        for kc in [a.keychain, b.keychain, c.keychain] { #expect(Self.password(kc, "before") == "from-b") }
        #expect(a.conflicts.count == 1 && b.conflicts.count == 1)
    }

    /// A deletion and a later edit of the same item: the edit wins everywhere, the deletion is the kept
    /// loser; the other way round the item is gone everywhere.
    @Test func deleteAgainstEditIsDecidedByTheClock() throws {
        let (a, b, c) = try circle()
        let q = ItemQuery(attributes: ["acct": .string("before"), "sync": .bool(true)])
        #expect(try a.keychain.delete(q, scope: .unrestricted) == 1)
        #expect(try b.keychain.update(q, ItemChanges(secret: secret("edited")), scope: .unrestricted) == 1)
        _ = try a.sync(now: 5_000)
        #expect(try b.sync(now: 6_000).conflicts == 1)
        _ = try a.sync(now: 6_001)
        _ = try c.sync(now: 6_001)
        for kc in [a.keychain, b.keychain, c.keychain] { #expect(Self.password(kc, "before") == "edited") }
        #expect(try b.keychain.update(q, ItemChanges(secret: secret("again")), scope: .unrestricted) == 1)
        #expect(try c.keychain.delete(q, scope: .unrestricted) == 1)
        _ = try b.sync(now: 7_000)
        #expect(try c.sync(now: 8_000).conflicts == 1)
        _ = try a.sync(now: 8_001)
        _ = try b.sync(now: 8_001)
        for kc in [a.keychain, b.keychain, c.keychain] { #expect(Self.password(kc, "before") == nil) }
    }

    /// A removed device reads nothing written after its removal, and its own new changes reach nobody.
    @Test func aRemovedDeviceReadsNothingNew() throws {
        let (a, b, c) = try circle()
        try a.remove(device: "server", now: 2_000)
        #expect(try a.devices().first { $0.name == "server" }?.member == false)
        try Self.add(a.keychain, "secret-after", "pw2")
        _ = try a.sync(now: 3_000)
        _ = try b.sync(now: 3_001)
        #expect(Self.password(b.keychain, "secret-after") == "pw2")
        // The removed machine's sync says so (it is not waiting for anyone's approval).
        #expect(status { try c.sync(now: 3_002) } == .notAvailable)
        #expect(Self.password(c.keychain, "secret-after") == nil)
        try Self.add(c.keychain, "from-removed", "x")
        _ = try? c.sync(now: 4_000)
        _ = try a.sync(now: 4_001)
        #expect(Self.password(a.keychain, "from-removed") == nil)
        // It may set sync up again (new keys, a member's approval); before, "already set up" forever.
        let (again, code) = try KeychainSync.join(keychain: c.keychain, remote: tmp.file("remote.git"), name: "server-2", now: 5_000)
        try approve(a, code, joiner: again, now: 5_001)
        #expect(Self.password(again.keychain, "secret-after") == "pw2")
    }

    /// A conflict one member restores is settled on every member: the restore's record names the
    /// loser it brings back, so nobody lists that conflict any more (before, the others kept it).
    @Test func aRestoredConflictIsSettledOnEveryMember() throws {
        let (a, b, c) = try circle()
        let q = ItemQuery(attributes: ["acct": .string("before"), "sync": .bool(true)])
        #expect(try a.keychain.update(q, ItemChanges(secret: secret("from-a")), scope: .unrestricted) == 1)
        #expect(try b.keychain.update(q, ItemChanges(secret: secret("from-b")), scope: .unrestricted) == 1)
        _ = try a.sync(now: 5_000)
        _ = try b.sync(now: 6_000)
        _ = try a.sync(now: 6_001)
        _ = try c.sync(now: 6_001)
        #expect(a.conflicts.count == 1 && b.conflicts.count == 1 && c.conflicts.count == 1)
        try b.restore(conflict: KeychainSync.id(of: b.conflicts[0]))
        #expect(b.conflicts.isEmpty)
        _ = try b.sync(now: 7_000)
        _ = try a.sync(now: 7_001)
        _ = try c.sync(now: 7_001)
        for s in [a, b, c] {
            #expect(Self.password(s.keychain, "before") == "from-a", "the restored version is the newest everywhere")
            #expect(s.conflicts.isEmpty, "\(s.conflicts)")
        }
        // And no new conflict appears later: the old winner was superseded knowingly.
        for s in [a, b, c] { #expect(try s.sync(now: 8_000).conflicts == 0) }
    }

    /// A first setup that failed (an unreachable remote, a remote that is no git repository) leaves
    /// nothing behind: a second attempt with the right remote works (before: "remote origin already
    /// exists", forever).
    @Test func aFailedSetupUndoesItselfAndASecondAttemptWorks() throws {
        let remote = try bareRemote()
        let ka = try keychain("a")
        #expect(status { _ = try KeychainSync.initialize(keychain: ka, remote: tmp.file("nowhere.git"), name: "laptop", now: 1) } == .io)
        #expect(try ka.syncState() == nil && !FileManager.default.fileExists(atPath: ka.syncDirectory))
        let a = try KeychainSync.initialize(keychain: ka, remote: remote, name: "laptop", now: 2)
        let kb = try keychain("b")
        #expect(status { _ = try KeychainSync.join(keychain: kb, remote: tmp.file("nowhere.git"), name: "desktop", now: 3) } == .io)
        #expect(try kb.syncState() == nil && !FileManager.default.fileExists(atPath: kb.syncDirectory))
        let (b, code) = try KeychainSync.join(keychain: kb, remote: remote, name: "desktop", now: 4)
        try approve(a, code, joiner: b, now: 5)
    }

    /// While the remote is unreachable a sync fails with errSecIO and the local change stays noted; once
    /// it is back the change is recorded and reaches the others.
    @Test func anUnreachableRemoteIsCaughtUpLater() throws {
        let (a, b, _) = try circle()
        let remote = tmp.file("remote.git"), away = tmp.file("remote.away")
        try FileManager.default.moveItem(atPath: remote, toPath: away)
        try Self.add(a.keychain, "offline", "pw3")
        #expect(status { try a.sync(now: 2_000) } == .io)
        #expect(Self.password(a.keychain, "offline") == "pw3")
        try FileManager.default.moveItem(atPath: away, toPath: remote)
        #expect(try a.sync(now: 3_000).recorded == 1)
        _ = try b.sync(now: 3_001)
        #expect(Self.password(b.keychain, "offline") == "pw3")
    }

    /// An erase (too many failed passcodes) leaves nothing of the circle: not the clone in `sync` (its
    /// records, the epochs sealing the circle key to this device), not the state, not the device keys.
    @Test func eraseRemovesTheSyncDirectoryAndState() throws {
        let (a, _, _) = try circle()
        let dir = a.keychain.syncDirectory
        #expect(FileManager.default.fileExists(atPath: dir + "/.git"))
        #expect(try a.keychain.syncState() != nil)
        a.keychain.eraseEverything()
        #expect(!FileManager.default.fileExists(atPath: dir), "the sync clone outlived the erase")
        let reopened = try Keychain(directory: tmp.file("a"), lockingStateDirectory: false)
        #expect(try reopened.syncState() == nil && reopened.syncDeviceSecret() == nil)
        #expect(try KeychainSync.open(keychain: reopened) == nil)
    }

    /// `KeychainSync.compact`: once every member has synced, the writer's superseded records leave the
    /// remote, and a machine joining afterwards holds exactly the current items.
    @Test func compactionThenANewMachineHasExactlyTheCurrentItems() throws {
        let (a, b, c) = try circle()
        let q = ItemQuery(attributes: ["acct": .string("before"), "sync": .bool(true)])
        for i in 0..<5 {
            #expect(try a.keychain.update(q, ItemChanges(secret: secret("v\(i)")), scope: .unrestricted) == 1)
            _ = try a.sync(now: 2_000 + UInt64(i))
        }
        try Self.add(a.keychain, "gone", "x")
        _ = try a.sync(now: 2_100)
        #expect(try a.keychain.delete(ItemQuery(attributes: ["acct": .string("gone"), "sync": .bool(true)]), scope: .unrestricted) == 1)
        _ = try a.sync(now: 2_101)
        // B and C applied only the first version of "before" (at their first sync): only that one goes.
        #expect(try a.compact(now: 2_200) == SyncReplica.Compaction(through: 1, removed: 1, kept: 0))
        for s in [b, c, a] { _ = try s.sync(now: 2_300) }
        let done = try a.compact(now: 2_400)
        // What stays: the last version of "before" and the tombstone of "gone".
        #expect(done.removed == 5 && done.kept == 2, "\(done)")   // v0…v3 and "gone" itself
        let tree = runProcess("/usr/bin/git", ["-C", tmp.file("remote.git"), "ls-tree", "-r", "--name-only", "coffer-sync"]).stdout
        #expect(tree.split(separator: "\n").count(where: { $0.hasSuffix(".record") }) == done.kept)
        let (d, code) = try KeychainSync.join(keychain: try keychain("d"), remote: tmp.file("remote.git"), name: "phone", now: 3_000)
        try approve(a, code, joiner: d, now: 3_001)
        _ = try d.sync(now: 3_002)
        #expect(Self.password(d.keychain, "before") == "v4" && Self.password(d.keychain, "gone") == nil)
        #expect(try d.keychain.count() == 1)
        for s in [b, c] {
            _ = try s.sync(now: 3_003)
            #expect(Self.password(s.keychain, "before") == "v4" && Self.password(s.keychain, "gone") == nil)
        }
    }
}
