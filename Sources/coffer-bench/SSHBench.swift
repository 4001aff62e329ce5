import CofferClient
import CofferCrypto
import CofferModel
import CofferProtocol
import CofferSSHAgentProtocol
import CofferSystem
import Glibc

/// cofferd's ssh-agent socket beside OpenSSH's own `ssh-agent` (issue #27's benchmark), in one run on
/// the same keys: 100 Ed25519 keys generated here and added to both agents with ADD_IDENTITY (what
/// `ssh-add` sends), then, alternating between the agents in blocks so machine noise falls on both:
///
/// - SIGN_REQUEST round trips from this process (requests built with the CofferSSHAgentProtocol codec)
///   with the 100th key (the last a linear search finds), on a persistent connection and on a new
///   connection each; both agents' signatures are checked to be the same bytes (Ed25519 is
///   deterministic) and to verify;
/// - the real `ssh-add -l` process with the 100 keys loaded, beside `/bin/true`;
/// - the real `ssh -T … true` to an `sshd` this benchmark starts on 127.0.0.1 (a free port, its own
///   host key, config and authorized_keys in a temporary directory), with `SSH_AUTH_SOCK` at each
///   agent; when sshd cannot start, the row says why;
/// - a protected keychain key inside its reuse window against a plain keychain key (cofferd only: the
///   keys are made in the agent with KEY_CREATE; OpenSSH's agent has no such keys), and a keychain key
///   against a key added with ssh-add.
///
/// Every process it starts (cofferd, ssh-agent, sshd) is stopped before it returns, by its pid.
struct SSHBench {
    let binDir: String
    static let keyCount = 100
    var tools: AgentBench { AgentBench(binDir: binDir, sizes: []) }

    /// OpenSSH's programs, found on PATH (sshd also in /usr/sbin; `COFFER_BENCH_SSHD` overrides it).
    struct OpenSSH {
        let agent: String, add: String, ssh: String, keygen: String
        let sshd: String?

        init() throws {
            func find(_ name: String) throws -> String {
                guard let p = SSHBench.program(name) else { throw SecError(.notAvailable, "\(name) not found: install openssh-client") }
                return p
            }
            agent = try find("ssh-agent"); add = try find("ssh-add"); ssh = try find("ssh"); keygen = try find("ssh-keygen")
            if let env = getenv("COFFER_BENCH_SSHD") { sshd = String(cString: env) } else { sshd = SSHBench.program("sshd") }
        }
    }

    /// The processes this run started and must stop.
    final class Children {
        var pids: [pid_t] = []
        func stopAll() {
            for pid in pids.reversed() {
                kill(pid, SIGTERM)
                var status: Int32 = 0
                waitpid(pid, &status, 0)
            }
            pids = []
        }
    }

