import CofferCrypto
import CofferFiles
import CofferModel
import CofferTestSupport
import Foundation
import Testing

/// CofferFiles against a real ext4 with the encrypt feature on a loop device each test makes (root):
/// fscrypt keys and policies, the in-place protect and the migration, the refusals, busy files.
@Suite(.serialized, .enabled(if: LoopFilesystem.unavailable == nil, "\(LoopFilesystem.unavailable ?? "")")) struct ProtectedDirectoryTests {
    /// A test filesystem (the suite is skipped, naming what is missing, where none can be made).
    static func filesystem(megabytes: Int = 64, encrypt: Bool = true) throws -> LoopFilesystem? {
        return try LoopFilesystem(megabytes: megabytes, encrypt: encrypt)
    }

    static func read(_ path: String) -> (String?, Int32) {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return (nil, errno) }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = Glibc.read(fd, &buffer, buffer.count)
        guard n >= 0 else { return (nil, errno) }
        return (String(decoding: buffer[0..<n], as: UTF8.self), 0)
    }

    @Test func anEmptyDirectoryIsProtectedInPlaceAndLocksWithItsKey() throws {
        guard let fs = try Self.filesystem() else { return }
        let dir = fs.file("secret")
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
        let candidate = try ProtectedDirectories.check(dir, uid: getuid())
        #expect(candidate.isEmpty)
        let key = SecureBytes.random(count: Fscrypt.keyBytes)
        let id = try Fscrypt.addKey(key, filesystemOf: fs.mountPoint)
        #expect(id.count == 16)
        #expect(try Fscrypt.addKey(key, filesystemOf: fs.mountPoint) == id, "the same key has the same identifier")
        try ProtectedDirectories.protect(candidate, identifier: id)
        #expect(try Fscrypt.policy(of: dir) == .v2(identifier: id))
        try "hello".write(toFile: dir + "/note.txt", atomically: false, encoding: .utf8)
        #expect(try Fscrypt.keyState(id, filesystemOf: fs.mountPoint) == .present)

        let removal = try Fscrypt.removeKey(id, filesystemOf: fs.mountPoint)
        #expect(!removal.filesBusy)
        #expect(try Fscrypt.keyState(id, filesystemOf: fs.mountPoint) == .absent)
        #expect(Self.read(dir + "/note.txt").1 == ENOENT, "the plain name is gone while locked")
        let names = try FileManager.default.contentsOfDirectory(atPath: dir)
        #expect(names.count == 1 && names != ["note.txt"], "names are ciphertext: \(names)")
        #expect(Self.read(dir + "/" + names[0]).1 == ENOKEY)
        #expect(open(dir + "/new.txt", O_WRONLY | O_CREAT, 0o600) == -1 && errno == ENOKEY)

        _ = try Fscrypt.addKey(key, filesystemOf: fs.mountPoint)
        #expect(Self.read(dir + "/note.txt").0 == "hello")
        // Checking a protected directory again: already protected; a directory inside it: nested.
        #expect(throws: FileProtectionError.alreadyProtected(dir)) { try ProtectedDirectories.check(dir, uid: getuid()) }
        try FileManager.default.createDirectory(atPath: dir + "/inner", withIntermediateDirectories: false)
        #expect(throws: FileProtectionError.nested(dir + "/inner", inside: dir)) { try ProtectedDirectories.check(dir + "/inner", uid: getuid()) }
        _ = try Fscrypt.removeKey(id, filesystemOf: fs.mountPoint)
    }

    @Test func aNonEmptyDirectoryIsMigratedWholeAndItsOldCopyRemoved() throws {
        guard let fs = try Self.filesystem() else { return }
        let dir = fs.file("docs")
        try FileManager.default.createDirectory(atPath: dir + "/sub/deeper", withIntermediateDirectories: true)
        try "one".write(toFile: dir + "/a.txt", atomically: false, encoding: .utf8)
        let big = (0..<300_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        _ = FileManager.default.createFile(atPath: dir + "/sub/big.bin", contents: Data(big))
        try "three".write(toFile: dir + "/sub/deeper/c.txt", atomically: false, encoding: .utf8)
        try FileManager.default.createSymbolicLink(atPath: dir + "/link", withDestinationPath: "a.txt")
        chmod(dir + "/a.txt", 0o640)
        let candidate = try ProtectedDirectories.check(dir, uid: getuid())
        #expect(!candidate.isEmpty && candidate.bytes == 300_008)
        let key = SecureBytes.random(count: Fscrypt.keyBytes)
        let id = try Fscrypt.addKey(key, filesystemOf: fs.mountPoint)
        try ProtectedDirectories.protect(candidate, identifier: id)

        #expect(try Fscrypt.policy(of: dir) == .v2(identifier: id))
        #expect(try Fscrypt.policy(of: dir + "/sub/deeper") == .v2(identifier: id), "inherited by every directory")
        #expect(Self.read(dir + "/a.txt").0 == "one")
        #expect(Self.read(dir + "/sub/deeper/c.txt").0 == "three")
        #expect(Array(FileManager.default.contents(atPath: dir + "/sub/big.bin") ?? Data()) == big)
        #expect(try FileManager.default.destinationOfSymbolicLink(atPath: dir + "/link") == "a.txt")
        #expect((try FileManager.default.attributesOfItem(atPath: dir + "/a.txt")[.posixPermissions] as? Int) == 0o640)
        #expect(!FileManager.default.fileExists(atPath: ProtectedDirectories.stagingPath(of: dir)), "the old copy is removed")
        #expect(try FileManager.default.contentsOfDirectory(atPath: fs.mountPoint).sorted() == ["docs", "lost+found"])

        _ = try Fscrypt.removeKey(id, filesystemOf: fs.mountPoint)
        #expect(Self.read(dir + "/a.txt").1 != 0, "locked after the migration")
    }

    @Test func badInputIsRefusedWithItsReasonAndChangesNothing() throws {
        guard let fs = try Self.filesystem() else { return }
        let uid = getuid()
        // A symbolic link to a directory.
        try FileManager.default.createDirectory(atPath: fs.file("real"), withIntermediateDirectories: false)
        try FileManager.default.createSymbolicLink(atPath: fs.file("alias"), withDestinationPath: fs.file("real"))
        #expect(throws: FileProtectionError.symbolicLink(fs.file("alias"))) { try ProtectedDirectories.check(fs.file("alias"), uid: uid) }
        // Missing, a file.
        #expect(throws: FileProtectionError.notFound(fs.file("nothing"))) { try ProtectedDirectories.check(fs.file("nothing"), uid: uid) }
        _ = FileManager.default.createFile(atPath: fs.file("plain.txt"), contents: Data("x".utf8))
        #expect(throws: FileProtectionError.notADirectory(fs.file("plain.txt"))) { try ProtectedDirectories.check(fs.file("plain.txt"), uid: uid) }
        // Another user's directory.
        try FileManager.default.createDirectory(atPath: fs.file("theirs"), withIntermediateDirectories: false)
        chown(fs.file("theirs"), 65534, 65534)
        #expect(throws: FileProtectionError.notOwner(fs.file("theirs"), owner: 65534)) { try ProtectedDirectories.check(fs.file("theirs"), uid: uid) }
        // A device node cannot be copied into a protected directory.
        try FileManager.default.createDirectory(atPath: fs.file("fifo"), withIntermediateDirectories: false)
        mkfifo(fs.file("fifo/pipe"), 0o600)
        #expect(throws: FileProtectionError.cannotCopy(fs.file("fifo/pipe"), what: "a device, FIFO or socket")) {
            try ProtectedDirectories.check(fs.file("fifo"), uid: uid)
        }
        // Nothing changed: no policy anywhere.
        for d in ["real", "theirs", "fifo"] { #expect(try Fscrypt.policy(of: fs.file(d)) == .none) }

        // ext4 without the encrypt feature: the reason and the one-time fix.
        let plain = try #require(try Self.filesystem(megabytes: 16, encrypt: false))
        try FileManager.default.createDirectory(atPath: plain.file("d"), withIntermediateDirectories: false)
        let e = #expect(throws: FileProtectionError.self) { try ProtectedDirectories.check(plain.file("d"), uid: uid) }
        #expect(e == .featureMissing(plain.file("d"), filesystem: "ext4", device: plain.device))
        #expect(e?.description.contains("tune2fs -O encrypt \(plain.device)") == true, "\(e.map { "\($0)" } ?? "")")
        #expect(e?.code == 6 && e?.secError.status == .notAvailable)

        // Another filesystem (a tmpfs mounted for this test).
        let tmp = TemporaryDirectory("coffer-tmpfs")
        #expect(runProcess("/bin/mount", ["-t", "tmpfs", "-o", "size=1m", "coffer-test", tmp.path]).status == 0)
        defer { _ = runProcess("/bin/umount", [tmp.path]) }
        try FileManager.default.createDirectory(atPath: tmp.file("d"), withIntermediateDirectories: false)
        #expect(throws: FileProtectionError.otherFilesystem(tmp.file("d"), type: "tmpfs")) { try ProtectedDirectories.check(tmp.file("d"), uid: uid) }
    }

    @Test func aMigrationThatDoesNotFitIsRefusedBeforeAnythingChanges() throws {
        guard let fs = try Self.filesystem(megabytes: 24) else { return }
        let dir = fs.file("full")
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
        let bytes = [UInt8](repeating: 7, count: 14 << 20)
        _ = FileManager.default.createFile(atPath: dir + "/big", contents: Data(bytes))
        let candidate = try ProtectedDirectories.check(dir, uid: getuid())
        let id = try Fscrypt.addKey(SecureBytes.random(count: Fscrypt.keyBytes), filesystemOf: fs.mountPoint)
        let e = #expect(throws: FileProtectionError.self) { try ProtectedDirectories.protect(candidate, identifier: id) }
        guard case .noSpace = e else { Issue.record("expected noSpace, got \(String(describing: e))"); return }
        #expect(try Fscrypt.policy(of: dir) == .none)
        #expect(Array(FileManager.default.contents(atPath: dir + "/big") ?? Data()) == bytes)
        #expect(!FileManager.default.fileExists(atPath: ProtectedDirectories.stagingPath(of: dir)))
        _ = try Fscrypt.removeKey(id, filesystemOf: fs.mountPoint)
    }

    @Test func anOpenFileKeepsTheKeyIncompletelyRemovedUntilItCloses() throws {
        guard let fs = try Self.filesystem() else { return }
        let dir = fs.file("open")
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)
        let id = try Fscrypt.addKey(SecureBytes.random(count: Fscrypt.keyBytes), filesystemOf: fs.mountPoint)
        try ProtectedDirectories.protect(try ProtectedDirectories.check(dir, uid: getuid()), identifier: id)
        try "kept".write(toFile: dir + "/held.txt", atomically: false, encoding: .utf8)
        try "other".write(toFile: dir + "/other.txt", atomically: false, encoding: .utf8)
        let fd = open(dir + "/held.txt", O_RDWR)
        #expect(fd >= 0)
        let removal = try Fscrypt.removeKey(id, filesystemOf: fs.mountPoint)
        #expect(removal.filesBusy)
        #expect(try Fscrypt.keyState(id, filesystemOf: fs.mountPoint) == .incompletelyRemoved)
        #expect(FileHolders.holding(dir).contains { $0.pid == getpid() }, "\(FileHolders.holding(dir))")
        var buffer = [UInt8](repeating: 0, count: 16)
        #expect(pread(fd, &buffer, 16, 0) == 4 && Array(buffer[0..<4]) == Array("kept".utf8), "the open file stays usable")
        #expect(Self.read(dir + "/other.txt").1 == ENOKEY, "other files are locked")
        close(fd)
        #expect(try Fscrypt.keyState(id, filesystemOf: fs.mountPoint) == .incompletelyRemoved, "closing alone does not finish it")
        #expect(!(try Fscrypt.removeKey(id, filesystemOf: fs.mountPoint).filesBusy))
        #expect(try Fscrypt.keyState(id, filesystemOf: fs.mountPoint) == .absent)
        #expect(FileHolders.holding(dir).isEmpty)
    }
}
