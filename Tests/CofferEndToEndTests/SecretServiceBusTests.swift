import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// A private session bus for the Secret Service front end: `dbus-daemon --session`-style with a
/// config in a temporary directory (listening on a socket there), started as FprintdBus starts its
/// daemon (output to a log file, never a pipe), and the front ends started on it.
final class PrivateSessionBus: @unchecked Sendable {
    let dir = TemporaryDirectory("coffer-ssbus")
    var address: String { "unix:path=" + dir.file("bus") }
    private var processes: [Process] = []
    /// What must live as long as the bus (the agent its front end serves).
    var keepAlive: [AnyObject] = []

    static let python = "/usr/bin/python3"
    /// dbus-daemon, gdbus and Debian's python3 with secretstorage (and the jeepney it is built on).
    static var available: Bool {
        ["/usr/bin/dbus-daemon", "/usr/bin/gdbus", python, "/usr/lib/python3/dist-packages/secretstorage",
         "/usr/lib/python3/dist-packages/jeepney"].allSatisfy { FileManager.default.fileExists(atPath: $0) }
    }

    /// `XDG_CONFIG_HOME` of every process started on this bus (its own, empty unless a test writes
    /// there): a front end's default configuration file is ``frontEndConfig``, never the user's.
    var configHome: String { dir.file("config") }
    /// The front end's default configuration file (`$XDG_CONFIG_HOME/coffer/secret-service.conf`).
    var frontEndConfig: String { configHome + "/coffer/secret-service.conf" }

    /// With `serviceDirectory`, the bus activates the services whose files are there. With
    /// `plainSessions`, the front end's configuration allows `plain` sessions (`plain-sessions =
    /// allow`, which the tests' own clients open for brevity); without, it has no configuration file
    /// and refuses them, as an installed one does by default.
    init(serviceDirectory: String? = nil, plainSessions: Bool = true) throws {
        try FileManager.default.createDirectory(atPath: configHome + "/coffer", withIntermediateDirectories: true)
        if plainSessions { try "plain-sessions = allow\n".write(toFile: frontEndConfig, atomically: true, encoding: .utf8) }
        let config = dir.file("bus.conf")
        let services = serviceDirectory.map { "<servicedir>\($0)</servicedir>" } ?? ""
        try """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>session</type>
              <listen>unix:path=\(dir.file("bus"))</listen>
              <auth>EXTERNAL</auth>
              \(services)
              <policy context="default">
                <allow send_destination="*" eavesdrop="true"/>
                <allow eavesdrop="true"/>
                <allow own="*"/>
              </policy>
            </busconfig>

            """.write(toFile: config, atomically: true, encoding: .utf8)
        _ = try spawn("/usr/bin/dbus-daemon", ["--config-file=" + config, "--nofork", "--nopidfile"], log: "dbus-daemon.log")
        // Until the socket accepts, not until its file exists: dbus-daemon binds before it listens, and a client
        // in between is refused ("Connection refused", seen under load).
        guard Self.wait(until: { self.accepts() }) else {
            throw SignedApps.Failure("dbus-daemon did not start:\n" + read("dbus-daemon.log"))
        }
    }

    /// True if the bus's socket takes a connection now.
    func accepts() -> Bool {
        guard let fd = try? UnixSocket.connect(path: dir.file("bus")) else { return false }
        close(fd)
        return true
    }

    /// Starts `coffer-secret-service` (the signed path `executable`) for `agent`; with `waitForName`,
    /// waits until it owns org.freedesktop.secrets.
    func startFrontEnd(_ executable: String, agent: AgentProcess, arguments: [String] = [], log: String = "front-end.log",
                       waitForName: Bool = true) throws -> Process {
        let p = try spawn(executable, arguments, log: log, environment: ["COFFER_SOCKET": agent.socketPath])
        if waitForName {
            guard Self.wait(until: { self.nameOwner() != nil || !p.isRunning }), p.isRunning else {
                throw SignedApps.Failure("coffer-secret-service did not own the name:\n" + read(log))
            }
        }
        return p
    }

