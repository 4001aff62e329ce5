package import CofferCrypto
package import CofferModel
package import CofferSystem
import Glibc

/// One client connection of a ``SocketServer``: its socket, its peer, and frame I/O in its front
/// end's ``Framing``.
///
/// Frame bodies are read into guarded memory (they may carry passcodes and secrets) and wiped when
/// released; replies that carried a secret are wiped after sending.
///
/// Time limits (``Limits``): a connection must send the first byte of its first frame (the native
/// protocol's HELLO) within
/// ``Limits/helloSeconds`` of connecting; once a frame's first byte arrived, the whole frame must
/// arrive within ``Limits/frameSeconds`` (an absolute deadline, not a per-read timeout, so a client
/// dripping a byte every few seconds cannot hold the connection, or the locked memory its frame
/// needs, for longer); time spent waiting for frame budget does not count against it. Between
/// frames, a greeted client may stay idle as long as it likes.
package final class Connection: @unchecked Sendable {
    // @unchecked Sendable: `socket`, `peer`, `limits` and `connectedAt` are immutable and the flags and the
    // event queue are owned by `state`, but `writes` is a bare mutex that guards the socket's write side
    // (no Swift state), and reads happen on the serving thread only: the compiler cannot see either.
    /// The connection's socket: closed when the last reference to the connection goes (never while a
    /// thread that still holds it, such as a lock-event broadcast, could write to the number reused).
    private let socket: FileDescriptor
    /// The socket's descriptor number (valid while this connection lives).
    package var fd: Int32 { socket.rawValue }
    /// Who connected (SO_PEERCRED at accept time, and /proc/PID/exe).
    package let peer: PeerIdentity
    /// The time limits this connection runs under.
    let limits: Limits
    /// How its front end cuts the byte stream into frames.
    let framing: any Framing
    /// When the connection was accepted (monotonic seconds).
    let connectedAt = Threads.monotonicSeconds()
    /// Held while writing to the socket (a reply, or queued events).
    private let writes = PThreadMutex()
    /// How long the serving thread polls for the client's next request, learnt from this client's last
    /// ones (serving thread only, as every read).
    private var nextRequestSpin = AdaptiveSpin(initialMicros: Connection.initialSpinMicros, ceilingMicros: Connection.spinCeilingMicros)
    /// A new client's first polling budget for its next request (a client in a request loop sends it within
    /// microseconds), and the longest (a program that builds and bridges a query first, on a busy machine).
    package static let initialSpinMicros = 50.0, spinCeilingMicros = 200.0
    private let state = Protected(IOState())

    private struct IOState {
        /// How lock events are encoded for this connection's front end (nil: not subscribed).
        var eventEncoding: (@Sendable (LockEvent) -> [UInt8])? = nil
        var eventTopics: EventTopics = []
        var closed = false
        /// Event frames waiting for the write lock (see ``sendEvent(_:)``).
        var pendingEvents: [[UInt8]] = []
        /// When the write in progress began (nil: none), to tell a busy writer from a stuck one.
        var writingSince: Double? = nil
        /// The largest frame body the conversation accepts now (see ``maximumBody``).
        var maximumBody: Int? = nil
    }

    /// The largest frame body this conversation accepts now, both ways, once its front end has set one
    /// (nil: the framing's own limit). The native front end sets it after a HELLO: 256 KiB, or 1.5 MiB
    /// at version 4.
    package var maximumBody: Int? {
        get { state.withLock { $0.maximumBody } }
        set { state.withLock { $0.maximumBody = newValue } }
    }

    /// Seconds a reply may take to be accepted by the peer (SO_SNDTIMEO), and the longest wait for frame budget.
    static let ioTimeout = 10.0
    /// Most event frames queued behind a reply being written; beyond that the subscriber is dropped.
    static let maxPendingEvents = 16
    /// An event that finds a reply write in progress for longer than this drops the subscriber
    /// instead of queueing behind it: that client stopped reading.
    static let stuckWriteSeconds = 0.5

    /// Per-connection time limits (configurable for tests; see ``AgentConfiguration``).
    package struct Limits: Sendable {
        /// The whole frame must arrive within this many seconds of its first byte.
        var frameSeconds: Double = 10
        /// The first byte of the first frame (HELLO) must arrive within this many seconds of the connection.
        var helloSeconds: Double = 5

        package init(frameSeconds: Double = 10, helloSeconds: Double = 5) {
            self.frameSeconds = frameSeconds
            self.helloSeconds = helloSeconds
        }
    }

    init(socket: consuming FileDescriptor, peer: PeerIdentity, limits: Limits = Limits(), framing: any Framing) {
        self.socket = socket
        self.peer = peer
        self.limits = limits
        self.framing = framing
        // Reads wait with poll() against the deadlines below; only sends use a socket timeout.
        UnixSocket.setTimeouts(fd, send: Self.ioTimeout, receive: 0)
    }

    /// True once the client subscribed to events.
    var isSubscribed: Bool { state.withLock { $0.eventEncoding != nil && !$0.closed } }

    /// The topics the connection is subscribed to (empty before SUBSCRIBE).
    package var subscribedTopics: EventTopics { state.withLock { $0.eventTopics } }

    /// Marks the connection subscribed to `topics`: their events go out encoded by `encoding`.
    package func subscribe(to topics: EventTopics, encoding: @escaping @Sendable (LockEvent) -> [UInt8]) {
        state.withLock { s in
            s.eventEncoding = encoding
            s.eventTopics = topics
        }
    }

    /// `event` as this connection's front end sends it (an item change without its groups unless the
    /// connection asked for them); nil if it is not subscribed to its topic (or closed).
    func eventFrame(_ event: LockEvent) -> [UInt8]? {
        let subscription = state.withLock { s in s.closed ? nil : s.eventEncoding.map { ($0, s.eventTopics) } }
        guard let (encoding, topics) = subscription, let delivered = event.delivered(to: topics) else { return nil }
        return encoding(delivered)
    }

    /// Why ``readFrame(greeted:spinning:budget:bufferedOnly:)`` returned no frame.
    package enum ReadEnd: Error {
        /// The peer closed (or the connection was closed), or a socket error.
        case closed
        /// No first frame (HELLO) began within ``Limits/helloSeconds``.
        case helloTimeout
        /// A frame did not arrive in full within ``Limits/frameSeconds`` of its first byte.
        case frameDeadline
        /// A length outside the protocol's bounds (framing error).
        case badLength
        /// No locked memory for the body became free within ``ioTimeout``.
        case noBudget
    }

    /// Reads one frame body (type, request id, payload) into secure memory (before the session is
    /// `greeted`, the first byte must come within ``Limits/helloSeconds`` of connecting). When
    /// `spinning`, it first polls for as long as this client's last requests took to come
    /// (``AdaptiveSpin``: a client in a request loop sends its next request within microseconds, and
    /// polling saves the scheduler wake-up a blocking read pays; a client whose requests come
    /// milliseconds apart is not polled for). A large body first takes its size from `budget` (the
    /// caller releases it with ``FrameBudget/release(_:)`` once done with it).
    ///
    /// `bufferedOnly`: read only what the socket already holds, never wait (after a reply could not
    /// be sent, the requests the client sent before it closed still run; see ``Agent``): a frame not
    /// wholly there is reported as ``ReadEnd/closed``.
    package func readFrame(greeted: Bool, spinning: Bool = false, budget: FrameBudget, bufferedOnly: Bool = false) -> Result<Frame, ReadEnd> {
        guard spinning, !bufferedOnly else { return framing.readFrame(from: self, greeted: greeted, budget: budget, bufferedOnly: bufferedOnly) }
        let start = Threads.monotonicSeconds()
        // A request already there (sent with the one before it: HELLO, DELEGATE and WHOAMI written at
        // once) says nothing of the client's pace: only a wait is learnt from.
        let waiting = !UnixSocket.spinUntilReadable(fd, spinMicros: nextRequestSpin.budgetMicros)
        let frame = framing.readFrame(from: self, greeted: greeted, budget: budget, bufferedOnly: false)
        if waiting, case .success = frame { nextRequestSpin.record(waitedMicros: (Threads.monotonicSeconds() - start) * 1e6) }
        return frame
    }

    /// What the serving thread has learnt of this client's pace: the server keeps it when the connection
    /// ends and starts the same process's next connection from it (the Secret Service front end opens a
    /// connection for each client, whose requests come milliseconds apart). Serving thread only, or
    /// before it starts.
    package var pace: AdaptiveSpin {
        get { nextRequestSpin }
        set { nextRequestSpin = newValue }
    }

    /// A frame of a length-prefixed framing: a header of `headerBytes` bytes that `bodyLength` turns
    /// into the body's length (nil: outside the protocol's bounds), then the body, into secure memory,
    /// under ``FrameBudget`` and the deadlines above.
    package func readLengthPrefixedFrame(headerBytes: Int, bodyLength: (UnsafeRawBufferPointer) -> Int?, greeted: Bool, budget: FrameBudget,
                                 bufferedOnly: Bool) -> Result<Frame, ReadEnd> {
        var deadline: Double? = nil
        let idleUntil: Double? = greeted ? nil : connectedAt + limits.helloSeconds
        let passed = PassedDescriptors()
        // The header on the stack: no allocation per frame.
        let length = withUnsafeTemporaryAllocation(byteCount: headerBytes, alignment: 1) { header -> Result<Int, ReadEnd> in
            if let end = receive(header, deadline: &deadline, idleUntil: idleUntil, bufferedOnly: bufferedOnly, passed: passed) { return .failure(end) }
            guard let length = bodyLength(UnsafeRawBufferPointer(header)) else { return .failure(.badLength) }
            return .success(length)
        }
        switch length {
        case .failure(let end): return .failure(end)
        case .success(let n): return readBody(length: n, deadline: &deadline, budget: budget, bufferedOnly: bufferedOnly, passed: passed)
        }
    }

    /// A frame of a line framing: bytes up to a newline (not included), at most `maximumBytes`
    /// (longer is ``ReadEnd/badLength``), read one byte at a time into secure memory (a line may
    /// carry a secret) under the deadlines above.
    func readLine(maximumBytes: Int, greeted: Bool, budget: FrameBudget, bufferedOnly: Bool) -> Result<Frame, ReadEnd> {
        let line = SecureBytes(count: maximumBytes)
        var deadline: Double? = nil
        var count = 0
        let passed = PassedDescriptors()
        while true {
            var byte: UInt8 = 0
            let end = withUnsafeMutableBytes(of: &byte) {
                receive($0, deadline: &deadline, idleUntil: greeted || count > 0 ? nil : connectedAt + limits.helloSeconds,
                        bufferedOnly: bufferedOnly, passed: passed)
            }
            if let end { return .failure(end) }
            if byte == UInt8(ascii: "\n") { break }
            guard count < maximumBytes else { return .failure(.badLength) }
            line.withUnsafeMutableBytes { $0[count] = byte }
            count += 1
        }
        defer { line.wipe() }
        return .success(Frame(body: line.slice(0..<count), grant: .none, descriptors: passed))
    }

    private func readBody(length: Int, deadline: inout Double?, budget: FrameBudget, bufferedOnly: Bool,
                          passed: PassedDescriptors) -> Result<Frame, ReadEnd> {
        let cost = FrameBudget.cost(ofBody: length)
        let waitStarted = Threads.monotonicSeconds()
        guard let grant = budget.acquire(cost, owner: peer.pid, timeout: Self.ioTimeout) else { return .failure(.noBudget) }
        // Waiting for others to free the budget is not this client's delay.
        deadline = deadline.map { $0 + (Threads.monotonicSeconds() - waitStarted) }
        let body = SecureBytes(count: length)
        if let end = body.withUnsafeMutableBytes({ receive($0, deadline: &deadline, idleUntil: nil, bufferedOnly: bufferedOnly, passed: passed) }) {
            budget.release(grant)
            return .failure(end)
        }
        return .success(Frame(body: body, grant: grant, descriptors: passed))
    }

    /// A frame body read from the client, the frame budget it holds, and the descriptors the client
    /// passed (`SCM_RIGHTS`) while it was read: only a native DELEGATE takes one; every other frame's
    /// are closed with it (``PassedDescriptors`` closes what nobody took).
    package struct Frame {
        package let body: SecureBytes
        package let grant: FrameBudget.Grant
        package let descriptors: PassedDescriptors
    }

    /// Reads exactly `buffer.count` bytes; nil on success, else why not. Until a frame's first byte
    /// arrives (`deadline` nil), the wait is bounded by `idleUntil` (nil: unbounded); the first byte
    /// sets `deadline` to ``Limits/frameSeconds`` later, and the rest must arrive by then.
    ///
    /// A greeted client's next frame is awaited with a plain blocking `recv` (no time limit; a
    /// ``close()`` wakes it). Under a time limit each read is a non-blocking `recv`, and only when no
    /// data is there does the thread wait in `poll` (a frame already in the socket costs no extra
    /// system call).
    private func receive(_ buffer: UnsafeMutableRawBufferPointer, deadline: inout Double?, idleUntil: Double?,
                         bufferedOnly: Bool = false, passed: PassedDescriptors) -> ReadEnd? {
        var off = 0
        while off < buffer.count {
            let dontWait = deadline != nil || idleUntil != nil || bufferedOnly
            switch UnixSocket.receive(fd, into: UnsafeMutableRawBufferPointer(rebasing: buffer[off...]), dontWait: dontWait, passed: passed) {
            case .bytes(let n):
                off += n
                if deadline == nil { deadline = Threads.monotonicSeconds() + limits.frameSeconds }
                continue
            case .closed, .failed:
                return .closed
            case .wouldBlock:
                break
            }
            if bufferedOnly { return .closed }
            if state.withLock({ $0.closed }) { return .closed }
            var waitMillis: Int32 = 10_000 // between frames: wake now and then to notice a close
            if let limit = deadline ?? idleUntil {
                let remaining = limit - Threads.monotonicSeconds()
                if remaining <= 0 { return deadline != nil ? .frameDeadline : .helloTimeout }
                waitMillis = Int32(min(10_000, max(1, (remaining * 1000).rounded(.up))))
            }
            _ = UnixSocket.waitReadable(fd, timeoutMillis: waitMillis)
        }
        return nil
    }

    /// Sends a whole frame; false if the peer is gone or did not read for ``ioTimeout``. Events
    /// queued meanwhile go out right after it.
    package func send(_ frame: [UInt8]) -> Bool {
        let ok = writes.withLock {
            let now = Threads.monotonicSeconds()
            state.withLock { $0.writingSince = now }
            defer { state.withLock { $0.writingSince = nil } }
            return frame.withUnsafeBytes { UnixSocket.writeAll(fd, $0) } && flushEvents()
        }
        return ok && drainEvents()
    }

    /// Sends an event frame without ever waiting: the lock path calls this for every subscriber.
    /// If a reply is being written, the event is queued and goes out right after it; if that write
    /// has been stuck for ``stuckWriteSeconds`` (the client stopped reading), if the queue is full,
    /// or if the socket buffer is full, this returns false and the caller drops the subscriber.
    func sendEvent(_ frame: [UInt8]) -> Bool {
        let now = Threads.monotonicSeconds()
        let queued: Bool = state.withLock { s in
            if let since = s.writingSince, now - since > Self.stuckWriteSeconds { return false }
            guard s.pendingEvents.count < Self.maxPendingEvents else { return false }
            s.pendingEvents.append(frame)
            return true
        }
        return queued && drainEvents()
    }

    /// Writes queued events if nobody holds the write lock; a holder writes them itself before or
    /// right after releasing it (it checks the queue again once released, so none is left behind).
    private func drainEvents() -> Bool {
        while state.withLock({ !$0.pendingEvents.isEmpty }) {
            guard let ok = writes.tryWithLock({ flushEvents() }) else { return true }
            if !ok { return false }
        }
        return true
    }

    /// Writes queued events without blocking (call holding `writes`); false if the socket is full.
    private func flushEvents() -> Bool {
        while let next: [UInt8] = state.withLock({ $0.pendingEvents.isEmpty ? nil : $0.pendingEvents.removeFirst() }) {
            guard next.withUnsafeBytes({ UnixSocket.writeAll(fd, $0, dontWait: true) }) else { return false }
        }
        return true
    }

    /// Stops the connection: the serving thread's next read fails and it releases the socket.
    package func close() {
        let first: Bool = state.withLock { s in
            defer { s.closed = true }
            return !s.closed
        }
        if first { Glibc.shutdown(fd, Int32(SHUT_RDWR)) }
    }

    /// Ends the connection (the serving thread, once, at the end); the descriptor itself closes with
    /// the last reference.
    func release() { close() }
}
