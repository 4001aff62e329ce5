import CSystemShims
import Glibc

/// Who is at the other end of a Unix socket (SO_PEERCRED), plus the executable it runs: read once
/// when a connection is accepted, and carried from there into the identity resolver
/// (`ProcessHandle.peer(ofSocket:credentials:)`), which does not read the credentials again.
package struct PeerIdentity: Sendable, Equatable, CustomStringConvertible {
    /// Peer process id at connect time.
    package let pid: Int32
    /// Peer user id.
    package let uid: UInt32
    /// Peer group id.
    package let gid: UInt32
    /// `/proc/PID/exe` as resolved at connect time (nil if it could not be read).
    package let executable: String?

    /// Reads the peer of a connected socket. The read is the call ``Syscall`` names
    /// `getsockopt` on ``credentialsKey(socket:)`` (tests count it with ``SyscallFaults``).
    package static func of(socket fd: Int32) throws(SystemError) -> PeerIdentity {
        var pid: pid_t = 0, uid: uid_t = 0, gid: gid_t = 0
        _ = try Syscall.retrying("getsockopt", credentialsKey(socket: fd)) { unsafe coffer_peer_credentials(fd, &pid, &uid, &gid) }
        return PeerIdentity(pid: pid, uid: uid, gid: gid, executable: executablePath(pid: pid))
    }

    /// What an `SO_PEERCRED` read of socket `fd` is called in ``SyscallFaults`` and errors.
    package static func credentialsKey(socket fd: Int32) -> String { "SO_PEERCRED of socket \(fd)" }

    /// The target of `/proc/PID/exe`.
    package static func executablePath(pid: Int32) -> String? { ThisProcess.executablePath(pid: pid) }

    package var description: String { "pid \(pid) uid \(uid) \(executable ?? "?")" }
}

/// Descriptors a peer passed with `SCM_RIGHTS` while one frame was read: owned here until taken,
/// closed when this goes (so a descriptor nobody asked for never stays open in the agent).
/// Used by the reading thread only.
package final class PassedDescriptors: @unchecked Sendable {
    // @unchecked Sendable: one frame's reader owns it (a frame is read and handled on one thread).
    /// Most descriptors one receive takes; more in one message are closed and mark it ``overflowed``.
    package static let maximum = 8
    private var fds: [Int32] = []
    /// True if the peer passed more descriptors than could be taken (they were closed on arrival).
    package private(set) var overflowed = false

    package init() {}

    /// How many descriptors arrived (not counting those closed on arrival).
    package var count: Int { fds.count }

    /// Takes ownership of `received`.
    func adopt(_ received: [Int32], truncated: Bool) {
        fds += received
        if truncated { overflowed = true }
    }

    /// Hands over the one descriptor that arrived; nil (the rest closed) if none did, or several
    /// (or more than could be taken) did.
    package func takeOnly() -> FileDescriptor? {
        guard fds.count == 1, !overflowed else { closeAll(); return nil }
        let fd = fds.removeFirst()
        return FileDescriptor(adopting: fd)
    }

    /// Closes every descriptor still held.
    package func closeAll() {
        for fd in fds { _ = Glibc.close(fd) }
        fds = []
    }

    deinit { closeAll() }
}