    func run() throws {
        let openssh = try OpenSSH()
        let root = makeTempDir()
        let coffer = AgentBench.AgentDirectory(path: root + "/coffer")
        let children = Children()
        var cofferStarted = false
        defer {
            children.stopAll()
            if cofferStarted { IdentityBench(binDir: binDir).stop(IdentityBench.Agent(path: coffer.path)) }
            _ = system("rm -rf '\(root)'")
        }
        guard mkdir(coffer.path, 0o700) == 0 else { throw SecError(.io, "mkdir \(coffer.path)") }
        try tools.writePAMStack(coffer.pam, passdb: coffer.path + "/passdb")
        // The agent's own prompter: a pinentry answering the passcode, for the protected key's first signature.
        let pinentry = root + "/pinentry", config = root + "/cofferd.conf"
        try tools.writeFile(pinentry, """
            #!/bin/sh
            echo "OK bench pinentry"
            while IFS= read -r line; do
              case "$line" in
                GETPIN*) echo "D \(AgentBench.passcode)"; echo "OK";;
                BYE*) echo "OK"; exit 0;;
                *) echo "OK";;
              esac
            done

            """)
        chmod(pinentry, 0o700)
        // Its dialog's display (it opens none): named, since the agent shows dialogs only on logind's
        // session display or a configured one.
        try tools.writeFile(config, "pinentry = \(pinentry)\nprompt-display = :0\n")
        guard tools.spawn(binDir + "/cofferd", coffer.arguments + ["--config", config]) == 0 else { throw SecError(.io, "cofferd did not start") }
        cofferStarted = true
        let cofferSocket = coffer.path + "/ssh-agent.sock"
        guard Files.exists(cofferSocket) else { throw SecError(.io, "cofferd serves no ssh-agent socket at \(cofferSocket)") }

        let opensshSocket = root + "/openssh-agent.sock"
        children.pids.append(try Self.launch(openssh.agent, ["-D", "-a", opensshSocket], output: root + "/ssh-agent.log"))
        try Self.waitUntil("ssh-agent's socket", log: root + "/ssh-agent.log", pid: children.pids.last!) {
            (try? UnixSocket.connect(path: opensshSocket)).map { close($0); return true } ?? false
        }

        // The same keys in both agents, added as ssh-add adds them.
        progress("ssh bench: \(Self.keyCount) Ed25519 keys into both agents")
        let keys = (0..<Self.keyCount).map { _ in Ed25519.generateKeyPair() }
        let agents = [(name: "cofferd", socket: cofferSocket), (name: "ssh-agent", socket: opensshSocket)]
        for a in agents {
            let c = try Client(path: a.socket)
            for (i, k) in keys.enumerated() {
                let reply = try c.call(.addIdentity(.ed25519(publicKey: k.publicKey, secret: k.secretKey), comment: "bench-key-\(i + 1)", constraints: []))
                guard reply == .success else { throw SecError(.internalComponent, "\(a.name) refused key \(i + 1): \(reply)") }
            }
            guard case .identities(let ids) = try c.call(.requestIdentities), ids.count == Self.keyCount else {
                throw SecError(.internalComponent, "\(a.name) does not list the \(Self.keyCount) keys")
            }
        }

        // SIGN_REQUEST with the last key, as ssh signs a userauth request (its size: ~150 bytes).
        let last = keys[keys.count - 1]
        let blob = SSHWirePublicKey.ed25519(last.publicKey).blob
        var data = [UInt8](repeating: 0, count: 160)
        for i in data.indices { data[i] = UInt8(truncatingIfNeeded: i &* 37 &+ 11) }
        let signFrame = try SSHAgentRequest.signRequest(keyBlob: blob, data: data, flags: 0).encodeFrame()
        let clients = try agents.map { try Client(path: $0.socket) }
        let signatures = try clients.map { try $0.sign(signFrame) }
        guard signatures[0] == signatures[1], case .ed25519(let sig) = try SSHWireSignature(blob: signatures[0]),
              Ed25519.verify(signature: sig, message: data, publicKey: last.publicKey) else {
            throw SecError(.internalComponent, "the agents' signatures differ or do not verify")
        }

        progress("ssh bench: SIGN_REQUEST round trips")
        var persistent: [[UInt64]] = [[], []]
        for block in 0..<220 {
            for (i, c) in clients.enumerated() {
                for _ in 0..<100 {
                    let t0 = nowNanos()
                    _ = try c.sign(signFrame)
                    if block >= 20 { persistent[i].append(nowNanos() - t0) }
                }
            }
        }
        var fresh: [[UInt64]] = [[], []]
        for block in 0..<44 {
            for (i, a) in agents.enumerated() {
                for _ in 0..<50 {
                    let t0 = nowNanos()
                    _ = try Client(path: a.socket).sign(signFrame)
                    if block >= 4 { fresh[i].append(nowNanos() - t0) }
                }
            }
        }

        progress("ssh bench: ssh-add -l with \(Self.keyCount) keys")
        var listings: [[UInt64]] = [[], []], trues: [UInt64] = []
        for block in 0..<22 {
            for (i, a) in agents.enumerated() {
                setenv("SSH_AUTH_SOCK", a.socket, 1)
                for _ in 0..<10 {
                    let t0 = nowNanos()
                    let status = tools.spawn(openssh.add, ["-l"])
                    let dt = nowNanos() - t0
                    guard status == 0 else { throw SecError(.io, "ssh-add -l on \(a.name) failed (status \(status))") }
                    if block >= 2 { listings[i].append(dt) }
                }
            }
            for _ in 0..<10 {
                let t0 = nowNanos()
                _ = tools.spawn("/bin/true", [])
                if block >= 2 { trues.append(nowNanos() - t0) }
            }
        }

        progress("ssh bench: a protected keychain key inside its reuse window")
        let itemKeys = try protectedKeyTimings(nativeSocket: coffer.socket, sshSocket: cofferSocket)

        progress("ssh bench: ssh -T to a local sshd")
        let logins = try sshLogins(openssh: openssh, root: root, children: children, keys: keys.map { $0.publicKey }, agents: agents.map { $0.socket })
        unsetenv("SSH_AUTH_SOCK")
        children.stopAll()

        printTable(persistent: persistent, fresh: fresh, listings: listings, trues: trues, logins: logins, itemKeys: itemKeys)
    }