    /// The unique name owning org.freedesktop.secrets, if any.
    func nameOwner() -> String? {
        let r = run("/usr/bin/gdbus", ["call", "--session", "-d", "org.freedesktop.DBus", "-o", "/org/freedesktop/DBus",
                                       "-m", "org.freedesktop.DBus.GetNameOwner", "org.freedesktop.secrets"])
        return r.status == 0 ? r.stdout : nil
    }

    /// Runs a program on this bus. It has the display `display` (`DISPLAY`, never opened: the front end
    /// prompts only a client that has one, and the agent's scripted pinentry needs none), or with
    /// `display: nil` none, as a script from cron or an ssh session.
    func run(_ executable: String, _ args: [String], stdin: String? = nil, display: String? = ":0") -> CLIResult {
        runProcess(executable, args, stdin: stdin, environment: ["DBUS_SESSION_BUS_ADDRESS": address].merging(display.map { ["DISPLAY": $0] } ?? [:]) { $1 },
                   unset: ["DISPLAY", "WAYLAND_DISPLAY"], timeout: 60)
    }

    /// Runs a Python script (python3-secretstorage and jeepney) on this bus.
    func python(_ script: String, display: String? = ":0") throws -> CLIResult {
        let path = dir.file("script-\(UUID().uuidString).py")
        try script.write(toFile: path, atomically: true, encoding: .utf8)
        return run(Self.python, [path], display: display)
    }

    func read(_ log: String) -> String { (try? String(contentsOfFile: dir.file(log), encoding: .utf8)) ?? "" }

    func spawn(_ executable: String, _ arguments: [String], log: String, environment: [String: String] = [:]) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = arguments
        var env = ProcessInfo.processInfo.environment
        env.removeValue(forKey: "COFFER_SOCKET")
        p.environment = env.merging(environment.merging(["DBUS_SESSION_BUS_ADDRESS": address, "XDG_CONFIG_HOME": configHome]) { $1 }) { $1 }
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

    /// Runs `script` (``python(_:)``) on another thread; the returned function waits for its end and
    /// gives its result (nil if it could not be run).
    func pythonInBackground(_ script: String) -> () -> CLIResult? {
        let result = Protected<CLIResult?>(nil)
        let finished = DispatchSemaphore(value: 0)
        DispatchQueue.global().async {
            let r = try? self.python(script)
            result.withLock { $0 = r }
            finished.signal()
        }
        return {
            finished.wait()
            return result.withLock { $0 }
        }
    }

    /// Polls `condition` for up to `seconds` (FprintdBus's poll).
    static func wait(_ seconds: Double = 10, until condition: () -> Bool) -> Bool { FprintdBus.wait(seconds, until: condition) }

    deinit {
        // Front ends first, the bus last; SIGKILL: the test runner's blocked SIGTERM is inherited by its children.
        for p in processes.reversed() where p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
    }
}

/// The Secret Service front end `coffer-secret-service` (issue #26, its bus plumbing) on a private
/// session bus with the real agent, driven by python3-secretstorage (and the jeepney it is built on)
/// and gdbus: OpenSession with both algorithms, Session.Close, sessions owned by their sender and
/// removed when it leaves the bus, the per-sender limit, the bus name never taken from another
/// owner, and each sender's agent connection delegated to the sender's own process.
@Suite(.enabled(if: PrivateSessionBus.available, "needs dbus-daemon, gdbus and Debian's python3 with python3-secretstorage (contrib/deps.sh)"))
struct SecretServiceBusTests {
    static let frontEndApp = "org.example.secret-service"

