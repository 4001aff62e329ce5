import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// pam_coffer.so, built with cc, driven by pamtester under cwrap's pam_wrapper against a real agent.
@Suite struct PAMModuleTests {
    static let wrapperModules = PAMWrapper.modules

    /// Builds the module into a temporary directory (the test checks the build script too).
    static func buildModule(into dir: TemporaryDirectory) throws -> String {
        let out = dir.path + "/pam_coffer.so"
        let r = runShell("bash '\(Binaries.packageRoot)/contrib/pam_coffer/build.sh' '\(out)'", socket: "")
        guard r.status == 0 else { throw ModuleBuildError(output: r.stderr + r.stdout) }
        return out
    }

    struct ModuleBuildError: Error { let output: String }

    /// Whether `path` exists within `seconds` (another process is to create it).
    static func waitForFile(_ path: String, seconds: Double) -> Bool {
        let deadline = nowMillis() + seconds * 1000
        while !Files.exists(path) && nowMillis() < deadline { usleep(10_000) }
        return Files.exists(path)
    }

    /// A login service: pam_coffer remembers the password, pam_matrix checks it, pam_coffer unlocks in session.
    static func writeLoginService(dir: String, module: String, passdb: String, moduleArgs: String) throws {
        let m = "\(wrapperModules)/pam_matrix.so"
        try """
            auth optional \(module) \(moduleArgs)
            auth required \(m) passdb=\(passdb)
            account required \(m) passdb=\(passdb)
            session optional \(module) \(moduleArgs)
            password required \(m) passdb=\(passdb)
            password optional \(wrapperModules)/pam_set_items.so
            password optional \(module) \(moduleArgs)

            """.write(toFile: dir + "/coffer-login", atomically: true, encoding: .utf8)
        _ = FileManager.default.createFile(atPath: dir + "/other", contents: Data())
    }

    /// Runs pamtester for `operations`, answering prompts from `input`.
    static func pamtester(serviceDir: String, _ operations: [String], input: String, environment: String = "",
                          user: String = currentUser) -> CLIResult {
        PAMWrapper.serialized {
            runShell("printf '%s' '\(input)' | \(environment) LD_PRELOAD=libpam_wrapper.so PAM_WRAPPER=1 PAM_WRAPPER_SERVICE_DIR='\(serviceDir)' "
                     + "pamtester coffer-login '\(user)' \(operations.joined(separator: " "))", socket: "")
        }
    }

