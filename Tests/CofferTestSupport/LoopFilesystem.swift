import Foundation

/// A real ext4 filesystem with the `encrypt` feature (fscrypt), made for one test: a file image in a
/// private temporary directory, `mkfs.ext4 -O encrypt`, a loop device (`losetup --find --show`) and a
/// mount inside the same directory. Unmounted, detached and removed when released (always, also after a
/// failed test). Needs root, loop devices and ext4 encryption in the kernel: ``unavailable`` names what
/// is missing, and tests skip with that message instead of passing silently.
public final class LoopFilesystem: @unchecked Sendable {
    /// Where the filesystem is mounted.
    public let mountPoint: String
    /// The loop device (e.g. `/dev/loop3`).
    public let device: String
    private let dir: TemporaryDirectory
    private var mounted = true

    /// Why no test filesystem can be made here, nil if one can (root, ext4 encryption, a loop device).
    public static var unavailable: String? {
        if getuid() != 0 { return "protected directories need a test filesystem on a loop device: the tests must run as root" }
        if access("/sys/fs/ext4/features/encryption", F_OK) != 0 { return "this kernel's ext4 has no encryption (/sys/fs/ext4/features/encryption)" }
        for tool in ["/sbin/mkfs.ext4", "/sbin/losetup", "/bin/mount"] where access(tool, X_OK) != 0 && access("/usr" + tool, X_OK) != 0 {
            return "\(tool) is missing (e2fsprogs, util-linux, mount)"
        }
        let r = runProcess("/sbin/losetup", ["-f"])
        if r.status != 0 { return "no free loop device (losetup -f: \(r.stderr.trimmingCharacters(in: .whitespacesAndNewlines)))" }
        return nil
    }

    /// Makes and mounts a `megabytes` MiB ext4 with `-O encrypt` (`encrypt: false`: without it).
    public init(megabytes: Int = 64, encrypt: Bool = true) throws {
        dir = TemporaryDirectory("coffer-fscrypt")
        let image = dir.file("fs.img")
        // The normal path (no `//`): the agent and the kernel name directories by it.
        mountPoint = (URL(fileURLWithPath: dir.path).resolvingSymlinksInPath().path as NSString).standardizingPath + "/mnt"

        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: false)
        guard truncate(image, off_t(megabytes) << 20) == 0 || (FileManager.default.createFile(atPath: image, contents: nil) && truncate(image, off_t(megabytes) << 20) == 0) else {
            throw Failure("truncate \(image) failed")
        }
        var r = runProcess("/sbin/mkfs.ext4", ["-q", "-F"] + (encrypt ? ["-O", "encrypt"] : []) + [image])
        guard r.status == 0 else { throw Failure("mkfs.ext4: \(r)") }
        r = runProcess("/sbin/losetup", ["--find", "--show", image])
        guard r.status == 0 else { throw Failure("losetup: \(r)") }
        device = r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        r = runProcess("/bin/mount", [device, mountPoint])
        guard r.status == 0 else {
            _ = runProcess("/sbin/losetup", ["-d", device])
            mounted = false
            throw Failure("mount: \(r)")
        }
    }

    /// `mountPoint/name`.
    public func file(_ name: String) -> String { mountPoint + "/" + name }

    /// Unmounts and detaches now (also done when released).
    public func tearDown() {
        guard mounted else { return }
        mounted = false
        for _ in 0..<50 {
            if runProcess("/bin/umount", [mountPoint]).status == 0 { break }
            usleep(100_000)
        }
        _ = runProcess("/sbin/losetup", ["-d", device])
    }

    deinit { tearDown() }

    /// A test filesystem that could not be made.
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        public init(_ d: String) { description = d }
    }
}
