import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// pam_coffer.so, built with cc, driven by pamtester under cwrap's pam_wrapper against a real agent.
@Suite struct PAMModuleTests {
    static let wrapperModules = "/usr/lib/x86_64-linux-gnu/pam_wrapper"

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
    static func pamtester(serviceDir: String, _ operations: [String], input: String, environment: String = "") -> CLIResult {
        runShell("printf '%s' '\(input)' | \(environment) LD_PRELOAD=libpam_wrapper.so PAM_WRAPPER=1 PAM_WRAPPER_SERVICE_DIR='\(serviceDir)' "
                 + "pamtester coffer-login \(currentUser) \(operations.joined(separator: " "))", socket: "")
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

    /// A process of another user serving the socket pam_coffer talks to (a stale path, a hostile
    /// XDG_RUNTIME_DIR) must never get the password. The impostor answers HELLO as an agent would
    /// and records every byte it receives; the module must reach it and then send nothing.
    @Test func passwordIsNeverSentToASocketServedByAnotherUser() throws {
        guard getuid() == 0 else {
            print("skipped: serving a socket as another user needs root")
            return
        }
        let tmp = TemporaryDirectory("coffer-pam")
        chmod(tmp.path, 0o711)
        let module = try Self.buildModule(into: tmp)
        let services = tmp.path + "/services"
        try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
        let pw = "login password 8472"
        let passdb = tmp.path + "/passdb"
        try "\(currentUser):\(pw):coffer-login\n".write(toFile: passdb, atomically: true, encoding: .utf8)
        let den = tmp.path + "/impostor"
        try FileManager.default.createDirectory(atPath: den, withIntermediateDirectories: true)
        chmod(den, 0o777)
        let socket = den + "/agent.sock", received = den + "/received", accepted = den + "/accepted"
        let impostor = try compileC("""
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
                if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 4) != 0) { perror("impostor"); return 1; }
                static const unsigned char hello[] = { 0, 0, 0, 14, 0x81, 0, 0, 0, 1, 0, 1, 0, 5, '0', '.', '1', '.', '0' };
                for (;;) {
                    int c = accept(s, NULL, NULL);
                    if (c < 0) continue;
                    FILE *f = fopen(argv[3], "a"); if (f) { fputs("accepted\\n", f); fclose(f); }
                    struct timeval tv = { 2, 0 };
                    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                    FILE *r = fopen(argv[2], "ab");
                    unsigned char buf[4096]; ssize_t n; int first = 1;
                    while ((n = recv(c, buf, sizeof buf, 0)) > 0) {
                        if (first) { (void)!write(c, hello, sizeof hello); first = 0; }
                        if (r) fwrite(buf, 1, (size_t)n, r);
                    }
                    if (r) fclose(r);
                    close(c);
                }
            }

            """, named: "impostor", in: den)
        let listener = Process()
        listener.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        listener.arguments = ["--reuid=nobody", "--regid=nogroup", "--clear-groups", impostor, socket, received, accepted]
        let log = den + "/impostor.log"
        _ = FileManager.default.createFile(atPath: log, contents: Data())
        listener.standardError = FileHandle(forWritingAtPath: log)
        try listener.run()
        // SIGKILL: the test runner's blocked signals are inherited, so SIGTERM may never arrive.
        defer { kill(listener.processIdentifier, SIGKILL); listener.waitUntilExit() }
        try #require(Self.waitForFile(socket, seconds: 10), "the impostor did not start: \(String(decoding: fileBytes(log), as: UTF8.self))")

        try Self.writeLoginService(dir: services, module: module, passdb: passdb, moduleArgs: "socket=\(socket)")
        let r = Self.pamtester(serviceDir: services, ["authenticate", "open_session", "close_session"], input: "\(pw)\n\(pw)\n")
        #expect(r.status == 0, "the login must still succeed: \(r)")
        #expect(Self.waitForFile(accepted, seconds: 5), "pam_coffer never connected, so this test proves nothing")
        usleep(300_000)
        let bytes = fileBytes(received)
        #expect(!containsSubsequence(bytes, Array(pw.utf8)), "the password reached another user's socket")
        #expect(bytes.isEmpty, "pam_coffer sent \(bytes.count) bytes to another user's socket")
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
                                   moduleArgs: "socket=\(agent.socketPath) agent=\(Binaries.cofferd) \(extra)")
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
        for f in ["usr/local/bin/cofferd", "usr/local/bin/coffer", "usr/local/bin/coffer-cli"] { #expect(Files.mode(root.file(f)) == 0o755, "\(f)") }
        // The installed `coffer` finds the installed `coffer-cli` for the commands it hands over.
        let status = runShell("'\(root.file("usr/local/bin/coffer"))' status", socket: "/nonexistent/agent.sock")
        #expect(status.status == 9 && status.stderr.hasPrefix("coffer: errSecIO (-36)"), "\(status)")
        #expect(Files.mode(root.file("etc/pam.d/coffer")) == 0o644)
        #expect(Files.exists(root.file("usr/lib/systemd/user/coffer-agent.socket")))
        #expect(Files.exists(root.file("usr/lib/systemd/user/coffer-agent.service")))
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
        #expect(active.contains("LimitCORE=0") && active.contains("Type=notify"))
        let dry = runShell("bash '\(Binaries.packageRoot)/contrib/install.sh' --dry-run", socket: "")
        #expect(dry.status == 0 && dry.stdout.contains("+ install"), "\(dry)")
    }
}
