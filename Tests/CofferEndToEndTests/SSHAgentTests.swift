import CofferCrypto
import CofferSSHAgentProtocol
import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// OpenSSH's own client tools against cofferd's ssh-agent socket (issue #27): keys added with
/// `ssh-add` live in the agent's memory with ssh-agent's semantics.
@Suite(.enabled(if: SSHTools.available, "needs OpenSSH's ssh-add and ssh-keygen in /usr/bin (apt: openssh-client)"))
struct SSHAgentTests {
    /// A running agent, a private directory for keys and the environment that points OpenSSH at the agent.
    final class Fixture: @unchecked Sendable {
        let agent: AgentProcess
        let dir = TemporaryDirectory("coffer-ssh")
        var sshSocket: String { agent.dir.file("run/coffer/ssh-agent.sock") }

        init(extraArguments: [String] = []) throws {
            agent = try AgentProcess(extraArguments: extraArguments)
            #expect(SSHAgentTests.ready(agent), "the agent did not get ready: \(agent.log)")
        }

        /// A fixture around an agent started elsewhere (e.g. with signed apps' trust roots).
        init(agent: AgentProcess) {
            self.agent = agent
            #expect(SSHAgentTests.ready(agent), "the agent did not get ready: \(agent.log)")
        }

        /// Runs `/usr/bin/<tool>` (or `command`: another copy of it, or a sandbox running it) with
        /// SSH_AUTH_SOCK at the agent (and an askpass in ``dir`` answering `passphrase`).
        func run(_ tool: String, _ args: [String], passphrase: String? = nil, command: [String]? = nil) -> CLIResult {
            var env = ["SSH_AUTH_SOCK": sshSocket]
            if let passphrase {
                // The askpass program prints the file's contents: the passphrase never goes in argv or the environment.
                let file = dir.file("passphrase"), script = dir.file("askpass")
                _ = FileManager.default.createFile(atPath: file, contents: Data((passphrase + "\n").utf8), attributes: [.posixPermissions: 0o600])
                _ = FileManager.default.createFile(atPath: script, contents: Data("#!/bin/sh\nexec cat '\(file)'\n".utf8),
                                               attributes: [.posixPermissions: 0o700])
                env.merge(["SSH_ASKPASS": script, "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"]) { $1 }
            }
            let command = command ?? ["/usr/bin/" + tool]
            return runCLI(Array(command.dropFirst()) + args, environment: env, executable: command[0], unset: ["SSH_AGENT_PID"], timeout: 120)
        }

        /// Makes a key pair without a passphrase; returns the private key's path.
        func generate(_ type: String, name: String) -> String {
            let path = dir.file(name)
            let r = run("ssh-keygen", ["-q", "-t", type] + (type == "rsa" ? ["-b", "2048"] : []) + ["-N", "", "-C", "\(name)@test", "-f", path])
            #expect(r.status == 0, "ssh-keygen -t \(type): \(r)")
            return path
        }

        /// The SHA-256 fingerprint `ssh-keygen -lf` gives for a key file.
        func fingerprint(_ publicKey: String) -> String {
            let r = run("ssh-keygen", ["-lf", publicKey])
            return r.stdout.split(separator: " ").dropFirst().first.map(String.init) ?? "(none: \(r))"
        }

        /// The fingerprints `ssh-add -l` lists (empty when the agent has none).
        func listed() -> [String] {
            let r = run("ssh-add", ["-l"])
            guard r.status == 0 else { return [] }
            return r.stdout.split(separator: "\n").compactMap { $0.split(separator: " ").dropFirst().first.map(String.init) }
        }

        /// Signs `file` with the agent's key for `publicKey` (ssh-keygen -Y sign), then verifies the
        /// signature with an allowed_signers file naming that key; the verification's result.
        func signAndVerify(publicKey: String, file: String) -> (signed: CLIResult, verified: CLIResult?) {
            try? FileManager.default.removeItem(atPath: file + ".sig")
            let signed = run("ssh-keygen", ["-Y", "sign", "-f", publicKey, "-n", "file", file])
            guard signed.status == 0 else { return (signed, nil) }
            let allowed = dir.file("allowed_signers")
            let key = (try? String(contentsOfFile: publicKey, encoding: .utf8)) ?? ""
            try? "signer@test \(key)".write(toFile: allowed, atomically: true, encoding: .utf8)
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/usr/bin/ssh-keygen")
            p.arguments = ["-Y", "verify", "-f", allowed, "-I", "signer@test", "-n", "file", "-s", file + ".sig"]
            p.standardInput = FileHandle(forReadingAtPath: file)
            let out = Pipe()
            p.standardOutput = out
            p.standardError = out
            guard (try? p.run()) != nil else { return (signed, CLIResult(status: -1, stdout: "", stderr: "could not run ssh-keygen")) }
            let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            p.waitUntilExit()
            return (signed, CLIResult(status: p.terminationStatus, stdout: text, stderr: ""))
        }
    }

