import CSystemShims
import Glibc

/// The running process: where its executable is, and daemonising.
///
/// (Not called `Process`, so that code importing both Foundation and `CofferSystem` keeps
/// Foundation's `Process` unambiguous.)
package enum ThisProcess {
    /// The executable this process runs (`/proc/self/exe`), nil if it cannot be read.
    package static func executablePath() -> String? { readLink("/proc/self/exe") }

    /// The executable process `pid` runs (`/proc/PID/exe`), nil if it cannot be read.
    package static func executablePath(pid: Int32) -> String? { readLink("/proc/\(pid)/exe") }

    /// Replaces this process with `path` (`execv`: same environment), `arguments` being the whole
    /// argv (argv[0] included). Returns only if that failed, with the reason.
    package static func exec(_ path: String, arguments: [String]) -> SystemError {
        var argv: [UnsafeMutablePointer<CChar>?] = unsafe arguments.map { unsafe strdup($0) } + [nil]
        defer { for unsafe p in unsafe argv { unsafe free(p) } }
        let (_, e) = Syscall.result { unsafe execv(path, &argv) }
        return SystemError("exec", path, errno: e)
    }

    /// The values of the environment variables `names` that are set (empty ones included).
    /// Reads only those names (no copy of the whole environment).
    package static func environment(_ names: [String]) -> [String: String] {
        var out: [String: String] = [:]
        for name in names {
            if let v = unsafe getenv(name) { out[name] = unsafe String(cString: v) }
        }
        return out
    }

    /// Hands the free pages of every malloc arena back to the kernel (`malloc_trim(0)`): after a
    /// one-off job that allocated and freed megabytes, which glibc otherwise keeps for good.
    package static func releaseFreeHeap() { _ = coffer_release_free_heap() }

    private static func readLink(_ path: String) -> String? {
        var buf = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = unsafe readlink(path, &buf, buf.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Which side of ``daemonize(logFile:)`` this is.
    package enum DaemonRole: ~Copyable {
        /// The original process: exit with this status (0 once the daemon said it is ready; the
        /// daemon's own failure status, or 1, if it exited first).
        case parent(exitStatus: Int32)
        /// The daemon: detached from the terminal (new session, stdin and stdout on /dev/null,
        /// stderr on the log file). Call ``Readiness/signal()`` once serving.
        case daemon(Readiness)
    }

    /// The daemon's end of the readiness pipe: ``signal()`` lets the waiting parent exit 0.
    package struct Readiness: ~Copyable {
        let fd: FileDescriptor
        /// Tells the parent the daemon is ready, and closes the pipe.
        package consuming func signal() {
            var one: UInt8 = 1
            _ = unsafe try? withUnsafeBytes(of: &one) { b throws(SystemError) in unsafe try fd.writeAll(b, path: "readiness pipe") }
        }

        /// Tells the parent why the daemon cannot start (`message`, one line, at most 4 KiB): the
        /// parent prints it on its standard error, so a person who started the agent in a terminal
        /// reads why, not only its log. The daemon then exits non-zero.
        package consuming func fail(_ message: String) {
            let bytes: [UInt8] = [2] + Array(message.utf8.prefix(4096))
            let raw = fd.rawValue
            var sent = 0
            while sent < bytes.count {
                let n = unsafe bytes.withUnsafeBytes { b in unsafe Glibc.write(raw, b.baseAddress! + sent, b.count - sent) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                sent += n
            }
        }
    }

    /// Daemonises without a double fork: a readiness pipe keeps the parent waiting until the child
    /// reports that it serves (the parent then exits 0) or exits (the parent exits with its status),
    /// so a service manager or script learns about start-up failures. Every step is checked: a failed
    /// `fork` throws with its errno in the parent; a failed `setsid`, `open` of /dev/null or `dup2`
    /// throws in the child (which then exits non-zero, and the parent reports that). If `logFile`
    /// cannot be opened, stderr goes to /dev/null, as before.
    package static func daemonize(logFile: String) throws(SystemError) -> DaemonRole {
        let pipe = try DescriptorPair.pipe("readiness pipe")
        let pid = try Syscall.retrying("fork", "daemon") { fork() }
        if pid > 0 {
            let reader = pipe.first
            try? pipe.second.close()
            var byte: UInt8 = 0
            let n = unsafe (try? withUnsafeMutableBytes(of: &byte) { b throws(SystemError) in unsafe try reader.read(into: b, path: "readiness pipe") }) ?? 0
            if n == 1 && byte == 2 {
                // The daemon's reason (Readiness.fail), to this terminal.
                var message: [UInt8] = []
                var chunk = [UInt8](repeating: 0, count: 4096)
                let raw = reader.rawValue
                while message.count < 4096 {
                    let got = unsafe chunk.withUnsafeMutableBytes { b in unsafe Glibc.read(raw, b.baseAddress, b.count) }
                    if got < 0 && errno == EINTR { continue }
                    if got <= 0 { break }
                    message += chunk.prefix(got)
                }
                StandardStreams.printError(String(decoding: message, as: UTF8.self))
            }
            try? reader.close()
            if n == 1 && byte == 1 { return .parent(exitStatus: 0) }
            var status: Int32 = 0
            guard (try? Syscall.retrying("waitpid", "daemon") { unsafe waitpid(pid, &status, 0) }) != nil else {
                return .parent(exitStatus: 1)
            }
            let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 1
            return .parent(exitStatus: code == 0 ? 1 : code)
        }
        try? pipe.first.close()
        let writer = pipe.second
        _ = try Syscall.retrying("setsid", "daemon") { setsid() }
        // Raw numbers from here: when the process started with 0, 1 or 2 closed, /dev/null or the
        // log may land on one of them, and must then stay open.
        let null = try FileDescriptor.open("/dev/null", O_RDWR).release()
        var log: Int32 = -1
        if let f = try? FileDescriptor.open(logFile, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, mode: 0o600) { log = f.release() }
        defer {
            if null > 2 { close(null) }
            if log > 2 { close(log) }
        }
        _ = try Syscall.retrying("dup2", "stdin") { dup2(null, 0) }
        _ = try Syscall.retrying("dup2", "stdout") { dup2(null, 1) }
        _ = try Syscall.retrying("dup2", logFile) { dup2(log >= 0 ? log : null, 2) }
        return .daemon(Readiness(fd: writer))
    }
}
