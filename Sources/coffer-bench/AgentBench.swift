import CofferClient
import CofferCrypto
import CofferKeychain
import CofferModel
import CofferSystem
import Glibc

/// Measures a real `cofferd` over its socket: what a user of the agent experiences.
struct AgentBench {
    let binDir: String
    let items: Int

    func spawn(_ path: String, _ args: [String], stdin: String? = nil) -> Int32 {
        var pid: pid_t = 0
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        var cargs = ([path] + args).map { strdup($0) } + [nil]
        defer { for a in cargs { free(a) } }
        guard posix_spawn(&pid, path, &actions, nil, &cargs, environ) == 0 else { return -1 }
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        return status
    }

    func rssKiB(_ pid: Int32) -> Int {
        guard let f = fopen("/proc/\(pid)/status", "r") else { return -1 }
        defer { fclose(f) }
        var line = [CChar](repeating: 0, count: 256)
        while fgets(&line, 256, f) != nil {
            let s = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if s.hasPrefix("VmRSS:") { return Int(s.filter(\.isNumber)) ?? -1 }
        }
        return -1
    }

    func agentPID(_ socket: String) -> Int32 {
        // The agent is the peer of a connection to its socket.
        guard let fd = try? UnixSocket.connect(path: socket) else { return -1 }
        defer { close(fd) }
        return (try? PeerIdentity.of(socket: fd).pid) ?? -1
    }

    func run() throws {
        let dir = makeTempDir()
        defer { _ = system("pkill -TERM -f -- '--state-dir \(dir)/state'; rm -rf '\(dir)'") }
        let socket = dir + "/agent.sock", state = dir + "/state"
        let cofferd = binDir + "/cofferd", coffer = binDir + "/coffer"
        let agentArgs = ["--socket", socket, "--state-dir", state]
        setenv("COFFER_SOCKET", socket, 1)
        var rows: [(String, String, String)] = []

        // Cold start to ready: `cofferd` returns once its socket accepts (readiness pipe).
        var starts: [UInt64] = []
        for i in 0..<10 {
            if i > 0 { _ = system("pkill -TERM -f -- '--state-dir \(state)'"); while Files.exists(socket) { usleep(1000) } }
            let t0 = nowNanos()
            guard spawn(cofferd, agentArgs) == 0 else { throw SecError(.io, "cofferd did not start") }
            starts.append(nowNanos() - t0)
        }
        rows.append(("agent cold start to ready (empty keychain)", ms(percentile(starts, 0.5)), "≤ 50 ms"))
        let idlePID = agentPID(socket)
        rows.append(("agent RSS idle", "\(rssKiB(idlePID) / 1024) MiB", ""))
        _ = system("pkill -TERM -f -- '--state-dir \(state)'")
        while Files.exists(socket) { usleep(1000) }

        // Populate through the library (an agent add is one fsync'd transaction each).
        do {
            let kc = try Keychain(directory: state)
            var i = 0
            while i < items {
                try kc.add(contentsOf: (i..<min(items, i + 5000)).map(item))
                i += 5000
            }
            kc.checkpoint()
        }
        guard spawn(cofferd, agentArgs) == 0 else { throw SecError(.io, "cofferd did not start") }
        let pid = agentPID(socket)

        // The machine's floor: a bare blocking Unix-socket echo of one small frame, same run.
        rows.append(("bare Unix-socket echo (machine floor): median", us(percentile(try echoFloor(dir + "/echo.sock"), 0.5)), ""))

        // Round trip on a persistent connection: first with no keychain work (the IPC floor).
        let c = try AgentConnection(path: socket)
        var pings: [UInt64] = []
        for _ in 0..<5000 {
            let t0 = nowNanos()
            _ = try c.status()
            pings.append(nowNanos() - t0)
        }
        rows.append(("status round trip (IPC floor, no keychain work): median", us(percentile(pings, 0.5)), ""))
        var rng = SystemRandomNumberGenerator()
        var gets: [UInt64] = []
        for n in 0..<20_000 {
            let k = Int.random(in: 0..<items, using: &rng)
            let q = ItemQuery(itemClass: .genericPassword,
                              attributes: ["svce": .string("service-\(k % 97)"), "acct": .string("account-\(k)")], returnData: true)
            let t0 = nowNanos()
            _ = try c.copyMatching(q)
            if n >= 1000 { gets.append(nowNanos() - t0) } // after warm-up
        }
        rows.append(("get round trip, persistent connection, \(items) items: median", us(percentile(gets, 0.5)), "≤ 50 µs"))
        rows.append(("get round trip: p99", us(percentile(gets, 0.99)), "≤ 250 µs"))

        // Throughput with 16 concurrent clients, 2 s.
        let counter = Counter()
        let deadline = Threads.monotonicSeconds() + 2
        let done = Counter()
        for t in 0..<16 {
            Threads.detach {
                defer { done.add(1) }
                guard let conn = try? AgentConnection(path: socket) else { return }
                var k = t
                while Threads.monotonicSeconds() < deadline {
                    k = (k &* 1103515245 &+ 12345) & 0x7fffffff
                    let i = k % items
                    let q = ItemQuery(itemClass: .genericPassword,
                                      attributes: ["svce": .string("service-\(i % 97)"), "acct": .string("account-\(i)")], returnData: true)
                    if (try? conn.copyMatching(q)) != nil { counter.add(1) }
                }
            }
        }
        while done.value < 16 { usleep(10_000) }
        rows.append(("throughput, 16 concurrent clients (gets/s)", "\(counter.value / 2)", ""))

        // Whole-process `coffer get`.
        let secretFile = dir + "/s"
        _ = system("printf x > '\(secretFile)'")
        var procs: [UInt64] = []
        for i in 0..<200 {
            let t0 = nowNanos()
            let status = spawn(coffer, ["get", "--service", "service-\(i % 97)", "--account", "account-\(i)"])
            procs.append(nowNanos() - t0)
            guard status == 0 else { throw SecError(.io, "coffer get failed") }
        }
        rows.append(("`coffer get` whole process: median", ms(percentile(procs, 0.5)), "≤ 5 ms"))
        rows.append(("`coffer get` whole process: p90", ms(percentile(procs, 0.9)), ""))
        var trues: [UInt64] = []
        for _ in 0..<200 { let t0 = nowNanos(); _ = spawn("/bin/true", []); trues.append(nowNanos() - t0) }
        rows.append(("`/bin/true` (process floor): median", ms(percentile(trues, 0.5)), ""))
        rows.append(("agent RSS with \(items) items", "\(rssKiB(pid) / 1024) MiB", ""))
        _ = secretFile

        print("| measure | value | target |")
        print("|---|---:|---|")
        for (m, v, t) in rows { print("| \(m) | \(v) | \(t) |") }
    }

