import CofferClient
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// The desktop portal's secret backend `coffer-portal-secret` (issue #26, part 6) on a private
/// session bus (PrivateSessionBus: a `dbus-daemon` with its own config) with the real agent: a
/// python3-dbus script owns `org.freedesktop.portal.Desktop` (posing as xdg-desktop-portal) and calls
/// `org.freedesktop.impl.portal.Secret.RetrieveSecret` with a pipe; the secret it reads back, what the
/// agent stored (seen by the Flatpak app itself, in a bwrap sandbox with its `.flatpak-info`), and
/// every refusal: a sender that is not the portal, a bad app id, a closed pipe, a locked keybag, a
/// backend without the `portal-secret` entitlement, and PORTAL_SECRET from an unentitled client.
@Suite(.enabled(if: PrivateSessionBus.available && FileManager.default.fileExists(atPath: "/usr/lib/python3/dist-packages/dbus"),
                "needs dbus-daemon, gdbus and Debian's python3 with python3-dbus (contrib/deps.sh)"))
struct SecretPortalTests {
    static let backendName = "org.freedesktop.impl.portal.desktop.coffer"
    static let backendApp = "org.example.portal-secret"

    /// The portal's side of one RetrieveSecret, as xdg-desktop-portal makes it: `portal` (the script's
    /// connection owns org.freedesktop.portal.Desktop), `closed` (the same, with the pipe's read end
    /// closed before the call), `stranger` (another connection owns the portal's name; this one calls),
    /// `unowned` (nobody owns it). Prints {"response", "secret" (hex)} or {"error": D-Bus error name}.
    static let script = #"""
        json, os, select, sys, time, dbus = (__import__(m) for m in ('json', 'os', 'select', 'sys', 'time', 'dbus'))
        for module in ('dbus.bus', 'dbus.types', 'dbus.exceptions'):
            __import__(module)
        mode, app = sys.argv[1], sys.argv[2]
        address = os.environ['DBUS_SESSION_BUS_ADDRESS']
        caller = dbus.bus.BusConnection(address)
        if mode in ('portal', 'closed'):
            owner = caller
        elif mode == 'stranger':
            owner = dbus.bus.BusConnection(address)
        else:
            owner = None
        if owner is not None:
            got = owner.request_name('org.freedesktop.portal.Desktop', dbus.bus.NAME_FLAG_DO_NOT_QUEUE)
            assert got == dbus.bus.REQUEST_NAME_REPLY_PRIMARY_OWNER, got
        backend = dbus.Interface(caller.get_object('org.freedesktop.impl.portal.desktop.coffer', '/org/freedesktop/portal/desktop',
                                                   introspect=False), 'org.freedesktop.impl.portal.Secret')
        r, w = os.pipe()
        if mode == 'closed':
            os.close(r)
        fd = dbus.types.UnixFd(w)
        os.close(w)
        try:
            response, results = backend.RetrieveSecret(dbus.ObjectPath('/org/freedesktop/portal/desktop/request/1_1/coffer'), app, fd,
                                                       dbus.Dictionary({}, signature='sv'), timeout=120)
        except dbus.exceptions.DBusException as e:
            print(json.dumps({'error': e.get_dbus_name()}))
            sys.exit(0)
        del fd
        data = b''
        if mode != 'closed':
            deadline = time.monotonic() + 60
            while True:
                ready, _, _ = select.select([r], [], [], max(0, deadline - time.monotonic()))
                if not ready:
                    print(json.dumps({'error': 'no end of file on the pipe'}))
                    sys.exit(1)
                chunk = os.read(r, 4096)
                if not chunk:
                    break
                data += chunk
        print(json.dumps({'response': int(response), 'results': len(results), 'secret': data.hex()}))
        """#

    /// An agent with a passcode, the built backend signed (with `portal-secret` when `entitled`), a
    /// private bus, and the backend owning its name on it.
    final class Fixture {
        let apps: SignedApps
        let agent: AgentProcess
        let bus: PrivateSessionBus
        let backend: Process?

        let services = TemporaryDirectory("coffer-portal-services")

        /// With `activated`, the backend is not started: contrib/dbus's activation file (Exec= pointed at
        /// the built backend and the test agent's socket) lets the bus start it on the first call.
        init(entitled: Bool = true, activated: Bool = false, agentConfig: [String] = []) throws {
            apps = try SignedApps()
            let executable = String(decoding: try StableFile.canonicalPath(Binaries.directory + "/coffer-portal-secret"), as: UTF8.self)
            try apps.sign("portal", appID: SecretPortalTests.backendApp, groups: ["portal-secret"], path: executable,
                          entitlements: entitled ? ["portal-secret"] : [])
            agent = try apps.startAgent(agentConfig)
            agent.setPasscode()
            guard !activated else {
                let file = try String(contentsOfFile: Binaries.packageRoot + "/contrib/dbus/\(SecretPortalTests.backendName).service", encoding: .utf8)
                #expect(file.contains("\nName=\(SecretPortalTests.backendName)\n") && file.contains("\nExec=/usr/local/bin/coffer-portal-secret\n"))
                try file.replacingOccurrences(of: "\nExec=/usr/local/bin/coffer-portal-secret\n", with: "\nExec=\(executable) --socket \(agent.socketPath)\n")
                    .write(toFile: services.file("\(SecretPortalTests.backendName).service"), atomically: true, encoding: .utf8)
                bus = try PrivateSessionBus(serviceDirectory: services.path)
                backend = nil
                return
            }
            bus = try PrivateSessionBus()
            let backend = try bus.spawn(executable, [], log: "portal.log", environment: ["COFFER_SOCKET": agent.socketPath])
            self.backend = backend
            guard PrivateSessionBus.wait(until: { self.owner(SecretPortalTests.backendName) != nil || !backend.isRunning }),
                  backend.isRunning else {
                throw SignedApps.Failure("coffer-portal-secret did not own its name:\n" + bus.read("portal.log"))
            }
        }

        func owner(_ name: String) -> String? {
            let r = bus.run("/usr/bin/gdbus", ["call", "--session", "-d", "org.freedesktop.DBus", "-o", "/org/freedesktop/DBus",
                                               "-m", "org.freedesktop.DBus.GetNameOwner", name])
            return r.status == 0 ? r.stdout : nil
        }

        /// One RetrieveSecret (see ``SecretPortalTests/script``): the response and the secret's bytes, or the D-Bus error.
        func retrieve(_ app: String, as mode: String = "portal") throws -> (response: Int?, secret: [UInt8], error: String?) {
            let path = bus.dir.file("portal-\(UUID().uuidString).py")
            try SecretPortalTests.script.write(toFile: path, atomically: true, encoding: .utf8)
            let r = bus.run(PrivateSessionBus.python, [path, mode, app])
            guard r.status == 0, let object = try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any] else {
                throw SignedApps.Failure("the portal script failed: \(r)\n" + bus.read("portal.log"))
            }
            if let e = object["error"] as? String { return (nil, [], e) }
            let hex = object["secret"] as? String ?? ""
            let bytes = stride(from: 0, to: hex.count, by: 2).compactMap { i -> UInt8? in
                let s = hex.index(hex.startIndex, offsetBy: i)
                return UInt8(hex[s..<hex.index(s, offsetBy: 2)], radix: 16)
            }
            return (object["response"] as? Int, bytes, nil)
        }

        /// Successful adds into `flatpak:APP` in the audit log (what "nothing stored" checks).
        func adds(_ app: String) -> Int {
            auditRecords(agent).filter {
                $0["operation"] as? String == "add" && $0["accessGroup"] as? String == "flatpak:" + app && ($0["result"] as? Int) == 0
            }.count
        }

        deinit { agent.stop() }
    }

    /// contrib/dbus's activation file starts the backend on the portal's first call, and contrib/portal's
    /// coffer.portal names it for the Secret interface.
    @Test func theActivationFileStartsTheBackend() throws {
        let f = try Fixture(activated: true)
        #expect(f.owner(Self.backendName) == nil, "nothing owns the name before the portal asks")
        let r = try f.retrieve("org.example.Chat")
        #expect(r.response == 0 && r.secret.count >= 64, "\(r)\n\(f.bus.read("dbus-daemon.log"))")
        #expect(f.owner(Self.backendName) != nil)
        let portal = try String(contentsOfFile: Binaries.packageRoot + "/contrib/portal/coffer.portal", encoding: .utf8)
        #expect(portal.split(separator: "\n") == ["[portal]", "DBusName=\(Self.backendName)", "Interfaces=org.freedesktop.impl.portal.Secret", "UseIn=*"])
    }

    @Test func theSameSecretTwiceForOneAppAndAnotherForAnother() throws {
        let f = try Fixture()
        let first = try f.retrieve("org.example.Chat")
        #expect(first.response == 0 && first.secret.count >= 64, "\(first)\n\(f.bus.read("portal.log"))")
        let again = try f.retrieve("org.example.Chat")
        #expect(again.response == 0 && again.secret == first.secret, "\(again)")
        let other = try f.retrieve("org.example.Mail")
        #expect(other.response == 0 && other.secret.count >= 64 && other.secret != first.secret, "\(other)")
        #expect(f.adds("org.example.Chat") == 1 && f.adds("org.example.Mail") == 1, "made once each, in the app's own group")
        // The backend's own identity sees nothing of the apps' groups (it only has PORTAL_SECRET).
        let find = f.agent.cli(["find", "--service", "org.freedesktop.portal.Secret", "--json"])
        #expect(find.status == Exit.notFound, "an unsigned caller sees no portal secret: \(find)")
    }

    /// What the backend stored is the Flatpak app's own item: the app, identified by the agent from
    /// its sandbox's `.flatpak-info` (bwrap, as AccessGroupTests makes one), reads the same bytes in
    /// `flatpak:APP_ID`; another app's sandbox does not see it.
    @Test(.enabled(if: AccessGroupTests.canRunBwrap, "needs a bwrap that can create namespaces here (apt: bubblewrap)"))
    func theSecretIsTheFlatpakAppsOwnItem() throws {
        let f = try Fixture()
        let got = try f.retrieve("org.example.Chat")
        #expect(got.response == 0 && got.secret.count >= 64, "\(got)")
        let client = try f.apps.install("flat")
        let info = f.apps.file("chat-info"), otherInfo = f.apps.file("other-info")
        try "[Application]\nname=org.example.Chat\n".write(toFile: info, atomically: true, encoding: .utf8)
        try "[Application]\nname=org.example.Other\n".write(toFile: otherInfo, atomically: true, encoding: .utf8)
        let chat = AccessGroupTests.sandboxed(client, agent: f.agent, info: info)
        let r = chat.run(["get", "--service", "org.freedesktop.portal.Secret", "--account", "org.example.Chat", "--format", "json"])
        let object = try #require(try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any], "\(r)")
        let attributes = object["attributes"] as? [String: Any]
        #expect(attributes?["agrp"] as? String == "flatpak:org.example.Chat", "\(object)")
        let stored = (object["secretHex"] as? String) ?? (object["secret"] as? String).map { Array($0.utf8).map { String(format: "%02x", $0) }.joined() }
        #expect(stored == got.secret.map { String(format: "%02x", $0) }.joined())
        let other = AccessGroupTests.sandboxed(client, agent: f.agent, info: otherInfo)
        #expect(other.find("org.freedesktop.portal.Secret").status == Exit.notFound)
    }

    /// Only the current owner of org.freedesktop.portal.Desktop is served: another connection (while the
    /// portal's name has an owner, and while it has none) gets AccessDenied, and nothing is made.
    @Test func aCallerThatIsNotThePortalIsRefused() throws {
        let f = try Fixture()
        for mode in ["stranger", "unowned"] {
            let r = try f.retrieve("org.example.Chat", as: mode)
            #expect(r.error == "org.freedesktop.DBus.Error.AccessDenied", "\(mode): \(r)")
        }
        #expect(f.adds("org.example.Chat") == 0)
        #expect(f.bus.read("portal.log").contains("refused a call from"))
    }

    /// A bad app id, a pipe nobody reads, and a locked keybag: response 2, nothing stored; the backend
    /// serves the next call.
    @Test func badRequestsGetResponseTwoAndStoreNothing() throws {
        let f = try Fixture()
        for app in ["org.example", "org.1example.App", "org..App", "org.example.App/x", "", String(repeating: "a.", count: 130) + "b"] {
            let r = try f.retrieve(app)
            #expect(r.response == 2 && r.secret.isEmpty, "\(app): \(r)")
        }
        let closed = try f.retrieve("org.example.Closed", as: "closed")
        #expect(closed.response == 2, "\(closed)")
        #expect(f.adds("org.example.Closed") == 0)
        #expect(f.agent.cli(["lock"]).status == 0)
        let locked = try f.retrieve("org.example.Locked")
        #expect(locked.response == 2 && locked.secret.isEmpty, "\(locked)")
        #expect(f.adds("org.example.Locked") == 0)
        #expect(f.agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        let fine = try f.retrieve("org.example.Locked")
        #expect(fine.response == 0 && fine.secret.count >= 64, "\(fine)")
    }

    /// A backend whose manifest lacks `portal-secret` gets nothing (the agent refuses PORTAL_SECRET and
    /// audits it); the portal gets response 2.
    @Test func aBackendWithoutTheEntitlementGetsNothing() throws {
        let f = try Fixture(entitled: false)
        let r = try f.retrieve("org.example.Chat")
        #expect(r.response == 2 && r.secret.isEmpty, "\(r)")
        #expect(f.adds("org.example.Chat") == 0)
        #expect(auditRecords(f.agent).contains { $0["operation"] as? String == "portal-secret" && $0["reason"] as? String == "not-entitled" })
    }

    /// Under `flatpak-callers = deny` the agent gives Flatpak apps nothing, through the portal too:
    /// response 2, nothing stored, the refusal audited with the app as the caller.
    @Test func flatpakCallersDenyAlsoDeniesThePortal() throws {
        let f = try Fixture(agentConfig: ["flatpak-callers = deny"])
        let r = try f.retrieve("org.example.Chat")
        #expect(r.response == 2 && r.secret.isEmpty, "\(r)")
        #expect(f.adds("org.example.Chat") == 0)
        #expect(auditRecords(f.agent).contains { $0["app"] as? String == "org.example.Chat" && ($0["result"] as? Int) == -34018 },
                "\(auditRecords(f.agent))")
    }

    /// PORTAL_SECRET from a client without the entitlement (this unsigned test process) is -34018; a bad
    /// app id is -50 and the connection stays usable.
    @Test func portalSecretNeedsTheEntitlement() throws {
        let apps = try SignedApps()
        let agent = try apps.startAgent()
        agent.setPasscode()
        let c = try AgentConnection(path: agent.socketPath)
        do {
            _ = try c.portalSecret(appID: "org.example.Chat")
            Issue.record("an unentitled client got a portal secret")
        } catch {
            #expect(error.status == .missingEntitlement && error.message.contains("portal-secret"), "\(error)")
        }
        do {
            _ = try c.portalSecret(appID: "org.example")
            Issue.record("a bad app id was answered")
        } catch {
            #expect(error.status == .param, "\(error)")
        }
        #expect(try c.whoami().kind == .unsigned, "the connection is still open and still the client's own")
    }
}

/// contrib/install.sh installs the portal backend only with --enable-portal-secret: its binary, its
/// manifest (signed with `portal-secret`), its man page, its activation file and coffer.portal.
@Suite struct SecretPortalInstallTests {
    @Test func installsTheBackendOnlyWhenAsked() throws {
        let root = TemporaryDirectory("coffer-install-portal")
        var r = InstallScriptStepsTests.install(root.path, "--systemd")
        try #require(r.status == 0, "\(r)")
        let files = ["usr/local/bin/coffer-portal-secret", "etc/coffer/manifests.d/coffer-portal-secret.manifest",
                     "usr/local/share/dbus-1/services/org.freedesktop.impl.portal.desktop.coffer.service",
                     "usr/share/xdg-desktop-portal/portals/coffer.portal", "usr/local/share/man/man1/coffer-portal-secret.1"]
        for file in files { #expect(!FileManager.default.fileExists(atPath: root.file(file)), "\(file) without --enable-portal-secret") }
        r = InstallScriptStepsTests.install(root.path, "--systemd --enable-portal-secret")
        try #require(r.status == 0, "\(r)")
        for file in files { #expect(FileManager.default.fileExists(atPath: root.file(file)), "\(file) with --enable-portal-secret") }
        #expect(Files.mode(root.file(files[0])) == 0o755 && Files.mode(root.file(files[3])) == 0o644)
        r = runCLI(["manifest", "verify", root.file(files[1]), "--trusted-keys", root.file("etc/coffer/trusted-keys.d")])
        #expect(r.status == 0 && r.stdout.contains("app: coffer.portal-secret") && r.stdout.contains("entitlement: portal-secret\n"), "\(r)")
    }
}