    /// contrib/dbus's activation file, Exec= pointed at the built front end (and the test agent's
    /// socket): a client's first call starts the front end, and it serves that call.
    @Test func theActivationFileStartsTheFrontEnd() throws {
        let apps = try SignedApps()
        let executable = String(decoding: try StableFile.canonicalPath(Binaries.directory + "/coffer-secret-service"), as: UTF8.self)
        try apps.sign("secret-service", appID: Self.frontEndApp, groups: ["secret-service"], path: executable, entitlements: ["delegate-identity"])
        let agent = try apps.startAgent()
        let (bus, services) = try PrivateSessionBus.activating(executable, agent: agent)
        defer { withExtendedLifetime(services) {} }
        #expect(bus.nameOwner() == nil, "nothing owns the name before a client asks")
        let r = try bus.python(Self.prelude + "assert open_plain(a)[0] == 'ok', open_plain(a)\nprint('done')\n")
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("dbus-daemon.log"))")
        #expect(bus.nameOwner() != nil)
    }

    /// A private bus, an agent trusting the built front end signed (with `delegate-identity` when
    /// `entitled`), and the front end serving; `prepare` installs and signs other apps before the agent starts.
    static func setUp(entitled: Bool = true, arguments: [String] = [], agentConfig: [String] = [],
                      prepare: (SignedApps) throws -> Void = { _ in })
        throws -> (SignedApps, AgentProcess, PrivateSessionBus, Process, executable: String) {
        let apps = try SignedApps()
        let executable = String(decoding: try StableFile.canonicalPath(Binaries.directory + "/coffer-secret-service"), as: UTF8.self)
        try apps.sign("secret-service", appID: frontEndApp, groups: ["secret-service"], path: executable,
                      entitlements: entitled ? ["delegate-identity"] : [])
        try prepare(apps)
        let agent = try apps.startAgent(agentConfig)
        let bus = try PrivateSessionBus()
        let frontEnd = try bus.startFrontEnd(executable, agent: agent, arguments: arguments)
        return (apps, agent, bus, frontEnd, executable)
    }

    /// What every script starts with: two connections of their own (two bus senders) and helpers
    /// that answer ('ok', body) or ('error', D-Bus error name).
    static let prelude = #"""
        os, subprocess, sys, time, secretstorage = (__import__(m) for m in ('os', 'subprocess', 'sys', 'time', 'secretstorage'))
        from secretstorage.util import open_session
        from secretstorage.dhcrypto import DH_PRIME_1024
        from jeepney import DBusAddress, MessageType, new_method_call
        from jeepney.low_level import HeaderFields

        SERVICE, PATH = 'org.freedesktop.secrets', '/org/freedesktop/secrets'
        def call(conn, path, iface, method, sig='', *body):
            reply = conn.send_and_get_reply(new_method_call(DBusAddress(path, bus_name=SERVICE, interface=iface), method, sig, body))
            if reply.header.message_type == MessageType.error:
                return ('error', reply.header.fields[HeaderFields.error_name])
            return ('ok', reply.body)
        def open_plain(conn):
            return call(conn, PATH, 'org.freedesktop.Secret.Service', 'OpenSession', 'sv', 'plain', ('s', ''))
        def close(conn, path):
            return call(conn, path, 'org.freedesktop.Secret.Session', 'Close')
        def introspect(path):
            r = subprocess.run(['gdbus', 'introspect', '--session', '-d', SERVICE, '-o', path], capture_output=True, text=True)
            return r.stdout + r.stderr
        a = secretstorage.dbus_init()
        b = secretstorage.dbus_init()
        print('exe=' + os.path.realpath(sys.executable))

        """#

    @Test func sessionsOpenForEachSenderUnderItsOwnDelegatedIdentity() throws {
        let (_, agent, bus, frontEnd, _) = try Self.setUp()
        let descriptors = { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(frontEnd.processIdentifier)/fd").count) ?? -1 }
        let before = descriptors()
        let r = try bus.python(Self.prelude + #"""
            # Introspection shows the Service interface with its methods and the Collections property.
            service = introspect(PATH)
            assert 'interface org.freedesktop.Secret.Service' in service and 'OpenSession(' in service, service
            assert 'SearchItems(' in service and 'Collections' in service and 'CollectionCreated(' in service, service

            # secretstorage's own DH session: the server key is one of the group's prime-order subgroup,
            # and secretstorage derives its AES key from it.
            s = open_session(a)
            assert s.encrypted and s.aes_key is not None and len(s.aes_key) == 16, 'not a DH session'
            p, q = DH_PRIME_1024, (DH_PRIME_1024 - 1) // 2
            reply = call(a, PATH, 'org.freedesktop.Secret.Service', 'OpenSession', 'sv', 'dh-ietf1024-sha256-aes128-cbc-pkcs7',
                         ('ay', s.my_public_key.to_bytes(128, 'big')))
            assert reply[0] == 'ok' and reply[1][0][0] == 'ay' and len(reply[1][0][1]) == 128, reply
            y = int.from_bytes(reply[1][0][1], 'big')
            assert 1 < y < p - 1 and pow(y, q, p) == 1, 'server key outside the group'
            print('dh ok', s.object_path)

            # A plain session: output the empty string.
            plain = open_plain(a)
            assert plain[0] == 'ok' and plain[1][0] == ('s', ''), plain
            session = introspect(plain[1][1])
            assert 'interface org.freedesktop.Secret.Session' in session and 'Close()' in session, session

            # An unsupported algorithm; a DH input that is not a byte array; a key outside the group.
            assert call(a, PATH, 'org.freedesktop.Secret.Service', 'OpenSession', 'sv', 'rot13', ('s', '')) \
                == ('error', 'org.freedesktop.DBus.Error.NotSupported')
            assert call(a, PATH, 'org.freedesktop.Secret.Service', 'OpenSession', 'sv', 'dh-ietf1024-sha256-aes128-cbc-pkcs7', ('s', '')) \
                == ('error', 'org.freedesktop.DBus.Error.InvalidArgs')
            assert call(a, PATH, 'org.freedesktop.Secret.Service', 'OpenSession', 'sv', 'dh-ietf1024-sha256-aes128-cbc-pkcs7', ('ay', b'\x01')) \
                == ('error', 'org.freedesktop.DBus.Error.InvalidArgs')

            # A session is its sender's: another sender cannot close it; its owner can, and it is gone.
            assert close(b, plain[1][1]) == ('error', 'org.freedesktop.Secret.Error.NoSuchObject')
            assert close(a, plain[1][1]) == ('ok', ())
            assert 'org.freedesktop.Secret.Session' not in introspect(plain[1][1])
            assert close(a, plain[1][1])[0] == 'error'

            # At most 16 sessions per sender (the DH one above counts): the 17th is refused, other senders are served.
            paths = [s.object_path] + [open_plain(a)[1][1] for _ in range(15)]
            assert open_plain(a) == ('error', 'org.freedesktop.DBus.Error.LimitsExceeded')
            other = open_plain(b)
            assert other[0] == 'ok', other
            print('limit ok')

            # The sender leaves the bus: its sessions go (objects removed, nobody can close them).
            a.close()
            deadline = time.time() + 10
            while time.time() < deadline and any('org.freedesktop.Secret.Session' in introspect(x) for x in (paths[0], paths[-1])):
                time.sleep(0.05)
            assert all('org.freedesktop.Secret.Session' not in introspect(x) for x in (paths[0], paths[-1])), 'sessions left behind'
            assert close(b, paths[0])[0] == 'error'
            assert 'org.freedesktop.Secret.Session' in introspect(other[1][1]), 'the other sender lost its session'
            assert close(b, other[1][1]) == ('ok', ())
            print('done')
            """#)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))")
        #expect(frontEnd.isRunning, "\(bus.read("front-end.log"))")
        // Both senders have left the bus (the script has ended): their agent connections are closed.
        #expect(PrivateSessionBus.wait(until: { descriptors() == before }), "\(descriptors()) descriptors open, \(before) before the clients came")

        // Each sender's agent connection was delegated to the sender's process (the Python
        // interpreter, unsigned; gdbus introspect reads the Collections property, so it is a sender
        // too), by the front end (the caller of DELEGATE).
        let exe = r.stdout.split(separator: "\n").first { $0.hasPrefix("exe=") }.map { String($0.dropFirst(4)) } ?? "?"
        let delegations = auditRecords(agent).filter { ($0["operation"] as? String) == "delegate" }
        #expect(delegations.filter { ($0["reason"] as? String ?? "").contains("unsigned \(exe)") }.count == 2 && delegations.allSatisfy { d in
            (d["result"] as? Int) == 0 && (d["app"] as? String) == Self.frontEndApp
                && [exe, "/usr/bin/gdbus"].contains { (d["reason"] as? String ?? "").contains("unsigned \($0)") }
        }, "\(delegations)")
    }

    @Test func aSecondFrontEndIsRefusedTheNameAndTheFirstServesOn() throws {
        let (_, agent, bus, first, executable) = try Self.setUp()
        let owner = bus.nameOwner()
        let second = try bus.startFrontEnd(executable, agent: agent, log: "second.log", waitForName: false)
        second.waitUntilExit()
        #expect(second.terminationStatus == 69, "\(second.terminationStatus)")
        #expect(bus.read("second.log").contains("org.freedesktop.secrets is already owned"), "\(bus.read("second.log"))")
        #expect(first.isRunning && bus.nameOwner() == owner)
        let r = try bus.python(Self.prelude + "assert open_plain(a)[0] == 'ok'\nprint('done')\n")
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)")
    }

    @Test func withoutTheDelegationEntitlementEverySenderIsDenied() throws {
        let (_, agent, bus, frontEnd, _) = try Self.setUp(entitled: false)
        let r = try bus.python(Self.prelude + """
            assert open_plain(a) == ('error', 'org.freedesktop.DBus.Error.AccessDenied'), open_plain(a)
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))")
        #expect(frontEnd.isRunning)
        #expect(auditRecords(agent).contains { ($0["operation"] as? String) == "delegate" && ($0["result"] as? Int) != 0 })
    }

    /// The agent restarts under a running front end: a sender's next call gets a new delegated
    /// connection (not the dead one), and its sessions are kept. The script waits (a file in the
    /// bus's directory) while the test restarts the agent.
    @Test func aSendersNextCallAfterTheAgentRestartsGetsANewDelegatedConnection() throws {
        let (apps, agent, bus, frontEnd, _) = try Self.setUp()
        defer { withExtendedLifetime(apps) {} }
        let ready = bus.dir.file("ready"), go = bus.dir.file("go")
        let script = Self.prelude + """
            search = lambda: call(a, PATH, 'org.freedesktop.Secret.Service', 'SearchItems', 'a{ss}', {})
            session = open_plain(a)[1][1]
            assert search()[0] == 'ok', search()
            open('\(ready)', 'w').close()
            deadline = time.time() + 60
            while not os.path.exists('\(go)') and time.time() < deadline:
                time.sleep(0.05)
            assert os.path.exists('\(go)'), 'the agent was not restarted'
            r = search()
            assert r[0] == 'ok', r
            assert close(a, session) == ('ok', ()), 'the session was lost'
            assert search()[0] == 'ok'
            print('done')

            """
        let finished = bus.pythonInBackground(script)
        let started = PrivateSessionBus.wait(60) { FileManager.default.fileExists(atPath: ready) }
        if started { try agent.restart() }
        _ = FileManager.default.createFile(atPath: go, contents: nil)
        let r = finished()
        #expect(started && r?.status == 0 && r?.stdout.contains("done") == true, "\(String(describing: r))\n\(bus.read("front-end.log"))")
        #expect(frontEnd.isRunning)
        // Two delegations for the script's sender: one before the restart (in the old agent's audit
        // log, which the new agent keeps appending to) and one after.
        #expect(auditRecords(agent).filter { ($0["operation"] as? String) == "delegate" && ($0["result"] as? Int) == 0 }.count >= 2)
    }

    /// At most `--max-senders` distinct senders at once: one more is refused LimitsExceeded while the
    /// others are served, and is served once a sender has left the bus.
    @Test func aSenderBeyondTheCapIsRefusedAndTheOthersServed() throws {
        let (apps, agent, bus, frontEnd, _) = try Self.setUp(arguments: ["--max-senders", "2"])
        defer { withExtendedLifetime((apps, agent)) {} }
        let r = try bus.python(Self.prelude + #"""
            first = (open_plain(a), open_plain(b))
            assert first[0][0] == 'ok' and first[1][0] == 'ok', first
            c = secretstorage.dbus_init()
            assert open_plain(c) == ('error', 'org.freedesktop.DBus.Error.LimitsExceeded'), open_plain(c)
            assert open_plain(a)[0] == 'ok' and open_plain(b)[0] == 'ok', 'the senders already held are not served'
            a.close()
            deadline = time.time() + 10
            while time.time() < deadline and open_plain(c)[0] != 'ok':
                time.sleep(0.05)
            assert open_plain(c)[0] == 'ok', 'a place freed by a sender that left is not given'
            print('done')
            """#)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))")
        #expect(frontEnd.isRunning)
    }
}
