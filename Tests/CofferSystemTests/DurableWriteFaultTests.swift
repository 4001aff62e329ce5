@testable import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// The failure paths of durable writes, reached with debug-only errno injection (`SyscallFaults`):
/// whatever step fails, the target keeps its old content and no temporary file is left behind.
@Suite(.enabled(if: SyscallFaultsAvailable.value, "errno injection exists only in debug builds"))
struct DurableWriteFaultTests {
    let dir = TemporaryDirectory("coffer-system")
    var target: String { dir.file("state") }
    var temp: String { target + ".tmp" }
    let old = Array("old content".utf8)
    let new = Array("new content, longer than the old".utf8)

    init() throws { try Files.writeAtomically(dir.file("state"), Array("old content".utf8)) }

    /// Runs a write with `operation` on `path` failing with `code`: it must throw that very error,
    /// and leave the old content and no temporary file.
    func expectFailure(_ operation: String, on path: String, errno code: Int32) throws {
        #if DEBUG
        SyscallFaults.inject(operation, path: path, errno: code)
        defer { SyscallFaults.clear(path: path) }
        do {
            try Files.writeAtomically(target, new)
            Issue.record("\(operation) failing with \(code) went unnoticed")
        } catch {
            #expect(error.operation == operation)
            #expect(error.errno == code)
            #expect(error.path == path)
        }
        #expect(!SyscallFaults.isArmed(operation, path: path), "the fault never fired: \(operation) is not behind Syscall")
        #expect(fileBytes(target) == old)
        #expect(!Files.exists(temp), "a temporary file was left behind")
        #endif
    }

    @Test func aFullDiskDuringWriteKeepsTheOldFile() throws {
        try expectFailure("write", on: temp, errno: ENOSPC)
    }

    @Test func anFsyncErrorKeepsTheOldFile() throws {
        try expectFailure("fsync", on: temp, errno: EIO)
    }

    @Test func aFailedCloseKeepsTheOldFile() throws {
        try expectFailure("close", on: temp, errno: EIO)
    }

    @Test func aFailedRenameKeepsTheOldFile() throws {
        try expectFailure("rename", on: target, errno: EXDEV)
    }

    @Test func aFailedOpenKeepsTheOldFile() throws {
        try expectFailure("open", on: temp, errno: EACCES)
    }

    @Test func anInterruptedWriteIsRetriedAndLands() throws {
        #if DEBUG
        SyscallFaults.inject("write", path: temp, errno: EINTR)
        defer { SyscallFaults.clear(path: temp) }
        try Files.writeAtomically(target, new)
        #expect(!SyscallFaults.isArmed("write", path: temp))
        #expect(fileBytes(target) == new)
        #expect(!Files.exists(temp))
        #endif
    }

    @Test func aFailedDirectorySyncIsReportedAfterTheRename() throws {
        #if DEBUG
        // The rename happened (the new content is in place); the error says it may not be durable.
        SyscallFaults.inject("fsync", path: dir.path, errno: EIO)
        defer { SyscallFaults.clear(path: dir.path) }
        #expect(throws: SystemError("fsync", dir.path, errno: EIO)) { try Files.writeAtomically(target, new) }
        #expect(fileBytes(target) == new)
        #expect(!Files.exists(temp))
        #endif
    }

    @Test func theNthCallFails() throws {
        #if DEBUG
        // A second fsync on the same path (the first succeeds): the fault waits for its turn.
        SyscallFaults.inject("fsync", path: temp, errno: EIO, onCall: 2)
        defer { SyscallFaults.clear(path: temp) }
        try Files.writeAtomically(target, new)
        #expect(fileBytes(target) == new)
        #expect(SyscallFaults.isArmed("fsync", path: temp))
        #expect(throws: SystemError("fsync", temp, errno: EIO)) { try Files.writeAtomically(target, old) }
        #expect(fileBytes(target) == new)
        #expect(!Files.exists(temp))
        #endif
    }
}

