import CofferTestSupport
import Foundation
import Testing

/// The secret backend behind the real `xdg-desktop-portal` (issue #26, part 6): a Flatpak-style app
/// (a bwrap sandbox with its `.flatpak-info`) calls `org.freedesktop.portal.Secret.RetrieveSecret`,
/// as libsecret's portal path does; xdg-desktop-portal identifies the app itself, finds
/// `coffer.portal` (contrib/portal) and forwards to `coffer-portal-secret`, which the private bus
/// activates. The app reads the same secret twice, another app another one, and the app's own
/// sandboxed `coffer` finds that secret in its `flatpak:APP_ID` group.
@Suite(.enabled(if: RealPortal.available, "needs xdg-desktop-portal, a bwrap that can create namespaces here, dbus-daemon and python3-dbus (contrib/deps.sh)"))
struct RealPortalTests {

    /// The app's side, run inside its sandbox: RetrieveSecret with a pipe and a handle token, then the
    /// pipe read to its end. Prints {"secret": hex} or {"error": D-Bus error name}.
    static let app = #"""
        json, os, select, sys, time, dbus = (__import__(m) for m in ('json', 'os', 'select', 'sys', 'time', 'dbus'))
        for module in ('dbus.bus', 'dbus.types', 'dbus.exceptions'):
            __import__(module)
        bus = dbus.bus.BusConnection(os.environ['DBUS_SESSION_BUS_ADDRESS'])
        secret = dbus.Interface(bus.get_object('org.freedesktop.portal.Desktop', '/org/freedesktop/portal/desktop'),
                                'org.freedesktop.portal.Secret')
        r, w = os.pipe()
        fd = dbus.types.UnixFd(w)
        os.close(w)
        try:
            secret.RetrieveSecret(fd, dbus.Dictionary({'handle_token': dbus.String('coffer%d' % os.getpid())}, signature='sv'), timeout=120)
        except dbus.exceptions.DBusException as e:
            print(json.dumps({'error': e.get_dbus_name(), 'message': str(e)}))
            sys.exit(0)
        del fd
        data, deadline = b'', time.monotonic() + 60
        while True:
            ready, _, _ = select.select([r], [], [], max(0, deadline - time.monotonic()))
            if not ready:
                print(json.dumps({'error': 'no end of file on the pipe', 'secret': data.hex()}))
                sys.exit(0)
            chunk = os.read(r, 4096)
            if not chunk:
                break
            data += chunk
        print(json.dumps({'secret': data.hex()}))
        """#

    /// Runs the app script as `appID` in a bwrap sandbox (the runtime read-only, the bus's directory
    /// bound, a `.flatpak-info` naming the app): the secret's hex, or a failure naming what went wrong.
    static func retrieve(_ f: SecretPortalTests.Fixture, as appID: String) throws -> String {
        let script = f.bus.dir.file("app-\(UUID().uuidString).py")
        try app.write(toFile: script, atomically: true, encoding: .utf8)
        let info = f.bus.dir.file("info-\(UUID().uuidString)")
        try "[Application]\nname=\(appID)\n".write(toFile: info, atomically: true, encoding: .utf8)
        var runtime: [String] = []
        for top in ["usr", "etc"] { runtime += ["--ro-bind", "/" + top, "/" + top] }
        for link in ["bin", "lib", "lib64", "sbin"] {
            if let target = try? FileManager.default.destinationOfSymbolicLink(atPath: "/" + link) {
                runtime += ["--symlink", target, "/" + link]
            } else if FileManager.default.fileExists(atPath: "/" + link) {
                runtime += ["--ro-bind", "/" + link, "/" + link]
            }
        }
        let r = f.bus.run("/usr/bin/bwrap", runtime + ["--bind", f.bus.dir.path, f.bus.dir.path, "--ro-bind", info, "/.flatpak-info",
                                                       "--proc", "/proc", "--dev", "/dev", "--unshare-ipc", "--",
                                                       PrivateSessionBus.python, script])
        guard r.status == 0, let object = try? JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as? [String: Any] else {
            throw SignedApps.Failure("the sandboxed app failed: \(r)\n" + f.bus.read("xdg-desktop-portal.log"))
        }
        if let e = object["error"] as? String {
            throw SignedApps.Failure("RetrieveSecret as \(appID): \(e) \(object["message"] ?? "")\n" + f.bus.read("xdg-desktop-portal.log"))
        }
        return object["secret"] as? String ?? ""
    }

    @Test func aSandboxedAppGetsItsOwnSecretThroughTheRealPortal() throws {
        let f = try SecretPortalTests.Fixture(activated: true)
        // xdg-desktop-portal finds backends in XDG_DESKTOP_PORTAL_DIR: contrib/portal's file, as installed.
        let portals = TemporaryDirectory("coffer-portals")
        let file = try String(contentsOfFile: Binaries.packageRoot + "/contrib/portal/coffer.portal", encoding: .utf8)
        try file.write(toFile: portals.file("coffer.portal"), atomically: true, encoding: .utf8)
        let portal = try f.bus.spawn(RealPortal.executable, ["--replace", "--verbose"], log: "xdg-desktop-portal.log",
                                     environment: ["XDG_DESKTOP_PORTAL_DIR": portals.path, "XDG_CURRENT_DESKTOP": "coffer-test"])
        defer { portal.terminate() }
        try #require(PrivateSessionBus.wait(30, until: { f.owner("org.freedesktop.portal.Desktop") != nil || !portal.isRunning }) && portal.isRunning,
                     "xdg-desktop-portal did not start:\n\(f.bus.read("xdg-desktop-portal.log"))")
        let first = try Self.retrieve(f, as: "org.example.Chat")
        #expect(first.count >= 128, "a secret of at least 64 bytes: \(first)")
        #expect(try Self.retrieve(f, as: "org.example.Chat") == first, "the same app gets the same secret again")
        let other = try Self.retrieve(f, as: "org.example.Mail")
        #expect(other.count >= 128 && other != first, "another app gets its own")
        #expect(f.adds("org.example.Chat") == 1 && f.adds("org.example.Mail") == 1, "each made once, in the app's own group")
        #expect(f.owner(SecretPortalTests.backendName) != nil, "the bus activated coffer-portal-secret for the portal")
    }
}

/// Whether the real portal can run here.
enum RealPortal {
    static let executable = "/usr/libexec/xdg-desktop-portal"
    static let available = FileManager.default.isExecutableFile(atPath: executable) && AccessGroupTests.canRunBwrap
        && PrivateSessionBus.available && FileManager.default.fileExists(atPath: "/usr/lib/python3/dist-packages/dbus")
}
