package import CofferCrypto
package import CofferPluginProtocol
import CofferSystem
import Glibc

/// Why a request to the plugin host did not get its answer. Every case that ends an evaluation
/// without a plugin's result is, for LocalAuthentication, `systemCancel` (``laCode``).
package enum PluginHostError: Error, Equatable, Sendable, CustomStringConvertible {
    /// No answer by the deadline: the host was killed (and is being restarted).
    case timedOut
    /// The host exited (a plugin crashed it, or it was killed) while the request was pending; it is being restarted.
    case hostCrashed
    /// The host is not running and did not start within the start timeout (the reason, if known).
    case unavailable(String)
    /// No loaded plugin has that name.
    case unknownPlugin(String)
    /// The host answered ERROR (busy, malformed request).
    case refused(code: Int32, message: String)
    /// The host sent something this client cannot decode, or the wrong reply type.
    case protocolError(String)

    /// The LocalAuthentication result the agent reports for this failure.
    package var laCode: LACode {
        switch self {
        case .unknownPlugin: return .biometryNotAvailable
        default: return .systemCancel
        }
    }

    package var description: String {
        switch self {
        case .timedOut: return "the plugin host did not answer in time (killed and restarted)"
        case .hostCrashed: return "the plugin host exited during the request (restarted)"
        case .unavailable(let why): return "the plugin host is not available: \(why)"
        case .unknownPlugin(let name): return "no plugin named \(name) is loaded"
        case let .refused(code, message): return "the plugin host refused the request (\(code)): \(message)"
        case .protocolError(let why): return "plugin host protocol error: \(why)"
        }
    }
}

/// A plugin's answer to an evaluation.
package struct EvaluationResult: Sendable, Equatable {
    /// LocalAuthentication's code (success, authenticationFailed, userCancel, …).
    package var code: LACode
    /// The plugin's domain state after the evaluation (nil for a plugin without enrollment).
    package var domainState: [UInt8]?
}

/// A plugin's enrollment state.
package struct EnrollmentState: Sendable, Equatable {
    /// 0, or the plugin's status (4 unsupported: no enrollment).
    package var code: Int32
    package var enrolledCount: UInt32
    package var domainState: [UInt8]?
}

/// Names one evaluation, so another thread can cancel it.
package struct EvaluationTicket: Sendable, Hashable {
    package let id: UInt32
}

