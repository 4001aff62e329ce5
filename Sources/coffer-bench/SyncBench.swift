import CofferCrypto
import CofferModel
import CofferSync
import CofferSystem
import Glibc

/// Issue #29's sync figures for the engine alone (the agent does not sync yet): N item changes
/// recorded on one machine and pushed, a second machine's first sync of all N (clone, join, pull and
/// decide), one change reaching the other machine in one pull, the remote's growth per change (N more
/// edits of the same items), what compaction (SyncFormat.md, "Compaction") leaves in the tree and in a
/// new machine's shallow clone, and the remote's size after `git gc`. The peer, measured in the same
/// run, is git moving N files of the same sizes and then overwriting them in place, with no sealing,
/// signing or merging: the floor any design over git has.
struct SyncBench {
    let items: Int

    private func git(_ args: [String], in dir: String? = nil) throws -> String {
        let path = Subprocess.find("git", searchPath: "/usr/bin:/bin") ?? "/usr/bin/git"
        let env = ["PATH=/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C"]
        let out = try Subprocess.run(executable: path, arguments: (dir.map { ["-C", $0] } ?? [])
                                        + ["-c", "user.name=bench", "-c", "user.email=bench@localhost"] + args, environment: env)
        guard out.status == 0 else { throw SecError(.io, "git \(args.first ?? ""): \(out.text)") }
        return out.text
    }

    private func size(_ dir: String) -> Int {
        Int(shell("du -sb '\(dir)' | cut -f1").trimmingSpace()) ?? 0
    }

    /// The bytes of every blob in the branch's tree: what a checkout holds and a reader walks.
    private func treeBytes(_ repo: String, branch: String = GitTransport.branch) -> Int {
        Int(shell("git -C '\(repo)' ls-tree -r -l '\(branch)' | awk '{s += $4} END {print s + 0}'").trimmingSpace()) ?? 0
    }

    /// The size of a `--depth 1` clone's git directory: what a new machine downloads without the history.
    private func shallowClone(_ repo: String, _ into: String, branch: String = GitTransport.branch) -> Int {
        _ = shell("git clone -q --depth 1 -b '\(branch)' 'file://\(repo)' '\(into)' 2>&1")
        return size(into + "/.git")
    }

    private func shell(_ command: String) -> String {
        guard let out = (try? Subprocess.run(executable: "/bin/sh", arguments: ["-c", command], environment: ["PATH=/usr/bin:/bin"])) else { return "" }
        return out.text
    }

