import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Where `swift build` put the executables under test.
enum Binaries {
    static let directory: String = {
        // The build that made this test runner (so a sanitizer build tests its own sanitized agent).
        if let exe = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            let dir = URL(fileURLWithPath: exe).deletingLastPathComponent().path
            if FileManager.default.isExecutableFile(atPath: dir + "/cofferd") { return dir }
        }
        // Tests/CofferEndToEndTests/AgentHarness.swift → package root
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        for config in ["debug", "release"] {
            let dir = root.appendingPathComponent(".build/\(config)").path
            if FileManager.default.isExecutableFile(atPath: dir + "/cofferd") { return dir }
        }
        return root.appendingPathComponent(".build/debug").path
    }()
    static var cofferd: String { directory + "/cofferd" }
    static var coffer: String { directory + "/coffer" }
    static var packageRoot: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
    }
}

/// A real `cofferd` child process with a private state directory, socket and PAM stack
/// (pam_matrix from libpam-wrapper, loaded by absolute path through `--pam-confdir`).
final class AgentProcess: @unchecked Sendable {
    let dir = TemporaryDirectory("coffer-e2e")
    var stateDir: String { dir.file("state") }
    var socketPath: String { dir.file("run/coffer/agent.sock") }
    var pamDir: String { dir.file("pam") }
    private(set) var process: Process?
    private(set) var logPath: String
    let extraArguments: [String]
    /// Something that must live as long as the agent (a directory its configuration names).
    var keepAlive: AnyObject? = nil
    /// A command the agent is started through (e.g. `prlimit --memlock=…`), which must exec it in place.
    let launcher: [String]
    /// The `cofferd` to run: the build's, or a copy another user can reach (``SharedDirectory``).
    let executable: String
    /// The PAM service the agent verifies passcodes with (its file is in `pamDir`).
    let pamService: String
    /// pam_matrix's password file (`user:password:service` lines).
    var passdb: String { dir.file("passdb") }

    /// The login password PAM accepts in these tests.
    static let password = "correct horse"
    static let matrix = PAMWrapper.matrix

    init(extraArguments: [String] = [], pamService: String = "coffer", launcher: [String] = [],
         executable: String = Binaries.cofferd, start: Bool = true) throws {
        self.extraArguments = extraArguments
        self.launcher = launcher
        self.executable = executable
        self.pamService = pamService
        logPath = ""
        try FileManager.default.createDirectory(atPath: pamDir, withIntermediateDirectories: true)
        try "\(currentUser):\(Self.password):\(pamService)\n".write(toFile: passdb, atomically: true, encoding: .utf8)
        try """
            auth required \(Self.matrix) passdb=\(passdb)
            account required \(Self.matrix) passdb=\(passdb)

            """.write(toFile: pamDir + "/" + pamService, atomically: true, encoding: .utf8)
        if start { try self.start() }
    }

    /// The arguments `cofferd` gets (also used by pam_coffer's agent= start-up test).
    var agentArguments: [String] {
        ["--socket", socketPath, "--state-dir", stateDir, "--pam-confdir", pamDir, "--pam-service", pamService,
         "--log-level", "debug", "--kdf-ops", "1"] + extraArguments
    }

    /// Starts the agent in the foreground and waits until its socket accepts.
    func start() throws {
        logPath = dir.file("cofferd-\(UUID().uuidString.prefix(8)).log")
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let p = Process()
        let command = launcher + [executable, "--foreground"] + agentArguments
        p.executableURL = URL(fileURLWithPath: command[0])
        p.arguments = Array(command.dropFirst())
        p.standardError = FileHandle(forWritingAtPath: logPath)
        p.standardOutput = FileHandle.nullDevice
        p.standardInput = FileHandle.nullDevice
        try p.run()
        process = p
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            if let fd = try? UnixSocket.connect(path: socketPath) { close(fd); return }
            if !p.isRunning { break }
            usleep(5000)
        }
        throw AgentStartError(log: log)
    }

    struct AgentStartError: Error, CustomStringConvertible {
        let log: String
        var description: String { "cofferd did not start:\n\(log)" }
    }

    /// The agent's log so far.
    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    var pid: Int32 { process?.processIdentifier ?? 0 }

    /// SIGTERM and wait; returns the exit status.
    @discardableResult
    func stop() -> Int32 {
        guard let p = process, p.isRunning else { return process?.terminationStatus ?? 0 }
        p.terminate()
        p.waitUntilExit()
        return p.terminationStatus
    }

    /// SIGKILL and wait.
    func kill9() {
        guard let p = process, p.isRunning else { return }
        Glibc.kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
    }

    func restart() throws {
        stop()
        try start()
    }

    deinit { kill9() }

    /// Runs the `coffer` CLI against this agent.
    func cli(_ args: [String], stdin: String? = nil, environment: [String: String] = [:]) -> CLIResult {
        runCLI(args, stdin: stdin, environment: ["COFFER_SOCKET": socketPath].merging(environment) { $1 })
    }

    /// Sets the passcode (the PAM password) and leaves the agent unlocked.
    func setPasscode() {
        let r = cli(["passcode", "set", "--passcode-stdin"], stdin: Self.password)
        #expect(r.status == 0, "passcode set failed: \(r.stderr)\n\(log)")
    }
}