    @Test func keysAddedWithSSHAddAreListedSignAndGo() throws {
        let f = try Fixture()
        let empty = f.run("ssh-add", ["-l"])
        #expect(empty.status == 1 && empty.stdout.contains("no identities"), "\(empty)")

        let keys = ["ed25519", "ecdsa", "rsa"].map { ($0, f.generate($0, name: "id_\($0)")) }
        let added = f.run("ssh-add", keys.map(\.1))
        #expect(added.status == 0, "\(added)")
        let expected = keys.map { f.fingerprint($0.1 + ".pub") }
        #expect(f.listed() == expected)
        let full = f.run("ssh-add", ["-L"])
        #expect(full.status == 0)
        for (_, path) in keys {
            let line = try String(contentsOfFile: path + ".pub", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(full.stdout.split(separator: "\n").contains(Substring(line)), "ssh-add -L lacks \(line):\n\(full.stdout)")
        }

        // Only the agent can sign now.
        for (_, path) in keys { try FileManager.default.removeItem(atPath: path) }
        let document = f.dir.file("document")
        try "what was signed\n".write(toFile: document, atomically: true, encoding: .utf8)
        for (type, path) in keys {
            let (signed, verified) = f.signAndVerify(publicKey: path + ".pub", file: document)
            #expect(signed.status == 0, "\(type): \(signed)")
            #expect(verified?.status == 0 && verified?.stdout.contains("Good \"file\" signature") == true, "\(type): \(verified.map { "\($0)" } ?? "")")
        }
        // ssh-keygen asks for rsa-sha2-512, and the agent signs with it (never SHA-1 here).
        #expect(f.agent.log.contains("algorithm=rsa-sha2-512"), "\(f.agent.log)")
        #expect(!f.agent.log.contains("PRIVATE KEY"))

        // ssh-add -d removes one key (named by its public key), ssh-add -D the rest.
        let removed = f.run("ssh-add", ["-d", keys[0].1 + ".pub"])
        #expect(removed.status == 0, "\(removed)")
        #expect(f.listed() == Array(expected.dropFirst()))
        #expect(f.signAndVerify(publicKey: keys[0].1 + ".pub", file: document).signed.status != 0, "a removed key still signs")
        let all = f.run("ssh-add", ["-D"])
        #expect(all.status == 0, "\(all)")
        #expect(f.run("ssh-add", ["-l"]).status == 1)
        #expect(f.signAndVerify(publicKey: keys[2].1 + ".pub", file: document).signed.status != 0, "a removed key still signs")
        #expect(f.agent.log.contains("ssh-agent: removed all keys"))
    }

    @Test func lockHidesKeysUntilTheRightPassphrase() throws {
        // Every refusal logged (refused UNLOCKs are otherwise one line per log-repeat-interval): the
        // count of wrong passphrases in a row is read from the second one's line.
        let conf = TemporaryDirectory("coffer-sshlock")
        try "log-repeat-interval = 0\n".write(toFile: conf.file("cofferd.conf"), atomically: true, encoding: .utf8)
        let f = try Fixture(extraArguments: ["--config", conf.file("cofferd.conf")])
        let key = f.generate("ed25519", name: "id_lock")
        let other = f.generate("ecdsa", name: "id_other")
        #expect(f.run("ssh-add", [key]).status == 0)
        let fingerprint = f.fingerprint(key + ".pub")
        try FileManager.default.removeItem(atPath: key)   // only the agent can sign

        let locked = f.run("ssh-add", ["-x"], passphrase: "lock me")
        #expect(locked.status == 0, "\(locked)")
        #expect(f.run("ssh-add", ["-l"]).status == 1, "a locked agent lists no keys")
        #expect(f.run("ssh-add", [other]).status != 0, "a locked agent takes no keys")
        let document = f.dir.file("document")
        try "x\n".write(toFile: document, atomically: true, encoding: .utf8)
        #expect(f.signAndVerify(publicKey: key + ".pub", file: document).signed.status != 0, "a locked agent signed")
        #expect(f.run("ssh-add", ["-x"], passphrase: "again").status != 0, "locked twice")

        let wrong = f.run("ssh-add", ["-X"], passphrase: "not it")
        #expect(wrong.status != 0, "\(wrong)")
        #expect(f.run("ssh-add", ["-l"]).status == 1, "a wrong passphrase unlocked")
        // Each wrong passphrase in a row waits longer (0.1 s more each), as OpenSSH's agent does.
        let fd = try Self.connect(f)
        defer { close(fd) }
        #expect(Self.exchange(fd, try SSHAgentRequest.requestIdentities.encodeFrame()) == .identities([]))  // identified, served
        let started = Date()
        #expect(Self.exchange(fd, try SSHAgentRequest.unlock(passphrase: SecureBytes(count: 5)).encodeFrame()) == .failure)
        #expect(Date().timeIntervalSince(started) >= 0.2, "the second wrong passphrase in a row was answered without a delay")
        #expect(f.agent.log.contains("failures=2 pid=\(getpid())"), "\(f.agent.log)")
        let unlocked = f.run("ssh-add", ["-X"], passphrase: "lock me")
        #expect(unlocked.status == 0, "\(unlocked)")
        #expect(f.listed() == [fingerprint])
        #expect(f.signAndVerify(publicKey: key + ".pub", file: document).verified?.status == 0)
        #expect(!f.agent.log.contains("lock me") && !f.agent.log.contains("not it"), "a passphrase reached the log")
    }

    @Test func aKeyWithALifetimeGoesAndAnUnenforceableConstraintIsRefused() throws {
        let f = try Fixture()
        let key = f.generate("ed25519", name: "id_short")
        // A lifetime a loaded machine (ASan, TSan on 2 cores) cannot run out between the add and the
        // listing that follows it.
        let added = f.run("ssh-add", ["-t", "6", key])
        #expect(added.status == 0, "\(added)")
        #expect(f.listed() == [f.fingerprint(key + ".pub")])
        let deadline = Date().addingTimeInterval(40)
        var gone = false
        while Date() < deadline {
            // Gone from the list, and from memory (the agent's timer drops it and says so).
            if f.run("ssh-add", ["-l"]).status == 1 && f.agent.log.contains("lifetime ended") { gone = true; break }
            usleep(200_000)
        }
        #expect(gone, "the key outlived its lifetime")

        // A constraint this agent cannot enforce (max-signatures): the key is refused, not added without it.
        let fd = try Self.connect(f)
        defer { close(fd) }
        let pair = Ed25519.keyPair(seed: SecureBytes.random(count: Ed25519.seedBytes))
        let limited = SSHWirePrivateKey.ed25519(publicKey: pair.publicKey, secret: pair.secretKey)
        #expect(Self.exchange(fd, try SSHAgentRequest.addIdentity(limited, comment: "limited", constraints: [.maxSignatures(5)]).encodeFrame())
                == .failure)
        #expect(f.run("ssh-add", ["-l"]).status == 1, "a key meant to sign at most 5 times was added without the limit")
        #expect(f.agent.log.contains("constraint=max-signatures"))
    }

