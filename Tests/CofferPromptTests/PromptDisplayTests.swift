@testable import CofferPrompt
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// Where the agent's dialogs may appear (issue #41, F1): the person's login session as systemd-logind
/// reports it through `loginctl` (``LoginSessions``), or the configured `prompt-display`; never a
/// display from the user manager's or anyone's environment (``PinentryEnvironment``).
@Suite struct PromptDisplayTests {
    static let uid: UInt32 = 1000

    /// A session of `uid` with these properties (the defaults: active, local, X11 on `:0`, class user).
    static func session(_ id: String = "2", uid: UInt32? = PromptDisplayTests.uid, type: String = "x11", sessionClass: String = "user",
                        display: String = ":0", active: Bool = true, remote: Bool = false) -> LoginSession {
        LoginSession(id: id, uid: uid, type: type, sessionClass: sessionClass, display: display, active: active, remote: remote)
    }

    @Test func loginctlsKeyValueLinesAreParsed() {
        let p = LoginSessions.properties("Display=2\nSessions=2 5 c1\nRuntimePath=/run/user/1000\nnot a property\n=x\nDisplay=9\nOdd Key=1\nEmpty=\n")
        #expect(p == ["Display": "2", "Sessions": "2 5 c1", "RuntimePath": "/run/user/1000", "Empty": ""], "\(p)")
        let s = LoginSession(properties: LoginSessions.properties(
            "Id=5\nUser=1000\nName=alice\nType=x11\nClass=user\nDisplay=:1\nActive=yes\nRemote=no\n"))
        #expect(s == Self.session("5", display: ":1"))
        #expect(LoginSession(properties: ["Type": "x11"]) == nil, "no Id: not a session")
        // What logind did not say is the safe answer: not active, remote.
        let bare = try! #require(LoginSession(properties: ["Id": "7"]))
        #expect(!bare.active && bare.remote && bare.uid == nil)
    }

