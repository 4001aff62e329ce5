import Glibc

/// A log file kept to a bounded size (`cofferd.log` of a daemonised agent): lines are appended with
/// one `write(2)` each to a descriptor opened `O_APPEND` on ``path`` (the daemon's standard error,
/// so what the runtime itself prints lands there too), and when a line would take the file past
/// ``maximumBytes`` the files move up one (``rotate(_:keep:)``: `cofferd.log` → `cofferd.log.1` → …
/// → `cofferd.log.KEEP`, the oldest dropped), a new file is opened at ``path``, and it takes the
/// descriptor's place (`dup2`). At most ``keep`` + 1 files, each at most ``maximumBytes`` (a single
/// line longer than that gets a file of its own), are ever on disk.
///
/// Crash-safe: each step of a rotation is a `rename(2)`, which is atomic, and a line is written only
/// once the rotation is done, so a crash at any point leaves every line written so far whole in one
/// of the files (at worst one old file dropped early); the next start appends to ``path``, or
/// creates it. A failure (disk full, a file that cannot be renamed) never stops the caller: the line
/// goes to the descriptor as it is, and rotation is tried again at the next line.
package final class RotatingLogFile: Sendable {
    /// The current file (`…/cofferd.log`).
    package let path: String
    /// Rotate before a line would take the current file past this many bytes.
    package let maximumBytes: Int
    /// How many rotated files are kept (`path.1` … `path.KEEP`).
    package let keep: Int
    /// The descriptor written to, open on ``path``: replaced (`dup2`) by a new file's at each rotation.
    private let descriptor: Protected<Int32>

    /// Lines go to `descriptor`, which must already be open on `path` with `O_APPEND` (it is neither
    /// closed nor moved: a rotation puts the new file under the same number).
    package init(path: String, descriptor: Int32, maximumBytes: Int, keep: Int) {
        self.path = path
        self.descriptor = Protected(descriptor)
        self.maximumBytes = max(maximumBytes, 1)
        self.keep = max(keep, 0)
    }

    /// Appends `line` (which should end in a line feed), rotating first if it would not fit.
    package func append(_ line: [UInt8]) {
        guard !line.isEmpty else { return }
        descriptor.withLock { fd in
            var st = stat()
            // Only a regular file is rotated (a daemon whose log could not be opened writes to /dev/null).
            if unsafe fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG, st.st_size > 0, Int(st.st_size) + line.count > maximumBytes {
                try? reopen(fd)
            }
            var written = 0
            while written < line.count {
                let n = unsafe line.withUnsafeBytes { b in unsafe Glibc.write(fd, b.baseAddress! + written, b.count - written) }
                if n > 0 { written += n; continue }
                if n < 0 && errno == EINTR { continue }
                return
            }
        }
    }

    /// Moves the files up one and puts a new file at ``path`` under `fd`.
    private func reopen(_ fd: Int32) throws(SystemError) {
        try Self.rotate(path, keep: keep)
        let fresh = try FileDescriptor.open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode: 0o600)
        let raw = fresh.release()
        defer { close(raw) }
        _ = try Syscall.retrying("dup2", path) { dup2(raw, fd) }
    }

    /// Moves `base.KEEP-1` … `base.1` up one and `base` to `base.1`, dropping `base.KEEP`; with `keep`
    /// 0, removes `base`. Each step is one `rename(2)`: a crash between two leaves every file whole (a
    /// missing number is skipped). The caller opens a new `base`.
    package static func rotate(_ base: String, keep: Int) throws(SystemError) {
        guard keep > 0 else {
            _ = try? Syscall.retrying("unlink", base) { unsafe unlink(base) }
            return
        }
        _ = try? Syscall.retrying("unlink", "\(base).\(keep)") { unsafe unlink("\(base).\(keep)") }
        for i in stride(from: keep - 1, through: 1, by: -1) where Files.exists("\(base).\(i)") {
            _ = try Syscall.retrying("rename", "\(base).\(i)") { unsafe rename("\(base).\(i)", "\(base).\(i + 1)") }
        }
        _ = try Syscall.retrying("rename", base) { unsafe rename(base, "\(base).1") }
    }

    /// The log's files, oldest first (those that exist): `base.KEEP` … `base.1`, `base`.
    package static func files(_ base: String, keep: Int) -> [String] {
        (stride(from: keep, through: 1, by: -1).map { "\(base).\($0)" } + [base]).filter { Files.exists($0) }
    }
}
