import CofferKeybag
import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// One agent per state directory (issue 23): the lock file, the refusal of a second agent and of
/// offline programs, its release when the agent dies, and an agent that notices a keybag rewritten
/// under it.
@Suite struct StateLockTests {
    /// A second `cofferd` on the state directory another agent serves, with its own socket: the
    /// arguments of `agent` with `--socket` replaced.
    static func secondAgentArguments(_ agent: AgentProcess, socket: String) -> [String] {
        var args = agent.agentArguments
        if let i = args.firstIndex(of: "--socket") { args[i + 1] = socket }
        return args
    }

    /// The sequence that lost an acknowledged write: a second agent beside the first, keys rotated by
    /// the first. The second is refused at once, naming the first; nothing the first holds is lost.
    @Test func aSecondAgentOnTheSameStateDirectoryIsRefused() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        #expect(agent.cli(["add", "--service", "mail", "--account", "alice", "--secret-stdin"], stdin: "one").status == 0)

        // In the foreground: refused before it reads anything, with the holder's pid and socket.
        let other = agent.dir.file("run/other.sock")
        let r = runCLI(["--foreground"] + Self.secondAgentArguments(agent, socket: other), executable: Binaries.cofferd, timeout: 60)
        #expect(r.status == 69, "\(r)")
        #expect(r.stderr.contains("another Coffer agent already uses this state directory"), "\(r)")
        #expect(r.stderr.contains("pid \(agent.pid)") && r.stderr.contains("socket \(agent.socketPath)"), "\(r)")
        #expect(!FileManager.default.fileExists(atPath: other), "the refused agent never listened")

        // Daemonising: the command fails (the refusal comes before the fork), and no daemon serves.
        let daemonStatus = try DaemonTests.runCofferd(Self.secondAgentArguments(agent, socket: other))
        if daemonStatus == 0, let fd = try? UnixSocket.connect(path: other) {
            // Old behaviour: a second agent runs. Stop it so it does not outlive the test.
            if let peer = try? PeerIdentity.of(socket: fd) { kill(peer.pid, SIGTERM) }
            close(fd)
        }
        #expect(daemonStatus != 0)
        #expect(!FileManager.default.fileExists(atPath: other))

