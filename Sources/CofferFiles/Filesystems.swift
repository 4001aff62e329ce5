package import CofferModel
import Glibc

/// What a path's filesystem is, for messages people can act on: its type and the device to run
/// `tune2fs` on (from `/proc/self/mountinfo`).
package enum Filesystems {
    /// True if this kernel's ext4 has fscrypt (`/sys/fs/ext4/features/encryption`).
    package static var kernelHasExt4Encryption: Bool { unsafe access("/sys/fs/ext4/features/encryption", F_OK) == 0 }

    /// Whether a directory at `path` could be protected as far as its filesystem and kernel go: nil if
    /// yes, else the reason with its one-time fix (``FileProtectionError``'s message). What `coffer status`
    /// says of the home directory.
    package static func fscryptRefusal(_ path: String) -> String? {
        do {
            _ = try Fscrypt.policy(of: path)
            return nil
        } catch {
            return error.description
        }
    }

    /// The filesystem type (`ext4`, `tmpfs`, …) and its mount source (e.g. `/dev/sda2`) of `path`.
    package static func describe(_ path: String) -> (type: String, device: String) {
        var st = stat()
        let own = unsafe lstat(path, &st)
        if own != 0 {
            let parentStatus = unsafe stat(Self.parent(of: path), &st)
            guard parentStatus == 0 else { return ("unknown", "DEVICE") }
        }
        let dev = UInt64(st.st_dev)
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & ~UInt64(0xfff))
        let minor = (dev & 0xff) | ((dev >> 12) & ~UInt64(0xff))
        guard let text = readText("/proc/self/mountinfo") else { return ("unknown", "DEVICE") }
        for line in text.split(separator: "\n") {
            // ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL…] - TYPE SOURCE SUPEROPTIONS
            let fields = line.split(separator: " ")
            guard fields.count > 3, fields[2] == "\(major):\(minor)", let dash = fields.firstIndex(of: "-"), dash + 2 < fields.count else { continue }
            return (String(fields[dash + 1]), String(fields[dash + 2]))
        }
        return ("unknown", "DEVICE")
    }

    /// The directory holding `path` (`/` for `/x`).
    package static func parent(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// A small text file's contents (a /proc file), nil if unreadable.
    package static func readText(_ path: String, maxBytes: Int = 1 << 20) -> String? {
        let fd = unsafe open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { _ = close(fd) }
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16384)
        while out.count < maxBytes {
            let n = unsafe buffer.withUnsafeMutableBytes { unsafe read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            out += buffer[0..<n]
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// Which processes hold files of a directory open (their descriptors, working directory or root,
/// from `/proc/PID/fd`, `cwd` and `root`): the files that keep a removed key incompletely removed.
package enum FileHolders {
    /// Every process (that this user may inspect) with something open under `directory`, by pid.
    package static func holding(_ given: String) -> [FileHolder] {
        // The kernel names open files by their normal path: compare with the directory's own.
        var directory = given
        if let resolved = unsafe realpath(given, nil) {
            directory = unsafe String(cString: resolved)
            unsafe free(resolved)
        }
        let prefix = directory.hasSuffix("/") ? directory : directory + "/"
        func inside(_ target: String) -> Bool { target == directory || target.hasPrefix(prefix) }
        var found: [FileHolder] = []
        guard let proc = unsafe opendir("/proc") else { return [] }
        defer { unsafe closedir(proc) }
        var pids: [Int32] = []
        while let e = unsafe readdir(proc) {
            let name = unsafe withUnsafeBytes(of: e.pointee.d_name) { raw in
                unsafe String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
            }
            if let pid = Int32(name) { pids.append(pid) }
        }
        for pid in pids.sorted() {
            var holds = ["cwd", "root"].contains { link("/proc/\(pid)/\($0)").map(inside) ?? false }
            if !holds, let fds = unsafe opendir("/proc/\(pid)/fd") {
                while !holds, let e = unsafe readdir(fds) {
                    let name = unsafe withUnsafeBytes(of: e.pointee.d_name) { raw in
                        unsafe String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
                    }
                    guard Int(name) != nil else { continue }
                    if let target = link("/proc/\(pid)/fd/\(name)"), inside(target) { holds = true }
                }
                unsafe closedir(fds)
            }
            if holds {
                let comm = Filesystems.readText("/proc/\(pid)/comm", maxBytes: 64)?.split(separator: "\n").first.map(String.init) ?? "?"
                found.append(FileHolder(pid: pid, name: comm))
            }
        }
        return found
    }

    /// A symbolic link's target, nil if it cannot be read.
    private static func link(_ path: String) -> String? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = unsafe buffer.withUnsafeMutableBytes { unsafe readlink(path, $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n], as: UTF8.self)
    }
}
