import CofferCLISupport
import CofferClient
import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferSystem
import Glibc

/// Measures a real `cofferd` over its socket at several keychain sizes: what a user of the agent
/// experiences. Each size gets a fresh state directory with a passcode set (Argon2id calibrated as
/// in real use), is filled through the library (one transaction per 5,000 items: an agent add is
/// one fsync'd transaction each, which would take an hour at 1M), and is then served by a real
/// agent with a private PAM stack (pam_matrix) so that unlock runs PAM and Argon2id for real.
struct AgentBench {
    let binDir: String
    let sizes: [Int]

    static let passcode = "bench passcode"
    static let matrix = "/usr/lib/x86_64-linux-gnu/pam_wrapper/pam_matrix.so"
    static let clientCounts = [1, 4, 16, 64]

    /// Where one benchmark agent keeps everything: its socket, keychain state and PAM stack.
    struct AgentDirectory {
        let path: String
        var socket: String { path + "/agent.sock" }
        var state: String { path + "/state" }
        var pam: String { path + "/pam" }
        var arguments: [String] { ["--socket", socket, "--state-dir", state, "--pam-confdir", pam, "--pam-service", "coffer"] }
    }

    /// One size's results, in table order.
    struct Column { var values: [String: String] = [:] }

    /// The rows of the table: (key, label, target).
    static let rows: [(String, String, String)] = [
        ("fill", "fill through the library (items/s)", ""),
        ("dbsize", "database size", ""),
        ("cold", "cold start to ready (median of 5)", "≤ 50 ms"),
        ("rssIdle", "agent RSS after start (before unlock)", ""),
        ("kdf", "Argon2id alone, keybag's parameters (median of 11)", "≥ 80 ms by design"),
        ("unlock", "unlock over the socket: PAM + Argon2id + unwrap (median of 11)", "KDF + ≤ 20 ms"),
        ("unlockOver", "unlock minus Argon2id", "≤ 20 ms"),
        ("echo", "bare Unix-socket echo (machine floor): median", ""),
        ("status", "status round trip (IPC floor): median", ""),
        ("get50", "get round trip, persistent connection: median", "≤ 50 µs"),
        ("get99", "get round trip: p99", "≤ 250 µs"),
        ("oneShot", "connect + HELLO + get + close (what `coffer get` does): median", ""),
        ("tp1", "throughput, 1 client (gets/s)", ""),
        ("tp4", "throughput, 4 clients (gets/s)", ""),
        ("tp16", "throughput, 16 clients (gets/s)", ""),
        ("tp64", "throughput, 64 clients (gets/s)", ""),
        ("tp64p99", "64 clients: p99 per get", ""),
        ("cli50", "`coffer get` whole process: median", "≤ 5 ms"),
        ("cli90", "`coffer get` whole process: p90", ""),
        ("true", "↳ `/bin/true` (process floor): median", ""),
        ("cliStart", "↳ `coffer get` that stops at connect (start-up, parsing, no agent): median", ""),
        ("cliAgent", "↳ the rest: the agent's part, connect to reply (whole process minus the line above)", ""),
        ("rss", "agent RSS after the runs above", "≤ 30 MB at 100,000"),
        ("vmlck", "agent locked memory (VmLck) / RLIMIT_MEMLOCK", "within the limit"),
    ]

    func run() throws {
        var columns: [Column] = []
        var kept: [String] = []
        defer { for dir in kept { _ = system("rm -rf '\(dir)'") } }
        for (i, n) in sizes.enumerated() {
            progress("agent bench: \(n) items")
            // The smallest and largest keychains are kept for the side-by-side run below.
            let keep = sizes.count > 1 && (i == 0 || i == sizes.count - 1)
            let (col, dir) = try measure(items: n, keep: keep)
            columns.append(col)
            if let dir { kept.append(dir) }
        }
        print("| measure | " + sizes.map { "\(grouped($0)) items" }.joined(separator: " | ") + " | target |")
        print("|---|" + sizes.map { _ in "---:|" }.joined() + "---|")
        for (key, label, target) in Self.rows {
            print("| \(label) | " + columns.map { $0.values[key] ?? "–" }.joined(separator: " | ") + " | \(target) |")
        }
        guard kept.count == 2, let small = sizes.first, let large = sizes.last else { return }
        // Lookup cost against keychain size, measured so that machine noise cannot pose as a
        // difference: both agents run at once and the gets alternate between them.
        progress("agent bench: \(small) and \(large) items side by side")
        let (a, b) = try sideBySide(kept[0], small, kept[1], large)
        print()
        print("| get round trip, both keychains served at once, gets alternating in blocks of 100 | \(grouped(small)) items | \(grouped(large)) items | ratio | target |")
        print("|---|---:|---:|---:|---|")
        print("| median | \(us(percentile(a, 0.5))) | \(us(percentile(b, 0.5))) | \(fixed(percentile(b, 0.5) / percentile(a, 0.5), 2))× | ≤ 2× |")
        print("| p99 | \(us(percentile(a, 0.99))) | \(us(percentile(b, 0.99))) | \(fixed(percentile(b, 0.99) / percentile(a, 0.99), 2))× | |")
    }

