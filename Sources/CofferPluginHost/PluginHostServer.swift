import CCofferPlugin
import CofferCrypto
import CofferPluginProtocol
import CofferSystem
import Glibc

/// The host's side of the protocol: reads requests on one socket, runs every EVALUATE, CONTROL and
/// STATE on a thread of its own (so CANCEL and `present` reach a plugin blocked in an evaluation),
/// and writes each reply whole under one lock.
package final class PluginHostServer: @unchecked Sendable {
    // @unchecked Sendable: `fd` is only read and written through `writeLock` (writes) and the
    // serving thread (reads); the rest is immutable or in `Protected`.
    let fd: Int32
    let plugins: [String: LoadedPlugin]
    let loadResult: LoadResult
    let writeLock = PThreadMutex()
    let running = Protected<[UInt32: Running]>([:])
    /// Most requests running at once (each holds a thread).
    package static let maximumRunning = 32

    struct Running {
        let plugin: LoadedPlugin?
        var started = false
        var cancelled: CancelReason? = nil
    }

    /// Serves `fd` (the socket to the agent; not closed here) with the plugins of `load`.
    package init(fd: Int32, load: LoadResult) {
        self.fd = fd
        loadResult = load
        var byName: [String: LoadedPlugin] = [:]
        for p in load.plugins { byName[p.name] = p }
        plugins = byName
    }

    /// Reads and answers requests until the peer closes the socket or breaks the framing. The first
    /// frame must be HELLO.
    package func serve() {
        var greeted = false
        while true {
            guard let header = readExactly(PluginWire.headerBytes) else { return }
            guard let length = PluginWire.bodyLength(header) else {
                hostLog("closing: frame length outside \(PluginWire.minimumBodyBytes)...\(PluginWire.maximumBodyBytes)")
                return
            }
            guard var body = readExactly(length) else { return }
            let id = body[1..<5].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
            let decoded = Result { () throws(PluginProtocolError) in try HostRequest.decodeBody(body) }
            secureZero(&body)
            switch decoded {
            case .failure(let e):
                send(.error(code: PluginErrorCode.malformed.rawValue, message: "malformed request: \(e.description)"), id)
                if !greeted { return }
            case .success((_, .hello(let lo, let hi))):
                guard !greeted else {
                    send(.error(code: PluginErrorCode.malformed.rawValue, message: "HELLO was already received"), id)
                    continue
                }
                guard lo <= PluginWire.version, PluginWire.version <= hi else {
                    send(.error(code: PluginErrorCode.version.rawValue, message: "this host speaks version \(PluginWire.version)"), id)
                    return
                }
                greeted = true
                send(.helloReply(version: PluginWire.version, plugins: loadResult.plugins.map(\.info), refused: loadResult.refused), id)
            case .success((_, let request)):
                guard greeted else {
                    send(.error(code: PluginErrorCode.malformed.rawValue, message: "the first request must be HELLO"), id)
                    return
                }
                handle(request, id: id)
            }
        }
    }

    func handle(_ request: HostRequest, id: UInt32) {
        switch request {
        case .hello:
            break // handled in serve
        case let .cancel(reason):
            cancel(id: id, reason: reason)
        case let .evaluate(name, reason, app, timeout, credential):
            guard let plugin = plugins[name] else {
                credential?.wipe()
                return send(.error(code: PluginErrorCode.unknownPlugin.rawValue, message: "no plugin of that name is loaded"), id)
            }
            guard admit(id: id, plugin: plugin) else { credential?.wipe(); return }
            let started = Threads.detach { [self] in
                let code = evaluate(plugin, id: id, reason: reason, app: app, timeoutMillis: timeout, credential: credential)
                credential?.wipe()
                let e = plugin.enrollment()
                running.withLock { _ = $0.removeValue(forKey: id) }
                send(.result(code: code, domainState: e.domainState), id)
            }
            if !started { refuseBusy(id) }
        case let .control(name, command, arguments):
            guard let plugin = plugins[name] else {
                return send(.error(code: PluginErrorCode.unknownPlugin.rawValue, message: "no plugin of that name is loaded"), id)
            }
            runDetached(id) { [self] in
                let (code, text) = control(plugin, command: command, arguments: arguments)
                send(.controlReply(code: code, text: text), id)
            }
        case let .state(name):
            guard let plugin = plugins[name] else {
                return send(.error(code: PluginErrorCode.unknownPlugin.rawValue, message: "no plugin of that name is loaded"), id)
            }
            runDetached(id) { [self] in
                let e = plugin.enrollment()
                send(.stateReply(code: e.code, enrolledCount: e.count, domainState: e.domainState), id)
            }
        }
    }

    /// Registers a running request; false (and ERROR busy sent) if the id runs already or too many run.
    func admit(id: UInt32, plugin: LoadedPlugin?) -> Bool {
        let ok = running.withLock { r -> Bool in
            guard r[id] == nil, r.count < Self.maximumRunning else { return false }
            r[id] = Running(plugin: plugin)
            return true
        }
        if !ok { send(.error(code: PluginErrorCode.busy.rawValue, message: "that id is running, or too many requests are"), id) }
        return ok
    }

    func refuseBusy(_ id: UInt32) {
        running.withLock { _ = $0.removeValue(forKey: id) }
        send(.error(code: PluginErrorCode.busy.rawValue, message: "no thread for the request"), id)
    }

    func runDetached(_ id: UInt32, _ body: @escaping @Sendable () -> Void) {
        guard admit(id: id, plugin: nil) else { return }
        if !Threads.detach({ [self] in body(); running.withLock { _ = $0.removeValue(forKey: id) } }) { refuseBusy(id) }
    }

    /// Runs one evaluation: waits for the plugin to be free (within the deadline), then calls
    /// begin_evaluation. Returns an LAError code (anything else the plugin returns becomes -1).
    func evaluate(_ plugin: LoadedPlugin, id: UInt32, reason: String, app: String, timeoutMillis: UInt32,
                  credential: SecureBytes?) -> Int32 {
        let start = Threads.monotonicSeconds()
        let acquired: Void? = plugin.busy.withLock(waitingUntil: { !$0 }, timeout: Double(timeoutMillis) / 1000) { busy in busy = true }
        guard acquired != nil else { return LACode.systemCancel.rawValue }
        defer { plugin.busy.withLock { $0 = false }; plugin.busy.broadcast() }
        let cancelled = running.withLock { r -> CancelReason? in
            r[id]?.started = true
            return r[id]?.cancelled
        }
        if let cancelled { return cancelled.code.rawValue }
        let left = UInt32(max(1, Double(timeoutMillis) - (Threads.monotonicSeconds() - start) * 1000))
        let sink = unsafe Unmanaged.passRetained(FeedbackSink(server: self, id: id)).toOpaque()
        defer { unsafe Unmanaged<FeedbackSink>.fromOpaque(sink).release() }
        let code: Int32 = unsafe reason.withCString { reasonC in
            unsafe app.withCString { appC in
                func run(_ bytes: UnsafeRawBufferPointer) -> Int32 {
                    var e = unsafe coffer_evaluation_v1(
                        struct_size: UInt32(MemoryLayout<coffer_evaluation_v1>.size), timeout_ms: left, id: UInt64(id),
                        reason: reasonC, app_name: appC,
                        credential: bytes.count == 0 ? nil : bytes.baseAddress?.assumingMemoryBound(to: UInt8.self),
                        credential_len: bytes.count,
                        feedback: { ctx, text in
                            guard let ctx = unsafe ctx, let text = unsafe text else { return }
                            let s = unsafe Unmanaged<FeedbackSink>.fromOpaque(ctx).takeUnretainedValue()
                            unsafe s.server.send(.feedback(sanitizedText(String(cString: text), max: 512)), s.id)
                        },
                        feedback_context: unsafe sink)
                    return unsafe plugin.table.pointee.begin_evaluation(plugin.state, &e)
                }
                if let credential { return unsafe credential.withUnsafeBytes { unsafe run($0) } }
                return unsafe run(UnsafeRawBufferPointer(start: nil, count: 0))
            }
        }
        guard LACode(rawValue: code) != nil else {
            hostLog("plugin \(plugin.name) returned an undefined result code; reported as authenticationFailed")
            return LACode.authenticationFailed.rawValue
        }
        return code
    }

    /// Marks the evaluation cancelled and calls the plugin's cancel() every 50 ms until it returns
    /// (a cancel that lands just before the plugin registered the evaluation is not lost).
    func cancel(id: UInt32, reason: CancelReason) {
        let plugin = running.withLock { r -> LoadedPlugin? in
            guard r[id] != nil, r[id]?.cancelled == nil else { return nil }
            r[id]?.cancelled = reason
            return r[id]?.plugin
        }
        guard let plugin, let cancelFn = unsafe plugin.table.pointee.cancel else { return }
        Threads.detach { [self] in
            while running.withLock({ $0[id] != nil }) {
                if running.withLock({ $0[id]?.started == true }) { unsafe cancelFn(plugin.state, UInt64(id), reason.code.rawValue) }
                Threads.sleep(seconds: 0.05)
            }
        }
    }

    func control(_ plugin: LoadedPlugin, command: String, arguments: [String]) -> (Int32, String) {
        guard let f = unsafe plugin.table.pointee.control else { return (Int32(COFFER_STATUS_UNKNOWN_COMMAND.rawValue), "no control commands") }
        let size = Int(COFFER_CONTROL_REPLY_BYTES)
        var reply = [CChar](repeating: 0, count: size)
        let cargs = unsafe arguments.map { unsafe strdup($0) }
        defer { unsafe cargs.forEach { unsafe free($0) } }
        let rc = unsafe command.withCString { c in
            unsafe cargs.map { unsafe UnsafePointer($0) }.withUnsafeBufferPointer { argv in
                unsafe reply.withUnsafeMutableBufferPointer { unsafe f(plugin.state, c, argv.baseAddress, argv.count, $0.baseAddress, size) }
            }
        }
        reply[size - 1] = 0
        let text = unsafe reply.withUnsafeBufferPointer { unsafe String(decoding: UnsafeRawBufferPointer($0).prefix { $0 != 0 }, as: UTF8.self) }
        return (rc, sanitizedText(text, max: 1000))
    }

    /// Writes one frame whole (several threads send).
    func send(_ response: HostResponse, _ id: UInt32) {
        let frame = response.encodeFrame(id: id)
        // A failed send leaves the agent without its answer: it sees the broken socket and gives up.
        _ = writeLock.withLock { UnixSocket.writeAll(fd, frame) }
    }

    func readExactly(_ n: Int) -> [UInt8]? { UnixSocket.readExactly(fd, count: n) }
}

