import CofferClient
import CofferCrypto
import CofferIdentity
import CofferKeychain
import CofferModel
import CofferProtocol
import CofferSystem
import Glibc

/// What identifying callers costs (issue #13's benchmark). Two real `cofferd` agents serve copies of
/// the same keychain with the same configuration but one line: the signed agent identifies every
/// connection at accept (pidfd, /proc/PID/status, /proc/PID/exe hashed through its cache, manifests
/// from a temporary trust directory), the baseline has `identify-callers = no` (every caller unsigned,
/// never examined). The caller is this very binary, signed for the group `bench` by a temporary key
/// with `coffer manifest keygen` / `sign`. Gets alternate between the two agents in blocks, so machine
/// noise falls on both alike. Then: SHA-256 of a 50 MiB file through ``ExecutableHashCache`` (cold:
/// a new cache; warm: the same one), and a signed 50 MiB executable's first connection to a fresh
/// agent (the hash is computed) against its second (the hash is remembered).
struct IdentityBench {
    let binDir: String

    static let items = 1000
    static let group = "bench"
    static let appID = "org.coffer.bench"
    static let bigBytes = 50 << 20

    /// Helpers shared with the agent benchmark (spawn, agent pid, file writing, formatting).
    var tools: AgentBench { AgentBench(binDir: binDir, sizes: []) }

    struct Agent {
        let path: String
        var socket: String { path + "/agent.sock" }
        var state: String { path + "/state" }
        var config: String { path + "/cofferd.conf" }
        var arguments: [String] { ["--socket", socket, "--state-dir", state, "--config", config] }
    }

