import CofferCrypto
import Glibc

/// Hashes the executable a manifest pins: SHA-256 of the file's contents, read in chunks (the file is
/// never held in memory), refusing anything that is not a regular file of at most ``maximumBytes``.
///
/// The agent hashes the descriptor it gets by opening `/proc/PID/exe` (the very file the peer runs,
/// even if its path has since been replaced) with ``sha256(fileDescriptor:)``, reads the path with
/// `readlink`, and asks ``Manifest/matches(executablePath:sha256:)-([UInt8],_)``. See "For the agent"
/// in the ManifestFormat article.
public enum ExecutableHash {
    /// Largest executable hashed (1 GiB): bounds the work a peer can cause.
    public static let maximumBytes = 1 << 30
    /// Bytes read per `pread`.
    static let chunkBytes = 1 << 17

    /// SHA-256 of the regular file open on `fd`, read from offset 0 with `pread` (the descriptor's
    /// own offset is left alone). Throws `.executableChanged` if the file's size, mtime or ctime moved
    /// while it was being read, or it did not yield exactly its size in bytes.
    public static func sha256(fileDescriptor fd: Int32) throws(ManifestError) -> [UInt8] {
        let before = try status(fd)
        guard (before.st_mode & S_IFMT) == S_IFREG else { throw .executableNotRegularFile }
        guard before.st_size <= maximumBytes else { throw .executableTooLarge }
        var hasher = SHA256.Hasher()
        var buffer = [UInt8](repeating: 0, count: chunkBytes)
        var total = 0
        while true {
            let n = buffer.withUnsafeMutableBytes { b in
                var n: Int
                repeat { n = pread(fd, b.baseAddress!, b.count, off_t(total)) } while n < 0 && errno == EINTR
                return n
            }
            if n < 0 { throw .executableUnreadable(errno: errno) }
            if n == 0 { break }
            total += n
            guard total <= maximumBytes else { throw .executableTooLarge }
            buffer.withUnsafeBytes { hasher.update(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
        let after = try status(fd)
        guard total == Int(before.st_size), after.st_size == before.st_size,
              after.st_mtim.tv_sec == before.st_mtim.tv_sec, after.st_mtim.tv_nsec == before.st_mtim.tv_nsec,
              after.st_ctim.tv_sec == before.st_ctim.tv_sec, after.st_ctim.tv_nsec == before.st_ctim.tv_nsec
        else { throw .executableChanged }
        return hasher.finalize()
    }

    /// SHA-256 of the file at `path` (symbolic links followed, like `sha256sum`): for tools that
    /// write manifests. See ``sha256(fileDescriptor:)``.
    public static func sha256(path: String) throws(ManifestError) -> [UInt8] {
        // O_NONBLOCK: opening a FIFO must not wait for a writer; it is then refused as not a regular file.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)
        guard fd >= 0 else { throw .executableUnreadable(errno: errno) }
        defer { close(fd) }
        return try sha256(fileDescriptor: fd)
    }

    private static func status(_ fd: Int32) throws(ManifestError) -> stat {
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw .executableUnreadable(errno: errno) }
        return st
    }
}

extension Manifest {
    /// True if `path` (raw bytes, as `readlink` returns them) is the manifest's executable path byte
    /// for byte, and `sha256` its pinned digest. Pure; this is the check the agent makes.
    ///
    /// Compare raw bytes, never Swift strings: `String` equality treats canonically equivalent Unicode
    /// (a precomposed and a decomposed "é") as equal, and decoding invalid UTF-8 replaces bytes with
    /// U+FFFD — either would let a different file's path match.
    public func matches(executablePath path: [UInt8], sha256 digest: [UInt8]) -> Bool {
        path.elementsEqual(executable.utf8) && digest == executableSHA256
    }

    /// ``matches(executablePath:sha256:)-([UInt8],_)`` with the path as a string (compared as UTF-8 bytes).
    public func matches(executablePath path: String, sha256 digest: [UInt8]) -> Bool {
        matches(executablePath: Array(path.utf8), sha256: digest)
    }

    /// Checks the file at `path` against the manifest, for tools (`coffer manifest check`) and tests:
    /// `path` must be the manifest's executable byte for byte, must already be canonical
    /// (`realpath(path) == path`: a path through a symbolic link, such as `/bin/sh` on a merged-/usr
    /// system, never matches, because `/proc/PID/exe` shows the resolved path), and the file's
    /// SHA-256 must be the pinned one. False for a mismatch; throws if the file cannot be hashed.
    ///
    /// Not for the agent: the file at a path can change between this check and an `exec`. The agent
    /// hashes `/proc/PID/exe` instead (see "For the agent" in the ManifestFormat article).
    public func matches(executableAt path: String) throws(ManifestError) -> Bool {
        guard path.utf8.elementsEqual(executable.utf8) else { return false }
        guard let resolved = realpath(path, nil) else { throw .executableUnreadable(errno: errno) }
        let canonical = strcmp(resolved, path) == 0
        free(resolved)
        guard canonical else { return false }
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK)
        guard fd >= 0 else { throw .executableUnreadable(errno: errno) }
        defer { close(fd) }
        return try ExecutableHash.sha256(fileDescriptor: fd) == executableSHA256
    }
}