/// Unix stream sockets: the only Swift code making raw socket calls.
package enum UnixSocket {
    /// Longest socket path (sun_path minus the terminator).
    package static let maxPathBytes = MemoryLayout.size(ofValue: sockaddr_un().sun_path) - 1

    private static func withAddress<R>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> R) throws(SystemError) -> R {
        let bytes = Array(path.utf8)
        guard !bytes.isEmpty, bytes.count <= maxPathBytes else { throw SystemError("socket path too long", path, errno: ENAMETOOLONG) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        unsafe withUnsafeMutableBytes(of: &addr.sun_path) { p in
            for (i, b) in bytes.enumerated() { unsafe p[i] = b }
        }
        return unsafe withUnsafePointer(to: &addr) {
            unsafe $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { unsafe body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
    }

    /// Creates a listening socket at `path` with mode 0600. The caller has made sure the directory is
    /// the user's own and private (``Files/makePrivateDirectory(_:mode:)``). A stale socket file is
    /// replaced; a live one is an error: EADDRINUSE when another agent of this user answers, EPERM
    /// when a process of another uid answers (only root can have put it in a private directory; the
    /// agent neither talks to it nor replaces it).
    package static func listen(path: String, backlog: Int32 = 128) throws(SystemError) -> Int32 {
        if Files.exists(path) {
            if let probe = try? connect(path: path) {
                let owner = try? peerUID(probe)
                close(probe)
                if let owner, owner != geteuid() {
                    throw SystemError(refusing: path, "is served by a process of uid \(owner), not by you (uid \(geteuid())); only root "
                        + "can have put it in your private directory; refusing to start beside it or to replace it", errno: EPERM)
                }
                throw SystemError("another agent is listening on", path, errno: EADDRINUSE)
            }
            unsafe unlink(path)
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket", path) }
        let old = umask(0o177)
        let rc = unsafe try withAddress(path) { unsafe bind(fd, $0, $1) }
        umask(old)
        guard rc == 0 else { let e = SystemError("bind", path); close(fd); throw e }
        guard unsafe chmod(path, 0o600) == 0 else { let e = SystemError("chmod", path); close(fd); throw e }
        guard Glibc.listen(fd, backlog) == 0 else { let e = SystemError("listen", path); close(fd); throw e }
        return fd
    }

    /// The user id of the process at the other end of a connected Unix socket (SO_PEERCRED: for a
    /// client, the uid that created the listening socket). One getsockopt.
    package static func peerUID(_ fd: Int32) throws(SystemError) -> UInt32 {
        var pid: pid_t = 0, uid: uid_t = 0, gid: gid_t = 0
        guard unsafe coffer_peer_credentials(fd, &pid, &uid, &gid) == 0 else { throw SystemError("getsockopt", "SO_PEERCRED") }
        return uid
    }

    /// Connects to the socket at `path`.
    package static func connect(path: String) throws(SystemError) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket", path) }
        let (rc, e) = unsafe try withAddress(path) { addr, len in Syscall.result { unsafe Glibc.connect(fd, addr, len) } }
        guard rc == 0 else { close(fd); throw SystemError("connect", path, errno: e) }
        return fd
    }

    /// Accepts one connection (retrying EINTR); the new socket is close-on-exec.
    package static func accept(_ listener: Int32) throws(SystemError) -> Int32 {
        try Syscall.retrying("accept", "listener") { coffer_accept_cloexec(listener) }
    }

    /// Writes every byte (retrying EINTR and short writes). MSG_NOSIGNAL: a vanished peer is an error, not SIGPIPE.
    package static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, dontWait: Bool = false) -> Bool {
        var off = 0
        let flags = Int32(MSG_NOSIGNAL) | (dontWait ? Int32(MSG_DONTWAIT) : 0)
        while off < bytes.count {
            let (n, _) = Syscall.result { unsafe send(fd, bytes.baseAddress! + off, bytes.count - off, flags) }
            if n <= 0 { return false }
            off += n
        }
        return true
    }

    /// Reads exactly `buffer.count` bytes; false on EOF, error or timeout before that.
    package static func readExactly(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) -> Bool {
        var off = 0
        while off < buffer.count {
            let (n, _) = Syscall.result { unsafe recv(fd, buffer.baseAddress! + off, buffer.count - off, 0) }
            if n <= 0 { return false }
            off += n
        }
        return true
    }

    /// Reads exactly `count` bytes into a new array; nil on EOF, error or timeout before that.
    package static func readExactly(_ fd: Int32, count: Int) -> [UInt8]? {
        var buffer = [UInt8](repeating: 0, count: count)
        let ok = unsafe buffer.withUnsafeMutableBytes { unsafe readExactly(fd, into: $0) }
        return ok ? buffer : nil
    }

    /// Writes every byte of `bytes` (see ``writeAll(_:_:dontWait:)``).
    @discardableResult
    package static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        unsafe bytes.withUnsafeBytes { unsafe writeAll(fd, $0) }
    }

    /// What one ``receive(_:into:dontWait:)`` got.
    package enum Received: Equatable, Sendable {
        /// This many bytes (at least one).
        case bytes(Int)
        /// The peer closed its end (end of stream).
        case closed
        /// Nothing there yet (only with `dontWait`, or a receive timeout).
        case wouldBlock
        /// The receive failed with this `errno`.
        case failed(Int32)
    }

    /// One `recv` into `buffer` (EINTR retried, `errno` captured at once). With `dontWait`, returns
    /// ``Received/wouldBlock`` instead of waiting for data (`MSG_DONTWAIT`).
    package static func receive(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, dontWait: Bool) -> Received {
        guard buffer.count > 0 else { return .bytes(0) }
        let (n, e) = Syscall.result { unsafe recv(fd, buffer.baseAddress!, buffer.count, dontWait ? Int32(MSG_DONTWAIT) : 0) }
        if n > 0 { return .bytes(n) }
        if n == 0 { return .closed }
        return e == EAGAIN || e == EWOULDBLOCK ? .wouldBlock : .failed(e)
    }

    /// One `recvmsg` into `buffer`, as ``receive(_:into:dontWait:)``, that also takes the descriptors
    /// passed with these bytes (`SCM_RIGHTS`) into `passed`, which owns them from then on (the kernel
    /// installs them in this process whether or not anyone wants them: whoever reads a socket a peer
    /// may pass descriptors on must take them, or close them, or they leak).
    package static func receive(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, dontWait: Bool,
                                passed: PassedDescriptors) -> Received {
        guard buffer.count > 0 else { return .bytes(0) }
        // The descriptors land on the stack: a frame without any costs no allocation.
        let (n, e) = unsafe withUnsafeTemporaryAllocation(of: Int32.self, capacity: PassedDescriptors.maximum) { fds in
            var count: Int32 = 0, truncated: Int32 = 0
            let r = Syscall.result {
                unsafe Int(coffer_recv_with_fds(fd, buffer.baseAddress!, UInt(buffer.count), dontWait ? Int32(MSG_DONTWAIT) : 0,
                                                fds.baseAddress!, Int32(fds.count), &count, &truncated))
            }
            if count > 0 || truncated != 0 { unsafe passed.adopt(Array(fds[0..<Int(max(0, count))]), truncated: truncated != 0) }
            return r
        }
        if n > 0 { return .bytes(n) }
        if n == 0 { return .closed }
        return e == EAGAIN || e == EWOULDBLOCK ? .wouldBlock : .failed(e)
    }

    /// Writes every byte of `bytes`, the first `sendmsg` carrying `descriptors` (at most
    /// ``PassedDescriptors/maximum``) as `SCM_RIGHTS`: the receiver gets them with the first bytes.
    /// The descriptors stay open here. False if the peer is gone or the send failed.
    package static func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, passing descriptors: [Int32]) -> Bool {
        guard !descriptors.isEmpty else { return unsafe writeAll(fd, bytes) }
        guard descriptors.count <= PassedDescriptors.maximum, bytes.count > 0 else { return false }
        let (n, _) = Syscall.result { unsafe Int(coffer_send_with_fds(fd, bytes.baseAddress!, UInt(bytes.count), descriptors, Int32(descriptors.count))) }
        guard n > 0 else { return false }
        return unsafe n == bytes.count || writeAll(fd, UnsafeRawBufferPointer(rebasing: bytes[n...]))
    }

    /// Waits up to `timeoutMillis` for `fd` to become readable (or closed); true if it did. An
    /// interrupted wait returns false early (the caller re-checks its deadline and waits again).
    @discardableResult
    package static func waitReadable(_ fd: Int32, timeoutMillis: Int32) -> Bool {
        var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return unsafe poll(&p, 1, timeoutMillis) > 0
    }

    /// Waits up to `spinMicros` for `fd` to become readable by polling without sleeping, then returns.
    ///
    /// For a reply that is expected within tens of microseconds, spinning avoids the scheduler
    /// wake-up a blocking read pays (≈ 15–30 µs on an idle virtual machine). Callers then block as usual.
    /// Each poll yields the CPU: when the peer that must answer runs on the same CPU, a plain spin
    /// would keep it off that CPU for the whole budget (round trips measured 80–140 µs instead of 20,
    /// depending on where the scheduler placed the two threads); with the yield both placements
    /// measure ≈ 20 µs.
    ///
    /// Returns true if something was there at the first look (nothing was waited for; a budget of 0
    /// only looks).
    @discardableResult
    package static func spinUntilReadable(_ fd: Int32, spinMicros: Double) -> Bool {
        let deadline = Threads.monotonicSeconds() + spinMicros / 1e6
        var byte: UInt8 = 0
        var first = true
        while true {
            if unsafe recv(fd, &byte, 1, Int32(MSG_PEEK) | Int32(MSG_DONTWAIT)) != -1 || errno != EAGAIN { return first }
            first = false
            guard spinMicros > 0 else { return false }
            sched_yield()
            if Threads.monotonicSeconds() >= deadline { return false }
        }
    }

    /// Sets send/receive timeouts (0 = none).
    package static func setTimeouts(_ fd: Int32, send: Double, receive: Double) {
        func tv(_ s: Double) -> timeval { timeval(tv_sec: Int(s), tv_usec: Int((s - Double(Int(s))) * 1e6)) }
        var s = tv(send), r = tv(receive)
        unsafe setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &s, socklen_t(MemoryLayout<timeval>.size))
        unsafe setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &r, socklen_t(MemoryLayout<timeval>.size))
    }
}