    func run() throws {
        let root = try canonical(makeTempDir())
        defer { _ = system("rm -rf '\(root)'") }
        for d in ["keys", "manifests", "big"] { guard mkdir(root + "/" + d, 0o755) == 0 else { throw SecError(.io, "mkdir \(d)") } }
        let me = try canonical("/proc/self/exe")

        // A temporary signer, trusted by the signed agent, and this binary's manifest.
        progress("identity bench: signing \(me)")
        try coffer(["manifest", "keygen", "--out", root + "/bench.key"])
        try copyFile(root + "/bench.key.pub", root + "/keys/bench.pub")
        try coffer(["manifest", "sign", "--key", root + "/bench.key", "--app-id", Self.appID, "--executable", me,
                    "--group", Self.group, "--out", root + "/manifests/bench.manifest"])

        // Two agents, the same keychain (items in the signed group and in `unsigned`), the same config
        // except `identify-callers`.
        let signed = Agent(path: root + "/signed"), baseline = Agent(path: root + "/baseline")
        let common = "standard-trust-dirs = no\ntrusted-keys-dir = \(root)/keys\nmanifests-dir = \(root)/manifests\n"
        for (agent, extra) in [(signed, ""), (baseline, "identify-callers = no\n")] {
            guard mkdir(agent.path, 0o700) == 0, mkdir(agent.state, 0o700) == 0 else { throw SecError(.io, "mkdir \(agent.path)") }
            try tools.writeFile(agent.config, common + extra)
            try fill(agent.state)
        }
        sync()

        // The agent remembers a hash only for a file unchanged for 2 s (racily-clean rule): a binary
        // installed a moment ago would be hashed on every connection, which is not the warm case.
        waitUntilSettled(me)

        var started: [Agent] = []
        defer { for a in started { stop(a) } }
        for a in [signed, baseline] {
            try start(a)
            started.append(a)
        }
        // Check each agent sees the caller as intended before measuring anything.
        let sc = try AgentConnection(path: signed.socket), bc = try AgentConnection(path: baseline.socket)
        let sw = try sc.whoami(), bw = try bc.whoami()
        guard sw.kind == .signedManifest, sw.appID == Self.appID, sw.accessGroups.first == Self.group else {
            throw SecError(.internalComponent, "the signed agent did not identify the bench as \(Self.appID): \(sw)")
        }
        guard bw.kind == .unsigned, bw.accessGroups.first == "unsigned" else {
            throw SecError(.internalComponent, "the baseline agent did not treat the bench as unsigned: \(bw)")
        }

        // 1. Warm get on a persistent connection, alternating in blocks of 100.
        progress("identity bench: persistent connections")
        var rng = SystemRandomNumberGenerator()
        var gets: ([UInt64], [UInt64]) = ([], [])
        for block in 0..<210 {
            for (c, isSigned) in [(sc, true), (bc, false)] {
                for _ in 0..<100 {
                    let q = query(Int.random(in: 0..<Self.items, using: &rng))
                    let t0 = nowNanos()
                    let r = try c.copyMatching(q)
                    let dt = nowNanos() - t0
                    precondition(r.count == 1 && r[0].data != nil)
                    if block < 10 { continue } // warm-up
                    if isSigned { gets.0.append(dt) } else { gets.1.append(dt) }
                }
            }
        }

        // 2. A new connection each time: connect + HELLO (pipelined, as `coffer get` does) + get + close.
        progress("identity bench: new connections")
        var conns: ([UInt64], [UInt64]) = ([], [])
        for block in 0..<42 {
            for (a, isSigned) in [(signed, true), (baseline, false)] {
                for _ in 0..<50 {
                    let q = query(Int.random(in: 0..<Self.items, using: &rng))
                    let t0 = nowNanos()
                    let r = try AgentConnection(path: a.socket, pipelineHello: true).copyMatching(q)
                    let dt = nowNanos() - t0
                    precondition(r.count == 1)
                    if block < 2 { continue }
                    if isSigned { conns.0.append(dt) } else { conns.1.append(dt) }
                }
            }
        }
        // Still signed after all that (the cache did not lose the binary, nothing was refused).
        guard try AgentConnection(path: signed.socket).whoami().kind == .signedManifest else {
            throw SecError(.internalComponent, "the bench lost its signed identity during the run")
        }
        for a in started { stop(a) }
        started.removeAll()

        // 3. Hashing a 50 MiB file through the agent's cache, and this binary.
        progress("identity bench: hashing 50 MiB")
        let big = root + "/big/data"
        try writeRandomFile(big, bytes: Self.bigBytes)
        let hashes = try hashTimes(big)
        let own = try hashTimes(me, evicted: false)

        // 4. End to end: a 50 MiB signed executable (this binary padded) connecting to a fresh agent.
        progress("identity bench: a 50 MiB signed executable against fresh agents")
        let bigExe = root + "/big/coffer-bench-50m"
        try copyFile(me, bigExe, padTo: Self.bigBytes)
        guard chmod(bigExe, 0o755) == 0 else { throw SecError(.io, "chmod") }
        try coffer(["manifest", "sign", "--key", root + "/bench.key", "--app-id", Self.appID + ".big", "--executable", bigExe,
                    "--group", Self.group, "--out", root + "/manifests/big.manifest"])
        waitUntilSettled(bigExe)
        var firsts: [UInt64] = [], seconds: [UInt64] = [], baseFirsts: [UInt64] = [], baseSeconds: [UInt64] = []
        for _ in 0..<5 {
            for (a, isSigned) in [(signed, true), (baseline, false)] {
                try start(a)
                started.append(a)
                let (t1, t2, kind) = try probe(bigExe, socket: a.socket)
                guard kind == (isSigned ? WhoAmIReply.Kind.signedManifest.rawValue : WhoAmIReply.Kind.unsigned.rawValue) else {
                    throw SecError(.internalComponent, "the 50 MiB executable got identity kind \(kind)")
                }
                if isSigned {
                    firsts.append(t1)
                    seconds.append(t2)
                } else {
                    baseFirsts.append(t1)
                    baseSeconds.append(t2)
                }
                stop(a)
                started.removeAll()
            }
        }

        printTable(gets: gets, conns: conns, hashes: hashes, own: own, ownBytes: tools.fileBytes(me),
                   firsts: firsts, seconds: seconds, baseFirsts: baseFirsts, baseSeconds: baseSeconds)
    }

    /// Hash times of `path` (ns): cold with the file's pages cached (a new cache instance each time),
    /// cold with the pages evicted first (`posix_fadvise(DONTNEED)`, the file read from disk), warm
    /// (one cache instance, the hash remembered).
    struct HashTimes {
        var cold: [UInt64] = [], evicted: [UInt64] = [], warm: [UInt64] = []
        /// Percent of the file's pages still in the page cache right after the eviction (the most seen).
        var residentAfterEviction = 0
    }