    /// The default place taken by another agent (one whose native socket is in the same directory):
    /// this agent starts without an ssh-agent socket and says so; a path named in the configuration
    /// that is taken stops the agent instead.
    @Test func aTakenSSHSocketIsSkippedAtTheDefaultPlaceAndFatalWhenConfigured() throws {
        let agent = try AgentProcess(start: false)
        let runDir = agent.dir.file("run/coffer")
        try FileManager.default.createDirectory(atPath: runDir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        // "Another agent": a live listener of this user where the new agent's default would go.
        let taken = try UnixSocket.listen(path: runDir + "/ssh-agent.sock")
        defer { close(taken) }
        try agent.start()
        #expect(Self.ready(agent), "\(agent.log)")
        #expect(agent.log.contains("no ssh-agent socket"), "\(agent.log)")
        #expect(agent.cli(["status"]).status == 0, "the native socket serves")
        _ = agent.stop()
        #expect(FileManager.default.fileExists(atPath: runDir + "/ssh-agent.sock"), "the agent removed a socket it did not make")

        let configured = try AgentProcess(extraArguments: ["--ssh-agent-socket", runDir + "/ssh-agent.sock"], start: false)
        #expect(throws: (any Error).self) { try configured.start() }
        #expect(configured.log.contains("another agent is listening"), "\(configured.log)")
    }

    @Test func socketSettings() throws {
        let f = try Fixture()
        var st = stat()
        #expect(stat(f.sshSocket, &st) == 0 && st.st_mode & 0o777 == 0o600, "the ssh-agent socket is not 0600")

        let off = try AgentProcess(extraArguments: ["--ssh-agent-socket", "none"])
        #expect(Self.ready(off))
        #expect(!FileManager.default.fileExists(atPath: off.dir.file("run/coffer/ssh-agent.sock")))
        #expect(off.log.contains("ssh-agent-socket=none"))

        let conf = TemporaryDirectory("coffer-ssh-conf")
        let elsewhere = conf.file("elsewhere/ssh.sock")
        try "ssh-agent-socket = \(elsewhere)\n".write(toFile: conf.file("cofferd.conf"), atomically: true, encoding: .utf8)
        let moved = try AgentProcess(extraArguments: ["--config", conf.file("cofferd.conf")])
        #expect(Self.ready(moved))
        #expect(FileManager.default.fileExists(atPath: elsewhere))
        #expect(!FileManager.default.fileExists(atPath: moved.dir.file("run/coffer/ssh-agent.sock")))
        let r = runCLI(["-l"], environment: ["SSH_AUTH_SOCK": elsewhere], executable: "/usr/bin/ssh-add")
        #expect(r.status == 1 && r.stdout.contains("no identities"), "\(r)")
        moved.stop()
        #expect(!FileManager.default.fileExists(atPath: elsewhere), "the socket outlived the agent")
    }

    /// Waits (up to 30 s) for the agent's "agent ready" line (the ssh-agent socket opens before the
    /// native one the harness waits for; this also waits for the rest of the start-up).
    static func ready(_ agent: AgentProcess) -> Bool {
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if agent.log.contains("agent ready") { return true }
            usleep(20_000)
        }
        return false
    }

