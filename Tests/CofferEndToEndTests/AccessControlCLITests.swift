import CofferClient
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Items with an access control through the real agent and the real CLI (issue #14): the passcode
/// is asked for on a pseudo-terminal (util-linux `script`) and checked by PAM (pam_matrix); without a
/// terminal nothing hangs.
@Suite(.serialized, .enabled(if: TerminalRun.available, "needs util-linux script and setsid"))
struct AccessControlCLITests {
    /// An agent with a passcode and one user-presence item (no biometric sensor: the passcode is asked).
    static func agentWithProtectedItem() throws -> AgentProcess {
        let agent = try AgentProcess()
        agent.setPasscode()
        let r = agent.cli(["add", "--service", "bank", "--account", "me", "--access-control", "user-presence", "--secret-stdin"],
                          stdin: "pin 1234")
        #expect(r.status == 0, "\(r)")
        return agent
    }

    static func onTerminal(_ agent: AgentProcess, _ args: [String], typing: String?, prompt: String = "Passcode: ") -> TerminalRun {
        TerminalRun.run([Binaries.coffer] + args + ["--socket", agent.socketPath], typing: typing, prompt: prompt)
    }

    /// Runs `coffer ARGS` in a new session: no controlling terminal at all.
    static func detached(_ agent: AgentProcess, _ args: [String], stdin: String? = nil, extraShell: String? = nil,
                         environment: [String: String] = [:]) -> CLIResult {
        let p = Process()
        if !environment.isEmpty { p.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 } }
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setsid")
        let argv = [Binaries.coffer] + args + ["--socket", agent.socketPath]
        if let extraShell {
            // Redirections (another descriptor) through the shell.
            p.arguments = ["-w", "/bin/sh", "-c", argv.map { "'" + $0 + "'" }.joined(separator: " ") + " " + extraShell]
        } else {
            p.arguments = ["-w"] + argv
        }
        let out = Pipe(), err = Pipe(), inp = Pipe()
        p.standardOutput = out
        p.standardError = err
        p.standardInput = inp
        guard (try? p.run()) != nil else { return CLIResult(status: -1, stdout: "", stderr: "setsid did not start") }
        if let stdin { inp.fileHandleForWriting.write(Data(stdin.utf8)) }
        try? inp.fileHandleForWriting.close()
        let o = out.fileHandleForReading.readDataToEndOfFile(), e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return CLIResult(status: p.terminationStatus, stdout: String(decoding: o, as: UTF8.self), stderr: String(decoding: e, as: UTF8.self))
    }

    @Test func theSecretNeedsThePasscodeTypedOnTheTerminal() throws {
        let agent = try Self.agentWithProtectedItem()
        // The full parser and the fast path both ask; the prompt names the app and the item.
        for args in [["get", "--service", "bank", "--account", "me", "--prompt", "pay the rent"], ["get", "--service", "bank", "--account", "me"]] {
            let t = Self.onTerminal(agent, args, typing: AgentProcess.password)
            #expect(t.status == 0 && t.output.contains("pin 1234"), "\(args): \(t)")
            #expect(t.prompted && t.output.contains("wants to read the secret of \"bank\""), "\(t.output)")
            #expect(!t.output.contains(AgentProcess.password), "the passcode was echoed")
        }
        let withPrompt = Self.onTerminal(agent, ["get", "--service", "bank", "--account", "me", "--prompt", "pay the rent"], typing: AgentProcess.password)
        #expect(withPrompt.output.contains(": pay the rent"))
        // Attributes never need it.
        let find = agent.cli(["find", "--service", "bank", "--json"])
        #expect(find.status == 0 && find.stdout.contains("\"accc\""), "\(find)")
        // Everything is audited, never with the secret.
        let audit = try String(contentsOfFile: agent.stateDir + "/audit.log", encoding: .utf8)
        #expect(audit.contains("\"operation\":\"authenticate\"") && !audit.contains("pin 1234"))
    }

    @Test func wrongPasscodesCancelAndNoUserInterface() throws {
        let agent = try Self.agentWithProtectedItem()
        // Three wrong passcodes: errSecAuthFailed (exit 5), no secret.
        let wrong = Self.onTerminal(agent, ["get", "--service", "bank", "--account", "me"], typing: "nope\nnope\nnope")
        #expect(wrong.status == 5 && !wrong.output.contains("pin 1234"), "\(wrong)")
        #expect(wrong.output.contains("Wrong passcode"), "\(wrong.output)")
        // Ctrl-D cancels: errSecUserCanceled (exit 10).
        let cancelled = Self.onTerminal(agent, ["get", "--service", "bank", "--account", "me"], typing: "\u{04}")
        #expect(cancelled.status == 10 && !cancelled.output.contains("pin 1234"), "\(cancelled)")
        // --no-auth-ui: errSecInteractionNotAllowed at once, no prompt.
        let noUI = Self.onTerminal(agent, ["get", "--service", "bank", "--account", "me", "--no-auth-ui"], typing: nil)
        #expect(noUI.status == 6 && !noUI.prompted, "\(noUI)")
        // No terminal at all: the same, and nothing hangs.
        let detached = Self.detached(agent, ["get", "--service", "bank", "--account", "me"])
        #expect(detached.status == 6 && detached.stderr.contains("errSecInteractionNotAllowed"), "\(detached)")
        // A passcode given in advance (LAContext.setCredential) needs no terminal.
        let preset = Self.detached(agent, ["get", "--service", "bank", "--account", "me", "--auth-passcode-fd", "0"], stdin: AgentProcess.password)
        #expect(preset.status == 0 && preset.stdout == "pin 1234", "\(preset)")
        // Delete is guarded too: refused without the person, the item stays.
        let del = Self.detached(agent, ["delete", "--service", "bank"])
        #expect(del.status == 6, "\(del)")
        #expect(agent.cli(["find", "--service", "bank"]).status == 0)
        let delOK = Self.onTerminal(agent, ["delete", "--service", "bank"], typing: AgentProcess.password)
        #expect(delOK.status == 0, "\(delOK)")
        #expect(agent.cli(["find", "--service", "bank"]).status == 3)
    }

    @Test func localAuthenticationThroughTheCLI() throws {
        let agent = try AgentProcess()
        // No passcode yet: passcodeNotSet (exit 25).
        #expect(agent.cli(["la", "can-evaluate", "--policy", "device-owner"]).status == 25)
        agent.setPasscode()
        // No biometric sensor configured: biometryNotAvailable (exit 26); the passcode policy can.
        let bio = agent.cli(["la", "can-evaluate", "--policy", "biometrics"])
        #expect(bio.status == 26 && bio.stderr.contains("LAErrorBiometryNotAvailable (-6)"), "\(bio)")
        #expect(agent.cli(["la", "can-evaluate", "--policy", "device-owner"]).status == 0)
        let ok = Self.onTerminal(agent, ["la", "evaluate", "--policy", "device-owner", "--reason", "open the vault"], typing: AgentProcess.password)
        #expect(ok.status == 0 && ok.output.contains("open the vault"), "\(ok)")
        let noUI = Self.detached(agent, ["la", "evaluate", "--policy", "device-owner", "--reason", "x", "--no-auth-ui"])
        #expect(noUI.status == 29, "notInteractive: \(noUI)")
        // An empty reason is refused before anything is sent.
        #expect(agent.cli(["la", "evaluate", "--policy", "device-owner", "--reason", ""]).status == 64)
    }

    @Test func anItemWithAnAccessControlNeedsAPasscodeAndADeviceOnlyClass() throws {
        let agent = try AgentProcess()
        var r = agent.cli(["add", "--service", "x", "--account", "me", "--access-control", "device-passcode", "--secret-stdin"], stdin: "s")
        #expect(r.status == 7 && r.stderr.contains("needs a passcode"), "\(r)")
        agent.setPasscode()
        r = agent.cli(["add", "--service", "x", "--account", "me", "--access-control", "device-passcode", "--accessible", "always", "--secret-stdin"],
                      stdin: "s")
        #expect(r.status == 2 && r.stderr.contains("ThisDeviceOnly"), "\(r)")
        r = agent.cli(["add", "--service", "x", "--account", "me", "--access-control", "biometry-any,xor,device-passcode", "--secret-stdin"], stdin: "s")
        #expect(r.status == 64, "\(r)")
        // biometry-current-set needs enrolled biometry (no sensor here).
        r = agent.cli(["add", "--service", "x", "--account", "me", "--access-control", "biometry-current-set", "--secret-stdin"], stdin: "s")
        #expect(r.status == 7, "\(r)")
    }

    @Test func anApplicationPasswordItemThroughTheCLI() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        // Made with the secret on descriptor 3 and the application password on stdin.
        let secretFile = agent.dir.file("secret-input")
        try "pin 9876".write(toFile: secretFile, atomically: true, encoding: .utf8)
        let add = Self.detached(agent, ["add", "--service", "vault", "--account", "me", "--access-control", "application-password",
                                        "--secret-fd", "3", "--app-password-fd", "0"],
                                stdin: "open sesame", extraShell: "3<'\(secretFile)'")
        #expect(add.status == 0, "\(add)")
        // Read on a terminal: the application password is asked for.
        let t = Self.onTerminal(agent, ["get", "--service", "vault", "--account", "me"], typing: "open sesame", prompt: "Application password: ")
        #expect(t.status == 0 && t.output.contains("pin 9876") && !t.output.contains("open sesame"), "\(t)")
        let wrong = Self.onTerminal(agent, ["get", "--service", "vault", "--account", "me"], typing: "open sesam", prompt: "Application password: ")
        #expect(wrong.status == 5 && !wrong.output.contains("pin 9876"), "\(wrong)")
        let given = Self.detached(agent, ["get", "--service", "vault", "--account", "me", "--app-password-fd", "0"], stdin: "open sesame")
        #expect(given.status == 0 && given.stdout == "pin 9876", "\(given)")
    }

    /// Issue #24, finding 1: application-password guesses are counted per item in the state
    /// directory, so neither a restart nor a kill -9 earns new tries; beyond the free ones a guess is
    /// refused at once with the time to wait, another item is not delayed, and the audit log has them.
    @Test func applicationPasswordGuessesAreThrottledAcrossRestartsAndKills() throws {
        // The 4th failure's wait is an hour (not the standard minute): a kill, start, unlock, restart and
        // unlock take well under that on a loaded machine or under a sanitizer.
        let setup = TemporaryDirectory("coffer-app-throttle")
        try "unlock-delays = 0, 0, 0, 3600\n".write(toFile: setup.file("cofferd.conf"), atomically: true, encoding: .utf8)
        defer { withExtendedLifetime(setup) {} } // the restarts read the file
        let agent = try AgentProcess(extraArguments: ["--config", setup.file("cofferd.conf")])
        agent.setPasscode()
        let secretFile = agent.dir.file("secret-input")
        try "pin 9876".write(toFile: secretFile, atomically: true, encoding: .utf8)
        for service in ["vault", "other"] {
            let add = Self.detached(agent, ["add", "--service", service, "--account", "me", "--access-control", "application-password",
                                            "--secret-fd", "3", "--app-password-fd", "0"],
                                    stdin: "open sesame", extraShell: "3<'\(secretFile)'")
            #expect(add.status == 0, "\(add)")
        }
        func get(_ service: String, _ password: String) -> CLIResult {
            Self.detached(agent, ["get", "--service", service, "--account", "me", "--app-password-fd", "0"], stdin: password)
        }
        for n in 1...4 {
            let r = get("vault", "guess \(n)")
            #expect(r.status == 5 && !r.stderr.contains("try again"), "\(r)")
        }
        let early = get("vault", "open sesame")
        #expect(early.status == 5 && early.stderr.contains("try again in") && !early.stdout.contains("pin 9876"), "\(early)")
        // Killed and started again: still refused, the other item still opens.
        agent.kill9()
        try agent.start()
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        let afterKill = get("vault", "open sesame")
        #expect(afterKill.status == 5 && afterKill.stderr.contains("try again in"), "\(afterKill)\n\(agent.log)")
        let other = get("other", "open sesame")
        #expect(other.status == 0 && other.stdout == "pin 9876", "\(other)")
        // A restart likewise.
        try agent.restart()
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(get("vault", "open sesame").stderr.contains("try again in"))
        let audit = (try? String(contentsOfFile: agent.stateDir + "/audit.log", encoding: .utf8)) ?? ""
        let failed = audit.split(separator: "\n").filter { $0.contains("\"app-password-failed\"") }
        let refused = audit.split(separator: "\n").filter { $0.contains("\"app-password-refused\"") }
        #expect(failed.count == 4 && refused.count == 3 && !audit.contains("guess") && !audit.contains("sesame"), "\(audit)")
        #expect(!agent.log.contains("guess") && !agent.log.contains("sesame"))
    }

    /// A pinentry answering each GETPIN with the next of `pins` (or cancelling when `cancel`), logging
    /// every command it gets to `log` (never the answers): CofferTestSupport's ``ScriptedPinentry``.
    static func scriptedPinentry(in dir: TemporaryDirectory, pins: [String], cancel: Bool = false) throws -> (program: String, log: String) {
        let p = try ScriptedPinentry(in: dir, pins: pins, cancel ? .cancel : .answer)
        return (p.program, p.log)
    }

    @Test func withoutATerminalAPinentryAsks() throws {
        let agent = try Self.agentWithProtectedItem()
        let dir = TemporaryDirectory("coffer-pinentry")
        // A wrong passcode, then the right one: the dialog is shown again with the agent's feedback.
        var p = try Self.scriptedPinentry(in: dir, pins: ["nope", AgentProcess.password])
        var r = Self.detached(agent, ["get", "--service", "bank", "--account", "me"], environment: ["COFFER_PINENTRY": p.program])
        #expect(r.status == 0 && r.stdout == "pin 1234", "\(r)")
        let log = (try? String(contentsOfFile: p.log, encoding: .utf8)) ?? ""
        #expect(log.contains("SETDESC coffer wants to read the secret of \"bank\"") && log.contains("SETPROMPT Passcode:"), "\(log)")
        #expect(log.contains("SETERROR Wrong passcode. Try again") && log.components(separatedBy: "GETPIN").count == 3, "\(log)")
        #expect(!log.contains(AgentProcess.password))
        // A long answer comes as several D lines (a pinentry splits at about 1000 bytes): they add up.
        let splitDir = TemporaryDirectory("coffer-pinentry-split")
        let pw = AgentProcess.password, half = pw.index(pw.startIndex, offsetBy: pw.count / 2)
        p = try Self.scriptedPinentry(in: splitDir, pins: [pw[..<half] + "^^" + pw[half...]])
        r = Self.detached(agent, ["get", "--service", "bank", "--account", "me"], environment: ["COFFER_PINENTRY": p.program])
        #expect(r.status == 0 && r.stdout == "pin 1234", "\(r)")
        // Cancel in the dialog: errSecUserCanceled.
        let cancelDir = TemporaryDirectory("coffer-pinentry-cancel")
        p = try Self.scriptedPinentry(in: cancelDir, pins: [], cancel: true)
        r = Self.detached(agent, ["get", "--service", "bank", "--account", "me"], environment: ["COFFER_PINENTRY": p.program])
        #expect(r.status == 10 && r.stdout.isEmpty, "\(r)")
        // A pinentry that is not there: nobody to ask, at once.
        r = Self.detached(agent, ["get", "--service", "bank", "--account", "me"], environment: ["COFFER_PINENTRY": "/nonexistent/pinentry"])
        #expect(r.status == 6, "\(r)")
    }
}

