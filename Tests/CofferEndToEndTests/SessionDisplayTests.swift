import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// Where the agent's own dialogs appear (issue #41, F1): on the person's login session as
/// systemd-logind reports it, never on a display a process of the user names. A real `ssh-add -c`
/// key's signature through the agent's ssh-agent socket, with a fake logind (python3-jeepney) on a
/// private D-Bus system bus reporting the session display `:N` of one Xvfb, the real `loginctl`
/// asking it, and a fake `systemctl` (the user manager's environment) naming an attacker's display
/// `:M`, a second Xvfb. The scripted pinentry notes its `DISPLAY` and the screen it reached there.
///
/// The agent runs in a private mount namespace (root): `loginctl` refuses to run unless
/// `/run/systemd/system` exists (sd_booted), which a test machine without systemd as init lacks,
/// and the fake `systemctl` is bind-mounted over `/usr/bin/systemctl`, the one the agent runs.
@Suite(.enabled(if: SessionDisplayRig.available,
                "needs root (a private mount namespace for the agent), unshare, loginctl, /run/systemd, Xvfb and xdpyinfo (apt: xvfb x11-utils), dbus-daemon, Debian's python3 with jeepney, and OpenSSH's ssh-add and ssh-keygen"))
struct SessionDisplayTests {
    /// What the agent finds of logind.
    enum Logind: Sendable, CaseIterable, CustomTestStringConvertible {
        /// The user's active, local X11 session on the session display.
        case graphicalSession
        /// No logind on the system bus the agent is given.
        case unreachable
        /// logind answers, but the user's sessions are a remote one, an inactive one and a tty (the
        /// active, local session on the session display is another user's).
        case noLocalGraphicalSession

        var testDescription: String { "\(self)" }
    }

    /// An agent in its own mount namespace whose pinentry is the scripted one (answering CONFIRM with
    /// OK), started with `agentDisplay` as its own `DISPLAY`, `logind` as described, a fake
    /// `systemctl` naming the attacker's display, and with `promptDisplay`, `prompt-display` set to
    /// the session display.
    final class Rig: @unchecked Sendable {
        let dir = PinentryHarness.ShortDirectory()
        let fake: PinentryHarness.FakePinentry
        let session: VirtualDisplay
        let attacker: VirtualDisplay
        let logind: FakeLogind?
        let f: SSHAgentTests.Fixture

        enum AgentDisplay: Sendable { case none, attackers }

        init(logind mode: Logind, promptDisplay: Bool = false, agentDisplay: AgentDisplay = .none) throws {
            fake = try PinentryHarness.FakePinentry(in: dir, confirm: "ok")
            session = try VirtualDisplay(width: 640, height: 480)
            attacker = try VirtualDisplay(width: 800, height: 600)
            let uid = getuid()
            switch mode {
            case .graphicalSession:
                logind = try FakeLogind(users: [.init(uid: uid, name: "root", display: "2", sessions: ["2"]),
                                                .init(uid: 4321, name: "other", display: "9", sessions: ["9"])],
                                        sessions: [.init(id: "2", uid: uid, type: "x11", display: session.name),
                                                   .init(id: "9", uid: 4321, type: "x11", display: attacker.name, active: false)])
            case .noLocalGraphicalSession:
                logind = try FakeLogind(users: [.init(uid: uid, name: "root", display: "3", sessions: ["3", "4", "5"]),
                                                .init(uid: 4321, name: "other", display: "9", sessions: ["9"])],
                                        sessions: [.init(id: "3", uid: uid, type: "x11", display: attacker.name, remote: true),
                                                   .init(id: "4", uid: uid, type: "x11", display: attacker.name, active: false),
                                                   .init(id: "5", uid: uid, type: "tty", display: ""),
                                                   .init(id: "9", uid: 4321, type: "x11", display: attacker.name)])
            case .unreachable:
                logind = nil
            }
            // The pinentry notes where it runs: its DISPLAY and the screen it reached there.
            let wrapper = dir.file("pinentry-on-display")
            try writeExecutable("""
                #!/bin/sh
                dims=$(/usr/bin/xdpyinfo 2>/dev/null | sed -n 's/^ *dimensions: *\\([0-9x]*\\) pixels.*/\\1/p')
                echo "${DISPLAY:-none} ${dims:-unreachable}" >> '\(dir.file("screens.log"))'
                exec '\(fake.path)' "$@"

                """, to: wrapper)
            // The user manager's environment, as `systemctl --user set-environment` by any process of the user leaves it.
            let systemctl = dir.file("systemctl")
            try writeExecutable("""
                #!/bin/sh
                echo "$*" >> '\(dir.file("systemctl.log"))'
                printf 'DISPLAY=\(attacker.name)\\nWAYLAND_DISPLAY=wayland-attacker\\nLANG=C\\n'

                """, to: systemctl)
            let config = dir.file("cofferd.conf")
            try (["authentication-timeout = 120", "pinentry = \(wrapper)"] + (promptDisplay ? ["prompt-display = \(session.name)"] : []))
                .joined(separator: "\n").appending("\n").write(toFile: config, atomically: true, encoding: .utf8)
            // No logind: a system bus address where nothing listens.
            let bus = logind?.address ?? "unix:path=" + dir.file("no-system-bus")
            let display = agentDisplay == .attackers ? "DISPLAY=\(attacker.name)" : ""
            let launcher = ["/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", """
                fake="$0"; bus="$1"; shift
                mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && mount --bind "$fake" /usr/bin/systemctl || exit 97
                exec env -u DISPLAY -u WAYLAND_DISPLAY -u XAUTHORITY \(display) DBUS_SYSTEM_BUS_ADDRESS="$bus" "$@"
                """, systemctl, bus]
            let agent = try AgentProcess(extraArguments: ["--config", config], launcher: launcher)
            f = SSHAgentTests.Fixture(agent: agent)
        }

