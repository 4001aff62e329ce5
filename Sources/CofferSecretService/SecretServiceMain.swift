import CofferClient
import Glibc

/// `coffer-secret-service [--socket PATH] [--max-senders N] [--max-senders-per-process M] [--config FILE]`: the Secret Service front end's
/// command line. Exit statuses (coffer-secret-service(1)): 0 the bus connection ended, 1 the bus cannot be
/// reached or failed, 64 a usage error (an unreadable or invalid configuration file too), 69
/// `org.freedesktop.secrets` has another owner.
public enum SecretServiceMain {
    public static let usage = """
        usage: coffer-secret-service [--socket PATH] [--max-senders N] [--max-senders-per-process M] [--config FILE]
        Serves the freedesktop Secret Service API (org.freedesktop.secrets) on the session bus
        (DBUS_SESSION_BUS_ADDRESS) for the Coffer agent at PATH (default: $COFFER_SOCKET, else
        $XDG_RUNTIME_DIR/coffer/agent.sock). Collections (the session one in memory), items, searches,
        secrets and aliases are served; Unlock prompts through the agent's pinentry. At most N distinct senders (default
        \(SecretServiceFrontEnd.defaultMaxSenders)) are served at once, at most M (default
        \(SecretServiceFrontEnd.defaultMaxSendersPerProcess)) of one process; more are refused LimitsExceeded.
        FILE (default: $XDG_CONFIG_HOME/coffer/secret-service.conf when it exists) holds key = value lines:
        plain-sessions = allow serves the plain session algorithm, which sends secrets over the bus
        unencrypted (refused by default: clients use dh-ietf1024-sha256-aes128-cbc-pkcs7).
        """

    public static func run(_ arguments: [String]) -> Int32 {
        var socket: String?
        var maxSenders = SecretServiceFrontEnd.defaultMaxSenders
        var maxPerProcess = SecretServiceFrontEnd.defaultMaxSendersPerProcess
        var config: String?
        var rest = arguments[...]
        while let a = rest.popFirst() {
            switch a {
            case "--socket":
                guard let p = rest.popFirst(), !p.isEmpty else { return fail("--socket needs a path", status: 64) }
                socket = p
            case "--config":
                guard let p = rest.popFirst(), !p.isEmpty else { return fail("--config needs a file", status: 64) }
                config = p
            case "--max-senders":
                guard let n = rest.popFirst().flatMap({ Int($0) }), (1...65536).contains(n) else {
                    return fail("--max-senders needs a number from 1 to 65536", status: 64)
                }
                maxSenders = n
            case "--max-senders-per-process":
                guard let n = rest.popFirst().flatMap({ Int($0) }), (1...65536).contains(n) else {
                    return fail("--max-senders-per-process needs a number from 1 to 65536", status: 64)
                }
                maxPerProcess = n
            case "-h", "--help":
                print(usage)
                return 0
            default:
                return fail("unknown argument \(a)\n\(usage)", status: 64)
            }
        }
        let settings: SecretServiceSettings
        do { settings = try SecretServiceSettings.load(path: config ?? SecretServiceSettings.defaultPath(), required: config != nil) } catch {
            return fail(error.description, status: 64)
        }
        let frontEnd: SecretServiceFrontEnd
        do {
            frontEnd = try SecretServiceFrontEnd(socketPath: AgentConnection.socketPath(explicit: socket), maxSenders: maxSenders,
                                                 maxSendersPerProcess: maxPerProcess, settings: settings)
        } catch {
            return fail(error.description, status: error.exitStatus)
        }
        let r = frontEnd.run()
        guard r >= 0 else { return fail("the session bus failed: \(String(cString: strerror(-r)))", status: 1) }
        return 0
    }

    private static func fail(_ message: String, status: Int32) -> Int32 {
        let line = "coffer-secret-service: \(message)\n"
        _ = line.withCString { write(2, $0, strlen($0)) }
        return status
    }
}