    @Test func moduleDoesNotDependOnTheSwiftRuntime() throws {
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let r = runShell("ldd '\(module)'", socket: "")
        #expect(r.status == 0)
        let libs = r.stdout.split(separator: "\n").map { String($0.split(separator: " ").first ?? "").trimmingCharacters(in: .whitespaces) }
        let allowed = ["linux-vdso.so.1", "libpam.so.0", "libc.so.6", "libaudit.so.1", "libcap-ng.so.0", "/lib64/ld-linux-x86-64.so.2"]
        for lib in libs where !lib.isEmpty { #expect(allowed.contains(lib), "unexpected dependency \(lib)") }
        #expect(!r.stdout.contains("swift"))
    }

    @Test func loginUnlocksTheAgentAndFirstLoginSetsThePasscode() throws {
        let agent = try AgentProcess(pamService: "coffer-login")
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        try Self.writeLoginService(dir: services, module: module, passdb: agent.passdb, moduleArgs: "socket=\(agent.socketPath)")
        let pw = AgentProcess.password

        // First login: no passcode yet, so pam_coffer sets it to the login password.
        var r = Self.pamtester(serviceDir: services, ["authenticate", "open_session", "close_session"], input: "\(pw)\n\(pw)\n")
        #expect(r.status == 0, "\(r)")
        var s = agent.cli(["status"]).stdout
        #expect(s.contains("passcode: set") && s.contains("state: unlocked"), "\(s)\n\(agent.log)")

        // Locked, then a login unlocks it.
        #expect(agent.cli(["add", "--service", "s", "--account", "a", "--secret-stdin"], stdin: "v").status == 0)
        #expect(agent.cli(["lock"]).status == 0)
        r = Self.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "\(pw)\n\(pw)\n")
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["get", "--service", "s", "--account", "a"]).stdout == "v", "\(agent.log)")

        // A failed login leaves it locked.
        #expect(agent.cli(["lock"]).status == 0)
        r = Self.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "wrong\nwrong\n")
        #expect(r.status != 0)
        s = agent.cli(["status"]).stdout
        #expect(s.contains("state: locked"), "\(s)")

        // A password change moves the keybag passcode along.
        r = Self.pamtester(serviceDir: services, ["chauthtok"], input: "\(pw)\nnew secret\nnew secret\n",
                           environment: "PAM_OLDAUTHTOK='\(pw)' PAM_AUTHTOK='new secret'")
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: pw).status == 5)
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: "new secret").status == 0, "\(agent.log)")
        #expect(!agent.log.contains(pw) && !agent.log.contains("new secret"))
    }

    /// The last logout (issue #45, without systemd stopping the agent): pam_coffer tells the agent of every
    /// session it opens and closes (SESSION); while one stays open nothing changes, and when the last one
    /// closes the keychain locks and until-first-auth directories lose their key with Complete's, None's
    /// staying. The next login brings every key back. On a real fscrypt ext4 (root; skipped otherwise).
    @Test(.enabled(if: LoopFilesystem.unavailable == nil, "\(LoopFilesystem.unavailable ?? "")"))
    func theLastLogoutLocksAndEndsWhatLastsUntilIt() throws {
        let fs = try LoopFilesystem()
        let agent = try AgentProcess(extraArguments: ["--lock-grace", "0"], pamService: "coffer-login")
        agent.setPasscode()
        let tmp = TemporaryDirectory("coffer-pam-sessions")
        let module = try Self.buildModule(into: tmp)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        try Self.writeLoginService(dir: services, module: module, passdb: agent.passdb, moduleArgs: "socket=\(agent.socketPath)")
        let pw = AgentProcess.password
        let dirs = ["until-first-auth": fs.file("u"), "complete": fs.file("c"), "none": fs.file("n")]
        for (cls, dir) in dirs {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
            #expect(agent.cli(["files", "protect", dir, "--class", cls]).status == 0, "\(agent.log)")
            try "in \(cls)".write(toFile: dir + "/f.txt", atomically: false, encoding: .utf8)
        }
        func readable() -> Set<String> {
            Set(dirs.filter { runProcess("/bin/cat", [$0.value + "/f.txt"]).stdout == "in \($0.key)" }.map(\.key))
        }
        func eventually(_ wanted: Set<String>) -> Bool {
            let deadline = Date().addingTimeInterval(10)
            while Date() < deadline { if readable() == wanted { return true }; usleep(50_000) }
            return readable() == wanted
        }
        // Two logins (a desktop and an ssh session, say).
        for _ in 0..<2 {
            let r = Self.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "\(pw)\n\(pw)\n")
            #expect(r.status == 0, "\(r)")
        }
        #expect(readable() == ["until-first-auth", "complete", "none"])
        // One logs out: the other still works.
        #expect(Self.pamtester(serviceDir: services, ["close_session"], input: "").status == 0)
        usleep(300_000)
        #expect(readable() == ["until-first-auth", "complete", "none"], "\(agent.log.suffix(2000))")
        #expect(agent.cli(["status"]).stdout.contains("state: unlocked"))
        // The last one logs out: locked, and until-first-auth goes with Complete.
        #expect(Self.pamtester(serviceDir: services, ["close_session"], input: "").status == 0)
        #expect(eventually(["none"]), "readable after the last logout: \(readable())\n\(agent.log.suffix(3000))")
        #expect(agent.cli(["status"]).stdout.contains("state: locked"))
        // A close with no session open changes nothing (the count never goes below zero).
        #expect(Self.pamtester(serviceDir: services, ["close_session"], input: "").status == 0)
        // The next login brings every key back.
        let again = Self.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "\(pw)\n\(pw)\n")
        #expect(again.status == 0, "\(again)")
        #expect(eventually(["until-first-auth", "complete", "none"]), "\(readable())\n\(agent.log.suffix(2000))")
        #expect(agent.log.contains("the last login session closed"))
    }

    /// sshd's keyboard-interactive authentication runs authentication and account management in a
    /// process of their own, apart from the session: with an account line, pam_coffer unlocks the
    /// running agent at account management (after a successful authentication only), so such an ssh
    /// login unlocks as a password login does (issue #43).
    @Test func anAccountLineUnlocksAtAccountManagementAsSSHKeyboardInteractiveNeeds() throws {
        let agent = try AgentProcess(pamService: "coffer-login")
        agent.setPasscode()
        #expect(agent.cli(["lock"]).status == 0)
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        try Self.writeLoginService(dir: services, module: module, passdb: agent.passdb, moduleArgs: "socket=\(agent.socketPath)")
        var service = try String(contentsOfFile: services + "/coffer-login", encoding: .utf8)
        service = service.replacingOccurrences(of: "account required \(Self.wrapperModules)/pam_matrix.so passdb=\(agent.passdb)\n",
                                               with: "account required \(Self.wrapperModules)/pam_matrix.so passdb=\(agent.passdb)\n"
                                                   + "account optional \(module) socket=\(agent.socketPath)\n")
        try service.write(toFile: services + "/coffer-login", atomically: true, encoding: .utf8)
        let pw = AgentProcess.password
        // A wrong password: authentication fails, account management never runs, nothing is sent.
        var r = Self.pamtester(serviceDir: services, ["authenticate", "acct_mgmt"], input: "wrong\nwrong\n")
        #expect(r.status != 0)
        #expect(agent.cli(["status"]).stdout.contains("state: locked"))
        // The right one, authentication and account management only (no session): unlocked.
        r = Self.pamtester(serviceDir: services, ["authenticate", "acct_mgmt"], input: "\(pw)\n\(pw)\n")
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["status"]).stdout.contains("state: unlocked"), "\(agent.log)")
        #expect(!agent.log.contains(pw))
    }

    /// A session opened through pam_coffer has the agent's sockets in its environment (issue #43):
    /// SSH_AUTH_SOCK (the ssh-agent socket beside the agent's) unless one is set already, and
    /// COFFER_SOCKET when socket= names the agent's; `no_env` leaves both out. pam_exec, after
    /// pam_coffer in the session stack, shows the environment PAM hands the session.
    @Test func theSessionGetsTheAgentsSocketsInItsEnvironment() throws {
        let agent = try AgentProcess(pamService: "coffer-login")
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let pamExec = ["/lib/x86_64-linux-gnu/security/pam_exec.so", "/usr/lib/x86_64-linux-gnu/security/pam_exec.so"]
            .first { FileManager.default.fileExists(atPath: $0) }
        try #require(pamExec != nil, "pam_exec.so (libpam-modules) is not installed")
        let pw = AgentProcess.password
        let dump = tmp.path + "/env"
        try writeExecutable("#!/bin/sh\nenv > '\(dump)'\n", to: tmp.path + "/dump.sh")
        for (args, preset, expectSSH, expectCoffer) in [
            ("socket=\(agent.socketPath)", "", Files.directoryName(agent.socketPath) + "/ssh-agent.sock", agent.socketPath),
            ("socket=\(agent.socketPath) no_env", "", nil, nil),
            ("socket=\(agent.socketPath)", "SSH_AUTH_SOCK=/elsewhere/agent", "/elsewhere/agent", agent.socketPath),
        ] as [(String, String, String?, String?)] {
            let services = tmp.path + "/services-\(UUID().uuidString.prefix(6))"
            try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
            try Self.writeLoginService(dir: services, module: module, passdb: agent.passdb, moduleArgs: args)
            var service = try String(contentsOfFile: services + "/coffer-login", encoding: .utf8)
            service += "session optional \(pamExec!) \(tmp.path)/dump.sh\n"
            try service.write(toFile: services + "/coffer-login", atomically: true, encoding: .utf8)
            try? FileManager.default.removeItem(atPath: dump)
            // A variable already in PAM's environment (pamtester's own environment is not PAM's): set
            // by pam_env, with a private configuration, on a session line before pam_coffer's.
            if !preset.isEmpty {
                let conf = services + "/env.conf"
                let parts = preset.split(separator: "=", maxSplits: 1)
                try "\(parts[0]) DEFAULT=\(parts[1])\n".write(toFile: conf, atomically: true, encoding: .utf8)
                service = try String(contentsOfFile: services + "/coffer-login", encoding: .utf8)
                service = service.replacingOccurrences(of: "session optional \(module)",
                    with: "session optional \(Files.directoryName(pamExec!))/pam_env.so conffile=\(conf) readenv=0\nsession optional \(module)")
                try service.write(toFile: services + "/coffer-login", atomically: true, encoding: .utf8)
            }
            let r = Self.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "\(pw)\n\(pw)\n")
            #expect(r.status == 0, "\(args): \(r)")
            let env = (try? String(contentsOfFile: dump, encoding: .utf8)) ?? ""
            let lines = Set(env.split(separator: "\n").map(String.init))
            #expect(expectSSH.map { lines.contains("SSH_AUTH_SOCK=\($0)") } ?? !env.contains("SSH_AUTH_SOCK="), "\(args) \(preset): \(env)")
            #expect(expectCoffer.map { lines.contains("COFFER_SOCKET=\($0)") } ?? !env.contains("COFFER_SOCKET="), "\(args) \(preset): \(env)")
        }
    }

    /// The password changed behind Coffer's back (root's `passwd USER`), then a login: the login works,
    /// the agent keeps the new password and says "out of sync"; `coffer passcode sync` with the previous
    /// one re-wraps the keybag, and the next login unlocks it (issue #16 item 2).
    @Test func aLoginAfterAPasswordChangedOutsideCofferThenSync() throws {
        let agent = try AgentProcess(pamService: "coffer-login")
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        try Self.writeLoginService(dir: services, module: module, passdb: agent.passdb, moduleArgs: "socket=\(agent.socketPath)")
        let old = AgentProcess.password
        var r = Self.pamtester(serviceDir: services, ["authenticate", "open_session", "close_session"], input: "\(old)\n\(old)\n")
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["add", "--service", "s", "--account", "a", "--secret-stdin"], stdin: "v").status == 0)
        #expect(agent.cli(["lock"]).status == 0)
        // passwd behind Coffer's back.
        try "\(currentUser):changed by root:coffer-login\n".write(toFile: agent.passdb, atomically: true, encoding: .utf8)
        r = Self.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "changed by root\nchanged by root\n")
        #expect(r.status == 0, "the login itself must not fail: \(r)")
        var status = agent.cli(["status"]).stdout
        #expect(status.contains("state: locked") && status.contains("out of sync"), "\(status)\n\(agent.log)")
        #expect(agent.cli(["passcode", "sync", "--passcode-stdin"], stdin: old).status == 0, "\(agent.log)")
        #expect(agent.cli(["lock"]).status == 0)
        r = Self.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "changed by root\nchanged by root\n")
        #expect(r.status == 0, "\(r)")
        status = agent.cli(["status"]).stdout
        #expect(status.contains("state: unlocked") && !status.contains("out of sync"), "\(status)")
        #expect(agent.cli(["get", "--service", "s", "--account", "a"]).stdout == "v")
        #expect(!agent.log.contains("changed by root") && !agent.log.contains(old))
    }

    @Test func loginSucceedsWhenNoAgentIsReachable() throws {
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        let passdb = tmp.path + "/passdb"
        try "\(currentUser):pw:coffer-login\n".write(toFile: passdb, atomically: true, encoding: .utf8)
        try Self.writeLoginService(dir: services, module: module, passdb: passdb, moduleArgs: "socket=\(tmp.path)/none.sock")
        let r = Self.pamtester(serviceDir: services, ["authenticate", "open_session", "close_session"], input: "pw\npw\n")
        #expect(r.status == 0, "\(r)")
    }

    /// A listener that answers HELLO as an agent would, then records every byte it receives (appended
    /// to RECEIVED) and notes each connection in ACCEPTED. Usage: recorder SOCKET RECEIVED ACCEPTED.
    static let recorderSource = """
        #include <stdio.h>
        #include <string.h>
        #include <sys/socket.h>
        #include <sys/time.h>
        #include <sys/un.h>
        #include <unistd.h>
        int main(int argc, char **argv) {
            if (argc != 4) return 2;
            int s = socket(AF_UNIX, SOCK_STREAM, 0);
            struct sockaddr_un a = { .sun_family = AF_UNIX };
            strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
            if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 4) != 0) { perror("recorder"); return 1; }
            static const unsigned char hello[] = { 0, 0, 0, 14, 0x81, 0, 0, 0, 1, 0, 1, 0, 5, '0', '.', '1', '.', '0' };
            for (;;) {
                int c = accept(s, NULL, NULL);
                if (c < 0) continue;
                FILE *f = fopen(argv[3], "a"); if (f) { fputs("accepted\\n", f); fclose(f); }
                struct timeval tv = { 0, 500000 };
                setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                FILE *r = fopen(argv[2], "ab");
                unsigned char buf[4096]; ssize_t n; int first = 1;
                while ((n = recv(c, buf, sizeof buf, 0)) > 0) {
                    if (first) { (void)!write(c, hello, sizeof hello); first = 0; }
                    if (r) { fwrite(buf, 1, (size_t)n, r); fflush(r); }
                }
                if (r) fclose(r);
                close(c);
            }
        }

        """

    /// A recorder (see `recorderSource`) running as `user`/`group` with its socket in `den`, which that user can reach.
    final class Recorder {
        let socket: String, received: String, accepted: String
        let process = Process()

        init(in den: String, executable: String, user: String, group: String) throws {
            socket = den + "/agent.sock"; received = den + "/received"; accepted = den + "/accepted"
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = ["--reuid=\(user)", "--regid=\(group)", "--clear-groups", executable, socket, received, accepted]
            let log = den + ".log"
            _ = FileManager.default.createFile(atPath: log, contents: Data())
            process.standardError = FileHandle(forWritingAtPath: log)
            try process.run()
            guard PAMModuleTests.waitForFile(socket, seconds: 10) else {
                throw StartError(log: String(decoding: fileBytes(log), as: UTF8.self))
            }
        }

        struct StartError: Error { let log: String }

        var bytes: [UInt8] { fileBytes(received) }
        var connections: Int { String(decoding: fileBytes(accepted), as: UTF8.self).split(separator: "\n").count }

        // SIGKILL: the test runner's blocked signals are inherited, so SIGTERM may never arrive.
        deinit { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() }
    }

    /// A process of another user serving the socket pam_coffer talks to (a stale path, a hostile
    /// XDG_RUNTIME_DIR) must never get the password. The impostor answers HELLO as an agent would
    /// and records every byte it receives; the module must reach it and then send nothing.
    @Test(.enabled(if: getuid() == 0, "needs root to serve a socket as another user"))
    func passwordIsNeverSentToASocketServedByAnotherUser() throws {
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        let pw = "login password 8472"
        let passdb = tmp.path + "/passdb"
        try "\(currentUser):\(pw):coffer-login\n".write(toFile: passdb, atomically: true, encoding: .utf8)
        let shared = try SharedDirectory("coffer-pam-impostor")
        let impostor = try shared.copyExecutable(compileC(Self.recorderSource, named: "impostor", in: tmp.path))
        let nobody = try #require(getpwnam("nobody"))
        let den = try shared.privateDirectory("den", uid: nobody.pointee.pw_uid, gid: nobody.pointee.pw_gid)
        let listener = try Recorder(in: den, executable: impostor, user: "nobody", group: "nogroup")

        try Self.writeLoginService(dir: services, module: module, passdb: passdb, moduleArgs: "socket=\(listener.socket)")
        let r = Self.pamtester(serviceDir: services, ["authenticate", "open_session", "close_session"], input: "\(pw)\n\(pw)\n")
        #expect(r.status == 0, "the login must still succeed: \(r)")
        #expect(Self.waitForFile(listener.accepted, seconds: 5), "pam_coffer never connected, so this test proves nothing")
        usleep(300_000)
        let bytes = listener.bytes
        #expect(!containsSubsequence(bytes, Array(pw.utf8)), "the password reached another user's socket")
        #expect(bytes.isEmpty, "pam_coffer sent \(bytes.count) bytes to another user's socket")
    }

    /// A PAM application that does what sudo does for `sudo -i -u SESSION-USER`: authenticates USER,
    /// then sets PAM_USER to SESSION-USER before opening the session. The password comes on stdin.
    /// Usage: sudo-like SERVICE USER SESSION-USER
    static let sudoLikeSource = """
        #include <security/pam_appl.h>
        #include <stdio.h>
        #include <stdlib.h>
        #include <string.h>
        static char password[256];
        static int conv(int n, const struct pam_message **msg, struct pam_response **resp, void *data) {
            (void)data;
            struct pam_response *r = calloc((size_t)n, sizeof *r);
            if (!r) return PAM_BUF_ERR;
            for (int i = 0; i < n; i++)
                if (msg[i]->msg_style == PAM_PROMPT_ECHO_OFF || msg[i]->msg_style == PAM_PROMPT_ECHO_ON) r[i].resp = strdup(password);
            *resp = r;
            return PAM_SUCCESS;
        }
        int main(int argc, char **argv) {
            if (argc != 4 || !fgets(password, sizeof password, stdin)) return 2;
            password[strcspn(password, "\\n")] = 0;
            struct pam_conv c = { conv, NULL };
            pam_handle_t *h = NULL;
            int rc = pam_start(argv[1], argv[2], &c, &h);
            if (rc != PAM_SUCCESS) return 3;
            if ((rc = pam_authenticate(h, 0)) != PAM_SUCCESS || (rc = pam_acct_mgmt(h, 0)) != PAM_SUCCESS) {
                fprintf(stderr, "authentication: %s\\n", pam_strerror(h, rc)); pam_end(h, rc); return 4;
            }
            if (strcmp(argv[2], argv[3]) != 0 && (rc = pam_set_item(h, PAM_USER, argv[3])) != PAM_SUCCESS) {
                fprintf(stderr, "pam_set_item: %s\\n", pam_strerror(h, rc)); pam_end(h, rc); return 5;
            }
            pam_setcred(h, PAM_ESTABLISH_CRED);
            if ((rc = pam_open_session(h, 0)) != PAM_SUCCESS) {
                fprintf(stderr, "open_session: %s\\n", pam_strerror(h, rc)); pam_end(h, rc); return 6;
            }
            pam_close_session(h, 0);
            pam_setcred(h, PAM_DELETE_CRED);
            pam_end(h, PAM_SUCCESS);
            return 0;
        }

        """

    /// The message types of the frames in `bytes` (what a recorder received, frames end to end).
    static func messageTypes(_ bytes: [UInt8]) -> [UInt8] {
        var types: [UInt8] = [], i = 0
        while i + 5 <= bytes.count {
            let length = Int(bytes[i]) << 24 | Int(bytes[i + 1]) << 16 | Int(bytes[i + 2]) << 8 | Int(bytes[i + 3])
            types.append(bytes[i + 4])
            guard length >= 5 else { break }
            i += 4 + length
        }
        return types
    }

    static func buildSudoLike(in dir: String) throws -> String {
        let c = dir + "/sudo-like.c", out = dir + "/sudo-like"
        try sudoLikeSource.write(toFile: c, atomically: true, encoding: .utf8)
        let r = runShell("cc -O1 -Wall -Werror -o '\(out)' '\(c)' -lpam", socket: "")
        guard r.status == 0 else { throw ModuleBuildError(output: r.stderr + r.stdout) }
        return out
    }

    /// Runs the sudo-like application under pam_wrapper with the service in `serviceDir`.
    static func sudoLike(_ app: String, serviceDir: String, user: String, sessionUser: String, password: String) -> CLIResult {
        PAMWrapper.serialized {
            runShell("printf '%s\\n' '\(password)' | LD_PRELOAD=libpam_wrapper.so PAM_WRAPPER=1 PAM_WRAPPER_SERVICE_DIR='\(serviceDir)' "
                     + "'\(app)' coffer-login '\(user)' '\(sessionUser)'", socket: "")
        }
    }

    /// `sudo -i -u B` run by A: A's password must not reach B's agent. B's "agent" is a recorder running
    /// as B, which pam_coffer's child (dropped to B) would trust; it must get nothing. The same
    /// application without the user change hands B's own password to it, so the path is live.
    @Test(.enabled(if: getuid() == 0, "needs root to create a throwaway user"))
    func passwordOfOneUserNeverReachesTheAgentOfTheSessionUser() throws {
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let app = try Self.buildSudoLike(in: tmp.path)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        let alicePassword = "alice login 5531", bobPassword = "bob login 7719"
        let other = try OtherUsersAgent(tmp, prefix: "coffer-s", alicePassword: alicePassword, bobPassword: bobPassword)
        let (bob, passdb, bobsAgent) = (other.bob, other.passdb, other.agent)
        try Self.writeLoginService(dir: services, module: module, passdb: passdb, moduleArgs: "socket=\(bobsAgent.socket)")

        // alice (the test's user) authenticates, the session is bob's.
        var r = Self.sudoLike(app, serviceDir: services, user: currentUser, sessionUser: bob.name, password: alicePassword)
        #expect(r.status == 0, "the session must still open: \(r)")
        usleep(300_000)
        #expect(!containsSubsequence(bobsAgent.bytes, Array(alicePassword.utf8)), "alice's password reached bob's agent")
        // The session is bob's, so his agent may hear that it opened and closed (SESSION), and nothing else:
        // no UNLOCK, no SET_PASSCODE, no password.
        let types = Self.messageTypes(bobsAgent.bytes)
        #expect(Set(types).isSubset(of: [0x01, 0x28]), "pam_coffer sent bob's agent more than HELLO and SESSION for alice's login: \(types)")

        // bob logging in himself: his own password reaches his agent.
        r = Self.sudoLike(app, serviceDir: services, user: bob.name, sessionUser: bob.name, password: bobPassword)
        #expect(r.status == 0, "\(r)")
        let deadline = nowMillis() + 5000
        while !containsSubsequence(bobsAgent.bytes, Array(bobPassword.utf8)) && nowMillis() < deadline { usleep(20_000) }
        #expect(containsSubsequence(bobsAgent.bytes, Array(bobPassword.utf8)), "the recorder never got bob's own password: the test proves nothing")
        #expect(!containsSubsequence(bobsAgent.bytes, Array(alicePassword.utf8)))
    }

    /// A password change whose PAM user changes between the preliminary check and the update (here a
    /// module in the stack switches it, as an application could) must not hand the first user's old
    /// and new passwords to the second user's agent. Without the switch, the path is live.
    @Test(.enabled(if: getuid() == 0, "needs root to create a throwaway user"))
    func passwordChangeOfOneUserNeverReachesTheAgentOfAnother() throws {
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let switcher = tmp.path + "/switch-user.so"
        try """
            #define PAM_SM_PASSWORD
            #include <security/pam_modules.h>
            #include <string.h>
            /* password optional switch-user.so user=NAME: PAM_USER becomes NAME in the update pass. */
            PAM_EXTERN int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc, const char **argv) {
                if (!(flags & PAM_UPDATE_AUTHTOK)) return PAM_IGNORE;
                for (int i = 0; i < argc; i++)
                    if (strncmp(argv[i], "user=", 5) == 0) pam_set_item(pamh, PAM_USER, argv[i] + 5);
                return PAM_IGNORE;
            }

            """.write(toFile: switcher + ".c", atomically: true, encoding: .utf8)
        let cc = runShell("cc -shared -fPIC -Wall -Werror -o '\(switcher)' '\(switcher).c' -lpam", socket: "")
        try #require(cc.status == 0, "\(cc)")
        let alicePassword = "alice old 3318", bobPassword = "bob old 6627"
        let other = try OtherUsersAgent(tmp, prefix: "coffer-p", alicePassword: alicePassword, bobPassword: bobPassword)
        let (bob, passdb, bobsAgent) = (other.bob, other.passdb, other.agent)
        let m = "\(Self.wrapperModules)/pam_matrix.so"
        try """
            password required \(m) passdb=\(passdb)
            password optional \(Self.wrapperModules)/pam_set_items.so
            password optional \(switcher) user=\(bob.name)
            password optional \(module) socket=\(bobsAgent.socket)

            """.write(toFile: tmp.path + "/coffer-login", atomically: true, encoding: .utf8)
        _ = FileManager.default.createFile(atPath: tmp.path + "/other", contents: Data())

        // alice changes her password; by the update pass the PAM user is bob.
        let aliceNew = "alice new 9025"
        var r = Self.pamtester(serviceDir: tmp.path, ["chauthtok"], input: "\(alicePassword)\n\(aliceNew)\n\(aliceNew)\n",
                               environment: "PAM_OLDAUTHTOK='\(alicePassword)' PAM_AUTHTOK='\(aliceNew)'")
        #expect(r.status == 0, "the password change must still succeed: \(r)")
        usleep(300_000)
        #expect(bobsAgent.connections == 0 && bobsAgent.bytes.isEmpty, "pam_coffer talked to bob's agent about alice's password")
        #expect(!containsSubsequence(bobsAgent.bytes, Array(aliceNew.utf8)) && !containsSubsequence(bobsAgent.bytes, Array(alicePassword.utf8)))

        // bob changing his own password (the switch names bob himself): his agent hears of it.
        let bobNew = "bob new 4410"
        r = Self.pamtester(serviceDir: tmp.path, ["chauthtok"], input: "\(bobPassword)\n\(bobNew)\n\(bobNew)\n",
                           environment: "PAM_OLDAUTHTOK='\(bobPassword)' PAM_AUTHTOK='\(bobNew)'", user: bob.name)
        #expect(r.status == 0, "\(r)")
        let deadline = nowMillis() + 5000
        while !containsSubsequence(bobsAgent.bytes, Array(bobNew.utf8)) && nowMillis() < deadline { usleep(20_000) }
        #expect(containsSubsequence(bobsAgent.bytes, Array(bobNew.utf8)), "the recorder never got bob's own change: the test proves nothing")
    }

    /// The same application without a user change still unlocks the real agent.
    @Test func sudoLikeApplicationWithoutUserChangeUnlocksTheAgent() throws {
        let agent = try AgentProcess(pamService: "coffer-login")
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let app = try Self.buildSudoLike(in: tmp.path)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        try Self.writeLoginService(dir: services, module: module, passdb: agent.passdb, moduleArgs: "socket=\(agent.socketPath)")
        let r = Self.sudoLike(app, serviceDir: services, user: currentUser, sessionUser: currentUser, password: AgentProcess.password)
        #expect(r.status == 0, "\(r)")
        let s = agent.cli(["status"]).stdout
        #expect(s.contains("passcode: set") && s.contains("state: unlocked"), "\(s)\n\(agent.log)")
    }

    /// A listener of the user's own uid that accepts and never answers (a hung agent, one busy
    /// elsewhere, a hostile listener), noting each connection in `accepted`; killed when released.
    final class SilentListener {
        let socket: String, accepted: String
        let process = Process()

        init(in tmp: TemporaryDirectory) throws {
            let silent = try compileC("""
                #include <stdio.h>
                #include <string.h>
                #include <sys/socket.h>
                #include <sys/un.h>
                #include <unistd.h>
                int main(int argc, char **argv) {
                    if (argc != 3) return 2;
                    int s = socket(AF_UNIX, SOCK_STREAM, 0);
                    struct sockaddr_un a = { .sun_family = AF_UNIX };
                    strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
                    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 4) != 0) { perror("silent"); return 1; }
                    for (;;) {
                        int c = accept(s, NULL, NULL); /* kept open, never read, never answered */
                        if (c < 0) continue;
                        FILE *f = fopen(argv[2], "a"); if (f) { fputs("accepted\\n", f); fclose(f); }
                    }
                }

                """, named: "silent", in: tmp.path)
            socket = tmp.path + "/agent.sock"; accepted = tmp.path + "/accepted"
            process.executableURL = URL(fileURLWithPath: silent)
            process.arguments = [socket, accepted]
            try process.run()
            guard PAMModuleTests.waitForFile(socket, seconds: 10) else { throw StartError() }
        }

        struct StartError: Error {}

        deinit { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() }
    }

    /// One login against a listener that never answers, with `moduleArgs` besides socket=; its result and duration.
    static func loginAgainstSilentListener(moduleArgs: String) throws -> (result: CLIResult, elapsedMs: Double) {
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try buildModule(into: tmp)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        let passdb = tmp.path + "/passdb"
        try "\(currentUser):pw:coffer-login\n".write(toFile: passdb, atomically: true, encoding: .utf8)
        let listener = try SilentListener(in: tmp)
        try writeLoginService(dir: services, module: module, passdb: passdb, moduleArgs: "socket=\(listener.socket) \(moduleArgs)")
        let start = nowMillis()
        let r = pamtester(serviceDir: services, ["authenticate", "open_session"], input: "pw\npw\n")
        let elapsed = nowMillis() - start
        #expect(Files.exists(listener.accepted), "pam_coffer never connected, so this test proves nothing")
        return (r, elapsed)
    }

    /// A socket of the user's own uid that accepts and never answers (a hung agent, one in its backoff, a
    /// hostile listener) delays the login by the module's budget (about 2 s), not by 30 s or more.
    @Test func aListenerThatNeverAnswersDelaysTheLoginOnlyBriefly() throws {
        let (r, elapsed) = try Self.loginAgainstSilentListener(moduleArgs: "")
        #expect(r.status == 0, "the login must succeed: \(r)")
        // The budget is 2 s; the bound leaves a loaded machine room (loading the module, pamtester)
        // and still tells it from a login held for 30 s or more.
        #expect(elapsed < 15_000, "the login waited \(Int(elapsed)) ms for a listener that never answers")
    }

    /// budget_ms= gives the exchange more time (for a slow machine): a listener that never answers then
    /// holds the login for that long, not for the default 2 s.
    @Test func budgetMsGivesTheAgentMoreTime() throws {
        let (r, elapsed) = try Self.loginAgainstSilentListener(moduleArgs: "budget_ms=4000")
        #expect(r.status == 0, "the login must succeed: \(r)")
        #expect(elapsed >= 4000, "the login gave up after \(Int(elapsed)) ms, before the 4000 ms of budget_ms=")
    }

    @Test func sessionStartsTheAgentWhenAsked() throws {
        let agent = try AgentProcess(pamService: "coffer-login", start: false)
        let tmp = TemporaryDirectory("coffer-pam")
        let module = try Self.buildModule(into: tmp)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        // Everything after --socket PATH is passed as agentarg=… tokens.
        let extra = agent.agentArguments.dropFirst(2).map { "agentarg=\($0)" }.joined(separator: " ")
        try Self.writeLoginService(dir: services, module: module, passdb: agent.passdb,
                                   moduleArgs: "socket=\(agent.socketPath) budget_ms=60000 agent=\(Binaries.cofferd) \(extra)")
        try FileManager.default.createDirectory(atPath: Files.directoryName(agent.socketPath), withIntermediateDirectories: true)
        let pw = AgentProcess.password
        let r = Self.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "\(pw)\n\(pw)\n")
        #expect(r.status == 0, "\(r)")
        let s = agent.cli(["status"])
        #expect(s.status == 0 && s.stdout.contains("passcode: set") && s.stdout.contains("state: unlocked"), "\(s)")
        // Stop the agent the module started.
        let pid = runShell("pgrep -f -- '--socket \(agent.socketPath)'", socket: "").stdout.split(separator: "\n").first.flatMap { Int32($0) }
        if let pid { kill(pid, SIGTERM) }
        #expect(pid != nil)
    }
}


