package import CofferCrypto
package import CofferModel
package import CofferSystem
import Glibc
package import Logging

/// How a front end cuts its byte stream into frames (the native protocol: a length prefix; a line
/// protocol: up to a newline). Built on ``Connection``'s readers, so every framing runs under the
/// same deadlines and the same ``FrameBudget``.
package protocol Framing: Sendable {
    /// Reads one frame from `conn`: before the conversation is `greeted`, its first byte must come
    /// within the connection's first-frame limit; `bufferedOnly` reads only what is already there.
    func readFrame(from conn: Connection, greeted: Bool, budget: FrameBudget, bufferedOnly: Bool) -> Result<Connection.Frame, Connection.ReadEnd>
}

/// A front end's side of a connection: serves one admitted, identified connection until it ends
/// (the server then forgets and closes it). It reads frames with ``SocketServer/readFrame(_:greeted:replying:)``
/// and runs each request inside ``SocketServer/request(_:)``, so shutdown can drain it.
package protocol ConnectionHandler: Sendable {
    func serve(_ conn: Connection, caller: CallerIdentity, server: SocketServer)
}

/// A Unix-socket server, one per listener, with no protocol of its own: accepts connections, refuses
/// other users (SO_PEERCRED) and connections beyond the limits of the shared ``ConnectionRegistry``
/// (all connections, and per process across every listener), identifies each caller once on its own
/// thread, and hands the connection to its ``ConnectionHandler``, which reads frames in the listener's
/// ``Framing`` under the first-frame timeout, the frame deadline and the shared ``FrameBudget``.
/// Shutdown (``Agent/shutdown()``) stops every listener, then drains the requests in flight.
package final class SocketServer: Sendable {
    /// The listener's name in logs (`native`, `ssh-agent`, …).
    let name: String
    private let listener: FileDescriptor
    let framing: any Framing
    let handler: any ConnectionHandler
    package let registry: ConnectionRegistry
    package let budget: FrameBudget
    let limits: Connection.Limits
    let refusals: RefusalLog
    let logger: Logger
    /// A connection's caller (nil: refuse it; the reason is logged by the identifier).
    private let identify: @Sendable (Connection) -> CallerIdentity?
    /// The pace each client process's last connection ended with (``Connection/pace``), by pid, so that a
    /// process that opens connection after connection is polled for as it deserves from its first request
    /// (a reused pid inherits only a polling budget). At most ``rememberedPaces`` processes.
    private let paces = Protected<[Int32: AdaptiveSpin]>([:])
    static let rememberedPaces = 64

    package init(name: String, listener: consuming FileDescriptor, framing: any Framing, handler: any ConnectionHandler,
         registry: ConnectionRegistry, budget: FrameBudget, limits: Connection.Limits, refusals: RefusalLog, logger: Logger,
         identify: @escaping @Sendable (Connection) -> CallerIdentity?) {
        self.name = name
        self.listener = listener
        self.framing = framing
        self.handler = handler
        self.registry = registry
        self.budget = budget
        self.limits = limits
        self.refusals = refusals
        self.logger = logger
        self.identify = identify
    }

    /// Starts the accept loop on its own thread.
    package func start() { Threads.detach { [self] in acceptLoop() } }

    /// Stops accepting (the accept loop ends once the registry is stopping).
    package func stopAccepting() { Glibc.shutdown(listener.rawValue, Int32(SHUT_RDWR)) }

    private func acceptLoop() {
        while true {
            let fd: Int32
            do {
                fd = try UnixSocket.accept(listener.rawValue)
            } catch {
                if registry.isStopping { return }
                if error.errno == EMFILE || error.errno == ENFILE {
                    logger.error("out of file descriptors; pausing accepts", metadata: ["listener": "\(name)"])
                    Threads.sleep(seconds: 0.1)
                }
                continue
            }
            admit(fd)
        }
    }

    private func admit(_ fd: Int32) {
        let socket = FileDescriptor(adopting: fd) // a refused connection closes with it
        let peer: PeerIdentity
        do {
            peer = try PeerIdentity.of(socket: socket.rawValue)
        } catch {
            refusals.log("credentials", "refused a connection whose peer credentials cannot be read (SO_PEERCRED)", peer: nil)
            return
        }
        guard peer.uid == getuid() else {
            refusals.log("other-user", "refused a connection from another user", peer: peer)
            return
        }
        let conn = Connection(socket: socket, peer: peer, limits: limits, framing: framing)
        if let known = paces.withLock({ $0[peer.pid] }) { conn.pace = known }
        switch registry.admit(conn) {
        case .admitted: break
        case .stopping:
            conn.release()
            return
        case .full:
            refusals.log("full", "too many connections (\(registry.maxConnections)); refusing one", peer: peer)
            conn.release()
            return
        case .processFull:
            refusals.log("process-full", "refused a connection: process already has \(registry.maxPerProcess) connections", peer: peer)
            conn.release()
            return
        }
        let started = Threads.detach { [self] in
            if let caller = identify(conn) { handler.serve(conn, caller: caller, server: self) }
            forget(conn)
        }
        if !started { forget(conn) }
    }

    /// Removes a finished connection from the registry and closes it.
    private func forget(_ conn: Connection) {
        let pace = conn.pace
        paces.withLock { known in
            if known[conn.peer.pid] == nil && known.count >= Self.rememberedPaces { known.removeAll(keepingCapacity: true) }
            known[conn.peer.pid] = pace
        }
        registry.forget(conn)
        conn.release()
    }

    /// The connection's next frame (the caller releases its grant with ``release(_:)``); polls
    /// briefly first while few clients are connected and the conversation is `replying`.
    package func readFrame(_ conn: Connection, greeted: Bool, replying: Bool = true) -> Result<Connection.Frame, Connection.ReadEnd> {
        conn.readFrame(greeted: greeted, spinning: replying && mayPoll(), budget: budget, bufferedOnly: !replying)
    }

    /// Gives a frame's budget back and closes the descriptors passed with it that nobody took.
    package func release(_ frame: Connection.Frame) {
        budget.release(frame.grant)
        frame.descriptors.closeAll()
    }

    /// Serves a conversation in which every frame is one request (the ssh-agent protocol, a line
    /// protocol): reads frames (the first within the first-frame limit) until the peer closes, breaks
    /// framing or misses a deadline (reported as not sending `firstFrame`), runs each body through
    /// `handle` as a request in flight, and ends when `handle` returns false (its reply could not be
    /// sent) or the server stops. Each frame's budget is given back after its request.
    package func serveRequests(_ conn: Connection, firstFrame: String, _ handle: (SecureBytes) -> Bool) {
        var greeted = false
        while true {
            let frame: Connection.Frame
            switch readFrame(conn, greeted: greeted) {
            case .success(let f): frame = f
            case .failure(let end):
                reportEnd(end, of: conn, firstFrame: firstFrame)
                return
            }
            greeted = true
            defer { release(frame) }
            guard request({ handle(frame.body) }) == true else { return }
        }
    }

    /// Runs one request as in flight (shutdown waits for it); nil if the server is stopping.
    package func request<T>(_ body: () -> T) -> T? {
        guard registry.beginRequest() else { return nil }
        defer { registry.endRequest() }
        return body()
    }

    /// Logs (rate-limited) why a connection ended, when it was not the client's doing.
    package func reportEnd(_ end: Connection.ReadEnd, of conn: Connection, firstFrame: String) {
        switch end {
        case .closed: return
        case .helloTimeout:
            refusals.log("hello-timeout", "closed a connection that sent no \(firstFrame) within \(conn.limits.helloSeconds) s", peer: conn.peer)
        case .frameDeadline:
            refusals.log("frame-deadline", "closed a connection whose frame did not arrive within \(conn.limits.frameSeconds) s",
                         peer: conn.peer)
        case .badLength:
            refusals.log("framing", "closed a connection that sent a frame length outside the protocol's bounds", peer: conn.peer)
        case .noBudget:
            refusals.log("budget", "closed a connection: no locked memory for its large frame became free in time", peer: conn.peer)
        }
    }

    /// Whether a connection thread may poll for its client's next request (for as long as
    /// ``Connection`` has learnt that client takes): only while few clients are connected, so polling
    /// never competes with threads doing real work for the CPUs.
    private func mayPoll() -> Bool {
        registry.count <= Self.spinningConnectionLimit
    }

    /// Above this many connections, connection threads block instead of polling.
    static let spinningConnectionLimit = 2
}