    func hashTimes(_ path: String, evicted: Bool = true) throws -> HashTimes {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw SecError(.io, "open \(path)") }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw SecError(.io, "fstat \(path)") }
        var t = HashTimes()
        var digest: [UInt8] = []
        // The cache does not remember files changed in the last 2 s; the files here are new, so the
        // window is off (the agent's own files are older than that: see waitUntilSettled).
        for i in 0..<6 {
            let cache = ExecutableHashCache(racyWindowSeconds: 0)
            let t0 = nowNanos()
            let d = try cache.sha256(fileDescriptor: fd, status: st)
            if i > 0 { t.cold.append(nowNanos() - t0) } // the first also brings the file into the page cache
            if digest.isEmpty { digest = d } else { precondition(d == digest) }
        }
        if evicted {
            for _ in 0..<3 {
                _ = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
                t.residentAfterEviction = max(t.residentAfterEviction, residentPercent(fd, bytes: Int(st.st_size)))
                let cache = ExecutableHashCache(racyWindowSeconds: 0)
                let t0 = nowNanos()
                let d = try cache.sha256(fileDescriptor: fd, status: st)
                precondition(d == digest)
                t.evicted.append(nowNanos() - t0)
            }
        }
        let cache = ExecutableHashCache(racyWindowSeconds: 0)
        _ = try cache.sha256(fileDescriptor: fd, status: st)
        for _ in 0..<10_000 {
            // What the agent does per connection once the hash is known: fstat, then the lookup.
            var now = stat()
            let t0 = nowNanos()
            guard fstat(fd, &now) == 0 else { throw SecError(.io, "fstat") }
            let d = try cache.sha256(fileDescriptor: fd, status: now)
            t.warm.append(nowNanos() - t0)
            precondition(d.count == 32)
        }
        precondition(cache.hashesComputed == 1)
        return t
    }

    /// Percent of the file's pages in the page cache (`mincore` on a mapping; no page is touched).
    func residentPercent(_ fd: Int32, bytes: Int) -> Int {
        guard let map = mmap(nil, bytes, PROT_READ, MAP_SHARED, fd, 0), map != MAP_FAILED else { return -1 }
        defer { munmap(map, bytes) }
        let page = Int(sysconf(Int32(_SC_PAGESIZE)))
        var vec = [UInt8](repeating: 0, count: (bytes + page - 1) / page)
        guard mincore(map, bytes, &vec) == 0 else { return -1 }
        return vec.reduce(0) { $0 + Int($1 & 1) } * 100 / max(vec.count, 1)
    }

    func printTable(gets: ([UInt64], [UInt64]), conns: ([UInt64], [UInt64]), hashes: HashTimes, own: HashTimes, ownBytes: Int,
                    firsts: [UInt64], seconds: [UInt64], baseFirsts: [UInt64], baseSeconds: [UInt64]) {
        let t = tools
        func ratio(_ a: Double, _ b: Double) -> String { fixed(a / b, 2) + "×" }
        func verdict(_ ok: Bool) -> String { ok ? "PASS" : "FAIL" }
        print("| round trip, both agents served at once, alternating | signed caller (identified) | baseline (`identify-callers = no`) | signed − baseline | ratio | target |")
        print("|---|---:|---:|---:|---:|---|")
        let g50 = (percentile(gets.0, 0.5), percentile(gets.1, 0.5)), g99 = (percentile(gets.0, 0.99), percentile(gets.1, 0.99))
        print("| get, persistent connection: median (\(grouped(gets.0.count)) each) | \(t.us(g50.0)) | \(t.us(g50.1)) | \(signedUs(g50.0 - g50.1)) | \(ratio(g50.0, g50.1)) | ≤ 1.1×: \(verdict(g50.0 <= 1.1 * g50.1)) |")
        print("| get, persistent connection: p99 | \(t.us(g99.0)) | \(t.us(g99.1)) | \(signedUs(g99.0 - g99.1)) | \(ratio(g99.0, g99.1)) | |")
        let c50 = (percentile(conns.0, 0.5), percentile(conns.1, 0.5)), c99 = (percentile(conns.0, 0.99), percentile(conns.1, 0.99))
        print("| new connection: connect + HELLO + get + close, hash cached: median (\(grouped(conns.0.count)) each) | \(t.us(c50.0)) | \(t.us(c50.1)) | \(signedUs(c50.0 - c50.1)) | \(ratio(c50.0, c50.1)) | ≤ +100 µs: \(verdict(c50.0 - c50.1 <= 100)) |")
        print("| new connection: p99 | \(t.us(c99.0)) | \(t.us(c99.1)) | \(signedUs(c99.0 - c99.1)) | \(ratio(c99.0, c99.1)) | |")
        let f50 = percentile(firsts, 0.5), s50 = percentile(seconds, 0.5), b50 = percentile(baseFirsts, 0.5), bs50 = percentile(baseSeconds, 0.5)
        print("| 50 MiB signed executable, first connection to a fresh agent (hash computed): median of \(firsts.count) | \(t.us(f50)) | \(t.us(b50)) | \(signedUs(f50 - b50)) | \(ratio(f50, b50)) | measured |")
        print("| ↳ its second connection (hash remembered): median of \(seconds.count) | \(t.us(s50)) | \(t.us(bs50)) | \(signedUs(s50 - bs50)) | \(ratio(s50, bs50)) | |")
        print()
        print("| SHA-256 through `ExecutableHashCache` | median | p99 / max | throughput | target |")
        print("|---|---:|---:|---:|---|")
        func mbps(_ bytes: Int, _ micros: Double) -> String { fixed(Double(bytes) / 1_048_576 / (micros / 1e6), 0) + " MiB/s" }
        let big = Self.bigBytes
        print("| 50 MiB, cold (new cache; file in the page cache): median of \(hashes.cold.count) | \(t.ms(percentile(hashes.cold, 0.5))) | \(t.ms(percentile(hashes.cold, 1))) | \(mbps(big, percentile(hashes.cold, 0.5))) | measured |")
        print("| 50 MiB, cold (new cache; pages evicted with `POSIX_FADV_DONTNEED`, ≤ \(hashes.residentAfterEviction)% left resident): median of \(hashes.evicted.count) | \(t.ms(percentile(hashes.evicted, 0.5))) | \(t.ms(percentile(hashes.evicted, 1))) | \(mbps(big, percentile(hashes.evicted, 0.5))) | measured |")
        print("| 50 MiB, warm (fstat + cache hit) | \(fixed(percentile(hashes.warm, 0.5), 2)) µs | \(fixed(percentile(hashes.warm, 0.99), 2)) µs | | |")
        print("| this coffer-bench binary (\(t.mib(ownBytes))), cold (page cache): median of \(own.cold.count) | \(t.ms(percentile(own.cold, 0.5))) | \(t.ms(percentile(own.cold, 1))) | \(mbps(ownBytes, percentile(own.cold, 0.5))) | |")
    }

    func signedUs(_ x: Double) -> String { (x >= 0 ? "+" : "−") + tools.us(abs(x)) }

    /// The same query to both agents, naming no group: each agent searches its caller's groups
    /// (`bench` for the signed caller, `unsigned` for the baseline's), as `coffer get` does.
    func query(_ k: Int) -> ItemQuery {
        ItemQuery(itemClass: .genericPassword,
                  attributes: ["svce": .string("service-\(k % 97)"), "acct": .string("account-\(k)")], returnData: true)
    }

    /// The keychain both agents serve: ``items`` items in the signed group and as many in `unsigned`.
    func fill(_ state: String) throws {
        let kc = try Keychain(directory: state, lockingStateDirectory: true)
        for group in [Self.group, "unsigned"] {
            try kc.add(contentsOf: (0..<Self.items).map { i in
                NewItem(itemClass: .genericPassword,
                        attributes: ["svce": .string("service-\(i % 97)"), "acct": .string("account-\(i)"), "labl": .string("item \(i)"),
                                     "agrp": .string(group)],
                        secret: secret("password-\(i)"))
            }, scope: .unrestricted)
        }
        kc.checkpoint()
    }

    func start(_ agent: Agent) throws {
        guard tools.spawn(binDir + "/cofferd", agent.arguments) == 0 else { throw SecError(.io, "cofferd did not start") }
    }

    /// Stops the agent we started, by its pid (the peer of a connection to its socket).
    func stop(_ agent: Agent) {
        let pid = tools.agentPID(agent.socket)
        guard pid > 0 else { return }
        kill(pid, SIGTERM)
        while Files.exists(agent.socket) || kill(pid, 0) == 0 { usleep(1000) }
    }

    /// `coffer ARGS`, which must succeed.
    func coffer(_ args: [String]) throws {
        let status = tools.spawn(binDir + "/coffer", args)
        guard status == 0 else { throw SecError(.io, "coffer \(args.prefix(2).joined(separator: " ")) failed (status \(status))") }
    }

    /// Sleeps until `path` has been unchanged for over 2 s (the cache's racy window).
    func waitUntilSettled(_ path: String) {
        while true {
            var st = stat(), now = timespec()
            guard stat(path, &st) == 0 else { return }
            clock_gettime(CLOCK_REALTIME, &now)
            let newest = max(st.st_mtim.tv_sec, st.st_ctim.tv_sec)
            if now.tv_sec - newest >= 3 { return }
            progress("identity bench: waiting for \(path) to be older than the cache's 2 s racy window")
            sleep(1)
        }
    }

    func canonical(_ path: String) throws -> String {
        guard let p = realpath(path, nil) else { throw SecError(.io, "realpath \(path)") }
        defer { free(p) }
        return String(cString: p)
    }

    /// Copies `from` to `to` (mode 0644), padding with zeros to `padTo` bytes if given.
    func copyFile(_ from: String, _ to: String, padTo: Int? = nil) throws {
        var bytes = try Files.read(from, maxBytes: 1 << 30)
        if let padTo, bytes.count < padTo { bytes += [UInt8](repeating: 0, count: padTo - bytes.count) }
        try write(to, bytes)
    }

    func writeRandomFile(_ path: String, bytes: Int) throws {
        var data: [UInt8] = []
        data.reserveCapacity(bytes)
        while data.count < bytes { data += Random.bytes(min(1 << 20, bytes - data.count)) }
        try write(path, data)
    }

    func write(_ path: String, _ bytes: [UInt8]) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw SecError(.io, "create \(path)") }
        defer { close(fd) }
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + off, $0.count - off) }
            guard n > 0 else { throw SecError(.io, "write \(path)") }
            off += n
        }
        guard fsync(fd) == 0 else { throw SecError(.io, "fsync \(path)") }
    }

    /// Runs `exe identity-probe SOCKET` and reads its line: first and second connection (ns) and the
    /// identity kind the agent gave it.
    func probe(_ exe: String, socket: String) throws -> (UInt64, UInt64, UInt8) {
        guard let f = popen("'\(exe)' identity-probe '\(socket)'", "r") else { throw SecError(.io, "popen") }
        var line = [CChar](repeating: 0, count: 256)
        let got = fgets(&line, 256, f) != nil
        let status = pclose(f)
        let fields = got ? String(decoding: line.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self).split(separator: " ").compactMap { UInt64($0.filter(\.isNumber)) } : []
        guard status == 0, fields.count == 3 else { throw SecError(.io, "identity-probe failed (status \(status))") }
        return (fields[0], fields[1], UInt8(fields[2]))
    }
}

/// `coffer-bench identity-probe SOCKET` (run by ``IdentityBench`` as a padded 50 MiB copy of itself):
/// two connect + HELLO + get + close in a row, timed; prints "FIRST_NS SECOND_NS KIND".
func identityProbe(socket: String) throws {
    var times: [UInt64] = []
    for _ in 0..<2 {
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("service-1"), "acct": .string("account-1")], returnData: true)
        let t0 = nowNanos()
        let r = try AgentConnection(path: socket, pipelineHello: true).copyMatching(q)
        times.append(nowNanos() - t0)
        guard r.count == 1 else { throw SecError(.itemNotFound, "identity-probe: no item") }
    }
    let kind = try AgentConnection(path: socket).whoami().kind
    print("\(times[0]) \(times[1]) \(kind.rawValue)")
}
