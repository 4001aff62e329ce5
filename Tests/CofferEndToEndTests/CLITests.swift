import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Every CLI command and its errors, against a real agent over a real socket with a real PAM stack.
@Suite struct CLITests {
    @Test func fullLifecycleThroughTheCLI() throws {
        let agent = try AgentProcess()
        var r = agent.cli(["status"])
        #expect(r.status == 0 && r.stdout.contains("state: unlocked") && r.stdout.contains("passcode: not set"), "\(r)")
        // Without a passcode there is nothing to lock with.
        r = agent.cli(["lock"])
        #expect(r.status == 7 && r.stderr.contains("errSecNotAvailable (-25291)"), "\(r)")
        // passcode set needs the PAM password.
        r = agent.cli(["passcode", "set", "--passcode-stdin"], stdin: "not the login password")
        #expect(r.status == 5 && r.stderr.hasPrefix("coffer: errSecAuthFailed (-25293)"), "\(r)")
        agent.setPasscode()
        r = agent.cli(["status", "--json"])
        #expect(r.stdout.contains("\"state\":\"unlocked\"") && r.stdout.contains("\"passcodeSet\":true"), "\(r)")

        r = agent.cli(["add", "--service", "mail", "--account", "alice", "--label", "Mail", "--secret-stdin"], stdin: "hunter2\n")
        #expect(r.status == 0, "\(r)")
        r = agent.cli(["get", "--service", "mail", "--account", "alice"])
        #expect(r.status == 0 && r.stdout == "hunter2" && r.stderr.isEmpty, "\(r)")
        r = agent.cli(["add", "--service", "mail", "--account", "alice", "--secret-stdin"], stdin: "again")
        #expect(r.status == 4 && r.stderr.contains("errSecDuplicateItem (-25299)"), "\(r)")
        r = agent.cli(["get", "--service", "mail", "--account", "bob"])
        #expect(r.status == 3 && r.stderr == "coffer: errSecItemNotFound (-25300): no matching item\n" && r.stdout.isEmpty, "\(r)")

        // Internet password and arbitrary attributes.
        r = agent.cli(["add", "--server", "git.example.org", "--protocol", "htps", "--port", "443", "--path", "/repo",
                       "--account", "ci", "--attr", "icmt=deploy", "--accessible", "after-first-unlock", "--secret-stdin"], stdin: "tok")
        #expect(r.status == 0, "\(r)")
        r = agent.cli(["get", "--server", "git.example.org", "--account", "ci"])
        #expect(r.stdout == "tok", "\(r)")
        r = agent.cli(["find", "--attr", "icmt=deploy", "--json"])
        #expect(r.status == 0 && r.stdout.contains("\"class\":\"inet\"") && r.stdout.contains("\"pdmn\":\"ck\"")
                && r.stdout.contains("\"port\":443") && !r.stdout.contains("tok"), "\(r)")
        r = agent.cli(["find"])
        #expect(r.status == 0 && r.stdout.contains("svce: mail") && r.stdout.contains("srvr: git.example.org")
                && !r.stdout.contains("hunter2"), "\(r)")
        r = agent.cli(["find", "--class", "genp", "--limit", "1", "--json"])
        #expect(r.stdout.hasPrefix("[{\"class\":\"genp\"") && r.stdout.components(separatedBy: "\"class\"").count == 2, "\(r)")

        // Update the secret, the label, the accessibility.
        r = agent.cli(["update", "--service", "mail", "--account", "alice", "--secret-stdin"], stdin: "new-pass")
        #expect(r.status == 0 && r.stderr.contains("updated 1 item"), "\(r)")
        #expect(agent.cli(["get", "--service", "mail", "--account", "alice"]).stdout == "new-pass")
        r = agent.cli(["update", "--service", "mail", "--set-label", "Work mail", "--accessible", "always"])
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["find", "--service", "mail"]).stdout.contains("labl: Work mail"))

        // Lock: WhenUnlocked refused, AfterFirstUnlock and Always still read.
        r = agent.cli(["add", "--service", "wu", "--account", "a", "--secret-stdin"], stdin: "x")
        #expect(r.status == 0)
        #expect(agent.cli(["lock"]).status == 0)
        #expect(agent.cli(["status"]).stdout.contains("state: locked"))
        r = agent.cli(["get", "--service", "wu", "--account", "a"])
        #expect(r.status == 6 && r.stderr.contains("errSecInteractionNotAllowed (-25308)"), "\(r)")
        #expect(agent.cli(["get", "--server", "git.example.org", "--account", "ci"]).stdout == "tok")
        #expect(agent.cli(["get", "--service", "mail", "--account", "alice"]).stdout == "new-pass")

        // Wrong passcode refused by PAM; right one unlocks.
        r = agent.cli(["unlock", "--passcode-stdin"], stdin: "wrong")
        // ... saying how many attempts are left before a wait (issue #43), and naming nothing typed.
        #expect(r.status == 5 && r.stderr == "coffer: errSecAuthFailed (-25293): authentication failed (3 attempts left before a wait of 1 min)\n",
                "\(r)")
        #expect(!agent.log.contains("wrong"))
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(agent.cli(["get", "--service", "wu", "--account", "a"]).stdout == "x")
        // The passcode from a file descriptor, as a login script or askpass helper would pass it.
        #expect(agent.cli(["lock"]).status == 0)
        let pwFile = agent.dir.file("pw")
        try AgentProcess.password.write(toFile: pwFile, atomically: true, encoding: .utf8)
        r = runShell("exec 8<'\(pwFile)'; '\(Binaries.coffer)' unlock --passcode-fd 8", socket: agent.socketPath)
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["unlock", "--passcode-stdin", "--passcode-fd", "3"]).status == 64)

        // Delete.
        r = agent.cli(["delete", "--service", "wu"])
        #expect(r.status == 0 && r.stderr.contains("deleted 1 item"), "\(r)")
        #expect(agent.cli(["delete", "--service", "wu"]).status == 3)
        #expect(agent.cli(["delete"]).status != 0) // refuses to delete everything
        #expect(agent.cli(["status"]).stdout.contains("items: 2"))

        // Passcode change: the new one must pass PAM, the current one must open the keybag.
        r = agent.cli(["passcode", "change", "--passcode-stdin"], stdin: "wrong\n\(AgentProcess.password)\n")
        #expect(r.status == 5, "\(r)")
        r = agent.cli(["passcode", "change", "--passcode-stdin"], stdin: "\(AgentProcess.password)\n\(AgentProcess.password)\n")
        #expect(r.status == 0, "\(r)")

        #expect(agent.stop() == 0)
        #expect(agent.log.contains("keys wiped"))
        for secret in ["hunter2", "new-pass", "tok", AgentProcess.password] {
            #expect(!agent.log.contains(secret), "log leaks a secret")
        }
    }

    @Test func usageErrorsAndSecretsNeverFromArguments() throws {
        let agent = try AgentProcess()
        var r = agent.cli(["add", "--service", "s", "--account", "a"])
        #expect(r.status == 64 && r.stderr.contains("--secret-stdin"), "\(r)")
        r = agent.cli(["add", "--service", "s", "--account", "a", "--secret", "x"])
        #expect(r.status != 0, "a --secret option must not exist")
        r = agent.cli(["add", "--service", "s", "--account", "a", "--accessible", "sometimes", "--secret-stdin"], stdin: "x")
        #expect(r.status == 64 && r.stderr.contains("unknown accessibility"), "\(r)")
        // (Any other name is a general attribute: GeneralAttributeCLITests.)
        r = agent.cli(["add", "--service", "s", "--account", "a", "--attr", "=1", "--secret-stdin"], stdin: "x")
        #expect(r.status == 64 && r.stderr.contains("--attr needs a name"), "\(r)")
        r = agent.cli(["add", "--service", "s", "--account", "a", "--attr", "port=many", "--secret-stdin"], stdin: "x")
        #expect(r.status == 64 && r.stderr.contains("attribute 'port' takes an integer"), "\(r)")
        r = agent.cli(["add", "--service", "s", "--account", "a", "--secret-stdin"], stdin: "")
        #expect(r.status == 2 && r.stderr.contains("errSecParam (-50)") && r.stderr.contains("empty"), "\(r)")
        r = agent.cli(["add", "--service", "s", "--account", "a", "--accessible", "akpu", "--secret-stdin"], stdin: "x")
        #expect(r.status == 7 && r.stderr.contains("errSecNotAvailable"), "\(r)")
        // A get that names no item is a usage error showing how to ask, never the first item found.
        #expect(agent.cli(["add", "--service", "first", "--account", "a", "--secret-stdin"], stdin: "arbitrary").status == 0)
        for args in [["get"], ["get", "--access-group", "unsigned"], ["get", "--class", "genp", "--format", "json"]] {
            r = agent.cli(args)
            #expect(r.status == 64 && r.stdout.isEmpty && r.stderr.contains("coffer get --service"), "\(args): \(r)")
        }
        // Secret from a file descriptor.
        let path = agent.dir.file("secret.txt")
        try "from-fd".write(toFile: path, atomically: true, encoding: .utf8)
        r = runShell("exec 7<'\(path)'; '\(Binaries.coffer)' add --service fd --account a --secret-fd 7", socket: agent.socketPath)
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["get", "--service", "fd", "--account", "a"]).stdout == "from-fd")
    }

    /// `get` has a fast path that skips the argument parser; it must answer exactly like the full parser.
    @Test func fastAndFullGetAgree() throws {
        let agent = try AgentProcess()
        #expect(agent.cli(["add", "--service", "s", "--account", "a", "--secret-stdin"], stdin: "v").status == 0)
        #expect(agent.cli(["add", "--server", "h", "--account", "a", "--secret-stdin"], stdin: "w").status == 0)
        let fast = agent.cli(["get", "--account", "a", "--service", "s"])
        let full = agent.cli(["get", "--class", "genp", "--account", "a", "--service", "s"])
        #expect(fast.stdout == "v" && full.stdout == "v" && fast.status == 0 && full.status == 0)
        #expect(agent.cli(["get", "--server", "h", "--account", "a"]).stdout == "w")
        #expect(agent.cli(["get", "--class", "inet", "--server", "h", "--account", "a"]).stdout == "w")
        let fastMiss = agent.cli(["get", "--service", "s", "--account", "nope"])
        let fullMiss = agent.cli(["get", "--class", "genp", "--service", "s", "--account", "nope"])
        #expect(fastMiss.status == 3 && fastMiss.status == fullMiss.status && fastMiss.stderr == fullMiss.stderr, "\(fastMiss) \(fullMiss)")
        // Repeated or unknown options fall through to the full parser (which takes the last value of a
        // repeated option, and refuses unknown ones).
        #expect(agent.cli(["get", "--service", "t", "--service", "s", "--account", "a"]).stdout == "v")
        #expect(agent.cli(["get", "--service", "s", "--bogus", "x"]).status == 64)
        let viaSocket = runCLI(["get", "--service", "s", "--account", "a", "--socket", agent.socketPath])
        #expect(viaSocket.stdout == "v", "\(viaSocket)")
    }

    /// `add` has the same fast path: an item added through it is exactly the one the full parser
    /// adds, and its errors read the same.
    @Test func fastAndFullAddAgree() throws {
        let agent = try AgentProcess()
        #expect(agent.cli(["add", "--service", "fast", "--account", "a", "--label", "L", "--secret-stdin"], stdin: "v1").status == 0)
        #expect(agent.cli(["add", "--class", "genp", "--service", "full", "--account", "a", "--label", "L", "--secret-stdin"], stdin: "v2").status == 0)
        /// Everything `find --json` shows but the service and the dates.
        func shape(_ service: String) -> String {
            let json = agent.cli(["find", "--service", service, "--json"]).stdout
            return json.replacingOccurrences(of: "\"svce\":\"\(service)\"", with: "")
                .replacingOccurrences(of: #""(cdat|mdat)":"[^"]*""#, with: "", options: .regularExpression)
        }
        #expect(shape("fast") == shape("full") && shape("fast").contains("\"pdmn\":\"ak\""), "\(shape("fast")) vs \(shape("full"))")
        #expect(agent.cli(["get", "--service", "fast", "--account", "a"]).stdout == "v1")
        let fastDup = agent.cli(["add", "--service", "fast", "--account", "a", "--secret-stdin"], stdin: "x")
        let fullDup = agent.cli(["add", "--class", "genp", "--service", "fast", "--account", "a", "--secret-stdin"], stdin: "x")
        #expect(fastDup.status == 4 && fastDup.status == fullDup.status && fastDup.stderr == fullDup.stderr, "\(fastDup) \(fullDup)")
        // Forms the fast path does not take go to the full parser: --opt=value, a value that looks
        // like an option, both secret sources at once.
        #expect(agent.cli(["add", "--service=eq", "--account", "a", "--secret-stdin"], stdin: "v3").status == 0)
        #expect(agent.cli(["get", "--service", "eq", "--account", "a"]).stdout == "v3")
        let both = agent.cli(["add", "--service", "s", "--account", "a", "--secret-stdin", "--secret-fd", "0"], stdin: "x")
        #expect(both.status == 64 && both.stderr.contains("either --secret-stdin or --secret-fd"), "\(both)")
    }

    /// `coffer` without `coffer-cli` beside it still answers its fast forms, and says what is missing otherwise.
    @Test func cofferWithoutTheFullParser() throws {
        let dir = TemporaryDirectory("coffer-alone")
        let lone = dir.file("coffer")
        try FileManager.default.copyItem(atPath: Binaries.coffer, toPath: lone)
        let r = runShell("'\(lone)' status", socket: "/nonexistent/agent.sock")
        #expect(r.status == 14 && r.stderr.contains("coffer-cli is not installed beside coffer"), "\(r)")
        let g = runShell("'\(lone)' get --service s --account a", socket: "/nonexistent/agent.sock")
        #expect(g.status == 9 && g.stderr.hasPrefix("coffer: errSecIO (-36)"), "\(g)")
    }

    /// An empty query acts on every item only with an explicit `--all` (issue #10: `update
    /// --secret-stdin` without a query overwrote every item's secret).
    @Test func updateAndDeleteOfEveryItemNeedAll() throws {
        let agent = try AgentProcess()
        for (s, secret) in [("one", "s1"), ("two", "s2")] {
            #expect(agent.cli(["add", "--service", s, "--account", "a", "--secret-stdin"], stdin: secret).status == 0)
        }
        var r = agent.cli(["update", "--secret-stdin"], stdin: "overwritten")
        #expect(r.status == 64 && r.stderr.contains("refusing to update every item") && r.stderr.contains("--all"), "\(r)")
        r = agent.cli(["update", "--set-label", "L"])
        #expect(r.status == 64 && r.stderr.contains("refusing to update every item"), "\(r)")
        #expect(agent.cli(["get", "--service", "one", "--account", "a"]).stdout == "s1")
        #expect(agent.cli(["get", "--service", "two", "--account", "a"]).stdout == "s2")
        r = agent.cli(["update", "--all", "--service", "one", "--set-label", "L"])
        #expect(r.status == 64 && r.stderr.contains("--all cannot be combined with a query"), "\(r)")
        r = agent.cli(["delete"])
        #expect(r.status == 64 && r.stderr.contains("refusing to delete every item") && r.stderr.contains("--all"), "\(r)")
        r = agent.cli(["delete", "--all", "--class", "genp"])
        #expect(r.status == 64 && r.stderr.contains("--all cannot be combined with a query"), "\(r)")
        #expect(agent.cli(["status"]).stdout.contains("items: 2"))

        r = agent.cli(["update", "--all", "--secret-stdin"], stdin: "everyone")
        #expect(r.status == 0 && r.stderr == "coffer: updated 2 items\n", "\(r)")
        #expect(agent.cli(["get", "--service", "one", "--account", "a"]).stdout == "everyone")
        #expect(agent.cli(["get", "--service", "two", "--account", "a"]).stdout == "everyone")
        r = agent.cli(["delete", "--all"])
        #expect(r.status == 0 && r.stderr == "coffer: deleted 2 items\n", "\(r)")
        #expect(agent.cli(["status"]).stdout.contains("items: 0"))
    }

    /// `find` text output escapes what could forge a block or reach the terminal (issue #10): a
    /// label with a newline and a fake `service:` line, an ESC sequence, a C1 CSI, a backslash.
    @Test func findEscapesControlCharacters() throws {
        let agent = try AgentProcess()
        let label = "x\nservice: forged\u{1b}[2J\u{9b}31m\t\\end\r"
        var r = agent.cli(["add", "--service", "s", "--account", "a", "--label", label, "--secret-stdin"], stdin: "v")
        #expect(r.status == 0, "\(r)")
        r = agent.cli(["find", "--service", "s"])
        #expect(r.status == 0, "\(r)")
        #expect(r.stdout.contains("labl: x\\nservice: forged\\x1b[2J\\u{009b}31m\\t\\\\end\\r\n"), "\(r.stdout)")
        #expect(!r.stdout.unicodeScalars.contains { $0.value < 0x20 && $0 != "\n" || (0x7F...0x9F).contains($0.value) })
        let lines = r.stdout.split(separator: "\n")
        #expect(!lines.contains { $0.hasPrefix("service:") } && lines.count == 9, "\(lines)")
        r = agent.cli(["find", "--service", "s", "--json"])
        #expect(r.status == 0 && r.stdout.contains(#""labl":"x\nservice: forged\u001b[2J\u009b31m\t\\end\r""#), "\(r.stdout)")
        #expect(!r.stdout.unicodeScalars.contains { $0.value < 0x20 && $0 != "\n" || (0x7F...0x9F).contains($0.value) })
        let parsed = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [[String: Any]]
        #expect(parsed?.first?["labl"] as? String == label)
    }

    /// Secret input drops exactly one trailing "\n" (the documented rule); a "\r" is part of the
    /// secret, on the fast path (`coffer add`) and in coffer-cli (add with other options, update).
    @Test func secretInputKeepsACarriageReturn() throws {
        let agent = try AgentProcess()
        var r = agent.cli(["add", "--service", "fast", "--account", "a", "--secret-stdin"], stdin: "pw\r\n")
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["get", "--service", "fast", "--account", "a"]).stdout == "pw\r")
        r = agent.cli(["add", "--class", "genp", "--service", "full", "--account", "a", "--secret-stdin"], stdin: "pw\r\n")
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["get", "--service", "full", "--account", "a"]).stdout == "pw\r")
        r = agent.cli(["update", "--service", "full", "--secret-stdin"], stdin: "new\r")
        #expect(r.status == 0, "\(r)")
        #expect(agent.cli(["get", "--service", "full", "--account", "a"]).stdout == "new\r")
        // Only one newline goes, and only a newline.
        #expect(agent.cli(["add", "--service", "two", "--account", "a", "--secret-stdin"], stdin: "pw\n\n").status == 0)
        #expect(agent.cli(["get", "--service", "two", "--account", "a"]).stdout == "pw\n")
    }

    @Test func noAgentIsErrSecIO() {
        let r = runCLI(["status", "--socket", "/nonexistent/agent.sock"])
        #expect(r.status == 9 && r.stderr.hasPrefix("coffer: errSecIO (-36): cannot reach the agent at /nonexistent/agent.sock"), "\(r)")
        let env = runCLI(["status"], environment: ["XDG_RUNTIME_DIR": "/nonexistent-runtime"])
        #expect(env.status == 9 && env.stderr.contains("/nonexistent-runtime/coffer/agent.sock"), "\(env)")
    }
}