/// contrib/install.sh into a staging root (DESTDIR): what an administrator runs, checked without touching the system.
@Suite struct InstallScriptTests {
    @Test func installsEverythingIdempotently() throws {
        let root = TemporaryDirectory("coffer-install")
        let cmd = "DESTDIR='\(root.path)' bash '\(Binaries.packageRoot)/contrib/install.sh' --bin-dir '\(Binaries.directory)' --enable-pam-login"
        for _ in 0..<2 {
            let r = runShell(cmd, socket: "")
            #expect(r.status == 0, "\(r)")
        }
        for f in ["usr/local/bin/cofferd", "usr/local/bin/coffer", "usr/local/bin/coffer-cli", "usr/local/bin/pinentry-coffer", "usr/local/bin/git-credential-coffer", "usr/local/bin/coffer-plugin-host"] { #expect(Files.mode(root.file(f)) == 0o755, "\(f)") }
        for f in ["usr/local/lib/coffer/plugins/libCofferPluginPasscode.so", "usr/local/lib/coffer/plugins/libCofferPluginFprintd.so",
                  "usr/local/share/man/man1/coffer.1", "usr/local/share/man/man1/pinentry-coffer.1", "usr/local/share/man/man1/git-credential-coffer.1",
                  "usr/local/share/man/man8/cofferd.8", "usr/local/share/man/man8/pam_coffer.8"] {
            #expect(Files.mode(root.file(f)) == 0o644, "\(f)")
        }
        #expect(!Files.exists(root.file("usr/local/lib/coffer/plugins/libCofferPluginBiometricEmulator.so")), "a test plugin was installed")
        // Completions generated by the installed CLI, one per shell, for the command people type.
        for (f, marker) in [("usr/local/share/bash-completion/completions/coffer", "complete -o filenames -F _coffer coffer"),
                            ("usr/local/share/zsh/site-functions/_coffer", "#compdef coffer"),
                            ("usr/local/share/fish/vendor_completions.d/coffer.fish", "complete -c 'coffer'")] {
            let text = (try? String(contentsOfFile: root.file(f), encoding: .utf8)) ?? ""
            #expect(Files.mode(root.file(f)) == 0o644 && text.contains(marker), "\(f)")
        }
        // The installed `coffer` finds the installed `coffer-cli` for the commands it hands over.
        let status = runShell("'\(root.file("usr/local/bin/coffer"))' status", socket: "/nonexistent/agent.sock")
        #expect(status.status == 9 && status.stderr.hasPrefix("coffer: errSecIO (-36)"), "\(status)")
        #expect(Files.mode(root.file("etc/pam.d/coffer")) == 0o644)
        #expect(Files.exists(root.file("usr/lib/systemd/user/coffer-agent.socket")))
        #expect(Files.exists(root.file("usr/lib/systemd/user/coffer-agent.service")))
        #expect(Files.mode(root.file("usr/local/include/coffer/coffer_wire.h")) == 0o644)
        let modules = runShell("find '\(root.path)' -name pam_coffer.so", socket: "").stdout
        #expect(modules.contains("/security/pam_coffer.so"), "\(modules)")
        let auth = (try? String(contentsOfFile: root.file("etc/pam.d/common-auth"), encoding: .utf8)) ?? ""
        #expect(auth.components(separatedBy: "pam_coffer.so").count == 2, "line added twice or not at all: \(auth)")
        // The unit must not switch on anything that sets no_new_privs (or a user namespace): pam_unix
        // would lose its setgid unix_chkpwd helper and every unlock would fail.
        let unit = (try? String(contentsOfFile: root.file("usr/lib/systemd/user/coffer-agent.service"), encoding: .utf8)) ?? ""
        let active = unit.split(separator: "\n").filter { !$0.hasPrefix("#") }.map(String.init)
        for option in ["NoNewPrivileges=", "RestrictAddressFamilies=", "SystemCallFilter=", "SystemCallArchitectures=",
                       "LockPersonality=", "MemoryDenyWriteExecute=", "RestrictRealtime=", "RestrictSUIDSGID=", "PrivateTmp=",
                       "PrivateNetwork=", "PrivateDevices=", "ProtectSystem=", "ProtectHome="] {
            #expect(!active.contains { $0.hasPrefix(option) }, "\(option) would break PAM's setgid helper")
        }
        #expect(active.contains("LimitCORE=0") && active.contains("Type=notify") && active.contains("ExecReload=/bin/kill -HUP $MAINPID"))
        // The shell helper's identity: a root-only signing key, its public half trusted, and manifests
        // for the installed paths of coffer and coffer-cli (app coffer.shell, groups shell and unsigned)
        // that a trust load accepts.
        #expect(Files.mode(root.file("etc/coffer/install-signing.key")) == 0o600)
        #expect(Files.exists(root.file("etc/coffer/trusted-keys.d/coffer-install.pub")))
        let list = runShell("'\(root.file("usr/local/bin/coffer-cli"))' manifest list --no-default-dirs --key-dir '\(root.file("etc/coffer/trusted-keys.d"))' "
                            + "--manifest-dir '\(root.file("etc/coffer/manifests.d"))' --json", socket: "")
        #expect(list.status == 0, "\(list)")
        for b in ["coffer", "coffer-cli", "pinentry-coffer", "git-credential-coffer"] {
            #expect(list.stdout.contains("\"executable\":\"/usr/local/bin/\(b)\""), "\(list.stdout)")
        }
        // pinentry-coffer and git-credential-coffer are apps of their own, each with its own group.
        #expect(list.stdout.contains("\"coffer.gnupg\"") && list.stdout.contains("\"gnupg\""), "\(list.stdout)")
        #expect(list.stdout.contains("\"coffer.git\"") && list.stdout.contains("\"git\""), "\(list.stdout)")
        #expect(list.stdout.components(separatedBy: "coffer.shell").count == 3 && list.stdout.contains("\"unsigned\""), "\(list.stdout)")
        #expect(!list.stdout.contains("\"reason\""), "a file was refused: \(list.stdout)")
        let dry = runShell("bash '\(Binaries.packageRoot)/contrib/install.sh' --dry-run", socket: "")
        #expect(dry.status == 0 && dry.stdout.contains("+ install"), "\(dry)")
        // Without --bin-dir it builds what it installs: each release product not built yet is a step.
        for product in ["cofferd", "pinentry-coffer", "git-credential-coffer", "coffer-secret-service-import", "coffer-plugin-host"]
        where !FileManager.default.isExecutableFile(atPath: Binaries.packageRoot + "/.build/release/" + product) {
            #expect(dry.stdout.contains("+ swift build -c release --package-path \(Binaries.packageRoot) --product \(product)"), "\(product): \(dry.stdout)")
        }
    }
}

/// The setting of the two uid-binding tests: a throwaway user bob, a pam_matrix passdb accepting
/// alice's (the test user's) and bob's passwords, and a recorder serving a socket as bob — an agent
/// pam_coffer would trust for bob — in a directory bob can reach.
struct OtherUsersAgent {
    let bob: ThrowawayUser
    let passdb: String
    let shared: SharedDirectory
    let agent: PAMModuleTests.Recorder

    init(_ tmp: TemporaryDirectory, prefix: String, alicePassword: String, bobPassword: String) throws {
        bob = try ThrowawayUser(prefix: prefix)
        passdb = tmp.path + "/passdb"
        try "\(currentUser):\(alicePassword):coffer-login\n\(bob.name):\(bobPassword):coffer-login\n"
            .write(toFile: passdb, atomically: true, encoding: .utf8)
        shared = try SharedDirectory(prefix + "-den")
        let recorder = try shared.copyExecutable(compileC(PAMModuleTests.recorderSource, named: "recorder", in: tmp.path))
        let den = try shared.privateDirectory("den", uid: bob.uid, gid: bob.gid)
        agent = try PAMModuleTests.Recorder(in: den, executable: recorder, user: bob.name, group: bob.name)
    }
}
