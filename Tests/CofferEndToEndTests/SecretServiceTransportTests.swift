import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Issue #41 L2: no secret crosses the session bus unencrypted by default. The front end refuses the
/// `plain` session algorithm (org.freedesktop.DBus.Error.NotSupported, naming the setting that allows
/// it) unless its configuration says `plain-sessions = allow`; libsecret's `secret-tool` and
/// python3-secretstorage negotiate `dh-ietf1024-sha256-aes128-cbc-pkcs7` and keep working. The
/// eavesdropper is real: `dbus-monitor` on the same private bus, as any unconfined client of a
/// session bus can be.
@Suite(.enabled(if: PrivateSessionBus.available && FileManager.default.isExecutableFile(atPath: "/usr/bin/secret-tool")
                && FileManager.default.isExecutableFile(atPath: "/usr/bin/dbus-monitor"),
                "needs dbus-daemon, dbus-monitor, gdbus, libsecret-tools and Debian's python3 with python3-secretstorage (contrib/deps.sh)"))
struct SecretServiceTransportTests {
    /// An agent, a private bus whose front end has the default configuration (no file) unless
    /// `plainSessions`, and the front end serving. The agent lives as long as the bus (`keepAlive`).
    static func setUp(plainSessions: Bool = false, arguments: [String] = []) throws -> PrivateSessionBus {
        let apps = try SignedApps()
        let executable = String(decoding: try StableFile.canonicalPath(Binaries.directory + "/coffer-secret-service"), as: UTF8.self)
        try apps.sign("secret-service", appID: SecretServiceBusTests.frontEndApp, groups: ["secret-service"], path: executable,
                      entitlements: ["delegate-identity"])
        let agent = try apps.startAgent()
        let bus = try PrivateSessionBus(plainSessions: plainSessions)
        _ = try bus.startFrontEnd(executable, agent: agent, arguments: arguments)
        bus.keepAlive = [agent, apps]
        return bus
    }

    /// A script's start: a connection, and `call` answering ('ok', body) or ('error', name, message).
    static let prelude = #"""
        secretstorage = __import__('secretstorage')
        from secretstorage.util import open_session
        from jeepney import DBusAddress, MessageType, new_method_call
        from jeepney.low_level import HeaderFields

        SERVICE, PATH = 'org.freedesktop.secrets', '/org/freedesktop/secrets'
        conn = secretstorage.dbus_init()
        def call(path, iface, method, sig='', *body):
            reply = conn.send_and_get_reply(new_method_call(DBusAddress(path, bus_name=SERVICE, interface=iface), method, sig, body))
            if reply.header.message_type == MessageType.error:
                return ('error', reply.header.fields[HeaderFields.error_name], reply.body[0] if reply.body else '')
            return ('ok', reply.body)
        def open_plain():
            return call(PATH, 'org.freedesktop.Secret.Service', 'OpenSession', 'sv', 'plain', ('s', ''))

