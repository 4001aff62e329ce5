/// The version of Coffer's programs, one constant for all: the agent reports it (HELLO_REPLY, which
/// `coffer status` prints as `agent:`) and the command-line tools print it for `--version`.
public enum CofferVersion {
    /// The release, e.g. `0.1.0`.
    public static let current = "0.1.0"
}
