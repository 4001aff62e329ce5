import CofferClient
import CofferModel
import CofferSSHAgentProtocol
import CofferSystem
import Foundation
import CofferTestSupport
import Testing

/// Socket activation (LISTEN_FDS) and readiness (NOTIFY_SOCKET) as systemd would do them.
@Suite struct SystemdTests {
    @Test func socketActivationAndReadinessNotification() throws {
        let agent = try AgentProcess(start: false)
        try FileManager.default.createDirectory(atPath: Files.directoryName(agent.socketPath), withIntermediateDirectories: true)
        // Receive sd_notify datagrams on a socket of our own.
        let notifyPath = agent.dir.file("notify.sock")
        let nfd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &addr.sun_path) { p in for (i, b) in notifyPath.utf8.enumerated() { p[i] = b } }
        let bound = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(nfd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        #expect(bound == 0)
        defer { close(nfd) }
        UnixSocket.setTimeouts(nfd, send: 5, receive: 10)

        // Like systemd: the listening socket is fd 3, LISTEN_PID is the agent's own pid.
        let launcher = try compileC("""
            #include <stdio.h>
            #include <stdlib.h>
            #include <string.h>
            #include <sys/socket.h>
            #include <sys/stat.h>
            #include <sys/un.h>
            #include <unistd.h>
            int main(int argc, char **argv) {
                if (argc < 4) return 2;
                int s = socket(AF_UNIX, SOCK_STREAM, 0);
                struct sockaddr_un a = { .sun_family = AF_UNIX };
                strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
                if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || chmod(argv[1], 0600) != 0
                    || listen(s, 16) != 0 || dup2(s, 3) != 3) { perror("launcher"); return 1; }
                if (s != 3) close(s);
                char pid[32];
                snprintf(pid, sizeof pid, "%d", (int)getpid());
                setenv("LISTEN_PID", pid, 1); setenv("LISTEN_FDS", "1", 1); setenv("NOTIFY_SOCKET", argv[2], 1);
                execv(argv[3], argv + 3);
                perror("launcher: exec"); return 1;
            }

            """, named: "launcher", in: agent.dir.path)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: launcher)
        p.arguments = [agent.socketPath, notifyPath, Binaries.cofferd,
                       "--state-dir", agent.stateDir, "--pam-confdir", agent.pamDir, "--log-level", "debug"]
        p.standardError = FileHandle(forWritingAtPath: "/dev/null")
        try p.run()
        defer { p.terminate(); p.waitUntilExit() }

        var buf = [UInt8](repeating: 0, count: 512)
        let n = recv(nfd, &buf, buf.count, 0)
        let message = n > 0 ? String(decoding: buf[0..<n], as: UTF8.self) : ""
        #expect(message.contains("READY=1"), "no readiness notification: '\(message)'")
        #expect(message.contains("MAINPID=\(p.processIdentifier)"))
        // The agent serves on the socket it was handed (it did not create one).
        let c = try AgentConnection(path: agent.socketPath)
        #expect(try c.status().lockState == .unlocked)
        // Its ssh-agent socket is beside the socket it was handed (not in the default runtime directory).
        #expect(FileManager.default.fileExists(atPath: Files.directoryName(agent.socketPath) + "/ssh-agent.sock"))
        p.terminate()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)
        let stopping = recv(nfd, &buf, buf.count, 0)
        #expect(stopping > 0 && String(decoding: buf[0..<stopping], as: UTF8.self).contains("STOPPING=1"))
    }
}

/// Both sockets as systemd passes them with coffer-agent.socket and coffer-ssh-agent.socket
/// (FileDescriptorName= agent and ssh-agent), through systemd's own `systemd-socket-activate`: it
/// listens on each and, at the first connection to any of them, execs cofferd with all of them
/// (LISTEN_FDS, and LISTEN_FDNAMES from --fdname).
@Suite(.enabled(if: SystemdTools.has(SystemdTools.socketActivate), "needs systemd's systemd-socket-activate in /usr/bin (apt: systemd)"))
struct SocketActivationTests {

