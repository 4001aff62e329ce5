import CofferClient
import CofferSystem
import Foundation
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
        let script = """
            import os, socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o600); s.listen(16)
            os.dup2(s.fileno(), 3); os.set_inheritable(3, True)
            os.environ["LISTEN_PID"] = str(os.getpid()); os.environ["LISTEN_FDS"] = "1"
            os.environ["NOTIFY_SOCKET"] = sys.argv[2]
            os.execv(sys.argv[3], sys.argv[3:])
            """
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = ["python3", "-c", script, agent.socketPath, notifyPath, Binaries.cofferd,
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
        #expect(try c.status().lockState == 2)
        p.terminate()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)
        let stopping = recv(nfd, &buf, buf.count, 0)
        #expect(stopping > 0 && String(decoding: buf[0..<stopping], as: UTF8.self).contains("STOPPING=1"))
    }
}
