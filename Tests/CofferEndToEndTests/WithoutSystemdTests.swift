import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// A machine whose PID 1 is not systemd (issue #23 item 4): no logind makes `/run/user/UID`, no socket
/// unit starts the agent. pam_coffer's session line makes the runtime directory and starts `cofferd`;
/// `install.sh` writes those lines and lists every step it takes. The runtime root is a private
/// directory (`runtime_root=`), never the machine's `/run/user`; logins that start a real agent get a
/// generous `budget_ms=` (a slow machine under a sanitizer must not turn into a failure).
@Suite struct WithoutSystemdTests {
    /// The pid of the agent started with this state directory, if one runs (`[-]` keeps the pattern
    /// from matching the shell that runs pgrep).
    static func agentPid(stateDir: String) -> Int32? {
        runShell("pgrep -f -- '[-]-state-dir \(stateDir) '", socket: "").stdout.split(separator: "\n").first.flatMap { Int32($0) }
    }

    /// Stops the agent pam_coffer started (it is not the test's child) and waits until it is gone.
    static func stopAgent(stateDir: String) {
        guard let pid = agentPid(stateDir: stateDir) else { return }
        kill(pid, SIGKILL)
        let deadline = nowMillis() + 30_000
        while agentPid(stateDir: stateDir) != nil && nowMillis() < deadline { usleep(20_000) }
    }

    /// Owner, group and permission bits of `path` (not following a symbolic link).
    static func ownerAndMode(_ path: String) -> (uid: uid_t, gid: gid_t, mode: mode_t)? {
        var st = stat()
        guard lstat(path, &st) == 0 else { return nil }
        return (st.st_uid, st.st_gid, st.st_mode & 0o7777)
    }

    /// The session line as install.sh writes it without systemd (agent=), with a private runtime root:
    /// the first login makes the runtime directory, starts the agent and sets the passcode; a later login
    /// unlocks the running agent; a login after the agent stopped starts it again and unlocks it.
    @Test func sessionMakesTheRuntimeDirectoryStartsTheAgentSetsThePasscodeThenUnlocks() throws {
        let agent = try AgentProcess(pamService: "coffer-login", start: false)
        defer { Self.stopAgent(stateDir: agent.stateDir) }
        let tmp = TemporaryDirectory("coffer-nosd")
        let module = try PAMModuleTests.buildModule(into: tmp)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        let runtimeRoot = tmp.path + "/run-user"
        // No socket=: pam_coffer resolves it from the runtime directory it makes, as on a real machine.
        let args = ["--state-dir", agent.stateDir, "--pam-confdir", agent.pamDir, "--pam-service", agent.pamService, "--kdf-ops", "1"]
        try PAMModuleTests.writeLoginService(dir: services, module: module, passdb: agent.passdb,
                                             moduleArgs: "runtime_root=\(runtimeRoot) budget_ms=60000 agent=\(Binaries.cofferd) "
                                                 + args.map { "agentarg=\($0)" }.joined(separator: " "))
        let runtime = runtimeRoot + "/\(getuid())"
        let socket = runtime + "/coffer/agent.sock"
        let env = ["COFFER_SOCKET": socket]
        let pw = AgentProcess.password
        #expect(!Files.exists(runtime))

        // First login: the runtime directory is made (the user's, 0700), the agent started, the passcode set.
        var r = PAMModuleTests.pamtester(serviceDir: services, ["authenticate", "open_session", "close_session"], input: "\(pw)\n\(pw)\n")
        #expect(r.status == 0, "\(r)")
        let made = try #require(Self.ownerAndMode(runtime), "pam_coffer made no runtime directory")
        #expect(made.uid == getuid() && made.gid == getgid() && made.mode == 0o700, "\(made)")
        var s = agent.cli(["status"], environment: env)
        #expect(s.status == 0 && s.stdout.contains("passcode: set") && s.stdout.contains("state: unlocked"), "\(s)")
        #expect(agent.cli(["add", "--service", "s", "--account", "a", "--secret-stdin"], stdin: "v", environment: env).status == 0)

        // Locked; the next login unlocks the running agent.
        #expect(agent.cli(["lock"], environment: env).status == 0)
        r = PAMModuleTests.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "\(pw)\n\(pw)\n")
        #expect(r.status == 0, "\(r)")
        s = agent.cli(["status"], environment: env)
        #expect(s.stdout.contains("state: unlocked"), "\(s)")