/// The agent's side of the plugin host: starts `coffer-plugin-host` (``Subprocess/spawn``, the
/// socket on its descriptor 3) from a supervisor thread of its own that lives as long as this
/// object (the child's parent-death signal is tied to the thread that spawned it), speaks the
/// PluginProtocol, and restarts the host whenever it exits. Thread-safe: any number of threads may
/// evaluate, cancel and control at once.
///
/// A request that gets no answer by its deadline (an evaluation's timeout plus ``Configuration/grace``)
/// kills the host and fails with ``PluginHostError/timedOut``; every other request pending in that
/// host fails with ``PluginHostError/hostCrashed``; the next request goes to the restarted host.
package final class PluginHost: Sendable {
    /// How to start the host.
    package struct Configuration: Sendable {
        /// Absolute path of `coffer-plugin-host`.
        package var executable: String
        /// Directories of `*.so` plugins (checked by the host: owner, modes, no symlinks).
        package var pluginDirectories: [String]
        /// System directories of plugins: they, their ancestors and their plugins must belong to root.
        package var systemPluginDirectories: [String] = []
        /// Where each plugin gets its private state directory (`DIR/NAME`).
        package var stateDirectory: String
        /// How long a request waits for a (re)starting host.
        package var startTimeout: Double = 10
        /// Seconds beyond an evaluation's own timeout before the host is declared hung and killed.
        package var grace: Double = 2
        /// Deadline of CONTROL and STATE requests.
        package var controlTimeout: Double = 5
        /// A file the host appends its log to (refusals, plugin log lines) instead of inheriting stderr.
        package var logFile: String? = nil
        /// The host's environment (empty by default: nothing of the agent's leaks).
        package var environment: [String] = []

        package init(executable: String, pluginDirectories: [String], stateDirectory: String) {
            self.executable = executable
            self.pluginDirectories = pluginDirectories
            self.stateDirectory = stateDirectory
        }
    }

    let core: Core

    /// Starts the host and waits for its HELLO_REPLY (``Configuration/startTimeout``).
    package init(_ configuration: Configuration) throws(PluginHostError) {
        core = Core(configuration)
        guard Threads.detach(stackBytes: 256 << 10, { [core] in core.supervise() }) else {
            throw .unavailable("no thread for the supervisor")
        }
        if case .failure(let e) = core.waitReady() {
            core.shutdown()
            throw e
        }
    }

    deinit { core.shutdown() }

    /// Stops the host (and its supervisor); every pending request fails with ``PluginHostError/hostCrashed``.
    package func shutdown() { core.shutdown() }

    /// The plugins the running host loaded (from its last HELLO_REPLY).
    package var plugins: [PluginInfo] { core.state.withLock { $0.plugins } }
    /// The plugin files the running host refused, with reasons.
    package var refused: [RefusedPlugin] { core.state.withLock { $0.refused } }
    /// How many times the host was started (1 until the first restart).
    package var starts: Int { core.state.withLock { $0.starts } }
    /// How many requests (HELLO aside: STATE, EVALUATE, CONTROL) went to the host and waited for its
    /// answer: the agent's tests and the benchmark count the round trips a protected read costs.
    package var roundTrips: Int { core.state.withLock { $0.roundTrips } }
    /// The running host's pid (nil between an exit and the restart).
    package var pid: Int32? { core.state.withLock { $0.socket >= 0 ? $0.pid : nil } }

    /// A ticket for ``evaluate(plugin:reason:app:timeout:credential:ticket:feedback:)``, to cancel it from another thread.
    package func makeTicket() -> EvaluationTicket { EvaluationTicket(id: core.allocateID()) }

    /// Runs one evaluation in the host and waits for its result: at most `timeout` seconds for the
    /// plugin (it returns systemCancel then), plus the grace before the host is killed.
    /// `credential` travels in the EVALUATE frame, which is wiped after the write.
    /// `feedback` receives the plugin's progress messages (on the supervisor thread; keep it short).
    package func evaluate(plugin: String, reason: String, app: String, timeout: Double, credential: SecureBytes? = nil,
                          ticket: EvaluationTicket? = nil,
                          feedback: (@Sendable (String) -> Void)? = nil) throws(PluginHostError) -> EvaluationResult {
        let millis = UInt32(min(max(timeout, 0.001), 3600) * 1000)
        let request = HostRequest.evaluate(plugin: plugin, reason: reason, app: app, timeoutMillis: millis, credential: credential)
        let response = try core.request(request, id: ticket?.id, timeout: Double(millis) / 1000 + core.configuration.grace,
                                        feedback: feedback)
        switch response {
        case let .result(code, domainState):
            guard let la = LACode(rawValue: code) else { throw .protocolError("RESULT with an undefined code") }
            return EvaluationResult(code: la, domainState: domainState)
        default:
            throw try unexpected(response, plugin: plugin)
        }
    }

    /// Cancels the evaluation `ticket` names: it ends with userCancel (`.user`) or systemCancel
    /// (`.system`) once its plugin honours the cancel; ignored if it is not pending.
    package func cancel(_ ticket: EvaluationTicket, reason: CancelReason) {
        core.send(.cancel(reason), id: ticket.id, onlyIfPending: true)
    }

    /// A plugin's control command (`coffer bio enroll NAME` → `control(plugin: "biometric-emulator", command: "enroll", arguments: ["NAME"])`).
    package func control(plugin: String, command: String, arguments: [String] = []) throws(PluginHostError) -> (code: Int32, text: String) {
        let response = try core.request(.control(plugin: plugin, command: command, arguments: arguments), id: nil,
                                        timeout: core.configuration.controlTimeout, feedback: nil)
        if case let .controlReply(code, text) = response { return (code, text) }
        throw try unexpected(response, plugin: plugin)
    }

    /// A plugin's enrolled count and domain state.
    package func state(plugin: String) throws(PluginHostError) -> EnrollmentState {
        let response = try core.request(.state(plugin: plugin), id: nil, timeout: core.configuration.controlTimeout, feedback: nil)
        if case let .stateReply(code, count, domain) = response {
            return EnrollmentState(code: code, enrolledCount: count, domainState: domain)
        }
        throw try unexpected(response, plugin: plugin)
    }

    private func unexpected(_ response: HostResponse, plugin: String) throws(PluginHostError) -> PluginHostError {
        if case let .error(code, message) = response {
            return code == PluginErrorCode.unknownPlugin.rawValue ? .unknownPlugin(plugin) : .refused(code: code, message: message)
        }
        return .protocolError("unexpected reply type")
    }
}

/// The shared state of a ``PluginHost`` and its supervisor thread.
final class Core: Sendable {
    struct Pending {
        let generation: Int
        var response: HostResponse? = nil
        var failure: PluginHostError? = nil
        let feedback: (@Sendable (String) -> Void)?
    }

