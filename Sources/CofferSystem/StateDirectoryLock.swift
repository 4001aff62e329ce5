import Glibc

/// The exclusive lock on a state directory: one process at a time opens its keybag and database.
///
/// `flock(LOCK_EX | LOCK_NB)` on the file `lock` in the directory, opened `O_CLOEXEC | O_NOFOLLOW`
/// (mode 0600) and held for the life of this object. The kernel releases it when the last descriptor
/// of that open file goes away, so a process that dies in any way (`kill -9` included) leaves no
/// stale lock. Helpers the holder starts (the plugin host) do not inherit it; a process that forks
/// to become a daemon does (the child shares the open file and keeps the lock when the parent exits).
///
/// The file records who holds it, for the message a refused process prints (format 1, text):
/// `coffer-lock 1\npid PID\nsocket PATH\n`. Only the holder writes it; a reader may find it empty
/// (the holder has locked but not written yet), which the message then says.
package final class StateDirectoryLock: Sendable {
    /// The lock file's name inside the state directory.
    package static let fileName = "lock"

    /// The lock file.
    package let path: String
    /// The locked descriptor (owned; closed in `deinit`, which releases the lock).
    private let fd: Int32

    /// Who holds a lock, as its file records it (nil fields: not recorded yet, or unreadable).
    package struct Holder: Sendable, Equatable, CustomStringConvertible {
        /// The holder's process id.
        package var pid: Int32?
        /// The socket the holder serves, if it is an agent.
        package var socket: String?

        package var description: String {
            let who = pid.map { "pid \($0)" } ?? "an unknown pid"
            return socket.map { "\(who), socket \($0)" } ?? who
        }
    }

    /// Why the lock was not taken.
    package enum Failure: Error, Sendable, CustomStringConvertible {
        /// Another process holds it.
        case held(path: String, by: Holder)
        /// The lock file could not be opened or locked.
        case system(SystemError)

        package var description: String {
            switch self {
            case .held(let path, let holder):
                "another Coffer \(holder.socket == nil ? "program" : "agent") already uses this state directory (\(holder); lock file \(path)); "
                    + "stop it first, or give this one another --state-dir"
            case .system(let e): "cannot lock the state directory: \(e)"
            }
        }
    }

    private init(path: String, fd: Int32) {
        self.path = path
        self.fd = fd
    }

    deinit { _ = Glibc.close(fd) }

    /// Locks kept until the process exits (``keepUntilExit()``).
    private static let kept = Protected<[StateDirectoryLock]>([])

    /// Keeps this lock until the process exits: the descriptor is never closed by a deinit while other
    /// threads (a draining agent, the plugin host's reaper) may still touch the directory; only the
    /// process's exit releases it.
    package func keepUntilExit() {
        Self.kept.withLock { $0.append(self) }
    }

    /// Takes the lock on `directory` (which must exist) without waiting, and records this process as
    /// its holder with `socket`. Throws ``Failure/held(path:by:)`` naming the holder if another
    /// process has it.
    package static func acquire(directory: String, socket: String?) throws(Failure) -> StateDirectoryLock {
        let path = directory + "/" + fileName
        let fd: Int32
        do {
            fd = try FileDescriptor.open(path, O_RDWR | O_CREAT | O_NOFOLLOW, mode: 0o600).release()
        } catch {
            throw .system(error)
        }
        var (rc, e) = Syscall.result { flock(fd, LOCK_EX | LOCK_NB) }
        // A holder that is exiting (killed, crashed) has lost its memory but not yet its files: the
        // kernel drops the lock a moment later. A start right after (pam_coffer's, after a crash) waits
        // for that moment, at most 5 s, rather than refusing.
        let patience = Threads.monotonicSeconds() + 5
        while rc != 0 && e == EWOULDBLOCK && holder(fd, path).pid.map(isExiting) == true && Threads.monotonicSeconds() < patience {
            Threads.sleep(seconds: 0.02)
            (rc, e) = Syscall.result { flock(fd, LOCK_EX | LOCK_NB) }
        }
        if rc != 0 {
            let holder = holder(fd, path)
            _ = Glibc.close(fd)
            guard e == EWOULDBLOCK else { throw .system(SystemError("flock", path, errno: e)) }
            throw .held(path: path, by: holder)
        }
        let lock = StateDirectoryLock(path: path, fd: fd)
        lock.recordHolder(socket: socket)
        return lock
    }

    /// Who holds the lock on `directory` now (nil: nobody, or no lock file). Takes no lock that could
    /// refuse anyone: it asks the kernel's lock table (`F_OFD_GETLK` answers for `flock` locks too, on
    /// Linux) with a write-lock probe, which never blocks nor holds anything.
    package static func currentHolder(of directory: String) -> Holder? {
        let path = directory + "/" + fileName
        guard let fd = try? FileDescriptor.open(path, O_RDONLY | O_NOFOLLOW).release() else { return nil }
        defer { _ = Glibc.close(fd) }
        return isLocked(fd) ? holder(fd, path) : nil
    }

    /// True if some open file holds a lock on the file `fd` refers to: read from /proc/locks (the
    /// kernel's table of every lock), matched by device and inode. Reading it takes no lock.
    private static func isLocked(_ fd: Int32) -> Bool {
        var st = stat()
        guard unsafe fstat(fd, &st) == 0, let table = procLocks() else { return false }
        let dev = UInt64(st.st_dev)   // glibc's encoding (gnu_dev_major / gnu_dev_minor)
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000), minor = (dev & 0xff) | ((dev >> 12) & 0xffff_ff00)
        let hex = String(major, radix: 16, uppercase: false).leftPadded(2) + ":" + String(minor, radix: 16).leftPadded(2)
        let key = hex + ":" + String(st.st_ino)
        // Lines: "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; the device is printed as two hex
        // bytes each (at least), the inode in decimal.
        for line in String(decoding: table, as: UTF8.self).split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 6, fields[1] == "FLOCK" else { continue }
            if fields[5] == key { return true }
        }
        return false
    }

    /// The text of /proc/locks (a file whose size stat reports as 0: read to its end), nil if unreadable.
    private static func procLocks() -> [UInt8]? {
        guard let fd = try? FileDescriptor.open("/proc/locks", O_RDONLY) else { return nil }
        var table: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        while table.count < 16 << 20 {
            let n = unsafe chunk.withUnsafeMutableBytes { b in Syscall.result { unsafe read(fd.rawValue, b.baseAddress, b.count) }.value }
            guard n > 0 else { return n == 0 ? table : nil }
            table += chunk[..<n]
        }
        return table
    }

    /// Rewrites the holder record with this process's pid (after a fork the daemon calls it again).
    /// Best effort: the record only improves a refusal message; the lock is what counts.
    package func recordHolder(socket: String?) {
        var text = "coffer-lock 1\npid \(getpid())\n"
        if let socket { text += "socket \(socket)\n" }
        let bytes = Array(text.utf8)
        _ = ftruncate(fd, 0)
        _ = unsafe bytes.withUnsafeBytes { b in unsafe pwrite(fd, b.baseAddress, b.count, 0) }
    }

    /// True if process `pid` is gone or on its way out: a zombie, or a process whose memory is already
    /// released (an empty command line), which the kernel does before it closes the files.
    private static func isExiting(_ pid: Int32) -> Bool {
        guard pid > 0, let stat = readSmall("/proc/\(pid)/stat") else { return true }
        // "PID (comm) S ...": the state follows the last ')'.
        if let close = stat.lastIndex(of: UInt8(ascii: ")")), close + 2 < stat.count, [UInt8(ascii: "Z"), UInt8(ascii: "X")].contains(stat[close + 2]) {
            return true
        }
        return readSmall("/proc/\(pid)/cmdline")?.isEmpty ?? true
    }

    /// Up to 4 KiB of a /proc file, nil if it cannot be read.
    private static func readSmall(_ path: String) -> [UInt8]? {
        guard let fd = try? FileDescriptor.open(path, O_RDONLY) else { return nil }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = unsafe buffer.withUnsafeMutableBytes { b in Syscall.result { unsafe read(fd.rawValue, b.baseAddress, b.count) }.value }
        return n >= 0 ? Array(buffer[..<n]) : nil
    }

    /// Parses the record (format 1); unknown or missing lines leave the fields nil.
    private static func holder(_ fd: Int32, _ path: String) -> Holder {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = unsafe buffer.withUnsafeMutableBytes { b in
            Syscall.result { unsafe pread(fd, b.baseAddress, b.count, 0) }.value
        }
        var holder = Holder()
        let lines = String(decoding: buffer[..<max(n, 0)], as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: true)
        guard lines.first == "coffer-lock 1" else { return holder }
        for line in lines.dropFirst() {
            if line.hasPrefix("pid ") { holder.pid = Int32(line.dropFirst(4)) }
            if line.hasPrefix("socket ") { holder.socket = String(line.dropFirst(7)) }
        }
        return holder
    }
}

private extension String {
    func leftPadded(_ width: Int) -> String { count >= width ? self : String(repeating: "0", count: width - count) + self }
}
