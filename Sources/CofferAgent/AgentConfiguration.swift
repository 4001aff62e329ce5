import CofferAudit
package import CofferKeybag
import CofferModel
package import CofferPolicy
package import CofferPrompt
package import CofferService
package import CofferTrust
import CofferSystem
import Glibc

/// Everything `cofferd` is told at start (flags, config file, defaults).
package struct AgentConfiguration: Sendable {
    /// The listening socket's path (created unless systemd passes one).
    package var socketPath: String
    /// The ssh-agent socket (config key `ssh-agent-socket`, flag `--ssh-agent-socket`; `none` turns it off).
    package var sshAgentSocket: SSHAgentSocket = .besideNativeSocket
    /// The FIDO middlewares an `ssh-add` key may name (config key `ssh-allowed-providers`, OpenSSH
    /// ssh-agent's `-P`): comma-separated `*`/`?` patterns, `!` excluding, matched against the
    /// middleware's resolved path; OpenSSH's default. `internal` is always accepted by the allow-list.
    package var sshAllowedProviders: String = "/usr/lib*/*,/usr/local/lib*/*"
    /// Where the keybag, device key and database live (mode 0700).
    package var stateDirectory: String
    /// The PAM service that verifies passcodes.
    package var pamService: String = "coffer"
    /// A private PAM configuration directory (`pam_start_confdir`), for tests and sandboxes.
    package var pamConfdir: String? = nil
    /// Lock after this many seconds without a request (0: never).
    package var idleLockSeconds: UInt32 = 0
    /// How long subscribers are warned before an idle or session lock wipes WhenUnlocked keys.
    package var lockGraceSeconds: Double = 10
    /// Most simultaneous client connections: above the Secret Service front end's 256 senders (each
    /// a delegated connection), so that native clients are served while it is full.
    package var maxConnections: Int = 1024
    /// Most simultaneous connections from one client process (peer pid; for a delegated connection,
    /// the process it acts for, from its DELEGATE on). Connections whose peer pid
    /// cannot be read (SO_PEERCRED gives pid 0 for a process in another pid namespace) share one
    /// allowance of this size.
    package var maxConnectionsPerProcess: Int = 128
    /// Seconds a connection may take to start its HELLO (config key `hello-timeout`).
    package var helloTimeoutSeconds: Double = 5
    /// Seconds a frame may take to arrive in full, from its first byte (config key `frame-deadline`).
    package var frameDeadlineSeconds: Double = 10
    /// At most one log line per kind of refused or dropped connection per this many seconds; the
    /// next line says how many were left out (config key `log-repeat-interval`).
    package var logRepeatSeconds: Double = 10
    /// A daemonised agent's log (`cofferd.log` in the state directory) is rotated when a line would
    /// take it past this many bytes (config key `log-max-bytes`, at least 4096; default 1 MiB).
    package var logMaximumBytes = 1 << 20
    /// How many rotated logs are kept, `cofferd.log.1` (newest) to `cofferd.log.N` (config key
    /// `log-keep`, 0 to 100; default 3): with the current one, at most N + 1 files of
    /// ``logMaximumBytes`` each.
    package var logKeep = 3
    /// Where the device key lives (config key `device-key`: `file`, the default, or `tpm`).
    package var deviceKey: DeviceKeyKind = .file
    /// The TPM's TCTI configuration string (config key `tpm-tcti`; default `device:/dev/tpmrm0`, the
    /// kernel's resource manager; `swtpm:host=127.0.0.1,port=2321` for a software TPM).
    package var tpmTCTI: String = TPMDeviceKey.defaultTCTI
    /// Argon2id policy for passcode set (calibrated by default).
    package var kdfPolicy: KDFPolicy = .standard
    /// The user whose agent this is (for PAM).
    package var userName: String
    /// What callers get from their identity (config keys `unsigned-callers`, `flatpak-callers`,
    /// `shell-app`, `authorization-reuse`).
    package var policy = AccessPolicy()
    /// Where signer keys and manifests are read (config keys `user-trusted-keys`, `standard-trust-dirs`,
    /// `trusted-keys-dir` and `manifests-dir`, repeatable: ``TrustSettings``).
    package var trust = TrustSettings()
    /// Identify callers (config key `identify-callers`; `no` makes every caller unsigned without
    /// examining it: only for measuring what identification costs, see contrib/bench).
    package var identifyCallers = true
    /// Delays of failed passcode attempts and the optional erase (config keys `unlock-delays`, a
    /// comma-separated list of seconds after the 1st, 2nd … failure in a row, and `erase-after`,
    /// `off`, `on` (10) or a number).
    package var attemptSchedule = AttemptSchedule.standard
    /// Seconds a person has to authenticate for a protected item before the request fails
    /// (config key `authentication-timeout`).
    package var authenticationTimeoutSeconds: Double = 120
    /// More directories of authenticator plugins (`*.so`) for the plugin host (config key `plugin-dir`,
    /// repeatable; owned by root or the user), besides ``systemPluginDirectory``.
    package var pluginDirectories: [String] = []
    /// The system's plugins (root-owned, like everything in it, or nothing there is loaded).
    package static let systemPluginDirectory = "/usr/local/lib/coffer/plugins"
    /// The plugin that serves biometry, e.g. `biometric-emulator` (config key `biometry`; `none`, the
    /// default, means no biometry).
    package var biometryPlugin: String? = nil
    /// The plugin host executable (config key `plugin-host`; default: `coffer-plugin-host` beside cofferd).
    package var pluginHost: String? = nil
    /// The pinentry the agent's own prompter runs for callers that cannot prompt themselves (config
    /// key `pinentry`: an absolute path, `none`, or `auto`, the default: the first graphical pinentry
    /// installed in the system's directories, ``PinentryChoice``). Without one, such a request fails
    /// with errSecInteractionNotAllowed. See ``AgentPromptChannel``.
    package var pinentry: PinentryChoice.Setting = .automatic
    /// Where the default search looks, and the owner a candidate must have (tests only: a private
    /// directory; the configuration file cannot set them).
    package var pinentrySearch: (directories: [String], owner: UInt32) = (PinentryChoice.systemDirectories, 0)

    /// The pinentry this configuration chooses on this machine now, and why.
    package var pinentryChoice: PinentryChoice {
        PinentryChoice.resolve(pinentry, directories: pinentrySearch.directories, trustedOwner: pinentrySearch.owner)
    }
    /// The display the agent's own dialogs appear on (config key `prompt-display`: an X11 display
    /// such as `:0`, or a Wayland socket such as `wayland-0`), for a machine without systemd-logind;
    /// nil, the default: the person's active, local, graphical login session as logind reports it,
    /// and no agent-side dialog without one. See ``AgentPromptChannel/promptDisplay(_:loginctl:)``.
    package var promptDisplay: PromptDisplay? = nil
    /// Where passcodes are checked (config key `passcode-verifier`): `agent` (PAM in the agent, the
    /// default) or `plugin` (the `passcode` plugin runs PAM in the plugin host, so no PAM module is
    /// ever loaded into the agent).
    package var passcodeInPlugin = false
    /// Write the audit log (`audit.log` in the state directory; config key `audit`).
    package var auditLog = true
    /// Rotate the audit log past this many bytes (config key `audit-max-bytes`).
    package var auditMaximumBytes = 4 << 20
    /// Rollback detection (config key `rollback-detection`, `on` or `off`, the default): the keychain is
    /// anchored to a TPM NV counter (the RollbackAnchor article) reached through ``rollbackTCTI``.
    package var rollbackDetection = false
    /// The TCTI of the rollback counter's TPM (config key `rollback-tcti`; default: the device key's
    /// ``tpmTCTI``, itself `device:/dev/tpmrm0` by default), so one TPM setting serves both.
    package var rollbackTCTI: String {
        get { givenRollbackTCTI ?? tpmTCTI }
        set { givenRollbackTCTI = newValue }
    }
    /// `rollback-tcti` as given (nil: the default above).
    package var givenRollbackTCTI: String? = nil
    /// The NV index of the rollback counter (config key `rollback-nv-index`, e.g. `0x0100C0FF`, the
    /// default): one per keychain, so users sharing a TPM each set their own.
    package var rollbackNVIndex: UInt32 = 0x0100_C0FF
    /// Item writes are anchored at most this often, in seconds, and at every lock (config key
    /// `rollback-interval`, default 60): the window in which putting back an earlier keychain.db goes unseen.
    package var rollbackInterval: Double = 60
    /// Keychain sync (issue #29): config keys `sync-interval` (seconds between background pulls,
    /// default 300), `sync-push-delay` (seconds a push waits to collect writes, default 2),
    /// `sync-retry` (seconds before trying again after a failure, default 30), `sync-compact-interval`
    /// (seconds between compactions, default 86400), `sync-pairing-poll` (seconds between pulls while a
    /// pairing runs, default 2), `sync-pairing-timeout` (seconds an approval waits for the joining
    /// machine's confirmation, default 120) and `sync-git` (the git program; default `git` in `PATH`).
    package var sync = SyncService.Settings()

    /// Where the trust store looks for keys and manifests.
    package var trustConfiguration: TrustConfiguration { trust.configuration }

    /// Defaults for the current user: the socket where clients look for it
    /// (``CofferModel/AgentPaths/defaultSocket(explicit:environment:uid:)``: `$COFFER_SOCKET`, else
    /// `$XDG_RUNTIME_DIR/coffer/agent.sock`, else `/run/user/UID/coffer/agent.sock`) and `$XDG_DATA_HOME/coffer`.
    package static func defaults() throws(AgentError) -> AgentConfiguration {
        guard let pw = getpwuid(getuid()), let name = pw.pointee.pw_name, let home = pw.pointee.pw_dir else {
            throw AgentError("cannot find the current user in the password database")
        }
        let user = String(cString: name)
        let env = { (k: String) in getenv(k).map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 } }
        let socket = AgentPaths.defaultSocket(environment: ThisProcess.environment(["COFFER_SOCKET", "XDG_RUNTIME_DIR"]),
                                              uid: getuid())
        let data = env("XDG_DATA_HOME") ?? (String(cString: home) + "/.local/share")
        return AgentConfiguration(socketPath: socket, stateDirectory: data + "/coffer", userName: user)
    }

    /// Every key a config file may set (``apply(configFile:name:)``).
    package static let configurationKeys = [
        "socket", "ssh-agent-socket", "ssh-allowed-providers", "state-dir", "pam-service", "pam-confdir", "idle-lock", "lock-grace", "max-connections",
        "max-connections-per-process", "hello-timeout", "frame-deadline", "log-repeat-interval", "log-max-bytes", "log-keep",
        "unsigned-callers", "flatpak-callers", "shell-app", "authorization-reuse", "user-trusted-keys", "standard-trust-dirs",
        "trusted-keys-dir", "manifests-dir", "audit", "rollback-detection", "rollback-tcti", "rollback-nv-index", "rollback-interval",
        "identify-callers", "authentication-timeout", "unlock-delays", "erase-after", "plugin-dir", "biometry", "passcode-verifier",
        "plugin-host", "pinentry", "prompt-display", "device-key", "tpm-tcti", "sync-interval", "sync-push-delay", "sync-retry",
        "sync-pairing-poll", "sync-pairing-timeout", "sync-compact-interval", "sync-git", "audit-max-bytes",
    ]

    /// The config file the agent reads when no `--config` is given: `$XDG_CONFIG_HOME/coffer/cofferd.conf`,
    /// else `~/.config/coffer/cofferd.conf` (`home`: the user's home directory); nil when neither is set.
    package static func defaultConfigPath(environment: [String: String], home: String?) -> String? {
        AgentPaths.agentConfigFile(environment: environment, home: home)
    }

    /// ``defaultConfigPath(environment:home:)`` for this process and user.
    package static func defaultConfigPath() -> String? {
        let home = getpwuid(getuid()).flatMap { $0.pointee.pw_dir.map { String(cString: $0) } }
        return defaultConfigPath(environment: ThisProcess.environment(["XDG_CONFIG_HOME"]), home: home)
    }

    /// Reads and applies the config file at `path`.
    package mutating func apply(configFileAt path: String) throws(AgentError) {
        let bytes: [UInt8]
        do { bytes = try Files.read(path, maxBytes: 64 * 1024) } catch { throw AgentError("config file: \(error)") }
        try apply(configFile: String(decoding: bytes, as: UTF8.self), name: path)
    }

    /// Applies `key = value` lines from a config file (`#` comments). Keys: socket, ssh-agent-socket,
    /// ssh-allowed-providers, state-dir,
    /// pam-service, pam-confdir, idle-lock, lock-grace, max-connections, max-connections-per-process,
    /// hello-timeout, frame-deadline, log-repeat-interval (the last three mostly for tests), log-max-bytes, log-keep;
    /// unsigned-callers (`unsigned` or `deny`), flatpak-callers (`allow` or `deny`; unset: `deny` when
    /// unsigned callers are denied), shell-app (an app id, or `none`), authorization-reuse
    /// (seconds), user-trusted-keys and standard-trust-dirs (`yes`/`no`), trusted-keys-dir and
    /// manifests-dir (repeatable), audit (`yes`/`no`), audit-max-bytes, device-key (`file` or `tpm`), tpm-tcti;
    /// sync-interval, sync-push-delay, sync-retry, sync-compact-interval, sync-pairing-poll,
    /// sync-pairing-timeout, sync-git (keychain sync).
    package mutating func apply(configFile text: String, name: String) throws(AgentError) {
        for (n, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
            let trimmed = line.trimmingCharacters()
            if trimmed.isEmpty { continue }
            guard let eq = trimmed.firstIndex(of: "=") else { throw AgentError("\(name):\(n + 1): expected key = value") }
            let key = String(trimmed[..<eq]).trimmingCharacters()
            let value = String(trimmed[trimmed.index(after: eq)...]).trimmingCharacters()
            func number<T: LosslessStringConvertible>(_: T.Type) throws(AgentError) -> T {
                guard let v = T(value) else { throw AgentError("\(name):\(n + 1): '\(key)' needs a number") }
                return v
            }
            func yesNo() throws(AgentError) -> Bool {
                switch value {
                case "yes", "true", "1": return true
                case "no", "false", "0": return false
                default: throw AgentError("\(name):\(n + 1): '\(key)' is 'yes' or 'no'")
                }
            }
            func positive() throws(AgentError) -> Double {
                let v = try number(Double.self)
                guard v > 0 else { throw AgentError("\(name):\(n + 1): '\(key)' must be more than 0") }
                return v
            }
            switch key {
            case "socket": socketPath = value
            case "ssh-agent-socket": sshAgentSocket = try SSHAgentSocket(value, where: "\(name):\(n + 1)")
            case "ssh-allowed-providers":
                guard !value.isEmpty else { throw AgentError("\(name):\(n + 1): 'ssh-allowed-providers' needs patterns (e.g. /usr/lib*/*)") }
                sshAllowedProviders = value
            case "state-dir": stateDirectory = value
            case "pam-service": pamService = value
            case "pam-confdir": pamConfdir = value
            case "idle-lock": idleLockSeconds = try number(UInt32.self)
            case "lock-grace": lockGraceSeconds = try number(Double.self)
            case "max-connections": maxConnections = try number(Int.self)
            case "max-connections-per-process": maxConnectionsPerProcess = try number(Int.self)
            case "hello-timeout": helloTimeoutSeconds = try positive()
            case "frame-deadline": frameDeadlineSeconds = try positive()
            case "log-repeat-interval": logRepeatSeconds = try number(Double.self)
            case "log-max-bytes":
                let v = try number(Int.self)
                guard v >= 4096 else { throw AgentError("\(name):\(n + 1): 'log-max-bytes' must be at least 4096") }
                logMaximumBytes = v
            case "log-keep":
                let v = try number(Int.self)
                guard (0...100).contains(v) else { throw AgentError("\(name):\(n + 1): 'log-keep' is 0 to 100 files") }
                logKeep = v
            case "unsigned-callers":
                guard let v = AccessPolicy.UnsignedCallers(rawValue: value) else {
                    throw AgentError("\(name):\(n + 1): 'unsigned-callers' is 'unsigned' or 'deny'")
                }
                policy.unsignedCallers = v
            case "flatpak-callers":
                guard let v = AccessPolicy.FlatpakCallers(rawValue: value) else {
                    throw AgentError("\(name):\(n + 1): 'flatpak-callers' is 'allow' or 'deny'")
                }
                policy.flatpakCallers = v
            case "shell-app":
                guard !value.isEmpty else { throw AgentError("\(name):\(n + 1): 'shell-app' needs an app id or 'none'") }
                policy.shellAppID = value == "none" ? nil : value
            case "authorization-reuse":
                let v = try number(Double.self)
                guard v >= 0, v <= 3600 else { throw AgentError("\(name):\(n + 1): 'authorization-reuse' is 0 to 3600 seconds") }
                policy.authorizationReuseSeconds = v
            case _ where TrustSettings.keys.contains(key):
                if case .failure(let e) = trust.apply(key: key, value: value) { throw AgentError("\(name):\(n + 1): \(e.message)") }
            case "audit": auditLog = try yesNo()
            case "rollback-detection":
                switch value {
                case "on": rollbackDetection = true
                case "off": rollbackDetection = false
                default: throw AgentError("\(name):\(n + 1): rollback-detection is on or off")
                }
            case "rollback-tcti":
                guard !value.isEmpty else { throw AgentError("\(name):\(n + 1): rollback-tcti needs a TCTI (device:/dev/tpmrm0, swtpm:host=…,port=…)") }
                rollbackTCTI = value
            case "rollback-nv-index":
                let digits = value.lowercased().hasPrefix("0x") ? String(value.dropFirst(2)) : value
                guard let index = UInt32(digits, radix: 16), index >> 24 == 0x01 else {
                    throw AgentError("\(name):\(n + 1): rollback-nv-index is an NV index in hex, 0x01000000–0x01FFFFFF")
                }
                rollbackNVIndex = index
            case "rollback-interval": rollbackInterval = try positive()
            case "identify-callers": identifyCallers = try yesNo()
            case "authentication-timeout": authenticationTimeoutSeconds = try positive()
            case "unlock-delays":
                let parts = value.split(separator: ",").map { Double(String($0).trimmingCharacters()) }
                guard !parts.isEmpty, parts.allSatisfy({ $0 != nil && $0! >= 0 && $0! <= 86_400 }) else {
                    throw AgentError("\(name):\(n + 1): 'unlock-delays' is a comma-separated list of seconds (0 to 86400)")
                }
                attemptSchedule.delays = parts.map { $0! }
            case "erase-after":
                switch value {
                case "off": attemptSchedule.eraseAfter = nil
                case "on": attemptSchedule.eraseAfter = AttemptSchedule.defaultEraseAfter
                default:
                    guard let n = Int(value), n >= 1 else { throw AgentError("\(name):\(n + 1): 'erase-after' is off, on or a number of failures") }
                    attemptSchedule.eraseAfter = n
                }
            case "plugin-dir":
                guard value.hasPrefix("/") else { throw AgentError("\(name):\(n + 1): 'plugin-dir' needs an absolute path") }
                pluginDirectories.append(value)
            case "biometry": biometryPlugin = value == "none" ? nil : value
            case "passcode-verifier":
                guard value == "agent" || value == "plugin" else { throw AgentError("\(name):\(n + 1): 'passcode-verifier' is 'agent' or 'plugin'") }
                passcodeInPlugin = value == "plugin"
            case "plugin-host":
                guard value.hasPrefix("/") else { throw AgentError("\(name):\(n + 1): 'plugin-host' needs an absolute path") }
                pluginHost = value
            case "pinentry":
                switch value {
                case "auto": pinentry = .automatic
                case "none": pinentry = .none
                default:
                    guard value.hasPrefix("/") else { throw AgentError("\(name):\(n + 1): 'pinentry' is an absolute path, auto or none") }
                    pinentry = .program(value)
                }
            case "prompt-display":
                guard let display = PromptDisplay(configured: value) else {
                    throw AgentError("\(name):\(n + 1): 'prompt-display' is an X11 display (:0) or a Wayland socket (wayland-0, or an absolute path)")
                }
                promptDisplay = display
            case "device-key":
                guard let v = DeviceKeyKind(rawValue: value) else { throw AgentError("\(name):\(n + 1): 'device-key' is 'file' or 'tpm'") }
                deviceKey = v
            case "tpm-tcti":
                guard !value.isEmpty, value.utf8.count <= 256 else { throw AgentError("\(name):\(n + 1): 'tpm-tcti' needs a TCTI string (e.g. device:/dev/tpmrm0)") }
                tpmTCTI = value
            case "sync-interval": sync.intervalSeconds = try positive()
            case "sync-push-delay": sync.pushDelaySeconds = try positive()
            case "sync-retry": sync.retrySeconds = try positive()
            case "sync-pairing-poll": sync.pairingPollSeconds = try positive()
            case "sync-pairing-timeout": sync.pairingTimeoutSeconds = try positive()
            case "sync-compact-interval": sync.compactIntervalSeconds = try positive()
            case "sync-git":
                guard value.hasPrefix("/") else { throw AgentError("\(name):\(n + 1): 'sync-git' needs an absolute path") }
                sync.git = value
            case "audit-max-bytes":
                let v = try number(Int.self)
                guard v >= 4096 else { throw AgentError("\(name):\(n + 1): 'audit-max-bytes' must be at least 4096") }
                auditMaximumBytes = v
            default:
                // Named escaped (a config file's bytes), with the nearest key this agent knows.
                let hint = Spelling.nearest(key, among: Self.configurationKeys).map { "; did you mean '\($0)'?" }
                    ?? " (the keys are in cofferd(8))"
                throw AgentError("\(name):\(n + 1): unknown key '\(TerminalSafeText.escaped(key))'\(hint)")
            }
        }
    }
}

