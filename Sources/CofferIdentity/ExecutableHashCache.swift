package import CofferManifest
import CofferSystem
package import Glibc

/// SHA-256 of executables, remembered by file identity and version: (device, inode, size, mtime,
/// ctime), so a warm identity check is an `fstat` and a dictionary lookup. Any write to the file
/// moves its mtime and ctime (and a rename or `chmod` its ctime), so a changed executable misses
/// the cache and is hashed again.
///
/// Like git's "racily clean" index entries, a file whose mtime or ctime is within
/// ``racyWindowSeconds`` of now is hashed but not remembered: timestamps have a coarse granularity,
/// so a write in the same tick as the hash could leave every key field unchanged.
package final class ExecutableHashCache: Sendable {
    /// What identifies one version of one file.
    struct Key: Hashable {
        let device: UInt64, inode: UInt64, size: Int64
        let mtimeSeconds: Int, mtimeNanoseconds: Int, ctimeSeconds: Int, ctimeNanoseconds: Int

        init(_ st: stat) {
            device = UInt64(st.st_dev)
            inode = UInt64(st.st_ino)
            size = Int64(st.st_size)
            mtimeSeconds = st.st_mtim.tv_sec
            mtimeNanoseconds = st.st_mtim.tv_nsec
            ctimeSeconds = st.st_ctim.tv_sec
            ctimeNanoseconds = st.st_ctim.tv_nsec
        }
    }

    struct State {
        var entries: [Key: [UInt8]] = [:]
        var hashesComputed = 0
    }

    /// Most entries kept; when full, the cache starts over (executables are few).
    package let capacity: Int
    /// Files changed less than this long ago are not remembered (see the type's documentation).
    package let racyWindowSeconds: Double
    private let state = Protected(State())

    package init(capacity: Int = 1024, racyWindowSeconds: Double = 2) {
        precondition(capacity > 0)
        self.capacity = capacity
        self.racyWindowSeconds = racyWindowSeconds
    }

    /// How many files were actually hashed (cache misses): for tests and statistics.
    package var hashesComputed: Int { state.withLock { $0.hashesComputed } }

    /// How many hashes are remembered.
    package var count: Int { state.withLock { $0.entries.count } }

    /// SHA-256 of the regular file open on `fd`, whose `fstat` (taken before this call) is `status`.
    /// `ExecutableHash.sha256(fileDescriptor:)` checks the file did not change while it was read, so
    /// a remembered hash always belongs to the key it is stored under.
    package func sha256(fileDescriptor fd: Int32, status: stat) throws(ManifestError) -> [UInt8] {
        let key = Key(status)
        if let hit = state.withLock({ $0.entries[key] }) { return hit }
        let digest = try ExecutableHash.sha256(fileDescriptor: fd)
        // The stable read compared against its own fstat; compare against ours too (the file may have
        // changed between our fstat and the hash).
        guard let after = try? statusOf(fd), Key(after) == key else { throw .executableChanged }
        let remember = !isRacy(status)
        state.withLock { s in
            s.hashesComputed += 1
            guard remember else { return }
            if s.entries.count >= capacity { s.entries.removeAll(keepingCapacity: true) }
            s.entries[key] = digest
        }
        return digest
    }

    /// Forgets every hash.
    package func removeAll() { state.withLock { $0.entries.removeAll() } }

    /// True if the file was changed within ``racyWindowSeconds``: what is learnt of it is not remembered.
    func isRacy(_ st: stat) -> Bool {
        guard racyWindowSeconds > 0 else { return false }
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        func seconds(_ t: timespec) -> Double { Double(t.tv_sec) + Double(t.tv_nsec) / 1e9 }
        let newest = max(seconds(st.st_mtim), seconds(st.st_ctim))
        return seconds(now) - newest < racyWindowSeconds
    }

    private func statusOf(_ fd: Int32) throws -> stat {
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw SystemError("fstat", "executable") }
        return st
    }
}