    /// Two Ed25519 keychain keys made in the agent (KEY_CREATE): one plain, one whose access control
    /// asks for the passcode with a 300 s reuse window. The protected key's first signature asks (the
    /// bench's pinentry answers); then SIGN_REQUEST round trips on one connection, alternating in
    /// blocks: [protected, plain].
    func protectedKeyTimings(nativeSocket: String, sshSocket: String) throws -> [[UInt64]] {
        let c = try AgentConnection(path: nativeSocket)
        try c.setPasscode(current: nil, new: secret(AgentBench.passcode))
        func make(_ label: String, _ extra: Attributes) throws -> [UInt8] {
            let made = try c.createKey(.generate, attributes: ["type": .integer(KeyItem.KeyType.ed25519.rawValue), "labl": .string(label)]
                                         .merging(extra) { $1 }, returning: .attributes)
            guard case .data(let blob)? = made?.attributes?[KeyItem.publicKeyAttribute] else {
                throw SecError(.internalComponent, "KEY_CREATE returned no public key")
            }
            return blob
        }
        let rule = AccessControl(factors: [.devicePasscode])!
        let protected = try make("bench protected", [AccessControl.attributeName: .data(rule.encoded()), KeyItem.reuseAttribute: .integer(300)])
        let plain = try make("bench plain", [:])
        var data = [UInt8](repeating: 0, count: 160)
        for i in data.indices { data[i] = UInt8(truncatingIfNeeded: i &* 31 &+ 7) }
        let frames = try [protected, plain].map { try SSHAgentRequest.signRequest(keyBlob: $0, data: data, flags: 0).encodeFrame() }
        let client = try Client(path: sshSocket)
        for f in frames { _ = try client.sign(f) }   // the protected key's one question
        var times: [[UInt64]] = [[], []]
        for block in 0..<22 {
            for (i, f) in frames.enumerated() {
                for _ in 0..<100 {
                    let t0 = nowNanos()
                    _ = try client.sign(f)
                    if block >= 2 { times[i].append(nowNanos() - t0) }
                }
            }
        }
        return times
    }

    /// `ssh -T … true` timings with each agent (alternating), or why there are none.
    enum Logins {
        case measured([[UInt64]])
        case skipped(String)
    }

    /// Starts sshd on a free loopback port (private config, host key and authorized_keys under `root`)
    /// and times `ssh -T` logins through each agent in `agents`. sshd stays in `children`.
    func sshLogins(openssh: OpenSSH, root: String, children: Children, keys: [[UInt8]], agents: [String]) throws -> Logins {
        guard let sshd = openssh.sshd, access(sshd, X_OK) == 0 else { return .skipped("no sshd (install openssh-server)") }
        guard sshd.hasPrefix("/") else { return .skipped("sshd must be run by an absolute path, not \(sshd)") }
        let dir = root + "/sshd"
        guard mkdir(dir, 0o700) == 0 else { throw SecError(.io, "mkdir \(dir)") }
        let keygen = try Self.launch(openssh.keygen, ["-q", "-t", "ed25519", "-N", "", "-C", "bench host", "-f", dir + "/host_ed25519"],
                                     output: dir + "/keygen.log")
        guard Self.wait(keygen) == 0 else { return .skipped("ssh-keygen could not make a host key: \(Self.firstLine(dir + "/keygen.log"))") }
        try tools.writeFile(dir + "/authorized_keys",
                            keys.map { SSHWirePublicKey.ed25519($0).authorizedKeysLine(comment: "bench") + "\n" }.joined())
        let port = try Self.freeLoopbackPort()
        let config = dir + "/sshd_config"
        try tools.writeFile(config, """
            ListenAddress 127.0.0.1
            Port \(port)
            HostKey \(dir)/host_ed25519
            AuthorizedKeysFile \(dir)/authorized_keys
            PidFile none
            StrictModes no
            UsePAM no
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            PubkeyAuthentication yes
            PermitRootLogin prohibit-password
            LogLevel ERROR

            """)
        let check = try Self.launch(sshd, ["-t", "-f", config], output: dir + "/sshd-check.log")
        let checked = Self.wait(check)
        guard checked == 0 else { return .skipped("sshd -t -f CONFIG failed (status \(checked)): \(Self.firstLine(dir + "/sshd-check.log"))") }
        let log = dir + "/sshd.log"
        let pid = try Self.launch(sshd, ["-D", "-e", "-f", config], output: log)
        children.pids.append(pid)
        do {
            try Self.waitUntil("sshd", log: log, pid: pid) { Self.tcpConnects(port: port) }
        } catch {
            return .skipped("\(error)")
        }
        let user = String(cString: getpwuid(getuid())!.pointee.pw_name)
        let args = ["-T", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                    "-o", "LogLevel=ERROR", "-p", "\(port)", "\(user)@127.0.0.1", "true"]
        var samples: [[UInt64]] = [[], []]
        for block in 0..<11 {
            for (i, socket) in agents.enumerated() {
                setenv("SSH_AUTH_SOCK", socket, 1)
                for _ in 0..<4 {
                    let t0 = nowNanos()
                    let status = tools.spawn(openssh.ssh, args)
                    let dt = nowNanos() - t0
                    guard status == 0 else { return .skipped("ssh through \(socket) failed (status \(status)): \(Self.firstLine(log))") }
                    if block >= 1 { samples[i].append(dt) }
                }
            }
        }
        return .measured(samples)
    }

