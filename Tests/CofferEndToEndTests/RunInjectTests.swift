import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// `coffer get --format`, `coffer run` and `coffer inject` (issue #17) against a real agent: the
/// secret reaches the command or the output and nothing else, and a missing item stops everything
/// before a command starts or a byte is written.
@Suite struct RunInjectTests {
    /// A secret with every character a shell or JSON could trip on.
    static let awkward = "it's \"quoted\" $HOME `x` \\ é\ttab"

    private func agentWithItems() throws -> AgentProcess {
        let agent = try AgentProcess()
        var r = agent.cli(["add", "--service", "api.example.com", "--account", "me", "--secret-stdin"], stdin: Self.awkward)
        #expect(r.status == 0, "\(r)")
        r = agent.cli(["add", "--server", "git.example.com", "--account", "bob", "--path", "org/repo.git", "--secret-stdin"], stdin: "hunter2")
        #expect(r.status == 0, "\(r)")
        r = agent.cli(["add", "--service", "db", "--account", "admin", "--secret-stdin"], stdin: "s3cret")
        #expect(r.status == 0, "\(r)")
        return agent
    }

    @Test func getFormats() throws {
        let agent = try agentWithItems()
        var r = agent.cli(["get", "--service", "api.example.com", "--account", "me", "--format", "raw"])
        #expect(r.status == 0 && r.stdout == Self.awkward, "\(r)")

        r = agent.cli(["get", "--service", "api.example.com", "--account", "me", "--format", "json"])
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any])
        #expect(object["secret"] as? String == Self.awkward)
        let attributes = try #require(object["attributes"] as? [String: Any])
        #expect(attributes["svce"] as? String == "api.example.com" && attributes["acct"] as? String == "me" && attributes["class"] as? String == "genp")

        // env: what /bin/sh evaluates back to the exact secret (named after the service, or as asked).
        r = agent.cli(["get", "--service", "api.example.com", "--account", "me", "--format", "env"])
        #expect(r.status == 0 && r.stdout.hasPrefix("API_EXAMPLE_COM='"), "\(r)")
        let shell = runCLI(["-c", "eval \"$(cat)\"; printf %s \"$API_EXAMPLE_COM\""], stdin: r.stdout, executable: "/bin/sh")
        #expect(shell.stdout == Self.awkward, "\(shell)")
        r = agent.cli(["get", "--server", "git.example.com", "--format", "env", "--env-name", "GIT_PASSWORD"])
        #expect(r.status == 0 && r.stdout == "GIT_PASSWORD='hunter2'\n", "\(r)")

        // A secret that is not UTF-8 comes as hex in JSON; one with a NUL cannot be a shell variable.
        r = runCLI(["-c", "printf '\\377\\000' | \"$0\" add --service bin --account x --secret-stdin", Binaries.coffer],
                   environment: ["COFFER_SOCKET": agent.socketPath], executable: "/bin/sh")
        #expect(r.status == 0, "\(r)")
        r = agent.cli(["get", "--service", "bin", "--format", "json"])
        #expect(r.status == 0 && r.stdout.contains("\"secretHex\":\"ff00\"") && !r.stdout.contains("\"secret\":"), "\(r)")
        r = agent.cli(["get", "--service", "bin", "--format", "env"])
        #expect(r.status == 2 && r.stdout.isEmpty && r.stderr.contains("errSecParam (-50)"), "\(r)")

        // Usage errors and a missing item print nothing on standard output.
        r = agent.cli(["get", "--service", "db", "--format", "yaml"])
        #expect(r.status != 0 && r.stdout.isEmpty, "\(r)")
        r = agent.cli(["get", "--service", "db", "--env-name", "X"])
        #expect(r.status != 0 && r.stdout.isEmpty, "\(r)")
        r = agent.cli(["get", "--service", "nothing", "--format", "json"])
        #expect(r.status == 3 && r.stdout.isEmpty, "\(r)")
    }

    @Test func runPutsSecretsInTheCommandsEnvironmentOnly() throws {
        let agent = try agentWithItems()
        let dir = TemporaryDirectory("coffer-run")
        let out = dir.file("env")
        var r = agent.cli(["run", "--env", "TOKEN=api.example.com/me", "--env", "GITPW=coffer-inet://bob@git.example.com/org/repo.git",
                           "--", "/bin/sh", "-c", "printf '%s|%s' \"$TOKEN\" \"$GITPW\" > \"$0\"; exit 7", out])
        // The command's own exit status, and coffer printed nothing of its own.
        #expect(r.status == 7 && r.stdout.isEmpty && r.stderr.isEmpty, "\(r)")
        #expect((try? String(contentsOfFile: out, encoding: .utf8)) == Self.awkward + "|hunter2")

        // An inherited variable holding a reference is replaced; --no-inherited-references leaves it.
        r = agent.cli(["run", "--", "/bin/sh", "-c", "printf %s \"$DB\""], environment: ["DB": "coffer://db/admin"])
        #expect(r.status == 0 && r.stdout == "s3cret", "\(r)")
        r = agent.cli(["run", "--no-inherited-references", "--", "/bin/sh", "-c", "printf %s \"$DB\""], environment: ["DB": "coffer://db/admin"])
        #expect(r.status == 0 && r.stdout == "coffer://db/admin", "\(r)")
        // PATH is searched, arguments pass through untouched.
        r = agent.cli(["run", "--env", "X=db/admin", "--", "printf", "%s-%s", "a b", "--env"])
        #expect(r.status == 0 && r.stdout == "a b---env", "\(r)")
        // The rest of the environment reaches the command byte for byte, UTF-8 or not.
        r = runCLI(["-c", "export LATIN=\"$(printf 'caf\\351')\"; \"$0\" run --env X=db/admin -- /bin/sh -c 'printf %s \"$LATIN\" | od -An -tx1'",
                    Binaries.coffer], environment: ["COFFER_SOCKET": agent.socketPath], executable: "/bin/sh")
        #expect(r.status == 0 && r.stdout.split(separator: " ").map { $0.trimmingCharacters(in: .whitespacesAndNewlines) } == ["63", "61", "66", "e9"],
                "\(r)")
    }

    @Test func runWithAMissingItemNeverStartsTheCommand() throws {
        let agent = try agentWithItems()
        let dir = TemporaryDirectory("coffer-run")
        let marker = dir.file("started")
        var r = agent.cli(["run", "--env", "A=db/admin", "--env", "B=db/nobody", "--", "/bin/sh", "-c", "touch \"$0\"", marker])
        #expect(r.status == 3 && r.stdout.isEmpty && r.stderr.contains("errSecItemNotFound (-25300)") && r.stderr.contains("db/nobody"), "\(r)")
        #expect(!r.stderr.contains("s3cret"))
        #expect(!FileManager.default.fileExists(atPath: marker), "the command ran although an item was missing")
        // A malformed reference, a bad name, no command: usage errors, nothing started.
        for args in [["--env", "A=https://x/y"], ["--env", "1A=db/admin"], ["--env", "A"], ["--env", "A=db/admin", "--env", "A=db/admin"]] {
            r = agent.cli(["run"] + args + ["--", "/bin/sh", "-c", "touch \"$0\"", marker])
            #expect(r.status != 0 && r.stdout.isEmpty, "\(args): \(r)")
            #expect(!FileManager.default.fileExists(atPath: marker))
        }
        r = agent.cli(["run", "--env", "A=db/admin"])
        #expect(r.status != 0 && r.stderr.contains("after --"), "\(r)")
        // A locked keychain: the item is unavailable and the command does not start.
        agent.setPasscode()
        #expect(agent.cli(["lock"]).status == 0)
        r = agent.cli(["run", "--env", "A=db/admin", "--", "/bin/sh", "-c", "touch \"$0\"", marker])
        #expect(r.status == 6 && r.stderr.contains("errSecInteractionNotAllowed"), "\(r)")
        #expect(!FileManager.default.fileExists(atPath: marker))
        // A command that is not there: 127, as env(1).
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        r = agent.cli(["run", "--env", "A=db/admin", "--", "coffer-no-such-command"])
        #expect(r.status == 127 && r.stderr.contains("cannot run coffer-no-such-command") && !r.stderr.contains("s3cret"), "\(r)")
    }

    @Test func injectFillsTemplates() throws {
        let agent = try agentWithItems()
        let template = """
            user = admin
            password = {{ coffer://db/admin }}
            again = {{coffer://db/admin}}
            git = {{ coffer-inet://bob@git.example.com/org/repo.git }}
            jinja = {{ not.ours }}

            """
        var r = agent.cli(["inject"], stdin: template)
        #expect(r.status == 0 && r.stderr.isEmpty, "\(r)")
        #expect(r.stdout == "user = admin\npassword = s3cret\nagain = s3cret\ngit = hunter2\njinja = {{ not.ours }}\n", "\(r)")

        // --output: written 0600, atomically.
        let dir = TemporaryDirectory("coffer-inject")
        let path = dir.file("app.conf")
        r = agent.cli(["inject", "--output", path], stdin: "p={{ coffer://db/admin }}")
        #expect(r.status == 0 && r.stdout.isEmpty, "\(r)")
        #expect((try? String(contentsOfFile: path, encoding: .utf8)) == "p=s3cret")
        var st = stat()
        #expect(stat(path, &st) == 0 && st.st_mode & 0o777 == 0o600)

        // No references: the template passes through (and the agent is not needed).
        r = runCLI(["inject", "--socket", dir.file("no-agent.sock")], stdin: "plain {{ text }}\n")
        #expect(r.status == 0 && r.stdout == "plain {{ text }}\n", "\(r)")
    }

    @Test func injectWritesNothingUnlessEveryReferenceResolves() throws {
        let agent = try agentWithItems()
        let dir = TemporaryDirectory("coffer-inject")
        let path = dir.file("app.conf")
        try "old contents".write(toFile: path, atomically: true, encoding: .utf8)
        // The unresolved reference comes after a resolved one: still nothing written.
        for (template, status) in [("a={{ coffer://db/admin }} b={{ coffer://db/nobody }}", Int32(3)),
                                   ("a={{ coffer://db/admin }} b={{ coffer://db/a/b }}", 2),
                                   ("a={{ coffer://db/admin }} b={{ coffer://db/admin", 2)] {
            var r = agent.cli(["inject"], stdin: template)
            #expect(r.status == status && r.stdout.isEmpty, "\(template): \(r)")
            #expect(!r.stderr.contains("s3cret"))
            r = agent.cli(["inject", "--output", path], stdin: template)
            #expect(r.status == status && r.stdout.isEmpty, "\(template): \(r)")
            #expect((try? String(contentsOfFile: path, encoding: .utf8)) == "old contents")
        }
        // The agent stopped: nothing written either.
        agent.stop()
        let r = agent.cli(["inject"], stdin: "a={{ coffer://db/admin }}")
        #expect(r.status != 0 && r.stdout.isEmpty, "\(r)")
    }
}

