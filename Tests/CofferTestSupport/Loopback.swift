import Foundation
public import Glibc

/// TCP on 127.0.0.1 and processes the tests start as daemons: the helpers a test-started server
/// (sshd, swtpm) needs to pick its ports, see it listen and see it gone.
public enum Loopback {
    /// Binds a TCP socket to 127.0.0.1:`port` (0: one the kernel picks) and closes it again: the
    /// port it got (free at the time of asking), nil if it is taken.
    public static func freePort(_ port: UInt16 = 0) -> UInt16? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var addr = address(port)
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { a in
            a.withMemoryRebound(to: sockaddr.self, capacity: 1) { s in bind(fd, s, len) == 0 && getsockname(fd, s, &len) == 0 }
        }
        return ok ? UInt16(bigEndian: addr.sin_port) : nil
    }

    /// True if something accepts a TCP connection on 127.0.0.1:`port`.
    public static func accepts(_ port: UInt16) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var addr = address(port)
        return withUnsafePointer(to: &addr) { a in
            a.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }

    /// True while process `pid` exists and is not a zombie (a daemon, not this process's child, may
    /// be reaped late by whoever inherited it).
    public static func running(_ pid: pid_t) -> Bool {
        guard kill(pid, 0) == 0,
              let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return false }
        return !stat[close...].hasPrefix(") Z")
    }

    private static func address(_ port: UInt16) -> sockaddr_in {
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = port.bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        return addr
    }
}
