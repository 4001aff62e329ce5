import CofferCrypto
import CofferSSHKeys
import Testing

/// RSA through OpenSSL: PKCS#1 v1.5 signatures byte for byte as `openssl dgst -sign` makes them,
/// generated keys the `openssl` tool accepts, SHA-1 refused unless allowed, bad components refused.
/// Keys come from `openssl genpkey` (fast) except where generation itself is the point.
@Suite struct RSATests {
    struct Parts { let n: [UInt8], e: [UInt8], d: [UInt8], p: [UInt8], q: [UInt8], iqmp: [UInt8] }

    /// A key made by `openssl genpkey` into `scratch/file`, and its components.
    static func opensslKey(bits: Int, file: String, in scratch: Scratch) throws -> Parts {
        try OpenSSLTool.run(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:\(bits)", "-out", file], in: scratch.url)
        let c = try OpenSSLTool.components(ofKeyFile: file, in: scratch.url)
        return Parts(n: try #require(c["modulus"]), e: try #require(c["publicExponent"]), d: try #require(c["privateExponent"]),
                     p: try #require(c["prime1"]), q: try #require(c["prime2"]), iqmp: try #require(c["coefficient"]))
    }

    static func components(_ k: Parts) -> SSHPrivateKeyComponents {
        .rsa(n: k.n, e: k.e, d: secure(k.d), p: secure(k.p), q: secure(k.q), iqmp: secure(k.iqmp))
    }

    static func signatureBytes(_ signature: SSHSignature) -> [UInt8] {
        if case .rsa(_, let bytes) = signature { return bytes }
        Issue.record("not an RSA signature")
        return []
    }

    @Test(.enabled(if: OpenSSLTool.available, "no openssl command-line tool"))
    func importedKeySignsExactlyAsOpenSSLDoes() throws {
        let scratch = try Scratch()
        let parts = try Self.opensslKey(bits: 2048, file: "key.pem", in: scratch)
        let key = try SSHPrivateKey(components: Self.components(parts))
        #expect(key.algorithm == .rsa(bits: 2048))
        #expect(key.publicComponents == .rsa(e: [0x01, 0x00, 0x01], n: Array(parts.n.drop { $0 == 0 })))
        let data = Array("rsa-sha2 signed data".utf8)
        try scratch.write(data, to: "msg")
        try scratch.write(DER.publicKeyPEM(key.publicComponents), to: "pub.pem")
        for (hash, flag) in [(SSHRSAHash.sha256, "-sha256"), (.sha512, "-sha512")] {
            let signature = try key.sign(data: data, hash: hash)
            try OpenSSLTool.run(["dgst", flag, "-sign", "key.pem", "-out", "expected.sig", "msg"], in: scratch.url)
            #expect(Self.signatureBytes(signature) == (try scratch.read("expected.sig")), "PKCS#1 v1.5 is deterministic: \(flag)")
            #expect(Self.signatureBytes(signature).count == 256)
            #expect(key.verify(signature, data: data))
            #expect(!key.verify(signature, data: data + [0]))
            #expect(!key.verify(.rsa(hash: hash == .sha256 ? .sha512 : .sha256, signature: Self.signatureBytes(signature)), data: data))
            try scratch.write(Self.signatureBytes(signature), to: "ours.sig")
            #expect(try OpenSSLTool.run(["dgst", flag, "-verify", "pub.pem", "-signature", "ours.sig", "msg"], in: scratch.url).status == 0)
        }
        // ssh-rsa (SHA-1): refused unless the caller allows it, and then what openssl makes.
        #expect(thrown { try key.sign(data: data, hash: .sha1) } == .sha1Refused)
        let sha1 = try key.sign(data: data, hash: .sha1, allowSHA1: true)
        try OpenSSLTool.run(["dgst", "-sha1", "-sign", "key.pem", "-out", "sha1.sig", "msg"], in: scratch.url)
        #expect(Self.signatureBytes(sha1) == (try scratch.read("sha1.sig")))
        #expect(key.verify(sha1, data: data))
    }

    @Test(.enabled(if: OpenSSLTool.available, "no openssl command-line tool"))
    func badComponentsAreRefused() throws {
        let scratch = try Scratch()
        let k = try Self.opensslKey(bits: 2048, file: "a.pem", in: scratch)
        let other = try Self.opensslKey(bits: 2048, file: "b.pem", in: scratch)
        func importing(_ parts: Parts) -> SSHKeyError? { thrown { try SSHPrivateKey(components: Self.components(parts)) } }
        func flipped(_ v: [UInt8]) -> [UInt8] { var v = v; v[v.count - 1] ^= 2; return v }
        let inconsistent = SSHKeyError.inconsistentKey(.rsa(bits: 2048))
        var errors: [SSHKeyError?] = []
        #expect(importing(k) == nil)
        // p·q ≠ n: another key's prime.
        errors.append(importing(Parts(n: k.n, e: k.e, d: k.d, p: other.p, q: k.q, iqmp: k.iqmp)))
        #expect(errors.last == inconsistent)
        // Another key's modulus with these primes.
        errors.append(importing(Parts(n: other.n, e: k.e, d: k.d, p: k.p, q: k.q, iqmp: k.iqmp)))
        #expect(errors.last == inconsistent)
        // d, iqmp or e that do not belong.
        errors.append(importing(Parts(n: k.n, e: k.e, d: flipped(k.d), p: k.p, q: k.q, iqmp: k.iqmp)))
        #expect(errors.last == inconsistent)
        errors.append(importing(Parts(n: k.n, e: k.e, d: k.d, p: k.p, q: k.q, iqmp: flipped(k.iqmp))))
        #expect(errors.last == inconsistent)
        errors.append(importing(Parts(n: k.n, e: [0x01, 0x00, 0x03], d: k.d, p: k.p, q: k.q, iqmp: k.iqmp)))
        #expect(errors.last == inconsistent)
        // Truncated or empty numbers.
        errors.append(importing(Parts(n: Array(k.n.dropLast()), e: k.e, d: k.d, p: k.p, q: k.q, iqmp: k.iqmp)))
        #expect(errors.last == .unsupportedAlgorithm("RSA with a 2040-bit modulus (2048 to 16384 bits are accepted)"))
        errors.append(importing(Parts(n: k.n, e: k.e, d: [], p: k.p, q: k.q, iqmp: k.iqmp)))
        #expect(errors.last == .malformedComponent("RSA d (0 bytes)"))
        errors.append(importing(Parts(n: k.n, e: k.e, d: k.d, p: Array(k.p.dropLast()), q: k.q, iqmp: k.iqmp)))
        #expect(errors.last == inconsistent)

        let secretHex = hexString(Array(k.d.drop { $0 == 0 }))
        for case let error? in errors {
            #expect(!String(describing: error).lowercased().contains(secretHex.prefix(8)), "\(error) shows the secret")
        }
    }

    @Test(.enabled(if: OpenSSLTool.available, "no openssl command-line tool"))
    func keysBelow2048BitsAreRefused() throws {
        let scratch = try Scratch()
        let small = try Self.opensslKey(bits: 1024, file: "small.pem", in: scratch)
        #expect(thrown { try SSHPrivateKey(components: Self.components(small)) }
                == .unsupportedAlgorithm("RSA with a 1024-bit modulus (2048 to 16384 bits are accepted)"))
        #expect(thrown { try SSHPublicKey.rsa(e: small.e, n: small.n).validate() } != nil)
    }

    @Test func generationRefusesSizesOutOfRange() {
        for bits in [1024, 2047, 2056, 16384] {
            guard case .unsupportedAlgorithm? = thrown({ try SSHPrivateKey.generate(.rsa(bits: bits)) }) else {
                Issue.record("RSA \(bits) was not refused"); continue
            }
        }
    }

    @Test(.enabled(if: OpenSSLTool.available, "no openssl command-line tool"))
    func generatedKeysHaveTheirSizeDifferAndOpenSSLVerifies() throws {
        let scratch = try Scratch()
        let a = try SSHPrivateKey.generate(.rsa(bits: 2048)), b = try SSHPrivateKey.generate(.rsa(bits: 2048))
        guard case .rsa(let n, let e, let d, let p, let q, let iqmp) = a.components else { Issue.record("not RSA"); return }
        #expect(a.algorithm == .rsa(bits: 2048))
        #expect(n.count == 256 && n[0] & 0x80 != 0, "the modulus has exactly 2048 bits")
        #expect(e == [0x01, 0x00, 0x01])
        #expect(p.count == 128 && q.count == 128 && d.count <= 256 && iqmp.count <= 128)
        #expect(a.publicComponents != b.publicComponents)
        #expect(try SSHPrivateKey(components: a.components).publicComponents == a.publicComponents)

        let data = Array("generated".utf8)
        try scratch.write(data, to: "msg")
        try scratch.write(DER.publicKeyPEM(a.publicComponents), to: "pub.pem")
        for (hash, flag) in [(SSHRSAHash.sha256, "-sha256"), (.sha512, "-sha512")] {
            let signature = try a.sign(data: data, hash: hash)
            #expect(a.verify(signature, data: data) && !b.verify(signature, data: data))
            try scratch.write(Self.signatureBytes(signature), to: "sig")
            #expect(try OpenSSLTool.run(["dgst", flag, "-verify", "pub.pem", "-signature", "sig", "msg"], in: scratch.url).status == 0)
        }
    }

    /// The one RSA 3072 generation of the suite (the size `coffer ssh keygen --type rsa-3072` makes).
    @Test func generates3072BitKeys() throws {
        let key = try SSHPrivateKey.generate(.rsa(bits: 3072))
        #expect(key.algorithm == .rsa(bits: 3072))
        let signature = try key.sign(data: [1, 2, 3], hash: .sha256)
        #expect(Self.signatureBytes(signature).count == 384)
        #expect(key.verify(signature, data: [1, 2, 3]))
        #expect(key.verify(try key.sign(data: [], hash: .sha512), data: []))
    }
}
