import CofferCrypto
import CofferSSHKeys
import Testing

/// ssh-ed25519 through libsodium: RFC 8032's test vectors, generation, and import checks.
@Suite struct Ed25519Tests {
    /// RFC 8032 §7.1, TEST 1 to 3: secret key (the seed), public key, message, signature.
    static let vectors: [(seed: String, publicKey: String, message: String, signature: String)] = [
        ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
         "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
         "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
        ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
         "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
         "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
        ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
         "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
         "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"),
    ]

    @Test(arguments: 0..<3) func rfc8032Vectors(index: Int) throws {
        let v = Self.vectors[index]
        let key = try SSHPrivateKey(components: .ed25519(seed: secure(hex(v.seed)), publicKey: hex(v.publicKey)))
        #expect(key.algorithm == .ed25519)
        #expect(key.publicComponents == .ed25519(hex(v.publicKey)))
        let signature = try key.sign(data: hex(v.message))
        #expect(signature == .ed25519(hex(v.signature)))
        #expect(key.verify(signature, data: hex(v.message)))
        #expect(!key.verify(signature, data: hex(v.message) + [0]))
        #expect(!key.publicComponents.verify(.ecdsa(r: [1], s: [1]), data: hex(v.message)), "a signature of another kind never verifies")

        // The key owns its seed: the caller wiping its buffer leaves the stored components whole.
        let callersSeed = secure(hex(v.seed))
        let owned = try SSHPrivateKey(components: .ed25519(seed: callersSeed, publicKey: hex(v.publicKey)))
        callersSeed.wipe()
        #expect(try SSHPrivateKey(components: owned.components).sign(data: hex(v.message)) == .ed25519(hex(v.signature)))
    }

    @Test func generatedKeysAreFreshAndSign() throws {
        let a = try SSHPrivateKey.generate(.ed25519), b = try SSHPrivateKey.generate(.ed25519)
        guard case .ed25519(let seedA, let pkA) = a.components, case .ed25519(let seedB, let pkB) = b.components else {
            Issue.record("not Ed25519 components"); return
        }
        #expect(seedA.count == 32 && pkA.count == 32)
        #expect(!seedA.constantTimeEquals(seedB) && pkA != pkB)
        let data = Array("session".utf8)
        let signature = try a.sign(data: data)
        guard case .ed25519(let raw) = signature else { Issue.record("not an Ed25519 signature"); return }
        #expect(raw.count == 64)
        #expect(a.verify(signature, data: data) && !b.verify(signature, data: data))
        // The components import again (the keychain item's round trip).
        #expect(try SSHPrivateKey(components: a.components).publicComponents == a.publicComponents)
    }

    @Test func badComponentsAreRefused() throws {
        let v = Self.vectors[0]
        var otherPublic = hex(v.publicKey)
        otherPublic[0] ^= 1
        #expect(thrown { try SSHPrivateKey(components: .ed25519(seed: secure(hex(v.seed)), publicKey: otherPublic) ) }
                == .inconsistentKey(.ed25519))
        #expect(thrown { try SSHPrivateKey(components: .ed25519(seed: secure(Array(hex(v.seed).dropLast())), publicKey: hex(v.publicKey))) }
                == .malformedComponent("Ed25519 seed (31 bytes, not 32)"))
        #expect(thrown { try SSHPrivateKey(components: .ed25519(seed: secure(hex(v.seed)), publicKey: Array(hex(v.publicKey).prefix(16)))) }
                == .malformedComponent("Ed25519 public key (16 bytes, not 32)"))
        #expect(thrown { try SSHPublicKey.ed25519([1, 2, 3]).validate() } != nil)
        #expect(thrown { try SSHPublicKey.ed25519(hex(v.publicKey)).validate() } == nil)
    }
}
