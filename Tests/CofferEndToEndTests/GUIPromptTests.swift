import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// Issue #43: the agent's dialog reaches the person on a real X display, through a real GUI pinentry,
/// and only what the person does there decides. Xvfb as the session's display (`prompt-display`, as
/// on a machine without logind), Debian's pinentry-gtk2 as the agent's pinentry, xdotool as the
/// person's hands, and libsecret's `secret-tool` asking the real Secret Service front end for an item
/// while the keychain is locked. A second run cancels the dialog: the client gets a clear failure at
/// once and nothing is lost.
@Suite(.enabled(if: GUIPromptRig.available && PrivateSessionBus.available && PrivateSessionBus.clientsAvailable,
                "needs Xvfb, xdotool and pinentry-gtk2 (apt: xvfb xdotool pinentry-gtk2), dbus-daemon and libsecret-tools (contrib/deps.sh)"))
struct GUIPromptTests {
    @Test func theUnlockDialogAppearsOnTheSessionsDisplayAndThePersonsAnswerUnlocks() throws {
        let rig = try GUIPromptRig()
        let person = rig.person(typing: AgentProcess.password)
        let found = rig.lookup()
        let saw = person.finish()
        #expect(found.status == 0 && found.stdout == "s3cret", "\(found)\n\(saw)\n\(rig.bus.read("front-end.log"))\n\(rig.agent.log)")
        // The dialog was on the session's display, titled with the app as the agent identified it.
        #expect(saw.window?.hasPrefix("Coffer: ") == true, "\(saw)")
        #expect(saw.display == rig.display.name)
        #expect(rig.agent.cli(["status"]).stdout.contains("state: unlocked"))
    }

    /// The agent as a login starts it (issue #43: "an agent started by PAM at login has no display"):
    /// pam_coffer starts cofferd at the session's open (agent=), with no DISPLAY of its own, and sets the
    /// passcode to the login password. The Secret Service front end asks it for an item while it is
    /// locked: its dialog appears on the session's display all the same (prompt-display), the person's
    /// answer unlocks, and secret-tool gets the secret.
    @Test func anAgentStartedByTheLoginShowsItsDialogOnTheSessionsDisplay() throws {
        let rig = try GUIPromptRig(storing: true, startedByLogin: true)
        // A locked keychain: the dialog appears on the session's display and the person answers it.
        let person = rig.person(typing: AgentProcess.password)
        let found = rig.lookup()
        let saw = person.finish()
        #expect(saw.window?.hasPrefix("Coffer: ") == true, "\(saw)\n\(rig.bus.read("front-end.log").suffix(2000))")
        #expect(found.status == 0 && found.stdout == "s3cret", "\(found)\n\(saw)\n\(rig.bus.read("front-end.log").suffix(2000))")
        #expect(rig.agent.cli(["status"]).stdout.contains("state: unlocked"))
    }

    @Test func aCancelledDialogIsAClearFailureAndLosesNothing() throws {
        let rig = try GUIPromptRig()
        let person = rig.person(typing: nil)
        let started = Date()
        let refused = rig.lookup()
        let saw = person.finish()
        #expect(saw.window?.hasPrefix("Coffer: ") == true, "\(saw)\n\(rig.agent.log)")
        #expect(refused.status != 0 && refused.stdout.isEmpty, "\(refused)")
        #expect(Date().timeIntervalSince(started) < 60, "the cancel ended the request at once: \(saw)\n\(rig.agent.log.suffix(3000))")
        #expect(rig.agent.cli(["status"]).stdout.contains("state: locked"))
        // Nothing was deleted: unlocked by other means, the item is there.
        #expect(rig.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        let after = rig.lookup()
        #expect(after.status == 0 && after.stdout == "s3cret", "\(after)")
    }
}

