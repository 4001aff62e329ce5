@testable import CofferAgent
@testable import CofferNativeFrontEnd
@testable import CofferAgentPrompt
import CofferAudit
import CofferModel
import CofferPAM
import CofferPrompt
import CofferProtocol
import CofferService
import CofferServiceTestSupport
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// The agent's own prompter as the authentication channel of a protected read: a real pinentry
/// process (CofferTestSupport's scripted one) asks, the passcode goes through real libpam
/// (pam_matrix in a private PAM configuration), a real keychain answers.
@Suite(.enabled(if: FileManager.default.fileExists(atPath: PAMWrapper.matrix), "needs pam_matrix.so (libpam-wrapper)"))
struct AgentPromptChannelTests {
    /// A keychain whose passcode PAM checks, unlocked, holding a passcode-protected item of the app
    /// `com.example.bank`.
    final class Fixture {
        let pam: PAMSandbox
        let rig: AgentRig
        var session: Session
        let dir = TemporaryDirectory("coffer-prompt-agent")

        init() throws {
            pam = try PAMSandbox(password: AgentRig.passcode) { dir in
                "auth required \(PAMWrapper.matrix) passdb=\(dir)/passdb\naccount required \(PAMWrapper.matrix) passdb=\(dir)/passdb\n"
            }
            rig = try AgentRig(passcodeVerifier: PAMAuthenticator(service: "coffer", confdir: pam.dir), userName: currentUser)
            session = rig.greetedSession(as: rig.signedCaller("com.example.bank", ["bank"]))
            #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &session)) == nil)
            let add = AgentRequest.add(NewItem(itemClass: .genericPassword,
                                               attributes: ["svce": .string("bank"), "acct": .string("me"),
                                                            AccessControl.attributeName: .data(AccessControl(parsing: "device-passcode")!.encoded())],
                                               secret: secret("pin 1234")), [])
            #expect(errorStatus(rig.pipeline.handle(add, session: &session)) == nil)
        }

        /// The channel for a pinentry.
        func channel(_ pinentry: ScriptedPinentry) -> AgentPromptChannel {
            AgentPromptChannel(program: pinentry.program, environment: ["LANG=C"], clock: rig.clock, timeoutSeconds: 120)
        }