    /// Serves the two kept keychains at once and alternates gets between them: round trips (µs) for each.
    func sideBySide(_ dirA: String, _ itemsA: Int, _ dirB: String, _ itemsB: Int) throws -> ([UInt64], [UInt64]) {
        let agents = [AgentDirectory(path: dirA), AgentDirectory(path: dirB)]
        var started: [AgentDirectory] = [], conns: [AgentConnection] = []
        defer { for agent in started { stopAgent(agent) } }
        for agent in agents {
            try startAgent(agent)
            started.append(agent)
            let c = try AgentConnection(path: agent.socket)
            try c.unlock(passcode: secret(Self.passcode))
            conns.append(c)
        }
        // Blocks of 100 gets, alternating: short enough that both see the same machine, long enough
        // that the idle agent's connection thread has stopped polling for its next request (each
        // polls ~50 µs after a reply; strict alternation would have one agent spinning while the other works).
        var rng = SystemRandomNumberGenerator()
        var a: [UInt64] = [], b: [UInt64] = []
        for block in 0..<220 {
            for (c, items) in [(conns[0], itemsA), (conns[1], itemsB)] {
                for _ in 0..<100 {
                    let q = query(Int.random(in: 0..<items, using: &rng))
                    let t0 = nowNanos()
                    let r = try c.copyMatching(q)
                    let t = nowNanos() - t0
                    precondition(r.count == 1 && r[0].data != nil)
                    if block < 20 { continue } // warm-up
                    if items == itemsA { a.append(t) } else { b.append(t) }
                }
            }
        }
        return (a, b)
    }

