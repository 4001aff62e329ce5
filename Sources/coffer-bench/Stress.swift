import CofferClient
import CofferCrypto
import CofferKeychain
import CofferModel
import CofferProtocol
import CofferSystem
import Glibc

/// Reliability runs against a real agent (contrib/stress/run.sh): load, hostile input, crash consistency.
struct Stress {
    let cofferd: String
    let dir = makeTempDir()
    var socket: String { dir + "/agent.sock" }
    var state: String { dir + "/state" }

    var binDir: String { String(cofferd[..<(cofferd.lastIndex(of: "/") ?? cofferd.startIndex)]) }

    func startAgent(_ extraArguments: [String] = []) throws -> pid_t {
        var pid: pid_t = 0
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 2, dir + "/agent.log", O_WRONLY | O_CREAT | O_APPEND, 0o600)
        let words: [String] = [cofferd, "--foreground", "--socket", socket, "--state-dir", state] + extraArguments
        var args: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
        defer { for a in args { free(a) } }
        guard posix_spawn(&pid, cofferd, &actions, nil, &args, environ) == 0 else { throw SecError(.io, "spawn failed") }
        for _ in 0..<2000 {
            if let fd = try? UnixSocket.connect(path: socket) { close(fd); return pid }
            usleep(2000)
        }
        throw SecError(.io, "agent did not start")
    }

    func stop(_ pid: pid_t, signal sig: Int32 = SIGTERM) -> Int32 {
        kill(pid, sig)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        return status
    }

    func cleanup() { _ = system("rm -rf '\(dir)'") }

    /// `clients` threads × `ops` mixed operations; zero errors expected.
    func load(clients: Int, ops: Int) throws {
        let pid = try startAgent()
        var reaped = false // an agent that died is reaped below: its pid is never signalled again
        defer { if !reaped { _ = stop(pid) }; cleanup() }
        let done = Counter()
        let failures = FailureLog()
        let latencies = LatencyLog()
        let t0 = Threads.monotonicSeconds()
        for c in 0..<clients {
            let path = socket
            Threads.detach {
                defer { done.add(1) }
                let conn: AgentConnection
                do { conn = try AgentConnection(path: path) } catch {
                    failures.add("connect: \(error)", counting: ops) // every operation of this client is lost
                    return
                }
                var mine: [Int] = []
                var rng = SystemRandomNumberGenerator()
                var local: [UInt64] = []
                local.reserveCapacity(ops)
                for i in 0..<ops {
                    let t = nowNanos()
                    do {
                        let roll = Int.random(in: 0..<100, using: &rng)
                        if mine.isEmpty || roll < 20 {
                            try conn.add(NewItem(itemClass: .genericPassword,
                                                 attributes: ["svce": .string("load\(c)"), "acct": .string("\(i)")], secret: secret("v\(i)")))
                            mine.append(i)
                        } else if roll < 70 {
                            let k = mine.randomElement(using: &rng)!
                            let r = try conn.copyMatching(ItemQuery(itemClass: .genericPassword,
                                attributes: ["svce": .string("load\(c)"), "acct": .string("\(k)")], returnData: true))
                            if r.count != 1 { failures.add("get: \(r.count) items, not 1") }
                        } else if roll < 80 {
                            let k = mine.randomElement(using: &rng)!
                            try conn.update(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("load\(c)"), "acct": .string("\(k)")]),
                                            ItemChanges(secret: secret("u\(i)")))
                        } else if roll < 90 {
                            let k = mine.removeLast()
                            try conn.delete(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("load\(c)"), "acct": .string("\(k)")]))
                        } else {
                            _ = try conn.status()
                        }
                    } catch {
                        failures.add("\(error)")
                    }
                    local.append(nowNanos() - t)
                }
                latencies.add(local)
            }
        }
        while done.value < clients { usleep(20_000) }
        let secs = Threads.monotonicSeconds() - t0
        let all = latencies.all
        print("| load: clients × operations | \(clients) × \(ops) |")
        print("| errors | \(failures.count) |")
        print("| wall time | \(Int(secs)) s (\(Int(Double(clients * ops) / secs)) ops/s) |")
        print("| latency median / p99 | \(Int(percentile(all, 0.5))) µs / \(Int(percentile(all, 0.99))) µs |")
        failures.report("load failure")
        var status: Int32 = 0
        let died = waitpid(pid, &status, WNOHANG) == pid
        reaped = died
        if died {
            let how = (status & 0x7f) != 0 ? "was killed by signal \(status & 0x7f)" : "exited with status \((status >> 8) & 0xff)"
            progress("load failure: the agent \(how) during the load")
        }
        if failures.count > 0 || died {
            // The agent's own account of it (its log never holds a secret): its warnings and errors.
            let log = String(decoding: (try? Files.read(dir + "/agent.log")) ?? [], as: UTF8.self)
            for line in log.split(separator: "\n").filter({ $0.contains(" warning ") || $0.contains(" error ") || $0.contains(" critical ") }).prefix(30) {
                progress("agent: \(line)")
            }
            throw SecError(.internalComponent, "load produced errors")
        }
    }

    /// `frames` random and mutated frames on fresh connections while a well-behaved client keeps working.
    ///
    /// The claim is exact: nothing the hostile frames may legitimately do reaches the well-behaved
    /// client's item. The frames come from another process with another identity: an unsigned copy
    /// of this binary (group `unsigned`), while this process is signed (a temporary trusted key, as
    /// the identity bench does) for the group `stress-good` that holds the item. A mutated frame can
    /// still become any valid request (a one-byte change turns the COPY_MATCHING below into a DELETE
    /// of the same query), but an unsigned caller's requests never see that group; the item is of
    /// the Always class (`dk`), readable in every lock state. So each failure of the well-behaved
    /// client is the agent's fault: a crash, a request that hangs (no reply within 60 s), an error,
    /// or a wrong secret. Each one is printed (request kind, status code, message).
    func hostile(frames: Int) throws {
        defer { cleanup() }
        let tools = IdentityBench(binDir: binDir)
        let root = try tools.canonical(dir)
        let me = try tools.canonical("/proc/self/exe")
        for d in ["keys", "manifests", "hostile"] { guard mkdir(root + "/" + d, 0o755) == 0 else { throw SecError(.io, "mkdir \(d)") } }
        try tools.coffer(["manifest", "keygen", "--out", root + "/stress.key"])
        try tools.copyFile(root + "/stress.key.pub", root + "/keys/stress.pub")
        try tools.coffer(["manifest", "sign", "--key", root + "/stress.key", "--app-id", "org.coffer.stress", "--executable", me,
                          "--group", Self.goodGroup, "--out", root + "/manifests/stress.manifest"])
        // No manifest names the copy: the agent gives it the shared group `unsigned`.
        let hostileCopy = root + "/hostile/coffer-bench"
        try tools.copyFile(me, hostileCopy)
        chmod(hostileCopy, 0o755)
        try tools.tools.writeFile(root + "/cofferd.conf",
                            "standard-trust-dirs = no\ntrusted-keys-dir = \(root)/keys\nmanifests-dir = \(root)/manifests\n")
        let pid = try startAgent(["--config", root + "/cofferd.conf"])
        var exited = false // reaped: never signalled again (the pid may be reused)
        defer { if !exited { _ = stop(pid) } }
        let good = try AgentConnection(path: socket)
        let who = try good.whoami()
        guard who.kind == .signedManifest, who.accessGroups == [Self.goodGroup] else {
            throw SecError(.internalComponent, "the agent did not identify the well-behaved client as signed for \(Self.goodGroup): \(who)")
        }
        try good.add(NewItem(itemClass: .genericPassword,
                             attributes: ["svce": .string("s"), "acct": .string("a"), "pdmn": .string("dk")], secret: secret("ok")))
        let stopFlag = Counter(), goodOps = Counter(), failures = FailureLog()
        let path = socket
        Threads.detach {
            defer { stopFlag.add(1) }
            guard let c = try? AgentConnection(path: path) else { failures.add("connect: the agent refused a new connection"); return }
            while stopFlag.value == 0 {
                do {
                    let r = try c.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("s"), "acct": .string("a")],
                                                         returnData: true))
                    let value = r.first?.data.map { d in d.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } }
                    if r.count == 1, value == "ok" { goodOps.add(1) } else { failures.add("COPY_MATCHING: \(r.count) items, secret \(value ?? "none"), expected 1 item, secret ok") }
                } catch {
                    failures.add("COPY_MATCHING: \(error)")
                }
                usleep(500)
            }
        }
        // The hostile frames, from the unsigned copy.
        let senderStatus = tools.tools.spawn(hostileCopy, ["stress-frames", socket, "\(frames)"], quiet: false)
        stopFlag.add(1)
        // The well-behaved client's request in flight must come back: a hang fails the run.
        let deadline = Threads.monotonicSeconds() + 60
        while stopFlag.value < 2 && Threads.monotonicSeconds() < deadline { usleep(1000) }
        let hung = stopFlag.value < 2
        // kill(pid, 0) succeeds on a dead child not yet reaped: ask waitpid.
        var status: Int32 = 0
        exited = waitpid(pid, &status, WNOHANG) == pid
        let alive = !exited
        print("| hostile frames to send (by an unsigned caller) | \(frames) |")
        print("| agent still running | \(alive ? "yes" : "NO") |")
        print("| well-behaved client (signed, its own group): requests / failures | \(goodOps.value) / \(failures.count) |")
        if hung { print("| well-behaved client's last request | no reply within 60 s |") }
        failures.report("well-behaved client failure")
        if senderStatus != 0 { progress("the hostile sender failed (wait status \(senderStatus))") }
        if !alive || hung || failures.count > 0 || senderStatus != 0 { throw SecError(.internalComponent, "hostile input disturbed the agent") }
    }

    static let goodGroup = "stress-good"

    /// The hostile side of ``hostile(frames:)`` (`coffer-bench stress-frames SOCKET FRAMES`, run as an
    /// unsigned copy): random, mutated and truncated frames, each on a fresh connection. Fails if the
    /// agent stops accepting, or if this process could reach the well-behaved client's group.
    static func sendHostileFrames(socket: String, frames: Int) throws {
        let who = try AgentConnection(path: socket).whoami()
        guard !who.accessGroups.contains(goodGroup) else {
            throw SecError(.internalComponent, "the hostile sender can reach \(goodGroup): \(who)")
        }
        let hello = AgentRequest.hello(minVersion: 1, maxVersion: 1, clientName: "hostile").encodeFrame(requestID: 1)
        let valid = [AgentRequest.status.encodeFrame(requestID: 2),
                     AgentRequest.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("h")], secret: secret("x")), []).encodeFrame(requestID: 3),
                     AgentRequest.copyMatching(ItemQuery(attributes: ["svce": .string("s")], limit: .all)).encodeFrame(requestID: 4),
                     // Valid as sent, refused: the well-behaved client's group is not this caller's (-34018).
                     AgentRequest.delete(ItemQuery(attributes: ["agrp": .string(goodGroup), "svce": .string("s")], limit: .all)).encodeFrame(requestID: 5)]
        var rng = SystemRandomNumberGenerator()
        for i in 0..<frames {
            guard let fd = try? UnixSocket.connect(path: socket) else { throw SecError(.io, "agent stopped accepting at frame \(i)") }
            UnixSocket.setTimeouts(fd, send: 1, receive: 0.2)
            var bytes: [UInt8]
            switch i % 3 {
            case 0: bytes = (0..<Int.random(in: 1...300, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            case 1:
                bytes = hello + valid.randomElement(using: &rng)!
                for _ in 0..<Int.random(in: 1...6, using: &rng) { bytes[Int.random(in: 4..<bytes.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng) }
            default:
                bytes = hello + Array(valid.randomElement(using: &rng)!.dropLast(Int.random(in: 1...5, using: &rng)))
            }
            _ = bytes.withUnsafeBytes { UnixSocket.writeAll(fd, $0) }
            var sink = [UInt8](repeating: 0, count: 512)
            _ = recv(fd, &sink, sink.count, 0)
            close(fd)
        }
    }

    /// `trials` × (a mixed write load, kill -9 at a random moment, then the database checked
    /// against what the agent acknowledged). The writer adds, updates (new secret and label) and
    /// deletes items, keeping a model of every acknowledged write: afterwards each item must be
    /// exactly as its last acknowledged write left it — present with that secret and label, or
    /// absent — and no other item may exist. The one request in flight at the kill may have
    /// committed or not; its item may be in either state, nothing else.
    func crash(trials: Int) throws {
        defer { cleanup() }
        var checkedTotal = 0, wrongTotal = 0
        var opsTotal = (adds: 0, updates: 0, deletes: 0)
        for trial in 0..<trials {
            let pid = try startAgent()
            let log = WriteLog()
            let path = socket
            let service = "t\(trial)"
            Threads.detach {
                defer { log.finish() }
                guard let c = try? AgentConnection(path: path) else { return }
                var rng = SystemRandomNumberGenerator()
                var live: [Int] = []
                for i in 0..<1_000_000 {
                    let roll = live.count < 8 ? 0 : Int.random(in: 0..<10, using: &rng)
                    let op: WriteLog.Op
                    if roll < 6 {
                        op = .add(i)
                    } else if roll < 9 {
                        op = .update(live.randomElement(using: &rng)!, i)
                    } else {
                        op = .delete(live.remove(at: Int.random(in: 0..<live.count, using: &rng)))
                    }
                    log.begin(op)
                    do {
                        switch op {
                        case .add(let k):
                            try c.add(NewItem(itemClass: .genericPassword,
                                              attributes: ["svce": .string(service), "acct": .string("\(k)"), "labl": .string("v\(k)"), "pdmn": .string("dk")],
                                              secret: secret("v\(k)")))
                            live.append(k)
                        case .update(let k, let v):
                            try c.update(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(service), "acct": .string("\(k)")]),
                                         ItemChanges(attributes: ["labl": .string("v\(v)")], secret: secret("v\(v)")))
                        case .delete(let k):
                            try c.delete(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(service), "acct": .string("\(k)")]))
                        }
                    } catch { return } // the agent is gone: this write stays in flight
                    log.acknowledge()
                }
            }
            usleep(UInt32.random(in: 20_000...200_000))
            _ = stop(pid, signal: SIGKILL)
            log.waitUntilFinished()

            let kc = try Keychain(directory: state, lockingStateDirectory: true)
            guard try kc.integrityCheck() else { throw SecError(.decode, "integrity_check failed after trial \(trial)") }
            var found: [Int: String] = [:] // account -> "secret|label"
            if let all = try? kc.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(service)],
                                                        limit: .all, returnData: true, returnAttributes: true), scope: .unrestricted) {
                for r in all {
                    guard case .string(let acct)? = r.attributes?["acct"], let k = Int(acct),
                          case .string(let label)? = r.attributes?["labl"], let data = r.data else { wrongTotal += 1; continue }
                    found[k] = data.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } + "|" + label
                }
            }
            let (expected, inFlight) = log.model()
            let stored = { (version: Int) in "v\(version)|v\(version)" } // what a write of `version` leaves
            let accounts = Set(expected.keys).union(found.keys)
            for k in accounts {
                let want = expected[k].map(stored), got = found[k]
                if got == want { continue }
                if let f = inFlight, f.key == k, got == f.after.map(stored) { continue }
                wrongTotal += 1
                progress("trial \(trial): item \(k) is \(got ?? "absent"), expected \(want ?? "absent")")
            }
            checkedTotal += accounts.count
            let counts = log.counts
            opsTotal.adds += counts.adds; opsTotal.updates += counts.updates; opsTotal.deletes += counts.deletes
        }
        print("| crash trials (kill -9 during a mixed write load) | \(trials) |")
        print("| acknowledged writes: adds / updates / deletes | \(opsTotal.adds) / \(opsTotal.updates) / \(opsTotal.deletes) |")
        print("| items checked against the acknowledged writes | \(checkedTotal) |")
        print("| items lost, stale or unexpected | \(wrongTotal) |")
        print("| integrity_check | ok every trial |")
        if wrongTotal > 0 { throw SecError(.decode, "the database does not match the acknowledged writes") }
    }
}

