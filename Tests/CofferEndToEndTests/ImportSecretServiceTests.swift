import CofferTestSupport
import Foundation
import Testing

/// `coffer import secret-service` against a real gnome-keyring-daemon (secrets component, unlocked
/// with its password on stdin, in a temporary HOME) on a private session bus (PrivateSessionBus),
/// filled by the real `secret-tool store` in three collections, one of them locked, imported into a
/// real agent and read back with `coffer find --attr …` and `coffer get`.
///
/// gnome-keyring's unlock prompt needs its system prompter (gcr-prompter, a person's dialog); on a
/// bus where none can start, the prompt completes as dismissed at once, so the locked collection is
/// reported as locked (its items failed, the rest imported), which is what is checked here.
@Suite(.enabled(if: GnomeKeyring.available, "needs gnome-keyring, secret-tool (libsecret-tools), dbus-daemon and Debian's python3-secretstorage (contrib/deps.sh)"))
struct ImportSecretServiceTests {
    @Test func importsEveryUnlockedCollectionAndReportsTheLockedOne() throws {
        let keyring = try GnomeKeyring()
        try keyring.store(label: "Web alice", ["xdg:schema": "org.example.Password", "service": "web", "user": "alice"], secret: "s-alice")
        try keyring.store(label: "Mail", ["service": "mail", "user": "alice"], secret: "s-mail")
        let work = try keyring.createCollection("Work", password: "work-pw")
        try keyring.store(label: "VPN", ["service": "vpn", "user": "bob"], secret: "s-vpn", collection: work)
        let vault = try keyring.createCollection("Vault", password: "vault-pw")
        try keyring.store(label: "Bank", ["service": "bank", "user": "carol"], secret: "s-bank", collection: vault)
        try keyring.lock(vault)
        let agent = try AgentProcess()

        var r = agent.cli(["import", "secret-service"], environment: keyring.environment)
        #expect(r.status == 15, "the locked collection failed: \(r)")
        let lines = r.stdout.split(separator: "\n").map(String.init)
        for entry in ["login/Web alice", "login/Mail", "Work/VPN"] { #expect(lines.contains("imported " + entry), "\(entry): \(r)") }
        #expect(lines.contains { $0.hasPrefix("failed Vault/") && $0.contains("locked") }, "\(r)")
        #expect(lines.last == "3 imported, 0 skipped as duplicates, 1 failed", "\(r)")
        #expect(!r.stdout.contains("s-") && !r.stderr.contains("s-alice"), "no secret is printed")

        // Found by their attributes, as libsecret apps will find them through Coffer's front end.
        r = agent.cli(["find", "--attr", "service=web", "--attr", "user=alice", "--json"])
        #expect(r.status == 0 && r.stdout.contains("\"svce\":\"org.freedesktop.secrets\"") && r.stdout.contains("\"labl\":\"Web alice\"")
                && r.stdout.contains("\"@xdg:schema\":\"org.example.Password\"") && r.stdout.contains("\"@coffer:collection\":\"login\"")
                && r.stdout.contains("\"@coffer:content-type\":\"text/plain\""), "\(r)")
        r = agent.cli(["get", "--attr", "service=web", "--attr", "user=alice"])
        #expect(r.status == 0 && r.stdout == "s-alice", "\(r)")
        r = agent.cli(["get", "--attr", "service=vpn", "--attr", "coffer:collection=Work"])
        #expect(r.status == 0 && r.stdout == "s-vpn", "\(r)")
        r = agent.cli(["find", "--attr", "service=bank"])
        #expect(r.status == 3, "nothing of the locked collection: \(r)")

        // Again: every item is a duplicate, nothing changes (an item changed in Coffer keeps its change).
        r = agent.cli(["update", "--attr", "service=mail", "--secret-stdin"], stdin: "changed-in-coffer")
        #expect(r.status == 0, "\(r)")
        r = agent.cli(["import", "secret-service"], environment: keyring.environment)
        #expect(r.status == 15 && r.stdout.contains("0 imported, 3 skipped as duplicates, 1 failed")
                && r.stdout.contains("duplicate login/Mail"), "\(r)")
        r = agent.cli(["get", "--attr", "service=mail"])
        #expect(r.status == 0 && r.stdout == "changed-in-coffer", "\(r)")
        r = agent.cli(["find", "--attr", "service=web", "--json"])
        #expect(r.status == 0 && r.stdout.components(separatedBy: "\"labl\"").count == 2, "one item, not two: \(r)")
    }

    @Test func oneCollectionADryRunAndAnEqualItemInAnotherCollection() throws {
        let keyring = try GnomeKeyring()
        try keyring.store(label: "Shared", ["service": "s", "user": "u"], secret: "s-login")
        let work = try keyring.createCollection("Work", password: "work-pw")
        try keyring.store(label: "Shared", ["service": "s", "user": "u"], secret: "s-work", collection: work)
        let agent = try AgentProcess()

        var r = agent.cli(["import", "secret-service", "--collection", "Work", "--dry-run"], environment: keyring.environment)
        #expect(r.status == 0 && r.stdout.contains("would import Work/Shared") && !r.stdout.contains("login/")
                && r.stdout.contains("1 would be imported, 0 skipped as duplicates, 0 failed"), "\(r)")
        r = agent.cli(["find", "--attr", "service=s"])
        #expect(r.status == 3, "a dry run stores nothing: \(r)")
        r = agent.cli(["import", "secret-service", "--collection", "Work"], environment: keyring.environment)
        #expect(r.status == 0 && r.stdout.contains("imported Work/Shared"), "\(r)")
        // The same label and attributes in another collection is another item, not a duplicate.
        r = agent.cli(["import", "secret-service"], environment: keyring.environment)
        #expect(r.status == 0 && r.stdout.contains("imported login/Shared") && r.stdout.contains("duplicate Work/Shared"), "\(r)")
        r = agent.cli(["get", "--attr", "service=s", "--attr", "coffer:collection=login"])
        #expect(r.status == 0 && r.stdout == "s-login", "\(r)")
        r = agent.cli(["import", "secret-service", "--collection", "Nowhere"], environment: keyring.environment)
        #expect(r.status == 3 && r.stderr.contains("no collection 'Nowhere'"), "\(r)")
    }

    @Test func noProviderOrCofferItselfIsRefused() throws {
        let bus = try PrivateSessionBus()
        let agent = try AgentProcess()
        var r = agent.cli(["import", "secret-service"], environment: ["DBUS_SESSION_BUS_ADDRESS": bus.address])
        #expect(r.status == 7 && r.stderr.contains("no Secret Service provider is on the session bus"), "\(r)")

        let (_, coffersAgent, coffersBus, _, _) = try SecretServiceBusTests.setUp()
        r = coffersAgent.cli(["import", "secret-service"], environment: ["DBUS_SESSION_BUS_ADDRESS": coffersBus.address])
        #expect(r.status == 2 && r.stderr.contains("coffer-secret-service itself"), "\(r)")
        r = coffersAgent.cli(["status", "--json"])
        #expect(r.stdout.contains("\"items\":0"), "\(r)")
    }

    /// A provider that leaves the bus in the middle of GetSecrets (a scripted one in python3-dbus,
    /// serving one collection of two items and exiting when asked for their secrets): the import
    /// reports both as failed, stores nothing, and ends with exit 15.
    @Test(.enabled(if: ScriptedProvider.available, "needs python3-dbus and python3-gi"))
    func aProviderThatLeavesMidImport() throws {
        let provider = try ScriptedProvider(mode: "leave")
        let agent = try AgentProcess()
        let r = agent.cli(["import", "secret-service"], environment: ["DBUS_SESSION_BUS_ADDRESS": provider.bus.address])
        #expect(r.status == 15 && r.stdout.contains("failed login/1: not read: the provider left the bus")
                && r.stdout.contains("failed login/2: not read: the provider left the bus")
                && r.stdout.hasSuffix("0 imported, 0 skipped as duplicates, 2 failed\n"), "\(r)")
        #expect(agent.cli(["status", "--json"]).stdout.contains("\"items\":0"))
    }

    /// A locked collection whose provider answers Unlock with a prompt that completes (what a person
    /// typing the keyring's password amounts to; scripted, as gnome-keyring's needs a display): the
    /// importer calls Prompt, waits for Completed, and imports the items it then gets.
    @Test(.enabled(if: ScriptedProvider.available, "needs python3-dbus and python3-gi"))
    func aLockedCollectionIsUnlockedThroughTheProvidersPrompt() throws {
        let provider = try ScriptedProvider(mode: "prompt")
        let agent = try AgentProcess()
        var r = agent.cli(["import", "secret-service"], environment: ["DBUS_SESSION_BUS_ADDRESS": provider.bus.address])
        #expect(r.status == 0 && r.stdout.contains("imported login/item 1") && r.stdout.contains("imported login/item 2"), "\(r)")
        #expect(provider.log.contains("Unlock") && provider.log.contains("Prompt"), "\(provider.log)")
        // The DH session first; `plain` only because this provider refuses it.
        #expect(provider.log.contains("OpenSession dh-ietf1024-sha256-aes128-cbc-pkcs7\nOpenSession plain\n"), "\(provider.log)")
        r = agent.cli(["get", "--attr", "k=v2"])
        #expect(r.status == 0 && r.stdout == "secret-2", "\(r)")
    }
}

