import CofferCrypto
import CofferModel
import CofferSync
import CofferTestSupport
import Foundation
import Testing

/// Compaction (SyncFormat.md, "Compaction"): three and four machines through a local bare git
/// repository with the real `git`.
@Suite(.serialized) struct SyncCompactionTests {
    let tmp = TemporaryDirectory("coffer-compact")

    func bareRemote() throws -> String { try makeBareRemote(tmp) }

    /// A new machine `name` asks to join and `approver` lets it in; then (if `firstPull`) it pulls.
    func join(_ name: String, remote: String, approver: Machine, firstPull: Bool = true) throws -> Machine {
        let git = try GitTransport.clone(remote: remote, into: tmp.file(name))
        let head = try git.pull(lastSeen: "")
        let j = try SyncReplica.requestJoin(directory: git.directory, keys: .generate(), name: name, now: 1_000)
        var st = j.replica.state
        st.remoteHead = head
        j.replica.commit(st)
        let m = Machine(replica: j.replica, git: git)
        try m.push()
        try pair(m, code: j.code, approver: approver)
        if firstPull {
            _ = try m.pull()
            try m.push()
        }
        return m
    }

    func circle(_ names: [String], remote: String) throws -> [Machine] {
        let git = try GitTransport.clone(remote: remote, into: tmp.file(names[0]))
        let a = Machine(replica: try SyncReplica.found(directory: git.directory, keys: .generate(), name: names[0], now: 1_000), git: git)
        try a.push()
        var out = [a]
        for n in names.dropFirst() { out.append(try join(n, remote: remote, approver: a)) }
        return out
    }

    /// Everyone pulls and pushes twice: every change and every acknowledgement is everywhere.
    func settle(_ machines: [Machine]) throws {
        for _ in 0..<2 { for m in machines { _ = try m.pull(); try m.push() } }
    }

    func recordFiles(_ m: Machine, of writer: Machine) -> [String] {
        let dir = m.replica.directory + "/records/" + writer.replica.keys.id.hex
        return (FileManager.default.enumerator(atPath: dir)?.allObjects as? [String] ?? []).filter { $0.hasSuffix(".record") }.sorted()
    }

    func remoteTree(_ remote: String) -> [String] {
        runProcess("/usr/bin/git", ["-C", remote, "ls-tree", "-r", "--name-only", "coffer-sync"]).stdout.split(separator: "\n").map(String.init)
    }

    /// A's history: ten versions of k1 (the last then edited by B), k2 written and deleted, k3, and k5
    /// against C's concurrent k5 (a conflict whose loser must stay restorable).
    func history(_ a: Machine, _ b: Machine, _ c: Machine) throws {
        try c.write("k5", "c5", now: 1_500)   // before C sees A's k5: concurrent, and earlier by the clock
        try c.push()
        for i in 0..<10 { try a.write("k1", "v\(i)", now: 2_000 + UInt64(i)) }
        try a.write("k2", "doomed", now: 2_100)
        try a.write("k2", nil, now: 2_101)
        try a.write("k3", "a3", now: 2_200)
        try a.write("k5", "a5", now: 2_300)
        try a.push()
        try settle([a, b, c])
        try b.write("k1", "from b", now: 3_000)
        try b.push()
        try settle([a, b, c])
    }

