@testable import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// The waits and flags the agent's and the client's loops use instead of raw `poll` and `fcntl`:
/// an interrupted wait returns (the caller re-checks its deadline), an interrupted `fcntl` is retried.
@Suite struct PollTests {
    /// A fresh name for errno injection, so tests running in parallel never trip each other's faults.
    static func uniqueName() -> String { "poll-test-\(UUID().uuidString)" }

    @Test func interruptibleReturnsNilOnEINTRWithoutRetrying() throws {
        var calls = 0
        let interrupted = try Syscall.interruptible("probe", "z") { () -> Int32 in calls += 1; errno = EINTR; return -1 }
        #expect(interrupted == nil && calls == 1, "an interrupted call goes back to its caller, not round again")
        #expect(try Syscall.interruptible("probe", "z") { () -> Int32 in 7 } == 7)
        #expect(throws: SystemError("probe", "z", errno: EBADF)) {
            try Syscall.interruptible("probe", "z") { () -> Int32 in errno = EBADF; return -1 }
        }
    }

    @Test func readableSaysWhichDescriptorsHaveData() throws {
        let a = try DescriptorPair.pipe(), b = try DescriptorPair.pipe()
        #expect(try Poll.readable([a.first.rawValue, b.first.rawValue, -1], timeoutMillis: 0) == [false, false, false])
        try [UInt8(1)].withUnsafeBytes { try b.second.writeAll($0) }
        #expect(try Poll.readable([a.first.rawValue, b.first.rawValue, -1], timeoutMillis: 60_000) == [false, true, false],
                "data in the second pipe wakes the wait at once; a negative descriptor is never ready")
        // A real failure is thrown: more descriptors than RLIMIT_NOFILE allows is EINVAL.
        var limit = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < 1 << 22 {
            #expect(throws: SystemError("poll", "descriptors", errno: EINVAL)) {
                try Poll.readable([Int32](repeating: a.first.rawValue, count: Int(limit.rlim_cur) + 1), timeoutMillis: 0)
            }
        }
    }

    @Test(.enabled(if: SyscallFaultsAvailable.value, "errno injection exists only in debug builds"))
    func anInterruptedWaitReturnsWithNothingReady() throws {
        #if DEBUG
        let p = try DescriptorPair.pipe()
        try [UInt8(1)].withUnsafeBytes { try p.second.writeAll($0) }
        let what = Self.uniqueName()
        SyscallFaults.inject("poll", path: what, errno: EINTR)
        defer { SyscallFaults.clear(path: what) }
        #expect(try Poll.readable([p.first.rawValue], timeoutMillis: 60_000, what: what) == [false],
                "EINTR returns early so the caller can check its deadline and stop flag")
        #expect(!SyscallFaults.isArmed("poll", path: what))
        #expect(try Poll.readable([p.first.rawValue], timeoutMillis: 60_000, what: what) == [true])
        SyscallFaults.inject("poll", path: what, errno: ENOMEM)
        #expect(throws: SystemError("poll", what, errno: ENOMEM)) { try Poll.readable([p.first.rawValue], timeoutMillis: 0, what: what) }
        #endif
    }

    @Test func setNonBlockingSetsAndClearsTheFlag() throws {
        let p = try DescriptorPair.pipe()
        let name = Self.uniqueName()
        try p.first.setNonBlocking(true, path: name)
        #expect(fcntl(p.first.rawValue, F_GETFL) & O_NONBLOCK != 0)
        var byte: UInt8 = 0
        #expect(throws: SystemError("read", name, errno: EAGAIN), "an empty non-blocking pipe does not wait") {
            try withUnsafeMutableBytes(of: &byte) { try p.first.read(into: $0, path: name) }
        }
        try p.first.setNonBlocking(false, path: name)
        #expect(fcntl(p.first.rawValue, F_GETFL) & O_NONBLOCK == 0)
        // Released ends stay open, for an owner that keeps plain numbers (the biometric wake pipe).
        let (read, write) = p.release()
        #expect(fcntl(read, F_GETFD) != -1 && fcntl(write, F_GETFD) != -1)
        close(read)
        close(write)
    }

    @Test(.enabled(if: SyscallFaultsAvailable.value, "errno injection exists only in debug builds"))
    func setNonBlockingRetriesEINTRAndReportsOtherFailures() throws {
        #if DEBUG
        let p = try DescriptorPair.pipe()
        let name = Self.uniqueName()
        defer { SyscallFaults.clear(path: name) }
        SyscallFaults.inject("fcntl", path: name, errno: EINTR, onCall: 2)
        try p.first.setNonBlocking(true, path: name)
        #expect(fcntl(p.first.rawValue, F_GETFL) & O_NONBLOCK != 0, "the interrupted F_SETFL was made again")
        SyscallFaults.inject("fcntl", path: name, errno: EBADF)
        #expect(throws: SystemError("fcntl", name, errno: EBADF)) { try p.first.setNonBlocking(false, path: name) }
        #expect(fcntl(p.first.rawValue, F_GETFL) & O_NONBLOCK != 0, "nothing was changed")
        #endif
    }
}
