import CofferModel
import CofferTestSupport
import Foundation
import Testing

/// A person at a terminal (issue #23, part 3), on a real pseudo-terminal (util-linux `script`) with a
/// real agent: commands given no `--…-stdin`/`--…-fd` ask on /dev/tty with echo off, new secrets
/// twice; Ctrl-C restores the terminal and ends the command by SIGINT; errors say what to do next.
@Suite(.serialized, .enabled(if: TerminalRun.available, "needs util-linux script and setsid"))
struct TerminalTests {
    static func onTerminal(_ agent: AgentProcess, _ args: [String], _ steps: [(prompt: String, answer: String)]) -> TerminalRun {
        TerminalRun.run([Binaries.coffer] + args + ["--socket", agent.socketPath], steps: steps)
    }

    static func state(_ agent: AgentProcess) -> String {
        agent.cli(["status"]).stdout.split(separator: "\n").first.map(String.init) ?? ""
    }

    @Test func unlockAsksForThePasscodeWithEchoOff() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        #expect(agent.cli(["lock"]).status == 0)
        let t = Self.onTerminal(agent, ["unlock"], [("Passcode: ", AgentProcess.password)])
        #expect(t.status == 0 && t.prompted, "\(t)")
        #expect(!t.output.contains(AgentProcess.password), "the passcode was echoed: \(t.output)")
        #expect(Self.state(agent) == "state: unlocked")