        /// Each pinentry run's `DISPLAY` and the screen it reached (`none`, `unreachable`), in order.
        var screens: [String] {
            ((try? String(contentsOfFile: dir.file("screens.log"), encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }

        /// Adds a new key with `ssh-add -c` and removes its private file; returns its public key's path.
        func confirmKey() -> String {
            let key = f.generate("ed25519", name: "id_confirm")
            let added = f.run("ssh-add", ["-c", key])
            #expect(added.status == 0, "ssh-add -c: \(added)")
            try? FileManager.default.removeItem(atPath: key)
            return key + ".pub"
        }

        /// Signs a document with `publicKey`'s agent key (ssh-keygen -Y sign, verified).
        func sign(_ publicKey: String) -> (signed: CLIResult, verified: CLIResult?) {
            let document = f.dir.file("document")
            try? "signed only with consent\n".write(toFile: document, atomically: true, encoding: .utf8)
            return f.signAndVerify(publicKey: publicKey, file: document)
        }
    }

    @Test(arguments: [Rig.AgentDisplay.none, .attackers])
    func aConfirmationAppearsOnTheLoginSessionsDisplayNeverOnOneTheUserManagerNames(agentDisplay: Rig.AgentDisplay) throws {
        let rig = try Rig(logind: .graphicalSession, agentDisplay: agentDisplay)
        let key = rig.confirmKey()
        let (signed, verified) = rig.sign(key)
        #expect(signed.status == 0 && verified?.status == 0, "\(signed)\n\(rig.f.agent.log)")
        // The dialog was on the session's X server (640x480), not the attacker's (800x600).
        #expect(rig.screens == ["\(rig.session.name) 640x480"], "\(rig.screens)\n\(rig.f.agent.log)")
        #expect(rig.fake.takeQuestions().filter { $0.hasPrefix("CONFIRM") }.count == 1)
        // The real loginctl asked logind for the user and the session.
        let calls = rig.logind?.calls ?? []
        #expect(calls.contains { $0.contains("GetUser (\(getuid()),)") } && calls.contains { $0.contains("GetSession ('2',)") }, "\(calls)")
        #expect(SSHAgentPolicyTests.signatures(rig.f.agent).last?["reason"] as? String == "confirmed")
        // coffer status names the prompter, why, and where its dialogs appear (issue #43).
        let status = rig.f.agent.cli(["status"])
        let wrapper = rig.dir.file("pinentry-on-display")
        #expect(status.stdout.contains("prompter: \(wrapper) (pinentry = \(wrapper) in cofferd.conf)"), "\(status)")
        #expect(status.stdout.contains("dialogs: on the login session 2's display (\(rig.session.name))"), "\(status)")
    }

    @Test(arguments: [Logind.unreachable, .noLocalGraphicalSession])
    func withoutALocalGraphicalSessionTheSignatureIsRefusedAndNoPinentryRuns(logind: Logind) throws {
        let rig = try Rig(logind: logind)
        let key = rig.confirmKey()
        let (signed, _) = rig.sign(key)
        #expect(signed.status != 0, "signed without the person: \(signed)")
        #expect(rig.screens.isEmpty && rig.fake.displays().isEmpty, "a pinentry ran: \(rig.screens)")
        #expect(SSHAgentPolicyTests.signatures(rig.f.agent).last?["reason"] as? String == "nobody-to-ask",
                "\(SSHAgentPolicyTests.signatures(rig.f.agent))")
        // One clear line says why.
        let lines = rig.f.agent.log.split(separator: "\n").filter { $0.contains("no dialog shown") }
        #expect(lines.count == 1 && lines.allSatisfy { $0.contains("systemd-logind") && $0.contains("prompt-display") }, "\(rig.f.agent.log)")
        if logind == .noLocalGraphicalSession {
            #expect(rig.logind?.calls.contains { $0.contains("GetSession ('3',)") } == true, "logind was not asked: \(rig.logind?.calls ?? [])")
        }
        // coffer status says that dialogs can appear nowhere, and why (issue #43).
        let status = rig.f.agent.cli(["status"])
        let dialogs = status.stdout.split(separator: "\n").first { $0.hasPrefix("dialogs: ") } ?? ""
        #expect(dialogs.hasPrefix("dialogs: nowhere: ") && dialogs.contains("prompt-display"), "\(status)")
    }

    @Test func aConfiguredPromptDisplayServesAMachineWithoutLogind() throws {
        let rig = try Rig(logind: .unreachable, promptDisplay: true, agentDisplay: .attackers)
        let key = rig.confirmKey()
        let (signed, verified) = rig.sign(key)
        #expect(signed.status == 0 && verified?.status == 0, "\(signed)\n\(rig.f.agent.log)")
        #expect(rig.screens == ["\(rig.session.name) 640x480"], "\(rig.screens)\n\(rig.f.agent.log)")
    }
}

enum SessionDisplayRig {
    /// What ``SessionDisplayTests`` need.
    static var available: Bool {
        getuid() == 0 && SSHTools.available && FileManager.default.fileExists(atPath: "/run/systemd")
            && ["/usr/bin/unshare", "/usr/bin/loginctl", "/usr/bin/systemctl", "/usr/bin/Xvfb", "/usr/bin/xdpyinfo", "/usr/bin/dbus-daemon",
                PrivateSessionBus.python].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
            && FileManager.default.fileExists(atPath: "/usr/lib/python3/dist-packages/jeepney")
    }
}

/// An Xvfb X server on a display number it picks itself (`-displayfd`), with a screen of the given
/// size (how a test tells two displays apart), stopped with the test.
final class VirtualDisplay: @unchecked Sendable {
    let dir = TemporaryDirectory("coffer-xvfb")
    private let process: Process
    /// `:N`.
    let name: String

