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
        // Gone from pgrep (its memory released) is not yet gone: it holds the state directory's lock
        // until the kernel has closed its files.
        while (agentPid(stateDir: stateDir) != nil || StateDirectoryLock.currentHolder(of: stateDir) != nil)
            && nowMillis() < deadline { usleep(20_000) }
    }

    /// A stand-in for cofferd that never listens: each start appends the socket it was given and its
    /// XDG_RUNTIME_DIR (or `unset`) to the file named by its next argument (`agentarg=MARKER`).
    static func standInAgent(in dir: String) throws -> String {
        let path = dir + "/stand-in-agent"
        try writeExecutable("#!/bin/sh\nprintf '%s %s\\n' \"$2\" \"${XDG_RUNTIME_DIR-unset}\" >> \"$3\"\n", to: path)
        return path
    }

    /// The starts a stand-in noted in `marker`. With `expected`, waits for the first (the stand-in is
    /// detached and may write after the login returned); without, none can come later (none was started).
    static func starts(_ marker: String, expected: Bool) -> [String] {
        if expected { _ = PAMModuleTests.waitForFile(marker, seconds: 60) }
        return String(decoding: fileBytes(marker), as: UTF8.self).split(separator: "\n").map(String.init)
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

        // The password and close lines find the agent under runtime_root= too, with no XDG_RUNTIME_DIR in
        // their PAM environment: a password change moves the passcode along, lock_on_close locks.
        let other = tmp.path + "/services-password"
        try FileManager.default.createDirectory(atPath: other, withIntermediateDirectories: true)
        try PAMModuleTests.writeLoginService(dir: other, module: module, passdb: agent.passdb,
                                             moduleArgs: "runtime_root=\(runtimeRoot) budget_ms=60000 lock_on_close")
        r = PAMModuleTests.pamtester(serviceDir: other, ["close_session"], input: "")
        #expect(r.status == 0, "\(r)")
        s = agent.cli(["status"], environment: env)
        #expect(s.stdout.contains("state: locked"), "lock_on_close did not reach the agent under runtime_root=: \(s)")
        r = PAMModuleTests.pamtester(serviceDir: other, ["chauthtok"], input: "\(pw)\nnew secret\nnew secret\n",
                                     environment: "PAM_OLDAUTHTOK='\(pw)' PAM_AUTHTOK='new secret'")
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: "new secret", environment: env).status == 0,
                "the password line did not reach the agent under runtime_root=")
    }

    /// A runtime directory that exists with another mode, a symbolic link in its place, or a runtime
    /// root others can write to or cannot enter is refused: left as it is, and no agent is started or
    /// told anything. A stand-in agent records whether pam_coffer would have started one, and where
    /// (each case in its own file, so a late start from one case cannot show up in another).
    @Test func aWrongRuntimeDirectoryIsRefusedAndLeftAlone() throws {
        let rig = try StandInRig()
        let tmp = rig.tmp, uid = "\(getuid())"

        /// One login with runtime root `root` (prepared by `prepare`); the starts of the stand-in.
        func login(_ name: String, expectStart: Bool = false, prepare: (String) throws -> Void) throws -> [String] {
            let root = tmp.path + "/root-" + name
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            #expect(chmod(root, 0o755) == 0)
            try prepare(root)
            return try rig.login(name, "runtime_root=\(root)", expectStart: expectStart)
        }

        // The right directory is used: the test's stand-in is live.
        var started = try login("good", expectStart: true) { _ in }
        let good = tmp.path + "/root-good/\(uid)"
        #expect(started == ["\(good)/coffer/agent.sock \(good)"], "\(started)")

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

        // A runtime root others cannot enter (an agent running as the user could not reach its
        // directory when root made it): refused, nothing made in it.
        started = try login("closed") { root in #expect(chmod(root, 0o700) == 0) }
        #expect(started.isEmpty, "an agent was started under a root of mode 0700: \(started)")
        #expect(!Files.exists(tmp.path + "/root-closed/" + uid))
    }

    /// Another user's directory in the place of the user's (root can make one) is refused and left alone.
    @Test(.enabled(if: getuid() == 0, "needs root to make a directory owned by another user"))
    func anotherUsersRuntimeDirectoryIsRefusedAndLeftAlone() throws {
        let rig = try StandInRig()
        let nobody = try #require(getpwnam("nobody"))
        let root = rig.tmp.path + "/run-user", mine = root + "/\(getuid())"
        try FileManager.default.createDirectory(atPath: mine, withIntermediateDirectories: true)
        #expect(chmod(root, 0o755) == 0 && chown(mine, nobody.pointee.pw_uid, nobody.pointee.pw_gid) == 0 && chmod(mine, 0o700) == 0)
        let started = try rig.login("owner", "runtime_root=\(root)", expectStart: false)
        #expect(started.isEmpty, "an agent was started in another user's directory: \(started)")
        let left = try #require(Self.ownerAndMode(mine))
        #expect(left.uid == nobody.pointee.pw_uid && left.mode == 0o700, "\(left)")
    }

    /// Under systemd (its marker directory exists; `systemd_check=` points at one here) a session without
    /// XDG_RUNTIME_DIR is logind's business: `su - bob` inside another session, a stack without
    /// pam_systemd or with pam_coffer before it. Nothing is made and XDG_RUNTIME_DIR stays unset; the
    /// agent is looked for where logind puts it. With `runtime_root=` given, the directory is made anyway.
    @Test func underSystemdTheRuntimeDirectoryIsMadeOnlyWhenRuntimeRootIsGiven() throws {
        // While no other test (DefaultSocketTests) makes or removes /run/user/UID.
        try MachineWideLock.with("run-user") { try runtimeDirectoryUnderSystemd() }
    }

    func runtimeDirectoryUnderSystemd() throws {
        let rig = try StandInRig()
        let systemd = rig.tmp.path + "/systemd-system"
        try FileManager.default.createDirectory(atPath: systemd, withIntermediateDirectories: false)
        let uid = getuid(), logind = "/run/user/\(uid)"
        let logindHadIt = Files.exists(logind)

        var started = try rig.login("default", "systemd_check=\(systemd)", expectStart: true)
        #expect(started == ["\(logind)/coffer/agent.sock unset"], "\(started)")
        #expect(logindHadIt || !Files.exists(logind), "pam_coffer made \(logind) on a machine with systemd")

        let root = rig.tmp.path + "/run-user"
        started = try rig.login("explicit", "systemd_check=\(systemd) runtime_root=\(root)", expectStart: true)
        #expect(started == ["\(root)/\(uid)/coffer/agent.sock \(root)/\(uid)"], "\(started)")
        #expect(Self.ownerAndMode(root + "/\(uid)")?.mode == 0o700)
    }

    /// A preloaded fchown that holds the first call on a directory (the moment between making the
    /// user's directory and handing it to the user) until RELEASE exists, after making HELD.
    /// Usage: LD_PRELOAD=hold.so HOLD_HELD=PATH HOLD_RELEASE=PATH …
    static let holdSource = """
        #define _GNU_SOURCE
        #include <dlfcn.h>
        #include <stdio.h>
        #include <stdlib.h>
        #include <sys/stat.h>
        #include <unistd.h>
        int fchown(int fd, uid_t uid, gid_t gid) {
            static int held;
            int (*real)(int, uid_t, gid_t) = (int (*)(int, uid_t, gid_t))dlsym(RTLD_NEXT, "fchown");
            const char *at = getenv("HOLD_HELD"), *release = getenv("HOLD_RELEASE");
            struct stat st;
            if (!held && at && release && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
                held = 1;
                FILE *f = fopen(at, "w");
                if (f) fclose(f);
                for (int i = 0; i < 300000 && access(release, F_OK) != 0; i++) usleep(1000);
            }
            return real(fd, uid, gid);
        }

        """

    /// A login stopped (here: held, then killed) between making bob's directory and handing it to him,
    /// and a login that races it, lock nobody out: the directory appears under its final name only once
    /// it is bob's and 0700, so the racing login succeeds, the held one then finds it and succeeds too,
    /// and after a kill the next login makes it (the killed one's temporary directory is left alone).
    @Test(.enabled(if: getuid() == 0, "needs root to make the directory for another user"))
    func aLoginKilledOrRacedWhileMakingTheDirectoryLocksNobodyOut() throws {
        let tmp = TemporaryDirectory("coffer-nosd")
        let module = try PAMModuleTests.buildModule(into: tmp)
        let hold = tmp.path + "/hold.so"
        try Self.holdSource.write(toFile: hold + ".c", atomically: true, encoding: .utf8)
        let cc = runShell("cc -shared -fPIC -Wall -Werror -o '\(hold)' '\(hold).c' -ldl", socket: "")
        try #require(cc.status == 0, "\(cc)")
        let bob = try ThrowawayUser(prefix: "coffer-r")
        let shared = try SharedDirectory("coffer-nosd-race")
        let standIn = try shared.copyExecutable(Self.standInAgent(in: tmp.path))
        let den = try shared.privateDirectory("den", uid: bob.uid, gid: bob.gid)
        let passdb = tmp.path + "/passdb"
        try "\(bob.name):pw:coffer-login\n".write(toFile: passdb, atomically: true, encoding: .utf8)

        /// The service for runtime root `root`, in its own directory; bob's agent notes itself in den/started-NAME.
        func service(_ name: String, root: String) throws -> (dir: String, marker: String) {
            let dir = tmp.path + "/services-" + name, marker = den + "/started-" + name
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
            #expect(chmod(root, 0o755) == 0)
            try PAMModuleTests.writeLoginService(dir: dir, module: module, passdb: passdb,
                                                 moduleArgs: "runtime_root=\(root) agent=\(standIn) agentarg=\(marker)")
            return (dir, marker)
        }
        /// A session for bob (no password) held inside the making of his directory; returns once it is held.
        func heldSession(_ serviceDir: String, _ name: String) throws -> (Process, release: String) {
            let held = tmp.path + "/held-" + name, release = tmp.path + "/release-" + name
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/bin/sh")
            p.arguments = ["-c", "exec env LD_PRELOAD='libpam_wrapper.so \(hold)' PAM_WRAPPER=1 PAM_WRAPPER_SERVICE_DIR='\(serviceDir)' "
                           + "HOLD_HELD='\(held)' HOLD_RELEASE='\(release)' pamtester coffer-login '\(bob.name)' open_session </dev/null"]
            // Started and set up (it holds its session) before any other pam_wrapper process starts.
            try PAMWrapper.serialized {
                try p.run()
                try #require(PAMModuleTests.waitForFile(held, seconds: 60), "the session was never held: the test proves nothing")
            }
            return (p, release)
        }
        /// bob logs in with his password; the starts of his (stand-in) agent.
        func login(_ s: (dir: String, marker: String)) -> [String] {
            let r = PAMModuleTests.pamtester(serviceDir: s.dir, ["authenticate", "open_session"], input: "pw\npw\n", user: bob.name)
            #expect(r.status == 0, "the login must succeed: \(r)")
            return Self.starts(s.marker, expected: true)
        }
        let name = "\(bob.uid)"

        // A login racing one that is making the directory: both succeed, one directory, bob's, 0700.
        let raced = tmp.path + "/root-raced"
        let first = try service("held", root: raced), second = try service("racing", root: raced)
        let (holder, release) = try heldSession(first.dir, "raced")
        var started = login(second)
        #expect(started == ["\(raced)/\(name)/coffer/agent.sock \(raced)/\(name)"], "the racing login was refused: \(started)")
        _ = FileManager.default.createFile(atPath: release, contents: Data())
        holder.waitUntilExit()
        #expect(holder.terminationStatus == 0)
        var made = try #require(Self.ownerAndMode(raced + "/" + name))
        #expect(made.uid == bob.uid && made.gid == bob.gid && made.mode == 0o700, "\(made)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: raced) == [name], "the held login left its temporary directory")

        // A login killed while making it: the next one makes it and succeeds.
        let killedRoot = tmp.path + "/root-killed"
        let killed = try service("killed", root: killedRoot), next = try service("next", root: killedRoot)
        let (victim, _) = try heldSession(killed.dir, "killed")
        kill(victim.processIdentifier, SIGKILL)
        victim.waitUntilExit()
        started = login(next)
        #expect(started == ["\(killedRoot)/\(name)/coffer/agent.sock \(killedRoot)/\(name)"], "a killed login locked bob out: \(started)")
        made = try #require(Self.ownerAndMode(killedRoot + "/" + name))
        #expect(made.uid == bob.uid && made.gid == bob.gid && made.mode == 0o700, "\(made)")
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
        let r = PAMWrapper.serialized {
            runShell("umask 077; LD_PRELOAD=libpam_wrapper.so PAM_WRAPPER=1 PAM_WRAPPER_SERVICE_DIR='\(tmp.path)' "
                     + "pamtester coffer-login '\(bob.name)' open_session close_session </dev/null", socket: "")
        }
        #expect(r.status == 0, "\(r)")
        let made = try #require(Self.ownerAndMode(root + "/\(bob.uid)"), "no runtime directory for \(bob.name)")
        #expect(made.uid == bob.uid && made.gid == bob.gid && made.mode == 0o700, "\(made)")
        let top = try #require(Self.ownerAndMode(root))
        #expect(top.uid == 0 && top.mode == 0o755, "every user must reach their own directory: \(top)")
    }
}

