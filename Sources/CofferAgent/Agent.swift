import CofferCrypto
import CofferKeychain
import CofferModel
import CofferPAM
import CofferProtocol
import CofferSystem
import Glibc
import Logging

/// The agent: accepts connections, identifies peers, and serves requests against the keychain.
///
/// Concurrency model: one thread per connection doing blocking I/O. A request that waits (PAM,
/// Argon2id, the unlock backoff, and later a person authenticating) holds only its own
/// connection's thread; the keychain serialises its short critical sections internally.
public final class Agent: @unchecked Sendable {
    // @unchecked Sendable: mutable state is guarded by `mutex`.
    /// The agent's version, reported in HELLO and STATUS replies.
    public static let version = "0.1.0"

    let configuration: AgentConfiguration
    let keychain: Keychain
    let logger: Logger
    let pam: PAMAuthenticator
    /// Locked memory shared by large incoming frames.
    let frameBudget = FrameBudget.standard()
    private(set) var locks: LockController!
    private let mutex = Lock()
    private var listener: Int32 = -1
    private var ownsSocketPath = false
    private var connections: [ObjectIdentifier: Connection] = [:]
    /// Open connections per peer pid (pid 0: unknown, shared).
    private var perProcess: [Int32: Int] = [:]
    /// Keeps repeated refusals from growing the log without bound.
    private let refusals: LogThrottle
    private var inFlight = 0
    private var stopping = false

    /// Opens the keychain and the listening socket (or adopts systemd's).
    public init(configuration: AgentConfiguration, logger: Logger) throws {
        self.configuration = configuration
        self.logger = logger
        refusals = LogThrottle(interval: configuration.logRepeatSeconds)
        do {
            try Files.makePrivateDirectory(configuration.stateDirectory)
        } catch {
            throw AgentError("state directory: \(error)")
        }
        keychain = try Keychain(directory: configuration.stateDirectory)
        pam = PAMAuthenticator(service: configuration.pamService, confdir: configuration.pamConfdir)
        locks = LockController(keychain: keychain, idleSeconds: Double(configuration.idleLockSeconds),
                               graceSeconds: configuration.lockGraceSeconds, logger: logger) { [weak self] event in
            self?.broadcast(event)
        }
        if let fd = Systemd.activationSocket() {
            listener = fd
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
        logMigrations()
        logger.info("agent ready", metadata: [
            "socket": "\(configuration.socketPath)", "state": "\(configuration.stateDirectory)",
            "keybag": "\(keychain.keybag.state)", "pam-service": "\(configuration.pamService)",
        ])
        logger.info("locked memory", metadata: [
            "budget": "\(SecureMemory.lockBudget.map { "\($0 / 1024) KiB" } ?? "unlimited")",
            "large-frames": "\(frameBudget.capacity / 1024) KiB"])
        if SecureMemory.unlockedAllocations > 0 {
            logger.warning("some key memory could not be locked into RAM (RLIMIT_MEMLOCK \(SecureMemory.lockLimit().map(String.init) ?? "unlimited") bytes): it may be swapped")
        }
    }

    /// Starts the accept loop and the lock timer.
    public func start() {
        Threads.detach { [self] in acceptLoop() }
        Threads.detach { [self] in
            var unlocked = SecureMemory.unlockedAllocations
            while !mutex.withLock({ stopping }) {
                Threads.sleep(seconds: 0.25)
                locks.tick()
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
    public func sessionLocked() { locks.requestLock(reason: "session locked (SIGUSR1)") }

    /// SIGTERM: stop accepting, let in-flight requests finish (up to 5 s), wipe keys, checkpoint.
    public func shutdown() {
        logger.info("shutting down")
        let open: [Connection] = mutex.withLock {
            stopping = true
            return Array(connections.values)
        }
        if ownsSocketPath { unlink(configuration.socketPath) }
        shutdownSocket(listener)
        let deadline = Threads.monotonicSeconds() + 5
        while mutex.withLock({ inFlight }) > 0 && Threads.monotonicSeconds() < deadline {
            Threads.sleep(seconds: 0.01)
        }
        for c in open { c.close() }
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
                if mutex.withLock({ stopping }) { return }
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
        enum Admission { case admitted, stopping, full, processFull }
        let admission: Admission = mutex.withLock {
            guard !stopping else { return .stopping }
            guard connections.count < configuration.maxConnections else { return .full }
            guard perProcess[peer.pid, default: 0] < configuration.maxConnectionsPerProcess else { return .processFull }
            connections[ObjectIdentifier(conn)] = conn
            perProcess[peer.pid, default: 0] += 1
            return .admitted
        }
        switch admission {
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
        mutex.withLock {
            _ = connections.removeValue(forKey: ObjectIdentifier(conn))
            let left = perProcess[conn.peer.pid, default: 1] - 1
            perProcess[conn.peer.pid] = left > 0 ? left : nil
        }
        conn.release()
    }

    /// Reads frames until the peer closes, breaks framing or misses a deadline.
    private func serve(_ conn: Connection) {
        logger.debug("client connected", metadata: ["peer": "\(conn.peer)"])
        while true {
            let frame: Connection.Frame
            switch conn.readFrame(spinMicros: spinBudget(), budget: frameBudget) {
            case .success(let f): frame = f
            case .failure(let end):
                reportEnd(end, of: conn)
                return
            }
            defer { frameBudget.release(frame.grant) }
            let begun: Bool = mutex.withLock {
                guard !stopping else { return false }
                inFlight += 1
                return true
            }
            guard begun else { return }
            let keepOpen = handle(frame: frame.body, on: conn)
            mutex.withLock { inFlight -= 1 }
            if !keepOpen { return }
        }
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
        guard let suppressed = refusals.admit(key) else { return }
        var metadata: Logger.Metadata = [:]
        if let peer { metadata["peer"] = "\(peer)" }
        if suppressed > 0 { metadata["suppressed"] = "\(suppressed) like it since the last such line" }
        logger.warning(message, metadata: metadata)
    }

    /// Microseconds a connection thread may poll for its client's next request: only while few
    /// clients are connected, so polling never competes with threads doing real work for the CPUs.
    private func spinBudget() -> Double {
        mutex.withLock { connections.count } <= Self.spinningConnectionLimit ? 50 : 0
    }

    /// Above this many connections, connection threads block instead of polling.
    static let spinningConnectionLimit = 2

    private func broadcast(_ event: LockEvent) {
        let subscribers = mutex.withLock { connections.values.filter { $0.isSubscribed } }
        guard !subscribers.isEmpty else { return }
        let frame = Response.event(event).encodeFrame(requestID: 0)
        for c in subscribers where !c.sendEvent(frame) {
            logRefusal("subscriber", "dropping a subscriber that stopped reading", peer: c.peer)
            c.close()
        }
    }
}

/// Rate limit for repeated log lines: at most one per key per `interval` seconds.
final class LogThrottle: @unchecked Sendable {
    // @unchecked Sendable: `last` is guarded by `mutex`.
    private let mutex = Lock()
    private var last: [String: (at: Double, suppressed: Int)] = [:]
    let interval: Double

    init(interval: Double) { self.interval = interval }

    /// Nil when a line for `key` went out less than `interval` ago (this one is counted and left
    /// out); otherwise how many were left out since the last line for `key`.
    func admit(_ key: String) -> Int? {
        let now = Threads.monotonicSeconds()
        return mutex.withLock {
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