        /// Reads the item's secret through `channel`.
        func read(_ channel: AgentPromptChannel) -> AgentResponse {
            defer { channel.end() }
            let get = AgentRequest.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("bank")], returnData: true))
            return rig.pipeline.handle(get, session: &session, channel: channel)
        }
    }

    static func secretText(_ r: AgentResponse) -> String? {
        guard case .items(let items) = r else { return nil }
        return text(items.first?.data)
    }

    @Test func aProtectedReadAsksThroughTheAgentsPinentryAndPAMChecksThePasscode() throws {
        let f = try Fixture()
        let pinentry = try ScriptedPinentry(in: f.dir, pins: ["not it", AgentRig.passcode])
        let r = f.read(f.channel(pinentry))
        #expect(Self.secretText(r) == "pin 1234", "\(r)")
        let commands = pinentry.commands
        // The person sees the app as the agent identified it (its signed manifest), and the wrong
        // passcode's feedback before the second try.
        #expect(commands.contains("SETTITLE Coffer: com.example.bank"), "\(commands)")
        // ... and how the agent knows it (issue #43): a signed app.
        #expect(commands.contains {
            $0.hasPrefix("SETDESC Requested by: com.example.bank (signed app: a trusted manifest pins its executable)%0A%0Acom.example.bank wants to read")
        }, "\(commands)")
        #expect(commands.contains { $0.hasPrefix("SETERROR Wrong passcode. Try again") } && commands.filter { $0 == "GETPIN" }.count == 2, "\(commands)")
        #expect(!commands.joined().contains(AgentRig.passcode))
        // Real PAM checked it: the stub saw nothing.
        #expect(f.rig.verifier.callCount == 0)
        #expect(!pinentry.isRunning)
    }

    @Test func threeWrongPasscodesFailTheRead() throws {
        let f = try Fixture()
        let pinentry = try ScriptedPinentry(in: f.dir, pins: ["a", "b", "c"])
        #expect(errorStatus(f.read(f.channel(pinentry))) == .authFailed)
    }

    @Test func aCancelOrABrokenPinentryEndsTheReadWithoutTheSecret() throws {
        let f = try Fixture()
        for behaviour in [ScriptedPinentry.Behaviour.cancel, .crashAtGetpin, .exitAtOnce, .garbageLines] {
            let dir = TemporaryDirectory("coffer-prompt-agent")
            let pinentry = try ScriptedPinentry(in: dir, behaviour)
            let channel = f.channel(pinentry)
            #expect(errorStatus(f.read(channel)) == .userCanceled, "\(behaviour)")
            #expect((channel.failure == nil) == (behaviour == .cancel), "\(behaviour): \(String(describing: channel.failure))")
        }
        // Nothing was left unlocked by the failures: the right passcode still works.
        let good = try ScriptedPinentry(in: f.dir, pins: [AgentRig.passcode])
        #expect(Self.secretText(f.read(f.channel(good))) == "pin 1234")
    }

    @Test func aDialogNobodyAnswersEndsAtThePromptersDeadline() throws {
        let f = try Fixture()
        let pinentry = try ScriptedPinentry(in: f.dir, .hangAtGetpin)
        // The request's own deadline is on the rig's fake clock (which never moves): the prompter's
        // hard deadline ends it (generous enough for the greeting on a loaded machine, which
        // either way fails the read).
        let channel = AgentPromptChannel(program: pinentry.program, environment: [], clock: f.rig.clock, timeoutSeconds: 5)
        #expect(errorStatus(f.read(channel)) == .userCanceled)
        #expect(!pinentry.isRunning)
    }

    @Test func aProtectedItemIsReadOnASecondListenerOfARunningAgentThroughItsPinentry() throws {
        let pam = try PAMSandbox(password: AgentRig.passcode) { dir in
            "auth required \(PAMWrapper.matrix) passdb=\(dir)/passdb\naccount required \(PAMWrapper.matrix) passdb=\(dir)/passdb\n"
        }
        let dir = TemporaryDirectory("coffer-prompt-agent")
        let pinentry = try ScriptedPinentry(in: dir, pins: ["not it", AgentRig.passcode])
        let program = pinentry.program
        // The line protocol's clients cannot prompt: each request gets the agent's own pinentry.
        let agent = try TwoListeners(channel: { AgentPromptChannel(program: program, environment: [], clock: SystemClock(), timeoutSeconds: 120) },
                                     configure: { $0.userName = currentUser }, verifier: PAMAuthenticator(service: "coffer", confdir: pam.dir))
        let set = try agent.native([.setPasscode(current: secret(""), new: secret(AgentRig.passcode)),
                                    TwoListeners.add("bank", "pin 1234", rule: "device-passcode")])
        #expect(set.allSatisfy { errorStatus($0) == nil }, "\(set)")
        #expect(try agent.line("GET bank me") == "OK pin 1234")
        let commands = pinentry.commands
        // The app as the agent identified this (unsigned) process: its executable's name.
        let app = String(ThisProcess.executablePath()?.split(separator: "/").last ?? "")
        #expect(!app.isEmpty && commands.contains("SETTITLE Coffer: \(app)"), "\(commands)")
        // The dialog says that nothing vouches for it (issue #43).
        #expect(commands.contains { $0.hasPrefix("SETDESC Requested by: \(app) (unsigned program /") && $0.contains("no trusted manifest names the executable") },
                "\(commands)")
        #expect(commands.contains { $0.hasPrefix("SETERROR Wrong passcode. Try again") } && commands.filter { $0 == "GETPIN" }.count == 2, "\(commands)")
        #expect(Self.gone(pinentry), "the pinentry is stopped with the request")
    }

    /// Waits (generously) until `pinentry` has been reaped.
    static func gone(_ pinentry: ScriptedPinentry) -> Bool {
        for _ in 0..<600 where pinentry.isRunning { usleep(50_000) }
        return !pinentry.isRunning
    }

    @Test func thePinentryComesFromTheAgentsConfiguration() throws {
        var c = AgentConfiguration(socketPath: "/x", stateDirectory: "/y", userName: "u")
        try c.apply(configFile: "pinentry = /usr/bin/pinentry-gnome3\nprompt-display = :7\n", name: "cofferd.conf")
        #expect(c.pinentry == .program("/usr/bin/pinentry-gnome3"))
        #expect(c.pinentryChoice == PinentryChoice(program: "/usr/bin/pinentry-gnome3", reason: "pinentry = /usr/bin/pinentry-gnome3 in cofferd.conf"))
        #expect(c.promptDisplay == PromptDisplay(x11: ":7", wayland: nil, origin: .configuration))
        #expect((try? AgentPromptChannel.open(configuration: c, clock: FakeClock()).get()) != nil)
        var relative = AgentConfiguration(socketPath: "/x", stateDirectory: "/y", userName: "u")
        #expect(throws: AgentError.self) { try relative.apply(configFile: "pinentry = pinentry-gnome3\n", name: "cofferd.conf") }
        #expect(throws: AgentError.self) { try relative.apply(configFile: "prompt-display = my screen\n", name: "cofferd.conf") }
        var none = AgentConfiguration(socketPath: "/x", stateDirectory: "/y", userName: "u")
        #expect(none.pinentry == .automatic, "by default the first graphical pinentry installed")
        try none.apply(configFile: "pinentry = none\n", name: "cofferd.conf")
        #expect(none.pinentry == .none)
        #expect(AgentPromptChannel.open(configuration: none, clock: FakeClock()).failure
                == .noPinentry("pinentry = none in cofferd.conf: the agent shows no dialogs"), "pinentry = none: nobody to ask")
        // Nothing installed where the default search looks: nobody to ask either, and the reason says what to install.
        var bare = AgentConfiguration(socketPath: "/x", stateDirectory: "/y", userName: "u")
        let empty = TemporaryDirectory("coffer-no-pinentry")
        bare.pinentrySearch = ([empty.path], getuid())
        guard case .noPinentry(let why)? = AgentPromptChannel.open(configuration: bare, clock: FakeClock()).failure else {
            Issue.record("expected no pinentry"); return
        }
        #expect(why.contains("no graphical pinentry is installed") && why.contains("install pinentry-gnome3"), "\(why)")
    }

    /// A pinentry but no display: without a `prompt-display`, logind's session decides, and a logind
    /// that cannot be asked (here: no loginctl) leaves nobody to ask, whatever display the agent has.
    @Test func withoutALoginSessionDisplayNobodyIsAsked() throws {
        var c = AgentConfiguration(socketPath: "/x", stateDirectory: "/y", userName: "u")
        try c.apply(configFile: "pinentry = /usr/bin/pinentry-gnome3\n", name: "cofferd.conf")
        guard case .noDisplay(.unreachable)? = AgentPromptChannel.open(configuration: c, clock: FakeClock(), loginctl: "/nonexistent/loginctl").failure else {
            Issue.record("a channel without a display"); return
        }
        #expect(PromptUnavailable.noDisplay(.unreachable("x")).error.status == .interactionNotAllowed)
        #expect("\(PromptUnavailable.noDisplay(.unreachable("x")))".contains("prompt-display"))
    }
}

extension Result {
    /// The failure, nil on success.
    var failure: Failure? {
        if case .failure(let f) = self { return f }
        return nil
    }
}