/// The setting of the stand-in tests: pam_coffer, a passdb accepting the test user's password `pw`, and
/// a stand-in agent (`WithoutSystemdTests.standInAgent`).
struct StandInRig {
    let tmp = TemporaryDirectory("coffer-nosd")
    let module: String, passdb: String, standIn: String

    init() throws {
        module = try PAMModuleTests.buildModule(into: tmp)
        passdb = tmp.path + "/passdb"
        try "\(currentUser):pw:coffer-login\n".write(toFile: passdb, atomically: true, encoding: .utf8)
        standIn = try WithoutSystemdTests.standInAgent(in: tmp.path)
    }

    /// One login of the test user (authenticate, open_session) through a service of its own named
    /// `name`, with `moduleArgs` and the stand-in as agent= (noting its starts in a file of this login's
    /// own); the starts (see `WithoutSystemdTests.starts`).
    func login(_ name: String, _ moduleArgs: String, expectStart: Bool) throws -> [String] {
        let services = tmp.path + "/services-" + name, marker = tmp.path + "/started-" + name
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        try PAMModuleTests.writeLoginService(dir: services, module: module, passdb: passdb,
                                             moduleArgs: "\(moduleArgs) agent=\(standIn) agentarg=\(marker)")
        let r = PAMModuleTests.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "pw\npw\n")
        #expect(r.status == 0, "the login must succeed: \(r)")
        return WithoutSystemdTests.starts(marker, expected: expectStart)
    }
}
