// cofferd: the per-user Coffer agent. A thin wrapper over CofferAgent.
import ArgumentParser
import CofferAgent
import CofferKeybag
import Glibc

struct Cofferd: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cofferd",
        abstract: "The per-user Coffer agent: serves the keychain over a Unix socket.",
        discussion: """
            Listens on $XDG_RUNTIME_DIR/coffer/agent.sock (or the socket systemd passes). Passcodes are \
            verified through PAM before the keybag is unwrapped. SIGUSR1 locks after the grace period; \
            SIGTERM wipes keys and exits.
            """)

    @Flag(help: "Stay in the foreground (default when started by systemd).")
    var foreground = false

    @Option(help: "Listening socket path.")
    var socket: String?

    @Option(name: .customLong("ssh-agent-socket"),
            help: "ssh-agent socket path, or 'none' (default: ssh-agent.sock beside the socket).")
    var sshAgentSocket: String?

    @Option(name: .customLong("state-dir"), help: "State directory (default $XDG_DATA_HOME/coffer).")
    var stateDir: String?

    @Option(name: .customLong("pam-service"), help: "PAM service that verifies passcodes.")
    var pamService: String?

    @Option(name: .customLong("pam-confdir"), help: "Private PAM configuration directory (pam_start_confdir).")
    var pamConfdir: String?

    @Option(help: "Configuration file (key = value lines; default $XDG_CONFIG_HOME/coffer/cofferd.conf when it exists).")
    var config: String?

    @Option(name: .customLong("idle-lock"), help: "Lock after this many idle seconds (0: never).")
    var idleLock: UInt32?

    @Option(name: .customLong("lock-grace"), help: "Seconds between the will-lock event and the lock (default 10).")
    var lockGrace: Double?

    @Option(name: .customLong("kdf-ops"), help: .hidden)
    var kdfOps: UInt64?

    @Option(name: .customLong("migrate-device-key"),
            help: "Move the keychain's device key (agent stopped; passcode on stdin): 'tpm' (what 'coffer device-key migrate --to tpm' runs).")
    var migrateDeviceKey: String?

    @Option(name: .customLong("tpm-tcti"), help: "The TPM's TCTI string (config key tpm-tcti; default device:/dev/tpmrm0).")
    var tpmTCTI: String?

    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error, critical.")
    var logLevel: String = "info"

    func run() throws {
        var cfg: AgentConfiguration
        do {
            cfg = try AgentConfiguration.defaults()
            // Without --config, the user's own file when there is one (cofferd(8), FILES): the PAM
            // module's agent= line and the systemd unit need nothing extra.
            if let path = config ?? AgentConfiguration.defaultConfigPath().flatMap({ access($0, F_OK) == 0 ? $0 : nil }) {
                try cfg.apply(configFileAt: path)
            }
        } catch {
            throw ValidationError(error.description)
        }
        if let socket { cfg.socketPath = socket }
        if let sshAgentSocket {
            do { cfg.sshAgentSocket = try SSHAgentSocket(sshAgentSocket, where: "--ssh-agent-socket") } catch {
                throw ValidationError(error.description)
            }
        }
        if let stateDir { cfg.stateDirectory = stateDir }
        if let pamService { cfg.pamService = pamService }
        if let pamConfdir { cfg.pamConfdir = pamConfdir }
        if let idleLock { cfg.idleLockSeconds = idleLock }
        if let lockGrace { cfg.lockGraceSeconds = lockGrace }
        if let tpmTCTI { cfg.tpmTCTI = tpmTCTI }
        if let kdfOps { cfg.kdfPolicy = .fixed(KDFParameters(opsLimit: kdfOps, memLimit: KDFParameters.floorMemory)) }
        if let migrateDeviceKey {
            guard migrateDeviceKey == "tpm" else { throw ValidationError("--migrate-device-key: only 'tpm' (a TPM keychain does not move back to a file key)") }
            throw ExitCode(AgentMain.migrateDeviceKey(configuration: cfg))
        }
        let underSystemd = getenv("LISTEN_FDS") != nil || getenv("NOTIFY_SOCKET") != nil
        let code = AgentMain.run(configuration: cfg, daemonize: !foreground && !underSystemd, logLevel: logLevel)
        throw ExitCode(code)
    }
}

Cofferd.main()
