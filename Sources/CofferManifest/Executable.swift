import CofferCrypto
import CofferSystem

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
        var hasher = SHA256.Hasher()
        do {
            try StableFile.read(fd: fd, maximumBytes: maximumBytes, chunkBytes: chunkBytes) { hasher.update($0) }
        } catch {
            throw ManifestError(error)
        }
        return hasher.finalize()
    }

    /// SHA-256 of the file at `path` (symbolic links followed, like `sha256sum`): for tools that
    /// write manifests. See ``sha256(fileDescriptor:)``.
    public static func sha256(path: String) throws(ManifestError) -> [UInt8] {
        do {
            return try StableFile.withOpen(path, followSymlinks: true) { fd throws(StableFile.Failure) in
                try hash(fd)
            }
        } catch {
            throw ManifestError(error)
        }
    }

    /// ``sha256(fileDescriptor:)`` with the failure left as the I/O layer's.
    static func hash(_ fd: Int32) throws(StableFile.Failure) -> [UInt8] {
        var hasher = SHA256.Hasher()
        try StableFile.read(fd: fd, maximumBytes: maximumBytes, chunkBytes: chunkBytes) { hasher.update($0) }
        return hasher.finalize()
    }
}

extension ManifestError {
    /// The manifest vocabulary for a failed read of the executable.
    init(_ failure: StableFile.Failure) {
        switch failure {
        case .notRegularFile: self = .executableNotRegularFile
        case .tooLarge: self = .executableTooLarge
        case .unreadable(let e): self = .executableUnreadable(errno: e)
        case .changed: self = .executableChanged
        }
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
        do {
            guard try StableFile.canonicalPath(path).elementsEqual(path.utf8) else { return false }
            return try StableFile.withOpen(path, followSymlinks: false) { fd throws(StableFile.Failure) in
                try ExecutableHash.hash(fd)
            } == executableSHA256
        } catch {
            throw ManifestError(error)
        }
    }
}