/// systemd integration without libsystemd: socket activation and readiness notification.
package enum Systemd {
    /// The listening sockets systemd passed, by role.
    package struct ActivationSockets: Sendable, Equatable {
        /// The native socket: the fd named ``nativeSocketName``, else the first one not taken as another
        /// role's (so a single unnamed fd, as older units pass, is the native socket).
        package var native: Int32?
        /// The ssh-agent socket: the fd named ``sshAgentSocketName`` (or, without a
        /// `FileDescriptorName=`, systemd's default name for it, the unit's name).
        package var sshAgent: Int32?
        /// Passed fds with no role here (closed by ``activationSockets()``).
        package var unused: [Int32] = []

        package init(native: Int32? = nil, sshAgent: Int32? = nil, unused: [Int32] = []) {
            self.native = native
            self.sshAgent = sshAgent
            self.unused = unused
        }
    }

    /// `FileDescriptorName=` of coffer-agent.socket and coffer-ssh-agent.socket.
    package static let nativeSocketName = "agent", sshAgentSocketName = "ssh-agent"
    /// The name systemd gives the ssh-agent socket's fd when its unit sets no `FileDescriptorName=`.
    static let sshAgentSocketUnitName = "coffer-ssh-agent.socket"

    /// The listening sockets passed by systemd socket activation (LISTEN_FDS fds from 3, named by
    /// LISTEN_FDNAMES), if this process was given any; fds it has no use for are closed. Clears
    /// LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES so children do not inherit them.
    package static func activationSockets() -> ActivationSockets? {
        defer { unsafe unsetenv("LISTEN_PID"); unsafe unsetenv("LISTEN_FDS"); unsafe unsetenv("LISTEN_FDNAMES") }
        guard let pidText = unsafe getenv("LISTEN_PID").map({ unsafe String(cString: $0) }), Int32(pidText) == getpid(),
              let fdsText = unsafe getenv("LISTEN_FDS").map({ unsafe String(cString: $0) }), let n = Int(fdsText), n >= 1 else { return nil }
        let names = unsafe getenv("LISTEN_FDNAMES").map { unsafe String(cString: $0).split(separator: ":", omittingEmptySubsequences: false).map(String.init) }
        let sockets = assign(count: n, names: names, firstFD: 3)
        for fd in [sockets.native, sockets.sshAgent].compactMap({ $0 }) {
            let flags = fcntl(fd, F_GETFD)
            if flags >= 0 { _ = fcntl(fd, F_SETFD, flags | FD_CLOEXEC) }
        }
        for fd in sockets.unused { close(fd) }
        return sockets
    }

    /// The roles of `count` passed fds numbered from `firstFD`, by their `names` (LISTEN_FDNAMES; nil or
    /// a list of another length: all unnamed).
    package static func assign(count: Int, names: [String]?, firstFD: Int32) -> ActivationSockets {
        let names = names.flatMap { $0.count == count ? $0 : nil } ?? Array(repeating: "", count: count)
        let fds = (0..<count).map { firstFD + Int32($0) }
        var sockets = ActivationSockets()
        sockets.sshAgent = fds.indices.first { names[$0] == sshAgentSocketName || names[$0] == sshAgentSocketUnitName }.map { fds[$0] }
        sockets.native = fds.indices.first { names[$0] == nativeSocketName }.map { fds[$0] }
            ?? fds.first { $0 != sockets.sshAgent }
        sockets.unused = fds.filter { $0 != sockets.native && $0 != sockets.sshAgent }
        return sockets
    }

    /// Sends `state` (e.g. "READY=1") to $NOTIFY_SOCKET; false if not under systemd.
    @discardableResult
    package static func notify(_ state: String) -> Bool {
        guard let raw = unsafe getenv("NOTIFY_SOCKET") else { return false }
        var path = unsafe Array(String(cString: raw).utf8)
        guard !path.isEmpty, path.count <= UnixSocket.maxPathBytes else { return false }
        if path[0] == UInt8(ascii: "@") { path[0] = 0 } // abstract namespace
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        unsafe withUnsafeMutableBytes(of: &addr.sun_path) { p in for (i, b) in path.enumerated() { unsafe p[i] = b } }
        let len = socklen_t(MemoryLayout<sa_family_t>.size + path.count)
        let msg = Array(state.utf8)
        let sent = unsafe withUnsafePointer(to: &addr) {
            unsafe $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { unsafe sendto(fd, msg, msg.count, Int32(MSG_NOSIGNAL), $0, len) }
        }
        return sent == msg.count
    }
}