/// Headless Chromium with `--password-store=gnome-libsecret` (its cookies encrypted with the key it
/// keeps as "Chromium Safe Storage" in the Secret Service), its Safe Storage item in a locked
/// keychain of an agent the login started (pam_coffer, as on a desktop): Chromium starts, the agent's dialog appears on the session's display and is answered,
/// Chromium gets its key and its cookie survives the restart. Cancelled: Chromium goes on without
/// the key at once, and Coffer loses nothing: the same key is there and serves Chromium afterwards.
@Suite(.enabled(if: GUIPromptRig.available && ChromiumRig.available && PrivateSessionBus.available && PrivateSessionBus.clientsAvailable,
                "needs Xvfb, xdotool, pinentry-gtk2 and chromium (apt: xvfb xdotool pinentry-gtk2 chromium), dbus-daemon and libsecret-tools"))
struct ChromiumPromptTests {
    /// Once behind a variable: one of four full parallel runs failed, read then as Chromium giving up
    /// on its key while a loaded machine still showed the dialog. Chromium's wait is not that short:
    /// with the person answering only 30 s and 50 s after the dialog appeared, Chromium still got its
    /// key and its cookie (2026-12-07). The failure was the person's keys lost on a loaded machine, which
    /// `GUIPromptRig.Person` now retries until shortly before the agent's 60 s timeout.
    @Test
    func chromiumsKeyIsReleasedThroughTheDialogAndItsCookiesSurviveARestart() throws {
        // The agent as the login started it (pam_coffer, no display of its own), as on a desktop.
        let rig = try GUIPromptRig(storing: false, startedByLogin: true)
        let chromium = try ChromiumRig(rig)
        // First start, keychain unlocked: Chromium makes its key (an item through the Secret Service)
        // and keeps the server's cookie, encrypted with it.
        #expect(chromium.visit("/set").contains("cookie=[]"), "\(chromium.last)")
        let stored = rig.bus.run("/usr/bin/secret-tool", ["search", "application", "chromium"], display: nil)
        #expect(stored.stdout.contains("label = Chromium Safe Storage") || stored.stderr.contains("label = Chromium Safe Storage"), "\(stored)")
        #expect(rig.agent.cli(["lock"]).status == 0)
        // Restarted with the keychain locked: the dialog, the passcode, the key, the cookie.
        let person = rig.person(typing: AgentProcess.password)
        let page = chromium.visit("/show")
        let saw = person.finish()
        #expect(saw.window?.hasPrefix("Coffer: ") == true, "\(saw)\n\(rig.agent.log)")
        #expect(page.contains("cookie=[session=kept-across-restarts]"), "\(chromium.last)\n\(saw)\n\(rig.bus.read("front-end.log"))")
        #expect(rig.agent.cli(["status"]).stdout.contains("state: unlocked"))
    }

    @Test func aCancelledDialogLeavesChromiumWithoutItsKeyAndDeletesNothing() throws {
        let rig = try GUIPromptRig(storing: false)
        let chromium = try ChromiumRig(rig)
        #expect(chromium.visit("/set").contains("cookie=[]"), "\(chromium.last)")
        let before = rig.bus.run("/usr/bin/secret-tool", ["lookup", "application", "chromium"], display: nil)
        #expect(before.status == 0 && !before.stdout.isEmpty, "\(before)")
        #expect(rig.agent.cli(["lock"]).status == 0)
        let person = rig.person(typing: nil)
        let started = Date()
        let page = chromium.visit("/show")
        let saw = person.finish()
        #expect(saw.window?.hasPrefix("Coffer: ") == true, "\(saw)\n\(rig.agent.log)")
        #expect(!page.contains("kept-across-restarts"), "Chromium read its cookie without its key: \(chromium.last)")
        #expect(Date().timeIntervalSince(started) < 90, "Chromium was not kept waiting: \(saw)")
        #expect(rig.agent.cli(["status"]).stdout.contains("state: locked"))
        // Coffer deleted nothing: unlocked by other means, the same key is there, and Chromium goes on
        // with it. (The cookie itself is Chromium's: it drops a cookie it could not decrypt without its
        // key, as it does when gnome-keyring's prompt is cancelled.)
        #expect(rig.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        let after = rig.bus.run("/usr/bin/secret-tool", ["lookup", "application", "chromium"], display: nil)
        #expect(after.status == 0 && after.stdout == before.stdout, "the Safe Storage key changed or went: \(after)")
        #expect(chromium.visit("/set").contains("cookie=[]"), "\(chromium.last)")
        #expect(chromium.visit("/show").contains("cookie=[session=kept-across-restarts]"), "\(chromium.last)")
        let still = rig.bus.run("/usr/bin/secret-tool", ["lookup", "application", "chromium"], display: nil)
        #expect(still.stdout == before.stdout, "Chromium made another key: \(still)")
    }
}