    /// cofferd behind systemd-socket-activate, listening on `sockets` (path, fd name) in the agent's
    /// private runtime directory; nothing runs the agent until a first connection.
    final class Activated: @unchecked Sendable {
        let agent: AgentProcess
        let process = Process()
        let logPath: String
        var nativeSocket: String { agent.socketPath }
        var sshSocket: String { Files.directoryName(agent.socketPath) + "/ssh-agent.sock" }
        var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }
        /// Every socket systemd-socket-activate was told to make.
        private(set) var socketPaths: [String] = []

        init(names: [String], extraArguments: [String] = []) throws {
            agent = try AgentProcess(extraArguments: extraArguments, start: false)
            logPath = agent.dir.file("activated.log")
            try FileManager.default.createDirectory(atPath: Files.directoryName(agent.socketPath), withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            let paths = names.map { $0 == "ssh-agent" ? sshSocket : nativeSocket }
            socketPaths = paths
            _ = FileManager.default.createFile(atPath: logPath, contents: nil)
            // Through a launcher that stays its parent: systemd-socket-activate closes every descriptor
            // but the sockets before it execs, and Foundation's Process takes the closing of the one it
            // watches for the child's exit (then blocks in waitpid, and no other child's exit is seen).
            // The launcher unblocks the signals Foundation leaves blocked, forwards SIGTERM and exits
            // with the agent's status.
            let launcher = try compileC("""
                #include <errno.h>
                #include <signal.h>
                #include <sys/wait.h>
                #include <unistd.h>
                static volatile pid_t child;
                static void forward(int sig) { if (child > 0) kill(child, sig); }
                int main(int argc, char **argv) {
                    if (argc < 2) return 2;
                    sigset_t none;
                    sigemptyset(&none);
                    sigprocmask(SIG_SETMASK, &none, NULL);
                    signal(SIGTERM, forward);
                    child = fork();
                    if (child < 0) return 1;
                    if (child == 0) { signal(SIGTERM, SIG_DFL); execv(argv[1], argv + 1); _exit(127); }
                    int status;
                    while (waitpid(child, &status, 0) < 0) if (errno != EINTR) return 1;
                    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                }

                """, named: "launcher", in: agent.dir.path)
            process.executableURL = URL(fileURLWithPath: launcher)
            process.arguments = [SystemdTools.socketActivate] + paths.flatMap { ["-l", $0] }
                + ["--fdname=" + names.joined(separator: ":"), Binaries.cofferd, "--foreground"] + agent.agentArguments
            process.standardError = FileHandle(forWritingAtPath: logPath)
            process.standardOutput = FileHandle.nullDevice
            process.standardInput = FileHandle.nullDevice
            try process.run()
        }

        deinit {
            if process.isRunning { process.terminate(); process.waitUntilExit() }
        }

        /// Connects to `path` once systemd-socket-activate listens on every socket it was given (it binds
        /// them one after the other, and a connection to the first may come before the second exists, as a
        /// CI run showed): the first connection starts the agent, which must then answer it.
        func firstConnection(_ path: String) throws -> Int32 {
            let deadline = Date().addingTimeInterval(60)
            while Date() < deadline && process.isRunning {
                if socketPaths.allSatisfy({ inode($0) != nil }), let fd = try? UnixSocket.connect(path: path) {
                    UnixSocket.setTimeouts(fd, send: 120, receive: 120)
                    return fd
                }
                usleep(10_000)
            }
            throw AgentProcess.AgentStartError(log: "systemd-socket-activate never listened on \(path):\n\(log)")
        }

        /// True once the agent logged that it serves (generous: sanitizer builds start slowly).
        func ready() -> Bool {
            let deadline = Date().addingTimeInterval(120)
            while Date() < deadline && process.isRunning {
                if log.contains("agent ready") { return true }
                usleep(20_000)
            }
            return log.contains("agent ready")
        }

        /// The reply to REQUEST_IDENTITIES on `fd` (nil: none, e.g. nobody serves the socket).
        func identities(_ fd: Int32) -> SSHAgentReply? {
            SSHAgentTests.exchange(fd, SSHAgentTests.frame([SSHAgentMessageType.requestIdentities]))
        }

        /// `ssh-add -l` through the ssh-agent socket (skipped without OpenSSH's client tools).
        func expectSSHAddServed() {
            guard SSHTools.available else { return }
            let r = runCLI(["-l"], environment: ["SSH_AUTH_SOCK": sshSocket], executable: "/usr/bin/ssh-add", unset: ["SSH_AGENT_PID"], timeout: 120)
            #expect(r.status == 1 && r.stdout.contains("no identities"), "\(r)\n\(log)")
        }

        func inode(_ path: String) -> UInt64? {
            (try? FileManager.default.attributesOfItem(atPath: path))?[.systemFileNumber] as? UInt64
        }
    }