/// A Secret Service provider scripted in python3-dbus on a private session bus: one collection
/// `login` of two items (`item 1`, `item 2`, attributes `k=v1`, `k=v2`), a `plain` session only
/// (the DH one refused with NotSupported).
/// Mode `leave`: it exits when asked for secrets. Mode `prompt`: the collection is locked; Unlock
/// answers with a prompt whose Prompt call completes at once, not dismissed, and unlocks it. It
/// logs the methods called.
final class ScriptedProvider: @unchecked Sendable {
    let bus: PrivateSessionBus
    private let process = Process()
    static var available: Bool {
        PrivateSessionBus.available && ["dbus", "gi"].allSatisfy { FileManager.default.fileExists(atPath: "/usr/lib/python3/dist-packages/" + $0) }
    }
    var log: String { bus.read("provider.log") }

    init(mode: String) throws {
        bus = try PrivateSessionBus()
        let script = bus.dir.file("provider.py")
        try #"""
            dbus, os, sys = __import__('dbus'), __import__('os'), __import__('sys')
            __import__('dbus.service'), __import__('dbus.mainloop.glib')
            from gi.repository import GLib
            dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
            b, mode = dbus.SessionBus(), sys.argv[1]
            P, S = 'org.freedesktop.DBus.Properties', 'org.freedesktop.Secret.Service'
            C = '/org/freedesktop/secrets/collection/login'
            items = [dbus.ObjectPath(C + '/1'), dbus.ObjectPath(C + '/2')]
            def log(m): print(m, flush=True)
            class Obj(dbus.service.Object):
                def __init__(self, path, props):
                    super().__init__(b, path); self.props = props
                @dbus.service.method(P, in_signature='ss', out_signature='v')
                def Get(self, iface, name): return self.props[name]
                @dbus.service.method(P, in_signature='s', out_signature='a{sv}')
                def GetAll(self, iface): return self.props
            collection = Obj(C, {'Items': dbus.Array(items, signature='o'), 'Label': 'Login', 'Locked': mode == 'prompt'})
            class Prompt(dbus.service.Object):
                @dbus.service.method('org.freedesktop.Secret.Prompt', in_signature='s')
                def Prompt(self, window):
                    log('Prompt'); collection.props['Locked'] = False
                    GLib.idle_add(lambda: self.Completed(False, dbus.Array([dbus.ObjectPath(C)], signature='o', variant_level=1)))
                @dbus.service.signal('org.freedesktop.Secret.Prompt', signature='bv')
                def Completed(self, dismissed, result): pass
            Prompt(b, '/org/freedesktop/secrets/prompt/1')
            class Service(Obj):
                @dbus.service.method(S, in_signature='sv', out_signature='vo')
                def OpenSession(self, alg, inp):
                    log('OpenSession ' + alg)
                    if alg != 'plain': raise dbus.exceptions.DBusException('no', name='org.freedesktop.DBus.Error.NotSupported')
                    return (dbus.String('', variant_level=1), dbus.ObjectPath('/org/freedesktop/secrets/session/1'))
                @dbus.service.method(S, in_signature='ao', out_signature='aoo')
                def Unlock(self, objects):
                    log('Unlock')
                    return (dbus.Array([], signature='o'), dbus.ObjectPath('/org/freedesktop/secrets/prompt/1'))
                @dbus.service.method(S, in_signature='aoo', out_signature='a{o(oayays)}')
                def GetSecrets(self, wanted, session):
                    if mode == 'leave': os._exit(0)
                    log('GetSecrets')
                    if collection.props['Locked']: return dbus.Dictionary({}, signature='o(oayays)')
                    return dbus.Dictionary({i: (session, dbus.ByteArray(b''), dbus.ByteArray(b'secret-' + i[-1:].encode()), 'text/plain')
                                            for i in wanted}, signature='o(oayays)')
                @dbus.service.method('org.freedesktop.Secret.Session', in_signature='')
                def Close(self): pass
            Service('/org/freedesktop/secrets', {'Collections': dbus.Array([dbus.ObjectPath(C)], signature='o')})
            class Session(dbus.service.Object):
                @dbus.service.method('org.freedesktop.Secret.Session', in_signature='')
                def Close(self): pass
            Session(b, '/org/freedesktop/secrets/session/1')
            for n, i in enumerate(items, 1):
                Obj(i, {'Label': 'item %d' % n, 'Attributes': dbus.Dictionary({'k': 'v%d' % n}, signature='ss'), 'Locked': False})
            b.request_name('org.freedesktop.secrets')
            GLib.MainLoop().run()
            """#.write(toFile: script, atomically: true, encoding: .utf8)
        process.executableURL = URL(fileURLWithPath: PrivateSessionBus.python)
        process.arguments = [script, mode]
        process.environment = ProcessInfo.processInfo.environment.merging(["DBUS_SESSION_BUS_ADDRESS": bus.address]) { $1 }
        let log = bus.dir.file("provider.log")
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        process.standardOutput = FileHandle(forWritingAtPath: log)
        process.standardError = FileHandle(forWritingAtPath: log)
        try process.run()
        guard PrivateSessionBus.wait(30, until: { self.bus.nameOwner() != nil }) else {
            throw PinentryHarness.Failure("the scripted provider did not start:\n" + self.log)
        }
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() }
    }
}

/// gnome-keyring-daemon's secrets component on a private session bus of its own, in a temporary
/// HOME (XDG_DATA_HOME, XDG_RUNTIME_DIR), its login keyring unlocked with a password on stdin; run in
/// the foreground so that it ends with the test (SIGKILL).
final class GnomeKeyring: @unchecked Sendable {
    let bus: PrivateSessionBus
    let home = TemporaryDirectory("coffer-gk")
    private let daemon = Process()
    static var available: Bool {
        PrivateSessionBus.available && ["/usr/bin/gnome-keyring-daemon", "/usr/bin/secret-tool"].allSatisfy { FileManager.default.isExecutableFile(atPath: $0) }
    }
    var environment: [String: String] {
        ["DBUS_SESSION_BUS_ADDRESS": bus.address, "HOME": home.path, "XDG_DATA_HOME": home.file("data"), "XDG_RUNTIME_DIR": home.file("run")]
    }

    init() throws {
        bus = try PrivateSessionBus()
        for d in ["data", "run"] { mkdir(home.file(d), 0o700) }
        daemon.executableURL = URL(fileURLWithPath: "/usr/bin/gnome-keyring-daemon")
        daemon.arguments = ["--foreground", "--unlock", "--components=secrets"]
        daemon.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        let input = Pipe()
        daemon.standardInput = input
        let log = home.file("gnome-keyring.log")
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        daemon.standardOutput = FileHandle(forWritingAtPath: log)
        daemon.standardError = FileHandle(forWritingAtPath: log)
        try daemon.run()
        input.fileHandleForWriting.write(Data("login-pw".utf8))
        try input.fileHandleForWriting.close()
        guard PrivateSessionBus.wait(30, until: { self.bus.nameOwner() != nil }) else {
            throw PinentryHarness.Failure("gnome-keyring-daemon did not own org.freedesktop.secrets:\n" + ((try? String(contentsOfFile: log, encoding: .utf8)) ?? ""))
        }
    }

    /// `secret-tool store --label L [--collection C] ATTR VALUE …` with the secret on stdin.
    func store(label: String, _ attributes: [String: String], secret: String, collection: String? = nil) throws {
        let args = ["store", "--label", label] + (collection.map { ["--collection", $0] } ?? []) + attributes.sorted { $0.key < $1.key }.flatMap { [$0.key, $0.value] }
        let r = runProcess("/usr/bin/secret-tool", args, stdin: secret, environment: environment, timeout: 60)
        guard r.status == 0 else { throw PinentryHarness.Failure("secret-tool store: \(r)") }
    }

    /// A new collection with a password and no prompt (gnome-keyring's CreateWithMasterPassword); its path.
    func createCollection(_ label: String, password: String) throws -> String {
        let r = try bus.python(#"""
            secretstorage = __import__('secretstorage')
            from jeepney import DBusAddress, new_method_call
            conn = secretstorage.dbus_init()
            def call(iface, method, sig, *body):
                return conn.send_and_get_reply(new_method_call(DBusAddress('/org/freedesktop/secrets', bus_name='org.freedesktop.secrets', interface=iface), method, sig, body)).body
            session = call('org.freedesktop.Secret.Service', 'OpenSession', 'sv', 'plain', ('s', ''))[1]
            print(call('org.gnome.keyring.InternalUnsupportedGuiltRiddenInterface', 'CreateWithMasterPassword', 'a{sv}(oayays)',
                       {'org.freedesktop.Secret.Collection.Label': ('s', '\#(label)')}, (session, b'', b'\#(password)', 'text/plain'))[0])
            """#)
        let path = r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        guard r.status == 0, path.hasPrefix("/org/freedesktop/secrets/collection/") else { throw PinentryHarness.Failure("CreateWithMasterPassword: \(r)") }
        return path
    }

    /// Service.Lock of a collection.
    func lock(_ collection: String) throws {
        let r = bus.run("/usr/bin/gdbus", ["call", "--session", "-d", "org.freedesktop.secrets", "-o", "/org/freedesktop/secrets",
                                           "-m", "org.freedesktop.Secret.Service.Lock", "['\(collection)']"])
        guard r.status == 0 else { throw PinentryHarness.Failure("Lock: \(r)") }
    }

    deinit {
        if daemon.isRunning { kill(daemon.processIdentifier, SIGKILL); daemon.waitUntilExit() }
    }
}