    func printTable(persistent: [[UInt64]], fresh: [[UInt64]], listings: [[UInt64]], trues: [UInt64], logins: Logins, itemKeys: [[UInt64]]) {
        func m(_ xs: [UInt64]) -> Double { percentile(xs, 0.5) }
        func ratio(_ a: Double, _ b: Double) -> String { fixed(a / b, 2) + "×" }
        func target(_ bound: Double, _ a: Double, _ b: Double) -> String { "≤ \(fixed(bound, 1))×: " + (a <= bound * b ? "met" : "not met") }
        let us = tools.us, ms = tools.ms
        print("| measure | cofferd | ssh-agent (OpenSSH) | ratio | target |")
        print("|---|---:|---:|---:|---|")
        let p = persistent, f = fresh, l = listings
        print("| Ed25519 SIGN_REQUEST round trip, persistent connection, \(Self.keyCount) keys loaded: median (\(grouped(p[0].count)) each, alternating) "
              + "| \(us(m(p[0]))) | \(us(m(p[1]))) | \(ratio(m(p[0]), m(p[1]))) | \(target(1.5, m(p[0]), m(p[1]))) |")
        print("| SIGN_REQUEST round trip: p90 / p99 | \(us(percentile(p[0], 0.9))) / \(us(percentile(p[0], 0.99))) "
              + "| \(us(percentile(p[1], 0.9))) / \(us(percentile(p[1], 0.99))) | \(ratio(percentile(p[0], 0.9), percentile(p[1], 0.9))) at p90 | |")
        print("| connect + SIGN_REQUEST + close: median / p90 (\(grouped(f[0].count)) each) | \(us(m(f[0]))) / \(us(percentile(f[0], 0.9))) "
              + "| \(us(m(f[1]))) / \(us(percentile(f[1], 0.9))) | \(ratio(m(f[0]), m(f[1]))) | measured |")
        print("| `ssh-add -l` with \(Self.keyCount) keys, whole process: median (\(l[0].count) each) | \(ms(m(l[0]))) | \(ms(m(l[1]))) "
              + "| \(ratio(m(l[0]), m(l[1]))) | \(target(2, m(l[0]), m(l[1]))) |")
        print("| `ssh-add -l`: p90 | \(ms(percentile(l[0], 0.9))) | \(ms(percentile(l[1], 0.9))) | \(ratio(percentile(l[0], 0.9), percentile(l[1], 0.9))) | |")
        print("| ↳ `/bin/true` (process floor): median | \(ms(m(trues))) | | | |")
        switch logins {
        case .measured(let s):
            print("| `ssh -T` to a local sshd (key login, `true`): median (\(s[0].count) each, alternating) | \(ms(m(s[0]))) | \(ms(m(s[1]))) "
                  + "| \(ratio(m(s[0]), m(s[1]))) | \(target(1.1, m(s[0]), m(s[1]))) |")
            print("| `ssh -T`: p90 | \(ms(percentile(s[0], 0.9))) | \(ms(percentile(s[1], 0.9))) | \(ratio(percentile(s[0], 0.9), percentile(s[1], 0.9))) | |")
        case .skipped(let why):
            print("| `ssh -T` to a local sshd | – | – | – | ≤ 1.1×: skipped: \(why) |")
        }
        print("| keychain keys (cofferd only): a protected key inside its reuse window vs a plain one, SIGN_REQUEST median / p90 "
              + "(\(grouped(itemKeys[0].count)) each) | \(us(m(itemKeys[0]))) / \(us(percentile(itemKeys[0], 0.9))) "
              + "| plain: \(us(m(itemKeys[1]))) / \(us(percentile(itemKeys[1], 0.9))) | \(ratio(m(itemKeys[0]), m(itemKeys[1]))) "
              + "| \(target(1.2, m(itemKeys[0]), m(itemKeys[1]))) |")
        print("| ↳ a keychain key vs a key added with ssh-add (cofferd): median | \(us(m(itemKeys[1]))) | ssh-add key: \(us(m(p[0]))) "
              + "| \(ratio(m(itemKeys[1]), m(p[0]))) | measured |")
    }

