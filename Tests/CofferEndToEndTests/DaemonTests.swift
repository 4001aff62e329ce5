import CofferClient
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// `cofferd` without `--foreground` daemonises (`ThisProcess.daemonize`): the command returns only
/// once the socket accepts, or with the daemon's failure status.
@Suite struct DaemonTests {
    /// Runs `cofferd ARGS` and returns its exit status. Started through `Subprocess.spawn`, which
    /// hands the child no descriptor but 0-2 and its socket: a daemon keeps what it inherited, and
    /// Foundation's `Process` watches its child through an inherited descriptor, so it would wait
    /// for the daemon instead of the command.
    static func runCofferd(_ args: [String]) throws -> Int32 {
        let env = ProcessInfo.processInfo.environment.map { "\($0.key)=\($0.value)" }
        let child = try Subprocess.spawn(executable: Binaries.cofferd, arguments: args, environment: env)
        return try child.wait()
    }

    static func link(_ path: String) -> String { (try? FileManager.default.destinationOfSymbolicLink(atPath: path)) ?? "?" }

    /// Starts a daemonising `cofferd` for `sandbox` and returns the daemon (the peer of its socket,
    /// which accepts the moment the command returned: ready means ready).
    static func startDaemon(_ sandbox: AgentProcess, extra: [String] = []) throws -> PeerIdentity {
        #expect(try runCofferd(sandbox.agentArguments + extra) == 0)
        let fd = try UnixSocket.connect(path: sandbox.socketPath)
        defer { close(fd) }
        return try PeerIdentity.of(socket: fd)
    }

    /// SIGTERM to a daemon, then waits for it to be gone (up to 60 s: a loaded machine).
    static func stopDaemon(_ daemon: PeerIdentity) {
        kill(daemon.pid, SIGTERM)
        for _ in 0..<6000 where kill(daemon.pid, 0) == 0 { usleep(10_000) }
    }

    @Test func theParentReturnsOnceTheDaemonServes() throws {
        let sandbox = try AgentProcess(start: false)
        let daemon = try Self.startDaemon(sandbox)
        defer { Self.stopDaemon(daemon) }
        #expect(getsid(daemon.pid) == daemon.pid, "the daemon leads its own session (setsid)")
        #expect(Self.link("/proc/\(daemon.pid)/fd/0") == "/dev/null")
        #expect(Self.link("/proc/\(daemon.pid)/fd/1") == "/dev/null")
        #expect(Self.link("/proc/\(daemon.pid)/fd/2").hasSuffix("/state/cofferd.log"), "stderr goes to the log in the state directory")
    }

    /// Issue #41 L1: a daemon's `cofferd.log` is rotated by size (`log-max-bytes`, `log-keep`): at most
    /// KEEP + 1 files of at most MAX bytes, whole lines in each, the daemon's standard error on the
    /// current file, and after a SIGKILL the next daemon goes on appending to it. The lines come from
    /// failed requests, which a daemon at log level debug logs one each.
    @Test func theDaemonsLogRotatesBySize() throws {
        let sandbox = try AgentProcess(start: false)
        let config = sandbox.dir.file("cofferd.conf")
        try "log-max-bytes = 4096\nlog-keep = 2\n".write(toFile: config, atomically: true, encoding: .utf8)
        var daemon = try Self.startDaemon(sandbox, extra: ["--config", config])
        defer { Self.stopDaemon(daemon) }
        let log = sandbox.stateDir + "/cofferd.log"
        let connection = try AgentConnection(path: sandbox.socketPath)
        // Until the second rotation (cofferd.log.2 exists) and a few lines more; 20,000 requests is a failure bound.
        var requests = 0
        while !FileManager.default.fileExists(atPath: log + ".2") && requests < 20_000 {
            _ = try? connection.copyMatching(password("not-there", "\(requests)"))
            requests += 1
        }
        for i in 0..<20 { _ = try? connection.copyMatching(password("not-there", "last \(i)")) }
        _ = try? connection.status()   // the request after the last failure: its line is written by then

        let files = [log + ".2", log + ".1", log]
        #expect(files.allSatisfy { FileManager.default.fileExists(atPath: $0) }, "after \(requests) failed requests")
        #expect(!FileManager.default.fileExists(atPath: log + ".3"), "log-keep = 2 kept a third file")
        for file in files {
            let bytes = (try? Data(contentsOf: URL(fileURLWithPath: file))) ?? Data()
            #expect(bytes.count > 0 && bytes.count <= 4096, "\(file): \(bytes.count) bytes")
            let text = String(decoding: bytes, as: UTF8.self)
            #expect(text.hasSuffix("\n") && text.split(separator: "\n").allSatisfy { $0.first?.isNumber == true },
                    "\(file) holds a line that does not start with its timestamp (torn):\n\(text)")
        }
        #expect((try? String(contentsOfFile: log, encoding: .utf8))?.contains("request failed") == true)
        var file = stat(), standardError = stat()
        #expect(stat(log, &file) == 0 && stat("/proc/\(daemon.pid)/fd/2", &standardError) == 0 && file.st_ino == standardError.st_ino,
                "the daemon's standard error is not the current log: \(Self.link("/proc/\(daemon.pid)/fd/2"))")

        // A SIGKILL (a crash), then a new daemon: it writes to the current file (rotating it first if
        // its lines would not fit), and the killed one's last line is still there.
        let lastLine = (try? String(contentsOfFile: log, encoding: .utf8))?.split(separator: "\n").last.map(String.init) ?? "(none)"
        kill(daemon.pid, SIGKILL)
        for _ in 0..<6000 where kill(daemon.pid, 0) == 0 { usleep(10_000) }
        daemon = try Self.startDaemon(sandbox, extra: ["--config", config])
        let current = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        #expect(current.contains("state directory locked"), "the restarted daemon does not log to cofferd.log: \(current)")
        let kept = [log + ".1", log].compactMap { try? String(contentsOfFile: $0, encoding: .utf8) }.joined()
        #expect(kept.contains(lastLine + "\n"), "the killed daemon's last line is gone")
        #expect(!FileManager.default.fileExists(atPath: log + ".3"))
    }

    @Test func aDaemonThatCannotStartFailsTheCommand() throws {
        let sandbox = try AgentProcess(start: false)
        var args = sandbox.agentArguments
        // The socket's directory cannot be created: the daemon fails after the fork.
        if let i = args.firstIndex(of: "--socket") { args[i + 1] = "/proc/self/coffer-\(getpid())/agent.sock" }
        #expect(try Self.runCofferd(args) != 0)
    }

    /// A daemon that fails after the fork (its stderr is then its log) still tells the terminal why:
    /// the reason travels up the readiness pipe and the command prints it (issue #43).
    @Test func aDaemonsReasonForNotStartingReachesTheTerminal() throws {
        let running = try AgentProcess()
        let other = try AgentProcess(start: false)
        var args = other.agentArguments
        // Another agent serves the socket: refused after the fork, when the daemon binds it.
        if let i = args.firstIndex(of: "--socket") { args[i + 1] = running.socketPath }
        args += ["--ssh-agent-socket", "none"]
        let env = ProcessInfo.processInfo.environment.map { "\($0.key)=\($0.value)" }
        let out = try Subprocess.run(executable: Binaries.cofferd, arguments: args, environment: env)
        #expect(out.status == 1 && out.text.contains("cofferd: ") && out.text.contains("another agent is listening on \(running.socketPath)"),
                "\(out.status): \(out.text)")
    }
}