    @Test func compactionThenANewMachineSeesExactlyTheCurrentItems() throws {
        let remote = try bareRemote()
        let m = try circle(["a", "b", "c"], remote: remote)
        let (a, b, c) = (m[0], m[1], m[2])
        try history(a, b, c)
        #expect(recordFiles(a, of: a).count == 14)
        let done = try a.replica.compact()
        // k1's ten versions and k2's first are superseded knowingly; k2's tombstone, k3 and k5 stay.
        #expect(done == SyncReplica.Compaction(through: 14, removed: 11, kept: 3))
        #expect(recordFiles(a, of: a).count == 3)
        try a.push()
        #expect(remoteTree(remote).filter { $0.hasPrefix("records/\(a.replica.keys.id.hex)/") }.count == 3, "the removals are committed")
        #expect(try a.replica.compact().removed == 0, "nothing more to compact")
        // The members carry on (nothing they applied went back), and a new machine reaches the same items.
        try settle([a, b, c])
        let d = try join("d", remote: remote, approver: a)
        #expect(d.items == ["k1": "from b", "k3": "a3", "k5": "a5"])
        for x in [a, b, c] { #expect(x.items == d.items) }
        #expect(d.replica.state.versions == a.replica.state.versions)
        // C's losing k5 stays restorable on every machine, the new one included.
        let lost = try #require(d.replica.state.conflicts.first { $0.itemKey == Array("k5".utf8) })
        #expect(plainText(try d.replica.open(lost.loser).payload) == "c5")
        // Later changes still flow both ways after the compaction.
        try d.write("k1", "from d", now: 9_000)
        try d.push()
        _ = try a.pull()
        #expect(a.items["k1"] == "from d")
    }

    @Test func aMemberBehindHoldsCompactionBackAndStillConverges() throws {
        let remote = try bareRemote()
        let m = try circle(["a", "b", "c"], remote: remote)
        let (a, b, c) = (m[0], m[1], m[2])
        for i in 0..<5 { try a.write("k", "v\(i)", now: 2_000 + UInt64(i)) }
        try a.push()
        try settle([a, b])   // C has not pulled since it joined
        #expect(try a.replica.compact().removed == 0, "C acknowledged none of A's records")
        _ = try c.pull()
        try c.push()
        for i in 5..<10 { try a.write("k", "v\(i)", now: 3_000 + UInt64(i)) }
        try a.push()
        try settle([a, b])   // C is behind again: it saw up to record 5
        let done = try a.replica.compact()
        #expect(done.through == 5 && done.removed == 5, "only what every member applied")
        try a.push()
        #expect(recordFiles(a, of: a).count == 5)
        let p = try c.pull()
        #expect(p.refused.isEmpty && c.items["k"] == "v9" && b.items["k"] == "v9")
    }

    @Test func aTamperedCheckpointIsRefused() throws {
        let remote = try bareRemote()
        let m = try circle(["a", "b", "c"], remote: remote)
        let (a, b, c) = (m[0], m[1], m[2])
        try history(a, b, c)
        try a.replica.compact()
        try a.push()
        let path = "checkpoints/\(a.replica.keys.id.hex).checkpoint"
        // A machine joining meets an altered checkpoint: refused, and none of A's records past the gap apply.
        let d = try join("d", remote: remote, approver: a, firstPull: false)
        _ = try d.git!.pull(lastSeen: d.replica.state.remoteHead)
        var bytes = fileBytes(d.replica.directory + "/" + path)
        bytes[30] ^= 1
        writeFileBytes(d.replica.directory + "/" + path, bytes)
        let p = try d.replica.pull()
        #expect(p.refused.contains { $0.path == path })
        #expect(p.waiting[a.replica.keys.id] == 1 && p.apply.allSatisfy { $0.time.device != a.replica.keys.id })
        // A member that relies on the checkpoint refuses the whole pull.
        _ = try b.pull()
        #expect(b.replica.state.checkpoints[a.replica.keys.id] == 14)
        writeFileBytes(b.replica.directory + "/" + path, bytes)
        let before = b.replica.state
        #expect(throws: SyncError.self) { _ = try b.replica.pull() }
        #expect(b.replica.state == before)
    }

    @Test func aRollbackAcrossACompactionIsRefused() throws {
        let remote = try bareRemote()
        let m = try circle(["a", "b", "c"], remote: remote)
        let (a, b, c) = (m[0], m[1], m[2])
        try history(a, b, c)
        let oldRecords = tmp.file("old-records")
        try FileManager.default.copyItem(atPath: b.replica.directory + "/records/" + a.replica.keys.id.hex, toPath: oldRecords)
        let beforeCompaction = runProcess("/usr/bin/git", ["-C", remote, "rev-parse", "coffer-sync"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        try a.replica.compact()
        try a.push()
        _ = try b.pull()
        _ = try c.pull()
        // Over git: the remote reset to before the compaction.
        let r = runProcess("/usr/bin/git", ["-C", remote, "update-ref", "refs/heads/coffer-sync", beforeCompaction])
        try #require(r.status == 0, "\(r)")
        #expect(throws: SyncError.self) { _ = try c.pull() }
        // In the directory (a file-sync engine): the checkpoint gone and the removed records back.
        let dir = b.replica.directory
        try FileManager.default.removeItem(atPath: dir + "/checkpoints/\(a.replica.keys.id.hex).checkpoint")
        try FileManager.default.removeItem(atPath: dir + "/records/" + a.replica.keys.id.hex)
        try FileManager.default.copyItem(atPath: oldRecords, toPath: dir + "/records/" + a.replica.keys.id.hex)
        let before = b.replica.state
        do {
            _ = try b.replica.pull()
            Issue.record("a directory from before the compaction was accepted")
        } catch {
            guard case .rolledBack = error else { Issue.record("\(error)"); return }
        }
        #expect(b.replica.state == before)
    }
}