        // Without a terminal the usage error stays (nothing waits for a person).
        let detached = AccessControlCLITests.detached(agent, ["unlock"])
        #expect(detached.status == 64 && detached.stderr.contains("give exactly one of --passcode-stdin or --passcode-fd N"), "\(detached)")
    }

    @Test func passcodeSetAsksTwiceAndAMismatchChangesNothing() throws {
        let agent = try AgentProcess()
        let mismatch = Self.onTerminal(agent, ["passcode", "set"],
                                       [("New passcode", AgentProcess.password), ("Same passcode again: ", "correct hors")])
        #expect(mismatch.status == 2 && mismatch.output.contains("errSecParam (-50): the two passcodes you typed differ; nothing was changed"),
                "\(mismatch)")
        #expect(agent.cli(["status"]).stdout.contains("passcode: not set"))

        let set = Self.onTerminal(agent, ["passcode", "set"],
                                  [("New passcode", AgentProcess.password), ("Same passcode again: ", AgentProcess.password)])
        #expect(set.status == 0 && set.prompted, "\(set)")
        #expect(!set.output.contains(AgentProcess.password), "the passcode was echoed")
        #expect(agent.cli(["status"]).stdout.contains("passcode: set"))

        // change: the current one, then the new one twice; a mismatch sends nothing.
        let change = Self.onTerminal(agent, ["passcode", "change"],
                                     [("Current passcode: ", AgentProcess.password), ("New passcode", "another one"), ("Same passcode again: ", "another on")])
        #expect(change.status == 2 && change.output.contains("differ"), "\(change)")
        #expect(agent.cli(["lock"]).status == 0)
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
    }

    @Test func passcodeSyncAndRemoveAskOnTheTerminal() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        #expect(agent.cli(["lock"]).status == 0)
        // The login password changed behind Coffer's back (as PasscodeSyncTests does it).
        let user = String(try String(contentsOfFile: agent.passdb, encoding: .utf8).prefix { $0 != ":" })
        try "\(user):new horse:\(agent.pamService)\n".write(toFile: agent.passdb, atomically: true, encoding: .utf8)
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: "new horse").status == 5)
        let sync = Self.onTerminal(agent, ["passcode", "sync"], [("Previous login password: ", AgentProcess.password)])
        #expect(sync.status == 0 && sync.prompted && !sync.output.contains(AgentProcess.password), "\(sync)\n\(agent.log)")
        #expect(!agent.cli(["status"]).stdout.contains("out of sync"))
        let remove = Self.onTerminal(agent, ["passcode", "remove"], [("Current passcode: ", "new horse")])
        #expect(remove.status == 0 && remove.prompted, "\(remove)")
        #expect(agent.cli(["status"]).stdout.contains("passcode: not set"))
    }

    @Test func addWithoutASecretOptionAsksTwiceThroughTheFastBinary() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        // `coffer` (the fast path) hands this form to coffer-cli, which asks.
        let t = Self.onTerminal(agent, ["add", "--service", "typed", "--account", "me"],
                                [("Secret: ", "s3cret typed"), ("Same secret again: ", "s3cret typed")])
        #expect(t.status == 0 && t.prompted && !t.output.contains("s3cret"), "\(t)")
        #expect(agent.cli(["get", "--service", "typed", "--account", "me"]).stdout == "s3cret typed")

        let typo = Self.onTerminal(agent, ["add", "--service", "typo", "--account", "me"],
                                   [("Secret: ", "one"), ("Same secret again: ", "two")])
        #expect(typo.status == 2 && typo.output.contains("the two secrets you typed differ"), "\(typo)")
        #expect(agent.cli(["get", "--service", "typo", "--account", "me"]).status == 3)

        let detached = AccessControlCLITests.detached(agent, ["add", "--service", "x", "--account", "me"])
        #expect(detached.status == 64 && detached.stderr.contains("give the secret with --secret-stdin or --secret-fd N"), "\(detached)")
    }

    @Test func backupAndEscrowAskOnTheTerminal() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        #expect(agent.cli(["add", "--service", "kept", "--account", "me", "--secret-stdin"], stdin: "v").status == 0)
        let dir = TemporaryDirectory("coffer-terminal")
        let file = dir.file("b.cfbu")
        let sh = TerminalRun.shellWord
        let created = TerminalRun.run(["/bin/sh", "-c", "printf %s \(sh(AgentProcess.password)) > \(sh(dir.file("pc"))); exec \(sh(Binaries.coffer)) backup create --out \(sh(file)) --auth-passcode-fd 3 --socket \(sh(agent.socketPath)) 3<\(sh(dir.file("pc")))"],
                                      steps: [("Backup password: ", "backup pw"), ("Same backup password again: ", "backup pw")])
        #expect(created.status == 0 && created.prompted && created.output.contains("backed up 1 item"), "\(created)")
        let restore = TerminalRun.run(["/bin/sh", "-c", "exec \(sh(Binaries.coffer)) backup restore \(sh(file)) --dry-run --socket \(sh(agent.socketPath)) 3<\(sh(dir.file("pc"))) --auth-passcode-fd 3"],
                                      steps: [("Backup password: ", "backup pw")])
        #expect(restore.status == 0 && restore.output.contains("kept (already present): 1"), "\(restore)")

        // escrow create: the agent's own prompt asks for the passcode on the terminal (the secret goes to the file).
        let escrow = TerminalRun.run(["/bin/sh", "-c", "exec \(sh(Binaries.coffer)) escrow create --socket \(sh(agent.socketPath)) > \(sh(dir.file("escrow")))"],
                                     steps: [("Passcode: ", AgentProcess.password)])
        #expect(escrow.status == 0 && escrow.prompted && !escrow.output.contains(AgentProcess.password), "\(escrow)")
        let secret = try String(contentsOfFile: dir.file("escrow"), encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(secret.count == 64)
        #expect(agent.cli(["lock"]).status == 0)
        let unlock = Self.onTerminal(agent, ["escrow", "unlock"], [("Escrow secret (64 hex digits): ", secret)])
        #expect(unlock.status == 0 && unlock.prompted && !unlock.output.contains(secret), "\(unlock)")
        #expect(Self.state(agent) == "state: unlocked")
        let revoke = Self.onTerminal(agent, ["escrow", "revoke"], [("Passcode: ", AgentProcess.password)])
        #expect(revoke.status == 0 && revoke.prompted, "\(revoke)")
        #expect(agent.cli(["lock"]).status == 0)
        let stale = Self.onTerminal(agent, ["escrow", "unlock"], [("Escrow secret (64 hex digits): ", secret)])
        #expect(stale.status != 0 && Self.state(agent) == "state: locked", "\(stale)")
    }

    /// Ctrl-C at a prompt: the terminal gets its echo back and the command ends by SIGINT, which the
    /// shell reports as 130 (docs/cli.md's and coffer(1)'s documented status).
    @Test func controlCRestoresTheTerminalAndEndsWithStatus130() throws {
        // The agent's own prompt (an item with an access control) first, while unlocked; then the CLI's.
        let agent = try AccessControlCLITests.agentWithProtectedItem()
        for args in [["get", "--service", "bank", "--account", "me"], ["lock"], ["unlock"], ["passcode", "remove"], ["add", "--service", "c", "--account", "me"]] {
            if args == ["lock"] {
                #expect(agent.cli(args).status == 0)
                continue
            }
            // The shell ignores SIGINT itself (so it lives to report), coffer catches it at the prompt.
            let command = TerminalRun.shellCommand([Binaries.coffer] + args + ["--socket", agent.socketPath])
            let t = TerminalRun.run(["/bin/sh", "-c", "trap '' INT; \(command); echo \"exit=$?\"; stty -a"],
                                    steps: [(args[0] == "add" ? "Secret: " : "asscode: ", "\u{03}")])
            #expect(t.prompted && t.output.contains("exit=130"), "\(args): \(t)")
            // stty -a lists the local flags: "echo" is on again, not "-echo".
            let flags = t.output.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "\r" || $0 == ";" })
            #expect(flags.contains("echo") && !flags.contains("-echo"), "\(args): echo not restored: \(t.output)")
        }
        #expect(Self.state(agent) == "state: locked")
    }
    /// The shell helper, with another app's group authorized for reuse (the passcode typed once in
    /// this terminal's session), still completes only the names of its own groups: the reuse widens
    /// what its commands may name, never what TAB offers. The second `get` shows the grant was live
    /// throughout (no second prompt).
    @Test func completionNeverOffersAGroupAuthorizedForReuse() throws {
        let apps = try SignedApps()
        let aPath = try apps.app("appA", appID: "com.example.a", groups: ["a"])
        let shellPath = try apps.app("shell", appID: "coffer.shell", groups: ["shell", "unsigned"])
        let agent = try apps.startAgent(["authorization-reuse = 3600"])
        agent.setPasscode()
        #expect(AppClient(executable: aPath, agent: agent).add("vault-of-a", "me", secret: "secret-of-a").status == 0)
        #expect(agent.cli(["add", "--service", "mine", "--account", "me", "--secret-stdin"], stdin: "v").status == 0)
        let get = [shellPath, "get", "--socket", agent.socketPath, "--access-group", "a", "--service", "vault-of-a", "--account", "me"]
        // As bash's script calls it for `coffer find --socket S --service <TAB>` (word 5, cursor 0).
        let complete = [shellPath, "---completion", "find", "--", "--service", "5", "0", "coffer", "find", "--socket", agent.socketPath, "--service", ""]
        let prompt = "type your passcode"
        let t = TerminalRun.run(["/bin/sh", "-c", TerminalRun.shellCommand(get) + "; echo; echo completion:; " + TerminalRun.shellCommand(complete)
                                    + "; echo :end; " + TerminalRun.shellCommand(get)],
                                steps: [(prompt, AgentProcess.password), (prompt, AgentProcess.password)])
        #expect(t.status == 0 && t.output.components(separatedBy: "secret-of-a").count == 3, "\(t)\n\(agent.log)")
        #expect(t.output.components(separatedBy: prompt).count == 2, "the reuse window was not live for the completion: \(t)")
        let offered = t.output.components(separatedBy: "completion:").last?.components(separatedBy: ":end").first ?? ""
        #expect(offered.split(whereSeparator: { $0.isWhitespace }) == ["mine"], "\(t)")
    }
}