/// `run` and `inject` with an item that needs the person (issue #17 item 6): without a terminal they
/// fail at once and start or write nothing; on a terminal the agent's authenticator asks there.
@Suite(.serialized, .enabled(if: TerminalRun.available, "needs util-linux script and setsid"))
struct RunInjectPromptTests {
    @Test func noTerminalNeverPromptsATerminalDoes() throws {
        let agent = try AccessControlCLITests.agentWithProtectedItem()
        let dir = TemporaryDirectory("coffer-run")
        let marker = dir.file("started")
        let started = Date()
        // (--socket comes first: `detached` appends its own after the command, where sh ignores it.)
        var r = AccessControlCLITests.detached(agent, ["run", "--socket", agent.socketPath, "--env", "PIN=bank/me", "--", "/bin/sh", "-c", "touch \"$0\"", marker])
        #expect(r.status == 6 && r.stderr.contains("errSecInteractionNotAllowed"), "\(r)")
        #expect(!FileManager.default.fileExists(atPath: marker))
        r = AccessControlCLITests.detached(agent, ["inject"], stdin: "pin={{ coffer://bank/me }}")
        #expect(r.status == 6 && r.stdout.isEmpty, "\(r)")
        #expect(Date().timeIntervalSince(started) < 10, "a helper without a terminal waited for a person")

        // On a terminal the passcode is asked there, then the command gets the secret.
        let t = TerminalRun.run([Binaries.coffer, "run", "--socket", agent.socketPath, "--env", "PIN=bank/me", "--", "/bin/sh", "-c", "echo \"got:$PIN\""],
                                typing: AgentProcess.password, prompt: "Passcode: ")
        #expect(t.status == 0 && t.prompted && t.output.contains("got:pin 1234"), "status \(t.status) prompted \(t.prompted) output \(t.output)")
        // inject on a terminal: the template comes from a file, the passcode from the terminal.
        let template = dir.file("t.tmpl")
        try "pin={{ coffer://bank/me }}\n".write(toFile: template, atomically: true, encoding: .utf8)
        let i = TerminalRun.run(["/bin/sh", "-c", "\"$0\" inject --socket \"$1\" < \"$2\"", Binaries.coffer, agent.socketPath, template],
                                typing: AgentProcess.password, prompt: "Passcode: ")
        #expect(i.status == 0 && i.prompted && i.output.contains("pin=pin 1234"), "\(i)")
    }
}
