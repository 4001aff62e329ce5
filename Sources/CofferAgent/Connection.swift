import CofferCrypto
import CofferProtocol
import CofferSystem
import Glibc

/// One client connection: its socket, its caller's identity, and frame I/O.
///
/// Frame bodies are read into guarded memory (they may carry passcodes and secrets) and wiped when
/// released; replies that carried a secret are wiped after sending.
final class Connection: @unchecked Sendable {
    // @unchecked Sendable: `fd` and `peer` are immutable; flags are guarded by `state`;
    // writes are serialised by `writes`; reads happen on the serving thread only.
    let fd: Int32
    /// Who connected (SO_PEERCRED at accept time, and /proc/PID/exe).
    let peer: PeerIdentity
    /// True once the client's HELLO was accepted (serving thread only).
    var greeted = false
    private let writes = Lock()
    private let state = Lock()
    private var subscribed = false
    private var closed = false

    /// Seconds a started frame may take to arrive in full, and a reply to be accepted by the peer.
    static let ioTimeout = 10.0

    init(fd: Int32, peer: PeerIdentity) {
        self.fd = fd
        self.peer = peer
        UnixSocket.setTimeouts(fd, send: Self.ioTimeout, receive: Self.ioTimeout)
    }

    /// True once the client subscribed to lock events.
    var isSubscribed: Bool { state.withLock { subscribed && !closed } }

    /// Marks the connection subscribed.
    func subscribe() { state.withLock { subscribed = true } }

    /// Reads one frame body (type, request id, payload) into secure memory, first polling for up to
    /// `spinMicros` (a client in a request loop sends its next request within microseconds; polling
    /// saves the scheduler wake-up a blocking read pays). A large body first takes its size from
    /// `budget` (the caller releases ``Frame/budgetBytes`` once done with it). Nil when the peer
    /// closed, stalled mid-frame, sent a length outside the protocol's bounds (framing errors
    /// close), or no locked memory for its body became free within ``ioTimeout``.
    func readFrame(spinMicros: Double = 0, budget: FrameBudget) -> Frame? {
        if spinMicros > 0 { UnixSocket.spinUntilReadable(fd, spinMicros: spinMicros) }
        var header: UInt32 = 0
        let gotHeader = withUnsafeMutableBytes(of: &header) { read($0, idleAllowed: true) }
        guard gotHeader else { return nil }
        let length = Int(UInt32(bigEndian: header))
        guard length >= WireFormat.minimumBodyBytes, length <= WireFormat.maximumBodyBytes else { return nil }
        let cost = FrameBudget.cost(ofBody: length)
        guard budget.acquire(cost, timeout: Self.ioTimeout) else { return nil }
        let body = SecureBytes(count: length)
        guard body.withUnsafeMutableBytes({ read($0, idleAllowed: false) }) else {
            budget.release(cost)
            return nil
        }
        return Frame(body: body, budgetBytes: cost)
    }

    /// A frame body read from the client and the frame budget it holds.
    struct Frame {
        let body: SecureBytes
        let budgetBytes: Int
    }

    /// Reads exactly `buffer.count` bytes. While nothing of a frame has arrived, receive timeouts
    /// just mean an idle client; once a frame started, a timeout ends the connection.
    private func read(_ buffer: UnsafeMutableRawBufferPointer, idleAllowed: Bool) -> Bool {
        var off = 0
        while off < buffer.count {
            let n = recv(fd, buffer.baseAddress! + off, buffer.count - off, 0)
            if n > 0 { off += n; continue }
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && idleAllowed && off == 0 {
                if state.withLock({ closed }) { return false }
                continue
            }
            return false
        }
        return true
    }

    /// Sends a whole frame; false if the peer is gone or did not read for ``ioTimeout``.
    func send(_ frame: [UInt8]) -> Bool {
        writes.withLock { frame.withUnsafeBytes { UnixSocket.writeAll(fd, $0) } }
    }

    /// Sends an event frame without blocking: a subscriber that stopped reading is dropped, never waited for.
    func sendEvent(_ frame: [UInt8]) -> Bool {
        writes.withLock { frame.withUnsafeBytes { UnixSocket.writeAll(fd, $0, dontWait: true) } }
    }

    /// Stops the connection: the serving thread's next read fails and it releases the socket.
    func close() {
        let first: Bool = state.withLock {
            defer { closed = true }
            return !closed
        }
        if first { Glibc.shutdown(fd, Int32(SHUT_RDWR)) }
    }

    /// Closes the descriptor (the serving thread, once, at the end).
    func release() {
        close()
        Glibc.close(fd)
    }
}
