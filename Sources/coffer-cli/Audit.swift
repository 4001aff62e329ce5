// `coffer audit`: the agent's audit log, one line per allowed or denied access.
import ArgumentParser
import CofferAudit
import CofferModel
import CofferSystem
import Glibc

struct AuditCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audit",
        abstract: "Show the audit log: who accessed which access group, when, with what result (never a secret or attribute value).")
    @Option(name: .customLong("state-dir"), help: "The agent's state directory (default $XDG_DATA_HOME/coffer).") var stateDir: String?
    @Flag(help: "Keep printing records as they are written (follows rotation).") var follow = false
    @Flag(help: "Print each record as a JSON line.") var json = false
    @Option(help: "Only records from this time on: seconds since the epoch, 2026-11-23T20:10:00Z, 2026-11-23, or a duration ago (90s, 10m, 2h, 7d).")
    var since: String?

    func validate() throws {
        if let since, AuditCommand.parseTime(since, now: AuditCommand.wallSeconds()) == nil {
            throw ValidationError("cannot read --since '\(since)'; give epoch seconds, 2026-11-23T20:10:00Z, 2026-11-23 or 10m/2h/7d")
        }
    }

    func run() throws {
        let dir = stateDir ?? AuditCommand.defaultStateDirectory()
        let from = since.flatMap { AuditCommand.parseTime($0, now: AuditCommand.wallSeconds()) }
        let show: (AuditRecord) -> Void = { r in
            guard from == nil || r.time >= from! else { return }
            Output.print(json ? String(r.jsonLine().dropLast()) : AuditCommand.text(r))
        }
        if !follow {
            let (records, skipped) = AuditReader.read(directory: dir, since: from)
            records.forEach(show)
            if skipped > 0 { Output.printError("coffer: skipped \(skipped) line(s) that are not audit records") }
            return
        }
        // Older files once, then the live file through a descriptor, reopened when it is rotated away.
        let live = dir + "/" + AuditLog.fileName
        for f in AuditLog.files(in: dir) where f != live {
            if let bytes = try? Files.read(f, maxBytes: 64 << 20) { AuditReader.records(in: bytes).records.forEach(show) }
        }
        var fd: Int32 = -1
        var pending: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            if fd < 0 {
                fd = open(live, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
                pending = []
                if fd < 0 { usleep(200_000); continue }
            }
            let n = buffer.withUnsafeMutableBytes { b in read(fd, b.baseAddress!, b.count) }
            if n > 0 {
                pending += buffer[0..<n]
                if let lastLF = pending.lastIndex(of: 0x0A) {
                    AuditReader.records(in: Array(pending[...lastLF])).records.forEach(show)
                    pending.removeSubrange(...lastLF)
                }
                continue
            }
            // At the end: if the path now names another file (rotated), finish with the new one.
            var a = stat(), b = stat()
            if fstat(fd, &a) == 0, stat(live, &b) == 0, a.st_ino != b.st_ino || a.st_dev != b.st_dev {
                close(fd)
                fd = -1
                continue
            }
            usleep(200_000)
        }
    }

    static func wallSeconds() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }

    static func defaultStateDirectory() -> String {
        if let x = getenv("XDG_DATA_HOME").map({ String(cString: $0) }), x.hasPrefix("/") { return x + "/coffer" }
        let home = getenv("HOME").map { String(cString: $0) } ?? "/"
        return home + "/.local/share/coffer"
    }

    /// `2026-11-23T20:10:09.123Z  errSecSuccess (0)  get  app=… exe=… pid=… group=… class=…`, every
    /// string escaped as `find` escapes values (no control character reaches the terminal).
    static func text(_ r: AuditRecord) -> String {
        let status = SecStatus(rawValue: r.result).map { "\($0.name) (\(r.result))" } ?? "OSStatus \(r.result)"
        var parts = [isoMillis(r.time), status, Output.escapedText(r.operation)]
        parts.append("app=" + (r.app.map(Output.escapedText) ?? "-"))
        parts.append("exe=" + (r.executable.map(Output.escapedText) ?? "-"))
        parts.append("pid=\(r.pid)")
        parts.append("group=" + (r.accessGroup.map(Output.escapedText) ?? "-"))
        parts.append("class=" + (r.itemClass?.rawValue ?? "-"))
        // An ssh-agent signature's key, destination and reason, when the record has them.
        for (name, value) in [("key", r.key), ("destination", r.destination), ("reason", r.reason)] {
            if let value { parts.append(name + "=" + Output.escapedText(value)) }
        }
        return parts.joined(separator: "  ")
    }

    static func isoMillis(_ t: Double) -> String {
        let whole = Output.iso8601(t)
        let ms = Int(((t - t.rounded(.down)) * 1000).rounded()) % 1000
        return String(whole.dropLast()) + "." + String(repeating: "0", count: 3 - String(ms).count) + String(ms) + "Z"
    }

    /// Seconds since the epoch for `text`: a number, an ISO 8601 UTC time or date, or a duration ago.
    static func parseTime(_ text: String, now: Double) -> Double? {
        if let d = Double(text), d.isFinite, d >= 0 { return d }
        if let unit = text.last, let n = Double(text.dropLast()), n >= 0, n.isFinite {
            switch unit {
            case "s": return now - n
            case "m": return now - n * 60
            case "h": return now - n * 3600
            case "d": return now - n * 86400
            default: break
            }
        }
        // YYYY-MM-DD, optionally followed by THH:MM:SS and an optional Z (always UTC).
        let u = Array(text.utf8)
        func num(_ r: Range<Int>) -> Int32? {
            guard r.upperBound <= u.count, u[r].allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
            return Int32(String(decoding: u[r], as: UTF8.self))
        }
        guard u.count >= 10, u[4] == 0x2D, u[7] == 0x2D, let y = num(0..<4), let mo = num(5..<7), let d = num(8..<10) else { return nil }
        var tmv = tm()
        tmv.tm_year = y - 1900
        tmv.tm_mon = mo - 1
        tmv.tm_mday = d
        var rest = u[10...]
        if !rest.isEmpty {
            guard rest.count >= 9, u[10] == 0x54, u[13] == 0x3A, u[16] == 0x3A,
                  let h = num(11..<13), let mi = num(14..<16), let sec = num(17..<19) else { return nil }
            tmv.tm_hour = h
            tmv.tm_min = mi
            tmv.tm_sec = sec
            rest = u[19...]
            if rest.first == 0x5A { rest = rest.dropFirst() }
            guard rest.isEmpty else { return nil }
        }
        guard (1...12).contains(mo), (1...31).contains(d), tmv.tm_hour < 24, tmv.tm_min < 60, tmv.tm_sec < 61 else { return nil }
        return Double(timegm(&tmv))
    }
}
