import CSystemShims
import Glibc

/// Child processes that talk to this one over a private socket: what the plugin host needs
/// (`ssh-pkcs11-client.c`'s `pkcs11_start_helper`: socketpair, dup, closefrom, exec of a fixed path).
package enum Subprocess {
    /// A started child: its pid and this process's end of the socket pair.
    package struct Child: ~Copyable {
        /// The child's process id.
        package let pid: Int32
        /// This process's end of the connected Unix stream socket pair.
        package let socket: FileDescriptor

        /// Hands over this process's end of the socket (e.g. to a connection object), leaving the pid.
        package consuming func takeSocket() -> FileDescriptor { socket }

        /// Waits for the child to exit (EINTR retried): its exit status, or 128 + the signal that killed it.
        package func wait() throws(SystemError) -> Int32 {
            var status: Int32 = 0
            _ = try Syscall.retrying("waitpid", "pid \(pid)") { unsafe waitpid(pid, &status, 0) }
            return (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        }
    }

    /// Starts `executable` (an absolute path; no `PATH` search) with `arguments` (argv[1...]) and
    /// `environment` (`KEY=VALUE`; empty by default, so nothing of this process's environment leaks),
    /// connected to this process by a Unix stream socket pair. The child's end is placed on each
    /// descriptor number in `socketAt` (default 3; `[0, 1]` makes it the child's stdin and stdout);
    /// 0, 1 and 2 are otherwise inherited, and every other descriptor is closed before `exec`. The
    /// child gets SIGKILL when the thread that spawned it exits (`PR_SET_PDEATHSIG`), starts with no
    /// blocked signals and default dispositions, and no Swift code runs between `fork` and `exec`
    /// (the fork/exec is the C shim `coffer_spawn`).
    package static func spawn(executable: String, arguments: [String] = [], environment: [String] = [],
                             socketAt targets: [Int32] = [3]) throws(SystemError) -> Child {
        precondition(!targets.isEmpty && targets.allSatisfy { $0 >= 0 }, "socketAt needs descriptor numbers")
        let pair = try DescriptorPair.socketPair("socketpair for \(executable)")
        let argv = unsafe ([executable] + arguments).map { unsafe strdup($0) } + [nil]
        let envp = unsafe environment.map { unsafe strdup($0) } + [nil]
        defer {
            for unsafe p in unsafe argv { unsafe free(p) }
            for unsafe p in unsafe envp { unsafe free(p) }
        }
        let childEnd = pair.second
        let fd = childEnd.rawValue
        let started = unsafe argv.withUnsafeBufferPointer { a in
            unsafe envp.withUnsafeBufferPointer { e in
                unsafe targets.withUnsafeBufferPointer { t in
                    Result { () throws(SystemError) in
                        try Syscall.retrying("spawn", executable) {
                            unsafe coffer_spawn(executable, a.baseAddress!, e.baseAddress!, fd, t.baseAddress!, Int32(t.count))
                        }
                    }
                }
            }
        }
        try? childEnd.close()
        let pid = try started.get()
        return Child(pid: pid, socket: pair.first)
    }
}
