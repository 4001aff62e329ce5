package import CSystemShims
import Glibc

/// A failed system call: which operation, on what path, and `errno`.
package struct SystemError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The operation, e.g. "open".
    package let operation: String
    /// The path or object it acted on.
    package let path: String
    /// The captured `errno`.
    package let errno: Int32

    /// Why the path was refused, when no system call failed (nil: `errno` explains it).
    package let reason: String?

    /// Captures the current `errno` (call immediately after the failing call).
    package init(_ operation: String, _ path: String, errno e: Int32 = Glibc.errno) {
        self.operation = operation
        self.path = path
        self.errno = e
        reason = nil
    }

    /// A path refused by a check, not by the system: the description is `PATH REASON`.
    package init(refusing path: String, _ reason: String, errno e: Int32) {
        operation = "refuse"
        self.path = path
        self.errno = e
        self.reason = reason
    }

    package var description: String {
        if let reason { return "\(path) \(reason)" }
        return unsafe "\(operation) \(path): \(String(cString: strerror(errno)))"
    }
}

/// File operations with the durability and permission rules Coffer's state needs.
package enum Files {
    /// True if something exists at `path`.
    package static func exists(_ path: String) -> Bool { unsafe access(path, F_OK) == 0 }

    /// Reads a whole regular file of at most `maxBytes` (public data only: use ``readSecret`` for keys).
    package static func read(_ path: String, maxBytes: Int = 16 << 20) throws(SystemError) -> [UInt8] {
        try withOpenFile(path) { fd, size throws(SystemError) in
            guard size <= maxBytes else { throw SystemError("read (file too large)", path, errno: EFBIG) }
            var out = [UInt8](repeating: 0, count: size)
            let got = unsafe out.withUnsafeMutableBytes { b in Result { () throws(SystemError) in unsafe try readFully(fd, b, path) } }
            out.removeSubrange(try got.get()...)
            return out
        }
    }

    /// Reads exactly `count` bytes from `path` into `destination` (e.g. secure memory); the file must have that size.
    package static func readExactly(_ path: String, into destination: UnsafeMutableRawBufferPointer) throws(SystemError) {
        try withOpenFile(path) { fd, size throws(SystemError) in
            guard size == destination.count else { throw SystemError("read (unexpected size)", path, errno: EINVAL) }
            guard unsafe try readFully(fd, destination, path) == destination.count else {
                throw SystemError("read (short)", path, errno: EIO)
            }
        }
    }

    /// How ``writeAtomically(_:bytes:mode:temporary:)`` names its temporary file beside `path`.
    package enum TemporaryName: Sendable {
        /// `PATH.tmp`, a leftover from a crash removed first: for Coffer's own state directory, where
        /// nothing else writes and a crash must not leave files to pile up.
        case fixed
        /// `PATH.tmp-RANDOM`, created exclusively, nothing removed: for a place the user chose (an
        /// output file), where `PATH.tmp` may be theirs and another run may be writing beside us.
        case unique
    }

    /// Writes `bytes` to `path` atomically: temp file with `mode`, fsync, rename, fsync the directory.
    /// A crash leaves either the old file or the new one, never a mix.
    package static func writeAtomically(_ path: String, bytes: UnsafeRawBufferPointer, mode: mode_t = 0o600,
                                        temporary: TemporaryName = .fixed) throws(SystemError) {
        var tmp = path + ".tmp"
        let fd: FileDescriptor
        switch temporary {
        case .fixed:
            unsafe unlink(tmp)
            fd = try FileDescriptor.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: mode)
        case .unique:
            var attempt = 0
            while true {
                tmp = path + ".tmp-" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
                do {
                    fd = try FileDescriptor.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: mode)
                    break
                } catch where error.errno == EEXIST && attempt < 8 {
                    attempt += 1
                }
            }
        }
        var ok = false
        defer { if !ok { unsafe unlink(tmp) } }
        do {
            unsafe try fd.writeAll(bytes, path: tmp)
            try fd.sync(path: tmp)
        } catch {
            try? fd.close(path: tmp)
            throw error
        }
        try fd.close(path: tmp)
        _ = try Syscall.retrying("rename", path) { unsafe rename(tmp, path) }
        ok = true
        try syncDirectory(of: path)
    }

    /// Creates `path` with `bytes` and `mode` only if nothing is there yet (`O_EXCL`, no symbolic
    /// link followed), written in full and fsynced, and its directory fsynced. Returns false, writing
    /// nothing, if `path` already exists (another process created it first). On any failure the
    /// half-written file is removed, so a later call starts afresh.
    @discardableResult
    package static func createExclusively(_ path: String, bytes: UnsafeRawBufferPointer, mode: mode_t = 0o600) throws(SystemError) -> Bool {
        let fd: FileDescriptor
        do {
            fd = try FileDescriptor.open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode: mode)
        } catch where error.errno == EEXIST {
            return false
        }
        do {
            unsafe try fd.writeAll(bytes, path: path)
            try fd.sync(path: path)
            try fd.close(path: path)
            try syncDirectory(of: path)
        } catch {
            unsafe unlink(path)
            throw error
        }
        return true
    }

    /// Reads from `fd` until `buffer` is full or end of file (EINTR retried); returns how many bytes
    /// arrived. For standard input, pipes and other descriptors the caller does not own.
    package static func readAll(fd: Int32, into buffer: UnsafeMutableRawBufferPointer, path: String? = nil) throws(SystemError) -> Int {
        var off = 0
        while off < buffer.count {
            let n = try Syscall.retrying("read", path ?? "fd \(fd)") { unsafe Glibc.read(fd, buffer.baseAddress! + off, buffer.count - off) }
            if n == 0 { break }
            off += n
        }
        return off
    }

    /// Writes an array atomically (see ``writeAtomically(_:bytes:mode:temporary:)``).
    package static func writeAtomically(_ path: String, _ bytes: [UInt8], mode: mode_t = 0o600,
                                        temporary: TemporaryName = .fixed) throws(SystemError) {
        unsafe try bytes.withUnsafeBytes { b in
            Result { () throws(SystemError) in unsafe try writeAtomically(path, bytes: b, mode: mode, temporary: temporary) }
        }.get()
    }

    /// Renames `from` to `to` and makes it durable.
    package static func renameDurably(_ from: String, _ to: String) throws(SystemError) {
        _ = try Syscall.retrying("rename", from) { unsafe rename(from, to) }
        try syncDirectory(of: to)
    }

    /// fsyncs the directory holding `path`, so a rename or create survives power loss.
    package static func syncDirectory(of path: String) throws(SystemError) {
        let dir = directoryName(path)
        let dfd = try FileDescriptor.open(dir, O_RDONLY | O_DIRECTORY)
        try dfd.sync(path: dir)
    }

    /// Creates `path` and missing parents with `mode`, and checks the final directory through a
    /// descriptor (no check-then-use by path): it must be a real directory (a symbolic link is
    /// refused, `O_NOFOLLOW`), owned by this user, and private. A directory this call created gets
    /// exactly `mode` (`fchmod`). An existing one that group or others may write to is refused, never
    /// repaired: whoever could write there may have planted entries in it. An existing one that is
    /// only readable by group or others is tightened to `mode` through the descriptor (nothing can
    /// have been planted in it, and a directory made by `mkdir -p` under umask 022 keeps working).
    package static func makePrivateDirectory(_ path: String, mode: mode_t = 0o700) throws(SystemError) {
        var prefix = path.hasPrefix("/") ? "" : "."
        var created = false
        for part in path.split(separator: "/") {
            prefix += "/" + part
            if unsafe mkdir(prefix, mode) == 0 {
                created = true
            } else if errno != EEXIST {
                throw SystemError("mkdir", prefix)
            } else {
                created = false
            }
        }
        let fd: FileDescriptor
        do {
            fd = try FileDescriptor.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
        } catch {
            let e = error.errno
            if e == ELOOP || e == ENOTDIR {
                var st = stat()
                if unsafe lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFLNK {
                    throw SystemError(refusing: path, "is a symbolic link; refusing to use it (point the configuration at the real directory)", errno: ELOOP)
                }
                throw SystemError(refusing: path, "is not a directory", errno: ENOTDIR)
            }
            throw error
        }
        let st = try fd.status(path: path)
        guard (st.st_mode & S_IFMT) == S_IFDIR else { throw SystemError(refusing: path, "is not a directory", errno: ENOTDIR) }
        let me = geteuid()
        guard st.st_uid == me else {
            throw SystemError(refusing: path, "is owned by uid \(st.st_uid), not by you (uid \(me)); refusing to use it", errno: EPERM)
        }
        let bits = st.st_mode & 0o7777
        if !created && bits & 0o022 != 0 {
            throw SystemError(refusing: path, "has mode \(octal(bits)): group or others may write to it, so they may have "
                + "planted entries in it; refusing to use it (check it, then 'chmod 700' it, or remove it)", errno: EPERM)
        }
        if bits != mode {
            try fd.setMode(mode, path: path)
        }
    }

    /// `mode` as four octal digits, e.g. `0770`.
    package static func octal(_ mode: mode_t) -> String {
        let digits = String(mode, radix: 8)
        return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }

    /// The permission bits of `path` (nil if it does not exist).
    package static func mode(_ path: String) -> mode_t? {
        var st = stat()
        guard unsafe lstat(path, &st) == 0 else { return nil }
        return st.st_mode & 0o7777
    }

    /// The directory part of `path`.
    package static func directoryName(_ path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    private static func withOpenFile<R>(_ path: String, _ body: (borrowing FileDescriptor, Int) throws(SystemError) -> R) throws(SystemError) -> R {
        let fd = try FileDescriptor.open(path, O_RDONLY | O_NOFOLLOW)
        let st: stat
        do { st = try fd.status(path: path) } catch { throw SystemError("stat", path, errno: error.errno) }
        guard (st.st_mode & S_IFMT) == S_IFREG else { throw SystemError("open (not a regular file)", path, errno: EINVAL) }
        return try body(fd, Int(st.st_size))
    }

    private static func readFully(_ fd: borrowing FileDescriptor, _ b: UnsafeMutableRawBufferPointer, _ path: String) throws(SystemError) -> Int {
        unsafe try fd.readFully(into: b, path: path)
    }
}