    // MARK: Raw frames

    /// A connection to the ssh-agent socket with generous timeouts (the agent identifies this process first).
    static func connect(_ f: Fixture) throws -> Int32 {
        let fd = try UnixSocket.connect(path: f.sshSocket)
        UnixSocket.setTimeouts(fd, send: 60, receive: 60)
        return fd
    }

    /// Sends `request` and decodes the reply (nil: the connection closed or the reply is malformed).
    static func exchange(_ fd: Int32, _ frame: [UInt8]) -> SSHAgentReply? {
        guard UnixSocket.writeAll(fd, frame), let reply = ConnectionLimitTests.readFrame(fd) else { return nil }
        return try? SSHAgentReply.decode(frame: reply)
    }

    static func frame(_ body: [UInt8]) -> [UInt8] {
        let n = UInt32(body.count)
        return [UInt8(n >> 24), UInt8(n >> 16 & 0xff), UInt8(n >> 8 & 0xff), UInt8(n & 0xff)] + body
    }

    @Test func malformedMessagesGetFailureAndBadFramesCloseTheConnection() throws {
        let f = try Fixture()
        let fd = try Self.connect(f)
        defer { close(fd) }
        // Well framed, malformed or unsupported: FAILURE, and the connection goes on.
        let failing: [[UInt8]] = [
            [SSHAgentMessageType.signRequest, 0, 0, 0, 9, 1],                 // truncated SIGN_REQUEST
            [SSHAgentMessageType.addIdentity, 0, 0, 0, 11] + Array("ssh-ed25519".utf8),  // a key cut short
            [SSHAgentMessageType.requestIdentities, 0],                       // a trailing byte
            [200, 1, 2, 3],                                                    // unknown type
            SSHAgentRequest.addSmartcardKey(provider: "/usr/lib/opensc-pkcs11.so", pin: .init(count: 4), constraints: []).encodeBody(),
            SSHAgentRequest.extension(.other(name: "unknown@example.com", contents: [1, 2])).encodeBody(),
            SSHAgentRequest.unlock(passphrase: .init(count: 3)).encodeBody(),  // not locked
        ]
        for body in failing {
            #expect(Self.exchange(fd, Self.frame(body)) == .failure, "\(body.prefix(8))")
        }
        #expect(Self.exchange(fd, try SSHAgentRequest.extension(.query).encodeFrame())
                == .queryResponse(["query", "session-bind@openssh.com"]))
        // Random bodies: every one is answered with a well-formed reply.
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<200 {
            let body = (0..<Int.random(in: 1...64, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            // A lone REMOVE_ALL or REQUEST_IDENTITIES is a valid request; anything else fails.
            #expect(Self.exchange(fd, Self.frame(body)) != nil, "no reply to \(body)")
        }
        #expect(Self.exchange(fd, Self.frame([SSHAgentMessageType.requestIdentities])) == .identities([]))

        // Frame-level violations close the connection: a length past 256 KiB, a zero length.
        for header: [UInt8] in [[0xff, 0xff, 0xff, 0xff], [0, 4, 0, 1], [0, 0, 0, 0]] {
            let c = try Self.connect(f)
            defer { close(c) }
            #expect(UnixSocket.writeAll(c, header))
            #expect(ConnectionLimitTests.closedByAgent(c, within: 30), "\(header) did not close the connection")
        }
        // A truncated frame, then the client goes; and a stream of random bytes.
        do {
            let c = try Self.connect(f)
            #expect(UnixSocket.writeAll(c, [0, 0, 0, 100, SSHAgentMessageType.signRequest, 0, 0]))
            close(c)
            let d = try Self.connect(f)
            _ = UnixSocket.writeAll(d, (0..<4096).map { _ in UInt8.random(in: 0...255) })
            close(d)
        }
        // The agent still serves.
        let r = f.run("ssh-add", ["-l"])
        #expect(r.status == 1 && r.stdout.contains("no identities"), "\(r)")
        #expect(f.agent.process?.isRunning == true)
    }

    @Test func theAgentHoldsAtMost256Keys() throws {
        let f = try Fixture()
        let fd = try Self.connect(f)
        defer { close(fd) }
        func add(_ comment: String) throws -> SSHAgentReply? {
            let seed = SecureBytes.random(count: Ed25519.seedBytes)
            let pair = Ed25519.keyPair(seed: seed)
            let key = SSHWirePrivateKey.ed25519(publicKey: pair.publicKey, secret: pair.secretKey)
            return Self.exchange(fd, try SSHAgentRequest.addIdentity(key, comment: comment, constraints: []).encodeFrame())
        }
        for n in 1...256 { #expect(try add("key \(n)") == .success, "key \(n)") }
        #expect(try add("one too many") == .failure)
        guard case .identities(let ids)? = Self.exchange(fd, try SSHAgentRequest.requestIdentities.encodeFrame()) else {
            Issue.record("no identities"); return
        }
        #expect(ids.count == 256 && !ids.contains { $0.comment == "one too many" })
        // ssh-add -D makes room again.
        #expect(f.run("ssh-add", ["-D"]).status == 0)
        #expect(try add("after -D") == .success)
    }

    @Test(.enabled(if: getuid() == 0, "reading another process's memory needs root"))
    func removedKeysAndTheLockPassphraseLeaveNoSecretInTheAgentsMemory() throws {
        let f = try Fixture()
        let fd = try Self.connect(f)
        defer { close(fd) }
        let seeds = (0..<2).map { _ in SecureBytes.random(count: Ed25519.seedBytes) }
        var blobs: [[UInt8]] = []
        for seed in seeds {
            let pair = Ed25519.keyPair(seed: seed)
            let key = SSHWirePrivateKey.ed25519(publicKey: pair.publicKey, secret: pair.secretKey)
            #expect(Self.exchange(fd, try SSHAgentRequest.addIdentity(key, comment: "memory", constraints: []).encodeFrame()) == .success)
            blobs.append(key.publicKey.blob)
            guard case .signResponse? = Self.exchange(fd, try SSHAgentRequest.signRequest(keyBlob: key.publicKey.blob, data: [1, 2, 3], flags: 0)
                .encodeFrame()) else { Issue.record("no signature"); return }
        }
        let plain = seeds.map { $0.withUnsafeBytes { Array($0) } }
        // Sanity: the scan reaches the keys while the agent holds them.
        let before = MemoryHygieneTests.memory(of: f.agent.pid)
        #expect(!before.isEmpty, "could not read the agent's memory")
        #expect(plain.allSatisfy { seed in before.contains { containsSubsequenceFast($0, seed) } }, "the scan does not reach the keys")

        // One removed by REMOVE_IDENTITY, the other by REMOVE_ALL_IDENTITIES (ssh-add -d, ssh-add -D).
        #expect(Self.exchange(fd, SSHAgentRequest.removeIdentity(keyBlob: blobs[0]).encodeBody().framed) == .success)
        #expect(f.run("ssh-add", ["-D"]).status == 0)
        let after = MemoryHygieneTests.memory(of: f.agent.pid)
        for (n, seed) in plain.enumerated() {
            #expect(!after.contains { containsSubsequenceFast($0, seed) }, "key \(n)'s seed is still in the agent's memory after removal")
        }

        // A locked agent keeps a hash of its passphrase, not the passphrase.
        let marker = Array("LOCK-PASSPHRASE-\(UUID().uuidString)".utf8)
        let passphrase = marker.withUnsafeBytes { SecureBytes(copying: $0) }
        #expect(Self.exchange(fd, SSHAgentRequest.lock(passphrase: passphrase).encodeBody().framed) == .success)
        #expect(!MemoryHygieneTests.memory(of: f.agent.pid).contains { containsSubsequenceFast($0, marker) },
                "the lock passphrase is in the agent's memory")
        #expect(Self.exchange(fd, SSHAgentRequest.unlock(passphrase: passphrase).encodeBody().framed) == .success)
    }

    @Test func sessionBindIsVerifiedAndRecorded() throws {
        let f = try Fixture()
        let key = f.generate("ed25519", name: "id_host")
        #expect(f.run("ssh-add", [key]).status == 0)
        let fd = try Self.connect(f)
        defer { close(fd) }
        guard case .identities(let ids)? = Self.exchange(fd, try SSHAgentRequest.requestIdentities.encodeFrame()), let host = ids.first else {
            Issue.record("no identity listed"); return
        }
        // The agent's own key plays the host key: it signs the session identifier.
        let session = (0..<32).map { _ in UInt8.random(in: 0...255) }
        guard case .signResponse(let signature)? = Self.exchange(fd, try SSHAgentRequest.signRequest(keyBlob: host.keyBlob, data: session, flags: 0)
            .encodeFrame()) else { Issue.record("no signature"); return }
        let bind = SSHSessionBind(hostKey: host.keyBlob, sessionIdentifier: session, signature: signature, isForwarding: true)
        #expect(Self.exchange(fd, try SSHAgentRequest.extension(.sessionBind(bind)).encodeFrame()) == .success)
        var forged = bind
        forged.sessionIdentifier[0] ^= 1
        #expect(Self.exchange(fd, try SSHAgentRequest.extension(.sessionBind(forged)).encodeFrame()) == .failure, "a bad signature was accepted")
        // The same bind again is accepted (and recorded once).
        #expect(Self.exchange(fd, try SSHAgentRequest.extension(.sessionBind(bind)).encodeFrame()) == .success)
        // A connection records at most 16 forwarding hops (OpenSSH's limit); a new connection starts afresh.
        func signedBind(_ n: UInt8, forwarding: Bool = true) throws -> SSHSessionBind {
            let sid = [n] + [UInt8](repeating: 0xA5, count: 31)  // distinct from each other and (but for 2^-256) from `session`
            guard case .signResponse(let sig)? = Self.exchange(fd, try SSHAgentRequest.signRequest(keyBlob: host.keyBlob, data: Array(sid), flags: 0)
                .encodeFrame()) else { throw CocoaError(.featureUnsupported) }
            return SSHSessionBind(hostKey: host.keyBlob, sessionIdentifier: Array(sid), signature: sig, isForwarding: forwarding)
        }
        for n in 2...16 {
            #expect(Self.exchange(fd, try SSHAgentRequest.extension(.sessionBind(try signedBind(UInt8(n)))).encodeFrame()) == .success, "bind \(n)")
        }
        #expect(Self.exchange(fd, try SSHAgentRequest.extension(.sessionBind(try signedBind(17))).encodeFrame()) == .failure, "a 17th bind")
        let fresh = try Self.connect(f)
        defer { close(fresh) }
        // A bind for authentication (not a forwarding) is the last: OpenSSH refuses any bind after it.
        let authentication = try signedBind(18, forwarding: false)
        #expect(Self.exchange(fresh, try SSHAgentRequest.extension(.sessionBind(authentication)).encodeFrame()) == .success)
        #expect(Self.exchange(fresh, try SSHAgentRequest.extension(.sessionBind(bind)).encodeFrame()) == .failure, "a bind after authentication")
    }
}

extension Array where Element == UInt8 {
    /// This message body behind its length prefix.
    var framed: [UInt8] { SSHAgentTests.frame(self) }
}

enum SSHTools {
    static let available = ["/usr/bin/ssh-add", "/usr/bin/ssh-keygen"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
}