    init(width: Int, height: Int) throws {
        let numberFile = dir.file("display")
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/sh")
        p.arguments = ["-c", "exec /usr/bin/Xvfb -displayfd 3 -nolisten tcp -screen 0 \(width)x\(height)x24 3>\"$0\"", numberFile]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        p.standardInput = FileHandle.nullDevice
        try p.run()
        process = p
        // Xvfb writes its display number once it accepts connections.
        var number: String? = nil
        _ = PrivateSessionBus.wait(30) {
            let text = (try? String(contentsOfFile: numberFile, encoding: .utf8)) ?? ""
            if text.hasSuffix("\n"), let n = Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) { number = ":\(n)" }
            return number != nil || !p.isRunning
        }
        guard let number else {
            if p.isRunning { kill(p.processIdentifier, SIGKILL) }
            throw SignedApps.Failure("Xvfb did not start")
        }
        name = number
    }

    deinit {
        // SIGKILL (the test runner's blocked SIGTERM is inherited), then what Xvfb leaves behind.
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        let n = name.dropFirst()
        unlink("/tmp/.X11-unix/X\(n)")
        unlink("/tmp/.X\(n)-lock")
    }
}

/// A fake systemd-logind on a private D-Bus system bus: `org.freedesktop.login1` with what the real
/// `loginctl show-user`, `show-session` and `list-sessions` call (Manager.GetUser, GetSession,
/// ListSessions; Properties.Get and GetAll on the user and session objects), answering from the
/// users and sessions given. Each call is logged (``calls``).
final class FakeLogind: @unchecked Sendable {
    struct User: Encodable {
        let uid: UInt32
        let name: String
        /// logind's display session of the user.
        let display: String
        let sessions: [String]
    }

