import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// cofferd's ssh-agent socket under OpenSSH's own programs beyond ssh-add (issue #27): `ssh` logging
/// in to an `sshd` this test starts, git signing commits with `gpg.format ssh`, another uid refused,
/// and OpenSSH's own regression scripts for the agent (contrib/ssh-regress.sh).
@Suite(.enabled(if: SSHTools.available, "needs OpenSSH's ssh-add and ssh-keygen in /usr/bin (apt: openssh-client)"))
struct SSHOpenSSHTests {
    /// Logs in to a private sshd with the key only the agent holds, for each key type; after
    /// `ssh-add -D` the same login is refused. ssh binds the agent to the session
    /// (`session-bind@openssh.com`): the agent verified the host's signature and said SUCCESS, which
    /// ssh reports as "bound agent to hostkey".
    @Test(.enabled(if: SSHDaemon.available, "needs /usr/sbin/sshd (apt: openssh-server)"),
          .enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: OpenSSH's programs do most of the work, and CI's 30 minutes are short"))
    func sshLogsInWithTheAgentsKeyAndBindsTheSession() throws {
        let f = try SSHAgentTests.Fixture()
        let keys = ["ed25519", "ecdsa", "rsa"].map { ($0, f.generate($0, name: "id_\($0)")) }
        let sshd = try SSHDaemon(authorizedKeys: try keys.map { try String(contentsOfFile: $0.1 + ".pub", encoding: .utf8) })
        for (type, key) in keys {
            #expect(f.run("ssh-add", [key]).status == 0)
            try FileManager.default.removeItem(atPath: key)   // only the agent can sign
            let fingerprint = f.fingerprint(key + ".pub")
            let r = f.run("ssh", sshd.clientArguments(in: f.dir) + ["true"])
            #expect(r.status == 0, "\(type): ssh through the agent failed: \(r)\nsshd: \(sshd.log.suffix(3000))")
            #expect(r.stderr.contains("bound agent to hostkey"), "\(type): the agent did not accept the session-bind: \(r.stderr.suffix(3000))")
            // The server saw this key, and the agent signed with it for ssh.
            #expect(Self.hasLine(sshd.log, "Accepted publickey for \(SSHDaemon.user)", fingerprint),
                    "\(type): sshd did not accept \(fingerprint): \(sshd.log.suffix(3000))")
            #expect(Self.hasLine(f.agent.log, "ssh-agent: signed", "key=\(fingerprint)"), "\(type): \(f.agent.log.suffix(2000))")
            #expect(f.run("ssh-add", ["-D"]).status == 0)
            let refused = f.run("ssh", sshd.clientArguments(in: f.dir) + ["true"])
            #expect(refused.status == 255 && refused.stderr.contains("Permission denied"),
                    "\(type): logged in with no key in the agent: \(refused)")
        }
        // An RSA key signs the login with SHA-512 (ssh asks for rsa-sha2-512; never SHA-1).
        #expect(f.agent.log.contains("algorithm=rsa-sha2-512"), "\(f.agent.log.suffix(3000))")
        #expect(!f.agent.log.contains("algorithm=ssh-rsa"), "an RSA login was signed with SHA-1")
    }

    /// Issue #43: user certificates work as with OpenSSH's agent. `ssh-add` of a key beside its
    /// `-cert.pub` adds both; `ssh-add -l` lists the certificate; `ssh` logs in to an sshd that
    /// trusts only the CA (no authorized key), the agent signing with the certified key; after
    /// `ssh-add -D` the login is refused. For each key type.
    @Test(.enabled(if: SSHDaemon.available, "needs /usr/sbin/sshd (apt: openssh-server)"),
          .enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: OpenSSH's programs do most of the work, and CI's 30 minutes are short"))
    func aUserCertificateLogsInThroughTheAgent() throws {
        let f = try SSHAgentTests.Fixture()
        let ca = f.generate("ed25519", name: "user_ca")
        let sshd = try SSHDaemon(authorizedKeys: [], trustedUserCAKeys: ca + ".pub")
        for type in ["ed25519", "ecdsa", "rsa"] {
            let key = f.generate(type, name: "id_cert_\(type)")
            let signed = f.run("ssh-keygen", ["-q", "-s", ca, "-I", "coffer-\(type)", "-n", SSHDaemon.user, "-V", "-5m:+1h", key + ".pub"])
            #expect(signed.status == 0, "ssh-keygen -s: \(signed)")
            let added = f.run("ssh-add", [key])
            #expect(added.status == 0 && added.stderr.contains("Certificate added"), "\(type): \(added)\n\(f.agent.log.suffix(2000))")
            try FileManager.default.removeItem(atPath: key)   // only the agent can sign
            let listed = f.run("ssh-add", ["-l"])
            #expect(listed.stdout.contains("-CERT)"), "\(type): \(listed)")
            let certificate = try String(contentsOfFile: key + "-cert.pub", encoding: .utf8)
            let blob = certificate.split(separator: " ").dropFirst().first.map(String.init) ?? "?"
            #expect(f.run("ssh-add", ["-L"]).stdout.contains(blob), "the certificate is listed as it is")
            let r = f.run("ssh", sshd.clientArguments(in: f.dir) + ["true"])
            #expect(r.status == 0, "\(type): ssh with the agent's certificate failed: \(r.stderr.suffix(2000))\nsshd: \(sshd.log.suffix(3000))")
            #expect(Self.hasLine(sshd.log, "Accepted publickey for \(SSHDaemon.user)", "-CERT") && sshd.log.contains("ID coffer-\(type)"),
                    "\(type): sshd did not accept the certificate: \(sshd.log.suffix(3000))")
            #expect(f.run("ssh-add", ["-D"]).status == 0)
            let refused = f.run("ssh", sshd.clientArguments(in: f.dir) + ["true"])
            #expect(refused.status == 255 && refused.stderr.contains("Permission denied"), "\(type): logged in with no key in the agent: \(refused)")
        }
    }

    /// git signs a commit with the agent's key (`gpg.format ssh`, the signing key named by its public
    /// key), `git verify-commit` accepts it with an allowed-signers file naming that key, and refuses
    /// it when the file names another key or the commit was altered; with the key gone from the
    /// agent, `git commit -S` fails.
    @Test(.enabled(if: GitRun.available, "needs /usr/bin/git"), .enabled(if: !SSHOpenSSHTests.sanitized, "the plain (unsanitized) run only: OpenSSH's programs do most of the work, and CI's 30 minutes are short"))
    func gitSignsCommitsThroughTheAgent() throws {
        let f = try SSHAgentTests.Fixture()
        let key = f.generate("ed25519", name: "id_git")
        let other = f.generate("ed25519", name: "id_other")
        #expect(f.run("ssh-add", [key]).status == 0)
        try FileManager.default.removeItem(atPath: key)
        let publicKey = try String(contentsOfFile: key + ".pub", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let otherKey = try String(contentsOfFile: other + ".pub", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let home = TemporaryDirectory("coffer-git-ssh")
        let repo = home.file("repo")
        let allowed = home.file("allowed_signers")
        func git(_ args: [String], stdin: String? = nil) -> CLIResult {
            var env = GitRun.environment(home: home)
            env["SSH_AUTH_SOCK"] = f.sshSocket
            return runCLI(["-C", repo, "-c", "gpg.format=ssh", "-c", "user.signingkey=key::\(publicKey)",
                           "-c", "gpg.ssh.allowedSignersFile=\(allowed)", "-c", "user.name=Signer", "-c", "user.email=signer@example.com"] + args,
                          stdin: stdin, environment: env, executable: "/usr/bin/git", unset: ["SSH_AGENT_PID"], timeout: 120)
        }
        #expect(runCLI(["init", "-q", repo], environment: GitRun.environment(home: home), executable: "/usr/bin/git").status == 0)
        let committed = git(["commit", "-q", "-S", "--allow-empty", "-m", "signed through cofferd"])
        #expect(committed.status == 0, "git commit -S: \(committed)\n\(f.agent.log.suffix(2000))")
        #expect(Self.hasLine(f.agent.log, "ssh-agent: signed", "key=\(f.fingerprint(key + ".pub"))"), "\(f.agent.log.suffix(2000))")

        try "signer@example.com \(publicKey)\n".write(toFile: allowed, atomically: true, encoding: .utf8)
        let verified = git(["verify-commit", "HEAD"])
        #expect(verified.status == 0 && verified.stderr.contains("Good \"git\" signature for signer@example.com"), "\(verified)")

        // The same commit, its message changed: the signature no longer matches.
        let object = git(["cat-file", "commit", "HEAD"]).stdout
        let forged = git(["hash-object", "-t", "commit", "-w", "--stdin"], stdin: object.replacingOccurrences(of: "signed through", with: "forged past"))
        #expect(forged.status == 0, "\(forged)")
        let tampered = git(["verify-commit", forged.stdout.trimmingCharacters(in: .whitespacesAndNewlines)])
        #expect(tampered.status != 0 && !tampered.stderr.contains("Good"), "an altered commit verified: \(tampered)")

        // Only another key allowed: refused.
        try "signer@example.com \(otherKey)\n".write(toFile: allowed, atomically: true, encoding: .utf8)
        let wrongKey = git(["verify-commit", "HEAD"])
        // (git still reports the signature as well formed, but its key belongs to no allowed signer.)
        #expect(wrongKey.status != 0 && !wrongKey.stderr.contains("signature for signer@example.com") && wrongKey.stderr.contains("No principal matched"),
                "verified with another key allowed: \(wrongKey)")

        // The key gone from the agent (and its file gone): nothing can sign.
        #expect(f.run("ssh-add", ["-D"]).status == 0)
        let unsigned = git(["commit", "-q", "-S", "--allow-empty", "-m", "no key"])
        #expect(unsigned.status != 0, "git signed a commit with no key in the agent: \(unsigned)")
    }

    /// A process of another uid connecting to the ssh-agent socket is refused by the agent itself:
    /// the socket and its directories are opened to everyone first, so only the agent's peer check
    /// stands in the way (the uid the same test process then uses is served).
    @Test(.enabled(if: getuid() == 0, "running ssh-add as another user needs root"))
    func anotherUIDIsRefused() throws {
        let f = try SSHAgentTests.Fixture()
        let key = f.generate("ed25519", name: "id_mine")
        #expect(f.run("ssh-add", [key]).status == 0)
        let publicKey = try String(contentsOfFile: key + ".pub", encoding: .utf8).split(separator: " ").prefix(2).joined(separator: " ")
        var dir = Files.directoryName(f.sshSocket)
        while dir.hasPrefix(f.agent.dir.path) {
            chmod(dir, 0o755)
            dir = Files.directoryName(dir)
        }
        chmod(f.sshSocket, 0o666)
        // What `nobody` needs (the public key, a place for the signature) is in a directory it can
        // reach: the test's own directories may sit under one it cannot traverse.
        let shared = try SharedDirectory("coffer-ssh-uid")
        let nobody = try #require(getpwnam("nobody"))
        let den = try shared.privateDirectory("den", uid: nobody.pointee.pw_uid, gid: nobody.pointee.pw_gid)
        try FileManager.default.copyItem(atPath: key + ".pub", toPath: den + "/key.pub")
        try "a document\n".write(toFile: den + "/document", atomically: true, encoding: .utf8)
        _ = runShell("chown nobody '\(den)/key.pub' '\(den)/document'", socket: "")
        func asNobody(_ command: String) -> CLIResult {
            runCLI(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "/bin/sh", "-c", command],
                   environment: ["SSH_AUTH_SOCK": f.sshSocket], executable: "/usr/bin/setpriv", unset: ["SSH_AGENT_PID"], timeout: 120)
        }
        let listed = asNobody("exec /usr/bin/ssh-add -L")
        #expect(listed.status != 0 && !listed.stdout.contains(publicKey), "another uid was served: \(listed)")
        let signed = asNobody("cd '\(den)' && exec /usr/bin/ssh-keygen -Y sign -f key.pub -n file document")
        #expect(signed.status != 0 && !FileManager.default.fileExists(atPath: den + "/document.sig"), "another uid got a signature: \(signed)")
        let deadline = Date().addingTimeInterval(30)
        while !f.agent.log.contains("refused a connection from another user") && Date() < deadline { usleep(20_000) }
        #expect(f.agent.log.contains("refused a connection from another user"), "\(f.agent.log.suffix(3000))")
        #expect(!f.agent.log.contains("ssh-agent: signed"))
        // The agent's own user, through the same opened socket, is served.
        let mine = f.run("ssh-add", ["-L"])
        #expect(mine.status == 0 && mine.stdout.contains(publicKey), "\(mine)")
    }

    // MARK: OpenSSH's regression scripts

    /// What each of OpenSSH's agent scripts does with cofferd as the agent, and why when it is not a
    /// plain pass (contrib/ssh-regress.md explains the same). A failure not listed here fails the
    /// test; a listed one that no longer happens fails it too, so the list stays true.
    enum RegressOutcome {
        case pass
        /// Fails exactly with these "[step] message" failures (the harness's form), each for its reason.
        case knownFailures([String: String])
        /// The script skips itself here; the reason, and what tests its property instead.
        case notApplicable(String)
    }

    static let noDSA = "cofferd holds no DSA keys (ssh-dss): issue #27 names ed25519, ECDSA and RSA; OpenSSH deprecated DSA "
        + "(off by default since 7.0, gone in 10.0), and its scripts still loop over every type `ssh -Q key-plain` lists"

    /// With FIDO keys (contrib/sk-dummy.sh built OpenSSH's sk-dummy, and the scripts' loops include the
    /// two sk-* key types, which cofferd serves: `FIDO-KEYS yes`), agent-timeout.sh counts two keys more.
    static func regressOutcomes(fido: Bool) -> [String: RegressOutcome] {
        var outcomes = regressOutcomes
        if fido {
            outcomes["agent-timeout"] = .knownFailures([
                "[add keys with timeout] ssh-add did succeed exit code 0": noDSA,
                "[agent has 7 keys] ssh-add -l did not return 8 keys: 7": noDSA,
            ])
        }
        return outcomes
    }

    static let regressOutcomes: [String: RegressOutcome] = [
        "agent": .knownFailures([
            "[overwrite authorized keys] ssh-add failed exit code 0": noDSA,
            "[connect via agent using ssh-dss key] ssh connect with failed (exit code 255)": noDSA,
            "[readd keys] ssh-add failed exit code 1": noDSA,
        ]),
        "agent-getpeereid": .notApplicable("it runs only as a non-root user with sudo to become `nobody` (as root it skips: root may "
            + "connect anyway; without sudo it cannot switch users); SSHOpenSSHTests.anotherUIDIsRefused checks the same refusal "
            + "with ssh-add and ssh-keygen run as nobody"),
        "agent-timeout": .knownFailures([
            "[add keys with timeout] ssh-add did succeed exit code 0": noDSA,
            "[agent has 5 keys] ssh-add -l did not return 6 keys: 5": noDSA,
        ]),
        // Every step passes, host_d's and host_e's host certificates under an @cert-authority hop included.
        "agent-restrict": .pass,
        "agent-ptrace": .notApplicable("it runs only as a non-root user with sudo (it makes the setgid ssh-agent binary its "
            + "own, then attaches gdb); as root any process may be traced. MemoryHygieneTests.agentIsNotDumpableAndHasNoCoreDumps "
            + "checks cofferd's PR_SET_DUMPABLE 0 as its own user"),
    ]

    /// Runs one of OpenSSH's agent scripts (from the installed OpenSSH's source, fetched by
    /// contrib/ssh-regress.sh) with cofferd as its ssh-agent and holds its outcome to
    /// ``regressOutcomes``. Not under a sanitizer: the scripts take a minute and test the protocol,
    /// which the plain run covers; CI runs them once. The cases run at once: each script runs in a
    /// directory of its own, and contrib/debian-source.sh prepares the shared source tree atomically.
    @Test(.enabled(if: SSHDaemon.available, "needs /usr/sbin/sshd (apt: openssh-server)"),
          .enabled(if: !SSHOpenSSHTests.sanitized, "OpenSSH's regression scripts run in the plain (unsanitized) test run only"),
          .timeLimit(.minutes(15)), arguments: ["agent", "agent-timeout", "agent-restrict"])
    func openSSHRegressScript(_ script: String) throws {
        try Self.checkRegress(script)
    }

    /// The two scripts that skip themselves here run too (their skip must be the one expected), then
    /// this test is cancelled with the reason: a parameterized case's cancellation is reported as a
    /// pass, a test's is not.
    @Test(.enabled(if: SSHDaemon.available, "needs /usr/sbin/sshd (apt: openssh-server)"),
          .enabled(if: !SSHOpenSSHTests.sanitized, "OpenSSH's regression scripts run in the plain (unsanitized) test run only"),
          .timeLimit(.minutes(15)))
    func openSSHRegressAgentGetpeereid() throws { try Self.checkRegress("agent-getpeereid") }

    @Test(.enabled(if: SSHDaemon.available, "needs /usr/sbin/sshd (apt: openssh-server)"),
          .enabled(if: !SSHOpenSSHTests.sanitized, "OpenSSH's regression scripts run in the plain (unsanitized) test run only"),
          .timeLimit(.minutes(15)))
    func openSSHRegressAgentPtrace() throws { try Self.checkRegress("agent-ptrace") }

    static func checkRegress(_ script: String) throws {
        let r = runCLI([Binaries.packageRoot + "/contrib/ssh-regress.sh", Binaries.cofferd, script],
                       executable: "/bin/bash", unset: ["SSH_AUTH_SOCK", "SSH_AGENT_PID"], timeout: 800)
        if r.status == 77 {
            try Test.cancel("OpenSSH's regression scripts cannot run here: \(r.stderr.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
        #expect(r.status == 0, "\(r.stdout.suffix(6000))\n\(r.stderr.suffix(3000))")
        let prefix = "RESULT \(script) "
        guard let line = r.stdout.split(separator: "\n").last(where: { $0.hasPrefix(prefix) }).map({ String($0.dropFirst(prefix.count)) }) else {
            Issue.record("no result for \(script).sh:\n\(r.stdout.suffix(6000))\n\(r.stderr.suffix(3000))"); return
        }
        let fido = r.stdout.split(separator: "\n").contains("FIDO-KEYS yes")
        let expected = try #require(Self.regressOutcomes(fido: fido)[script])
        switch expected {
        case .pass:
            #expect(line == "pass", "\(script).sh: \(line)\n\(r.stdout.suffix(6000))")
        case .notApplicable(let why):
            #expect(line.hasPrefix("skip: "), "\(script).sh was expected to skip itself: \(line)\n\(r.stdout.suffix(6000))")
            try Test.cancel("\(script).sh does not apply here (\(line.dropFirst("skip: ".count))): \(why)")
        case .knownFailures(let known):
            let failures = line.hasPrefix("fail: ") ? line.dropFirst("fail: ".count).components(separatedBy: " | ") : []
            #expect(line != "pass", "\(script).sh now passes: its known failures are gone; make it .pass")
            for failure in failures {
                if let reason = known[failure] {
                    withKnownIssue("\(script).sh: \(reason)") { Issue.record("\(script).sh: \(failure)") }
                } else {
                    Issue.record("\(script).sh failed: \(failure)\n\(r.stdout.suffix(6000))")
                }
            }
            for (failure, _) in known where !failures.contains(failure) {
                Issue.record("\(script).sh no longer fails with \"\(failure)\": take it off the known failures (and contrib/ssh-regress.md)")
            }
        }
    }

    /// True if one line of `log` contains every one of `parts`.
    static func hasLine(_ log: String, _ parts: String...) -> Bool {
        log.split(separator: "\n").contains { line in parts.allSatisfy { line.contains($0) } }
    }

    /// True in a sanitizer build (contrib/sanitizers.sh says so, and the runtime is linked in).
    static let sanitized = ProcessInfo.processInfo.environment["COFFER_SANITIZED"] != nil || LockedMemoryTests.underSanitizer
}

/// An `sshd` on the loopback interface with a private configuration in a temporary directory: its
/// own host key, one authorized_keys file, no PAM, no passwords; stopped when released.
final class SSHDaemon: @unchecked Sendable {
    static let path = "/usr/sbin/sshd"
    static let available = FileManager.default.isExecutableFile(atPath: path)
    /// The user the client logs in as: this process's own (sshd run by a plain user serves only it).
    static var user: String { getpwuid(getuid()).map { String(cString: $0.pointee.pw_name) } ?? "root" }

    let dir = TemporaryDirectory("coffer-sshd")
    private(set) var port: UInt16 = 0
    private var pid: Int32 = 0
    private var pidFile: String { dir.file("sshd.pid") }
    private var logPath: String { dir.file("sshd.log") }
    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    private let hostCertificate: String?
    private let trustedUserCAKeys: String?

    struct StartError: Error, CustomStringConvertible {
        let description: String
    }

    /// `authorizedKeys`: the lines of its authorized_keys file; `hostKey`: its private host key (one
    /// made for it when nil); `hostCertificate`: a certificate of the host key it presents instead.
    /// `trustedUserCAKeys`: a file of CA public keys whose user certificates it accepts.
    init(authorizedKeys: [String], hostKey: String? = nil, hostCertificate: String? = nil, trustedUserCAKeys: String? = nil) throws {
        self.trustedUserCAKeys = trustedUserCAKeys
        // sshd started by root needs its privilege separation directory (made at boot by
        // systemd-tmpfiles, which a container may never run).
        // Another test process may make it at the same moment: mkdir's EEXIST is success.
        if getuid() == 0 && mkdir("/run/sshd", 0o755) != 0 && errno != EEXIST {
            throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        }
        self.hostCertificate = hostCertificate
        let hostKey = hostKey ?? dir.file("host_ed25519")
        if !FileManager.default.fileExists(atPath: hostKey) {
            let keygen = runCLI(["-q", "-t", "ed25519", "-N", "", "-C", "coffer-test-host", "-f", hostKey], executable: "/usr/bin/ssh-keygen")
            guard keygen.status == 0 else { throw StartError(description: "ssh-keygen for the host key: \(keygen)") }
        }
        try authorizedKeys.map { $0.trimmingCharacters(in: .whitespacesAndNewlines) + "\n" }.joined()
            .write(toFile: dir.file("authorized_keys"), atomically: true, encoding: .utf8)
        // A port picked free may be taken before sshd binds it: then another one.
        var lastLog = ""
        for _ in 0..<5 {
            guard let candidate = Loopback.freePort() else { throw POSIXError(.EADDRNOTAVAIL) }
            if try start(port: candidate, hostKey: hostKey) {
                port = candidate
                let hostPublic = try String(contentsOfFile: hostKey + ".pub", encoding: .utf8)
                try "[127.0.0.1]:\(port) \(hostPublic)".write(toFile: dir.file("known_hosts"), atomically: true, encoding: .utf8)
                return
            }
            lastLog = log
        }
        throw StartError(description: "sshd did not start:\n\(lastLog)")
    }

    /// Starts sshd on `port`; false if the port was taken, throws on any other failure.
    private func start(port: UInt16, hostKey: String) throws -> Bool {
        let config = dir.file("sshd_config")
        try """
            Port \(port)
            ListenAddress 127.0.0.1
            AddressFamily inet
            HostKey \(hostKey)
            PidFile \(pidFile)
            AuthorizedKeysFile \(dir.file("authorized_keys"))
            StrictModes no
            UsePAM no
            PubkeyAuthentication yes
            PasswordAuthentication no
            KbdInteractiveAuthentication no
            PermitRootLogin prohibit-password
            AllowUsers \(Self.user)
            LogLevel VERBOSE
            \(hostCertificate.map { "HostCertificate \($0)" } ?? "")
            \(trustedUserCAKeys.map { "TrustedUserCAKeys \($0)" } ?? "")

            """.write(toFile: config, atomically: true, encoding: .utf8)
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        // Not `-D` under Foundation's Process: sshd closes every inherited descriptor as it starts,
        // Process's own among them, and Process then waits for it (blocking every other child's
        // reaping in this runner) until it exits. As a daemon, sshd binds its port, then forks; the
        // command returns once it listens (or failed to bind), and the pid file names the daemon.
        let r = runCLI(["-f", config, "-E", logPath], executable: Self.path, timeout: 120)   // an absolute path: sshd re-executes itself
        if r.status != 0 {
            if log.contains("Address already in use") { return false }
            throw StartError(description: "sshd failed (\(r.status)): \(r.stderr)\n\(log)")
        }
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            if let text = try? String(contentsOfFile: pidFile, encoding: .utf8), let pid = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)) {
                self.pid = pid
                return true
            }
            usleep(20_000)
        }
        throw StartError(description: "sshd wrote no pid file within 60 s:\n\(log)")
    }

    /// ssh's arguments for a login to this server: no configuration file, this server's host key
    /// only, no identity of its own (keys come from the agent alone), no passwords, debug output
    /// on stderr.
    func clientArguments(in dir: TemporaryDirectory) -> [String] {
        ["-F", "/dev/null", "-T", "-v", "-p", "\(port)",
         "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", "UserKnownHostsFile=\(self.dir.file("known_hosts"))", "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", "IdentityFile=\(dir.file("no-such-identity"))", "-o", "PasswordAuthentication=no",
         "-o", "KbdInteractiveAuthentication=no", "-o", "ConnectTimeout=60",
         "\(Self.user)@127.0.0.1"]
    }

    /// An ssh_config naming this server `testserver` (checked against `knownHosts`, batch mode, keys
    /// from the agent only).
    func writeClientConfig(_ path: String, knownHosts: String) throws {
        try """
            Host testserver
              HostName 127.0.0.1
              Port \(port)
              HostKeyAlias testserver
              User \(Self.user)
              UserKnownHostsFile \(knownHosts)
              GlobalKnownHostsFile /dev/null
              StrictHostKeyChecking yes
              BatchMode yes
              IdentityFile none
              IdentitiesOnly no
              ConnectTimeout 60

            """.write(toFile: path, atomically: true, encoding: .utf8)
    }

    /// SIGTERM to the daemon, then SIGKILL if it is still there after 10 s; waits until it is gone
    /// (a zombie counts as gone: the daemon is not this process's child).
    func stop() {
        guard pid > 0 else { return }
        defer { pid = 0 }
        kill(pid, SIGTERM)
        let deadline = Date().addingTimeInterval(10)
        while Loopback.running(pid) && Date() < deadline { usleep(20_000) }
        if Loopback.running(pid) { kill(pid, SIGKILL) }
    }

    deinit { stop() }
}
