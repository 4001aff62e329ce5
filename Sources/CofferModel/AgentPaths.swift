/// Where the agent's socket is, worked out in one place for the client, the CLI and the agent.
///
/// `pam_coffer.c` resolves the same way in C (`resolve_socket`: `$XDG_RUNTIME_DIR`, else
/// `/run/user/UID`).
public enum AgentPaths {
    /// The agent's configuration file when no `--config` is given: `$XDG_CONFIG_HOME/coffer/cofferd.conf`
    /// (an absolute `XDG_CONFIG_HOME` only, as XDG says), else `HOME/.config/coffer/cofferd.conf`; nil
    /// when neither is known. The agent reads it; `coffer manifest list` reads its trust keys.
    public static func agentConfigFile(environment: [String: String], home: String?) -> String? {
        if let x = environment["XDG_CONFIG_HOME"], x.hasPrefix("/") { return x + "/coffer/cofferd.conf" }
        return home.map { $0 + "/.config/coffer/cofferd.conf" }
    }

    /// The socket path: `explicit` if given (and not empty), else `$COFFER_SOCKET`, else
    /// `$XDG_RUNTIME_DIR/coffer/agent.sock`, else `/run/user/UID/coffer/agent.sock` (systemd-logind's
    /// runtime directory, which is what `XDG_RUNTIME_DIR` points to in a login session). Empty
    /// variables count as unset. Pure: the caller passes the environment and the uid, so a client
    /// started from cron or sudo (no `XDG_RUNTIME_DIR`) finds the same agent a login session started.
    public static func defaultSocket(explicit: String? = nil, environment: [String: String], uid: UInt32) -> String {
        if let explicit, !explicit.isEmpty { return explicit }
        if let s = environment["COFFER_SOCKET"], !s.isEmpty { return s }
        return runtimeDirectory(environment: environment, uid: uid) + "/coffer/agent.sock"
    }

    /// `$XDG_RUNTIME_DIR` if set and not empty, else `/run/user/UID`.
    public static func runtimeDirectory(environment: [String: String], uid: UInt32) -> String {
        if let r = environment["XDG_RUNTIME_DIR"], !r.isEmpty { return r }
        return "/run/user/\(uid)"
    }
}