    struct State {
        var generation = 0
        var socket: Int32 = -1
        var pid: Int32 = 0
        var ready = false
        var plugins: [PluginInfo] = []
        var refused: [RefusedPlugin] = []
        var pending: [UInt32: Pending] = [:]
        var reserved: Set<UInt32> = []
        /// Cancels of reserved ids (a ticket made, its request not yet sent): the request then ends at
        /// once as cancelled instead of starting an evaluation nobody will answer (``send(_:id:onlyIfPending:)``).
        var cancelledBeforeSending: [UInt32: CancelReason] = [:]
        var nextID: UInt32 = 1
        var stopped = false
        var starts = 0
        var lastError: String? = nil
        var roundTrips = 0
    }

    let configuration: PluginHost.Configuration
    let state = Protected(State())
    let writeLock = PThreadMutex()

    init(_ configuration: PluginHost.Configuration) { self.configuration = configuration }

    func allocateID() -> UInt32 {
        state.withLock { s in
            while s.nextID == 0 || s.pending[s.nextID] != nil || s.reserved.contains(s.nextID) { s.nextID &+= 1 }
            let id = s.nextID
            s.nextID &+= 1
            s.reserved.insert(id)
            return id
        }
    }

    /// Waits until the host has answered HELLO (or the supervisor gave up).
    func waitReady() -> Result<Void, PluginHostError> {
        let ok = state.withLock(waitingUntil: { $0.ready || $0.stopped }, timeout: configuration.startTimeout) { s -> Bool in s.ready }
        if ok == true { return .success(()) }
        let why = state.withLock { $0.lastError } ?? "it did not start within \(configuration.startTimeout) s"
        return .failure(.unavailable(why))
    }

    /// What became of a request at the moment it was to be sent.
    private enum Sending { case sent(generation: Int), cancelled(CancelReason) }

    func request(_ request: HostRequest, id given: UInt32?, timeout: Double,
                 feedback: (@Sendable (String) -> Void)?) throws(PluginHostError) -> HostResponse {
        if case .failure(let e) = waitReady() {
            if let given { state.withLock { s in s.reserved.remove(given); s.cancelledBeforeSending[given] = nil } }
            throw e
        }
        let id = given ?? allocateID()
        // Registered and written under the write lock, as a CANCEL is checked and written: a cancel
        // finds the request either not yet registered (it is then never sent) or already on the wire
        // (the CANCEL goes after it), never registered but not yet written (the host would get the
        // CANCEL first, ignore it, then run the evaluation, which then waits for a touch nobody
        // expects and takes the next request's).
        let sent = writeLock.withLock { () -> Sending in
            let registered = state.withLock { s -> (fd: Int32, sending: Sending) in
                s.reserved.remove(id)
                if let reason = s.cancelledBeforeSending.removeValue(forKey: id) { return (-1, .cancelled(reason)) }
                s.roundTrips += 1
                s.pending[id] = Pending(generation: s.generation, feedback: feedback)
                return (s.socket, .sent(generation: s.generation))
            }
            if case .sent = registered.sending {
                var frame = request.encodeFrame(id: id)
                // A failed write: the supervisor sees the broken socket and fails the request.
                if registered.fd >= 0 { _ = UnixSocket.writeAll(registered.fd, frame) }
                secureZero(&frame)
            }
            return registered.sending
        }
        let generation: Int
        switch sent {
        case .sent(let g): generation = g
        case .cancelled(let reason): return .result(code: reason.code.rawValue, domainState: nil) // cancelled before it was sent
        }
        let outcome = state.withLock(waitingUntil: { $0.pending[id]?.response != nil || $0.pending[id]?.failure != nil },
                                     timeout: timeout) { s -> Result<HostResponse, PluginHostError> in
            let p = s.pending.removeValue(forKey: id)!
            if let r = p.response { return .success(r) }
            return .failure(p.failure!)
        }
        if let outcome { return try outcome.get() }
        // No answer in time: kill this generation of the host (the supervisor restarts it).
        state.withLock { s in
            s.pending.removeValue(forKey: id)
            if s.generation == generation && s.socket >= 0 { kill(s.pid, SIGKILL) }
        }
        throw .timedOut
    }

    /// Sends a frame that expects no reply (CANCEL), if `id` is pending (when `onlyIfPending`). A CANCEL of
    /// an id reserved for a request not yet sent (a ticket made, its evaluation about to start) is kept:
    /// that request then ends at once as cancelled, unsent (``request(_:id:timeout:feedback:)``).
    func send(_ request: HostRequest, id: UInt32, onlyIfPending: Bool) {
        writeLock.withLock {
            let fd = state.withLock { s -> Int32 in
                if onlyIfPending, s.pending[id] == nil {
                    if case .cancel(let reason) = request, s.reserved.contains(id) { s.cancelledBeforeSending[id] = reason }
                    return -1
                }
                return s.ready ? s.socket : -1
            }
            if fd >= 0 { _ = UnixSocket.writeAll(fd, request.encodeFrame(id: id)) }
        }
    }