    struct Session: Encodable {
        let id: String
        let uid: UInt32
        let type: String
        let display: String
        var active = true
        var remote = false
        var sessionClass = "user"
    }

    private struct Configuration: Encodable {
        let users: [User]
        let sessions: [Session]
    }

    let dir = TemporaryDirectory("coffer-logind")
    private var processes: [Process] = []
    var address: String { "unix:path=" + dir.file("system_bus_socket") }

    init(users: [User], sessions: [Session]) throws {
        try JSONEncoder().encode(Configuration(users: users, sessions: sessions)).write(to: URL(fileURLWithPath: dir.file("logind.json")))
        let config = dir.file("bus.conf")
        try """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>system</type>
              <listen>unix:path=\(dir.file("system_bus_socket"))</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow user="*"/>
                <allow own="*"/>
                <allow send_type="method_call"/>
                <allow send_type="signal"/>
                <allow send_type="method_return"/>
                <allow send_type="error"/>
                <allow receive_type="method_call"/>
                <allow receive_type="signal"/>
                <allow receive_type="method_return"/>
                <allow receive_type="error"/>
              </policy>
            </busconfig>

            """.write(toFile: config, atomically: true, encoding: .utf8)
        try spawn("/usr/bin/dbus-daemon", ["--config-file=" + config, "--nofork", "--nopidfile"], log: "dbus-daemon.log")
        guard PrivateSessionBus.wait(30, until: { self.accepts() }) else { throw SignedApps.Failure("the system bus did not start:\n" + read("dbus-daemon.log")) }
        let script = dir.file("logind.py")
        try Self.service.write(toFile: script, atomically: true, encoding: .utf8)
        let service = try spawn(PrivateSessionBus.python, [script, address, dir.file("logind.json"), dir.file("calls.log"), dir.file("ready")],
                                log: "logind.log")
        guard PrivateSessionBus.wait(30, until: { FileManager.default.fileExists(atPath: self.dir.file("ready")) || !service.isRunning }),
              service.isRunning else {
            throw SignedApps.Failure("the fake logind did not start:\n" + read("logind.log"))
        }
    }

    /// The calls so far, one line each: `PATH INTERFACE MEMBER (ARGUMENTS)`.
    var calls: [String] { read("calls.log").split(separator: "\n").map(String.init) }

    func read(_ name: String) -> String { (try? String(contentsOfFile: dir.file(name), encoding: .utf8)) ?? "" }

    private func accepts() -> Bool {
        guard let fd = try? UnixSocket.connect(path: dir.file("system_bus_socket")) else { return false }
        close(fd)
        return true
    }

    @discardableResult
    private func spawn(_ executable: String, _ arguments: [String], log: String) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments
        let path = dir.file(log)
        _ = FileManager.default.createFile(atPath: path, contents: nil)
        let handle = FileHandle(forWritingAtPath: path)
        p.standardOutput = handle
        p.standardError = handle
        p.standardInput = FileHandle.nullDevice
        try p.run()
        processes.append(p)
        return p
    }

    deinit {
        // The service first, the bus last; SIGKILL: the test runner's blocked SIGTERM is inherited.
        for p in processes.reversed() where p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
    }

