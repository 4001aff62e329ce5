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

    func startAgent() throws -> pid_t {
        var pid: pid_t = 0
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 2, dir + "/agent.log", O_WRONLY | O_CREAT | O_APPEND, 0o600)
        let words: [String] = [cofferd, "--foreground", "--socket", socket, "--state-dir", state]
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
        defer { _ = stop(pid); cleanup() }
        let errors = Counter(), done = Counter()
        let latencies = LatencyLog()
        let t0 = Threads.monotonicSeconds()
        for c in 0..<clients {
            let path = socket
            Threads.detach {
                defer { done.add(1) }
                guard let conn = try? AgentConnection(path: path) else { errors.add(ops); return }
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
                            if r.count != 1 { errors.add(1) }
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
                        errors.add(1)
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
        print("| errors | \(errors.value) |")
        print("| wall time | \(Int(secs)) s (\(Int(Double(clients * ops) / secs)) ops/s) |")
        print("| latency median / p99 | \(Int(percentile(all, 0.5))) µs / \(Int(percentile(all, 0.99))) µs |")
        if errors.value > 0 { throw SecError(.internalComponent, "load produced errors") }
    }

    /// `frames` random and mutated frames on fresh connections while a well-behaved client keeps working.
    func hostile(frames: Int) throws {
        let pid = try startAgent()
        defer { _ = stop(pid); cleanup() }
        let good = try AgentConnection(path: socket)
        try good.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s"), "acct": .string("a")], secret: secret("ok")))
        let stopFlag = Counter(), goodErrors = Counter(), goodOps = Counter()
        let path = socket
        Threads.detach {
            guard let c = try? AgentConnection(path: path) else { goodErrors.add(1); return }
            while stopFlag.value == 0 {
                let r = try? c.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("s"), "acct": .string("a")], returnData: true))
                if r?.count == 1 { goodOps.add(1) } else { goodErrors.add(1) }
                usleep(500)
            }
            stopFlag.add(1)
        }
        let hello = Request.hello(minVersion: 1, maxVersion: 1, clientName: "hostile").encodeFrame(requestID: 1)
        let valid = [Request.status.encodeFrame(requestID: 2),
                     Request.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("h")], secret: secret("x")), []).encodeFrame(requestID: 3),
                     Request.copyMatching(ItemQuery(attributes: ["svce": .string("s")], limit: .all)).encodeFrame(requestID: 4)]
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
        stopFlag.add(1)
        while stopFlag.value < 2 { usleep(1000) }
        let alive = kill(pid, 0) == 0
        print("| hostile frames sent | \(frames) |")
        print("| agent still running | \(alive ? "yes" : "NO") |")
        print("| well-behaved client: requests / failures | \(goodOps.value) / \(goodErrors.value) |")
        if !alive || goodErrors.value > 0 { throw SecError(.internalComponent, "hostile input disturbed the agent") }
    }

    /// `trials` × (write load, kill -9 at a random moment, check every acknowledged add and the database).
    func crash(trials: Int) throws {
        defer { cleanup() }
        var lostTotal = 0, acknowledgedTotal = 0
        for trial in 0..<trials {
            let pid = try startAgent()
            let acked = LatencyLog()
            let writerDone = Counter()
            let path = socket
            Threads.detach {
                defer { writerDone.add(1) }
                guard let c = try? AgentConnection(path: path) else { return }
                var ok: [UInt64] = []
                for i in 0..<1_000_000 {
                    do {
                        if i % 5 == 4 {
                            try c.update(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("t\(trial)"), "acct": .string("\(i - 1)")]),
                                         ItemChanges(attributes: ["labl": .string("updated")]))
                        } else {
                            try c.add(NewItem(itemClass: .genericPassword,
                                              attributes: ["svce": .string("t\(trial)"), "acct": .string("\(i)"), "pdmn": .string("dk")],
                                              secret: secret("v\(i)")))
                            ok.append(UInt64(i))
                        }
                    } catch { break }
                }
                acked.add(ok)
            }
            usleep(UInt32.random(in: 20_000...200_000))
            _ = stop(pid, signal: SIGKILL)
            while writerDone.value == 0 { usleep(1000) }
            let kc = try Keychain(directory: state)
            guard try kc.integrityCheck() else { throw SecError(.decode, "integrity_check failed after trial \(trial)") }
            for i in acked.all {
                let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("t\(trial)"), "acct": .string("\(i)")], returnData: true)
                if (try? kc.copyMatching(q))?.count != 1 { lostTotal += 1 }
            }
            acknowledgedTotal += acked.all.count
        }
        print("| crash trials (kill -9 during writes) | \(trials) |")
        print("| acknowledged adds checked | \(acknowledgedTotal) |")
        print("| lost | \(lostTotal) |")
        print("| integrity_check | ok every trial |")
        if lostTotal > 0 { throw SecError(.decode, "acknowledged writes were lost") }
    }
}

/// Latency samples from many threads.
final class LatencyLog: @unchecked Sendable {
    private let lock = Lock()
    private var samples: [UInt64] = []
    func add(_ s: [UInt64]) { lock.withLock { samples += s } }
    var all: [UInt64] { lock.withLock { samples } }
}