    func write(_ frame: [UInt8], to fd: Int32) {
        guard fd >= 0 else { return }
        // A failed write: the supervisor sees the broken socket and fails the request.
        _ = writeLock.withLock { UnixSocket.writeAll(fd, frame) }
    }

    func shutdown() {
        state.withLock { s in
            s.stopped = true
            if s.socket >= 0 { Glibc.shutdown(s.socket, Int32(SHUT_RDWR)) }
        }
        state.broadcast()
    }

    /// The supervisor: start the host, read its frames until it exits, fail what was pending, restart.
    func supervise() {
        var quickExits = 0
        while !state.withLock({ $0.stopped }) {
            let startedAt = Threads.monotonicSeconds()
            let child: Subprocess.Child
            do {
                child = try Subprocess.spawn(executable: configuration.executable,
                                             arguments: ["--state-dir", configuration.stateDirectory]
                                                 + (configuration.logFile.map { ["--log-file", $0] } ?? [])
                                                 + configuration.systemPluginDirectories.flatMap { ["--system-dir", $0] }
                                                 + configuration.pluginDirectories,
                                             environment: configuration.environment)
            } catch {
                state.withLock { $0.lastError = "cannot start \(configuration.executable): \(error)" }
                state.broadcast()
                quickExits += 1
                Threads.sleep(seconds: min(0.1 * Double(quickExits), 2))
                continue
            }
            let pid = child.pid
            let fd = child.takeSocket().release()
            let generation = state.withLock { s -> Int in
                s.generation += 1
                s.socket = fd
                s.pid = pid
                s.starts += 1
                if s.stopped { Glibc.shutdown(fd, Int32(SHUT_RDWR)) }
                return s.generation
            }
            write(HostRequest.hello(minVersion: PluginWire.version, maxVersion: PluginWire.version).encodeFrame(id: 0), to: fd)
            readFrames(fd)
            state.withLock { s in
                s.ready = false
                s.socket = -1
                for (id, p) in s.pending where p.generation == generation && p.response == nil && p.failure == nil {
                    s.pending[id]?.failure = .hostCrashed
                }
            }
            state.broadcast()
            kill(pid, SIGKILL)
            close(fd)
            var status: Int32 = 0
            _ = try? Syscall.retrying("waitpid", "the plugin host") { waitpid(pid, &status, 0) }
            quickExits = Threads.monotonicSeconds() - startedAt < 1 ? quickExits + 1 : 0
            if quickExits > 1 { Threads.sleep(seconds: min(0.1 * Double(quickExits), 2)) }
        }
    }

    /// Reads frames until EOF or a framing/decoding error, delivering each.
    func readFrames(_ fd: Int32) {
        while true {
            guard let header = readExactly(fd, PluginWire.headerBytes) else { return }
            guard let length = PluginWire.bodyLength(header), let body = readExactly(fd, length) else { return }
            let decoded: (id: UInt32, response: HostResponse)
            do { decoded = try HostResponse.decodeBody(body) } catch {
                state.withLock { $0.lastError = "malformed frame from the host: \(error.description)" }
                return
            }
            switch decoded.response {
            case let .helloReply(version, plugins, refused):
                // Only the answer to this host's HELLO (id 0, before it is ready) counts: a HELLO_REPLY a
                // plugin writes onto the socket later cannot replace the plugin list (rule 9: dropped).
                guard decoded.id == 0, !state.withLock({ $0.ready }) else { continue }
                guard version == PluginWire.version else { return }
                state.withLock { s in
                    s.plugins = plugins
                    s.refused = refused
                    s.ready = true
                    s.lastError = nil
                }
                state.broadcast()
            case .error where decoded.id == 0:
                state.withLock { $0.lastError = "the host refused HELLO" }
                return
            case .feedback(let text):
                if let sink = state.withLock({ $0.pending[decoded.id]?.feedback }) { sink(text) }
            default:
                // A request's first reply is its answer: a later one for the same id (a plugin writing
                // frames of its own onto the socket) cannot replace it; one for an id that is not pending
                // (never sent, or already answered) is dropped.
                state.withLock { s in
                    if let p = s.pending[decoded.id], p.response == nil, p.failure == nil { s.pending[decoded.id]?.response = decoded.response }
                }
                state.broadcast()
            }
        }
    }

    func readExactly(_ fd: Int32, _ n: Int) -> [UInt8]? { UnixSocket.readExactly(fd, count: n) }
}