extension AgentConfiguration {
    /// The device key source the configuration chooses (nil: the keychain's default, the file key).
    package var deviceKeySource: DeviceKeySource? {
        deviceKey == .tpm ? TPMDeviceKey(path: stateDirectory + "/" + TPMDeviceKey.fileName, tcti: tpmTCTI, keepsConnection: true) : nil
    }
}

/// Where the ssh-agent front end listens (issue #27).
package enum SSHAgentSocket: Sendable, Equatable {
    /// `ssh-agent.sock` in the native socket's directory (the default).
    case besideNativeSocket
    case path(String)
    /// `none`: no ssh-agent socket.
    case disabled

    /// The file name of the default socket.
    package static let defaultName = "ssh-agent.sock"

    /// Parses a setting: `none` or a path (`where` names it in the error).
    package init(_ value: String, where place: String) throws(AgentError) {
        if value == "none" { self = .disabled; return }
        guard !value.isEmpty else { throw AgentError("\(place): 'ssh-agent-socket' needs a path or 'none'") }
        self = .path(value)
    }
}

extension AgentConfiguration {
    /// The ssh-agent socket's path; nil when it is turned off.
    package var sshAgentSocketPath: String? { sshAgentSocketPath(beside: socketPath) }

    /// The ssh-agent socket's path when the native socket is at `nativeSocket` (under socket
    /// activation: where systemd bound it); nil when it is turned off.
    package func sshAgentSocketPath(beside nativeSocket: String) -> String? {
        switch sshAgentSocket {
        case .besideNativeSocket: Files.directoryName(nativeSocket) + "/" + SSHAgentSocket.defaultName
        case .path(let p): p
        case .disabled: nil
        }
    }
}

