import Glibc

extension Subprocess {
    /// What a finished program said and how it ended.
    package struct Output: Sendable {
        /// Its exit status, or 128 + the signal that killed it.
        package let status: Int32
        /// Its standard output and standard error, interleaved as written (at most the limit asked for).
        package let text: String
    }

    /// Runs `executable` (an absolute path) to completion with `arguments` and exactly `environment`,
    /// its standard input, output and error one socket this process reads until the program closes it
    /// (nothing is written to its input: a program that waits for input sees end of file at once
    /// when it reads). Output beyond `maxOutput` bytes is read and dropped, so a chatty program never
    /// blocks. For public tools (`git`); never pass a secret in `arguments` or `environment`.
    package static func run(executable: String, arguments: [String], environment: [String],
                            maxOutput: Int = 1 << 20) throws(SystemError) -> Output {
        let child = try spawn(executable: executable, arguments: arguments, environment: environment, socketAt: [0, 1, 2])
        let pid = child.pid
        let socket = child.takeSocket()
        _ = Glibc.shutdown(socket.rawValue, Int32(SHUT_WR))
        var kept: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 << 10)
        while true {
            let n = unsafe chunk.withUnsafeMutableBytes { b in Result { () throws(SystemError) in unsafe try socket.read(into: b) } }
            guard case .success(let got) = n, got > 0 else { break }
            if kept.count < maxOutput { kept.append(contentsOf: chunk[0..<min(got, maxOutput - kept.count)]) }
        }
        try? socket.close()
        var status: Int32 = 0
        _ = try Syscall.retrying("waitpid", "pid \(pid)") { unsafe waitpid(pid, &status, 0) }
        let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        return Output(status: code, text: String(decoding: kept, as: UTF8.self))
    }

    /// The absolute path of `name` the way a shell finds it: in this process's `PATH` (its absolute
    /// directories; `/usr/local/bin:/usr/bin:/bin` without one), else in `/usr/bin`.
    package static func find(_ name: String) -> String? {
        let path = ThisProcess.environment(["PATH"])["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        return find(name, searchPath: path) ?? find(name, searchPath: "/usr/bin")
    }

    /// The absolute path of `name` in the colon-separated `searchPath` (an executable regular file), or nil.
    package static func find(_ name: String, searchPath: String) -> String? {
        for dir in searchPath.split(separator: ":") where dir.hasPrefix("/") {
            let candidate = dir + "/" + name
            var st = stat()
            if unsafe stat(candidate, &st) == 0, st.st_mode & S_IFMT == S_IFREG, unsafe access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }
}

extension StringProtocol {
    /// The text without leading and trailing whitespace (a program's output, a line of it): the one
    /// copy of this trim for the sync transport and the benchmarks.
    package func trimmingSpace() -> String {
        var s = Substring(self)
        while let c = s.first, c.isWhitespace { s.removeFirst() }
        while let c = s.last, c.isWhitespace { s.removeLast() }
        return String(s)
    }
}