/// Process-level hardening.
package enum ProcessHardening {
    /// Disables core dumps and ptrace attach (`PR_SET_DUMPABLE 0`, `RLIMIT_CORE 0`).
    package static func disableCoreDumps() throws(SystemError) {
        guard coffer_disable_core_dumps() == 0 else { throw SystemError("prctl", "PR_SET_DUMPABLE") }
    }

    /// Disables core files only (`RLIMIT_CORE 0`), for a client of the agent: it must stay dumpable,
    /// or an agent without CAP_SYS_PTRACE (any ordinary user's) could not read its `/proc/PID/exe`
    /// and root to tell which app it is, and a signed helper would pass for an unsigned caller.
    package static func disableCoreFiles() throws(SystemError) {
        var none = rlimit(rlim_cur: 0, rlim_max: 0)
        guard unsafe setrlimit(__rlimit_resource_t(RLIMIT_CORE.rawValue), &none) == 0 else { throw SystemError("setrlimit", "RLIMIT_CORE") }
    }

    /// True if the process may currently dump core.
    package static var isDumpable: Bool { coffer_is_dumpable() == 1 }
}

extension Files {
    /// Removes `path` and everything under it (an erase of a working tree). Never follows a symbolic
    /// link: a link is removed as a link, and directories are opened with `O_NOFOLLOW` relative to
    /// their parent's descriptor, so a link planted during the walk cannot redirect it. A missing
    /// `path` is no error.
    package static func removeTree(_ path: String) throws(SystemError) {
        var st = stat()
        if unsafe lstat(path, &st) != 0 {
            if errno == ENOENT { return }
            throw SystemError("lstat", path)
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else {
            _ = try Syscall.retrying("unlink", path) { unsafe unlink(path) }
            return
        }
        let fd = try FileDescriptor.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW)
        try removeContents(of: fd, path)
        _ = try Syscall.retrying("rmdir", path) { unsafe rmdir(path) }
    }

    private static func removeContents(of dir: borrowing FileDescriptor, _ path: String) throws(SystemError) {
        let directory = dir.rawValue
        for name in dir.directoryEntries() {
            let child = path + "/" + name
            if unsafe unlinkat(directory, name, 0) == 0 { continue }
            guard errno == EISDIR || errno == EPERM else {
                if errno == ENOENT { continue }
                throw SystemError("unlink", child)
            }
            let sub = try FileDescriptor.open(at: directory, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW, path: child)
            try removeContents(of: sub, child)
            _ = try Syscall.retrying("rmdir", child) { unsafe unlinkat(directory, name, AT_REMOVEDIR) }
        }
    }

    /// Makes every file written on the filesystem holding `path` durable (`syncfs`): one call after
    /// writing a batch of new files, where an fsync each would cost one disk flush per file.
    package static func syncFilesystem(of path: String) throws(SystemError) {
        let fd = try FileDescriptor.open(path, O_RDONLY | O_CLOEXEC)
        _ = try Syscall.retrying("syncfs", path) { coffer_syncfs(fd.rawValue) }
    }
}
