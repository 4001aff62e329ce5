@testable import CofferSystem
import CofferTestSupport
import Glibc
import Testing

@Suite struct SyscallTests {
    @Test func retriesEINTRAndCapturesErrno() throws {
        var calls = 0
        let value = try Syscall.retrying("probe", "x") { () -> Int32 in
            calls += 1
            if calls < 3 { errno = EINTR; return -1 }
            return 42
        }
        #expect(value == 42 && calls == 3)
        #expect(throws: SystemError("probe", "x", errno: ENOENT)) {
            try Syscall.retrying("probe", "x") { () -> Int32 in
                errno = ENOENT
                return -1
            }
        }
    }

    @Test func errorNumberCallsAreChecked() throws {
        var calls = 0
        try Syscall.returningErrorNumber("probe", "y") { calls += 1; return calls < 2 ? EINTR : 0 }
        #expect(calls == 2)
        #expect(throws: SystemError("probe", "y", errno: EAGAIN)) { try Syscall.returningErrorNumber("probe", "y") { EAGAIN } }
    }

    @Test func readAllReadsAPipeToItsEnd() throws {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        let chunks = ["abc", "defg", "h"]
        let writer = fds[1]
        let done = Threads.detach {
            for c in chunks {
                _ = Array(c.utf8).withUnsafeBytes { write(writer, $0.baseAddress!, $0.count) }
                Threads.sleep(seconds: 0.01)
            }
            close(writer)
        }
        #expect(done)
        var buffer = [UInt8](repeating: 0, count: 64)
        let n = try buffer.withUnsafeMutableBytes { try Files.readAll(fd: fds[0], into: $0) }
        close(fds[0])
        #expect(String(decoding: buffer[0..<n], as: UTF8.self) == "abcdefgh")
    }

    @Test func readAllReportsAReadError() {
        var buffer = [UInt8](repeating: 0, count: 8)
        #expect(throws: SystemError("read", "fd -1", errno: EBADF)) {
            try buffer.withUnsafeMutableBytes { try Files.readAll(fd: -1, into: $0) }
        }
    }
}

@Suite struct FileDescriptorTests {
    let dir = TemporaryDirectory("coffer-system")

    /// Whether descriptor number `fd` is open on the file at `path`. The number alone cannot tell:
    /// once closed, another test thread may open something that gets the same number (a CI run
    /// under ASan saw it), but never this test's own file.
    static func isOpen(_ fd: Int32, on path: String) -> Bool {
        var open = stat(), file = stat()
        guard fstat(fd, &open) == 0, stat(path, &file) == 0 else { return false }
        return open.st_dev == file.st_dev && open.st_ino == file.st_ino
    }

    @Test func closeClosesOnceAndDeinitClosesAnUnclosedOne() throws {
        let path = dir.file("f")
        writeFileBytes(path, [1, 2, 3])
        let fd = try FileDescriptor.open(path, O_RDONLY)
        let raw = fd.rawValue
        #expect(Self.isOpen(raw, on: path))
        #expect(fcntl(raw, F_GETFD) & FD_CLOEXEC != 0, "every descriptor CofferSystem opens is close-on-exec")
        try fd.close()
        #expect(!Self.isOpen(raw, on: path))
        // (A second `fd.close()` or any use of `fd` here does not compile: it was consumed.)

        var leaked: Int32 = -1
        do {
            let other = try FileDescriptor.open(path, O_RDONLY)
            leaked = other.rawValue
            #expect(Self.isOpen(leaked, on: path))
        }
        #expect(!Self.isOpen(leaked, on: path), "a descriptor whose owner went away must be closed by deinit")
    }

    @Test func releaseHandsOverWithoutClosing() throws {
        let path = dir.file("g")
        writeFileBytes(path, [1])
        let raw = try FileDescriptor.open(path, O_RDONLY).release()
        #expect(Self.isOpen(raw, on: path))
        close(raw)
    }

    @Test func openFailureCarriesErrnoAndPath() {
        let path = dir.file("missing")
        #expect(throws: SystemError("open", path, errno: ENOENT)) { _ = try FileDescriptor.open(path, O_RDONLY) }
    }
}

@Suite struct ThisProcessTests {
    @Test func executablePathIsProcSelfExe() throws {
        var buf = [CChar](repeating: 0, count: 4097)
        let n = readlink("/proc/self/exe", &buf, 4096)
        #expect(n > 0)
        let expected = String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        #expect(ThisProcess.executablePath() == expected)
        #expect(ThisProcess.executablePath(pid: getpid()) == expected)
        #expect(PeerIdentity.executablePath(pid: getpid()) == expected)
        #expect(ThisProcess.executablePath(pid: -5) == nil)
    }

    @Test func environmentReadsOnlyTheNamesAsked() {
        setenv("COFFER_TEST_ENV_PROBE", "v", 1)
        defer { unsetenv("COFFER_TEST_ENV_PROBE") }
        #expect(ThisProcess.environment(["COFFER_TEST_ENV_PROBE", "COFFER_TEST_ENV_UNSET"]) == ["COFFER_TEST_ENV_PROBE": "v"])
    }
}
