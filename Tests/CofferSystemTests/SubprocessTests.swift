@testable import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// `Subprocess.spawn` with real children (the plugin host's launcher).
@Suite struct SubprocessTests {
    /// Sends `text`, half-closes, and reads everything the child sends back until it closes.
    static func exchange(_ fd: Int32, _ text: String) -> String {
        _ = Array(text.utf8).withUnsafeBytes { UnixSocket.writeAll(fd, $0) }
        shutdown(fd, Int32(SHUT_WR))
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 256)
        while true {
            let r = chunk.withUnsafeMutableBytes { UnixSocket.receive(fd, into: $0, dontWait: false) }
            guard case .bytes(let n) = r else { break }
            out += chunk[0..<n]
        }
        return String(decoding: out, as: UTF8.self)
    }

    @Test func catEchoesOverTheSocketOnStdinAndStdout() throws {
        let child = try Subprocess.spawn(executable: "/bin/cat", socketAt: [0, 1])
        #expect(Self.exchange(child.socket.rawValue, "ping\nsecond line\n") == "ping\nsecond line\n")
        #expect(try child.wait() == 0)
    }

    @Test func theSocketOnFd3() throws {
        let child = try Subprocess.spawn(executable: "/bin/sh", arguments: ["-c", "cat <&3 >&3"])
        #expect(Self.exchange(child.socket.rawValue, "over fd 3") == "over fd 3")
        #expect(try child.wait() == 0)
    }

    @Test func theChildSeesOnlyItsStandardStreamsAndTheSocket() throws {
        // A descriptor this process opened WITHOUT close-on-exec: exec alone would hand it over. It is
        // moved to 10 or above (F_DUPFD, which leaves close-on-exec off): the lowest free number can be
        // 3 while the suite's other tests close theirs, and the child's fd 3 is the socket, where a
        // leak could not be told apart.
        let opened = open("/dev/null", O_RDONLY)
        #expect(opened >= 0)
        let leaky = fcntl(opened, F_DUPFD, 10)
        close(opened)
        #expect(leaky >= 10 && fcntl(leaky, F_GETFD) & FD_CLOEXEC == 0)
        defer { close(leaky) }
        let child = try Subprocess.spawn(executable: "/bin/sleep", arguments: ["30"])
        defer { kill(child.pid, SIGKILL); _ = try? child.wait() }
        // Wait until the exec happened (the child runs sleep), then list its descriptors.
        var fds: [String] = []
        for _ in 0..<400 {
            if ThisProcess.executablePath(pid: child.pid)?.hasSuffix("sleep") == true,
               let listed = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(child.pid)/fd") {
                fds = listed.sorted()
                if fds == ["0", "1", "2", "3"] { break }
            }
            Threads.sleep(seconds: 0.005)
        }
        #expect(fds == ["0", "1", "2", "3"])
        // fd 3 is a socket (the child's end of the pair).
        let target = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(child.pid)/fd/3")
        #expect(target.hasPrefix("socket:"))
    }

    @Test func theChildStartsWithNoBlockedSignals() throws {
        // The agent blocks SIGTERM etc. in every thread; a child must not inherit that mask.
        var set = sigset_t(), old = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        pthread_sigmask(SIG_BLOCK, &set, &old)
        defer { pthread_sigmask(SIG_SETMASK, &old, nil) }
        let child = try Subprocess.spawn(executable: "/bin/sh", arguments: ["-c", "grep ^SigBlk /proc/self/status >&3"])
        let line = Self.exchange(child.socket.rawValue, "")
        #expect(try child.wait() == 0)
        #expect(line.trimmingCharacters(in: .whitespacesAndNewlines).hasSuffix("0000000000000000"), "\(line)")
    }

    @Test func aMissingExecutableFailsInTheParentWithItsErrno() {
        #expect(throws: SystemError("spawn", "/nonexistent/coffer-plugin", errno: ENOENT)) {
            _ = try Subprocess.spawn(executable: "/nonexistent/coffer-plugin")
        }
    }

    @Test func theChildIsKilledWhenTheSpawningThreadGoesAway() throws {
        // PR_SET_PDEATHSIG fires when the thread that forked exits: spawn from a short-lived thread.
        final class Box: @unchecked Sendable { var pid: Int32 = 0; var socket: Int32 = -1; var failed: SystemError?; let done = DispatchSemaphore(value: 0) }
        let box = Box()
        #expect(Threads.detach {
            do throws(SystemError) {
                let child = try Subprocess.spawn(executable: "/bin/sleep", arguments: ["30"])
                box.pid = child.pid
                box.socket = child.takeSocket().release()
            } catch { box.failed = error }
            box.done.signal()
        })
        box.done.wait()
        #expect(box.failed == nil)
        defer { close(box.socket) }
        var status: Int32 = 0
        let started = nowMillis()
        #expect(waitpid(box.pid, &status, 0) == box.pid)
        #expect(status & 0x7f == SIGKILL, "the child outlived its parent thread (status \(status))")
        #expect(nowMillis() - started < 10_000)
    }
}