        // The first agent rotates the keys (a passcode change), acknowledges a write, locks and unlocks:
        // everything is there, and a plain listing works.
        #expect(agent.cli(["passcode", "change", "--passcode-stdin"], stdin: "\(AgentProcess.password)\n\(AgentProcess.password)\n").status == 0)
        #expect(agent.cli(["add", "--service", "mail", "--account", "bob", "--secret-stdin"], stdin: "two").status == 0)
        #expect(agent.cli(["lock"]).status == 0)
        #expect(agent.cli(["unlock", "--passcode-stdin"], stdin: AgentProcess.password).status == 0)
        #expect(agent.cli(["get", "--service", "mail", "--account", "alice"]).stdout == "one")
        #expect(agent.cli(["get", "--service", "mail", "--account", "bob"]).stdout == "two")
        let find = agent.cli(["find"])
        #expect(find.status == 0 && find.stdout.contains("alice") && find.stdout.contains("bob"), "\(find)")
    }

    /// Every other program takes the same lock: while the agent runs it is refused, naming the agent.
    @Test func anOfflineProgramIsRefusedWhileTheAgentRuns() throws {
        let agent = try AgentProcess()
        do {
            _ = try StateDirectoryLock.acquire(directory: agent.stateDir, socket: nil)
            Issue.record("the lock was taken beside a running agent")
        } catch {
            guard case .held(_, let holder) = error else { Issue.record("\(error)"); return }
            #expect(holder.pid == agent.pid && holder.socket == agent.socketPath, "\(holder)")
        }
        #expect(StateDirectoryLock.currentHolder(of: agent.stateDir)?.pid == agent.pid)
        agent.stop()
        // Stopped: free again (and the lock is this process's while it holds it).
        let lock = try StateDirectoryLock.acquire(directory: agent.stateDir, socket: nil)
        #expect(lock.path == agent.stateDir + "/" + StateDirectoryLock.fileName)
        #expect(StateDirectoryLock.currentHolder(of: agent.stateDir)?.pid == getpid())
    }

    /// The kernel releases the lock when the agent dies, `kill -9` included: a new agent starts and
    /// holds it in turn (a third is refused, naming the new one).
    @Test func killingTheAgentReleasesTheLock() throws {
        let agent = try AgentProcess()
        let first = agent.pid
        agent.kill9()
        try agent.start()
        #expect(agent.pid != first)
        #expect(StateDirectoryLock.currentHolder(of: agent.stateDir)?.pid == agent.pid)
        let r = runCLI(["--foreground"] + Self.secondAgentArguments(agent, socket: agent.dir.file("run/third.sock")),
                       executable: Binaries.cofferd, timeout: 60)
        #expect(r.status == 69 && r.stderr.contains("pid \(agent.pid)"), "\(r)")
    }

    /// A daemonising agent takes the lock before the fork and keeps it in the daemon: the parent's exit
    /// does not release it, and the file names the daemon.
    @Test func theDaemonHoldsTheLockAfterItsParentExits() throws {
        let sandbox = try AgentProcess(start: false)
        #expect(try DaemonTests.runCofferd(sandbox.agentArguments) == 0)
        let fd = try UnixSocket.connect(path: sandbox.socketPath)
        let daemon = try PeerIdentity.of(socket: fd)
        close(fd)
        defer {
            kill(daemon.pid, SIGTERM)
            for _ in 0..<6000 where kill(daemon.pid, 0) == 0 { usleep(10_000) }   // up to 60 s (a loaded machine)
        }
        let holder = StateDirectoryLock.currentHolder(of: sandbox.stateDir)
        #expect(holder?.pid == daemon.pid && holder?.socket == sandbox.socketPath, "\(String(describing: holder))")
        let r = runCLI(["--foreground"] + Self.secondAgentArguments(sandbox, socket: sandbox.dir.file("run/other.sock")),
                       executable: Binaries.cofferd, timeout: 60)
        #expect(r.status == 69 && r.stderr.contains("pid \(daemon.pid)"), "\(r)")
    }

    /// A keybag rewritten under a running agent (here by a process that ignored the lock and changed
    /// the passcode, rotating the keys): the agent refuses to write, with a clear error, instead of
    /// sealing under keys no keybag file holds any more.
    @Test func aKeybagChangedUnderTheAgentRefusesWrites() throws {
        let agent = try AgentProcess()
        agent.setPasscode()
        #expect(agent.cli(["add", "--service", "mail", "--account", "alice", "--secret-stdin"], stdin: "one").status == 0)

        let bag = try Keybag.openOrCreate(directory: agent.stateDir, deviceKey: FileDeviceKey(path: agent.stateDir + "/device.key"))
        try bag.setPasscode(current: secret(AgentProcess.password), new: secret("another passcode"), kdf: testKDF)

        let r = agent.cli(["add", "--service", "mail", "--account", "bob", "--secret-stdin"], stdin: "two")
        #expect(r.status == 7 && r.stderr.contains("errSecNotAvailable (-25291)"), "\(r)")
        #expect(r.stderr.contains("changed under this agent"), "\(r)")
        #expect(agent.cli(["delete", "--service", "mail", "--account", "alice"]).status == 7)
        #expect(agent.cli(["passcode", "change", "--passcode-stdin"], stdin: "\(AgentProcess.password)\n\(AgentProcess.password)\n").status == 7)
        // An escrow record holds the class keys: one made of keys rotated elsewhere would open nothing.
        let escrow = agent.cli(["escrow", "create", "--auth-passcode-fd", "0"], stdin: AgentProcess.password)
        #expect(escrow.status == 7 && escrow.stderr.contains("changed under this agent") && escrow.stdout.isEmpty, "\(escrow)")
        #expect(agent.log.contains("changed under this agent"), "the refusal is logged")
    }
}