    /// The service (python3-jeepney, blocking): argv = bus address, users and sessions (JSON), call
    /// log, a file made once it owns its name.
    static let service = """
        json = __import__('json')
        sys = __import__('sys')
        from jeepney import new_method_return, new_error, MessageType, HeaderFields
        from jeepney.bus_messages import message_bus
        from jeepney.io.blocking import open_dbus_connection

        address, config_file, log_file, ready_file = sys.argv[1:5]
        config = json.load(open(config_file))
        conn = open_dbus_connection(bus=address)
        reply = conn.send_and_get_reply(message_bus.RequestName('org.freedesktop.login1', 4))
        assert reply.body[0] == 1, reply.body
        log = open(log_file, 'a', buffering=1)
        open(ready_file, 'w').close()
        MANAGER = '/org/freedesktop/login1'

        def escaped(s):
            # sd-bus's object path escaping, as logind names session objects.
            return ''.join(c if c.isalnum() and c.isascii() and not (i == 0 and c.isdigit()) else '_%02x' % ord(c) for i, c in enumerate(s))

        def user_path(uid): return '/org/freedesktop/login1/user/_%d' % uid
        def session_path(sid): return '/org/freedesktop/login1/session/' + escaped(sid)

        users = {u['uid']: u for u in config['users']}
        sessions = {s['id']: s for s in config['sessions']}

        def user_properties(u):
            shown = u['display']
            return {
                'UID': ('u', u['uid']), 'GID': ('u', u['uid']), 'Name': ('s', u['name']),
                'RuntimePath': ('s', '/run/user/%d' % u['uid']), 'State': ('s', 'active'), 'Linger': ('b', False),
                'Display': ('(so)', (shown, session_path(shown) if shown else '/')),
                'Sessions': ('a(so)', [(sid, session_path(sid)) for sid in u['sessions']]),
                'IdleHint': ('b', False),
            }

        def session_properties(s):
            return {
                'Id': ('s', s['id']), 'User': ('(uo)', (s['uid'], user_path(s['uid']))),
                'Name': ('s', users.get(s['uid'], {}).get('name', 'user')), 'Display': ('s', s['display']),
                'Remote': ('b', s['remote']), 'RemoteHost': ('s', 'elsewhere' if s['remote'] else ''), 'Type': ('s', s['type']),
                'Class': ('s', s['sessionClass']), 'Active': ('b', s['active']), 'State': ('s', 'active' if s['active'] else 'online'),
                'Seat': ('(so)', ('seat0', '/org/freedesktop/login1/seat/seat0')), 'TTY': ('s', ''), 'Service': ('s', 'lightdm'),
            }

        def properties_of(path):
            for u in users.values():
                if path == user_path(u['uid']):
                    return user_properties(u)
            for s in sessions.values():
                if path == session_path(s['id']):
                    return session_properties(s)
            return None

        def error(msg, name, text):
            conn.send(new_error(msg, name, 's', (text,)))

        while True:
            msg = conn.receive()
            if msg.header.message_type != MessageType.method_call:
                continue
            fields = msg.header.fields
            path, interface, member = fields.get(HeaderFields.path), fields.get(HeaderFields.interface), fields.get(HeaderFields.member)
            log.write('%s %s %s %r\\n' % (path, interface, member, msg.body))
            if path == MANAGER and member == 'GetUser':
                if msg.body[0] not in users:
                    error(msg, 'org.freedesktop.login1.NoSuchUser', 'User ID %d is not logged in or lingering' % msg.body[0])
                else:
                    conn.send(new_method_return(msg, 'o', (user_path(msg.body[0]),)))
            elif path == MANAGER and member == 'GetSession':
                if msg.body[0] not in sessions:
                    error(msg, 'org.freedesktop.login1.NoSuchSession', "No session '%s' known" % msg.body[0])
                else:
                    conn.send(new_method_return(msg, 'o', (session_path(msg.body[0]),)))
            elif path == MANAGER and member == 'ListSessions':
                listed = [(s['id'], s['uid'], users.get(s['uid'], {}).get('name', 'user'), 'seat0', session_path(s['id'])) for s in sessions.values()]
                conn.send(new_method_return(msg, 'a(susso)', (listed,)))
            elif interface == 'org.freedesktop.DBus.Properties' and member in ('Get', 'GetAll'):
                found = properties_of(path)
                if found is None:
                    error(msg, 'org.freedesktop.DBus.Error.UnknownObject', 'no object ' + path)
                elif member == 'GetAll':
                    conn.send(new_method_return(msg, 'a{sv}', (found,)))
                elif msg.body[1] not in found:
                    error(msg, 'org.freedesktop.DBus.Error.UnknownProperty', msg.body[1])
                else:
                    conn.send(new_method_return(msg, 'v', (found[msg.body[1]],)))
            else:
                error(msg, 'org.freedesktop.DBus.Error.UnknownMethod', '%s.%s' % (interface, member))

        """
}
