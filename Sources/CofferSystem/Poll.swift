import Glibc

/// Waiting on several descriptors at once (`poll(2)`): a connection and the wake pipe of an
/// evaluation, a socket and the terminal a person types on.
package enum Poll {
    /// Waits up to `timeoutMillis` for any of `fds` to become readable (or hung up, or in error);
    /// returns, in order, which did. A negative descriptor is left out (never ready), as `poll`
    /// leaves it. An interrupted wait (EINTR) returns early with none ready: the caller re-checks
    /// its deadline and stop flag and waits again. Any other failure throws `SystemError("poll", what)`.
    package static func readable(_ fds: [Int32], timeoutMillis: Int32, what: String = "descriptors") throws(SystemError) -> [Bool] {
        var polled = fds.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        let n = try unsafe polled.withUnsafeMutableBufferPointer { (p) throws(SystemError) in
            try Syscall.interruptible("poll", what) { unsafe Glibc.poll(p.baseAddress, nfds_t(p.count), timeoutMillis) }
        }
        guard let n, n > 0 else { return [Bool](repeating: false, count: fds.count) }
        return polled.map { $0.revents != 0 }
    }
}
