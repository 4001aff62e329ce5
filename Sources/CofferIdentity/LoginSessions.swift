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

    /// The `/proc/PID/stat` fields of process `pid` if it is alive and not a zombie
    /// (``ProcessStat/of(pid:)``).
    package static func stat(ofPID pid: Int32) -> (pid: Int32, state: UInt8, session: Int32, startTime: UInt64)? {
        ProcessStat.of(pid: pid)
    }

    /// ``ProcessStat/parse(_:)``.
    package static func parseStat(_ line: ArraySlice<UInt8>) -> (pid: Int32, state: UInt8, session: Int32, startTime: UInt64)? {
        ProcessStat.parse(line)
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
