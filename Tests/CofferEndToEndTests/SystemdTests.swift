import CofferClient
import CofferModel
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
