import CofferAgentPrompt
import CofferCrypto
import CofferIdentity
import CofferKeybag
import CofferKeychain
import CofferManifest
import CofferModel
import CofferNativeFrontEnd
import CofferPAM
import CofferPluginClient
import CofferPluginProtocol
import CofferPrompt
import CofferSSHAgentFrontEnd
package import CofferService
import CofferSocketServer
import CofferSystem
import CofferTrust
import Glibc
package import Logging

/// The agent: one service core (keychain, lock state, audit log) served on N listeners, each a
/// ``SocketServer`` with its front end (the native protocol's ``NativeFrontEnd`` on the agent's
/// socket); identifies each connection's caller once, runs the lock timer, and shuts down.
///
/// Concurrency model: one thread per connection doing blocking I/O. A request that waits (PAM,
/// Argon2id, another connection's passcode attempt, a person authenticating; the attempt schedule
/// refuses an early attempt at once and never waits it out) holds only its own
/// connection's thread; the keychain serialises its short critical sections internally. The
/// threads, the locks and their order are described in the ConcurrencyModel article.
package final class Agent: Sendable {
    /// The agent's version, reported in HELLO and STATUS replies.
    package static let version = CofferVersion.current

    let configuration: AgentConfiguration
    let keychain: Keychain
    let logger: Logger
    /// Locked memory shared by large incoming frames.
    let frameBudget = FrameBudget.standard()
    /// Open connections, per-process counts, requests in flight, and the stopping flag.
    let registry: ConnectionRegistry
    let schedule: LockSchedule
    let pipeline: Pipeline
    /// The keychain sync and its background worker.
    let sync: SyncService
    /// Protected directories (issue #45): their keys added and removed with the lock state.
    let files: FileProtectionService
    /// The trust roots and manifests (reloaded on SIGHUP).
    let trust: TrustStore
    /// Connection → caller identity.
    let resolver: IdentityResolver
    /// The biometric sensor in the plugin host, if one is configured.
    let sensor: PluginBiometricSensor?
    /// The plugin host, when biometry or the passcode is served by a plugin.
    let pluginHost: PluginHost?
    /// Keys added with `ssh-add`, in memory only (every ssh-agent connection shares them).
    let sshKeys = SSHAgentKeyStore()

    /// Starts the plugin host with the configured plugin directories, if biometry or the passcode is
    /// served by a plugin. A host that cannot start is logged (biometry is then unavailable; a
    /// plugin passcode verifier then refuses every passcode, which is what it can vouch for).
    static func startPluginHost(_ configuration: AgentConfiguration, logger: Logger) -> PluginHost? {
        guard configuration.biometryPlugin != nil || configuration.passcodeInPlugin else { return nil }
        let executable = configuration.pluginHost ?? ThisProcess.executablePath().map { Files.directoryName($0) + "/coffer-plugin-host" }
        guard let executable else {
            logger.error("plugins: cannot find coffer-plugin-host (set plugin-host)")
            return nil
        }
        var hostConfig = PluginHost.Configuration(executable: executable, pluginDirectories: configuration.pluginDirectories,
                                                  stateDirectory: configuration.stateDirectory + "/plugins")
        // The system's plugins: root's directory, root's files (a missing directory is simply empty).
        hostConfig.systemPluginDirectories = [AgentConfiguration.systemPluginDirectory].filter { Files.exists($0) }
        hostConfig.logFile = configuration.stateDirectory + "/plugin-host.log"
        // What the passcode plugin needs to run PAM as the agent would; nothing else of the agent's environment.
        hostConfig.environment = ["COFFER_PAM_USER=\(configuration.userName)", "COFFER_PAM_SERVICE=\(configuration.pamService)"]
            + (configuration.pamConfdir.map { ["COFFER_PAM_CONFDIR=\($0)"] } ?? [])
        do {
            try Files.makePrivateDirectory(configuration.stateDirectory + "/plugins")
            let host = try PluginHost(hostConfig)
            for r in host.refused { logger.warning("plugin refused", metadata: ["file": "\(r.file)", "reason": "\(r.reason)"]) }
            logger.info("plugin host started", metadata: ["plugins": "\(host.plugins.map(\.name))", "pid": "\(host.pid ?? 0)"])
            return host
        } catch {
            logger.error("plugins: the plugin host did not start", metadata: ["error": "\(error)"])
            return nil
        }
    }

    /// The biometric sensor the configuration names, in `host`.
    static func biometricSensor(_ configuration: AgentConfiguration, host: PluginHost?, logger: Logger) -> PluginBiometricSensor? {
        guard let plugin = configuration.biometryPlugin, let host else { return nil }
        if !host.plugins.contains(where: { $0.name == plugin }) {
            logger.error("biometry: no plugin named \(plugin) was loaded", metadata: ["loaded": "\(host.plugins.map(\.name))"])
        }
        return PluginBiometricSensor(host: host, plugin: plugin, logger: logger)
    }

    /// The listeners this agent serves (the native socket; more front ends each add theirs), all on
    /// one keychain, one lock state and one audit log, with one connection registry and frame budget.
    private let servers = Protected([SocketServer]())
    /// Socket files this agent made (removed at shutdown; not systemd's).
    private let ownedSocketPaths = Protected([String]())
    private let started = Protected(false)
    /// Keeps repeated refusals from growing the log without bound.
    private let refusals: RefusalLog

    /// Opens the keychain and the listening socket (or adopts systemd's). The in-process tests give
    /// their own passcode `verifier` and biometric `sensor`; `cofferd` takes the configuration's (PAM or
    /// the passcode plugin, the biometry plugin).
    package init(configuration: AgentConfiguration, logger: Logger, verifier given: (any PasscodeVerifier)? = nil,
                 sensor givenSensor: (any BiometricSensor)? = nil) throws {
        self.configuration = configuration
        self.logger = logger
        let refusals = RefusalLog(logger: logger, throttle: LogThrottle(interval: configuration.logRepeatSeconds))
        self.refusals = refusals
        do {
            try Files.makePrivateDirectory(configuration.stateDirectory)
        } catch {
            throw AgentError("state directory: \(error)")
        }
        let rollbackCounter = configuration.rollbackDetection
            ? TPMRollbackCounter(tcti: configuration.rollbackTCTI, index: configuration.rollbackNVIndex) : nil
        keychain = try Keychain(directory: configuration.stateDirectory, deviceKey: configuration.deviceKeySource,
                                applicationPasswordDelays: configuration.attemptSchedule.delays,
                                clock: SystemWallClock(), rollbackCounter: rollbackCounter, rollbackInterval: configuration.rollbackInterval,
                                lockingStateDirectory: false)   // AgentMain holds it (before daemonising)
        if let tpm = configuration.deviceKeySource as? TPMDeviceKey {
            for warning in tpm.lockoutWarnings() { logger.warning("\(warning)") }
        }
        let registry = ConnectionRegistry(maxConnections: configuration.maxConnections,
                                          maxPerProcess: configuration.maxConnectionsPerProcess)
        self.registry = registry
        trust = TrustStore(configuration: configuration.trustConfiguration)
        resolver = IdentityResolver(manifests: TrustedManifests(store: trust))
        let host = Self.startPluginHost(configuration, logger: logger)
        pluginHost = host
        let verifier: any PasscodeVerifier = given ?? (configuration.passcodeInPlugin
            ? PluginPasscodeVerifier(host: host)
            : PAMAuthenticator(service: configuration.pamService, confdir: configuration.pamConfdir))
        let sensor = Self.biometricSensor(configuration, host: host, logger: logger)
        self.sensor = sensor
        // Lock events reach the sync once it exists (it needs the service). Held weakly: the sync holds
        // the service, which holds this closure (a cycle kept the keychain alive past the agent's stop).
        let syncBox = SyncReference()
        let filesBox = FilesReference()
        let service = KeychainService.compose(
            keychain: keychain, verifier: verifier, sensor: givenSensor ?? sensor ?? NoBiometricSensor(), settings: configuration.serviceSettings,
            clock: SystemClock(), wallClock: SystemWallClock(), logger: logger,
            onEvent: { event in
                registry.broadcast(event, refusals: refusals)
                syncBox.sync?.observe(event)
                filesBox.files?.observe(event)
            },
            onErase: { [logger] in
                // Everything was erased: stop once the reply is out; the next start makes a fresh keybag.
                logger.critical("the keychain was erased; stopping")
                Threads.detach {
                    Threads.sleep(seconds: 0.5)
                    exit(75)
                }
            })
        schedule = service.schedule
        let sync = SyncService(service: service, settings: configuration.sync)
        self.sync = sync
        syncBox.sync = sync
        let files = FileProtectionService(service: service)
        self.files = files
        filesBox.files = files
        // One way to the person for every agent-side dialog (PROMPT_UNLOCK, PROMPT_READ, access controls
        // of ssh keys, ssh-add -c): the configured pinentry on the login session's display, or nobody.
        let openPrompt: @Sendable () -> Result<AgentPromptChannel, PromptUnavailable> = { [configuration, logger] in
            let opened = AgentPromptChannel.open(configuration: configuration, clock: SystemClock()) { why, program in
                // The request only says it was cancelled: the reason goes to the log.
                logger.warning("a dialog ended without the person's answer: \(why)", metadata: ["pinentry": "\(program)"])
            }
            // pinentry = none is the person's choice: no warning for it.
            if case .failure(let why) = opened, configuration.pinentry != .none {
                logger.warning("refused a request that needs the person, no dialog shown: \(why)")
            }
            return opened
        }
        pipeline = Pipeline(service: service, resolver: resolver, promptChannel: openPrompt, sync: sync,
                            prompterReport: { [configuration] in AgentPromptChannel.report(configuration: configuration) }, files: files)
        let activation = Systemd.activationSockets()
        let nativeSocket = activation?.native.flatMap { Self.boundPath(of: $0) } ?? configuration.socketPath
        // The ssh-agent socket first: once the native socket accepts, both do (clients and tests wait
        // for the native one). Under socket activation, the one systemd passed (coffer-ssh-agent.socket,
        // FileDescriptorName=ssh-agent); when it passed none, one of our own beside the native socket.
        var sshAgentSocket = configuration.sshAgentSocketPath(beside: nativeSocket)
        let sshFrontEnd = SSHAgentFrontEnd(keys: sshKeys, securityKeys: SSHSecurityKeySigner(configuration: configuration),
                                           service: service, promptChannel: { try? openPrompt().get() },
                                           refusals: refusals, logger: logger)
        if let fd = activation?.sshAgent {
            if sshAgentSocket == nil {
                close(fd)
                logger.warning("closed the ssh-agent socket passed by systemd: ssh-agent-socket = none (disable coffer-ssh-agent.socket too)")
            } else {
                sshAgentSocket = Self.boundPath(of: fd) ?? "(passed by systemd)"
                self.host("ssh-agent", listener: FileDescriptor(adopting: fd), socketPath: nil, framing: SSHAgentFraming(),
                          handler: sshFrontEnd)
                logger.info("using the ssh-agent socket passed by systemd")
            }
        } else if let path = sshAgentSocket {
            do {
                try listen("ssh-agent", path: path, framing: SSHAgentFraming(), handler: sshFrontEnd)
            } catch where configuration.sshAgentSocket == .besideNativeSocket {
                // The default place is taken (another agent with its native socket in the same
                // directory serves it): this agent runs without one rather than not at all. A path
                // given in the configuration must work.
                logger.warning("no ssh-agent socket: \(error)", metadata: ["ssh-agent-socket": "\(path)"])
                sshAgentSocket = nil
            }
        }
        if let fd = activation?.native {
            self.host("native", listener: FileDescriptor(adopting: fd), socketPath: nil, framing: NativeFraming(),
                      handler: NativeFrontEnd(pipeline: pipeline, logger: logger))
            logger.info("using the socket passed by systemd")
        } else {
            try listen("native", path: configuration.socketPath, framing: NativeFraming(), handler: NativeFrontEnd(pipeline: pipeline, logger: logger))
        }
        keychain.logMigrations(to: logger)
        LegacyGroups.migrate(keychain, logger: logger)
        Self.report(trust.snapshot, logger: logger, reloaded: false)
        logger.info("agent ready", metadata: [
            "socket": "\(configuration.socketPath)", "ssh-agent-socket": "\(sshAgentSocket ?? "none")", "state": "\(configuration.stateDirectory)",
            "keybag": "\(keychain.status.lockState)", "pam-service": "\(configuration.pamService)",
        ])
        logger.info("locked memory", metadata: [
            "budget": "\(SecureMemory.lockBudget.map { "\($0 / 1024) KiB" } ?? "unlimited")",
            "large-frames": "\(frameBudget.capacity / 1024) KiB"])
        if SecureMemory.unlockedAllocations > 0 {
            logger.warning("some key memory could not be locked into RAM (RLIMIT_MEMLOCK \(SecureMemory.lockLimit().map(String.init) ?? "unlimited") bytes): it may be swapped")
        }
    }

    /// The path a listening Unix socket is bound to; nil for an unnamed or abstract one.
    static func boundPath(of fd: Int32) -> String? {
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        let rc = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard rc == 0, address.sun_family == sa_family_t(AF_UNIX) else { return nil }
        let path = withUnsafeBytes(of: &address.sun_path) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        return path.hasPrefix("/") ? path : nil
    }

    /// Opens a listening socket at `path` (its directory made private) and serves it with `handler`.
    func listen(_ name: String, path: String, framing: any Framing, handler: any ConnectionHandler) throws {
        let fd: Int32
        do {
            try Files.makePrivateDirectory(Files.directoryName(path))
        } catch {
            throw AgentError("socket directory: \(error)")
        }
        do {
            fd = try UnixSocket.listen(path: path)
        } catch {
            throw AgentError("socket: \(error)")
        }
        host(name, listener: FileDescriptor(adopting: fd), socketPath: path, framing: framing, handler: handler)
    }

    /// Serves `listener` with `handler` in `framing`, beside the other listeners (started at once if
    /// the agent already runs). `socketPath`: the file to remove at shutdown (nil: not ours).
    func host(_ name: String, listener: consuming FileDescriptor, socketPath: String?, framing: any Framing, handler: any ConnectionHandler) {
        let server = SocketServer(name: name, listener: listener, framing: framing, handler: handler, registry: registry, budget: frameBudget,
                                  limits: Connection.Limits(frameSeconds: configuration.frameDeadlineSeconds,
                                                            helloSeconds: configuration.helloTimeoutSeconds),
                                  refusals: refusals, logger: logger) { [weak self] conn in self?.identify(conn) }   // weak: the agent owns its servers
        if let socketPath { ownedSocketPaths.withLock { $0.append(socketPath) } }
        servers.withLock { $0.append(server) }
        if started.withLock({ $0 }) { server.start() }
    }

    /// A connection's caller, established once on its own thread before its first frame; nil (logged)
    /// if it cannot be identified.
    private func identify(_ conn: Connection) -> CallerIdentity? {
        let caller: CallerIdentity
        do {
            caller = configuration.identifyCallers
                ? try resolver.identify(socket: conn.fd, peer: conn.peer)   // the credentials read at accept: one SO_PEERCRED read
                : CallerIdentity(pid: conn.peer.pid, uid: conn.peer.uid,
                                 establishedBy: .unsigned(executablePath: conn.peer.executable ?? "", reason: .noMatchingManifest),
                                 accessGroups: [])
        } catch {
            refusals.log("identity", "refused a connection whose caller could not be identified: \(error)", peer: conn.peer)
            return nil
        }
        if case .unsigned(let path, let reason) = caller.establishedBy, reason != .noMatchingManifest {
            refusals.log("identity:\(path)", "caller gets no signed identity: \(reason)", peer: conn.peer)
        }
        logger.debug("client connected", metadata: ["peer": "\(conn.peer)", "caller": "\(caller)"])
        return caller
    }

    /// Starts every listener's accept loop and the lock timer.
    package func start() {
        started.withLock { $0 = true }
        // Before anyone is served: the keys a crashed agent left in the kernel are removed, None's added.
        files.start()
        for server in servers.withLock({ $0 }) { server.start() }
        sync.start()
        Threads.detach { [self] in
            var unlocked = SecureMemory.unlockedAllocations
            while !registry.isStopping {
                Threads.sleep(seconds: 0.25)
                schedule.tick()
                for key in sshKeys.expire() {
                    logger.info("ssh-agent: a key's lifetime ended; removed it", metadata: ["key": "\(key.fingerprint)"])
                }
                let now = SecureMemory.unlockedAllocations
                if now > unlocked {
                    logger.warning("secure buffers served from unlocked memory (locked-memory budget spent)",
                                   metadata: ["count": "\(now - unlocked)", "budget-bytes": "\(SecureMemory.lockBudget ?? -1)"])
                    unlocked = now
                }
            }
        }
    }

    /// SIGUSR1: the desktop session locked. Locks after the grace period.
    package func sessionLocked() { schedule.requestLock(reason: "session locked (SIGUSR1)") }

    /// SIGHUP: re-reads the trust roots and manifests. Connections identified before keep their
    /// identity; new connections get the new one.
    package func reloadTrust() { Self.report(trust.reload(), logger: logger, reloaded: true) }

    /// Logs what the trust store believes and, one line each, what it refused and why.
    private static func report(_ snapshot: TrustSnapshot, logger: Logger, reloaded: Bool) {
        for r in snapshot.refused {
            logger.warning("trust: refused \(r.path): \(r.reason)")
        }
        logger.info(reloaded ? "trust roots reloaded" : "trust roots loaded",
                    metadata: ["keys": "\(snapshot.keys.count)", "manifests": "\(snapshot.manifests.count)",
                               "refused": "\(snapshot.refused.count)"])
    }

    /// SIGTERM: stop accepting, let in-flight requests finish (up to 5 s), wipe keys, checkpoint.
    package func shutdown() {
        logger.info("shutting down")
        let open = registry.stop()
        sync.stop()
        files.stop()
        for path in ownedSocketPaths.withLock({ $0 }) { unlink(path) }
        for server in servers.withLock({ $0 }) { server.stopAccepting() }
        if !registry.drain(timeout: 5) { logger.warning("requests still running after 5 s; stopping anyway") }
        for c in open { c.close() }
        pluginHost?.shutdown()
        keychain.lock()
        sshKeys.clear()
        schedule.sessions.endAll()
        keychain.checkpoint()
        // A TPM without a resource manager (swtpm) keeps what a process leaves loaded.
        keychain.releaseDeviceKey()
        logger.info("stopped; keys wiped")
    }

}

/// The trust store as the identity resolver's source of verified manifests.
struct TrustedManifests: ManifestSource {
    let store: TrustStore
    func manifests(forExecutable path: String) -> [Manifest] { store.manifests(forExecutable: path) }
    var generation: UInt64 { store.generation }
}

/// The agent's sync, held weakly for the service's event closure (the agent holds it strongly).
private final class SyncReference: Sendable {
    private struct Weak: Sendable { weak var sync: SyncService? }
    private let box = Protected(Weak())
    var sync: SyncService? {
        get { box.withLock { $0.sync } }
        set { box.withLock { $0.sync = newValue } }
    }
}

/// The agent's protected directories, held weakly for the service's event closure (as the sync).
private final class FilesReference: Sendable {
    private struct Weak: Sendable { weak var files: FileProtectionService? }
    private let box = Protected(Weak())
    var files: FileProtectionService? {
        get { box.withLock { $0.files } }
        set { box.withLock { $0.files = newValue } }
    }
}