/// Writing into a place the user chose (`coffer inject --output`, a backup, a signed manifest):
/// a file of theirs named `PATH.tmp` is never touched, and nothing is left beside the target.
@Suite struct UniqueTemporaryWriteTests {
    let dir = TemporaryDirectory("coffer-system")

    @Test func leavesTheUsersTmpFileAlone() throws {
        let target = dir.file("config.yml")
        try Files.writeAtomically(target + ".tmp", Array("the user's own".utf8))
        try Files.writeAtomically(target, Array("first".utf8), mode: 0o640, temporary: .unique)
        try Files.writeAtomically(target, Array("second".utf8), mode: 0o640, temporary: .unique)
        // (Its mode is 0640 less the umask, which other suites change while this one runs.)
        #expect(fileBytes(target) == Array("second".utf8) && (Files.mode(target) ?? 0o777) & ~0o640 == 0)
        #expect(fileBytes(target + ".tmp") == Array("the user's own".utf8))
        let entries = try FileManager.default.contentsOfDirectory(atPath: dir.path)
        #expect(entries.sorted() == ["config.yml", "config.yml.tmp"], "\(entries)")
    }

    @Test func aFailedRenameLeavesNoTemporaryFile() throws {
        // The target is a directory: the rename fails, and the temporary file goes.
        let target = dir.file("out")
        #expect(mkdir(target, 0o700) == 0)
        #expect(throws: SystemError.self) { try Files.writeAtomically(target, Array("x".utf8), temporary: .unique) }
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path) == ["out"])
    }
}

/// Whether this build has `SyscallFaults` (debug builds only).
enum SyscallFaultsAvailable {
    #if DEBUG
    static let value = true
    #else
    static let value = false
    #endif
}

/// Creating a file only if it does not exist, fully written (the device key's path).
@Suite struct CreateExclusivelyTests {
    let dir = TemporaryDirectory("coffer-system")

    @Test func createsWithTheModeAndRefusesToReplace() throws {
        let path = dir.file("device.key")
        let key = [UInt8](repeating: 0xA5, count: 32)
        #expect(try key.withUnsafeBytes { try Files.createExclusively(path, bytes: $0, mode: 0o600) })
        #expect(Files.mode(path) == 0o600)
        #expect(fileBytes(path) == key)
        let other = [UInt8](repeating: 0x5A, count: 32)
        #expect(try !other.withUnsafeBytes { try Files.createExclusively(path, bytes: $0, mode: 0o600) })
        #expect(fileBytes(path) == key, "an existing file must never be replaced")
    }

    @Test func doesNotFollowASymbolicLink() throws {
        let path = dir.file("link")
        symlink(dir.file("elsewhere"), path)
        // O_EXCL: a (dangling) symbolic link counts as existing; nothing is written through it.
        #expect(try ![1, 2, 3].withUnsafeBytes { try Files.createExclusively(path, bytes: $0) })
        #expect(!Files.exists(dir.file("elsewhere")))
    }

    @Test(.enabled(if: SyscallFaultsAvailable.value, "errno injection exists only in debug builds"))
    func aFailedWriteLeavesNoHalfFile() throws {
        #if DEBUG
        let path = dir.file("device.key")
        SyscallFaults.inject("write", path: path, errno: ENOSPC)
        defer { SyscallFaults.clear(path: path) }
        #expect(throws: SystemError("write", path, errno: ENOSPC)) {
            try [UInt8](repeating: 1, count: 32).withUnsafeBytes { try Files.createExclusively(path, bytes: $0) }
        }
        #expect(!Files.exists(path), "a half-written key file would be read as the key next time")
        // An interrupted write is retried: the key lands in full.
        SyscallFaults.inject("write", path: path, errno: EINTR)
        #expect(try [UInt8](repeating: 2, count: 32).withUnsafeBytes { try Files.createExclusively(path, bytes: $0) })
        #expect(fileBytes(path) == [UInt8](repeating: 2, count: 32))
        #endif
    }
}