    /// Both sockets passed by name: the agent serves the ssh-agent protocol on systemd's socket (it
    /// makes none of its own), whichever socket is connected to first.
    @Test(arguments: ["ssh-agent", "agent"])
    func bothSocketsPassedByNameAndEitherOneStartsTheAgent(first: String) throws {
        let a = try Activated(names: ["agent", "ssh-agent"])
        let fd = try a.firstConnection(first == "ssh-agent" ? a.sshSocket : a.nativeSocket)
        defer { close(fd) }
        let passed = try #require(a.inode(a.sshSocket), "no ssh-agent socket from systemd-socket-activate: \(a.log)")
        #expect(a.ready(), "the agent did not start: \(a.log)")
        if first == "ssh-agent" {
            // The connection that started the agent is answered, on the socket it was made to.
            #expect(a.identities(fd) == .identities([]), "\(a.log)")
        } else {
            let ssh = try UnixSocket.connect(path: a.sshSocket)
            defer { close(ssh) }
            UnixSocket.setTimeouts(ssh, send: 120, receive: 120)
            #expect(a.identities(ssh) == .identities([]), "\(a.log)")
        }
        a.expectSSHAddServed()
        #expect(a.inode(a.sshSocket) == passed, "the agent replaced systemd's ssh-agent socket with its own")
        #expect(try AgentConnection(path: a.nativeSocket).status().lockState == .unlocked)
        #expect(a.log.contains("using the ssh-agent socket passed by systemd"), "\(a.log)")
        a.process.terminate()
        a.process.waitUntilExit()
        #expect(a.process.terminationStatus == 0, "\(a.log)")
        // systemd's socket files are systemd's: the agent leaves them in place.
        #expect(Files.exists(a.sshSocket))
    }

    /// Only the native socket passed (the ssh-agent socket unit not enabled): as before, the agent
    /// makes its ssh-agent socket beside it.
    @Test func onlyTheNativeSocketPassedTheAgentMakesItsSSHAgentSocketBesideIt() throws {
        let a = try Activated(names: ["agent"])
        let fd = try a.firstConnection(a.nativeSocket)
        defer { close(fd) }
        #expect(a.ready(), "the agent did not start: \(a.log)")
        let ssh = try UnixSocket.connect(path: a.sshSocket)
        defer { close(ssh) }
        UnixSocket.setTimeouts(ssh, send: 120, receive: 120)
        #expect(a.identities(ssh) == .identities([]), "\(a.log)")
        a.expectSSHAddServed()
        #expect(!a.log.contains("ssh-agent socket passed by systemd"), "\(a.log)")
    }

    /// `ssh-agent-socket = none` with the ssh-agent socket passed anyway: the agent does not serve it
    /// and says why (the native socket works).
    @Test func aPassedSSHAgentSocketTurnedOffInTheConfigurationIsClosedAndLogged() throws {
        let a = try Activated(names: ["agent", "ssh-agent"], extraArguments: ["--ssh-agent-socket", "none"])
        let fd = try a.firstConnection(a.nativeSocket)
        defer { close(fd) }
        #expect(a.ready(), "the agent did not start: \(a.log)")
        #expect(a.log.contains("closed the ssh-agent socket passed by systemd: ssh-agent-socket = none"), "\(a.log)")
        #expect(try AgentConnection(path: a.nativeSocket).status().lockState == .unlocked)
    }
}

/// systemd's own programs the tests run where they are installed.
enum SystemdTools {
    static let socketActivate = "/usr/bin/systemd-socket-activate"
    static let analyze = "/usr/bin/systemd-analyze"
    static let environmentGenerator = "/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator"
    static func has(_ path: String) -> Bool { FileManager.default.isExecutableFile(atPath: path) }
}
