import CofferClient
import CofferCrypto
import CofferModel
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Who may serve the socket and own the directories: clients talk only to a server of their own
/// uid, and the agent starts only in directories that are the user's own and private.
@Suite struct SocketTrustTests {
    static let isRoot = getuid() == 0

    /// `mode` as four octal digits, as the agent's messages print it.
    static func octal(_ mode: mode_t) -> String {
        let digits = String(mode, radix: 8)
        return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
    }

    /// A throwaway user (useradd) for as long as the value lives.
    struct SetupError: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }

    /// A process of another uid serving a Unix socket like an agent would: it answers the first
    /// bytes of each connection with a HELLO reply (so a client that does not check who serves
    /// goes on to send its request) and records how many connections it took and every byte it got.
    final class ForeignListener {
        let tmp = TemporaryDirectory("coffer-trust")
        let user: ThrowawayUser
        var den: String { tmp.file("den") }
        var socket: String { den + "/agent.sock" }
        var received: String { den + "/received" }
        var accepted: String { den + "/accepted" }
        private let process = Process()

        init(user: ThrowawayUser) throws {
            self.user = user
            // The other uid runs the helper from here: a 0711 directory under /tmp, never the checkout.
            chmod(tmp.path, 0o711)
            try FileManager.default.createDirectory(atPath: den, withIntermediateDirectories: true)
            chmod(den, 0o777)
            let program = try compileC("""
                #include <stdio.h>
                #include <string.h>
                #include <sys/socket.h>
                #include <sys/time.h>
                #include <sys/un.h>
                #include <unistd.h>
                int main(int argc, char **argv) {
                    if (argc != 4) return 2;
                    int s = socket(AF_UNIX, SOCK_STREAM, 0);
                    struct sockaddr_un a = { .sun_family = AF_UNIX };
                    strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
                    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 16) != 0) { perror("listener"); return 1; }
                    static const unsigned char hello[] = { 0, 0, 0, 14, 0x81, 0, 0, 0, 1, 0, 1, 0, 5, '0', '.', '1', '.', '0' };
                    for (;;) {
                        int c = accept(s, NULL, NULL);
                        if (c < 0) continue;
                        struct timeval tv = { 2, 0 };
                        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                        FILE *r = fopen(argv[2], "ab");
                        unsigned char buf[4096]; ssize_t n; int first = 1;
                        while ((n = recv(c, buf, sizeof buf, 0)) > 0) {
                            if (first) { (void)!write(c, hello, sizeof hello); first = 0; }
                            if (r) fwrite(buf, 1, (size_t)n, r);
                        }
                        if (r) fclose(r);
                        close(c);
                        FILE *f = fopen(argv[3], "a"); if (f) { fputs("accepted\\n", f); fclose(f); }
                    }
                }

                """, named: "listener", in: tmp.path)
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = ["--reuid=\(user.name)", "--regid=nogroup", "--clear-groups", program, socket, received, accepted]
            process.standardError = FileHandle.nullDevice
            try process.run()
            let deadline = Date().addingTimeInterval(10)
            while !Files.exists(socket) && Date() < deadline { usleep(10_000) }
            guard Files.exists(socket) else { throw SetupError("the listener did not start") }
        }

        /// Connections the listener finished with.
        var connections: Int { String(decoding: fileBytes(accepted), as: UTF8.self).split(separator: "\n").count }

        /// Waits until the listener finished with `n` connections.
        func waitForConnections(_ n: Int, seconds: Double = 10) -> Bool {
            let deadline = Date().addingTimeInterval(seconds)
            while connections < n && Date() < deadline { usleep(20_000) }
            return connections >= n
        }

        deinit {
            // SIGKILL: the test runner's blocked signals are inherited, so SIGTERM may never arrive.
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    @Test(.enabled(if: SocketTrustTests.isRoot, "serving a socket as another user needs root"))
    func clientsSendNothingToASocketOfAnotherUID() throws {
        let user = try ThrowawayUser("l")
        let listener = try ForeignListener(user: user)
        let env = ["COFFER_SOCKET": listener.socket]
        let passcode = "passcode 5521", secretText = "secret 7730"
        var results: [(String, CLIResult)] = []
        results.append(("unlock", runCLI(["unlock", "--passcode-stdin"], stdin: passcode, environment: env)))
        results.append(("passcode set", runCLI(["passcode", "set", "--passcode-stdin"], stdin: passcode, environment: env)))
        results.append(("add (fast path)", runCLI(["add", "--service", "svc", "--account", "me", "--secret-stdin"],
                                                  stdin: secretText, environment: env)))
        results.append(("add (full CLI)", runCLI(["add", "--service", "svc", "--account", "me", "--label", "l", "--secret-stdin",
                                                 "--accessible", "ak"], stdin: secretText, environment: env)))
        results.append(("get", runCLI(["get", "--service", "svc", "--account", "me"], environment: env)))
        for (what, r) in results {
            #expect(r.status == SecStatus.io.exitCode, "\(what): \(r)")
            #expect(r.stderr.contains("served by uid \(user.uid), not by you") && r.stderr.contains("refusing to talk to it"),
                    "\(what): \(r.stderr)")
            #expect(!r.stdout.contains("0.1.0"), "\(what) printed what the impostor sent")
        }
        // The library, with and without a pipelined HELLO.
        for pipeline in [false, true] {
            do {
                let c = try AgentConnection(path: listener.socket, pipelineHello: pipeline)
                try c.unlock(passcode: secret(passcode))
                Issue.record("the library talked to another uid's socket (pipelineHello \(pipeline))")
            } catch {
                #expect(error.status == .io && error.message.contains("served by uid \(user.uid)"), "\(error)")
            }
        }
        do {
            _ = try Self.connectAsync(listener.socket)
            Issue.record("CofferClient talked to another uid's socket")
        } catch let e as SecError {
            #expect(e.status == .io, "\(e)")
        }
        // Every client reached the listener (so the check, not a failed connect, stopped them) and sent nothing.
        #expect(listener.waitForConnections(results.count + 3), "only \(listener.connections) connections reached the listener")
        let bytes = fileBytes(listener.received)
        #expect(bytes.isEmpty, "another uid's listener received \(bytes.count) bytes")
        #expect(!containsSubsequence(bytes, Array(passcode.utf8)) && !containsSubsequence(bytes, Array(secretText.utf8)))
    }

    /// CofferClient.connect from synchronous code.
    static func connectAsync(_ path: String) throws -> CofferClient {
        let result = Locked<Result<CofferClient, SecError>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task {
            let r: Result<CofferClient, SecError>
            do throws(SecError) { r = .success(try await CofferClient.connect(socket: path)) } catch { r = .failure(error) }
            result.mutate { $0 = r }
            done.signal()
        }
        done.wait()
        return try result.value!.get()
    }

    /// Runs `cofferd --foreground` with `arguments` and expects it to refuse to start.
    static func agentRefuses(_ arguments: [String], in dir: TemporaryDirectory) -> (status: Int32, stderr: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: Binaries.cofferd)
        p.arguments = ["--foreground", "--log-level", "debug", "--kdf-ops", "1"] + arguments
        let err = Pipe()
        p.standardError = err
        p.standardOutput = FileHandle.nullDevice
        p.standardInput = FileHandle.nullDevice
        do { try p.run() } catch { return (-1, "\(error)") }
        // An agent that (wrongly) starts would run forever: stop it after a while.
        let killer = DispatchWorkItem { kill(p.processIdentifier, SIGKILL) }
        DispatchQueue.global().asyncAfter(deadline: .now() + 8, execute: killer)
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        killer.cancel()
        return (p.terminationStatus, String(decoding: e, as: UTF8.self))
    }

    @Test func groupOrWorldWritableDirectoriesAreRefusedNotRepaired() throws {
        let dir = TemporaryDirectory("coffer-trust")
        for mode: mode_t in [0o770, 0o777, 0o702] {
            let run = dir.file("run-\(Self.octal(mode))"), state = dir.file("state-\(Self.octal(mode))")
            let goodRun = dir.file("good-run-\(Self.octal(mode))"), goodState = dir.file("good-state-\(Self.octal(mode))")
            for d in [run, state] {
                try FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: false)
                chmod(d, mode)
            }
            // The socket directory.
            var r = Self.agentRefuses(["--socket", run + "/agent.sock", "--state-dir", goodState], in: dir)
            #expect(r.status != 0 && r.stderr.contains("\(run) has mode \(Self.octal(mode)): group or others may write to it"), "\(r)")
            #expect(Files.mode(run) == mode, "the socket directory was chmod'ed")
            #expect(!Files.exists(run + "/agent.sock"))
            // The state directory.
            r = Self.agentRefuses(["--socket", goodRun + "/agent.sock", "--state-dir", state], in: dir)
            #expect(r.status != 0 && r.stderr.contains("\(state) has mode \(Self.octal(mode)): group or others may write to it"), "\(r)")
            #expect(Files.mode(state) == mode, "the state directory was chmod'ed")
            #expect(!Files.exists(state + "/keybag"))
        }
    }

    @Test func symbolicLinksInPlaceOfTheDirectoriesAreRefused() throws {
        let dir = TemporaryDirectory("coffer-trust")
        let real = dir.file("real")
        try FileManager.default.createDirectory(atPath: real, withIntermediateDirectories: false)
        chmod(real, 0o700)
        symlink(real, dir.file("run"))
        symlink(real, dir.file("state"))
        var r = Self.agentRefuses(["--socket", dir.file("run/agent.sock"), "--state-dir", dir.file("good-state")], in: dir)
        #expect(r.status != 0 && r.stderr.contains("\(dir.file("run")) is a symbolic link"), "\(r)")
        r = Self.agentRefuses(["--socket", dir.file("good-run/agent.sock"), "--state-dir", dir.file("state")], in: dir)
        #expect(r.status != 0 && r.stderr.contains("\(dir.file("state")) is a symbolic link"), "\(r)")
        #expect((try? FileManager.default.contentsOfDirectory(atPath: real)) == [], "the agent wrote through a symbolic link")
        // A directory that is only readable by others is ours to tighten (nothing can have been planted in it).
        let agent = try AgentProcess(start: false)
        let readable = Files.directoryName(agent.socketPath)
        try FileManager.default.createDirectory(atPath: readable, withIntermediateDirectories: true)
        chmod(readable, 0o755)
        try agent.start()
        #expect(Files.mode(readable) == 0o700)
        #expect(agent.stop() == 0)
    }

    @Test(.enabled(if: SocketTrustTests.isRoot, "giving a directory to another uid needs root"))
    func directoriesOfAnotherUIDAreRefused() throws {
        let dir = TemporaryDirectory("coffer-trust")
        let run = dir.file("run"), state = dir.file("state")
        for d in [run, state] {
            try FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: false)
            chmod(d, 0o700)
            chown(d, 54321, 54321)
        }
        var r = Self.agentRefuses(["--socket", run + "/agent.sock", "--state-dir", dir.file("good-state")], in: dir)
        #expect(r.status != 0 && r.stderr.contains("\(run) is owned by uid 54321, not by you"), "\(r)")
        r = Self.agentRefuses(["--socket", dir.file("good-run/agent.sock"), "--state-dir", state], in: dir)
        #expect(r.status != 0 && r.stderr.contains("\(state) is owned by uid 54321, not by you"), "\(r)")
    }

    /// Only root can put another uid's live socket in the user's own private directory; the agent
    /// says so and stops, rather than reporting "another agent is running" or replacing it.
    @Test(.enabled(if: SocketTrustTests.isRoot, "serving a socket as another user needs root"))
    func aLiveListenerOfAnotherUIDInThePrivateDirectoryIsRefused() throws {
        let user = try ThrowawayUser("m")
        let listener = try ForeignListener(user: user)
        let dir = TemporaryDirectory("coffer-trust")
        let run = dir.file("run")
        try FileManager.default.createDirectory(atPath: run, withIntermediateDirectories: false)
        chmod(run, 0o700)
        // A bound socket keeps working under a new name: move the other uid's socket into our private directory.
        #expect(rename(listener.socket, run + "/agent.sock") == 0)
        let r = Self.agentRefuses(["--socket", run + "/agent.sock", "--state-dir", dir.file("state")], in: dir)
        #expect(r.status != 0 && r.stderr.contains("is served by a process of uid \(user.uid), not by you"), "\(r)")
        #expect(!r.stderr.contains("another agent is listening"), "\(r)")
        #expect(Files.exists(run + "/agent.sock"))
        #expect(listener.waitForConnections(1), "the agent's probe never reached the listener")
        #expect(fileBytes(listener.received).isEmpty)
    }
}
