import CofferCrypto
import CofferModel
import CofferPrompt
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Assuan's escaping (CofferPrompt's `Assuan`, used by pinentry-coffer, the pinentry delegate and the agent's prompter).
@Suite struct PinentryAssuanTests {
    @Test func escapingAndDecodingRoundTrip() {
        #expect(Assuan.escape("50% off\r\nnext") == "50%25 off%0D%0Anext")
        #expect(Assuan.unescape("50%25 off%0D%0Anext%0a") == "50% off\r\nnext\n")
        // A malformed escape stays as it is.
        #expect(Assuan.unescape("100%") == "100%" && Assuan.unescape("%zz%4") == "%zz%4")
        let decoded = Assuan.unescape(Array("D a%25b%0Ac%0dd".utf8), from: 2)
        #expect(decoded.withUnsafeBytes { Array($0) } == Array("a%b\nc\rd".utf8))
    }

    @Test func dataLinesEscapeAndStayWithinTheLineLimit() {
        var short = Array("p%ss\nw\r".utf8)
        let lines = Assuan.dataLines(SecureBytes(consuming: &short))
        #expect(lines.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } == "D p%25ss%0Aw%0D\n")
        #expect(Assuan.dataLines(SecureBytes(count: 0)).count == 0)

        // 2000 bytes, a third of them escaped: several D lines, each within Assuan's 1000 bytes, that decode back.
        var long = (0..<2000).map { i -> UInt8 in i % 3 == 0 ? UInt8(ascii: "%") : UInt8(ascii: "a") + UInt8(i % 26) }
        let original = long
        let many = Assuan.dataLines(SecureBytes(consuming: &long))
        let text = many.withUnsafeBytes { String(decoding: $0, as: UTF8.self) }
        let split = text.split(separator: "\n")
        #expect(split.count >= 3 && text.hasSuffix("\n"))
        #expect(split.allSatisfy { $0.hasPrefix("D ") && $0.utf8.count + 1 <= Assuan.maximumLineBytes })
        var back: [UInt8] = []
        for line in split { back += Assuan.unescape(Array(line.utf8), from: 2).withUnsafeBytes { Array($0) } }
        #expect(back == original)
    }
}

/// The agent's prompter against real pinentry processes (CofferTestSupport's scripted pinentry):
/// answers, cancels, and every way a pinentry can fail to answer, each ending the wait.
@Suite struct PinentryPrompterTests {
    static let request = AuthenticationRequest(methods: [.passcode], app: "com.example.mail",
                                               prompt: "com.example.mail wants to read the secret of \"imap\"")

    /// A prompter for `pinentry` with the default (generous) deadlines unless told.
    static func prompter(_ pinentry: ScriptedPinentry, timeout: Double = 120, reply: Double = 30) -> PinentryPrompter {
        PinentryPrompter(program: pinentry.program, environment: ["LANG=C"], timeoutSeconds: timeout, replyTimeout: reply)
    }

    /// `p.ask(request)`, recording why it could not ask.
    static func ask(_ p: PinentryPrompter, _ request: AuthenticationRequest) -> Bool {
        if p.ask(request) { return true }
        Issue.record("could not ask: \(p.await(stop: { false }))")
        return false
    }

    static func passcode(_ e: PromptEvent) -> String? {
        if case .answer(.passcode(let p)) = e { return text(p) }
        return nil
    }

    /// Waits (generously) until `pinentry` has been reaped.
    static func gone(_ pinentry: ScriptedPinentry) -> Bool {
        for _ in 0..<600 where pinentry.isRunning { usleep(50_000) }
        return !pinentry.isRunning
    }

