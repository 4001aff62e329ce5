import CofferCrypto
import Testing

private func hex(_ b: [UInt8]) -> String { b.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined() }

private func bytes(hex s: String) -> [UInt8] {
    let u = Array(s.utf8)
    return stride(from: 0, to: u.count, by: 2).map { UInt8(String(decoding: u[$0..<$0 + 2], as: UTF8.self), radix: 16)! }
}

/// SHA-256 known answers (FIPS 180-2 examples, as `sha256sum` prints them).
@Suite struct SHA256Tests {
    @Test(arguments: [
        ("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
        ("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
        ("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
        ("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"),
    ])
    func knownAnswers(message: String, digest: String) {
        #expect(hex(SHA256.hash(Array(message.utf8))) == digest)
        #expect(Array(message.utf8).withUnsafeBytes { hex(SHA256.hash($0)) } == digest)
    }

    /// One million "a", fed in uneven chunks to the incremental hasher.
    @Test func millionAsStreamed() {
        let million = [UInt8](repeating: 0x61, count: 1_000_000)
        let expected = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        #expect(hex(SHA256.hash(million)) == expected)
        var h = SHA256.Hasher()
        var offset = 0
        var step = 1
        million.withUnsafeBytes { all in
            while offset < all.count {
                let n = min(step, all.count - offset)
                h.update(UnsafeRawBufferPointer(rebasing: all[offset..<offset + n]))
                offset += n
                step = step * 3 + 1
            }
            h.update(UnsafeRawBufferPointer(rebasing: all[0..<0]))
        }
        #expect(hex(h.finalize()) == expected)
    }
}

/// Ed25519 key pairs from a seed (RFC 8032 section 7.1, test 1).
@Suite struct Ed25519SeedTests {
    @Test func rfc8032TestOne() {
        var seed = bytes(hex: "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
        let (pk, sk) = Ed25519.keyPair(seed: SecureBytes(consuming: &seed))
        #expect(hex(pk) == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
        #expect(Ed25519.publicKey(secretKey: sk) == pk)
        let sig = Ed25519.sign([], secretKey: sk)
        #expect(hex(sig) == "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b")
        #expect(Ed25519.verify(signature: sig, message: [], publicKey: pk))
    }

    @Test func theSameSeedGivesTheSameKeys() {
        var a = [UInt8](repeating: 1, count: 32), b = a
        let k1 = Ed25519.keyPair(seed: SecureBytes(consuming: &a))
        let k2 = Ed25519.keyPair(seed: SecureBytes(consuming: &b))
        #expect(k1.publicKey == k2.publicKey)
        #expect(k1.secretKey.constantTimeEquals(k2.secretKey))
        #expect(Ed25519.publicKey(secretKey: Ed25519.generateKeyPair().secretKey) != k1.publicKey)
    }
}