    @Test func theUsersDisplaySessionIsLookedAtFirstAndOddIdsNever() {
        #expect(LoginSessions.candidateSessions(["Display": "5", "Sessions": "2 5 c1"]) == ["5", "2", "c1"])
        #expect(LoginSessions.candidateSessions(["Sessions": "2"]) == ["2"])
        #expect(LoginSessions.candidateSessions(["Display": "", "Sessions": ""]) == [])
        #expect(LoginSessions.candidateSessions(["Display": "-h", "Sessions": "--all 3 a/b 4;x self auto 5"]) == ["3", "5"],
                "an id that loginctl could read as an option, or that is not logind's form, is never passed")
        let many = (1...40).map(String.init).joined(separator: " ")
        #expect(LoginSessions.candidateSessions(["Sessions": many]).count == LoginSessions.maximumSessions)
    }

    @Test func onlyTheUsersActiveLocalGraphicalUserSessionShowsDialogs() {
        let runtime = "/run/user/1000"
        #expect(Self.session().promptDisplay(for: Self.uid, runtimePath: runtime)
                == PromptDisplay(x11: ":0", wayland: nil, origin: .loginSession("2")))
        #expect(Self.session(display: ":1.0").promptDisplay(for: Self.uid, runtimePath: runtime)?.x11 == ":1.0")
        let refused: [(String, LoginSession)] = [
            ("inactive (another seat's or a switched-away VT's)", Self.session(active: false)),
            ("remote (ssh -X)", Self.session(remote: true)),
            ("tty only", Self.session(type: "tty", display: "")),
            ("unspecified type", Self.session(type: "unspecified")),
            ("a greeter", Self.session(sessionClass: "greeter")),
            ("a lock screen", Self.session(sessionClass: "lock-screen")),
            ("a background session", Self.session(sessionClass: "background")),
            ("another user's", Self.session(uid: 1001)),
            ("root's, for a user agent", Self.session(uid: 0)),
            ("owner not reported", Self.session(uid: nil)),
            ("x11 without a display", Self.session(display: "")),
            ("x11 on a remote display", Self.session(display: "localhost:10.0")),
            ("x11 display that is not a display name", Self.session(display: ":0 -evil")),
        ]
        for (why, s) in refused { #expect(s.promptDisplay(for: Self.uid, runtimePath: runtime) == nil, "\(why)") }
        // Wayland: logind records no socket; the compositor's wayland-0 in logind's runtime directory.
        let wayland = Self.session(type: "wayland", display: "")
        #expect(wayland.promptDisplay(for: Self.uid, runtimePath: runtime)
                == PromptDisplay(x11: nil, wayland: "wayland-0", runtimeDirectory: runtime, origin: .loginSession("2")))
        #expect(wayland.promptDisplay(for: Self.uid, runtimePath: runtime)?.variables
                == ["WAYLAND_DISPLAY": "wayland-0", "XDG_RUNTIME_DIR": runtime])
        #expect(Self.session(type: "wayland", display: ":1").promptDisplay(for: Self.uid, runtimePath: runtime)?.x11 == ":1", "Xwayland's, as logind has it")
        #expect(wayland.promptDisplay(for: Self.uid, runtimePath: nil) == nil && wayland.promptDisplay(for: Self.uid, runtimePath: "run") == nil)
    }

    @Test func aConfiguredDisplayIsAnX11DisplayOrAWaylandSocket() {
        #expect(PromptDisplay(configured: ":0")?.variables == ["DISPLAY": ":0"])
        #expect(PromptDisplay(configured: ":12.1")?.x11 == ":12.1")
        #expect(PromptDisplay(configured: "kiosk:0")?.x11 == "kiosk:0")
        #expect(PromptDisplay(configured: "wayland-1")?.variables == ["WAYLAND_DISPLAY": "wayland-1"])
        #expect(PromptDisplay(configured: "/run/kiosk/wayland-0")?.wayland == "/run/kiosk/wayland-0")
        #expect(PromptDisplay(configured: ":0")?.origin == .configuration)
        for bad in ["", "0", ":", ":x", ":0 :1", "wayland-0/../x", "weston", "/", "wayland-0\nDISPLAY=:9", ":123456"] {
            #expect(PromptDisplay(configured: bad) == nil, "\(bad)")
        }
    }

    /// A fake `loginctl` answering `show-user` and `show-session` from files in `dir` (`user`,
    /// `session-ID`), and logging each run's arguments and environment to `calls`.
    static func fakeLoginctl(_ dir: TemporaryDirectory, user: String, sessions: [String: String]) throws -> String {
        try user.write(toFile: dir.file("user"), atomically: true, encoding: .utf8)
        for (id, text) in sessions { try text.write(toFile: dir.file("session-\(id)"), atomically: true, encoding: .utf8) }
        let path = dir.file("loginctl")
        try ("""
            #!/bin/sh
            D='\(dir.path)'
            { echo "args: $*"; env | sort | sed 's/^/env: /'; } >> "$D/calls"
            [ "$1" = "--no-pager" ] || exit 2
            case "$2" in
              show-user) [ "$3" = "\(uid)" ] || { echo "Failed to get user: No such user" >&2; exit 1; }; cat "$D/user";;
              show-session) [ -f "$D/session-$3" ] || { echo "Failed to get session path: No session '$3' known" >&2; exit 1; }; cat "$D/session-$3";;
              *) exit 2;;
            esac

            """).write(toFile: path + ".src", atomically: true, encoding: .utf8)
        try ScriptedPinentry.install(path + ".src", at: path)
        return path
    }

    static func sessionText(_ id: String, uid: UInt32 = PromptDisplayTests.uid, type: String = "x11", display: String = ":5",
                            active: String = "yes", remote: String = "no", sessionClass: String = "user") -> String {
        // In logind's GetAll order, not the order of -p.
        "Id=\(id)\nUser=\(uid)\nName=alice\nDisplay=\(display)\nRemote=\(remote)\nType=\(type)\nClass=\(sessionClass)\nActive=\(active)\n"
    }

    @Test func theSessionDisplayComesFromLoginctlAndOnlyTheUsersActiveLocalGraphicalSessionCounts() throws {
        let dir = TemporaryDirectory("coffer-logind")
        // Session 3 (logind's display session for the user) is inactive; 4 is remote; 6 is a tty;
        // 7 is another user's (as if logind listed it); 8 is the one.
        let loginctl = try Self.fakeLoginctl(dir, user: "RuntimePath=/run/user/1000\nDisplay=3\nSessions=3 4 6 7 8\n", sessions: [
            "3": Self.sessionText("3", display: ":3", active: "no"),
            "4": Self.sessionText("4", display: ":4", remote: "yes"),
            "6": Self.sessionText("6", type: "tty", display: ""),
            "7": Self.sessionText("7", uid: 1001, display: ":7"),
            "8": Self.sessionText("8", display: ":8"),
        ])
        let found = LoginSessions.promptDisplay(uid: Self.uid, loginctl: loginctl)
        #expect(found == .success(PromptDisplay(x11: ":8", wayland: nil, origin: .loginSession("8"))), "\(found)")
        let calls = try String(contentsOfFile: dir.file("calls"), encoding: .utf8).split(separator: "\n").map(String.init)
        #expect(calls.filter { $0.hasPrefix("args:") } == [
            "args: --no-pager show-user 1000 -p Display -p Sessions -p RuntimePath",
            "args: --no-pager show-session 3 -p Id -p User -p Type -p Class -p Display -p Active -p Remote",
            "args: --no-pager show-session 4 -p Id -p User -p Type -p Class -p Display -p Active -p Remote",
            "args: --no-pager show-session 6 -p Id -p User -p Type -p Class -p Display -p Active -p Remote",
            "args: --no-pager show-session 7 -p Id -p User -p Type -p Class -p Display -p Active -p Remote",
            "args: --no-pager show-session 8 -p Id -p User -p Type -p Class -p Display -p Active -p Remote",
        ], "\(calls)")
        // loginctl gets the system bus address (if the agent has one), PATH and LANG=C; nothing else
        // (what the shell adds itself aside).
        let names = Set(calls.filter { $0.hasPrefix("env: ") }.compactMap { $0.dropFirst(5).split(separator: "=").first.map(String.init) })
            .subtracting(["PWD", "SHLVL", "_"])
        #expect(names.isSubset(of: ["PATH", "LANG", "DBUS_SYSTEM_BUS_ADDRESS"]) && names.isSuperset(of: ["PATH", "LANG"]), "\(names)")
        #expect(calls.contains("env: LANG=C"))
    }

    @Test func logindsDisplaySessionIsTakenWhenItQualifiesAndWaylandGetsTheRuntimeDirectorysSocket() throws {
        let dir = TemporaryDirectory("coffer-logind")
        let loginctl = try Self.fakeLoginctl(dir, user: "Display=c2\nSessions=1 c2\nRuntimePath=/run/user/1000\n", sessions: [
            "1": Self.sessionText("1", display: ":1"),
            "c2": Self.sessionText("c2", type: "wayland", display: ""),
        ])
        let found = LoginSessions.promptDisplay(uid: Self.uid, loginctl: loginctl)
        #expect(found == .success(PromptDisplay(x11: nil, wayland: "wayland-0", runtimeDirectory: "/run/user/1000", origin: .loginSession("c2"))),
                "\(found)")
    }

    @Test func withoutLogindOrAGraphicalSessionThereIsNoDisplay() throws {
        let dir = TemporaryDirectory("coffer-logind")
        // Only a tty session and a greeter.
        let ttyOnly = try Self.fakeLoginctl(dir, user: "Display=\nSessions=1 2\nRuntimePath=/run/user/1000\n", sessions: [
            "1": Self.sessionText("1", type: "tty", display: ""),
            "2": Self.sessionText("2", display: ":0", sessionClass: "greeter"),
        ])
        #expect(LoginSessions.promptDisplay(uid: Self.uid, loginctl: ttyOnly) == .failure(.noGraphicalSession(uid: Self.uid, sessions: ["1", "2"])))
        // A session that went away between show-user and show-session is skipped.
        let vanished = TemporaryDirectory("coffer-logind")
        let gone = try Self.fakeLoginctl(vanished, user: "Display=9\nSessions=9 10\nRuntimePath=/run/user/1000\n", sessions: [
            "10": Self.sessionText("10", display: ":10"),
        ])
        #expect(LoginSessions.promptDisplay(uid: Self.uid, loginctl: gone) == .success(PromptDisplay(x11: ":10", wayland: nil, origin: .loginSession("10"))))
        // logind does not know the user (loginctl fails), there is no loginctl, it hangs (killed at the bound).
        guard case .failure(.unreachable(let why)) = LoginSessions.promptDisplay(uid: 4242, loginctl: ttyOnly) else {
            Issue.record("an unknown user has a display"); return
        }
        #expect(why.contains("status 1") && why.contains("Failed to get user"), "\(why)")
        guard case .failure(.unreachable) = LoginSessions.promptDisplay(uid: Self.uid, loginctl: dir.file("missing")) else {
            Issue.record("no loginctl, yet a display"); return
        }
        let hangs = dir.file("loginctl-hangs")
        try "#!/bin/sh\necho Display=2\nexec sleep 3600\n".write(toFile: hangs + ".src", atomically: true, encoding: .utf8)
        try ScriptedPinentry.install(hangs + ".src", at: hangs)
        let started = Date()
        #expect(LoginSessions.promptDisplay(uid: Self.uid, loginctl: hangs, timeoutSeconds: 1) == .failure(.unreachable("\(hangs) gave no answer in time")))
        #expect(Date().timeIntervalSince(started) < 60, "bounded")
    }

    @Test func thePinentrysDisplayIsThePromptDisplayNeverTheAgentsOrTheManagers() throws {
        let session = PromptDisplay(x11: ":5", wayland: nil, origin: .loginSession("2"))
        let env = PinentryEnvironment.merge(own: ["LANG": "C", "HOME": "/home/u", "DISPLAY": ":66", "WAYLAND_DISPLAY": "wayland-66"],
                                            display: session,
                                            manager: ["DISPLAY": ":77", "WAYLAND_DISPLAY": "wayland-77", "LANG": "de_DE.UTF-8", "SECRET": "x",
                                                      "XAUTHORITY": "/run/user/1/xauth", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/tmp/evil"])
        #expect(env == ["DISPLAY=:5", "HOME=/home/u", "LANG=C", "XAUTHORITY=/run/user/1/xauth"], "\(env)")
        // The agent's own XAUTHORITY wins; a Wayland session sets the runtime directory its socket is in.
        let wayland = PromptDisplay(x11: nil, wayland: "wayland-0", runtimeDirectory: "/run/user/1000", origin: .loginSession("3"))
        #expect(PinentryEnvironment.merge(own: ["XAUTHORITY": "/home/u/.Xauthority", "XDG_RUNTIME_DIR": "/tmp/other"], display: wayland,
                                          manager: ["XAUTHORITY": "/x"])
                == ["WAYLAND_DISPLAY=wayland-0", "XAUTHORITY=/home/u/.Xauthority", "XDG_RUNTIME_DIR=/run/user/1000"])
        // An empty XAUTHORITY of the agent's is as good as none.
        #expect(PinentryEnvironment.merge(own: ["XAUTHORITY": ""], display: session, manager: ["XAUTHORITY": "/x"]) == ["DISPLAY=:5", "XAUTHORITY=/x"])
    }

    @Test func aUserManagerThatNamesAnotherDisplayChangesNothing() throws {
        let dir = TemporaryDirectory("coffer-prompt")
        let systemctl = try PinentryPrompterTests.script(dir, "systemctl", """
            echo ran >> '\(dir.file("ran"))'
            printf 'DISPLAY=:77\\nWAYLAND_DISPLAY=wayland-77\\nXAUTHORITY=/tmp/cookie\\n'
            """)
        let session = PromptDisplay(x11: ":5", wayland: nil, origin: .loginSession("2"))
        let env = PinentryEnvironment.current(on: session, systemctl: systemctl)
        #expect(env.contains("DISPLAY=:5") && !env.contains { $0.hasPrefix("WAYLAND_DISPLAY=") }, "\(env)")
        #expect(!env.contains { $0.contains(":77") || $0.contains("wayland-77") }, "\(env)")
    }
}
