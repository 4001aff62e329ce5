import CSDBus
import CofferClient
import CofferCrypto
import CofferModel
import CofferSystem
import Glibc

/// The desktop portal's secret backend (issue #26, part 6; SecretServiceMapping.md, Portal): owns
/// `org.freedesktop.impl.portal.desktop.coffer` and answers xdg-desktop-portal's
/// `org.freedesktop.impl.portal.Secret.RetrieveSecret` by writing the Flatpak app's per-app secret,
/// which the agent keeps (and makes on first use) in the app's `flatpak:APP_ID` group, to the
/// descriptor the portal passed. Only the current owner of `org.freedesktop.portal.Desktop` is
/// served (``refusal(sender:portalOwner:)``; every other sender gets AccessDenied): the app id is the portal's
/// word, after it checked the app's sandbox. The agent connection runs under this program's own
/// manifest, which must grant `portal-secret` (nothing else of the app's group is reachable with it).
public final class SecretPortal: @unchecked Sendable {
    /// The name this backend owns (what `coffer.portal`'s `DBusName` names).
    public static let busName = "org.freedesktop.impl.portal.desktop.coffer"
    /// The name whose owner (xdg-desktop-portal) alone may call the backend.
    public static let portalName = "org.freedesktop.portal.Desktop"
    /// How long (seconds) the backend waits for the agent's answer.
    static let agentTimeout = 30.0

    /// The portal's response codes (0 success, 1 cancelled, 2 other error).
    enum Response: UInt32 { case success = 0, cancelled = 1, failed = 2 }

    let socketPath: String

    public init(socketPath: String) { self.socketPath = socketPath }

    /// Serves until the bus connection ends: 0, ``CSP_NAME_TAKEN`` (another owner of ``busName``), or
    /// a negative errno.
    public func run() -> Int32 {
        signal(SIGPIPE, SIG_IGN)  // a reader that closed its end is EPIPE (response 2), never a crash
        let me = Unmanaged.passUnretained(self).toOpaque()
        return withExtendedLifetime(self) {
            csp_serve(Self.busName, Self.portalName, { sender, owner, app, fd, userdata in
                let portal = Unmanaged<SecretPortal>.fromOpaque(userdata!).takeUnretainedValue()
                let from = sender.map { String(cString: $0) }
                if let why = SecretPortal.refusal(sender: from, portalOwner: owner.map { String(cString: $0) }) {
                    SecretPortal.log("refused a call from \(from ?? "?"): \(why)")
                    return CSP_ACCESS_DENIED
                }
                return portal.retrieve(appID: app.map { String(cString: $0) } ?? "", fd: fd).rawValue
            }, me)
        }
    }

    /// Why a call from `sender` is refused, or nil when it may ask: only the current owner of
    /// ``portalName`` (xdg-desktop-portal, which checked the app's sandbox before naming it) is
    /// served; a name without an owner serves nobody.
    static func refusal(sender: String?, portalOwner: String?) -> String? {
        guard let portalOwner else { return "the portal's name has no owner" }
        guard let sender, sender == portalOwner else { return "not the portal's owner" }
        return nil
    }

    /// One RetrieveSecret from the portal: the app id checked against Flatpak's grammar and the
    /// descriptor checked writable with a reader before the agent is asked (so a bad call stores
    /// nothing), then the secret written whole.
    func retrieve(appID: String, fd: Int32) -> Response {
        guard FlatpakAppID.isValid(appID) else {
            Self.log("refused a request: the app id is not a valid Flatpak application id")
            return .failed
        }
        if let problem = Self.unusable(fd) {
            Self.log("refused the request for \(appID): \(problem)")
            return .failed
        }
        let secret: SecureBytes
        do {
            let agent = try AgentConnection(path: socketPath, clientName: "coffer-portal-secret", replyTimeout: Self.agentTimeout)
            secret = try agent.portalSecret(appID: appID)
        } catch {
            Self.log("no secret for \(appID): \(error)")
            return .failed
        }
        defer { secret.wipe() }
        let written = secret.withUnsafeBytes { StandardStreams.write(fd, $0) }
        guard written else {
            Self.log("could not write the secret of \(appID): \(String(cString: strerror(errno)))")
            return .failed
        }
        return .success
    }

    /// Why `fd` cannot take the secret (not open for writing, or its reader is gone), or nil.
    static func unusable(_ fd: Int32) -> String? {
        let flags = fcntl(fd, F_GETFL)
        guard flags >= 0 else { return "the descriptor is not open" }
        guard flags & O_ACCMODE != O_RDONLY else { return "the descriptor is not open for writing" }
        var p = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
        guard poll(&p, 1, 0) >= 0 else { return "the descriptor cannot be polled" }
        if p.revents & Int16(POLLERR | POLLHUP | POLLNVAL) != 0 { return "nothing reads the descriptor" }
        return nil
    }

    static func log(_ line: String) { StandardStreams.printError("coffer-portal-secret: " + line) }
}

/// `coffer-portal-secret [--socket PATH]`: the backend's command line. Exit statuses
/// (coffer-portal-secret(1)): 0 the bus connection ended, 1 the bus cannot be reached or failed, 64 a
/// usage error, 69 the backend's name has another owner.
public enum SecretPortalMain {
    public static let usage = """
        usage: coffer-portal-secret [--socket PATH]
        Serves the desktop portal's secret backend (org.freedesktop.impl.portal.Secret as
        org.freedesktop.impl.portal.desktop.coffer) on the session bus (DBUS_SESSION_BUS_ADDRESS) for
        xdg-desktop-portal only, with the Coffer agent at PATH (default: $COFFER_SOCKET, else
        $XDG_RUNTIME_DIR/coffer/agent.sock). Each Flatpak app gets its own secret in its flatpak:APP_ID group.
        """

    public static func run(_ arguments: [String]) -> Int32 {
        var socket: String?
        var rest = arguments[...]
        while let a = rest.popFirst() {
            switch a {
            case "--socket":
                guard let p = rest.popFirst(), !p.isEmpty else { return fail("--socket needs a path", status: 64) }
                socket = p
            case "-h", "--help":
                StandardStreams.print(usage)
                return 0
            default:
                return fail("unknown argument \(a)\n\(usage)", status: 64)
            }
        }
        let r = SecretPortal(socketPath: AgentConnection.socketPath(explicit: socket)).run()
        if r == CSP_NAME_TAKEN { return fail("\(SecretPortal.busName) has another owner", status: 69) }
        guard r >= 0 else { return fail("the session bus failed: \(String(cString: strerror(-r)))", status: 1) }
        return 0
    }

    private static func fail(_ message: String, status: Int32) -> Int32 {
        StandardStreams.printError("coffer-portal-secret: \(message)")
        return status
    }
}
