import CofferTestSupport
import Foundation
import Security
import Testing

/// Data Protection for files through Apple's `FileProtectionType` (issue #45; Sources/Security/FileProtection.swift):
/// a directory's class set and read back, a file written into a complete-unless-open directory while the
/// keychain is locked and found there after the unlock, a Complete directory refusing it. On a real ext4 with
/// fscrypt on a loop device (root; skipped with what is missing otherwise). Part of AppleSecurityAPITests'
/// serialized suite: it locks the one agent those tests share.
extension AppleSecurityAPITests {
    @Test(.enabled(if: LoopFilesystem.unavailable == nil, "\(LoopFilesystem.unavailable ?? "")"))
    func directoriesTakeApplesFileProtectionTypes() throws {
        let fs = try LoopFilesystem(megabytes: 64, encrypt: true)
        let fm = FileManager.default
        let complete = fs.file("complete"), inbox = fs.file("inbox"), plain = fs.file("plain")
        for d in [complete, inbox, plain] { try fm.createDirectory(atPath: d, withIntermediateDirectories: false) }
        try "kept".write(toFile: inbox + "/old.txt", atomically: false, encoding: .utf8)

        try fm.setProtection(.complete, ofDirectoryAtPath: complete)
        try fm.setProtection(.completeUnlessOpen, ofDirectoryAtPath: inbox)
        #expect(try fm.protection(ofItemAtPath: complete)?.rawValue == FileProtectionType.complete.rawValue)
        #expect(try fm.protection(ofItemAtPath: inbox + "/old.txt")?.rawValue == FileProtectionType.completeUnlessOpen.rawValue,
                "a file has its directory's class")
        #expect(try fm.protection(ofItemAtPath: plain) == nil)
        #expect(try String(contentsOfFile: inbox + "/old.txt", encoding: .utf8) == "kept", "a migrated directory keeps its files")

        // Errors as Apple's Security errors: NSOSStatusErrorDomain with the status.
        func status(_ body: () throws -> Void) -> Int? {
            do { try body() } catch let e as NSError { return e.domain == "NSOSStatusErrorDomain" ? e.code : nil }
            return 0
        }
        #expect(status { try fm.setProtection(FileProtectionType(rawValue: "NSFileProtectionSomethingElse"), ofDirectoryAtPath: plain) }
                == Int(errSecParam))
        #expect(status { try fm.setProtection(.complete, ofDirectoryAtPath: complete) } == Int(errSecDuplicateItem))

        // Unlocked, writeProtected is an ordinary write.
        try Data("one".utf8).writeProtected(to: URL(fileURLWithPath: complete + "/one.txt"))
        #expect(try String(contentsOfFile: complete + "/one.txt", encoding: .utf8) == "one")

        // Locked: the complete-unless-open directory takes a new file (sealed until the unlock), Complete does not.
        let lock = runProcess(agent.binaries + "/coffer", ["lock"], environment: ["COFFER_SOCKET": agent.socket])
        #expect(lock.status == 0, "\(lock)")
        defer {
            _ = runProcess(agent.binaries + "/coffer", ["unlock", "--passcode-stdin"], stdin: TestAgent.password,
                           environment: ["COFFER_SOCKET": agent.socket])
        }
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline, (try? String(contentsOfFile: complete + "/one.txt", encoding: .utf8)) != nil { usleep(50_000) }
        #expect((try? String(contentsOfFile: complete + "/one.txt", encoding: .utf8)) == nil, "Complete is readable while locked")
        let note = Data((0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        try note.writeProtected(to: URL(fileURLWithPath: inbox + "/while-locked.bin"))
        #expect(!fm.fileExists(atPath: inbox + "/while-locked.bin") || (try? Data(contentsOf: URL(fileURLWithPath: inbox + "/while-locked.bin"))) == nil)
        #expect(status { try Data("no".utf8).writeProtected(to: URL(fileURLWithPath: complete + "/two.txt")) } == Int(errSecInteractionNotAllowed))

        let unlock = runProcess(agent.binaries + "/coffer", ["unlock", "--passcode-stdin"], stdin: TestAgent.password,
                                environment: ["COFFER_SOCKET": agent.socket])
        #expect(unlock.status == 0, "\(unlock)")
        let delivered = Date().addingTimeInterval(10)
        while Date() < delivered, (try? Data(contentsOf: URL(fileURLWithPath: inbox + "/while-locked.bin"))) != note { usleep(50_000) }
        #expect((try? Data(contentsOf: URL(fileURLWithPath: inbox + "/while-locked.bin"))) == note, "the file written while locked is not in its directory")
        #expect(!fm.fileExists(atPath: complete + "/two.txt"))
    }
}