/// Headless Chromium on the rig's bus with a profile of its own, and a local web server that sets a
/// cookie (`/set`) and shows the cookies it is sent (`/show`).
final class ChromiumRig: @unchecked Sendable {
    static let chromium = "/usr/bin/chromium"
    static var available: Bool { FileManager.default.isExecutableFile(atPath: chromium) }

    let rig: GUIPromptRig
    let dir = TemporaryDirectory("coffer-chromium")
    private let server: Process
    let port: Int
    /// The last run's result (for messages).
    private(set) var last = CLIResult(status: -1, stdout: "", stderr: "")

    init(_ rig: GUIPromptRig) throws {
        self.rig = rig
        let script = dir.file("server.py")
        try """
            http = __import__('http.server').server
            class H(http.BaseHTTPRequestHandler):
                def do_GET(self):
                    body = ('cookie=[%s]' % self.headers.get('Cookie', '')).encode()
                    self.send_response(200)
                    if self.path == '/set':
                        self.send_header('Set-Cookie', 'session=kept-across-restarts; Max-Age=86400; Path=/')
                    self.send_header('Content-Type', 'text/plain')
                    self.send_header('Content-Length', str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                def log_message(self, *a):
                    pass
            s = http.HTTPServer(('127.0.0.1', 0), H)
            open(__import__('sys').argv[1], 'w').write('%d\\n' % s.server_address[1])
            s.serve_forever()

            """.write(toFile: script, atomically: true, encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        p.arguments = [script, dir.file("port")]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        server = p
        var port = 0
        let portFile = dir.file("port")
        _ = PrivateSessionBus.wait(30) {
            let text = (try? String(contentsOfFile: portFile, encoding: .utf8)) ?? ""
            if text.hasSuffix("\n") { port = Int(text.dropLast()) ?? 0 }
            return port != 0 || !p.isRunning
        }
        guard port != 0 else { throw SignedApps.Failure("the web server did not start") }
        self.port = port
    }

    deinit { if server.isRunning { kill(server.processIdentifier, SIGKILL) } }

    /// Starts Chromium on `path` of the server, returns the page as it shows it (`--dump-dom`).
    func visit(_ path: String) -> String {
        last = runProcess(Self.chromium, ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--password-store=gnome-libsecret",
                                          "--user-data-dir=" + dir.file("profile"), "--dump-dom", "http://127.0.0.1:\(port)\(path)"],
                          environment: ["DBUS_SESSION_BUS_ADDRESS": rig.bus.address, "HOME": dir.path],
                          unset: ["DISPLAY", "WAYLAND_DISPLAY"], timeout: 120)
        return last.stdout
    }
}