    func run() throws {
        let root = makeTempDir()
        defer { _ = system("rm -rf '\(root)'") }
        let remote = root + "/remote.git"
        _ = try git(["init", "-q", "--bare", remote])
        func ms(_ ns: UInt64) -> String { fixed(Double(ns) / 1e6, 0) + " ms" }

        // Machine A: founds the circle, records N changes, pushes.
        let ga = try GitTransport.clone(remote: remote, into: root + "/a")
        let a = try SyncReplica.found(directory: ga.directory, keys: .generate(), name: "a", now: 1)
        var head = try ga.push(lastSeen: "", message: "found")
        let emptySize = size(remote)
        // A keychain's first upload is one batch (one syncfs); later changes are a record each.
        let changes = (0..<items).map { i in
            (itemKey: Array("genp\u{0}unsigned\u{0}svc\(i % 97)\u{0}acct\(i)".utf8),
             payload: Optional(secret(String(repeating: "x", count: 64) + "secret-\(i)")))
        }
        var t0 = nowNanos()
        try a.record(changes, now: 1_000)
        let recordTime = nowNanos() - t0
        t0 = nowNanos()
        head = try ga.push(lastSeen: head, message: "bulk")
        let pushTime = nowNanos() - t0
        let grown = size(remote) - emptySize

        // Machine B: clone, join, approved by A, then its first sync of everything.
        t0 = nowNanos()
        let gb = try GitTransport.clone(remote: remote, into: root + "/b")
        var bHead = try gb.pull(lastSeen: "")
        let cloneTime = nowNanos() - t0
        let join = try SyncReplica.requestJoin(directory: gb.directory, keys: .generate(), name: "b", now: 2)
        let b = join.replica
        bHead = try gb.push(lastSeen: bHead, message: "join")
        try pair(joiner: b, joinerGit: gb, joinerHead: &bHead, code: join.code, approver: a, approverGit: ga, approverHead: &head)
        t0 = nowNanos()
        bHead = try gb.pull(lastSeen: bHead)
        var pulled = try b.pull()
        let decideTime = nowNanos() - t0
        guard pulled.apply.count == items else { throw SecError(.internalComponent, "B applied \(pulled.apply.count) of \(items)") }
        pulled.state.remoteHead = bHead
        b.commit(pulled.state)

        // One change on A reaches B within one pull after the push.
        t0 = nowNanos()
        try a.record(itemKey: Array("genp\u{0}unsigned\u{0}svc0\u{0}acct0".utf8), payload: secret("changed"), now: 10_000_000)
        let oneRecord = nowNanos() - t0
        let before = size(remote)
        t0 = nowNanos()
        head = try ga.push(lastSeen: head, message: "one")
        let onePush = nowNanos() - t0
        let perChange = size(remote) - before
        t0 = nowNanos()
        bHead = try gb.pull(lastSeen: bHead)
        let one = try b.pull()
        let onePull = nowNanos() - t0
        guard one.apply.count == 1, one.apply[0].payload.withUnsafeBytes({ Array($0) }) == Array("changed".utf8) else {
            throw SecError(.internalComponent, "the change did not arrive in one pull")
        }
        // N more changes: every item edited once (a record each), B and A then acknowledge, A compacts.
        let edits = changes.map { (itemKey: $0.itemKey, payload: Optional(secret(String(repeating: "y", count: 64) + "edit"))) }
        let beforeEdits = size(remote), treeBefore = treeBytes(remote)
        try a.record(edits, now: 20_000_000)
        head = try ga.push(lastSeen: head, message: "edits")
        let editGrowth = size(remote) - beforeEdits, treeEdited = treeBytes(remote)
        let shallowEdited = shallowClone(remote, root + "/shallow1")
        bHead = try gb.pull(lastSeen: bHead)
        var pb = try b.pull()
        pb.state.remoteHead = bHead
        b.commit(pb.state)
        try b.acknowledge()
        bHead = try gb.push(lastSeen: bHead, message: "seen")
        head = try ga.pull(lastSeen: head)
        var pa = try a.pull()
        pa.state.remoteHead = head
        a.commit(pa.state)
        try a.acknowledge()
        t0 = nowNanos()
        let compaction = try a.compact()
        let compactTime = nowNanos() - t0
        t0 = nowNanos()
        head = try ga.push(lastSeen: head, message: "compact")
        let compactPush = nowNanos() - t0
        guard compaction.removed >= items else { throw SecError(.internalComponent, "compaction removed \(compaction.removed) of \(2 * items + 1) records") }
        let treeCompacted = treeBytes(remote), afterCompaction = size(remote) - emptySize
        let shallowCompacted = shallowClone(remote, root + "/shallow2")
        // A new machine after the compaction: its first sync reaches the same items.
        let gc2 = try GitTransport.clone(remote: remote, into: root + "/c")
        var cHead = try gc2.pull(lastSeen: "")
        let join2 = try SyncReplica.requestJoin(directory: gc2.directory, keys: .generate(), name: "c", now: 3)
        cHead = try gc2.push(lastSeen: cHead, message: "join")
        try pair(joiner: join2.replica, joinerGit: gc2, joinerHead: &cHead, code: join2.code, approver: a, approverGit: ga, approverHead: &head)
        cHead = try gc2.pull(lastSeen: cHead)
        let t1 = nowNanos()
        let pc = try join2.replica.pull()
        let joinDecide = nowNanos() - t1
        guard pc.apply.count == items, pc.state.versions == a.state.versions else {
            throw SecError(.internalComponent, "the machine joining after compaction applied \(pc.apply.count) of \(items)")
        }
        _ = try git(["gc", "-q", "--aggressive", "--prune=now"], in: remote)
        let compacted = size(remote) - emptySize

        // The peer: git alone moving N files of the same sizes (random, as sealed records are).
        let recordBytes = Int(shell("find '\(ga.directory)/records' -type f -name '*.record' -exec cat {} + | wc -c").trimmingSpace()) ?? 0
        let peerRemote = root + "/peer.git", peerA = root + "/pa", peerB = root + "/pb"
        _ = try git(["init", "-q", "--bare", peerRemote])
        _ = try git(["init", "-q", peerA])
        _ = shell("cd '\(peerA)' && i=0; while [ $i -lt \(items) ]; do d=f/$((i / 256)); mkdir -p $d; head -c \(recordBytes / max(items, 1)) /dev/urandom > $d/$i; i=$((i+1)); done")
        t0 = nowNanos()
        _ = try git(["add", "-A"], in: peerA)
        _ = try git(["commit", "-q", "-m", "peer"], in: peerA)
        _ = try git(["push", "-q", peerRemote, "HEAD:refs/heads/main"], in: peerA)
        let peerPush = nowNanos() - t0
        t0 = nowNanos()
        _ = try git(["clone", "-q", "-b", "main", peerRemote, peerB])
        let peerClone = nowNanos() - t0
        // The peer's N edits: every file overwritten in place (same sizes, random), committed, pushed.
        let peerBefore = size(peerRemote)
        _ = shell("cd '\(peerA)' && i=0; while [ $i -lt \(items) ]; do head -c \(recordBytes / max(items, 1)) /dev/urandom > f/$((i / 256))/$i; i=$((i+1)); done")
        _ = try git(["add", "-A"], in: peerA)
        _ = try git(["commit", "-q", "-m", "edits"], in: peerA)
        _ = try git(["push", "-q", peerRemote, "HEAD:refs/heads/main"], in: peerA)
        let peerEditGrowth = size(peerRemote) - peerBefore, peerTree = treeBytes(peerRemote, branch: "main")
        let peerShallow = shallowClone(peerRemote, root + "/pshallow", branch: "main")

        print("| \(grouped(items)) item changes | Coffer sync | git alone (peer) | ratio |")
        print("|---|---:|---:|---:|")
        print("| record N changes in one batch (seal, sign, write; one syncfs) | \(ms(recordTime)) | – | – |")
        print("| push N records (commit and push) | \(ms(pushTime)) | \(ms(peerPush)) | \(fixed(Double(pushTime) / Double(max(peerPush, 1)), 2))× |")
        print("| first sync on a new machine: fetch | \(ms(cloneTime)) | – | – |")
        print("| first sync: pull and decide all N (verify, open, merge) | \(ms(decideTime)) | \(ms(peerClone)) (clone) | \(fixed(Double(cloneTime + decideTime) / Double(max(peerClone, 1)), 2))× (fetch + decide vs clone) |")
        print("| first sync in all (fetch, pull, decide) | \(ms(cloneTime + decideTime)) | – | – |")
        print("| one change: record, push, then the other machine's one pull | \(ms(oneRecord)) + \(ms(onePush)) + \(ms(onePull)) | – | – |")
        print("| remote growth for N changes | \(fixed(Double(grown) / 1_048_576, 1)) MiB (\(grown / max(items, 1)) B per change) | – | – |")
        print("| remote growth for one more change | \(perChange) B | – | – |")
        func mib(_ b: Int) -> String { fixed(Double(b) / 1_048_576, 1) + " MiB" }
        func perChangeB(_ b: Int) -> String { "\(b / max(items, 1)) B" }
        print("| remote growth per change, N edits of the N items (pushed in one commit) | \(perChangeB(editGrowth)) | \(perChangeB(peerEditGrowth)) | \(fixed(Double(editGrowth) / Double(max(peerEditGrowth, 1)), 2))× |")
        print("| tree after the N edits (what a checkout holds): before → after compaction | \(mib(treeEdited)) → \(mib(treeCompacted)) (was \(mib(treeBefore)) before the edits) | \(mib(peerTree)) (files overwritten in place) | \(fixed(Double(treeCompacted) / Double(max(peerTree, 1)), 2))× after compaction |")
        print("| compaction: records removed, kept; time (verify, open, decide, write the checkpoint) + push | \(grouped(compaction.removed)), \(grouped(compaction.kept)); \(ms(compactTime)) + \(ms(compactPush)) | – | – |")
        print("| a new machine's shallow clone (`--depth 1`): before → after compaction | \(mib(shallowEdited)) → \(mib(shallowCompacted)) | \(mib(peerShallow)) | \(fixed(Double(shallowCompacted) / Double(max(peerShallow, 1)), 2))× |")
        print("| a machine joining after compaction: pull and decide all N | \(ms(joinDecide)) | – | – |")
        print("| remote after compaction (history keeps the removed blobs) | \(mib(afterCompaction)) | – | – |")
        print("| remote after git gc | \(mib(compacted)) | – | – |")
    }
}

/// The three pairing steps (SyncFormat.md, "Pairing") between a joiner and a member through their git
/// clones: the member's answer, the joiner's confirmation, the member's admission.
private func pair(joiner: SyncReplica, joinerGit: GitTransport, joinerHead: inout String, code: String,
                  approver: SyncReplica, approverGit: GitTransport, approverHead: inout String) throws {
    approverHead = try approverGit.pull(lastSeen: approverHead)
    let approval = try approver.answer(code: code)
    approverHead = try approverGit.push(lastSeen: approverHead, message: "answer")
    joinerHead = try joinerGit.pull(lastSeen: joinerHead)
    guard case .confirmed = try joiner.advancePairing() else { throw SecError(.internalComponent, "the pairing did not confirm") }
    joinerHead = try joinerGit.push(lastSeen: joinerHead, message: "confirm")
    approverHead = try approverGit.pull(lastSeen: approverHead)
    guard try approver.admit(approval) != nil else { throw SecError(.internalComponent, "the member saw no confirmation") }
    approverHead = try approverGit.push(lastSeen: approverHead, message: "approve")
}
