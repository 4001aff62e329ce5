import Foundation
import Glibc

/// A swtpm (TPM 2.0 simulator) this test started: its own state directory, TCP ports picked free for
/// it, `--daemon --pid file=`, stopped (SIGTERM, then SIGKILL) when released. A fresh state directory
/// is a fresh TPM (its own seeds), made in milliseconds without swtpm_setup (no EK certificates needed).
public final class SoftwareTPM: @unchecked Sendable {
    /// swtpm's path, or nil when it is not installed.
    public static let executable: String? = ["/usr/bin/swtpm", "/usr/local/bin/swtpm"].first { access($0, X_OK) == 0 }
    /// True if swtpm and tpm2-tss's swtpm TCTI are both installed.
    public static let available: Bool = executable != nil && dlopen("libtss2-tcti-swtpm.so.0", RTLD_LAZY) != nil
    public static let unavailableReason = "no swtpm or no tpm2-tss swtpm TCTI (apt-get install swtpm libtss2-dev; contrib/deps.sh)"
    /// tpm2-tools' directory, or nil when it is not installed.
    public static let tools: String? = access("/usr/bin/tpm2_hmac", X_OK) == 0 ? "/usr/bin" : nil

    public let state: TemporaryDirectory
    public private(set) var port: UInt16 = 0
    public private(set) var pid: Int32 = 0

    /// The TCTI configuration string reaching it.
    public var tcti: String { "swtpm:host=127.0.0.1,port=\(port)" }

    /// Starts a swtpm on `state` (a new directory: a new TPM).
    public init(state: TemporaryDirectory = TemporaryDirectory("coffer-swtpm")) throws {
        self.state = state
        try start()
    }

    deinit { stop() }

    /// Starts swtpm on two fresh ports (server P, control P + 1), retrying when another process took them first.
    public func start() throws {
        var lastError = ""
        for _ in 0..<8 {
            guard let p = Self.freePortPair() else { continue }
            let pidFile = state.file("swtpm.pid")
            unlink(pidFile)
            // Not runProcess (nor Process): the daemon inherits output pipes and holds them open; posix_spawn with
            // /dev/null for all three and waitpid for the parent, which exits once the daemon listens.
            let args = [Self.executable!, "socket", "--tpm2", "--tpmstate", "dir=\(state.path)",
                        "--server", "type=tcp,port=\(p),bindaddr=127.0.0.1", "--ctrl", "type=tcp,port=\(p + 1),bindaddr=127.0.0.1",
                        "--flags", "not-need-init,startup-clear", "--daemon", "--pid", "file=\(pidFile)",
                        "--log", "file=\(state.file("swtpm.log"))"]
            let status = Self.spawnAndWait(args)
            guard status == 0, let text = try? String(contentsOfFile: pidFile, encoding: .utf8),
                  let pid = pid_t(text.trimmingCharacters(in: .whitespacesAndNewlines))
            else {
                lastError = "exit status \(status); " + ((try? String(contentsOfFile: state.file("swtpm.log"), encoding: .utf8)) ?? "")
                continue
            }
            self.port = p
            self.pid = pid
            // swtpm may daemonise before it listens: wait (generously) until its server port accepts.
            let deadline = Date().addingTimeInterval(30)
            while !Loopback.accepts(p) {
                guard Date() < deadline, Loopback.running(pid) else { throw SoftwareTPMError(message: "swtpm \(pid) never listened on port \(p)") }
                usleep(10_000)
            }
            return
        }
        throw SoftwareTPMError(message: "swtpm did not start: \(lastError)")
    }

    /// Stops swtpm and waits until it is gone: SIGKILL, a power loss (the test runner blocks SIGTERM and
    /// its children inherit that; swtpm writes its NV state to its directory as each command changes it).
    public func stop() {
        guard pid > 0 else { return }
        kill(pid, SIGKILL)
        while Loopback.running(pid) { usleep(10_000) }
        pid = 0
    }

    /// Runs `args` with /dev/null as its standard streams and returns its exit status (-1 if it could not start).
    private static func spawnAndWait(_ args: [String]) -> Int32 {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for fd: Int32 in 0...2 { posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0) }
        var argv: [UnsafeMutablePointer<CChar>?] = args.map { strdup($0) } + [nil]
        defer { for a in argv { free(a) } }
        var child: pid_t = 0
        guard posix_spawn(&child, args[0], &actions, nil, &argv, environ) == 0 else { return -1 }
        var status: Int32 = 0
        while waitpid(child, &status, 0) < 0 && errno == EINTR {}
        return (status & 0x7f) == 0 ? (status >> 8) & 0xff : -1
    }

    /// Stops and starts it again on the same state (new ports): the TPM after a power cycle.
    public func restart() throws {
        stop()
        try start()
    }

    /// Runs a tpm2-tools command against this TPM (no resource manager: the caller flushes).
    public func tool(_ name: String, _ args: [String]) -> CLIResult {
        runProcess(Self.tools! + "/" + name, args, environment: ["TPM2TOOLS_TCTI": tcti], directory: URL(fileURLWithPath: state.path),
                   timeout: 60)
    }

    /// A port P with P and P + 1 both free on 127.0.0.1 right now.
    private static func freePortPair() -> UInt16? {
        for _ in 0..<32 {
            guard let p = Loopback.freePort(), p < UInt16.max, Loopback.freePort(p + 1) != nil else { continue }
            return p
        }
        return nil
    }
}

public struct SoftwareTPMError: Error, CustomStringConvertible {
    let message: String
    public var description: String { message }
}
