import CofferCrypto
@testable import CofferManifest
import Foundation
import Testing

/// A private temporary directory, by its canonical path, removed at the end.
func withTemporaryDirectory<R>(_ body: (String) throws -> R) throws -> R {
    var template = Array("/tmp/coffer-manifest-XXXXXX".utf8CString)
    let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    let dir = String(cString: try #require(made))
    defer { try? FileManager.default.removeItem(atPath: dir) }
    let canonical = try #require(realpath(dir, nil))
    defer { free(canonical) }
    return try body(String(cString: canonical))
}

func write(_ bytes: [UInt8], to path: String) throws {
    try Data(bytes).write(to: URL(fileURLWithPath: path))
}

@Suite struct ExecutableTests {
    @Test func matchesTheFileItPins() throws {
        try withTemporaryDirectory { dir in
            let exe = dir + "/example mail"
            let content = Array("#!/bin/true\nsome program\n".utf8)
            try write(content, to: exe)
            let digest = try ExecutableHash.sha256(path: exe)
            #expect(digest == SHA256.hash(content))
            let m = try signed(executable: exe, digest: digest)
            #expect(try m.matches(executableAt: exe))

            // Same content elsewhere: the path differs.
            let copy = dir + "/copy"
            try write(content, to: copy)
            #expect(try !m.matches(executableAt: copy))

            // Same path, different content.
            try write(content + [0x0A], to: exe)
            #expect(try !m.matches(executableAt: exe))
        }
    }

    /// A path through a symbolic link never matches, because /proc/PID/exe shows the resolved path.
    @Test func aSymbolicLinkPathDoesNotMatch() throws {
        try withTemporaryDirectory { dir in
            let content = Array("program".utf8)
            try write(content, to: dir + "/real")
            try FileManager.default.createSymbolicLink(atPath: dir + "/link", withDestinationPath: dir + "/real")
            let viaLink = try signed(executable: dir + "/link", digest: SHA256.hash(content))
            #expect(try !viaLink.matches(executableAt: dir + "/link"))
            try FileManager.default.createDirectory(atPath: dir + "/d", withIntermediateDirectories: false)
            try FileManager.default.createSymbolicLink(atPath: dir + "/dl", withDestinationPath: dir + "/d")
            try write(content, to: dir + "/d/x")
            let viaDirLink = try signed(executable: dir + "/dl/x", digest: SHA256.hash(content))
            #expect(try !viaDirLink.matches(executableAt: dir + "/dl/x"))
            #expect(try signed(executable: dir + "/d/x", digest: SHA256.hash(content)).matches(executableAt: dir + "/d/x"))
        }
    }

    @Test func unsuitableFilesAreErrors() throws {
        try withTemporaryDirectory { dir in
            let m = try signed(executable: dir)
            #expect(throws: ManifestError.executableNotRegularFile) { try m.matches(executableAt: dir) }
            let missing = try signed(executable: dir + "/missing")
            #expect(throws: ManifestError.executableUnreadable(errno: ENOENT)) { try missing.matches(executableAt: dir + "/missing") }
            #expect(throws: ManifestError.executableUnreadable(errno: ENOENT)) { try ExecutableHash.sha256(path: dir + "/missing") }
            #expect(throws: ManifestError.executableNotRegularFile) { try ExecutableHash.sha256(path: "/dev/null") }
            // A FIFO is refused at once rather than waiting for a writer.
            #expect(mkfifo(dir + "/fifo", 0o600) == 0)
            #expect(throws: ManifestError.executableNotRegularFile) { try ExecutableHash.sha256(path: dir + "/fifo") }
            let fifo = try signed(executable: dir + "/fifo")
            #expect(throws: ManifestError.executableNotRegularFile) { try fifo.matches(executableAt: dir + "/fifo") }
        }
    }

    /// Streaming in chunks gives the one-shot digest, for empty, odd-sized and multi-chunk files,
    /// and leaves the descriptor's offset alone.
    @Test(arguments: [0, 1, ExecutableHash.chunkBytes - 1, ExecutableHash.chunkBytes, 3 * ExecutableHash.chunkBytes + 123])
    func streamedDigestEqualsOneShot(size: Int) throws {
        try withTemporaryDirectory { dir in
            var rng = SplitMix64(seed: UInt64(size))
            let content = (0..<size).map { _ in UInt8.random(in: 0...255, using: &rng) }
            try write(content, to: dir + "/f")
            let fd = open(dir + "/f", O_RDONLY | O_CLOEXEC)
            #expect(fd >= 0)
            defer { close(fd) }
            #expect(try ExecutableHash.sha256(fileDescriptor: fd) == SHA256.hash(content))
            #expect(lseek(fd, 0, SEEK_CUR) == 0)
        }
    }

    /// The agent's way: hash the descriptor of /proc/PID/exe, match against readlink's bytes.
    @Test func procSelfExeMatchesItsOwnManifest() throws {
        let fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC)
        #expect(fd >= 0)
        defer { close(fd) }
        let digest = try ExecutableHash.sha256(fileDescriptor: fd)
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = readlink("/proc/self/exe", &buffer, buffer.count)
        #expect(n > 0)
        let path = Array(buffer[0..<n])
        #expect(digest == (try ExecutableHash.sha256(path: String(decoding: path, as: UTF8.self))))
        let m = try signed(executable: String(decoding: path, as: UTF8.self), digest: digest)
        #expect(m.matches(executablePath: path, sha256: digest))
        #expect(try m.matches(executableAt: String(decoding: path, as: UTF8.self)))
    }
}