    @Test func aPasscodeIsAnsweredAndAWrongOneAskedAgainWithTheFeedback() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let pinentry = try ScriptedPinentry(in: dir, pins: ["nope", "right one"])
        let p = Self.prompter(pinentry)
        #expect(Self.ask(p, Self.request))
        #expect(Self.passcode(p.await(stop: { false })) == "nope")
        p.feedback("Wrong passcode. Try again.", kind: .wrongPasscode)
        #expect(Self.passcode(p.await(stop: { false })) == "right one")
        p.end()
        let commands = pinentry.commands
        // The dialog names the app as the agent identified it, in the title and first in the text.
        #expect(commands.contains("SETTITLE Coffer: com.example.mail"), "\(commands)")
        #expect(commands.contains { $0.hasPrefix("SETDESC Requested by: com.example.mail%0A%0Acom.example.mail wants to read") }, "\(commands)")
        #expect(commands.contains("SETERROR Wrong passcode. Try again.") && commands.filter { $0 == "GETPIN" }.count == 2, "\(commands)")
        #expect(!commands.joined().contains("nope") && !commands.joined().contains("right one"))
        #expect(Self.gone(pinentry), "the pinentry is stopped at the end")
    }

    @Test func anApplicationPasswordAndALongAnswerInSeveralDataLines() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let long = String(repeating: "a%25", count: 400)
        let pinentry = try ScriptedPinentry(in: dir, pins: [long + "^^" + "tail"])
        let p = Self.prompter(pinentry)
        #expect(Self.ask(p, AuthenticationRequest(methods: [.applicationPassword], app: "app", prompt: "app wants it")))
        guard case .answer(.applicationPassword(let pw)) = p.await(stop: { false }) else { Issue.record("no application password"); return }
        #expect(text(pw) == String(repeating: "a%", count: 400) + "tail")
        #expect(pinentry.commands.contains("SETPROMPT Application password:"))
    }

    @Test func feedbackWhileTheDialogIsOpenShowsItInANewDialog() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let pinentry = try ScriptedPinentry(in: dir, pins: ["typed"])
        let p = Self.prompter(pinentry)
        #expect(Self.ask(p, AuthenticationRequest(methods: [.biometry, .passcode], app: "app", prompt: "app wants it")))
        // A failed match while the passcode dialog is open: Assuan cannot change an open dialog, so
        // a new one shows the message, and after biometry is out, without "touch the sensor".
        p.feedback("No match. Try again.", kind: .noMatch)
        p.feedback("Biometry is not available: type your passcode.", kind: .passcodeOnly)
        #expect(Self.passcode(p.await(stop: { false })) == "typed")
        let commands = pinentry.commands
        #expect(commands.contains("SETERROR No match. Try again.") && commands.contains("SETERROR Biometry is not available: type your passcode."),
                "\(commands)")
        let descriptions = commands.filter { $0.hasPrefix("SETDESC ") }
        #expect(descriptions.count == 3 && descriptions[1].contains("touch the sensor") && !descriptions[2].contains("touch the sensor"),
                "\(descriptions)")
    }

    @Test func whyTheRequestEndedIsShownInAMessageTheDeadlineBounds() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let pinentry = try ScriptedPinentry(in: dir, pins: ["wrong"])
        let p = Self.prompter(pinentry)
        #expect(Self.ask(p, Self.request))
        #expect(Self.passcode(p.await(stop: { false })) == "wrong")
        #expect(p.tell("Too many failed attempts: try again in 1 minute.", app: "com.example.mail"))
        let commands = pinentry.commands
        #expect(commands.filter { $0 != "BYE" }.suffix(3) == ["SETTITLE Coffer: com.example.mail",
                                       "SETDESC Requested by: com.example.mail%0A%0AToo many failed attempts: try again in 1 minute.",
                                       "MESSAGE"], "\(commands)")
        #expect(Self.gone(pinentry))
        // A message nobody closes ends at its time limit, and its pinentry is killed.
        let hangDir = TemporaryDirectory("coffer-prompt")
        let hanging = try ScriptedPinentry(in: hangDir, .hangAtMessage)
        let q = Self.prompter(hanging)
        #expect(!q.tell("Wait.", app: "app", seconds: 1))
        #expect(!hanging.isRunning)
    }

    @Test func aCancelInTheDialogIsACancel() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let p = Self.prompter(try ScriptedPinentry(in: dir, .cancel))
        #expect(Self.ask(p, Self.request))
        guard case .answer(.cancel) = p.await(stop: { false }) else { Issue.record("not a cancel"); return }
    }

    @Test func aDialogNobodyAnswersEndsAtTheDeadlineAndThePinentryIsStopped() throws {
        for behaviour in [ScriptedPinentry.Behaviour.hangAtGetpin, .hangIgnoringTerm] {
            let dir = TemporaryDirectory("coffer-prompt")
            let pinentry = try ScriptedPinentry(in: dir, behaviour)
            let p = Self.prompter(pinentry)
            #expect(Self.ask(p, Self.request))
            let started = Date()
            guard case .timedOut = p.await(stop: { false }, within: 1) else { Issue.record("\(behaviour): no timeout"); continue }
            #expect(Date().timeIntervalSince(started) < 60, "\(behaviour)")
            // Reaped before the wait returned: killed when it ignored SIGTERM.
            #expect(!pinentry.isRunning, "\(behaviour)")
        }
    }

    @Test func theHardDeadlineBoundsAPinentryThatNeverGreets() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let pinentry = try ScriptedPinentry(in: dir, .hangAtGreeting)
        // The reply timeout alone would wait 10 minutes; the request's deadline is 1 s.
        let p = Self.prompter(pinentry, timeout: 1, reply: 600)
        let started = Date()
        #expect(!p.ask(Self.request))
        guard case .failed(.noReply) = p.await(stop: { false }) else { Issue.record("not a failure"); return }
        #expect(Date().timeIntervalSince(started) < 300)
        #expect(!pinentry.isRunning)
    }

    @Test func aPinentryThatCannotStartOrExitsAtOnceFailsAtOnce() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        var p = PinentryPrompter(program: dir.file("missing"), environment: [])
        #expect(!p.ask(Self.request))
        guard case .failed(.couldNotStart) = p.await(stop: { false }) else { Issue.record("missing program"); return }
        p = Self.prompter(try ScriptedPinentry(in: dir, .exitAtOnce))
        #expect(!p.ask(Self.request))
        guard case .failed(.couldNotStart) = p.await(stop: { false }) else { Issue.record("exit at once"); return }
    }

    @Test func aPinentryThatCrashesInTheDialogEndsTheRequest() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let pinentry = try ScriptedPinentry(in: dir, .crashAtGetpin)
        let p = Self.prompter(pinentry)
        #expect(Self.ask(p, Self.request))
        guard case .failed(.exited) = p.await(stop: { false }) else { Issue.record("crash not seen"); return }
        #expect(!pinentry.isRunning)
    }

    @Test func aPinentryWritingGarbageEndsTheRequest() throws {
        for behaviour in [ScriptedPinentry.Behaviour.garbageLines, .endlessLine] {
            let dir = TemporaryDirectory("coffer-prompt")
            let pinentry = try ScriptedPinentry(in: dir, behaviour)
            let p = Self.prompter(pinentry)
            #expect(Self.ask(p, Self.request))
            let event = p.await(stop: { false })
            guard case .failed(.protocolError) = event else { Issue.record("\(behaviour): \(event)"); continue }
            #expect(Self.gone(pinentry), "\(behaviour)")
        }
    }

    @Test func theCallerCanStopTheWait() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let p = Self.prompter(try ScriptedPinentry(in: dir, .hangAtGetpin))
        #expect(Self.ask(p, Self.request))
        var fds: [Int32] = [-1, -1]
        #expect(pipe(&fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        var b: UInt8 = 1
        #expect(write(fds[1], &b, 1) == 1)
        var woken = false
        guard case .stopped = p.await(stop: { defer { woken = true }; return woken }, wake: fds[0]) else { Issue.record("not stopped"); return }
    }

    @Test func biometryOnlyShowsAOneButtonConfirmThatCancels() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let pinentry = try ScriptedPinentry(in: dir)
        let p = Self.prompter(pinentry)
        #expect(Self.ask(p, AuthenticationRequest(methods: [.biometry], app: "app", prompt: "app wants it")))
        guard case .answer(.cancel) = p.await(stop: { false }) else { Issue.record("not a cancel"); return }
        #expect(pinentry.commands.contains("CONFIRM --one-button") && pinentry.commands.contains("SETOK Cancel"))
    }

    /// A script at `dir/name` with `body`.
    static func script(_ dir: TemporaryDirectory, _ name: String, _ body: String) throws -> String {
        let path = dir.file(name)
        try ("#!/bin/sh\n" + body + "\n").write(toFile: path + ".src", atomically: true, encoding: .utf8)
        try ScriptedPinentry.install(path + ".src", at: path)
        return path
    }

    @Test func thePinentryGetsOnlyItsEnvironmentAndNoArguments() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let program = try Self.script(dir, "pinentry-env", """
            { echo "args:$#"; env; } > '\(dir.file("seen"))'
            echo OK; while IFS= read -r line; do case "$line" in GETPIN) echo 'D typed secret'; echo OK;; *) echo OK;; esac; done
            """)
        let p = PinentryPrompter(program: program, environment: ["DISPLAY=:7", "LANG=C"])
        #expect(Self.ask(p, Self.request))
        #expect(Self.passcode(p.await(stop: { false })) == "typed secret")
        p.end()
        let seen = try String(contentsOfFile: dir.file("seen"), encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(seen.contains("args:0") && seen.contains("DISPLAY=:7") && seen.contains("LANG=C"), "\(seen)")
        // What the shell adds itself (PWD, SHLVL, _) aside, nothing else came through.
        #expect(seen.filter { !$0.hasPrefix("PWD=") && !$0.hasPrefix("SHLVL=") && !$0.hasPrefix("_=") }.count == 3, "\(seen)")
    }

    @Test func theUserManagersEnvironmentIsReadAndALateManagerIsKilled() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let manager = try Self.script(dir, "systemctl", """
            [ "$1 $2" = "--user show-environment" ] || exit 2
            printf 'DISPLAY=:3\\nWAYLAND_DISPLAY=wayland-1\\nODD=$\\047a\\\\nb\\047\\nLANG=C.UTF-8\\n'
            """)
        let env = try #require(PinentryEnvironment.userManager(systemctl: manager))
        #expect(env["DISPLAY"] == ":3" && env["WAYLAND_DISPLAY"] == "wayland-1" && env["LANG"] == "C.UTF-8", "\(env)")
        #expect(env["ODD"] == nil, "a value systemctl quotes is left out: \(env)")
        let failing = try Self.script(dir, "systemctl-fails", "echo DISPLAY=:9; exit 1")
        #expect(PinentryEnvironment.userManager(systemctl: failing) == nil)
        let late = try Self.script(dir, "systemctl-hangs", "echo DISPLAY=:9; exec sleep 3600")
        let started = Date()
        #expect(PinentryEnvironment.userManager(systemctl: late, timeoutSeconds: 1) == nil)
        #expect(Date().timeIntervalSince(started) < 60)
        #expect(PinentryEnvironment.userManager(systemctl: dir.file("missing")) == nil)
    }
}