        // The agent gone (a reboot clears /run too): the next login starts it again and unlocks it.
        Self.stopAgent(stateDir: agent.stateDir)
        try #require(Self.agentPid(stateDir: agent.stateDir) == nil, "the agent did not stop")
        r = PAMModuleTests.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "\(pw)\n\(pw)\n")
        #expect(r.status == 0, "\(r)")
        let got = agent.cli(["get", "--service", "s", "--account", "a"], environment: env)
        #expect(got.status == 0 && got.stdout == "v", "\(got)")
        #expect(Self.ownerAndMode(runtime)?.mode == 0o700)
    }

    /// A runtime directory that exists with another mode or owner, a symbolic link in its place, or a
    /// runtime root others can write to is refused: left as it is, and no agent is started or told
    /// anything. A stand-in agent records whether pam_coffer would have started one, and where.
    @Test func aWrongRuntimeDirectoryIsRefusedAndLeftAlone() throws {
        let tmp = TemporaryDirectory("coffer-nosd")
        let module = try PAMModuleTests.buildModule(into: tmp)
        let passdb = tmp.path + "/passdb"
        try "\(currentUser):pw:coffer-login\n".write(toFile: passdb, atomically: true, encoding: .utf8)
        let marker = tmp.path + "/started"
        let standIn = tmp.path + "/stand-in-agent"
        try "#!/bin/sh\necho \"$2\" >> '\(marker)'\n".write(toFile: standIn, atomically: true, encoding: .utf8)
        #expect(chmod(standIn, 0o755) == 0)
        let uid = "\(getuid())"

        /// One login with runtime root `root` (prepared by `prepare`); the paths the stand-in was started with.
        func login(_ name: String, prepare: (String) throws -> Void) throws -> [String] {
            let services = tmp.path + "/services-" + name, root = tmp.path + "/root-" + name
            try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            #expect(chmod(root, 0o755) == 0)
            try prepare(root)
            try PAMModuleTests.writeLoginService(dir: services, module: module, passdb: passdb,
                                                 moduleArgs: "runtime_root=\(root) agent=\(standIn)")
            try? FileManager.default.removeItem(atPath: marker)
            let r = PAMModuleTests.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "pw\npw\n")
            #expect(r.status == 0, "the login must succeed: \(r)")
            return String(decoding: fileBytes(marker), as: UTF8.self).split(separator: "\n").map(String.init)
        }

        // The right directory is used: the test's stand-in is live.
        var started = try login("good") { _ in }
        #expect(started == [tmp.path + "/root-good/\(uid)/coffer/agent.sock"], "\(started)")

        // The user's own directory, but readable by others: refused, not repaired.
        started = try login("mode") { root in
            try FileManager.default.createDirectory(atPath: root + "/" + uid, withIntermediateDirectories: false)
            #expect(chmod(root + "/" + uid, 0o755) == 0)
        }
        #expect(started.isEmpty, "an agent was started in a directory of mode 0755: \(started)")
        #expect(Self.ownerAndMode(tmp.path + "/root-mode/" + uid)?.mode == 0o755)

        // A symbolic link to a directory of the user's: refused, the target untouched.
        let elsewhere = tmp.path + "/elsewhere"
        try FileManager.default.createDirectory(atPath: elsewhere, withIntermediateDirectories: false)
        #expect(chmod(elsewhere, 0o700) == 0)
        started = try login("link") { root in try FileManager.default.createSymbolicLink(atPath: root + "/" + uid, withDestinationPath: elsewhere) }
        #expect(started.isEmpty, "an agent was started through a symbolic link: \(started)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: elsewhere).isEmpty)

        // A runtime root others may write to (they could swap the directory): refused.
        started = try login("open") { root in #expect(chmod(root, 0o777) == 0) }
        #expect(started.isEmpty, "an agent was started under a world-writable root: \(started)")
        #expect(!Files.exists(tmp.path + "/root-open/" + uid))

        // Another user's directory (root can make one): refused.
        if getuid() == 0 {
            let nobody = try #require(getpwnam("nobody"))
            started = try login("owner") { root in
                try FileManager.default.createDirectory(atPath: root + "/" + uid, withIntermediateDirectories: false)
                #expect(chown(root + "/" + uid, nobody.pointee.pw_uid, nobody.pointee.pw_gid) == 0 && chmod(root + "/" + uid, 0o700) == 0)
            }
            #expect(started.isEmpty, "an agent was started in another user's directory: \(started)")
            #expect(Self.ownerAndMode(tmp.path + "/root-owner/" + uid)?.uid == nobody.pointee.pw_uid)
        }
    }

    /// Run as root for another user (what login does), the directory is made for that user: their uid
    /// and group, mode 0700, even with a session that has no password (a key-based ssh login).
    @Test(.enabled(if: getuid() == 0, "needs root to open a session for another user"))
    func theRuntimeDirectoryBelongsToTheSessionUser() throws {
        let tmp = TemporaryDirectory("coffer-nosd")
        let module = try PAMModuleTests.buildModule(into: tmp)
        let bob = try ThrowawayUser(prefix: "coffer-r")
        let root = tmp.path + "/run-user"
        try "session optional \(module) runtime_root=\(root)\n".write(toFile: tmp.path + "/coffer-login", atomically: true, encoding: .utf8)
        _ = FileManager.default.createFile(atPath: tmp.path + "/other", contents: Data())
        // Under a umask that would leave the runtime root unreachable for everyone but root.
        let r = runShell("umask 077; LD_PRELOAD=libpam_wrapper.so PAM_WRAPPER=1 PAM_WRAPPER_SERVICE_DIR='\(tmp.path)' "
                         + "pamtester coffer-login '\(bob.name)' open_session close_session </dev/null", socket: "")
        #expect(r.status == 0, "\(r)")
        let made = try #require(Self.ownerAndMode(root + "/\(bob.uid)"), "no runtime directory for \(bob.name)")
        #expect(made.uid == bob.uid && made.gid == bob.gid && made.mode == 0o700, "\(made)")
        let top = try #require(Self.ownerAndMode(root))
        #expect(top.uid == 0 && top.mode == 0o755, "every user must reach their own directory: \(top)")
    }
}