/// Runs a shell snippet with COFFER_SOCKET set.
func runShell(_ script: String, socket: String) -> CLIResult {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: "/bin/sh")
    p.arguments = ["-c", script]
    var env = ProcessInfo.processInfo.environment
    env["COFFER_SOCKET"] = socket
    p.environment = env
    let out = Pipe(), err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try? p.run()
    let o = out.fileHandleForReading.readDataToEndOfFile(), e = err.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return CLIResult(status: p.terminationStatus, stdout: String(decoding: o, as: UTF8.self), stderr: String(decoding: e, as: UTF8.self))
}

/// Builds a test helper from C source with cc (already a build dependency, like the PAM module),
/// so that end-to-end tests need no interpreter on the machine. Returns the executable's path.
func compileC(_ source: String, named name: String, in directory: String) throws -> String {
    let c = directory + "/" + name + ".c", out = directory + "/" + name
    try source.write(toFile: c, atomically: true, encoding: .utf8)
    let r = runShell("cc -O1 -Wall -Werror -o '\(out)' '\(c)'", socket: "")
    guard r.status == 0 else { throw CHelperBuildError(name: name, output: r.stderr + r.stdout) }
    chmod(out, 0o755)
    return out
}

struct CHelperBuildError: Error { let name: String, output: String }