    /// Fills a keychain with `items`, serves it with a real agent, and takes every measure.
    /// With `keep`, the directory (keychain, PAM stack) is left for the caller, who removes it.
    func measure(items: Int, keep: Bool) throws -> (Column, String?) {
        var col = Column()
        let agent = AgentDirectory(path: makeTempDir())
        let dir = agent.path, socket = agent.socket, state = agent.state
        defer { _ = system("pkill -TERM -f -- '--state-dir \(state)'" + (keep ? "" : "; rm -rf '\(dir)'")) }
        try writePAMStack(agent.pam, passdb: dir + "/passdb")
        setenv("COFFER_SOCKET", socket, 1)

        // Fill, with a calibrated passcode set: the same keybag a real user has.
        let kdf: KDFParameters
        do {
            try Files.makePrivateDirectory(state)
            let kc = try Keychain(directory: state, lockingStateDirectory: true)
            try kc.setPasscode(current: nil, new: secret(Self.passcode))
            kdf = kc.kdfParameters!
            let t0 = nowNanos()
            var i = 0
            while i < items {
                try kc.add(contentsOf: (i..<min(items, i + 5000)).map(item), scope: .unrestricted)
                i += 5000
            }
            col.values["fill"] = grouped(Int(Double(items) / (Double(nowNanos() - t0) / 1e9)))
            kc.checkpoint()
        }
        // Write the fill out now: the kernel flushing a gigabyte of dirty pages in the background
        // would otherwise be measured as noise in everything below.
        sync()
        col.values["dbsize"] = mib(fileBytes(state + "/" + Keychain.FileNames.database))

        // Cold start to ready: `cofferd` daemonises and returns once its socket accepts.
        var starts: [UInt64] = []
        for i in 0..<5 {
            if i > 0 { stopAgent(agent) }
            let t0 = nowNanos()
            try startAgent(agent)
            starts.append(nowNanos() - t0)
        }
        col.values["cold"] = ms(percentile(starts, 0.5))
        let pid = agentPID(socket)
        col.values["rssIdle"] = mib(statusKiB(pid, "VmRSS") * 1024)

        // Unlock over the socket vs Argon2id alone with the keybag's own parameters.
        let c = try AgentConnection(path: socket)
        var unlocks: [UInt64] = [], kdfs: [UInt64] = []
        for _ in 0..<11 {
            let t0 = nowNanos()
            try c.unlock(passcode: secret(Self.passcode))
            unlocks.append(nowNanos() - t0)
            try c.lock()
            let salt = Random.bytes(Argon2id.saltBytes)
            let t1 = nowNanos()
            _ = try Array(Self.passcode.utf8).withUnsafeBytes { pw in
                try Argon2id.deriveKey(password: pw, salt: salt, opsLimit: kdf.opsLimit, memLimit: Int(kdf.memLimit))
            }
            kdfs.append(nowNanos() - t1)
        }
        try c.unlock(passcode: secret(Self.passcode))
        let unlockMs = percentile(unlocks, 0.5) / 1000, kdfMs = percentile(kdfs, 0.5) / 1000
        col.values["kdf"] = fixed(kdfMs, 1) + " ms"
        col.values["unlock"] = fixed(unlockMs, 1) + " ms"
        col.values["unlockOver"] = fixed(unlockMs - kdfMs, 1) + " ms"

        col.values["echo"] = us(percentile(try echoFloor(dir + "/echo.sock"), 0.5))
        var pings: [UInt64] = []
        for _ in 0..<5000 {
            let t0 = nowNanos()
            _ = try c.status()
            pings.append(nowNanos() - t0)
        }
        col.values["status"] = us(percentile(pings, 0.5))
        var rng = SystemRandomNumberGenerator()
        var gets: [UInt64] = []
        for n in 0..<21_000 {
            let q = query(Int.random(in: 0..<items, using: &rng))
            let t0 = nowNanos()
            let r = try c.copyMatching(q)
            if n >= 1000 { gets.append(nowNanos() - t0) } // after warm-up
            precondition(r.count == 1 && r[0].data != nil)
        }
        var oneShots: [UInt64] = []
        for _ in 0..<2000 {
            let q = query(Int.random(in: 0..<items, using: &rng))
            let t0 = nowNanos()
            let r = try AgentConnection(path: socket, pipelineHello: true).copyMatching(q)
            oneShots.append(nowNanos() - t0)
            precondition(r.count == 1)
        }
        col.values["oneShot"] = us(percentile(oneShots, 0.5))
        col.values["get50"] = us(percentile(gets, 0.5))
        col.values["get99"] = us(percentile(gets, 0.99))

        for clients in Self.clientCounts {
            let (rate, p99) = throughput(socket: socket, clients: clients, items: items, seconds: 2)
            col.values["tp\(clients)"] = grouped(rate)
            if clients == 64 { col.values["tp64p99"] = us(p99) }
        }

        var procs: [UInt64] = []
        for i in 0..<200 {
            let k = (i * 7919) % items
            let t0 = nowNanos()
            let status = spawn(binDir + "/coffer", ["get", "--service", "service-\(k % 97)", "--account", "account-\(k)"])
            procs.append(nowNanos() - t0)
            guard status == 0 else { throw SecError(.io, "coffer get failed") }
        }
        col.values["cli50"] = ms(percentile(procs, 0.5))
        col.values["cli90"] = ms(percentile(procs, 0.9))
        // Where the whole process's time goes: the bare process floor, then a `coffer get` that
        // fails at connect (no agent at that path: the same start-up and parsing, no IPC). Interleaved,
        // so both see the same machine.
        var trues: [UInt64] = [], starts0: [UInt64] = []
        let nowhere = dir + "/no-agent.sock"
        for i in 0..<200 {
            var t0 = nowNanos()
            _ = spawn("/bin/true", [])
            trues.append(nowNanos() - t0)
            let k = (i * 7919) % items
            t0 = nowNanos()
            let status = spawn(binDir + "/coffer", ["get", "--service", "service-\(k % 97)", "--account", "account-\(k)", "--socket", nowhere])
            starts0.append(nowNanos() - t0)
            guard status != 0 else { throw SecError(.internalComponent, "coffer get succeeded without an agent") }
        }
        col.values["true"] = ms(percentile(trues, 0.5))
        col.values["cliStart"] = ms(percentile(starts0, 0.5))
        col.values["cliAgent"] = ms(percentile(procs, 0.5) - percentile(starts0, 0.5))
        col.values["rss"] = mib(statusKiB(pid, "VmRSS") * 1024)
        let limit = memlockLimit(pid).map { "\($0 >> 10) KiB" } ?? "unlimited"
        col.values["vmlck"] = "\(statusKiB(pid, "VmLck")) KiB / \(limit)"
        stopAgent(agent)
        return (col, keep ? dir : nil)
    }

    /// `clients` threads doing gets on their own connections for `seconds`: total rate and p99 latency (µs).
    func throughput(socket: String, clients: Int, items: Int, seconds: Double) -> (Int, Double) {
        let counter = Counter(), done = Counter(), latencies = LatencyLog()
        let deadline = Threads.monotonicSeconds() + seconds
        for t in 0..<clients {
            Threads.detach {
                defer { done.add(1) }
                guard let conn = try? AgentConnection(path: socket) else { return }
                var k = t &* 2_654_435_761
                var local: [UInt64] = []
                while Threads.monotonicSeconds() < deadline {
                    k = (k &* 1_103_515_245 &+ 12345) & 0x7fff_ffff
                    let t0 = nowNanos()
                    if (try? conn.copyMatching(query(k % items))) != nil { counter.add(1) }
                    local.append(nowNanos() - t0)
                }
                latencies.add(local)
            }
        }
        while done.value < clients { usleep(10_000) }
        return (Int(Double(counter.value) / seconds), percentile(latencies.all, 0.99))
    }

