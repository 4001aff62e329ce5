package import CSystemShims
package import Glibc

/// An open file descriptor that closes exactly once.
///
/// Non-copyable: a descriptor has one owner. ``close()`` consumes it (a second close, or a use
/// after close, does not compile); if the owner goes away without closing, `deinit` closes it (the
/// error is lost then: close explicitly where it matters). NIO's `BaseSocket` asserts the same
/// ("leak of open BaseSocket") at run time; here the compiler checks it.
package struct FileDescriptor: ~Copyable {
    /// The descriptor number (valid while this value lives).
    package let rawValue: Int32

    /// Takes ownership of an open descriptor.
    package init(adopting rawValue: Int32) {
        precondition(rawValue >= 0, "not a descriptor")
        self.rawValue = rawValue
    }

    /// Opens `path` (EINTR retried). `O_CLOEXEC` is always added.
    package static func open(_ path: String, _ flags: Int32, mode: mode_t = 0) throws(SystemError) -> FileDescriptor {
        let fd = try Syscall.retrying("open", path) { unsafe Glibc.open(path, flags | O_CLOEXEC, mode) }
        return FileDescriptor(adopting: fd)
    }

    /// Opens `name` relative to the directory open on `directory` (`openat`, EINTR retried).
    /// `O_CLOEXEC` is always added; `path` names the file in errors and in ``SyscallFaults``.
    package static func open(at directory: Int32, _ name: String, _ flags: Int32, mode: mode_t = 0, path: String) throws(SystemError) -> FileDescriptor {
        let fd = try Syscall.retrying("openat", path) { unsafe openat(directory, name, flags | O_CLOEXEC, mode) }
        return FileDescriptor(adopting: fd)
    }

    deinit { _ = Glibc.close(rawValue) }

    /// Closes the descriptor. It is gone afterwards even if this throws (Linux releases the number
    /// before reporting an error such as EIO, so the close is never retried).
    package consuming func close(path: String? = nil) throws(SystemError) {
        let fd = rawValue
        discard self
        #if DEBUG
        if let injected = SyscallFaults.take("close", path ?? "fd \(fd)") {
            _ = Glibc.close(fd)
            throw SystemError("close", path ?? "fd \(fd)", errno: injected)
        }
        #endif
        if Glibc.close(fd) != 0 {
            let e = errno
            if e != EINTR { throw SystemError("close", path ?? "fd \(fd)", errno: e) }
        }
    }

    /// Gives up ownership without closing; the caller now owns the number.
    package consuming func release() -> Int32 {
        let fd = rawValue
        discard self
        return fd
    }

    private func name(_ path: String?) -> String { path ?? "fd \(rawValue)" }

    /// One `read` (EINTR retried): bytes read, 0 at end of file.
    package func read(into buffer: UnsafeMutableRawBufferPointer, path: String? = nil) throws(SystemError) -> Int {
        guard buffer.count > 0 else { return 0 }
        return try Syscall.retrying("read", name(path)) { unsafe Glibc.read(rawValue, buffer.baseAddress!, buffer.count) }
    }

    /// Reads until `buffer` is full or end of file; returns how many bytes arrived.
    package func readFully(into buffer: UnsafeMutableRawBufferPointer, path: String? = nil) throws(SystemError) -> Int {
        unsafe try Files.readAll(fd: rawValue, into: buffer, path: name(path))
    }

    /// One `pread` at `offset` (EINTR retried; the descriptor's offset is left alone).
    package func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int, path: String? = nil) throws(SystemError) -> Int {
        guard buffer.count > 0 else { return 0 }
        return try Syscall.retrying("pread", name(path)) { unsafe pread(rawValue, buffer.baseAddress!, buffer.count, off_t(offset)) }
    }

    /// Writes every byte (EINTR and short writes retried).
    package func writeAll(_ bytes: UnsafeRawBufferPointer, path: String? = nil) throws(SystemError) {
        var off = 0
        while off < bytes.count {
            let n = try Syscall.retrying("write", name(path)) { unsafe Glibc.write(rawValue, bytes.baseAddress! + off, bytes.count - off) }
            guard n > 0 else { throw SystemError("write", name(path), errno: EIO) }
            off += n
        }
    }

    /// `fsync`: the file's data and metadata reach the disk.
    package func sync(path: String? = nil) throws(SystemError) {
        _ = try Syscall.retrying("fsync", name(path)) { fsync(rawValue) }
    }

    /// The names in this directory (without `.` and `..`), sorted, read through a duplicate of the
    /// descriptor so that it stays usable. Empty if the directory cannot be read.
    package func directoryEntries() -> [String] {
        let copy = dup(rawValue)
        guard copy >= 0 else { return [] }
        guard let d = unsafe fdopendir(copy) else { _ = Glibc.close(copy); return [] }
        defer { unsafe closedir(d) }
        var names: [String] = []
        while let e = unsafe readdir(d) {
            let name = unsafe withUnsafeBytes(of: e.pointee.d_name) { raw in
                unsafe String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names.sorted()
    }

    /// `fstat`.
    package func status(path: String? = nil) throws(SystemError) -> stat {
        var st = stat()
        _ = try Syscall.retrying("fstat", name(path)) { unsafe fstat(rawValue, &st) }
        return st
    }

    /// The type of the filesystem the file is on (`fstatfs`'s `f_type`, a `*_SUPER_MAGIC` of linux/magic.h).
    package func filesystemType(path: String? = nil) throws(SystemError) -> Int {
        Int(try Syscall.retrying("fstatfs", name(path)) { coffer_filesystem_type(rawValue) })
    }

    /// `fchmod`.
    package func setMode(_ mode: mode_t, path: String? = nil) throws(SystemError) {
        _ = try Syscall.retrying("fchmod", name(path)) { fchmod(rawValue, mode) }
    }

    /// Sets or clears `O_NONBLOCK` (a read or write that would wait fails with EAGAIN instead).
    package func setNonBlocking(_ on: Bool, path: String? = nil) throws(SystemError) {
        let flags = try Syscall.retrying("fcntl", name(path)) { fcntl(rawValue, F_GETFL) }
        _ = try Syscall.retrying("fcntl", name(path)) { fcntl(rawValue, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) }
    }

    /// Sets or clears close-on-exec.
    package func setCloseOnExec(_ on: Bool) throws(SystemError) {
        let flags = try Syscall.retrying("fcntl", name(nil)) { fcntl(rawValue, F_GETFD) }
        _ = try Syscall.retrying("fcntl", name(nil)) { fcntl(rawValue, F_SETFD, on ? flags | FD_CLOEXEC : flags & ~FD_CLOEXEC) }
    }
}

/// Both ends of a pipe or socket pair, each owned (and closed) separately.
package struct DescriptorPair: ~Copyable {
    /// The read end of a pipe (for a socket pair: the parent's end).
    package let first: FileDescriptor
    /// The write end of a pipe (for a socket pair: the child's end).
    package let second: FileDescriptor

    /// Gives up ownership of both ends without closing them; the caller now owns the numbers.
    package consuming func release() -> (first: Int32, second: Int32) { (first.release(), second.release()) }

    /// A pipe, `O_CLOEXEC` on both ends: `first` reads, `second` writes.
    package static func pipe(_ what: String = "pipe") throws(SystemError) -> DescriptorPair {
        var fds: [Int32] = [-1, -1]
        _ = try Syscall.retrying("pipe", what) { unsafe coffer_pipe_cloexec(&fds) }
        return DescriptorPair(first: FileDescriptor(adopting: fds[0]), second: FileDescriptor(adopting: fds[1]))
    }

    /// A connected Unix stream socket pair, `SOCK_CLOEXEC` on both ends.
    package static func socketPair(_ what: String = "socketpair") throws(SystemError) -> DescriptorPair {
        var fds: [Int32] = [-1, -1]
        _ = try Syscall.retrying("socketpair", what) {
            unsafe socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds)
        }
        return DescriptorPair(first: FileDescriptor(adopting: fds[0]), second: FileDescriptor(adopting: fds[1]))
    }
}
