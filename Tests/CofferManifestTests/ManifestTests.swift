import CofferCrypto
@testable import CofferManifest
import CofferModel
import Testing

/// A manifest signed with the trusted test key.
func signed(app: String = "com.example.mail", executable: String = "/usr/bin/example-mail",
            digest: [UInt8] = abcDigest, groups: [String] = ["com.example.mail", "com.example.shared"],
            key: SecureBytes = Keys.trusted.secretKey) throws(ManifestError) -> Manifest {
    try Manifest.sign(app: app, executable: executable, executableSHA256: digest, accessGroups: groups, secretKey: key)
}

@Suite struct SigningTests {
    @Test func signParseVerify() throws {
        let m = try signed()
        let bytes = m.encoded()
        let parsed = try Manifest.parse(bytes)
        #expect(parsed == m)
        #expect(parsed.app == "com.example.mail")
        #expect(parsed.executable == "/usr/bin/example-mail")
        #expect(parsed.accessGroups == ["com.example.mail", "com.example.shared"])
        #expect(parsed.defaultAccessGroup == "com.example.mail")
        #expect(parsed.signer.bytes == Keys.trusted.publicKey)
        #expect(parsed.signer.description == hex(Keys.trusted.publicKey))
        try parsed.verify(trusting: Keys.trustedSet)
        // The signature covers exactly the bytes before the signature line.
        let signatureLine = bytes.lastIndex(of: 0x0A, before: bytes.count - 1)! + 1
        #expect(Ed25519.verify(signature: parsed.signature, message: Array(bytes[0..<signatureLine]),
                               publicKey: Keys.trusted.publicKey))
    }

    @Test func untrustedSignerAndEmptyTrustSet() throws {
        let m = try signed(key: Keys.untrusted.secretKey)
        #expect(throws: ManifestError.untrustedSigner) { try m.verify(trusting: Keys.trustedSet) }
        #expect(throws: ManifestError.untrustedSigner) { try signed().verify(trusting: []) }
        try m.verify(trusting: [SignerKey(Keys.untrusted.publicKey)!])
        try m.verify(trusting: Keys.trustedSet.union([SignerKey(Keys.untrusted.publicKey)!]))
    }

    /// Changing, deleting or inserting any byte of a signed manifest makes it fail to parse or to verify.
    @Test func tamperingWithAnyByteIsCaught() throws {
        for m in [try signed(), try signed(executable: "/opt/Ünïcode/mail", groups: ["a"])] {
            let bytes = m.encoded()
            var variants: [[UInt8]] = []
            for i in bytes.indices {
                for flip: UInt8 in [0x01, 0x02, 0x20, 0x80] {
                    var b = bytes; b[i] ^= flip; variants.append(b)
                }
                var d = bytes; d.remove(at: i); variants.append(d)
                var ins = bytes; ins.insert(0x61, at: i); variants.append(ins)
            }
            for v in variants {
                guard let p = try? Manifest.parse(v) else { continue }
                #expect(throws: ManifestError.self) { try p.verify(trusting: Keys.trustedSet) }
            }
        }
    }

    /// A hex digit in the signature changed to another lowercase digit still parses, and fails verification.
    @Test func aValidLookingSignatureChangeIsABadSignature() throws {
        var bytes = try signed().encoded()
        let i = bytes.count - 2
        bytes[i] = bytes[i] == 0x30 ? 0x31 : 0x30
        let p = try Manifest.parse(bytes)
        #expect(throws: ManifestError.badSignature) { try p.verify(trusting: Keys.trustedSet) }
    }

    /// Signing applies the parser's rules to each value, so no value can add a line of its own.
    @Test func signingRefusesInvalidValuesWithTheirLine() {
        func problem(_ body: @autoclosure () throws(ManifestError) -> Manifest) -> ManifestError? {
            do { _ = try body(); return nil } catch { return error }
        }
        #expect(problem(try signed(app: "com.a\nexecutable: /bin/sh")) == .malformed(line: 2, .controlCharacter))
        #expect(problem(try signed(groups: ["g1\naccess-group: g2"])) == .malformed(line: 5, .controlCharacter))
        #expect(problem(try signed(groups: ["a", "b", "c d"])) == .malformed(line: 7, .badValue(.accessGroup)))
        #expect(problem(try signed(executable: "/usr/bin/")) == .malformed(line: 3, .badValue(.executable)))
        #expect(problem(try signed(executable: "/usr/bin/x ")) == .malformed(line: 3, .trailingSpace))
        #expect(problem(try signed(executable: "/usr/bin/x\r")) == .malformed(line: 3, .carriageReturn))
        #expect(problem(try signed(digest: [1, 2, 3])) == .malformed(line: 4, .badValue(.executableSHA256)))
        #expect(problem(try signed(groups: [])) == .malformed(line: 5, .expectedField(.accessGroup)))
        #expect(problem(try signed(groups: ["a", "a"])) == .malformed(line: 6, .duplicateAccessGroup))
        #expect(problem(try signed(groups: (0..<65).map { "g\($0)" })) == .malformed(line: 69, .tooManyAccessGroups))
        #expect(problem(try signed(groups: (0..<64).map { "g\($0)" })) == nil)
    }

    @Test func errorsMapToStableStatuses() {
        #expect(ManifestError.untrustedSigner.secError.status.rawValue == -34018)
        #expect(ManifestError.badSignature.secError.status.rawValue == -26275)
        #expect(ManifestError.tooLarge(bytes: 20000).secError.status.rawValue == -26275)
        #expect(ManifestError.malformed(line: 3, .badValue(.executable)).secError.status.rawValue == -26275)
        #expect(ManifestError.executableUnreadable(errno: 2).secError.status.rawValue == -36)
        #expect(ManifestError.executableTooLarge.secError.status.rawValue == -108)
        #expect(ManifestError.malformed(line: 3, .badValue(.executable)).description
                == "manifest line 3: executable must be an absolute path of at most 4096 bytes with no empty, \".\" or \"..\" components")
    }

    @Test func signerKeysFromHex() {
        let h = hex(Keys.trusted.publicKey)
        #expect(SignerKey(hex: h)?.bytes == Keys.trusted.publicKey)
        #expect(SignerKey(hex: h.uppercased()) == nil)
        #expect(SignerKey(hex: String(h.dropLast())) == nil)
        #expect(SignerKey([1, 2, 3]) == nil)
    }
}