/// The writes of one crash trial: what was acknowledged, and the one write in flight.
final class WriteLog: @unchecked Sendable {
    enum Op {
        case add(Int)
        case update(Int, Int) // account, new version
        case delete(Int)
    }

    private let lock = PThreadMutex()
    private var acknowledged: [Op] = []
    private var pending: Op?
    private var finished = false

    func begin(_ op: Op) { lock.withLock { pending = op } }
    func acknowledge() { lock.withLock { if let p = pending { acknowledged.append(p) }; pending = nil } }
    func finish() { lock.withLock { finished = true } }
    func waitUntilFinished() { while !lock.withLock({ finished }) { usleep(1000) } }

    var counts: (adds: Int, updates: Int, deletes: Int) {
        lock.withLock {
            var c = (adds: 0, updates: 0, deletes: 0)
            for op in acknowledged {
                switch op {
                case .add: c.adds += 1
                case .update: c.updates += 1
                case .delete: c.deletes += 1
                }
            }
            return c
        }
    }

    /// Account -> version of its secret and label after every acknowledged write; and the write in
    /// flight, as (account, version after it; nil when it deletes).
    func model() -> ([Int: Int], (key: Int, after: Int?)?) {
        lock.withLock {
            var m: [Int: Int] = [:]
            for op in acknowledged {
                switch op {
                case .add(let k): m[k] = k
                case .update(let k, let v): m[k] = v
                case .delete(let k): m[k] = nil
                }
            }
            let flight: (key: Int, after: Int?)? = pending.map {
                switch $0 {
                case .add(let k): (k, k)
                case .update(let k, let v): (k, v)
                case .delete(let k): (k, nil)
                }
            }
            return (m, flight)
        }
    }
}

/// What clients got instead of what they asked for: how many operations failed, and the first 50
/// lines telling why (the one count a run's result is judged by).
final class FailureLog: @unchecked Sendable {
    private let lock = PThreadMutex()
    private var kept: [String] = []
    private var n = 0
    /// One failure, or `counting` operations lost to one cause (a client that could not connect).
    func add(_ line: String, counting: Int = 1) { lock.withLock { n += counting; if kept.count < 50 { kept.append(line) } } }
    var count: Int { lock.withLock { n } }
    /// Prints the kept lines, each after `label`, and how many more failures there were.
    func report(_ label: String) {
        let (lines, total) = lock.withLock { (kept, n) }
        for line in lines { progress("\(label): \(line)") }
        if total > lines.count { progress("… and \(total - lines.count) more failures") }
    }
}

/// Latency samples from many threads.
final class LatencyLog: @unchecked Sendable {
    private let lock = PThreadMutex()
    private var samples: [UInt64] = []
    func add(_ s: [UInt64]) { lock.withLock { samples += s } }
    var all: [UInt64] { lock.withLock { samples } }
}