    func query(_ k: Int) -> ItemQuery {
        ItemQuery(itemClass: .genericPassword,
                  attributes: ["svce": .string("service-\(k % 97)"), "acct": .string("account-\(k)")], returnData: true)
    }

    /// A private PAM stack accepting ``passcode`` for the current user (pam_matrix by absolute path).
    func writePAMStack(_ pamDir: String, passdb: String) throws {
        guard mkdir(pamDir, 0o700) == 0 else { throw SecError(.io, "mkdir \(pamDir)") }
        let user = String(cString: getpwuid(getuid())!.pointee.pw_name)
        try writeFile(passdb, "\(user):\(Self.passcode):coffer\n")
        try writeFile(pamDir + "/coffer", "auth required \(Self.matrix) passdb=\(passdb)\naccount required \(Self.matrix) passdb=\(passdb)\n")
    }

    func writeFile(_ path: String, _ text: String) throws {
        guard let f = fopen(path, "w") else { throw SecError(.io, "cannot write \(path)") }
        fputs(text, f)
        fclose(f)
    }

    /// Starts `cofferd` on `agent`; it daemonises and returns once its socket accepts.
    func startAgent(_ agent: AgentDirectory) throws {
        guard spawn(binDir + "/cofferd", agent.arguments) == 0 else { throw SecError(.io, "cofferd did not start") }
    }

    func stopAgent(_ agent: AgentDirectory) {
        _ = system("pkill -TERM -f -- '--state-dir \(agent.state)'")
        while Files.exists(agent.socket) { usleep(1000) }
    }

    /// Runs `path ARGS` to its end; its wait status. `quiet`: its output goes to /dev/null.
    func spawn(_ path: String, _ args: [String], quiet: Bool = true) -> Int32 {
        var pid: pid_t = 0
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        if quiet {
            posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        }
        var cargs = ([path] + args).map { strdup($0) } + [nil]
        defer { for a in cargs { free(a) } }
        guard posix_spawn(&pid, path, &actions, nil, &cargs, environ) == 0 else { return -1 }
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        return status
    }

    /// A field of /proc/PID/status in KiB (VmRSS, VmLck).
    func statusKiB(_ pid: Int32, _ field: String) -> Int {
        procLine("/proc/\(pid)/status", prefix: field + ":").flatMap { Int($0.filter(\.isNumber)) } ?? -1
    }

    /// The soft RLIMIT_MEMLOCK of `pid` in bytes (nil: unlimited).
    func memlockLimit(_ pid: Int32) -> Int? {
        procLine("/proc/\(pid)/limits", prefix: "Max locked memory")
            .flatMap { $0.dropFirst("Max locked memory".count).split(separator: " ").first.flatMap { Int($0) } }
    }

    func procLine(_ path: String, prefix: String) -> String? {
        guard let f = fopen(path, "r") else { return nil }
        defer { fclose(f) }
        var line = [CChar](repeating: 0, count: 512)
        while fgets(&line, 512, f) != nil {
            let s = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if s.hasPrefix(prefix) { return s }
        }
        return nil
    }

    func fileBytes(_ path: String) -> Int {
        var st = stat()
        return stat(path, &st) == 0 ? Int(st.st_size) : -1
    }

    func agentPID(_ socket: String) -> Int32 {
        // The agent is the peer of a connection to its socket.
        guard let fd = try? UnixSocket.connect(path: socket) else { return -1 }
        defer { close(fd) }
        return (try? PeerIdentity.of(socket: fd).pid) ?? -1
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

    func us(_ x: Double) -> String { x < 10_000 ? "\(Int(x.rounded())) µs" : fixed(x / 1000, 1) + " ms" }
    func ms(_ x: Double) -> String { fixed(x / 1000, 1) + " ms" }
    func mib(_ bytes: Int) -> String { fixed(Double(bytes) / 1_048_576, 1) + " MiB" }
}

/// `x` with `digits` decimals (``CofferCLISupport/DecimalText/fixed(_:_:)``).
func fixed(_ x: Double, _ digits: Int) -> String { DecimalText.fixed(x, digits) }

/// 1234567 → "1,234,567".
func grouped(_ n: Int) -> String { DecimalText.grouped(n) }

/// A progress line on stderr (the table goes to stdout).
func progress(_ s: String) { StandardStreams.printError(s) }

/// A thread-safe counter.
final class Counter: @unchecked Sendable {
    private let lock = PThreadMutex()
    private var n = 0
    func add(_ k: Int) { lock.withLock { n += k } }
    var value: Int { lock.withLock { n } }
}