/// Errors that say what to do next, `--version`, "did you mean", and value completion (no pty needed).
@Suite(.serialized)
struct CLIGuidanceTests {
    @Test func aLockedKeychainNamesTheUnlockCommand() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        #expect(agent.cli(["add", "--service", "s", "--account", "me", "--secret-stdin"], stdin: "v").status == 0)
        #expect(agent.cli(["lock"]).status == 0)
        // With --socket on another path than the default, the hint names it too.
        let r = runCLI(["get", "--service", "s", "--account", "me", "--socket", agent.socketPath])
        let lines = r.stderr.split(separator: "\n")
        #expect(r.status == 6 && lines.first?.hasPrefix("coffer: errSecInteractionNotAllowed (-25308): ") == true, "\(r)")
        #expect(lines.count == 2 && lines[1] == "coffer: hint: the keychain is locked; unlock it with: coffer unlock --socket \(agent.socketPath)", "\(r)")
        let viaEnvironment = agent.cli(["find", "--service", "s"])
        #expect(viaEnvironment.stderr.contains("coffer: hint: the keychain is locked; unlock it with: coffer unlock\n"), "\(viaEnvironment)")
    }

    /// A client on a locked keychain makes the one connection it opened: the client library never
    /// opens another to explain a refusal (git-credential-coffer names the error in one line), and
    /// `coffer` asks for its `coffer unlock` hint on its own connection.
    @Test func aLockedKeychainCostsEachClientOneConnection() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        #expect(agent.cli(["add", "--service", "s", "--account", "me", "--secret-stdin"], stdin: "v").status == 0)
        let git = Binaries.directory + "/git-credential-coffer"
        #expect(runCLI(["--socket", agent.socketPath, "store"], stdin: "protocol=https\nhost=h.example\nusername=u\npassword=p\n\n",
                       executable: git).status == 0)
        #expect(agent.cli(["lock"]).status == 0)
        /// Runs `body`; returns its result and how many connections the agent accepted meanwhile (it
        /// logs each before reading from it, so all are logged once the client has its replies). The
        /// test process's own are not counted: the harness's readiness probe at start may be logged
        /// late, after a slow machine (a sanitizer build) spent seconds hashing the large test executable.
        let ownExecutable = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? "/proc/self/exe"
        func counting(_ body: () -> CLIResult) -> (CLIResult, Int) {
            let before = agent.log.utf8.count
            let r = body()
            let log = Array(agent.log.utf8)
            let lines = String(decoding: log[min(before, log.count)...], as: UTF8.self).split(separator: "\n")
            return (r, lines.filter { $0.contains("client connected") && !$0.contains(" \(ownExecutable) ") }.count)
        }
        let (helper, helperConnections) = counting {
            runCLI(["--socket", agent.socketPath, "get"], stdin: "protocol=https\nhost=h.example\n\n", executable: git)
        }
        // Refused as locked (audited), which git-credential-coffer leaves to git without a word.
        #expect(helper.status == 0 && helper.stdout.isEmpty && helper.stderr.isEmpty, "\(helper)")
        #expect(auditRecords(agent).contains { ($0["result"] as? Int) == -25308 }, "\(auditRecords(agent))")
        #expect(helperConnections == 1, "\(helper)\n\(agent.log)")
        let (get, getConnections) = counting { runCLI(["get", "--service", "s", "--account", "me", "--socket", agent.socketPath]) }
        #expect(get.status == 6 && get.stderr.hasSuffix("\ncoffer: hint: the keychain is locked; unlock it with: coffer unlock --socket \(agent.socketPath)\n"),
                "\(get)")
        #expect(getConnections == 1, "\(get)\n\(agent.log)")
    }

    /// TAB never hangs the shell on an agent that accepts but does not answer (stopped here): the
    /// completion's connection gives up after its reply timeout and offers nothing. (Killed after
    /// 120 s otherwise, which fails the test.)
    @Test func completionGivesUpOnAnAgentThatDoesNotAnswer() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        #expect(agent.cli(["add", "--service", "mine", "--account", "me", "--secret-stdin"], stdin: "v").status == 0)
        let complete = ["---completion", "find", "--", "--service", "5", "0", "coffer", "find", "--socket", agent.socketPath, "--service", ""]
        #expect(runCLI(complete, timeout: 120).stdout == "mine\n")
        #expect(kill(agent.pid, SIGSTOP) == 0)
        defer { kill(agent.pid, SIGCONT) }
        let r = runCLI(complete, timeout: 120)
        #expect(r.status == 0 && r.stdout.isEmpty, "\(r)")
    }

    @Test func anUnreachableAgentSaysWhyAndHowToStartIt() throws {
        let r = runCLI(["get", "--service", "s", "--account", "me", "--socket", "/nonexistent/agent.sock"])
        #expect(r.status == 9 && r.stderr == """
            coffer: errSecIO (-36): cannot reach the agent at /nonexistent/agent.sock: the socket does not exist (no agent is running)
            coffer: hint: start the agent with: cofferd --socket /nonexistent/agent.sock

            """, "\(r)")
        // The default socket: systemd's unit when it is installed and systemd runs the machine, else cofferd.
        let config = TemporaryDirectory("coffer-units")
        try FileManager.default.createDirectory(atPath: config.file("systemd/user"), withIntermediateDirectories: true)
        #expect(FileManager.default.createFile(atPath: config.file("systemd/user/coffer-agent.socket"), contents: Data()))
        let viaDefault = runCLI(["status"], environment: ["COFFER_SOCKET": "/nonexistent/agent.sock", "XDG_CONFIG_HOME": config.path])
        let start = FileManager.default.fileExists(atPath: "/run/systemd/system") ? "systemctl --user start coffer-agent.socket" : "cofferd"
        #expect(viaDefault.status == 9 && viaDefault.stderr.hasSuffix("\ncoffer: hint: start the agent with: \(start)\n"), "\(viaDefault)")
        // A socket left by an agent that died: refused.
        let agent = try AgentProcess()
        agent.kill9()
        let refused = runCLI(["status", "--socket", agent.socketPath])
        #expect(refused.status == 9 && refused.stderr.contains("connection refused (the socket is there but no agent listens on it: it stopped)")
                    && refused.stderr.contains("coffer: hint: start the agent with: cofferd --socket \(agent.socketPath)"), "\(refused)")
    }

    @Test func versionAndCommandSuggestions() throws {
        let agent = try AgentProcess()
        let agentVersion = agent.cli(["status", "--json"]).stdout
        for exe in [Binaries.coffer, Binaries.directory + "/coffer-cli"] {
            let v = runCLI(["--version"], executable: exe)
            #expect(v.status == 0 && v.stdout.hasPrefix("coffer ") && agentVersion.contains("\"version\":\"\(v.stdout.dropFirst(7).trimmingCharacters(in: .whitespacesAndNewlines))\""),
                    "\(exe): \(v) / \(agentVersion)")
        }
        let typo = runCLI(["fnd", "--service", "x"])
        #expect(typo.status == 64 && typo.stderr.contains("Unknown command 'fnd'. Did you mean 'find'?"), "\(typo)")
        let nested = runCLI(["passcode", "chnage"])
        #expect(nested.status == 64 && nested.stderr.contains("Did you mean 'change'?"), "\(nested)")
        let far = runCLI(["xyzzy"])
        #expect(far.status == 64 && far.stderr.contains("Commands: status, unlock"), "\(far)")
    }

    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/bin/bash"), "bash is not installed"))
    func bashCompletesValuesAndTheCallersOwnNames() throws {
        // Another app's item (group "a") is never offered to the unsigned CLI the completion runs.
        let apps = try SignedApps()
        let appA = try apps.app("appA", appID: "com.example.a", groups: ["a"])
        let agent = try apps.startAgent()
        agent.setPasscode()
        #expect(AppClient(executable: appA, agent: agent).add("gitsecret", "other-app", secret: "never-completed").status == 0)
        for (service, account) in [("github", "me"), ("gitlab", "work"), ("mail", "me")] {
            #expect(agent.cli(["add", "--service", service, "--account", account, "--secret-stdin"], stdin: "never-completed").status == 0)
        }
        let dir = TemporaryDirectory("coffer-completion-values")
        let script = dir.file("coffer.bash")
        let generated = runCLI(["--generate-completion-script", "bash"])
        try generated.stdout.write(toFile: script, atomically: true, encoding: .utf8)
        func complete(_ words: [String]) -> String {
            // The script runs `coffer` from PATH for the custom values, as an installed one would.
            let quoted = TerminalRun.shellCommand(words)
            let r = runShell("""
                PATH=\(TerminalRun.shellWord(Binaries.directory)):"$PATH" bash --norc --noprofile -c '
                source "$0" || exit 90
                COMP_WORDS=(\(quoted.replacingOccurrences(of: "'", with: "'\\''"))); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
                COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
                _coffer coffer "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"; echo "${COMPREPLY[*]}"
                ' \(TerminalRun.shellWord(script))
                """, socket: agent.socketPath)
            return r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        #expect(complete(["coffer", "add", "--accessible", "after"]) == "after-first-unlock after-first-unlock-this-device-only")
        #expect(complete(["coffer", "add", "--access-control", "user-presence,"]) == "user-presence,or user-presence,and")
        #expect(complete(["coffer", "add", "--access-control", "user-presence,or,dev"]) == "user-presence,or,device-passcode")
        #expect(complete(["coffer", "get", "--format", ""]) == "raw json env")
        #expect(complete(["coffer", "get", "--service", "git"]) == "github gitlab")
        #expect(complete(["coffer", "get", "--service", "gitlab", "--account", ""]) == "work")
        #expect(complete(["coffer", "get", "--account", ""]) == "me work")
        #expect(complete(["coffer", "find", "--service", ""]) == "github gitlab mail")
        // Only bash is driven here: the zsh and fish scripts call the same `coffer ---completion`, but
        // zsh's function needs its line editor and fish 3's `commandline -C` (the cursor) fails
        // outside an interactive session.
        // Locked: nothing, and nobody is asked.
        #expect(agent.cli(["lock"]).status == 0)
        #expect(complete(["coffer", "get", "--service", "git"]) == "")
    }
}
