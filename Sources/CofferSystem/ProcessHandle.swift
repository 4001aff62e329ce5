import CSystemShims
import Glibc

/// A race-free handle on another process: a pidfd plus its `/proc/PID` directory, opened once.
///
/// A pid alone names whichever process has that number *now*; once the original exits and is
/// reaped the number can be reused. A pidfd names one process for as long as it is held, and
/// `/proc/PID` opened as a directory descriptor keeps reading that process's entries (they fail
/// with ESRCH once it is gone, even if the number is reused). So every fact about the process is
/// read relative to ``ProcessHandle``'s directory, and ``isAlive()`` afterwards proves the pid was
/// never reused meanwhile (a reaped process cannot come back; only a reaped process frees its pid).
///
/// The handle of a socket's peer comes from `SO_PEERPIDFD` (Linux 6.5+: the kernel pins the very
/// process that connected). Older kernels (Debian 12's 6.1) fall back to `pidfd_open` on the
/// `SO_PEERCRED` pid, confirmed afterwards to be live and of the peer's uid, as polkit's
/// CVE-2019-6133 fix and xdg-desktop-portal do; that fallback cannot tell a peer that exited and
/// whose pid was reused by another process of the same uid *before* `pidfd_open`.
///
/// A process that has no socket of its own to the agent (a bus sender) is pinned from a pidfd
/// handed over (``open(pidfd:)``) or from its pid (``open(pid:)``); for a pid, the caller re-checks
/// through the handle what it knew of the process (its uid, its start time).
package struct ProcessHandle: ~Copyable {
    /// How the pidfd was obtained.
    package enum Source: Sendable, Equatable {
        /// `getsockopt(SO_PEERPIDFD)`: the kernel's own record of the connecting process.
        case peerPIDFD
        /// `pidfd_open` on a pid: the `SO_PEERCRED` pid (kernels before 6.5) or one a caller knew,
        /// checked afterwards.
        case pidfdOpen
        /// A pidfd handed over by the caller (``open(pidfd:)``).
        case givenPIDFD
    }

    /// The process id (in this process's pid namespace).
    package let pid: Int32
    /// The process's effective uid (as `SO_PEERCRED` reports it), read through the pinned `/proc/PID`.
    package let uid: UInt32
    /// How the pidfd was obtained.
    package let source: Source
    /// The pidfd.
    let pidfd: FileDescriptor
    /// `/proc/PID`, opened once as a directory.
    let directory: FileDescriptor
    /// The lines of `/proc/PID/status` that identification reads (``statusKeys``), as they were when the
    /// handle was opened: before the check that the process was alive, so they are this process's.
    package let status: [String: String]

    /// The `/proc/PID/status` lines a handle keeps (``status``): the effective uid, and what identification
    /// reads (a tracer, the session, the state, the pid in each namespace). The file is read once.
    package static let statusKeys = ["Uid", "TracerPid", "NSsid", "State", "NSpid"]

    private init(pid: Int32, uid: UInt32, source: Source, pidfd: consuming FileDescriptor, directory: consuming FileDescriptor,
                 status: [String: String]) {
        self.pid = pid
        self.uid = uid
        self.source = source
        self.pidfd = pidfd
        self.directory = directory
        self.status = status
    }

    /// The process at the other end of the connected Unix socket `fd`, reading its credentials
    /// first (see ``peer(ofSocket:credentials:usePeerPIDFD:)``, which a server that has them from
    /// accepting the connection calls instead).
    package static func peer(ofSocket fd: Int32, usePeerPIDFD: Bool = true) throws(SystemError) -> ProcessHandle {
        try peer(ofSocket: fd, credentials: PeerIdentity.of(socket: fd), usePeerPIDFD: usePeerPIDFD)
    }

    /// The process at the other end of the connected Unix socket `fd`, whose `SO_PEERCRED`
    /// `credentials` were read when the connection was accepted (never read again: one read per
    /// connection). Throws if the peer has already been reaped (no handle on another process is ever
    /// returned instead: `SO_PEERPIDFD` fails then, and the fallback's pidfd must be alive and of the
    /// peer's uid). `usePeerPIDFD` false forces the `pidfd_open` fallback (for tests of older kernels).
    package static func peer(ofSocket fd: Int32, credentials: PeerIdentity, usePeerPIDFD: Bool = true) throws(SystemError) -> ProcessHandle {
        let credPID = credentials.pid, uid = credentials.uid
        guard credPID > 0 else { throw SystemError(refusing: "peer", "is in another pid namespace", errno: ESRCH) }
        if usePeerPIDFD {
            let (r, e) = Syscall.result { coffer_peer_pidfd(fd) }
            if r >= 0 {
                let handle = try open(pidfd: FileDescriptor(adopting: r), source: .peerPIDFD)
                guard handle.pid == credPID else {
                    throw SystemError(refusing: "pid \(credPID)", "is not the process behind the peer's pidfd", errno: ESRCH)
                }
                return handle
            } else if e != ENOPROTOOPT {
                // ESRCH / EINVAL: the peer exited and was reaped. Never fall back to its (reusable) pid.
                throw SystemError("getsockopt", "SO_PEERPIDFD", errno: e)
            }
        }
        // The process pidfd_open found must have the peer's uid (a reused pid of another user is
        // refused). SO_PEERCRED reports the effective uid, as ``uid`` does.
        let handle = try open(pid: credPID)
        guard handle.uid == uid else { throw SystemError(refusing: "pid \(credPID)", "is not of the peer's uid", errno: ESRCH) }
        return handle
    }

    /// The process that has `pid` now, pinned by `pidfd_open`. Nothing here tells whether it is the
    /// process the caller learned the pid of: the caller re-checks what it knew (its uid, its start
    /// time) through the handle, as `IdentityResolver.identify(pid:uid:startTime:)` does.
    package static func open(pid: Int32) throws(SystemError) -> ProcessHandle {
        guard pid > 0 else { throw SystemError(refusing: "pid \(pid)", "is not a process id", errno: ESRCH) }
        return try open(pidfd: pidfd(of: pid), source: .pidfdOpen)
    }

    /// `pidfd_open(pid)`: a pidfd for whichever process has `pid` now (close-on-exec).
    package static func pidfd(of pid: Int32) throws(SystemError) -> FileDescriptor {
        FileDescriptor(adopting: try Syscall.retrying("pidfd_open", "pid \(pid)") { coffer_pidfd_open(pid) })
    }

    /// The process behind `pidfd` (one a bus daemon or `SO_PEERPIDFD` handed over: it names one
    /// process for as long as it is held). Throws if that process has been reaped.
    package static func open(pidfd: consuming FileDescriptor) throws(SystemError) -> ProcessHandle {
        try open(pidfd: pidfd, source: .givenPIDFD)
    }

    private static func open(pidfd: consuming FileDescriptor, source: Source) throws(SystemError) -> ProcessHandle {
        let raw = pidfd.rawValue
        let pid = try Syscall.retrying("pidfd pid", "pidfd") { coffer_pidfd_pid(raw) }
        let directory = try FileDescriptor.open("/proc/\(pid)", O_RDONLY | O_DIRECTORY)
        // The effective uid: the second field of `Uid:` (what SO_PEERCRED reports); the other lines
        // identification reads come with it.
        let status = parseStatusFields(try readCapped(try Self.openAt(directory.rawValue, "status", O_RDONLY | O_NOFOLLOW | O_NOCTTY,
                                                                  what: "/proc/\(pid)/status"),
                                                       maximumBytes: 64 << 10, what: "/proc/\(pid)/status"), statusKeys)
        guard let uids = status["Uid"], case let fields = uids.split(separator: "\t"), fields.count >= 2, let uid = UInt32(fields[1]) else {
            throw SystemError(refusing: "pid \(pid)", "has no uid in its status", errno: ESRCH)
        }
        let handle = ProcessHandle(pid: pid, uid: uid, source: source, pidfd: pidfd, directory: directory, status: status)
        // Alive after /proc/PID was opened and read: the directory, the uid and the status are this process's.
        guard handle.isAlive() else { throw SystemError(refusing: "pid \(pid)", "exited during identification", errno: ESRCH) }
        return handle
    }

    /// True if `fd` is a pidfd (checked before any pidfd call on a descriptor another process handed
    /// over: a pidfd ioctl on an arbitrary device is not something to try).
    package static func isPIDFD(_ fd: borrowing FileDescriptor) -> Bool { coffer_is_pidfd(fd.rawValue) == 1 }

    /// True while the process has not been reaped (a zombie counts: it still holds its pid).
    /// Checked after reading anything about the process: true means every read was of this process.
    package func isAlive() -> Bool { coffer_pidfd_alive(pidfd.rawValue) == 1 }

    /// The contents of `/proc/PID/NAME` (one component, no symbolic links), at most `maximumBytes`.
    package func read(_ name: String, maximumBytes: Int = 64 << 10) throws(SystemError) -> [UInt8] {
        precondition(!name.contains("/"), "one path component")
        let fd = try Self.openAt(directory.rawValue, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY, what: "/proc/\(pid)/\(name)")
        return try Self.readCapped(fd, maximumBytes: maximumBytes, what: "/proc/\(pid)/\(name)")
    }

    /// The values of the `Key:\tvalue` lines of `/proc/PID/status` named in `keys` (one read).
    package func statusFields(_ keys: [String]) throws(SystemError) -> [String: String] {
        Self.parseStatusFields(try read("status"), keys)
    }

    private static func parseStatusFields(_ bytes: [UInt8], _ keys: [String]) -> [String: String] {
        // Scanned as bytes: splitting the ~1.5 KB text into Swift strings costs tens of microseconds.
        let prefixes = keys.map { Array($0.utf8) + [UInt8(ascii: ":")] }
        var out: [String: String] = [:]
        var start = 0
        while start < bytes.count, out.count < keys.count {
            let end = bytes[start...].firstIndex(of: UInt8(ascii: "\n")) ?? bytes.count
            for (i, prefix) in prefixes.enumerated()
            where end - start >= prefix.count && bytes[start..<(start + prefix.count)].elementsEqual(prefix) {
                var v = start + prefix.count
                while v < end, bytes[v] == UInt8(ascii: " ") || bytes[v] == UInt8(ascii: "\t") { v += 1 }
                out[keys[i]] = String(decoding: bytes[v..<end], as: UTF8.self)
            }
            start = end + 1
        }
        return out
    }

    /// `readlink /proc/PID/exe` as raw bytes (a deleted file shows as `PATH (deleted)`).
    package func executablePath() throws(SystemError) -> [UInt8] {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 32)
        let n = try Syscall.retrying("readlinkat", "/proc/\(pid)/exe") {
            unsafe buffer.withUnsafeMutableBytes { b in unsafe readlinkat(directory.rawValue, "exe", b.baseAddress!, b.count) }
        }
        return Array(buffer[0..<n])
    }

    /// Opens the very file the process executes through `/proc/PID/exe` (even if its path has since
    /// been deleted or replaced): hash this descriptor, never the path.
    package func openExecutable() throws(SystemError) -> FileDescriptor {
        try Self.openAt(directory.rawValue, "exe", O_RDONLY | O_NOCTTY | O_NONBLOCK, what: "/proc/\(pid)/exe")
    }

    /// Reads `NAME` (one component) in the process's root directory (`/proc/PID/root`, as the
    /// process sees `/`), as xdg-desktop-portal reads `.flatpak-info`: `openat` without following a
    /// symbolic link, a regular file only, at most `maximumBytes`. Nil if there is no such file.
    package func readInRoot(_ name: String, maximumBytes: Int) throws(SystemError) -> [UInt8]? {
        precondition(!name.contains("/") && name != ".." && name != ".", "one path component")
        let what = "/proc/\(pid)/root/\(name)"
        let root = try Self.openAt(directory.rawValue, "root", Self.openPathOnly | O_DIRECTORY, what: "/proc/\(pid)/root")
        let fd: FileDescriptor
        do throws(SystemError) {
            fd = try Self.openAt(root.rawValue, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK, what: what)
        } catch where error.errno == ENOENT {
            return nil
        }
        let st = try fd.status(path: what)
        guard (st.st_mode & S_IFMT) == S_IFREG else { throw SystemError(refusing: what, "is not a regular file", errno: EINVAL) }
        guard st.st_size <= maximumBytes else { throw SystemError(refusing: what, "is too large", errno: EFBIG) }
        return try Self.readCapped(fd, maximumBytes: maximumBytes, what: what)
    }

    /// `O_PATH` (Linux's generic value; Glibc does not export it without _GNU_SOURCE): a handle for
    /// `openat` only, needing no read permission on the directory itself.
    private static let openPathOnly: Int32 = 0o10000000

    private static func openAt(_ dir: Int32, _ name: String, _ flags: Int32, what: String) throws(SystemError) -> FileDescriptor {
        let fd = try Syscall.retrying("openat", what) { unsafe openat(dir, name, flags | O_CLOEXEC) }
        return FileDescriptor(adopting: fd)
    }

    private static func readCapped(_ fd: borrowing FileDescriptor, maximumBytes: Int, what: String) throws(SystemError) -> [UInt8] {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let (n, e) = unsafe chunk.withUnsafeMutableBytes { b in
                Syscall.result { unsafe Glibc.read(fd.rawValue, b.baseAddress!, b.count) }
            }
            if n < 0 { throw SystemError("read", what, errno: e) }
            if n == 0 { return out }
            out += chunk[0..<n]
            guard out.count <= maximumBytes else { throw SystemError(refusing: what, "is too large", errno: EFBIG) }
        }
    }
}
