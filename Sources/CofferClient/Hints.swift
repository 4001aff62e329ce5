import CofferModel
import CofferSystem
import Glibc

/// What a person can do next after an error (``CofferModel/SecError/hint``): how to start the agent.
/// Commands name `--socket` only when the socket is not the default one. (The `coffer unlock` hint
/// for a locked keychain is the CLI's: it asks the agent, which this library never does by itself.)
package enum Hints {
    /// ` --socket 'PATH'` when `path` is not the socket every command finds by itself.
    package static func socketOption(_ path: String) -> String {
        path == AgentConnection.socketPath() ? "" : " --socket " + shellWord(path)
    }

    /// `text` as one shell word to paste: as is when plain, else in single quotes, control
    /// characters escaped for the terminal (``CofferModel/TerminalSafeText/escaped(_:)``).
    static func shellWord(_ text: String) -> String {
        let plain = !text.isEmpty && text.unicodeScalars.allSatisfy { c in
            c.isASCII && (("a"..."z").contains(c) || ("A"..."Z").contains(c) || ("0"..."9").contains(c) || "/._-+,=:@%".unicodeScalars.contains(c))
        }
        if plain { return text }
        return "'" + TerminalSafeText.escaped(text) + "'"
    }

    /// Where systemd looks for user units (the install script writes /usr/lib/systemd/user).
    static let userUnitDirectories = ["/etc/systemd/user", "/usr/local/lib/systemd/user", "/usr/lib/systemd/user", "/lib/systemd/user"]

    /// True if the systemd user units are installed and systemd runs this machine: the agent is
    /// then started by `systemctl --user start coffer-agent.socket`.
    static var systemdUnitsInstalled: Bool {
        guard access("/run/systemd/system", F_OK) == 0 else { return false }
        let home = ThisProcess.environment(["XDG_CONFIG_HOME", "HOME"])
        let own = home["XDG_CONFIG_HOME"] ?? home["HOME"].map { $0 + "/.config" }
        return ((own.map { [$0 + "/systemd/user"] } ?? []) + userUnitDirectories).contains { access($0 + "/coffer-agent.socket", F_OK) == 0 }
    }

    /// For a socket nobody answers on: why (`errno` of `connect`), and, when no agent is there
    /// (no socket, or one nothing listens on), how to start it.
    static func unreachable(socket path: String, errno e: Int32) -> (reason: String, hint: String?) {
        let reason: String
        switch e {
        case ENOENT: reason = "the socket does not exist (no agent is running)"
        case ECONNREFUSED: reason = "connection refused (the socket is there but no agent listens on it: it stopped)"
        default: return (String(cString: strerror(e)), nil)
        }
        let start = socketOption(path).isEmpty && systemdUnitsInstalled
            ? "systemctl --user start coffer-agent.socket"
            : "cofferd" + socketOption(path)
        return (reason, "start the agent with: " + start)
    }
}