    /// Round trips of a 9-byte frame to a thread that answers each with 9 bytes.
    func echoFloor(_ path: String) throws -> [UInt64] {
        let listener = try UnixSocket.listen(path: path)
        Threads.detach {
            guard let fd = try? UnixSocket.accept(listener) else { return }
            var buf = [UInt8](repeating: 0, count: 9)
            while buf.withUnsafeMutableBytes({ UnixSocket.readExactly(fd, into: $0) }) {
                guard buf.withUnsafeBytes({ UnixSocket.writeAll(fd, $0) }) else { break }
            }
            close(fd)
            close(listener)
        }
        let fd = try UnixSocket.connect(path: path)
        defer { close(fd) }
        var frame: [UInt8] = [0, 0, 0, 5, 0x02, 0, 0, 0, 1]
        var samples: [UInt64] = []
        for _ in 0..<5000 {
            let t0 = nowNanos()
            _ = frame.withUnsafeBytes { UnixSocket.writeAll(fd, $0) }
            _ = frame.withUnsafeMutableBytes { UnixSocket.readExactly(fd, into: $0) }
            samples.append(nowNanos() - t0)
        }
        return samples
    }

    func us(_ x: Double) -> String { "\(Int(x.rounded())) µs" }
    func ms(_ x: Double) -> String {
        let v = (x / 100).rounded() / 10
        return "\(v) ms"
    }
}

/// A thread-safe counter.
final class Counter: @unchecked Sendable {
    private let lock = Lock()
    private var n = 0
    func add(_ k: Int) { lock.withLock { n += k } }
    var value: Int { lock.withLock { n } }
}
