public import CofferCrypto
public import CofferKeybag
public import CofferModel
import Foundation

// Helpers several test targets had each written for themselves.

/// A secret in secure memory from a string's UTF-8 bytes.
public func secret(_ s: String) -> SecureBytes { Array(s.utf8).withUnsafeBytes { SecureBytes(copying: $0) } }

/// A secret of `count` bytes 0x73 ("s").
public func secret(count: Int) -> SecureBytes {
    [UInt8](repeating: 0x73, count: count).withUnsafeBytes { SecureBytes(copying: $0) }
}

/// A secret's bytes as UTF-8 text (nil for nil).
public func text(_ s: SecureBytes?) -> String? { s.map { $0.withUnsafeBytes { String(decoding: $0, as: UTF8.self) } } }

/// The OSStatus `body` threw: nil if it did not throw, errSecInternalComponent for an error other than `SecError`.
public func status<T>(_ body: () throws -> T) -> SecStatus? {
    do { _ = try body(); return nil } catch let e as SecError { return e.status } catch { return .internalComponent }
}

/// The cheapest Argon2id parameters the keybag accepts: tests that need a passcode KDF, not its cost.
public let testKDF = KDFPolicy.fixed(KDFParameters(opsLimit: 1, memLimit: KDFParameters.floorMemory))

/// The user running the tests (PAM checks passcodes for this name).
public let currentUser: String = String(cString: getpwuid(getuid())!.pointee.pw_name)

/// True when the tests run as root (for `@Test(.enabled(if: isRoot, "needs root …"))`).
public let isRoot = getuid() == 0

/// A lock held across every test process of this machine (contrib/test.sh runs several at once): for the few
/// tests that use a place all processes share, such as `/run/user/UID`. `flock` on a file under /tmp (a fixed
/// path, not TMPDIR, which is each process's own); two holders in one process exclude each other too.
public enum MachineWideLock {
    public static func with<T>(_ name: String, _ body: () throws -> T) rethrows -> T {
        let fd = open("/tmp/coffer-\(name).lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        if fd >= 0 { _ = flock(fd, LOCK_EX) }
        defer { if fd >= 0 { close(fd) } }
        return try body()
    }
}

/// Where libpam-wrapper installs its modules, and its `pam_matrix.so` (a PAM module that checks
/// `user:password:service` lines of a file: real libpam, nothing under /etc).
public enum PAMWrapper {
    /// The module directory.
    public static let modules = "/usr/lib/x86_64-linux-gnu/pam_wrapper"
    /// `pam_matrix.so` by absolute path.
    public static let matrix = modules + "/pam_matrix.so"

    /// Runs `body`, which starts a process under `LD_PRELOAD=libpam_wrapper.so`, while no other test of
    /// this process (nor, through a lock file, of another) starts one. pam_wrapper sets itself up in
    /// one of 36 fixed directories `/tmp/pam.X` (a copy of libpam patched to read it instead of
    /// /etc/pam.d, so the name has that length): two processes starting together can pick the same
    /// one, one fails with "File exists" and the other reads a service file the first is copying in
    /// ("illegal module type"), as a CI run showed. Once set up, a process keeps its own directory,
    /// so a body may leave a process running after it returns (a held session), not one still starting.
    public static func serialized<T>(_ body: () throws -> T) rethrows -> T {
        try MachineWideLock.with("pam-wrapper", body)
    }
}

/// A private PAM configuration directory for `pam_start_confdir`: real libpam, real modules,
/// nothing under /etc. Holds a pam_matrix `passdb` accepting `password` for the current user and
/// `service`, and the service file `serviceLines(dir)` returns. Removed when released.
public final class PAMSandbox: @unchecked Sendable {
    /// The directory (pass it as the confdir).
    public let dir: String

    public init(password: String = "s3cret pass", service: String = "coffer", serviceLines: (String) -> String) throws {
        dir = NSTemporaryDirectory() + "coffer-pam-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        try "\(currentUser):\(password):\(service)\n".write(toFile: dir + "/passdb", atomically: true, encoding: .utf8)
        try serviceLines(dir).write(toFile: dir + "/" + service, atomically: true, encoding: .utf8)
    }

    deinit { try? FileManager.default.removeItem(atPath: dir) }
}

/// Writes `text` as an executable file at `path` (0755), which another process will run: written beside it
/// first and installed by a copy (``ScriptedPinentry/install(_:at:)``), so that no descriptor this process
/// opened for writing it can be inherited by another test's child, which would make running it fail with
/// ETXTBSY while that child lives.
public func writeExecutable(_ text: String, to path: String) throws {
    try text.write(toFile: path + ".src", atomically: true, encoding: .utf8)
    try ScriptedPinentry.install(path + ".src", at: path)
}