/// A start-up or configuration failure of the agent (not a request error).
package struct AgentError: Error, CustomStringConvertible, Sendable {
    /// What went wrong.
    package let description: String
    /// Makes an error.
    package init(_ description: String) { self.description = description }
}

extension String {
    func trimmingCharacters() -> String {
        var s = Substring(self)
        while let f = s.first, f == " " || f == "\t" || f == "\r" { s.removeFirst() }
        while let l = s.last, l == " " || l == "\t" || l == "\r" { s.removeLast() }
        return String(s)
    }
}

extension AgentConfiguration {
    /// What the service core is made with (``KeychainService/compose(keychain:verifier:sensor:settings:clock:wallClock:logger:sessionIsLive:onEvent:onErase:)``).
    var serviceSettings: ServiceSettings {
        var s = ServiceSettings(policy: policy,
                                audit: auditLog ? AuditLog(directory: stateDirectory, maximumBytes: auditMaximumBytes) : nil,
                                userName: userName, kdfPolicy: kdfPolicy)
        s.attemptSchedule = attemptSchedule
        s.attemptsFile = stateDirectory + "/attempts"
        s.idleLockSeconds = idleLockSeconds
        s.lockGraceSeconds = lockGraceSeconds
        s.authenticationTimeoutSeconds = authenticationTimeoutSeconds
        s.agentVersion = Agent.version
        return s
    }
}
