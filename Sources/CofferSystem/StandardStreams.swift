import Glibc

/// Unbuffered writes to standard output and error (no shared `FILE*` state).
package enum StandardStreams {
    /// Writes every byte to `fd`; false if it could not.
    @discardableResult
    package static func write(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Bool {
        var off = 0
        while off < bytes.count {
            let (n, _) = Syscall.result { unsafe Glibc.write(fd, bytes.baseAddress! + off, bytes.count - off) }
            if n <= 0 { return false }
            off += n
        }
        return true
    }

    /// Writes `line` and a newline to standard error.
    package static func printError(_ line: String) {
        var s = line + "\n"
        _ = s.withUTF8 { unsafe write(2, UnsafeRawBufferPointer($0)) }
    }

    /// Writes `line` and a newline to standard output.
    package static func print(_ line: String) {
        var s = line + "\n"
        _ = s.withUTF8 { unsafe write(1, UnsafeRawBufferPointer($0)) }
    }
}