@Suite struct ParsingTests {
    /// The size limit comes first: 16385 bytes is too large whatever they are; 16384 is parsed.
    @Test func sizeLimit() {
        let over = [UInt8](repeating: 0x41, count: Manifest.maximumBytes + 1)
        #expect(throws: ManifestError.tooLarge(bytes: 16385)) { try Manifest.parse(over) }
        #expect(throws: ManifestError.malformed(line: 1, .missingNewline)) { try Manifest.parse(Array(over.dropLast())) }
        let huge = [UInt8](repeating: 0x0A, count: 1 << 20)
        #expect(throws: ManifestError.tooLarge(bytes: 1 << 20)) { try huge.withUnsafeBytes { try Manifest.parse($0) } }
    }

    /// The largest valid manifest (longest names, path and 64 groups) is well under the limit.
    @Test func theLongestManifestFits() throws {
        let name = "a" + String(repeating: "b", count: 127)
        let groups = (0..<64).map { ($0 < 10 ? "0\($0)" : "\($0)") + String(repeating: "g", count: 126) }
        let path = "/" + String(repeating: "p", count: 4095)
        let m = try signed(app: name, executable: path, groups: groups)
        #expect(m.encoded().count == 13713)
        #expect(try Manifest.parse(m.encoded()) == m)
    }

    /// Equality is byte equality: canonically equivalent but different paths are different manifests.
    @Test func equalityIsByteEquality() throws {
        let nfc = try signed(executable: "/opt/caf\u{E9}/mail")
        let nfd = try signed(executable: "/opt/cafe\u{301}/mail")
        #expect(nfc.executable == nfd.executable, "Swift String equality equates them")
        #expect(nfc != nfd)
        #expect(nfc.matches(executablePath: Array("/opt/caf\u{E9}/mail".utf8), sha256: abcDigest))
        #expect(!nfc.matches(executablePath: Array("/opt/cafe\u{301}/mail".utf8), sha256: abcDigest))
        #expect(!nfc.matches(executablePath: "/opt/cafe\u{301}/mail", sha256: abcDigest))
        #expect(!nfc.matches(executablePath: "/opt/caf\u{E9}/mail", sha256: SHA256.hash(Array("abd".utf8))))
    }

    /// Random valid manifests (random names, groups and paths, including non-ASCII) round-trip
    /// exactly and verify; a random one-byte change never still verifies.
    @Test(arguments: [UInt64(1), 2, 3, 0xC0FFEE])
    func randomManifestsRoundTrip(seed: UInt64) throws {
        var rng = SplitMix64(seed: seed)
        let alnum = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        let nameChars = alnum + Array("._-")
        let pathChars = nameChars + Array(" é日\\:@+~,'\"()[]{}!#$%&=;") + [".", "."]
        func name() -> String {
            let n = Int.random(in: 1...128, using: &rng)
            return String(alnum.randomElement(using: &rng)!) + String((1..<n).map { _ in nameChars.randomElement(using: &rng)! })
        }
        func path() -> String {
            var p = ""
            repeat {
                p = ""
                for _ in 0..<Int.random(in: 1...8, using: &rng) {
                    var c = ""
                    repeat {
                        c = String((0..<Int.random(in: 1...24, using: &rng)).map { _ in pathChars.randomElement(using: &rng)! })
                    } while c == "." || c == ".." || c.hasSuffix(" ")
                    p += "/" + c
                }
            } while p.utf8.count > Manifest.maximumPathBytes
            return p
        }
        for _ in 0..<50 {
            var groups: [String] = []
            for _ in 0..<Int.random(in: 1...64, using: &rng) {
                let g = name()
                if !groups.contains(g) { groups.append(g) }
            }
            let digest = (0..<32).map { _ in UInt8.random(in: 0...255, using: &rng) }
            let m = try signed(app: name(), executable: path(), digest: digest, groups: groups)
            let bytes = m.encoded()
            let parsed = try Manifest.parse(bytes)
            #expect(parsed == m)
            #expect(parsed.encoded() == bytes)
            #expect(parsed.accessGroups == groups)
            #expect(parsed.executableSHA256 == digest)
            try parsed.verify(trusting: Keys.trustedSet)
            var bad = bytes
            let i = Int.random(in: 0..<bad.count, using: &rng)
            bad[i] ^= UInt8.random(in: 1...255, using: &rng)
            if let p = try? Manifest.parse(bad) {
                #expect(throws: ManifestError.self) { try p.verify(trusting: Keys.trustedSet) }
            }
        }
    }
}

extension Array where Element == UInt8 {
    /// The last index of `byte` before `end`.
    func lastIndex(of byte: UInt8, before end: Int) -> Int? { self[..<end].lastIndex(of: byte) }
}
