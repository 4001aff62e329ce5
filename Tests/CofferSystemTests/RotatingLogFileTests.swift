import CofferSystem
import CofferTestSupport
import Foundation
import Glibc
import Testing

/// The daemon's log file rotated by size (issue #41 L1): bounded files, whole lines, the descriptor
/// kept on the current file, and rotations that survive a crash between two renames.
@Suite struct RotatingLogFileTests {
    /// A log at `dir/test.log` written through a descriptor of its own (as the daemon's standard error).
    static func open(_ dir: TemporaryDirectory, maximumBytes: Int, keep: Int) throws -> (RotatingLogFile, Int32) {
        let path = dir.file("test.log")
        let fd = Glibc.open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
        try #require(fd >= 0, "open \(path): errno \(errno)")
        return (RotatingLogFile(path: path, descriptor: fd, maximumBytes: maximumBytes, keep: keep), fd)
    }

    static func read(_ path: String) -> String { (try? String(contentsOfFile: path, encoding: .utf8)) ?? "" }

    static func inode(ofDescriptor fd: Int32) -> ino_t {
        var st = stat()
        return fstat(fd, &st) == 0 ? st.st_ino : 0
    }

    static func inode(_ path: String) -> ino_t {
        var st = stat()
        return stat(path, &st) == 0 ? st.st_ino : 0
    }

    @Test func filesStayUnderTheLimitAndHoldTheNewestLinesWhole() throws {
        let dir = TemporaryDirectory("coffer-logrotate")
        let (log, fd) = try Self.open(dir, maximumBytes: 200, keep: 2)
        defer { close(fd) }
        let lines = (0..<100).map { String(format: "line %03d of the log, padded to a fixed width\n", $0) }
        for line in lines { log.append(Array(line.utf8)) }

        let base = dir.file("test.log")
        #expect(RotatingLogFile.files(base, keep: 5) == [base + ".2", base + ".1", base], "keep 2: three files at most")
        for file in RotatingLogFile.files(base, keep: 2) {
            let text = Self.read(file)
            #expect(text.utf8.count <= 200 && text.utf8.count > 0, "\(file): \(text.utf8.count) bytes")
            #expect(text.hasSuffix("\n") && text.split(separator: "\n").allSatisfy { $0.hasPrefix("line ") && $0.count == lines[0].count - 1 },
                    "\(file) holds a torn line: \(text)")
        }
        // Oldest first, the files are the log's last lines in order: nothing lost between them, nothing twice.
        let kept = RotatingLogFile.files(base, keep: 2).map(Self.read).joined()
        #expect(lines.joined().hasSuffix(kept) && kept.hasSuffix(lines.last!), "\(kept)")
        // The descriptor was moved onto the current file (dup2), not left on a renamed one.
        #expect(Self.inode(ofDescriptor: fd) == Self.inode(base))
        log.append(Array("after\n".utf8))
        #expect(Self.read(base).hasSuffix("after\n"))
    }

    @Test func aLineLongerThanTheLimitGetsAFileOfItsOwn() throws {
        let dir = TemporaryDirectory("coffer-logrotate")
        let (log, fd) = try Self.open(dir, maximumBytes: 64, keep: 1)
        defer { close(fd) }
        log.append(Array("short\n".utf8))
        let long = String(repeating: "x", count: 100) + "\n"
        log.append(Array(long.utf8))
        let base = dir.file("test.log")
        #expect(Self.read(base + ".1") == "short\n")
        #expect(Self.read(base) == long)
        log.append(Array("next\n".utf8))
        #expect(Self.read(base + ".1") == long && Self.read(base) == "next\n", "keep 1: the oldest went")
    }

    /// A crash between two renames of a rotation (after `.1` became `.2`, before the current file
    /// became `.1`) leaves a gap and a current file past the limit: the next line finishes the job.
    /// What it costs is the oldest file, dropped one rotation early; the current file's lines stay.
    @Test func aRotationCutShortByACrashIsFinishedByTheNext() throws {
        let dir = TemporaryDirectory("coffer-logrotate")
        let base = dir.file("test.log")
        try "was .1 when the crash came\n".write(toFile: base + ".2", atomically: false, encoding: .utf8)
        try "current, past the limit already\n".write(toFile: base, atomically: false, encoding: .utf8)
        let (log, fd) = try Self.open(dir, maximumBytes: 40, keep: 2)
        defer { close(fd) }
        log.append(Array("first line after the restart\n".utf8))
        #expect(RotatingLogFile.files(base, keep: 2) == [base + ".1", base])
        #expect(Self.read(base + ".1") == "current, past the limit already\n")
        #expect(Self.read(base) == "first line after the restart\n")
        log.append(Array("another line past the limit\n".utf8))
        #expect(RotatingLogFile.files(base, keep: 2).map(Self.read)
                == ["current, past the limit already\n", "first line after the restart\n", "another line past the limit\n"])
        #expect(!FileManager.default.fileExists(atPath: base + ".3"))
    }

    /// keep 0: the file is started afresh, nothing kept beside it.
    @Test func keepZeroKeepsOnlyTheCurrentFile() throws {
        let dir = TemporaryDirectory("coffer-logrotate")
        let (log, fd) = try Self.open(dir, maximumBytes: 16, keep: 0)
        defer { close(fd) }
        for word in ["first line\n", "second line\n", "third line\n"] { log.append(Array(word.utf8)) }
        let base = dir.file("test.log")
        #expect(RotatingLogFile.files(base, keep: 3) == [base])
        #expect(Self.read(base) == "third line\n")
    }
}
