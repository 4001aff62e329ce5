import CofferCrypto
import CofferSecretServiceCrypto
import Foundation
import Glibc
import Testing

/// python3-secretstorage (with `cryptography`), an independent client of the Secret Service API, as
/// the other side of real sessions: its `secretstorage.dhcrypto.Session` makes the client's key pair
/// and derives its key from our output, `secretstorage.util.format_secret` encrypts what we decrypt,
/// and it decrypts what we encrypt the way `secretstorage.Item.get_secret` does.
@Suite struct SecretStorageInteropTests {
    /// The first python3 that has secretstorage and cryptography (Debian's, then the one on PATH), or nil.
    static let python: String? = {
        var candidates = ["/usr/bin/python3"]
        for dir in (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":") { candidates.append("\(dir)/python3") }
        return candidates.first { path in
            guard FileManager.default.isExecutableFile(atPath: path) else { return false }
            let p = Process()
            p.executableURL = URL(fileURLWithPath: path)
            p.arguments = ["-c", "import secretstorage.dhcrypto, secretstorage.util, cryptography"]
            p.standardOutput = FileHandle.nullDevice
            p.standardError = FileHandle.nullDevice
            guard (try? p.run()) != nil else { return false }
            p.waitUntilExit()
            return p.terminationStatus == 0
        }
    }()

    /// The client: per round, prints its public value as secretstorage sends it (hex), reads our
    /// output, IV and ciphertext, prints the decrypted secret, reads a secret and prints its IV and
    /// ciphertext from format_secret. Secrets travel on stdin/stdout, never in argv.
    static let client = #"""
from sys import stdin
from cryptography.hazmat.backends import default_backend
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from secretstorage.dhcrypto import Session, int_to_bytes
from secretstorage.util import format_secret
rounds = int(stdin.readline())
for _ in range(rounds):
    session = Session()
    session.object_path = '/org/freedesktop/secrets/session/1'
    print(int_to_bytes(session.my_public_key).hex(), flush=True)
    output, iv, value = (bytes.fromhex(x) for x in stdin.readline().split(','))
    session.set_server_public_key(int.from_bytes(output, 'big'))
    decryptor = Cipher(algorithms.AES(session.aes_key), modes.CBC(iv), default_backend()).decryptor()
    padded = decryptor.update(value) + decryptor.finalize()
    print(padded[:-padded[-1]].hex(), flush=True)
    secret = bytes.fromhex(stdin.readline().strip())
    _, iv, value, _ = format_secret(session, secret, 'text/plain')
    print(iv.hex() + ',' + value.hex(), flush=True)
"""#

    /// Lines to and from the client process.
    final class Peer {
        let process = Process()
        let input = Pipe(), output = Pipe()
        var buffer: [UInt8] = []

        init(python: String) throws {
            process.executableURL = URL(fileURLWithPath: python)
            process.arguments = ["-c", SecretStorageInteropTests.client]
            process.standardInput = input
            process.standardOutput = output
            try process.run()
        }

        func send(_ line: String) { input.fileHandleForWriting.write(Data((line + "\n").utf8)) }

        /// The next line, or nil at end of output (the client failed: its stderr is the test's).
        func line() -> String? {
            while true {
                if let nl = buffer.firstIndex(of: 0x0A) {
                    defer { buffer.removeSubrange(...nl) }
                    return String(decoding: buffer[..<nl], as: UTF8.self)
                }
                // read(2) with EINTR retried (FileHandle.availableData traps on EINTR).
                var chunk = [UInt8](repeating: 0, count: 4096)
                let n = chunk.withUnsafeMutableBytes { read(output.fileHandleForReading.fileDescriptor, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return nil }
                buffer += chunk[..<n]
            }
        }

        func finish() -> Int32 {
            try? input.fileHandleForWriting.close()
            process.waitUntilExit()
            return process.terminationStatus
        }
    }

    @Test(.enabled(if: python != nil, "no python3 with secretstorage and cryptography (apt-get install python3-secretstorage; contrib/deps.sh)"))
    func secretstorageIsTheClientOfOurSessions() throws {
        let peer = try Peer(python: try #require(Self.python))
        defer { // a failed expectation leaves no python process behind
            if peer.process.isRunning { peer.process.terminate() }
            peer.process.waitUntilExit()
        }
        // Secret sizes across the padding's edges; 24 sessions make a 127-byte client value likely
        // (1 in 256 each is rarer; the spec's vectors pin that case).
        let sizes = [0, 1, 15, 16, 17, 31, 32, 33, 64, 100, 255, 256, 0, 5, 16, 48, 7, 1, 2, 3, 4096, 9, 10, 11]
        peer.send("\(sizes.count)")
        for (round, n) in sizes.enumerated() {
            let clientPublic = hex(try #require(peer.line(), "the python client stopped (round \(round))"))
            #expect(!clientPublic.isEmpty && clientPublic.count <= 128)
            let (output, session) = try SecretServiceSession.open(algorithm: "dh-ietf1024-sha256-aes128-cbc-pkcs7", input: clientPublic)

            // Ours to python: it derives the key from our output and decrypts as secretstorage's Item does.
            let toPython = SecureBytes.random(count: n)
            let sealed = try session.encrypt(toPython)
            peer.send("\(hex(output)),\(hex(sealed.parameters)),\(hex(bytes(sealed.value)))")
            #expect(try #require(peer.line()) == hex(bytes(toPython)), "round \(round): python decrypted something else")

            // Python's to us: format_secret's IV and ciphertext decrypt to its secret.
            let fromPython = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ round) }
            peer.send(hex(fromPython))
            let parts = try #require(peer.line()).split(separator: ",", omittingEmptySubsequences: false).map { hex(String($0)) }
            try #require(parts.count == 2)
            #expect(bytes(try session.decrypt(parameters: parts[0], value: parts[1])) == fromPython, "round \(round)")
        }
        #expect(peer.finish() == 0)
    }

    @Test(.enabled(if: python != nil, "no python3 with secretstorage and cryptography (apt-get install python3-secretstorage; contrib/deps.sh)"))
    func secretstoragesPrimeIsOurs() throws {
        let p = Process(), out = Pipe()
        p.executableURL = URL(fileURLWithPath: try #require(Self.python))
        p.arguments = ["-c", "from secretstorage.dhcrypto import DH_PRIME_1024_BYTES as p; print(bytes(p).hex())"]
        p.standardOutput = out
        try p.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        #expect(hex(text.trimmingCharacters(in: .whitespacesAndNewlines)) == SessionTests.p)
    }
}
