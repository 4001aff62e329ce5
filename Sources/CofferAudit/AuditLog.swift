package import CofferModel
package import CofferSystem
import Glibc

/// One allowed or denied access, as the audit log keeps it. The type has no field that could hold a
/// secret or an attribute value: who (app id or executable, pid), what (operation, access group,
/// item class), when, and the result code; for an ssh-agent signature also the key's fingerprint, the
/// destination host and the reason of the decision (public names, never a secret). ``fieldNames`` is the
/// whole schema.
package struct AuditRecord: Sendable, Equatable {
    /// Seconds since the Unix epoch (millisecond precision in the file).
    package let time: Double
    /// The caller's pid.
    package let pid: Int32
    /// The caller's app identifier from its manifest (nil: no signed identity).
    package let app: String?
    /// The caller's executable path (from `/proc/PID/exe`), if known.
    package let executable: String?
    /// The operation: a name like `get`, `add`, `find`, `update`, `delete`, `unlock`.
    package let operation: String
    /// The access group the operation used or asked for (nil: none).
    package let accessGroup: String?
    /// The item class (nil: not an item operation).
    package let itemClass: ItemClass?
    /// The result (OSStatus: 0 for success, e.g. -34018 errSecMissingEntitlement).
    package let result: Int32
    /// A signature's key (`SHA256:…` fingerprint of the public key; nil: not a signature).
    package let key: String?
    /// Where a signature goes: the host the ssh-agent's `session-bind@openssh.com` named (nil: unknown).
    package let destination: String?
    /// Why the decision was taken, a fixed word (`confirmed`, `cancelled`, `locked`, …; nil: not given).
    package let reason: String?

    /// Every key a record's JSON object may have, in file order: the complete schema. The last three
    /// (``optionalFieldNames``) are written only when set; a line without them is a record too.
    package static let fieldNames = ["time", "pid", "app", "executable", "operation", "accessGroup", "class", "result"] + optionalFieldNames
    /// The keys written only when the record has them (ssh-agent signatures).
    package static let optionalFieldNames = ["key", "destination", "reason"]

    package init(time: Double, pid: Int32, app: String?, executable: String?, operation: String,
                accessGroup: String?, itemClass: ItemClass?, result: Int32, key: String? = nil, destination: String? = nil,
                reason: String? = nil) {
        self.time = (time * 1000).rounded() / 1000
        self.pid = pid
        self.app = app
        self.executable = executable
        self.operation = operation
        self.accessGroup = accessGroup
        self.itemClass = itemClass
        self.result = result
        self.key = key
        self.destination = destination
        self.reason = reason
    }

    /// The record's JSON line (with its LF): one flat object, keys in ``fieldNames`` order, strings
    /// escaped so that no value can end the line or add a key.
    package func jsonLine() -> String {
        func str(_ s: String?) -> String { s.map(AuditJSON.quote) ?? "null" }
        let millis = Int64((time * 1000).rounded())
        let t = "\(millis / 1000).\(String(repeating: "0", count: 3 - String(abs(millis % 1000)).count))\(abs(millis % 1000))"
        return "{\"time\":\(t),\"pid\":\(pid),\"app\":\(str(app)),\"executable\":\(str(executable)),"
            + "\"operation\":\(str(operation)),\"accessGroup\":\(str(accessGroup)),\"class\":\(str(itemClass?.rawValue)),"
            + "\"result\":\(result)" + optionalFields + "}\n"
    }

    /// `,"key":…,"destination":…,"reason":…` for those that are set.
    private var optionalFields: String {
        zip(Self.optionalFieldNames, [key, destination, reason]).compactMap { name, value in
            value.map { ",\"\(name)\":\(AuditJSON.quote($0))" }
        }.joined()
    }

    /// The record a JSON line holds, or nil if the line is not one (a torn or foreign line).
    package init?(jsonLine line: String) {
        guard let fields = AuditJSON.parseFlatObject(line),
              case .number(let time)? = fields["time"], case .number(let pid)? = fields["pid"],
              case .string(let op)? = fields["operation"], case .number(let result)? = fields["result"],
              let p = Int32(exactly: pid), let r = Int32(exactly: result) else { return nil }
        func optional(_ k: String) -> String?? {
            switch fields[k] {
            case .string(let s)?: return .some(s)
            case .null?, nil: return .some(nil)
            default: return nil
            }
        }
        guard let app = optional("app"), let exe = optional("executable"), let group = optional("accessGroup"),
              let cls = optional("class"), let key = optional("key"), let destination = optional("destination"),
              let reason = optional("reason") else { return nil }
        var itemClass: ItemClass? = nil
        if let c = cls {
            guard let k = ItemClass(rawValue: c) else { return nil }
            itemClass = k
        }
        self.init(time: time, pid: p, app: app, executable: exe, operation: op, accessGroup: group,
                  itemClass: itemClass, result: r, key: key, destination: destination, reason: reason)
    }
}

