import Glibc

/// Reading a whole regular file in chunks while making sure it did not change meanwhile: what
/// hashing an executable needs (the caller feeds each chunk to its hash; the file is never held in
/// memory). The I/O half of `CofferManifest.ExecutableHash`, so that module stays a pure parser.
package enum StableFile {
    /// Why a stable read failed.
    package enum Failure: Error, Equatable, Sendable {
        /// Not a regular file (a directory, FIFO, device, …).
        case notRegularFile
        /// Larger than the limit.
        case tooLarge
        /// A system call failed with this errno.
        case unreadable(errno: Int32)
        /// The size, mtime or ctime moved while reading, or the bytes read were not the size.
        case changed
    }

    /// Reads the regular file open on `fd` from offset 0 with `pread` (the descriptor's own offset is
    /// left alone), handing `body` chunks of up to `chunkBytes`. Fails if the file is not regular,
    /// is larger than `maximumBytes`, or changed (size, mtime or ctime) while being read.
    package static func read(fd: Int32, maximumBytes: Int, chunkBytes: Int,
                            _ body: (UnsafeRawBufferPointer) -> Void) throws(Failure) {
        let before = try status(fd)
        guard (before.st_mode & S_IFMT) == S_IFREG else { throw .notRegularFile }
        guard before.st_size <= maximumBytes else { throw .tooLarge }
        var buffer = [UInt8](repeating: 0, count: chunkBytes)
        var total = 0
        while true {
            let got = unsafe buffer.withUnsafeMutableBytes { b in Syscall.result { unsafe pread(fd, b.baseAddress!, b.count, off_t(total)) } }
            if got.value < 0 { throw .unreadable(errno: got.errno) }
            let n = got.value
            if n == 0 { break }
            total += n
            guard total <= maximumBytes else { throw .tooLarge }
            unsafe buffer.withUnsafeBytes { unsafe body(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
        let after = try status(fd)
        guard total == Int(before.st_size), after.st_size == before.st_size,
              after.st_mtim.tv_sec == before.st_mtim.tv_sec, after.st_mtim.tv_nsec == before.st_mtim.tv_nsec,
              after.st_ctim.tv_sec == before.st_ctim.tv_sec, after.st_ctim.tv_nsec == before.st_ctim.tv_nsec
        else { throw .changed }
    }

    /// Opens `path` read-only for ``read(fd:maximumBytes:chunkBytes:_:)`` (`O_NONBLOCK`: opening a
    /// FIFO must not wait for a writer; it is then refused as not a regular file) and runs `body`
    /// with the descriptor, closing it afterwards. `followSymlinks` false adds `O_NOFOLLOW`.
    package static func withOpen<R>(_ path: String, followSymlinks: Bool,
                                   _ body: (Int32) throws(Failure) -> R) throws(Failure) -> R {
        let flags = O_RDONLY | O_NOCTTY | O_NONBLOCK | (followSymlinks ? 0 : O_NOFOLLOW)
        let fd: FileDescriptor
        do { fd = try FileDescriptor.open(path, flags) } catch { throw .unreadable(errno: error.errno) }
        return try body(fd.rawValue)
    }

    /// `realpath(path)` as raw bytes (no UTF-8 repair), for comparing byte for byte.
    package static func canonicalPath(_ path: String) throws(Failure) -> [UInt8] {
        guard let resolved = unsafe realpath(path, nil) else { throw .unreadable(errno: errno) }
        defer { unsafe free(resolved) }
        return unsafe Array(UnsafeRawBufferPointer(start: resolved, count: strlen(resolved)))
    }

    private static func status(_ fd: Int32) throws(Failure) -> stat {
        var st = stat()
        let (rc, e) = Syscall.result { unsafe fstat(fd, &st) }
        guard rc == 0 else { throw .unreadable(errno: e) }
        return st
    }
}