/// The async client library's LocalAuthentication and delegate (what a desktop app uses).
@Suite struct LocalAuthenticationLibraryTests {
    /// Answers every question with the passcode at once (its input is a pipe it writes to itself).
    final class Answering: AuthenticationDelegate, @unchecked Sendable {
        let passcode: String
        private var fds: [Int32] = [-1, -1]
        private(set) var prompts: [String] = []
        init(_ passcode: String) {
            self.passcode = passcode
            _ = pipe(&fds)
        }
        deinit { for fd in fds { close(fd) } }
        func begin(_ request: AuthenticationRequest) -> Bool {
            prompts.append(request.prompt)
            var b: UInt8 = 1
            return write(fds[1], &b, 1) == 1
        }
        var inputDescriptor: Int32 { fds[0] }
        func inputReady() -> AuthenticationAnswer? {
            var b: UInt8 = 0
            _ = read(fds[0], &b, 1)
            return .passcode(secret(passcode))
        }
        /// "Wrong passcode. Try again.": answers again.
        func feedback(_ text: String, kind: AuthFeedbackKind?) {
            var b: UInt8 = 1
            _ = write(fds[1], &b, 1)
        }
        func end() {}
    }

    @Test func canEvaluateAndEvaluateThroughTheAsyncClient() async throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        let client = try await CofferClient.connect(socket: agent.socketPath)
        #expect(try await client.canEvaluatePolicy(.deviceOwnerAuthentication) == nil)
        #expect(try await client.canEvaluatePolicy(.deviceOwnerAuthenticationWithBiometrics)?.code == .biometryNotAvailable)
        // Without a delegate nobody can be asked: notInteractive.
        guard case .failure(let e) = try await client.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "sign in") else {
            Issue.record("evaluated without anyone to ask"); return
        }
        #expect(e.code == .notInteractive || e.code == .userCancel, "\(e)")
        let delegate = Answering(AgentProcess.password)
        try await client.setAuthenticationDelegate(delegate)
        guard case .success = try await client.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "sign in to Mail") else {
            Issue.record("the passcode was not accepted"); return
        }
        #expect(delegate.prompts.first?.contains("sign in to Mail") == true, "\(delegate.prompts)")
        let wrong = Answering("wrong horse")
        try await client.setAuthenticationDelegate(wrong)
        guard case .failure(let f) = try await client.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "x") else {
            Issue.record("a wrong passcode was accepted"); return
        }
        #expect(f.code == .authenticationFailed)
    }
}