/// Runs `executable` (default `coffer`) with `args` (``runProcess(_:_:stdin:environment:unset:directory:timeout:)``).
func runCLI(_ args: [String], stdin: String? = nil, environment: [String: String] = [:], executable: String = Binaries.coffer,
            unset: [String] = [], timeout: Double = 300) -> CLIResult {
    runProcess(executable, args, stdin: stdin, environment: environment, unset: unset, timeout: timeout)
}

/// A fresh directory under /tmp that every user can traverse (0755), removed when released: the place
/// for what a process of another user must reach. The checkout and its build directory may live under
/// a directory other users cannot enter (a clone under a 0700 `mktemp -d`), so a test must never make
/// another user run or open a file where it was built.
final class SharedDirectory: @unchecked Sendable {
    let path: String

    init(_ prefix: String = "coffer-shared") throws {
        var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
        guard let p = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw CocoaError(.fileWriteUnknown)
        }
        path = String(cString: p)
        chmod(path, 0o755)
    }

    func file(_ name: String) -> String { path + "/" + name }

    /// Copies `executable` here (mode 0755) so that any user can run it; returns the copy's path.
    /// Only for self-contained programs (the `coffer` CLI is linked statically; the C helpers need
    /// only libc/libpam): a dynamically linked program still loads its libraries from where they are.
    func copyExecutable(_ executable: String, named name: String? = nil) throws -> String {
        let destination = file(name ?? URL(fileURLWithPath: executable).lastPathComponent)
        try? FileManager.default.removeItem(atPath: destination)
        try FileManager.default.copyItem(atPath: executable, toPath: destination)
        chmod(destination, 0o755)
        return destination
    }

    /// A subdirectory owned by `uid`/`gid` (mode 0700), e.g. where another user's process puts its socket.
    func privateDirectory(_ name: String, uid: uid_t, gid: gid_t) throws -> String {
        let dir = file(name)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        guard chown(dir, uid, gid) == 0 else { throw CocoaError(.fileWriteNoPermission) }
        chmod(dir, 0o700)
        return dir
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// A throwaway system user (no home, no shell) for tests that need a process of another uid; root only.
/// Deleted when released.
final class ThrowawayUser: @unchecked Sendable {
    let name: String
    let uid: uid_t
    let gid: gid_t

    /// A new system user named `prefix` and a random number (never an existing one: a name left over
    /// by a killed run, or one a concurrent run took, is skipped).
    init(prefix: String) throws {
        var last = ""
        for _ in 0..<5 {
            let candidate = "\(prefix)\(UInt32.random(in: 10_000...99_999_999))"
            let r = Self.locked { runShell("useradd --system --no-create-home --user-group --shell /usr/sbin/nologin '\(candidate)'", socket: "") }
            if r.status == 0, let pw = getpwnam(candidate) {
                name = candidate
                uid = pw.pointee.pw_uid
                gid = pw.pointee.pw_gid
                return
            }
            last = r.stderr
        }
        throw UserError(output: last)
    }

    /// `coffer-TAG…` (the other-uid socket tests).
    convenience init(_ tag: String) throws { try self.init(prefix: "coffer-\(tag)") }

    struct UserError: Error { let output: String }

    /// `body` run while no other test process of this machine adds or removes a user: contrib/test.sh runs
    /// several test processes at once, and useradd and userdel of two of them would contend for the lock
    /// of /etc/passwd (shadow's tools give up after a while on a loaded machine).
    static func locked<T>(_ body: () -> T) -> T { MachineWideLock.with("useradd", body) }

    deinit { _ = Self.locked { runShell("userdel '\(name)'", socket: "") } }
}