        """#

    /// OpenSession('plain') with the default configuration: NotSupported, the message naming the
    /// setting and the file it goes in, no session made; the DH session opens on the same connection.
    @Test func plainIsRefusedByDefaultWithAnErrorNamingTheSetting() throws {
        let bus = try Self.setUp()
        let r = try bus.python(Self.prelude + """
            refused = open_plain()
            print(repr(refused))
            assert refused[0] == 'error' and refused[1] == 'org.freedesktop.DBus.Error.NotSupported', refused
            assert 'plain-sessions = allow' in refused[2] and '\(bus.frontEndConfig)' in refused[2], refused
            assert 'dh-ietf1024-sha256-aes128-cbc-pkcs7' in refused[2], refused
            session = open_session(conn)
            assert session.object_path.startswith(PATH + '/session/'), session.object_path
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))")
    }

    /// `plain-sessions = allow` (in the default file, as the other suites' bus writes it, or in the
    /// file `--config` names) serves plain sessions; `deny`, or a configuration file that cannot be
    /// used, does not: the front end refuses to start with status 64 rather than guess.
    @Test func plainIsServedOnlyWhereTheConfigurationAllowsIt() throws {
        let opens = Self.prelude + "r = open_plain()\nprint(repr(r))\nassert r[0] == 'ok', r\nprint('done')\n"
        let allowing = try Self.setUp(plainSessions: true)
        let served = try allowing.python(opens)
        #expect(served.status == 0 && served.stdout.contains("done"), "\(served)")

        let config = TemporaryDirectory("coffer-ssconf")
        try "# for an old client\nplain-sessions = allow\n".write(toFile: config.file("ss.conf"), atomically: true, encoding: .utf8)
        let named = try Self.setUp(arguments: ["--config", config.file("ss.conf")])
        let viaFlag = try named.python(opens)
        #expect(viaFlag.status == 0 && viaFlag.stdout.contains("done"), "\(viaFlag)")

        try "plain-sessions = deny\n".write(toFile: config.file("deny.conf"), atomically: true, encoding: .utf8)
        let denying = try Self.setUp(plainSessions: true, arguments: ["--config", config.file("deny.conf")])
        let refused = try denying.python(opens)
        #expect(refused.status != 0 && refused.stdout.contains("NotSupported") && refused.stdout.contains(config.file("deny.conf")), "\(refused)")

        let executable = Binaries.directory + "/coffer-secret-service"
        try "plain-sessions = yes\n".write(toFile: config.file("bad.conf"), atomically: true, encoding: .utf8)
        let bad = runProcess(executable, ["--config", config.file("bad.conf")], timeout: 30)
        #expect(bad.status == 64 && bad.stderr.contains("'plain-sessions' is 'allow' or 'deny'"), "\(bad)")
        let missing = runProcess(executable, ["--config", config.file("none.conf")], timeout: 30)
        #expect(missing.status == 64 && missing.stderr.contains("none.conf"), "\(missing)")
    }

    /// The eavesdropper's view. With the default configuration, `secret-tool store/lookup`
    /// (libsecret), python3-secretstorage, and a client that asks for `plain` first and falls back
    /// to the DH session when refused, all store and read their secrets, and `dbus-monitor` on the
    /// same bus sees none of them; it does see the labels and attribute values, and the signals
    /// addressed to other clients, which the Secret Service cannot hide (ThreatModel.md).
    @Test func libsecretAndSecretstorageWorkAndNoSecretCrossesTheBusInTheClear() throws {
        let bus = try Self.setUp()
        let monitor = try bus.spawn("/usr/bin/dbus-monitor", ["--address", bus.address], log: "monitor.log")
        defer { if monitor.isRunning { kill(monitor.processIdentifier, SIGKILL); monitor.waitUntilExit() } }
        // Monitoring once a marker sent after it started shows up in its output (10 s: failure bound).
        let marker = "monitor-ready-\(UUID().uuidString.prefix(8))"
        #expect(PrivateSessionBus.wait {
            _ = bus.run("/usr/bin/gdbus", ["call", "--session", "-d", "org.freedesktop.DBus", "-o", "/org/freedesktop/DBus",
                                           "-m", "org.freedesktop.DBus.NameHasOwner", marker])
            return bus.read("monitor.log").contains(marker)
        }, "dbus-monitor did not start monitoring: \(bus.read("monitor.log"))")

        let secrets = ["libsecret": "s3cret-of-libsecret-7f3a", "secretstorage": "s3cret-of-secretstorage-9c1e",
                       "fallback": "s3cret-of-a-plain-first-client-2d8b"]
        let stored = bus.run("/usr/bin/secret-tool", ["store", "--label=Transport label", "transport-app", "libsecret-client"],
                             stdin: secrets["libsecret"]!)
        #expect(stored.status == 0, "\(stored)\n\(bus.read("front-end.log"))")
        let looked = bus.run("/usr/bin/secret-tool", ["lookup", "transport-app", "libsecret-client"])
        #expect(looked.status == 0 && looked.stdout == secrets["libsecret"]!, "\(looked)")

        let r = try bus.python(Self.prelude + """
            coll = secretstorage.get_default_collection(conn)
            coll.create_item('Stored by secretstorage', {'transport-app': 'secretstorage-client'}, b'\(secrets["secretstorage"]!)')
            [item] = list(coll.search_items({'transport-app': 'secretstorage-client'}))
            assert item.get_secret() == b'\(secrets["secretstorage"]!)', item.get_secret()

            # A client that prefers plain and falls back to the DH session when it is refused.
            props = {'org.freedesktop.Secret.Item.Label': ('s', 'Stored by a plain-first client'),
                     'org.freedesktop.Secret.Item.Attributes': ('a{ss}', {'transport-app': 'fallback-client'})}
            plain = open_plain()
            if plain[0] == 'ok':
                created = call(coll.collection_path, 'org.freedesktop.Secret.Collection', 'CreateItem', 'a{sv}(oayays)b',
                               props, (plain[1][1], b'', b'\(secrets["fallback"]!)', 'text/plain'), True)
            else:
                assert plain[1] == 'org.freedesktop.DBus.Error.NotSupported', plain
                created = coll.create_item('Stored by a plain-first client', {'transport-app': 'fallback-client'},
                                           b'\(secrets["fallback"]!)', replace=True)
            [item] = list(coll.search_items({'transport-app': 'fallback-client'}))
            assert item.get_secret() == b'\(secrets["fallback"]!)'
            print('done')

            """)
        #expect(r.status == 0 && r.stdout.contains("done"), "\(r)\n\(bus.read("front-end.log"))")

        // Everything went through the bus the monitor watched, and it caught the sessions' negotiation ...
        _ = bus.run("/usr/bin/gdbus", ["call", "--session", "-d", "org.freedesktop.DBus", "-o", "/org/freedesktop/DBus",
                                       "-m", "org.freedesktop.DBus.NameHasOwner", marker + "-end"])
        #expect(PrivateSessionBus.wait { bus.read("monitor.log").contains(marker + "-end") })
        let seen = bus.read("monitor.log")
        #expect(seen.contains("dh-ietf1024-sha256-aes128-cbc-pkcs7") && seen.contains("CreateItem") && seen.contains("GetSecret"),
                "the monitor missed the traffic: \(seen.suffix(2000))")
        // ... but no secret, as text or as bytes (dbus-monitor prints a byte array as a string when it is printable).
        for (client, secret) in secrets {
            let hex = secret.utf8.map { String(format: "%02x", $0) }.joined(separator: " ")
            #expect(!seen.contains(secret) && !seen.contains(hex), "\(client)'s secret crossed the bus in the clear")
        }
        // What the Secret Service cannot hide (documented, not a regression): labels and attribute values.
        #expect(seen.contains("Transport label") && seen.contains("secretstorage-client") && seen.contains("member=ItemCreated"),
                "the monitor no longer sees labels, attributes or signals: update ThreatModel.md")
    }
}
