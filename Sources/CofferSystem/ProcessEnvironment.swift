import Glibc

/// Another process's environment as it started (`/proc/PID/environ`), for the few names a front end
/// or the agent's prompter needs of a delegated client (its display).
package enum ProcessEnvironment {
    /// The variables of `names` that process `pid` was started with, read only while it still has
    /// `startTime` (clock ticks since boot, `/proc/PID/stat` field 22): a reused pid's are never
    /// returned. Empty when the process is gone, another's or not that one. At most 1 MiB is read.
    package static func variables(_ names: Set<String>, ofPID pid: Int32, startTime: UInt64) -> [String: String] {
        let fd = unsafe open("/proc/\(pid)/environ", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return [:] }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while bytes.count < 1 << 20 {
            let n = unsafe chunk.withUnsafeMutableBytes { unsafe read(fd, $0.baseAddress, $0.count) }
            guard n > 0 else { break }
            bytes += chunk[0..<n]
        }
        guard ProcessStat.of(pid: pid)?.startTime == startTime else { return [:] }
        var out: [String: String] = [:]
        for entry in bytes.split(separator: 0) {
            guard let eq = entry.firstIndex(of: UInt8(ascii: "=")) else { continue }
            let name = String(decoding: entry[entry.startIndex..<eq], as: UTF8.self)
            if names.contains(name) { out[name] = String(decoding: entry[(eq + 1)...], as: UTF8.self) }
        }
        return out
    }
}
