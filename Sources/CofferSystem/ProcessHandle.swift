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
package struct ProcessHandle: ~Copyable {
    /// How the pidfd was obtained.
    package enum Source: Sendable, Equatable {
        /// `getsockopt(SO_PEERPIDFD)`: the kernel's own record of the connecting process.
        case peerPIDFD
        /// `pidfd_open` on the `SO_PEERCRED` pid (kernels before 6.5), checked afterwards.
        case pidfdOpen
    }

    /// The process id (in this process's pid namespace).
    package let pid: Int32
    /// The peer's uid (`SO_PEERCRED`).
    package let uid: UInt32
    /// How the pidfd was obtained.
    package let source: Source
    /// The pidfd.
    let pidfd: FileDescriptor
    /// `/proc/PID`, opened once as a directory.
    let directory: FileDescriptor

    private init(pid: Int32, uid: UInt32, source: Source, pidfd: consuming FileDescriptor, directory: consuming FileDescriptor) {
        self.pid = pid
        self.uid = uid
        self.source = source
        self.pidfd = pidfd
        self.directory = directory
    }

    /// The process at the other end of the connected Unix socket `fd`. Throws if the peer has
    /// already been reaped (no handle on another process is ever returned instead: `SO_PEERPIDFD`
    /// fails then, and the fallback's pidfd must be alive and of the peer's uid).
    /// `usePeerPIDFD` false forces the `pidfd_open` fallback (for tests of older kernels).
    package static func peer(ofSocket fd: Int32, usePeerPIDFD: Bool = true) throws(SystemError) -> ProcessHandle {
        var credPID: pid_t = 0
        var uid: uid_t = 0
        var gid: gid_t = 0
        guard unsafe coffer_peer_credentials(fd, &credPID, &uid, &gid) == 0 else { throw SystemError("getsockopt", "SO_PEERCRED") }
        guard credPID > 0 else { throw SystemError(refusing: "peer", "is in another pid namespace", errno: ESRCH) }

        var source = Source.peerPIDFD
        var raw: Int32 = -1
        if usePeerPIDFD {
            let (r, e) = Syscall.result { coffer_peer_pidfd(fd) }
            if r >= 0 {
                raw = r
            } else if e != ENOPROTOOPT {
                // ESRCH / EINVAL: the peer exited and was reaped. Never fall back to its (reusable) pid.
                throw SystemError("getsockopt", "SO_PEERPIDFD", errno: e)
            }
        }
        if raw < 0 {
            source = .pidfdOpen
            raw = try Syscall.retrying("pidfd_open", "pid \(credPID)") { coffer_pidfd_open(credPID) }
        }
        let pidfd = FileDescriptor(adopting: raw)
        let pid = try Syscall.retrying("pidfd pid", "pid \(credPID)") { coffer_pidfd_pid(pidfd.rawValue) }
        guard pid == credPID else {
            throw SystemError(refusing: "pid \(credPID)", "is not the process behind the peer's pidfd", errno: ESRCH)
        }
        let directory = try FileDescriptor.open("/proc/\(pid)", O_RDONLY | O_DIRECTORY)
        let handle = ProcessHandle(pid: pid, uid: uid, source: source, pidfd: pidfd, directory: directory)
        guard handle.isAlive() else { throw SystemError(refusing: "pid \(pid)", "exited during identification", errno: ESRCH) }
        if source == .pidfdOpen {
            // The process pidfd_open found must have the peer's uid (a reused pid of another user is
            // refused). SO_PEERCRED reports the effective uid: the second field of `Uid:`.
            guard let uids = try handle.statusField("Uid"), case let fields = uids.split(separator: "\t"), fields.count >= 2,
                  UInt32(fields[1]) == uid
            else { throw SystemError(refusing: "pid \(pid)", "is not of the peer's uid", errno: ESRCH) }
        }
        return handle
    }

    /// True while the process has not been reaped (a zombie counts: it still holds its pid).
    /// Checked after reading anything about the process: true means every read was of this process.
    package func isAlive() -> Bool { coffer_pidfd_alive(pidfd.rawValue) == 1 }

    /// The contents of `/proc/PID/NAME` (one component, no symbolic links), at most `maximumBytes`.
    package func read(_ name: String, maximumBytes: Int = 64 << 10) throws(SystemError) -> [UInt8] {
        precondition(!name.contains("/"), "one path component")
        let fd = try openAt(directory.rawValue, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY, what: "/proc/\(pid)/\(name)")
        return try readCapped(fd, maximumBytes: maximumBytes, what: "/proc/\(pid)/\(name)")
    }

    /// The value of a `Key:\tvalue` line of `/proc/PID/status` (`TracerPid`, `Uid`, …), nil if absent.
    package func statusField(_ key: String) throws(SystemError) -> String? {
        try statusFields([key])[key]
    }

    /// The values of the `Key:\tvalue` lines of `/proc/PID/status` named in `keys` (one read).
    package func statusFields(_ keys: [String]) throws(SystemError) -> [String: String] {
        // Scanned as bytes: splitting the ~1.5 KB text into Swift strings costs tens of microseconds.
        let bytes = try read("status")
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
        try openAt(directory.rawValue, "exe", O_RDONLY | O_NOCTTY | O_NONBLOCK, what: "/proc/\(pid)/exe")
    }

    /// Reads `NAME` (one component) in the process's root directory (`/proc/PID/root`, as the
    /// process sees `/`), as xdg-desktop-portal reads `.flatpak-info`: `openat` without following a
    /// symbolic link, a regular file only, at most `maximumBytes`. Nil if there is no such file.
    package func readInRoot(_ name: String, maximumBytes: Int) throws(SystemError) -> [UInt8]? {
        precondition(!name.contains("/") && name != ".." && name != ".", "one path component")
        let what = "/proc/\(pid)/root/\(name)"
        let root = try openAt(directory.rawValue, "root", Self.openPathOnly | O_DIRECTORY, what: "/proc/\(pid)/root")
        let fd: FileDescriptor
        do throws(SystemError) {
            fd = try openAt(root.rawValue, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK, what: what)
        } catch where error.errno == ENOENT {
            return nil
        }
        let st = try fd.status(path: what)
        guard (st.st_mode & S_IFMT) == S_IFREG else { throw SystemError(refusing: what, "is not a regular file", errno: EINVAL) }
        guard st.st_size <= maximumBytes else { throw SystemError(refusing: what, "is too large", errno: EFBIG) }
        return try readCapped(fd, maximumBytes: maximumBytes, what: what)
    }

    /// `O_PATH` (Linux's generic value; Glibc does not export it without _GNU_SOURCE): a handle for
    /// `openat` only, needing no read permission on the directory itself.
    private static let openPathOnly: Int32 = 0o10000000

    private func openAt(_ dir: Int32, _ name: String, _ flags: Int32, what: String) throws(SystemError) -> FileDescriptor {
        let fd = try Syscall.retrying("openat", what) { unsafe openat(dir, name, flags | O_CLOEXEC) }
        return FileDescriptor(adopting: fd)
    }

    private func readCapped(_ fd: borrowing FileDescriptor, maximumBytes: Int, what: String) throws(SystemError) -> [UInt8] {
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
