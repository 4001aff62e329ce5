import Glibc

/// A process's `/proc/PID/stat` line, read once, for what identity and front ends need of it: the
/// pid, the state, the session and the start time (the one reader: identity pins sessions with it,
/// the Secret Service front end a sender's process).
package enum ProcessStat {
    /// The `/proc/PID/stat` fields of process `pid` (see ``parse(_:)``) if it is alive and not a
    /// zombie; nil otherwise.
    package static func of(pid: Int32) -> (pid: Int32, state: UInt8, session: Int32, startTime: UInt64)? {
        guard pid > 0 else { return nil }
        let path = "/proc/\(pid)/stat"
        guard let fd = try? FileDescriptor.open(path, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC) else { return nil }
        // procfs makes the whole line in one read (well under 1 KiB), from one process.
        var buffer = [UInt8](repeating: 0, count: 2048)
        let raw = fd.rawValue
        let (n, _) = unsafe buffer.withUnsafeMutableBytes { b in Syscall.result { unsafe Glibc.read(raw, b.baseAddress!, b.count) } }
        guard n > 0, let stat = parse(buffer[0..<n]), stat.pid == pid,
              stat.state != UInt8(ascii: "Z"), stat.state != UInt8(ascii: "X") else { return nil }
        return stat
    }

    /// The fields of a `/proc/PID/stat` line identity needs: pid (1), state (3), session (6) and
    /// starttime (22). The command name (2) is in parentheses and may hold spaces and parentheses, so
    /// the fields after it are counted from the last `)`. Nil if the line is not of that form.
    package static func parse(_ line: ArraySlice<UInt8>) -> (pid: Int32, state: UInt8, session: Int32, startTime: UInt64)? {
        guard let open = line.firstIndex(of: UInt8(ascii: "(")), let close = line.lastIndex(of: UInt8(ascii: ")")), open < close,
              let pid = Int32(String(decoding: line[line.startIndex..<open], as: UTF8.self).trimmingSpace())
        else { return nil }
        let rest = line[(close + 1)...].split(whereSeparator: { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\n") })
        // rest[0] is field 3 (state), rest[3] field 6 (session), rest[19] field 22 (starttime).
        guard rest.count > 19, rest[0].count == 1,
              let session = Int32(String(decoding: rest[3], as: UTF8.self)),
              let start = UInt64(String(decoding: rest[19], as: UTF8.self))
        else { return nil }
        return (pid, rest[0].first!, session, start)
    }
}
