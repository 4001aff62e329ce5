import Glibc

/// What identifies one version of a file: device, inode, size, modification and change times.
///
/// Coffer replaces its state files by rename (a new inode each time) and never edits them in place, so
/// two equal identities of a path mean nobody replaced or rewrote the file in between. Used to notice
/// a keybag rewritten under a running process (see the keybag's `checkUnchanged`).
package struct FileIdentity: Equatable, Sendable, CustomStringConvertible {
    /// `st_dev`.
    package let device: UInt64
    /// `st_ino`.
    package let inode: UInt64
    /// `st_size`.
    package let size: Int64
    /// Modification time (seconds, nanoseconds).
    package let modified: (Int64, Int64)
    /// Status change time (seconds, nanoseconds).
    package let changed: (Int64, Int64)

    /// The identity of what is at `path` now (no symbolic link followed); nil if nothing is.
    package static func of(_ path: String) -> FileIdentity? {
        var st = stat()
        guard unsafe lstat(path, &st) == 0 else { return nil }
        return FileIdentity(device: UInt64(st.st_dev), inode: UInt64(st.st_ino), size: Int64(st.st_size),
                            modified: (Int64(st.st_mtim.tv_sec), Int64(st.st_mtim.tv_nsec)),
                            changed: (Int64(st.st_ctim.tv_sec), Int64(st.st_ctim.tv_nsec)))
    }

    package static func == (a: FileIdentity, b: FileIdentity) -> Bool {
        a.device == b.device && a.inode == b.inode && a.size == b.size
            && a.modified == b.modified && a.changed == b.changed
    }

    package var description: String { "inode \(inode), \(size) bytes, modified \(modified.0).\(modified.1)" }
}
