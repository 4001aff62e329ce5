import CofferCrypto
import CofferModel
import CofferSync
import CofferSystem
import Glibc

/// Issue #29's sync figures for the engine alone (the agent does not sync yet): N item changes
/// recorded on one machine and pushed, a second machine's first sync of all N (clone, join, pull and
/// decide), one change reaching the other machine in one pull, and the remote's size per change before
/// and after `git gc`. The peer, measured in the same run, is git moving N files of the same sizes
/// with no sealing, signing or merging: the floor any design over git has.
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
        head = try ga.pull(lastSeen: head)
        try a.approve(code: join.code)
        head = try ga.push(lastSeen: head, message: "approve")
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
        print("| remote after git gc | \(fixed(Double(compacted) / 1_048_576, 1)) MiB | – | – |")
    }
}
