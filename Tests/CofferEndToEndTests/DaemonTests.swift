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
    static func startDaemon(_ sandbox: AgentProcess) throws -> PeerIdentity {
        #expect(try runCofferd(sandbox.agentArguments) == 0)
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

    @Test func aDaemonThatCannotStartFailsTheCommand() throws {
        let sandbox = try AgentProcess(start: false)
        var args = sandbox.agentArguments
        // The socket's directory cannot be created: the daemon fails after the fork.
        if let i = args.firstIndex(of: "--socket") { args[i + 1] = "/proc/self/coffer-\(getpid())/agent.sock" }
        #expect(try Self.runCofferd(args) != 0)
    }
}