/// The context of an evaluation's feedback callback.
final class FeedbackSink {
    let server: PluginHostServer
    let id: UInt32
    init(server: PluginHostServer, id: UInt32) { self.server = server; self.id = id }
}

/// The `coffer-plugin-host` executable's main: non-dumpable, load, serve fd 3 until the agent closes it.
package enum PluginHostMain {
    package static let usage = "usage: coffer-plugin-host --state-dir DIR [--log-file FILE] [--system-dir DIR]... [PLUGIN_DIR...]"
        + ", or: coffer-plugin-host --sk-sign [--log-file FILE]"

    package static func run(_ arguments: [String]) -> Int32 {
        // One FIDO signature through a middleware, in a process of its own (the agent starts one per signature).
        if arguments.first == "--sk-sign" { return SecurityKeyHelper.run(Array(arguments.dropFirst())) }
        do { try ProcessHardening.disableCoreDumps() } catch {
            hostLog("cannot make the process non-dumpable: \(error)")
            return 1
        }
        var stateRoot: String? = nil
        var dirs: [(path: String, requireRoot: Bool)] = []
        var i = 0
        while i < arguments.count {
            if arguments[i] == "--state-dir", i + 1 < arguments.count { stateRoot = arguments[i + 1]; i += 2; continue }
            // A system directory: it, its ancestors and every plugin in it must belong to root.
            if arguments[i] == "--system-dir", i + 1 < arguments.count { dirs.append((arguments[i + 1], true)); i += 2; continue }
            if arguments[i] == "--log-file", i + 1 < arguments.count {
                // The log (every refusal, every plugin log line) appended to FILE instead of stderr.
                guard let log = try? FileDescriptor.open(arguments[i + 1], O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW, mode: 0o600),
                      (try? Syscall.retrying("dup2", "the log file") { dup2(log.rawValue, 2) }) != nil
                else { hostLog("cannot open the log file"); return 1 }
                i += 2
                continue
            }
            if arguments[i].hasPrefix("-") { hostLog(usage); return 2 }
            dirs.append((arguments[i], false)); i += 1
        }
        guard let stateRoot else { hostLog(usage); return 2 }
        do { try Files.makePrivateDirectory(stateRoot) } catch {
            hostLog("cannot make the state directory: \(error)")
            return 1
        }
        var st = stat()
        guard (try? Syscall.retrying("fstat", "fd 3") { unsafe fstat(3, &st) }) != nil, st.st_mode & S_IFMT == S_IFSOCK else {
            hostLog("descriptor 3 is not the agent's socket")
            return 2
        }
        let load = PluginLoader.load(dirs, stateRoot: stateRoot)
        PluginHostServer(fd: 3, load: load).serve()
        return 0
    }
}
