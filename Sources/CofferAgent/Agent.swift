import CofferAudit
import CofferCrypto
import CofferIdentity
import CofferKeychain
import CofferManifest
import CofferModel
import CofferPAM
import CofferPluginClient
import CofferPolicy
import CofferProtocol
import CofferSystem
import CofferTrust
import Glibc
package import Logging

/// The agent's server: accepts connections, identifies peers, runs one thread per connection that
/// reads frames, hands each request to the ``Pipeline`` and writes the reply; and shuts down.
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
    /// The trust roots and manifests (reloaded on SIGHUP).
    let trust: TrustStore
    /// Connection → caller identity.
    let resolver: IdentityResolver
    /// The biometric sensor in the plugin host, if one is configured.
    let sensor: PluginBiometricSensor?
    /// The plugin host, when biometry or the passcode is served by a plugin.
    let pluginHost: PluginHost?

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

    /// The listening socket (set once in init).
    private let listener: Int32
    private let ownsSocketPath: Bool
    /// Keeps repeated refusals from growing the log without bound.
    private let refusals: RefusalLog

    /// Opens the keychain and the listening socket (or adopts systemd's).
    package init(configuration: AgentConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        let refusals = RefusalLog(logger: logger, throttle: LogThrottle(interval: configuration.logRepeatSeconds))
        self.refusals = refusals
        do {
            try Files.makePrivateDirectory(configuration.stateDirectory)
        } catch {
            throw AgentError("state directory: \(error)")
        }
        keychain = try Keychain(directory: configuration.stateDirectory, applicationPasswordDelays: configuration.attemptSchedule.delays,
                                clock: SystemWallClock())
        let registry = ConnectionRegistry(maxConnections: configuration.maxConnections,
                                          maxPerProcess: configuration.maxConnectionsPerProcess)
        self.registry = registry
        let clock = SystemClock()
        trust = TrustStore(configuration: configuration.trustConfiguration)
        resolver = IdentityResolver(manifests: TrustedManifests(store: trust))
        let gate = AccessGate(policy: configuration.policy,
                              audit: configuration.auditLog
                                  ? AuditLog(directory: configuration.stateDirectory, maximumBytes: configuration.auditMaximumBytes) : nil,
                              clock: clock, logger: logger)
        schedule = LockSchedule(keychain: keychain, idleSeconds: Double(configuration.idleLockSeconds),
                                graceSeconds: configuration.lockGraceSeconds, clock: clock, logger: logger) { event in
            gate.observe(event)
            registry.broadcast(event, refusals: refusals)
        }
        let host = Self.startPluginHost(configuration, logger: logger)
        pluginHost = host
        let verifier: any PasscodeVerifier = configuration.passcodeInPlugin
            ? PluginPasscodeVerifier(host: host)
            : PAMAuthenticator(service: configuration.pamService, confdir: configuration.pamConfdir)
        let unlocking = UnlockService(keychain: keychain,
                                      verifier: verifier,
                                      userName: configuration.userName, kdfPolicy: configuration.kdfPolicy, clock: SystemWallClock(),
                                      logger: logger, schedule: configuration.attemptSchedule,
                                      attemptsFile: configuration.stateDirectory + "/attempts") { [logger] in
            // Everything was erased: stop once the reply is out; the next start makes a fresh keybag.
            logger.critical("the keychain was erased; stopping")
            Threads.detach {
                Threads.sleep(seconds: 0.5)
                exit(75)
            }
        }
        let sensor = Self.biometricSensor(configuration, host: host, logger: logger)
        self.sensor = sensor
        let authenticator = Authenticator(sensor: sensor ?? NoBiometricSensor(), unlocking: unlocking, keychain: keychain, gate: gate,
                                          clock: clock, logger: logger, timeoutSeconds: configuration.authenticationTimeoutSeconds)
        pipeline = Pipeline(keychain: keychain, unlocking: unlocking, schedule: schedule, gate: gate, authenticator: authenticator,
                            clock: clock, logger: logger, idleLockSeconds: configuration.idleLockSeconds)
        if let fd = Systemd.activationSocket() {
            listener = fd
            ownsSocketPath = false
            logger.info("using the socket passed by systemd")
        } else {
            do {
                try Files.makePrivateDirectory(Files.directoryName(configuration.socketPath))
            } catch {
                throw AgentError("socket directory: \(error)")
            }
            do {
                listener = try UnixSocket.listen(path: configuration.socketPath)
                ownsSocketPath = true
            } catch {
                throw AgentError("socket: \(error)")
            }
        }
        keychain.logMigrations(to: logger)
        LegacyGroups.migrate(keychain, logger: logger)
        Self.report(trust.snapshot, logger: logger, reloaded: false)
        logger.info("agent ready", metadata: [
            "socket": "\(configuration.socketPath)", "state": "\(configuration.stateDirectory)",
            "keybag": "\(keychain.status.lockState)", "pam-service": "\(configuration.pamService)",
        ])
        logger.info("locked memory", metadata: [
            "budget": "\(SecureMemory.lockBudget.map { "\($0 / 1024) KiB" } ?? "unlimited")",
            "large-frames": "\(frameBudget.capacity / 1024) KiB"])
        if SecureMemory.unlockedAllocations > 0 {
            logger.warning("some key memory could not be locked into RAM (RLIMIT_MEMLOCK \(SecureMemory.lockLimit().map(String.init) ?? "unlimited") bytes): it may be swapped")
        }
    }

    /// Starts the accept loop and the lock timer.
    package func start() {
        Threads.detach { [self] in acceptLoop() }
        Threads.detach { [self] in
            var unlocked = SecureMemory.unlockedAllocations
            while !registry.isStopping {
                Threads.sleep(seconds: 0.25)
                schedule.tick()
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
        if ownsSocketPath { unlink(configuration.socketPath) }
        shutdownSocket(listener)
        if !registry.drain(timeout: 5) { logger.warning("requests still running after 5 s; stopping anyway") }
        for c in open { c.close() }
        pluginHost?.shutdown()
        keychain.lock()
        keychain.checkpoint()
        logger.info("stopped; keys wiped")
    }

    private func shutdownSocket(_ fd: Int32) { Glibc.shutdown(fd, Int32(SHUT_RDWR)) }

    // MARK: Connections

    private func acceptLoop() {
        while true {
            let fd: Int32
            do {
                fd = try UnixSocket.accept(listener)
            } catch {
                if registry.isStopping { return }
                if error.errno == EMFILE || error.errno == ENFILE {
                    logger.error("out of file descriptors; pausing accepts")
                    Threads.sleep(seconds: 0.1)
                }
                continue
            }
            admit(fd)
        }
    }

    private func admit(_ fd: Int32) {
        let peer: PeerIdentity
        do {
            peer = try PeerIdentity.of(socket: fd)
        } catch {
            logRefusal("credentials", "refused a connection whose peer credentials cannot be read (SO_PEERCRED)", peer: nil)
            Glibc.close(fd)
            return
        }
        guard peer.uid == getuid() else {
            logRefusal("other-user", "refused a connection from another user", peer: peer)
            Glibc.close(fd)
            return
        }
        let conn = Connection(fd: fd, peer: peer, limits: Connection.Limits(
            frameSeconds: configuration.frameDeadlineSeconds, helloSeconds: configuration.helloTimeoutSeconds))
        switch registry.admit(conn) {
        case .admitted: break
        case .stopping:
            conn.release()
            return
        case .full:
            logRefusal("full", "too many connections (\(configuration.maxConnections)); refusing one", peer: peer)
            conn.release()
            return
        case .processFull:
            logRefusal("process-full", "refused a connection: process already has \(configuration.maxConnectionsPerProcess) connections",
                       peer: peer)
            conn.release()
            return
        }
        let started = Threads.detach { [self] in
            serve(conn)
            forget(conn)
        }
        if !started { forget(conn) }
    }

    /// Removes a finished connection from the tables and closes it.
    private func forget(_ conn: Connection) {
        registry.forget(conn)
        conn.release()
    }

    /// Reads frames until the peer closes, breaks framing or misses a deadline, or the pipeline
    /// closes the session. The session is this thread's alone.
    ///
    /// A complete request runs even if its client is gone: once a reply cannot be sent (the client
    /// closed, or stopped reading for ``Connection/ioTimeout``), the frames already in the socket
    /// still run, without replies, and the connection ends at the first one not wholly there. So
    /// HELLO + ADD written at once and followed by a close adds the item (WireProtocol, lifecycle).
    private func serve(_ conn: Connection) {
        let caller: CallerIdentity
        do {
            caller = configuration.identifyCallers
                ? try resolver.identify(socket: conn.fd, peer: conn.peer)
                : CallerIdentity(pid: conn.peer.pid, uid: conn.peer.uid,
                                 establishedBy: .unsigned(executablePath: conn.peer.executable ?? "", reason: .noMatchingManifest),
                                 accessGroups: [])
        } catch {
            logRefusal("identity", "refused a connection whose caller could not be identified: \(error)", peer: conn.peer)
            return
        }
        if case .unsigned(let path, let reason) = caller.establishedBy, reason != .noMatchingManifest {
            logRefusal("identity:\(path)", "caller gets no signed identity: \(reason)", peer: conn.peer)
        }
        logger.debug("client connected", metadata: ["peer": "\(conn.peer)", "caller": "\(caller)"])
        var session = Session(peer: conn.peer, caller: caller)
        var replying = true
        while true {
            let frame: Connection.Frame
            switch conn.readFrame(greeted: session.isGreeted, spinMicros: replying ? spinBudget() : 0, budget: frameBudget,
                                  bufferedOnly: !replying) {
            case .success(let f): frame = f
            case .failure(let end):
                reportEnd(end, of: conn)
                return
            }
            defer { frameBudget.release(frame.grant) }
            guard registry.beginRequest() else { return }
            let sent = handle(frame: frame.body, session: &session, on: conn, replying: replying)
            registry.endRequest()
            if session.mustClose { return }
            if !sent { replying = false }
        }
    }

    /// Decodes one frame body, runs it through the pipeline, sends the reply. False if the reply could not be sent.
    /// `replying` false: run the request but send nothing (an earlier reply could not be sent).
    private func handle(frame body: SecureBytes, session: inout Session, on conn: Connection, replying: Bool) -> Bool {
        let requestID: UInt32
        let request: AgentRequest
        do {
            (requestID, request) = try body.withUnsafeBytes { b throws(ProtocolError) in try AgentRequest.decodeBody(b) }
        } catch {
            let id = body.withUnsafeBytes { WireFormat.requestID(ofBody: $0) } ?? 0
            let response = pipeline.refuse(error, session: &session)
            return replying && reply(response, id: id, on: conn)
        }
        if case .authResponse = request, session.isGreeted {
            // An answer to an authentication that already ended (the person touched the sensor while
            // typing): nothing waits for it, and it gets no reply. Its passcode is wiped with the frame.
            // As a first frame it is refused like any other frame that is not HELLO (lifecycle rule 1).
            return replying
        }
        let channel = ConnectionAuthChannel(conn: conn, requestID: requestID, budget: frameBudget,
                                            feedbackKinds: (session.protocolVersion ?? 0) >= WireFormat.feedbackKindVersion)
        let response = pipeline.handle(request, session: &session, channel: replying ? channel : nil)
        if channel.broken { session.close() }
        if session.wantsEvents && !conn.isSubscribed { conn.subscribe() }
        guard replying else { return false } // never encoded: a secret in it stays in secure memory
        return reply(response, id: requestID, on: conn)
    }

    private func reply(_ response: AgentResponse, id: UInt32, on conn: Connection) -> Bool {
        var frame = response.encodeFrame(requestID: id)
        defer { if response.carriesSecret { secureZero(&frame) } }
        guard frame.count - 4 <= WireFormat.maximumBodyBytes else {
            // Never reached by design (each reply is sized before it is built); a last guard, so the
            // agent never sends a frame the client must refuse.
            logger.error("a reply exceeded the frame limit", metadata: ["bytes": "\(frame.count - 4)", "peer": "\(conn.peer)"])
            return conn.send(AgentResponse.error(Pipeline.tooLarge("the reply")).encodeFrame(requestID: id))
        }
        return conn.send(frame)
    }

    /// Logs (rate-limited) why the agent closed a connection, when it was not the client's doing.
    private func reportEnd(_ end: Connection.ReadEnd, of conn: Connection) {
        switch end {
        case .closed: return
        case .helloTimeout:
            logRefusal("hello-timeout", "closed a connection that sent no HELLO within \(conn.limits.helloSeconds) s", peer: conn.peer)
        case .frameDeadline:
            logRefusal("frame-deadline", "closed a connection whose frame did not arrive within \(conn.limits.frameSeconds) s",
                       peer: conn.peer)
        case .badLength:
            logRefusal("framing", "closed a connection that sent a frame length outside the protocol's bounds", peer: conn.peer)
        case .noBudget:
            logRefusal("budget", "closed a connection: no locked memory for its large frame became free in time", peer: conn.peer)
        }
    }

    /// A warning, at most once per `key` per ``AgentConfiguration/logRepeatSeconds``; the next one
    /// that gets through says how many were left out.
    private func logRefusal(_ key: String, _ message: Logger.Message, peer: PeerIdentity?) {
        refusals.log(key, message, peer: peer)
    }

    /// Microseconds a connection thread may poll for its client's next request: only while few
    /// clients are connected, so polling never competes with threads doing real work for the CPUs.
    private func spinBudget() -> Double {
        registry.count <= Self.spinningConnectionLimit ? 50 : 0
    }

    /// Above this many connections, connection threads block instead of polling.
    static let spinningConnectionLimit = 2
}

/// The person behind a connection, reached through AUTH_NEEDED / AUTH_RESPONSE on the connection
/// itself while the request waits (WireProtocol.md, Authentication).
final class ConnectionAuthChannel: AuthChannel {
    let conn: Connection
    let requestID: UInt32
    let budget: FrameBudget
    /// The client's HELLO announced version 2: feedback goes out as AUTH_FEEDBACK_KIND.
    let feedbackKinds: Bool
    /// The client sent something other than AUTH_RESPONSE mid-conversation: the connection closes
    /// after the request's reply.
    private(set) var broken = false

    init(conn: Connection, requestID: UInt32, budget: FrameBudget, feedbackKinds: Bool) {
        self.conn = conn
        self.requestID = requestID
        self.budget = budget
        self.feedbackKinds = feedbackKinds
    }

    func ask(_ request: AuthenticationRequest) { _ = conn.send(AgentResponse.authNeeded(request).encodeFrame(requestID: requestID)) }

    func feedback(_ text: String, kind: AuthFeedbackKind) {
        _ = conn.send(AgentResponse.authFeedback(text, kind: feedbackKinds ? kind : nil).encodeFrame(requestID: requestID))
    }

    func awaitAnswer(stop: () -> Bool, wake: Int32, deadline: Double) -> ChannelEvent {
        while true {
            if stop() { return .stopped }
            if Threads.monotonicSeconds() >= deadline { return .timedOut }
            var fds = [pollfd(fd: conn.fd, events: Int16(POLLIN), revents: 0), pollfd(fd: wake, events: Int16(POLLIN), revents: 0)]
            let n = fds.withUnsafeMutableBufferPointer { Glibc.poll($0.baseAddress, wake >= 0 ? 2 : 1, 1000) }
            guard n > 0, fds[0].revents != 0 else { continue }
            let frame: Connection.Frame
            switch conn.readFrame(greeted: true, budget: budget) {
            case .success(let f): frame = f
            case .failure: return .gone
            }
            defer { budget.release(frame.grant) }
            let decoded = frame.body.withUnsafeBytes { b in Result { () throws(ProtocolError) in try AgentRequest.decodeBody(b) } }
            switch decoded {
            case .success((let id, .authResponse(let answer))) where id == requestID:
                return .answer(answer)
            case .success((_, .authResponse)):
                continue // a late answer to an earlier request
            default:
                broken = true
                return .gone
            }
        }
    }
}

/// The trust store as the identity resolver's source of verified manifests.
struct TrustedManifests: ManifestSource {
    let store: TrustStore
    func manifests(forExecutable path: String) -> [Manifest] { store.manifests(forExecutable: path) }
}

/// Rate limit for repeated log lines: at most one per key per `interval` seconds.
final class LogThrottle: Sendable {
    private let last = Protected<[String: (at: Double, suppressed: Int)]>([:])
    let interval: Double

    init(interval: Double) { self.interval = interval }

    /// Nil when a line for `key` went out less than `interval` ago (this one is counted and left
    /// out); otherwise how many were left out since the last line for `key`.
    func admit(_ key: String) -> Int? {
        let now = Threads.monotonicSeconds()
        return last.withLock { last in
            if var entry = last[key], now - entry.at < interval {
                entry.suppressed += 1
                last[key] = entry
                return nil
            }
            let left = last[key]?.suppressed ?? 0
            last[key] = (now, 0)
            return left
        }
    }
}

/// Warnings about refused or dropped connections, at most one per kind per interval (``LogThrottle``).
struct RefusalLog: Sendable {
    let logger: Logger
    let throttle: LogThrottle

    /// A warning, unless one for `key` went out less than the interval ago; the next one that gets
    /// through says how many were left out.
    func log(_ key: String, _ message: Logger.Message, peer: PeerIdentity?) {
        guard let suppressed = throttle.admit(key) else { return }
        var metadata: Logger.Metadata = [:]
        if let peer { metadata["peer"] = "\(peer)" }
        if suppressed > 0 { metadata["suppressed"] = "\(suppressed) like it since the last such line" }
        logger.warning(message, metadata: metadata)
    }
}