/// The audit log: `audit.log` in a directory, JSON lines, one `write(2)` per record on an `O_APPEND`
/// descriptor (a crash loses at most the record being written, never an earlier one; a torn last line
/// is ended before the next record so it spoils only itself), mode 0600, rotated by size:
/// `audit.log` → `audit.log.1` → … → `audit.log.KEEP`, the oldest dropped.
package final class AuditLog: Sendable {
    package static let fileName = "audit.log"
    package let directory: String
    package let maximumBytes: Int
    package let keep: Int
    private let state = Protected<Int32>(-1)

    /// A log in `directory` (which must exist), rotated when a record would take `audit.log` past
    /// `maximumBytes` (default 1 MiB), keeping `keep` old files (default 3).
    package init(directory: String, maximumBytes: Int = 1 << 20, keep: Int = 3) {
        self.directory = directory
        self.maximumBytes = maximumBytes
        self.keep = max(keep, 0)
    }

    deinit { state.withLock { if $0 >= 0 { close($0) } } }

    package var path: String { directory + "/" + Self.fileName }

    /// Appends `record` as one line with one `write`.
    package func append(_ record: AuditRecord) throws(SystemError) {
        let line = Array(record.jsonLine().utf8)
        try state.withLock { (fd: inout Int32) throws(SystemError) in
            if fd < 0 { fd = try openLog() }
            var st = stat()
            let raw = fd
            _ = try Syscall.retrying("fstat", path) { fstat(raw, &st) }
            if st.st_size > 0 && Int(st.st_size) + line.count > maximumBytes {
                close(fd)
                fd = -1
                try rotate()
                fd = try openLog()
            }
            // One write (O_APPEND): a record is never interleaved with another writer's.
            let out = fd
            let n = try Syscall.retrying("write", path) { line.withUnsafeBytes { b in Glibc.write(out, b.baseAddress!, b.count) } }
            guard n == line.count else { throw SystemError("write", path, errno: EIO) }
        }
    }

    /// The log's files, oldest first (those that exist): `audit.log.KEEP` … `audit.log.1`, `audit.log`.
    package static func files(in directory: String, keep: Int = 3) -> [String] {
        RotatingLogFile.files(directory + "/" + fileName, keep: keep)
    }

    private func openLog() throws(SystemError) -> Int32 {
        let fd = try FileDescriptor.open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW, mode: 0o600)
        let st = try fd.status(path: path)
        guard st.st_mode & S_IFMT == S_IFREG else { throw SystemError(refusing: path, "is not a regular file", errno: EINVAL) }
        if st.st_mode & 0o077 != 0 { try? fd.setMode(0o600, path: path) }
        // A record torn by a crash has no LF: end it, so that the next record starts a line of its own.
        if st.st_size > 0, let reader = try? FileDescriptor.open(path, O_RDONLY | O_NOFOLLOW) {
            // The write descriptor cannot read: look at the last byte through a read-only one.
            var last: [UInt8] = [0]
            let got = try? last.withUnsafeMutableBytes { b throws(SystemError) in try reader.read(into: b, at: Int(st.st_size) - 1, path: path) }
            let out = fd.rawValue
            if got == 1, last[0] != 0x0A { _ = try? Syscall.retrying("write", path) { Glibc.write(out, "\n", 1) } }
        }
        return fd.release()
    }

    private func rotate() throws(SystemError) { try RotatingLogFile.rotate(path, keep: keep) }
}

/// Reading the audit log back.
package enum AuditReader {
    /// Every record in the log's files, oldest first, with `time >= since` if given; lines that are
    /// not records (a torn last line) are skipped and counted.
    package static func read(directory: String, keep: Int = 3, since: Double? = nil) -> (records: [AuditRecord], skipped: Int) {
        var out: [AuditRecord] = []
        var skipped = 0
        for f in AuditLog.files(in: directory, keep: keep) {
            guard let bytes = try? Files.read(f, maxBytes: 64 << 20) else { continue }
            let (rs, s) = records(in: bytes)
            skipped += s
            out += rs.filter { since == nil || $0.time >= since! }
        }
        return (out, skipped)
    }

    /// The records in complete lines of `bytes` (a trailing partial line is ignored, not counted).
    package static func records(in bytes: [UInt8]) -> (records: [AuditRecord], skipped: Int) {
        var out: [AuditRecord] = []
        var skipped = 0
        var lines = bytes.split(separator: 0x0A, omittingEmptySubsequences: false)
        lines.removeLast()  // after the last LF: empty or a partial line
        for line in lines where !line.isEmpty {
            if let r = AuditRecord(jsonLine: String(decoding: line, as: UTF8.self)) { out.append(r) } else { skipped += 1 }
        }
        return (out, skipped)
    }
}
