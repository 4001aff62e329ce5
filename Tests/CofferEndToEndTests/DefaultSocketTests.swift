import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// The default socket path is worked out once (`AgentPaths.defaultSocket`), so the agent and every
/// client agree on it, also where `XDG_RUNTIME_DIR` is unset (cron, sudo, a system service).
@Suite struct AgentPathsTests {
    @Test func explicitThenCofferSocketThenXDGThenRunUser() {
        let all = ["COFFER_SOCKET": "/s/agent.sock", "XDG_RUNTIME_DIR": "/run/user/1000"]
        #expect(AgentPaths.defaultSocket(explicit: "/x.sock", environment: all, uid: 1000) == "/x.sock")
        #expect(AgentPaths.defaultSocket(environment: all, uid: 1000) == "/s/agent.sock")
        #expect(AgentPaths.defaultSocket(environment: ["XDG_RUNTIME_DIR": "/tmp/rt"], uid: 1000) == "/tmp/rt/coffer/agent.sock")
        #expect(AgentPaths.defaultSocket(environment: [:], uid: 1000) == "/run/user/1000/coffer/agent.sock")
        // Empty values count as unset, like pam_coffer's resolve_socket.
        #expect(AgentPaths.defaultSocket(explicit: "", environment: ["COFFER_SOCKET": "", "XDG_RUNTIME_DIR": ""], uid: 7)
                == "/run/user/7/coffer/agent.sock")
    }
}

/// `coffer` started without `XDG_RUNTIME_DIR` (as from cron or sudo) finds an agent that was also
/// started without it: both fall back to `/run/user/UID/coffer/agent.sock`. (Before, the client
/// gave up with "no agent socket" while the agent listened there.)
@Suite(.serialized) struct DefaultSocketTests {
    static let runtimeDirectory = "/run/user/\(getuid())"
    static let socket = runtimeDirectory + "/coffer/agent.sock"

    /// Runs only where it cannot disturb a real agent: no socket at the default path, and a runtime
    /// directory that is this user's or can be created.
    static let usable: Bool = {
        var st = stat()
        if lstat(socket, &st) == 0 { return false }
        if lstat(runtimeDirectory, &st) == 0 { return st.st_uid == geteuid() && (st.st_mode & S_IFMT) == S_IFDIR }
        return access("/run/user", W_OK) == 0
    }()

    /// The environment of a cron job: no XDG_RUNTIME_DIR, no COFFER_SOCKET.
    static var bareEnvironment: [String: String] {
        var env = ProcessInfo.processInfo.environment
        env.removeValue(forKey: "XDG_RUNTIME_DIR")
        env.removeValue(forKey: "COFFER_SOCKET")
        return env
    }

    static func run(_ executable: String, _ args: [String]) -> CLIResult {
        runProcess(executable, args, unset: ["XDG_RUNTIME_DIR"])
    }

    @Test(.enabled(if: usable, "\(socket) exists (a real agent may be serving it) or \(runtimeDirectory) cannot be created"))
    func clientAndAgentMeetAtRunUserWithoutXDGRuntimeDir() throws {
        // /run/user/UID is the machine's: WithoutSystemdTests checks that nothing makes it.
        try MachineWideLock.with("run-user") { try meetAtRunUser() }
    }

    func meetAtRunUser() throws {
        let fm = FileManager.default
        let createdRuntime = !fm.fileExists(atPath: Self.runtimeDirectory)
        if createdRuntime { try Files.makePrivateDirectory(Self.runtimeDirectory) }
        let cofferDirectory = Self.runtimeDirectory + "/coffer"
        let createdCofferDirectory = !fm.fileExists(atPath: cofferDirectory)
        let sandbox = try AgentProcess(start: false)

        // cofferd without --socket and without XDG_RUNTIME_DIR: its default.
        var args = sandbox.agentArguments
        if let i = args.firstIndex(of: "--socket") { args.removeSubrange(i...(i + 1)) }
        let agent = Process()
        agent.executableURL = URL(fileURLWithPath: Binaries.cofferd)
        agent.arguments = ["--foreground"] + args
        agent.environment = Self.bareEnvironment
        let log = sandbox.dir.file("cofferd.log")
        _ = fm.createFile(atPath: log, contents: nil)
        agent.standardError = FileHandle(forWritingAtPath: log)
        agent.standardOutput = FileHandle.nullDevice
        try agent.run()
        defer {
            agent.terminate()
            agent.waitUntilExit()
            if createdCofferDirectory {
                unlink(Self.socket)
                rmdir(cofferDirectory)
            }
            if createdRuntime { rmdir(Self.runtimeDirectory) }
        }
        var listening = false
        for _ in 0..<1000 where agent.isRunning {
            if let fd = try? UnixSocket.connect(path: Self.socket) { close(fd); listening = true; break }
            usleep(10_000)
        }
        let agentLog = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        try #require(listening, "cofferd did not listen at \(Self.socket):\n\(agentLog)")

        // The full parser (coffer → coffer-cli) and the fast path (coffer get) both find it.
        let status = Self.run(Binaries.coffer, ["status"])
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.stdout.contains("state:"))
        let get = Self.run(Binaries.coffer, ["get", "--service", "cron-job", "--account", "nobody"])
        #expect(get.status == SecStatus.itemNotFound.exitCode || get.status == SecStatus.interactionNotAllowed.exitCode,
                "the fast path did not reach the agent: \(get.stderr)")
        #expect(!get.stderr.contains("no agent socket"))
    }
}
