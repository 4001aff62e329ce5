import CofferAudit
import CofferModel
import CofferSystem
import CofferTestSupport
import CofferTrust
import Foundation
import Glibc
import Testing

/// Issue #25 (5): the trust store and the audit log make their system calls through CofferSystem
/// (`Syscall`, `FileDescriptor`), so an interrupted call is retried and a failing one reported, and
/// debug-only errno injection (`SyscallFaults`) reaches them.
@Suite(.serialized, .enabled(if: SyscallFaultsReachable.value, "errno injection exists only in debug builds"))
struct SystemCallTests {
    @Test func aManifestReadThatIsInterruptedIsRetried_oneThatFailsIsRefusedWithTheReason() throws {
        #if DEBUG
        let f = try TrustFixture()
        let exe = try f.executable("app-sys")
        try f.manifest("s", app: "com.example.s", exe: exe, groups: ["s"])
        let path = f.manifests + "/s.manifest"
        defer { SyscallFaults.clear(path: path) }

        SyscallFaults.inject("read", path: path, errno: EINTR)
        let retried = TrustStore(configuration: f.configuration).snapshot
        #expect(retried.refused.isEmpty, "\(retried.refused)")
        #expect(retried.manifests.count == 1)
        #expect(!SyscallFaults.isArmed("read", path: path), "the manifest's read went through Syscall")

        SyscallFaults.inject("read", path: path, errno: EIO)
        let failed = TrustStore(configuration: f.configuration).snapshot
        #expect(failed.refused == [RefusedFile(path: path, reason: "file cannot be read (errno \(EIO))")])
        #expect(failed.manifests.isEmpty)

        SyscallFaults.inject("openat", path: path, errno: EMFILE)
        let unopened = TrustStore(configuration: f.configuration).snapshot
        #expect(unopened.refused == [RefusedFile(path: path, reason: "file cannot be opened (errno \(EMFILE))")])
        #endif
    }

    @Test func anAuditWriteThatIsInterruptedIsRetried_oneThatFailsThrows() throws {
        #if DEBUG
        let dir = TemporaryDirectory()
        let log = AuditLog(directory: dir.path)
        defer { SyscallFaults.clear(path: log.path) }
        let record = AuditRecord(time: 1_763_928_609.123, pid: 1001, app: "com.example.app", executable: "/usr/bin/app",
                                 operation: "get", accessGroup: "g", itemClass: .genericPassword, result: 0)
        SyscallFaults.inject("write", path: log.path, errno: EINTR)
        try log.append(record)
        #expect(!SyscallFaults.isArmed("write", path: log.path), "the record's write went through Syscall")
        #expect(AuditReader.read(directory: dir.path).records == [record], "written once, whole")

        SyscallFaults.inject("write", path: log.path, errno: ENOSPC)
        #expect(throws: SystemError("write", log.path, errno: ENOSPC)) { try log.append(record) }
        #expect(AuditReader.read(directory: dir.path).records == [record], "nothing torn")
        #endif
    }
}

/// Whether this build has `SyscallFaults` (debug builds only).
enum SyscallFaultsReachable {
    #if DEBUG
    static let value = true
    #else
    static let value = false
    #endif
}