/// An X display, the agent whose pinentry is pinentry-gtk2 on it, the Secret Service front end on a
/// private bus, an item stored through it, and the keychain locked.
final class GUIPromptRig: @unchecked Sendable {
    static let pinentry = "/usr/bin/pinentry-gtk-2"
    static let xdotool = "/usr/bin/xdotool"
    static var available: Bool {
        [pinentry, xdotool, "/usr/bin/Xvfb"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
    }

    let display: VirtualDisplay
    let apps: SignedApps
    let agent: AgentProcess
    let bus: PrivateSessionBus
    let frontEnd: Process
    /// The PAM module and service of a login-started agent (nil: the agent was started directly).
    private let login: TemporaryDirectory?

    /// With `storing`, an item stored through secret-tool and the keychain locked; else unlocked and empty.
    ///
    /// `startedByLogin`: the agent as a login starts it (issue #43: "an agent started by PAM at login has
    /// no display"): pam_coffer starts cofferd at the session's open (`agent=`), with no DISPLAY of its
    /// own, and sets the passcode to the login password; its dialogs appear on the session's display all
    /// the same (`prompt-display`). What the harness would pass on the command line goes into the
    /// configuration (pam_coffer passes at most 8 `agentarg=` tokens), as an administrator's pam.d line
    /// would start it. Else the harness starts the agent and sets the passcode.
    init(storing: Bool = true, startedByLogin: Bool = false) throws {
        display = try VirtualDisplay(width: 800, height: 600)
        let dialogs = ["authentication-timeout = 60", "pinentry = \(Self.pinentry)", "prompt-display = \(display.name)"]
        if startedByLogin {
            apps = try SignedApps()
            let executable = String(decoding: try StableFile.canonicalPath(Binaries.directory + "/coffer-secret-service"), as: UTF8.self)
            try apps.sign("secret-service", appID: SecretServiceBusTests.frontEndApp, groups: ["secret-service"], path: executable,
                          entitlements: ["delegate-identity"])
            agent = try AgentProcess(pamService: "coffer-login", start: false)
            let config = try apps.writeAgentConfig(dialogs + ["state-dir = \(agent.stateDir)", "pam-confdir = \(agent.pamDir)",
                                                              "pam-service = coffer-login"])
            let tmp = TemporaryDirectory("coffer-gui-pam")
            login = tmp
            let module = try PAMModuleTests.buildModule(into: tmp)
            let services = tmp.path + "/services"
            try FileManager.default.createDirectory(atPath: services, withIntermediateDirectories: true)
            let extra = ["--config", config, "--kdf-ops", "1", "--log-level", "debug"].map { "agentarg=\($0)" }.joined(separator: " ")
            try PAMModuleTests.writeLoginService(dir: services, module: module, passdb: agent.passdb,
                                                 moduleArgs: "socket=\(agent.socketPath) budget_ms=60000 agent=\(Binaries.cofferd) \(extra)")
            try FileManager.default.createDirectory(atPath: Files.directoryName(agent.socketPath), withIntermediateDirectories: true)
            let pw = AgentProcess.password
            // The login: pam_coffer starts the agent (its environment has no DISPLAY) and sets the passcode.
            let opened = PAMModuleTests.pamtester(serviceDir: services, ["authenticate", "open_session"], input: "\(pw)\n\(pw)\n",
                                                  environment: "env -u DISPLAY -u WAYLAND_DISPLAY")
            #expect(opened.status == 0, "\(opened)")
            bus = try PrivateSessionBus()
            frontEnd = try bus.startFrontEnd(executable, agent: agent)
            #expect(agent.cli(["status"]).stdout.contains("state: unlocked"), "the login did not start and unlock the agent")
        } else {
            login = nil
            (apps, agent, bus, frontEnd, _) = try SecretServiceBusTests.setUp(agentConfig: dialogs)
            agent.setPasscode()
        }
        guard storing else { return }
        let store = bus.run("/usr/bin/secret-tool", ["store", "--label=Mail", "server", "mail.example.com"], stdin: "s3cret")
        #expect(store.status == 0, "\(store)\n\(bus.read("front-end.log"))")
        #expect(agent.cli(["lock"]).status == 0)
    }

    /// A login-started agent is no child of the test: it is stopped by its socket.
    deinit {
        guard login != nil else { return }
        frontEnd.terminate()
        let pids = runShell("pgrep -f -- '--socket \(agent.socketPath)'", socket: "").stdout.split(separator: "\n").compactMap { Int32($0) }
        for pid in pids { kill(pid, SIGTERM) }
    }

    func lookup() -> CLIResult { bus.run("/usr/bin/secret-tool", ["lookup", "server", "mail.example.com"]) }

    /// What the person saw: the dialog's title (nil: none appeared within the wait) and its display.
    struct Seen: Sendable, CustomStringConvertible {
        var window: String?
        var display: String
        /// What each attempt's xdotool steps answered (for a failure's message).
        var attempts: [String] = []
        var description: String { "dialog \(window ?? "none") on \(display)" + (attempts.isEmpty ? "" : "; attempts: " + attempts.joined(separator: " | ")) }
    }

    /// The person at the display, on a thread of its own: waits for the agent's dialog, then types
    /// `typing` and Return into it, or presses Escape (nil). `finish()` returns what it saw.
    final class Person: @unchecked Sendable {
        private let done = DispatchSemaphore(value: 0)
        private let seen: Protected<Seen>

        init(display: String, typing: String?) {
            seen = Protected(Seen(window: nil, display: display))
            let seen = self.seen, done = self.done
            Thread.detachNewThread {
                defer { done.signal() }
                // xdotool waits for a visible window titled by the agent's prompter (at most 60 s).
                let title = GUIPromptRig.xdotool(display, ["search", "--sync", "--onlyvisible", "--name", "^Coffer: ", "getwindowname"], timeout: 60)
                guard title.status == 0, !title.stdout.isEmpty else { return }
                seen.withLock { $0.window = title.stdout.split(separator: "\n").first.map(String.init) }
                // The pinentry grabs the keyboard once it is up: the person's keys go to it. A window
                // can be visible before its grab and entry are ready (a loaded machine), and keys sent
                // then are lost: the person acts, waits for the dialog to go, and acts again (the field
                // cleared first) while it is still there. A partial passcode that went in is a wrong
                // one: the agent asks again in the same dialog.
                // Each attempt first gives the dialog the input focus itself: if the pinentry's own grab
                // did not take (as in one CI run: the dialog stayed up, every key lost, until the agent's
                // 60 s timeout), keys would go to the root window. There is no window manager on Xvfb;
                // XSetInputFocus needs none.
                // Attempts go on until shortly before the agent's own 60 s authentication timeout (a
                // CI run with every core busy lost the keys of three attempts in a row).
                let giveUp = Date().addingTimeInterval(50)
                repeat {
                    var steps: [Int32] = []
                    steps.append(GUIPromptRig.xdotool(display, ["search", "--onlyvisible", "--name", "^Coffer: ", "windowfocus", "--sync"], timeout: 10).status)
                    usleep(300_000)   // the focus settles before the first key
                    if let typing {
                        steps.append(GUIPromptRig.xdotool(display, ["key", "ctrl+a", "BackSpace"], timeout: 10).status)
                        steps.append(GUIPromptRig.xdotool(display, ["type", "--delay", "20", typing], timeout: 30).status)
                        steps.append(GUIPromptRig.xdotool(display, ["key", "Return"], timeout: 10).status)
                    } else {
                        steps.append(GUIPromptRig.xdotool(display, ["key", "Escape"], timeout: 10).status)
                    }
                    seen.withLock { $0.attempts.append(steps.map(String.init).joined(separator: ",")) }
                    if GUIPromptRig.dialogGone(display, within: 8) { return }
                } while Date() < giveUp
            }
        }

        func finish() -> Seen {
            _ = done.wait(timeout: .now() + 120)
            return seen.withLock { $0 }
        }
    }

    func person(typing: String?) -> Person { Person(display: display.name, typing: typing) }

    /// Waits (at most `seconds`) until no dialog of the agent's prompter is visible on `display`.
    static func dialogGone(_ display: String, within seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let shown = xdotool(display, ["search", "--onlyvisible", "--name", "^Coffer: "], timeout: 10)
            if shown.status != 0 || shown.stdout.isEmpty { return true }
            usleep(100_000)
        }
        return false
    }

    /// Runs xdotool on `display` (bounded by `timeout` seconds).
    static func xdotool(_ display: String, _ arguments: [String], timeout: Int) -> CLIResult {
        runCLI(["-k", "5", "\(timeout)", xdotool] + arguments, environment: ["DISPLAY": display], executable: "/usr/bin/timeout",
               timeout: Double(timeout + 10))
    }
}
