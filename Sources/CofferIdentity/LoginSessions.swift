package import CofferModel
import CofferSystem
import Glibc

/// What makes a caller's terminal session unique (``CallerIdentity/LoginSession``), read from
/// `/proc`: the session leader's start time beside the session id, and the audit session id.
///
/// A session id is a pid. Once the session's leader has exited and been reaped, a same-uid process
/// can fork until it holds that pid and call `setsid()`: the new session has the old id. It cannot
/// have the old leader's start time, which is why an authorization kept for a session is keyed by
/// both, and is valid only while that leader lives (``isLive(_:)``): a session whose leader is gone
/// has no key at all (its remaining processes, daemons left behind, are not the person's terminal).
package enum LoginSessions {
    /// `/proc/PID/sessionid` when no audit session was ever set (`AUDIT_SID_UNSET`).
    package static let auditSessionUnset: UInt32 = 4_294_967_295

    /// The session of a caller in session `sid` whose audit session id file (`/proc/PID/sessionid`)
    /// read `auditSessionBytes`: nil if `sid` is not positive or its leader is gone (or is not the
    /// leader of `sid`: a process that merely holds the number now).
    package static func session(id sid: Int32, auditSessionBytes: [UInt8]?) -> CallerIdentity.LoginSession? {
        guard sid > 0, let start = leaderStartTime(of: sid) else { return nil }
        return CallerIdentity.LoginSession(id: sid, leaderStartTime: start, auditSessionID: auditSessionBytes.flatMap(auditSessionID(from:)))
    }

    /// True while `session`'s leader is the very process it was: alive, leading session `id`, with the
    /// same start time. Checked each time a kept authorization would be used.
    package static func isLive(_ session: CallerIdentity.LoginSession) -> Bool {
        leaderStartTime(of: session.id) == session.leaderStartTime
    }

    /// The start time of process `sid` if it is alive (not a zombie) and leads session `sid`.
    package static func leaderStartTime(of sid: Int32) -> UInt64? {
        guard let stat = stat(ofPID: sid), stat.session == sid else { return nil }
        return stat.startTime
    }

    /// The `/proc/PID/stat` fields of process `pid` (see ``parseStat(_:)``) if it is alive and not a
    /// zombie; nil otherwise.
    package static func stat(ofPID pid: Int32) -> (pid: Int32, state: UInt8, session: Int32, startTime: UInt64)? {
        guard pid > 0 else { return nil }
        let path = "/proc/\(pid)/stat"
        guard let fd = try? FileDescriptor.open(path, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC) else { return nil }
        // procfs makes the whole line in one read (well under 1 KiB), from one process.
        var buffer = [UInt8](repeating: 0, count: 2048)
        let raw = fd.rawValue
        let (n, _) = unsafe buffer.withUnsafeMutableBytes { b in Syscall.result { unsafe Glibc.read(raw, b.baseAddress!, b.count) } }
        guard n > 0, let stat = parseStat(buffer[0..<n]), stat.pid == pid,
              stat.state != UInt8(ascii: "Z"), stat.state != UInt8(ascii: "X") else { return nil }
        return stat
    }

    /// The fields of a `/proc/PID/stat` line identity needs: pid (1), state (3), session (6) and
    /// starttime (22). The command name (2) is in parentheses and may hold spaces and parentheses, so
    /// the fields after it are counted from the last `)`. Nil if the line is not of that form.
    package static func parseStat(_ line: ArraySlice<UInt8>) -> (pid: Int32, state: UInt8, session: Int32, startTime: UInt64)? {
        guard let open = line.firstIndex(of: UInt8(ascii: "(")), let close = line.lastIndex(of: UInt8(ascii: ")")), open < close,
              let pid = Int32(String(decoding: line[line.startIndex..<open], as: UTF8.self).trimmingCharacters(in: " "))
        else { return nil }
        let rest = line[(close + 1)...].split(whereSeparator: { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\n") })
        // rest[0] is field 3 (state), rest[3] field 6 (session), rest[19] field 22 (starttime).
        guard rest.count > 19, rest[0].count == 1,
              let session = Int32(String(decoding: rest[3], as: UTF8.self)),
              let start = UInt64(String(decoding: rest[19], as: UTF8.self))
        else { return nil }
        return (pid, rest[0].first!, session, start)
    }

    /// The value of `/proc/PID/sessionid`; nil if it is unset, empty or not a number.
    package static func auditSessionID(from bytes: [UInt8]) -> UInt32? {
        let text = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: " \n")
        guard let id = UInt32(text), id != auditSessionUnset else { return nil }
        return id
    }
}

extension String {
    /// Drops the characters of `set` from both ends (Foundation's trimmingCharacters without Foundation).
    fileprivate func trimmingCharacters(in set: String) -> String {
        var s = Substring(self)
        while let f = s.first, set.contains(f) { s = s.dropFirst() }
        while let l = s.last, set.contains(l) { s = s.dropLast() }
        return String(s)
    }
}
