import CofferCrypto
import CofferModel
import CofferSync
import CofferTestSupport
import Foundation
import Testing

/// What a member gone bad or a removed device can do with checkpoints (SyncFormat.md, "Compaction"),
/// and a sync cut short in the middle of a compaction: three machines through a local bare git
/// repository with the real `git`.
@Suite(.serialized) struct SyncCheckpointAbuseTests {
    /// The compaction tests' machines, circle and settling (their own temporary directory).
    let compaction = SyncCompactionTests()

    /// Writes `writer`'s checkpoint file as it chooses (signed with its own keys under `epoch`'s key,
    /// which it holds) and pushes it.
    func forge(_ writer: Machine, epoch: UInt64, through: UInt64, bases: [String: Set<HLCTimestamp>]) throws {
        let keys = try writer.replica.circle().keys(for: writer.replica.keys)
        let key = try #require(keys[epoch], "the writer holds the key of epoch \(epoch)")
        let cp = SyncCheckpoint(device: writer.replica.keys.id, epoch: epoch, through: through, kept: [], bases: bases)
        let path = writer.replica.directory + "/" + SyncCheckpoint.path(writer.replica.keys.id)
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try Data(cp.encoded(key: key, keys: writer.replica.keys)).write(to: URL(fileURLWithPath: path))
        try writer.push()
    }

    /// A member's checkpoint claiming every sequence number (through 2^64 − 1) is refused and
    /// reported; the pull goes on (it used to trap on the overflow: every agent of the circle crashed).
    @Test func aCheckpointClaimingEverySequenceNumberIsRefused() throws {
        let remote = try makeBareRemote(compaction.tmp)
        let m = try compaction.circle(["a", "b"], remote: remote)
        let (a, b) = (m[0], m[1])
        try b.write("k1", "v1", now: 2_000)
        try b.push()
        try forge(b, epoch: try b.replica.circle().current.epoch, through: UInt64.max, bases: [:])
        let p = try a.pull()
        #expect(p.refused.contains { $0.0.hasPrefix("checkpoints/") }, "\(p.refused)")
    }

    /// A device removed from the circle still has its keys: a checkpoint it writes afterwards, whose
    /// bases name another device's winning version, changes nothing on the members (its bases would
    /// have made that version look superseded, and the owner's compaction remove it).
    @Test func aRemovedDevicesCheckpointBasesAreIgnored() throws {
        let remote = try makeBareRemote(compaction.tmp)
        let m = try compaction.circle(["a", "b", "r"], remote: remote)
        let (a, b, r) = (m[0], m[1], m[2])
        try r.write("r1", "from r", now: 2_000)
        try a.write("k2", "winner", now: 2_100)
        try compaction.settle(m)
        let k2 = Hex.encode(Array("k2".utf8))
        let winner = try #require(b.replica.state.versions[k2]?.time, "b has a's version of k2")
        let memberEpoch = try r.replica.circle().current.epoch
        try a.replica.remove(device: r.replica.keys.id)
        try a.push()
        _ = try b.pull()
        #expect(b.replica.state.bases[k2]?.contains(winner) != true)
        try forge(r, epoch: memberEpoch, through: 1, bases: [k2: [winner]])
        _ = try b.pull()
        _ = try a.pull()
        #expect(b.replica.state.bases[k2]?.contains(winner) != true, "a removed device's checkpoint decided b's item")
        #expect(a.replica.state.bases[k2]?.contains(winner) != true, "a removed device's checkpoint decided a's item")
        #expect(b.items["k2"] == "winner")
    }

    /// A compaction whose removals and checkpoint were written but never committed (the keybag locked
    /// before the state was stored, or the agent killed): the next pull rebases them along instead of
    /// failing at every sync, and the next push sends them.
    @Test func aCompactionCutShortBeforeItsCommitDoesNotStopLaterSyncs() throws {
        let remote = try makeBareRemote(compaction.tmp)
        let m = try compaction.circle(["a", "b"], remote: remote)
        let (a, b) = (m[0], m[1])
        for i in 1...4 { try a.write("k1", "v\(i)", now: 2_000 + UInt64(i)) }
        try compaction.settle(m)
        let done = try a.replica.compact()        // files changed in a's clone, nothing committed
        #expect(done.removed > 0, "\(done)")
        try b.write("k9", "from b", now: 3_000)
        try b.push()
        let p = try a.pull()                       // git refused this rebase ("You have unstaged changes")
        #expect(p.refused.isEmpty, "\(p.refused)")
        #expect(a.items["k9"] == "from b")
        try a.push()
        _ = try b.pull()
        #expect(b.items["k1"] == "v4")
        let tree = runProcess("/usr/bin/git", ["-C", remote, "ls-tree", "-r", "--name-only", "coffer-sync"]).stdout
        #expect(tree.contains(SyncCheckpoint.path(a.replica.keys.id)), "the compaction reached the remote: \(tree)")
    }
}