    /// A connection to an ssh-agent socket speaking the agent protocol through the codec.
    final class Client {
        let fd: Int32
        init(path: String) throws { fd = try UnixSocket.connect(path: path) }
        deinit { close(fd) }

        func call(_ request: SSHAgentRequest) throws -> SSHAgentReply {
            var frame = try request.encodeFrame()
            defer { secureZero(&frame) }
            return try SSHAgentReply.decode(body: try exchange(frame))
        }

        /// Sends a SIGN_REQUEST frame; the signature blob.
        func sign(_ frame: [UInt8]) throws -> [UInt8] {
            guard case .signResponse(let blob) = try SSHAgentReply.decode(body: try exchange(frame)) else {
                throw SecError(.internalComponent, "the agent refused to sign")
            }
            return blob
        }

        private func exchange(_ frame: [UInt8]) throws -> [UInt8] {
            guard UnixSocket.writeAll(fd, frame), let prefix = UnixSocket.readExactly(fd, count: 4),
                  let body = UnixSocket.readExactly(fd, count: try SSHAgentFraming.bodyLength(prefix: prefix)) else {
                throw SecError(.io, "the agent closed the connection")
            }
            return body
        }
    }

    /// Starts `path ARGS` with stdout and stderr to `output`, stdin from /dev/null; its pid.
    static func launch(_ path: String, _ args: [String], output: String) throws -> pid_t {
        var pid: pid_t = 0
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        var cargs = ([path] + args).map { strdup($0) } + [nil]
        defer { for a in cargs { free(a) } }
        let rc = posix_spawn(&pid, path, &actions, nil, &cargs, environ)
        guard rc == 0 else { throw SecError(.io, "cannot start \(path): errno \(rc)") }
        return pid
    }

    /// Waits for `pid` to end: its exit status, or -1 if a signal ended it.
    static func wait(_ pid: pid_t) -> Int32 {
        var status: Int32 = 0
        guard waitpid(pid, &status, 0) == pid else { return -1 }
        return status & 0x7f == 0 ? (status >> 8) & 0xff : -1
    }

    /// Polls `ready` (every 10 ms, up to 20 s) while `pid` runs; throws with its log's first line if it ends or never gets ready.
    static func waitUntil(_ what: String, log: String, pid: pid_t, _ ready: () -> Bool) throws {
        for _ in 0..<2000 {
            if ready() { return }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid { throw SecError(.io, "\(what) exited: \(firstLine(log))") }
            usleep(10_000)
        }
        throw SecError(.io, "\(what) not ready after 20 s: \(firstLine(log))")
    }

    static func firstLine(_ path: String) -> String {
        let text = String(decoding: (try? Files.read(path)) ?? [], as: UTF8.self)
        return text.split(separator: "\n").first.map(String.init) ?? "(no output)"
    }

    /// `name` on PATH, then in /usr/sbin and /sbin.
    static func program(_ name: String) -> String? {
        let path = getenv("PATH").map { String(cString: $0) } ?? "/usr/bin:/bin"
        let dirs = path.split(separator: ":").map(String.init) + ["/usr/sbin", "/sbin"]
        return dirs.map { $0 + "/" + name }.first { access($0, X_OK) == 0 }
    }

    /// A TCP port on 127.0.0.1 nothing listens on now (the kernel's pick for an ephemeral bind).
    static func freeLoopbackPort() throws -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw SecError(.io, "socket: errno \(errno)") }
        defer { close(fd) }
        var addr = loopback(port: 0)
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
        }
        guard ok else { throw SecError(.io, "no free loopback port: errno \(errno)") }
        return UInt16(bigEndian: addr.sin_port)
    }

    /// Whether something accepts TCP connections on 127.0.0.1:`port`.
    static func tcpConnects(port: UInt16) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var addr = loopback(port: port)
        return withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }

    static func loopback(port: UInt16) -> sockaddr_in {
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = port.bigEndian
        addr.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        return addr
    }
}
