import CofferCrypto
import CofferSSHKeys
import Testing

/// ecdsa-sha2-nistp256/384/521 through OpenSSL: sizes, signatures the `openssl` tool accepts, keys it
/// made imported, and bad components refused.
@Suite struct ECDSATests {
    static let curves: [SSHCurve] = [.p256, .p384, .p521]

    /// The digest RFC 5656 pairs with the curve, as `openssl dgst` names it.
    static func digest(_ curve: SSHCurve) -> String {
        switch curve {
        case .p256: "-sha256"
        case .p384: "-sha384"
        case .p521: "-sha512"
        }
    }

    static func parts(_ key: SSHPrivateKey) throws -> (q: [UInt8], d: SecureBytes) {
        guard case .ecdsa(_, let q, let d) = key.components else { throw SSHKeyError.malformedComponent("not ECDSA") }
        return (q, d)
    }

    @Test(arguments: curves) func generatedKeysHaveTheCurvesSizesAndDiffer(curve: SSHCurve) throws {
        let a = try SSHPrivateKey.generate(curve.algorithm), b = try SSHPrivateKey.generate(curve.algorithm)
        let (qa, da) = try Self.parts(a), (qb, db) = try Self.parts(b)
        #expect(a.algorithm == curve.algorithm)
        #expect(qa.count == curve.pointBytes && qa.first == 0x04)
        #expect(da.count == curve.fieldBytes)
        #expect(qa != qb && !da.constantTimeEquals(db))
        #expect(try SSHPrivateKey(components: a.components).publicComponents == a.publicComponents)
        #expect(thrown { try a.publicComponents.validate() } == nil)

        // An imported key owns its secrets: the caller wiping its buffer changes nothing.
        let callersD = secure(bytes(da))
        let imported = try SSHPrivateKey(components: .ecdsa(curve: curve, q: qa, d: callersD))
        callersD.wipe()
        #expect(a.verify(try imported.sign(data: [7]), data: [7]))
        // Empty data signs and verifies too (the C wall gets a zero-length buffer).
        #expect(a.verify(try a.sign(data: []), data: []))
        #expect(!a.verify(try a.sign(data: []), data: [0]))
    }

    @Test(.enabled(if: OpenSSLTool.available, "no openssl command-line tool"), arguments: curves)
    func opensslVerifiesOurSignatures(curve: SSHCurve) throws {
        let scratch = try Scratch()
        let key = try SSHPrivateKey.generate(curve.algorithm)
        let data = Array("SSH_AGENTC_SIGN_REQUEST data for \(curve)".utf8)
        let signature = try key.sign(data: data)
        guard case .ecdsa(let r, let s) = signature else { Issue.record("not an ECDSA signature"); return }
        #expect(!r.isEmpty && r.count <= curve.fieldBytes && r.first != 0, "r is unsigned and minimal")
        #expect(!s.isEmpty && s.count <= curve.fieldBytes && s.first != 0, "s is unsigned and minimal")
        #expect(key.verify(signature, data: data))
        #expect(!key.verify(signature, data: data + [0]))
        #expect(!key.verify(.ecdsa(r: s, s: r), data: data))

        try scratch.write(DER.publicKeyPEM(key.publicComponents), to: "pub.pem")
        try scratch.write(DER.sequence(DER.integer(r), DER.integer(s)), to: "sig.der")
        try scratch.write(data, to: "msg")
        try scratch.write(data + [0], to: "other")
        let ok = try OpenSSLTool.run(["dgst", Self.digest(curve), "-verify", "pub.pem", "-signature", "sig.der", "msg"], in: scratch.url)
        #expect(ok.status == 0 && ok.output.contains("Verified OK"))
        let wrong = try OpenSSLTool.run(["dgst", Self.digest(curve), "-verify", "pub.pem", "-signature", "sig.der", "other"],
                                        in: scratch.url, expectFailure: true)
        #expect(wrong.status != 0, "openssl must refuse the signature for other data")
    }

    @Test(.enabled(if: OpenSSLTool.available, "no openssl command-line tool"), arguments: curves)
    func keysMadeByOpenSSLImportAndSign(curve: SSHCurve) throws {
        let scratch = try Scratch()
        let name = switch curve { case .p256: "P-256"; case .p384: "P-384"; case .p521: "P-521" }
        try OpenSSLTool.run(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:\(name)", "-out", "key.pem"], in: scratch.url)
        try OpenSSLTool.run(["pkey", "-in", "key.pem", "-pubout", "-out", "pub.pem"], in: scratch.url)
        let c = try OpenSSLTool.components(ofKeyFile: "key.pem", in: scratch.url)
        let q = try #require(c["pub"]), d = try #require(c["priv"])
        let key = try SSHPrivateKey(components: .ecdsa(curve: curve, q: q, d: secure(d)))
        #expect(key.publicComponents == .ecdsa(curve: curve, q: q))
        let (_, storedD) = try Self.parts(key)
        #expect(storedD.count == curve.fieldBytes, "d is stored at the field's width")

        // Ours, verified by openssl with its own public key file.
        let data = Array("imported \(curve)".utf8)
        let signature = try key.sign(data: data)
        guard case .ecdsa(let r, let s) = signature else { Issue.record("not an ECDSA signature"); return }
        try scratch.write(DER.sequence(DER.integer(r), DER.integer(s)), to: "sig.der")
        try scratch.write(data, to: "msg")
        #expect(try OpenSSLTool.run(["dgst", Self.digest(curve), "-verify", "pub.pem", "-signature", "sig.der", "msg"], in: scratch.url).status == 0)
        #expect(key.verify(signature, data: data))

        // openssl's, verified by ours.
        try OpenSSLTool.run(["dgst", Self.digest(curve), "-sign", "key.pem", "-out", "theirs.der", "msg"], in: scratch.url)
        let rs = try #require(DER.integers(ofSequence: try scratch.read("theirs.der")))
        try #require(rs.count == 2)
        #expect(key.verify(.ecdsa(r: rs[0], s: rs[1]), data: data))
        #expect(!key.verify(.ecdsa(r: rs[0], s: rs[1]), data: data + [1]))
    }

    @Test(arguments: curves) func badComponentsAreRefused(curve: SSHCurve) throws {
        let a = try SSHPrivateKey.generate(curve.algorithm), b = try SSHPrivateKey.generate(curve.algorithm)
        let (qa, da) = try Self.parts(a), (qb, _) = try Self.parts(b)
        func importing(_ q: [UInt8], _ d: SecureBytes, on c: SSHCurve? = nil) -> SSHKeyError? {
            thrown { try SSHPrivateKey(components: .ecdsa(curve: c ?? curve, q: q, d: d)) }
        }
        var errors: [SSHKeyError?] = []
        // d does not match Q (d·G is another point).
        errors.append(importing(qb, da))
        #expect(errors.last == .inconsistentKey(curve.algorithm))
        // Q off the curve.
        var offCurve = qa
        offCurve[offCurve.count - 1] ^= 1
        errors.append(importing(offCurve, da))
        #expect(errors.last == .inconsistentKey(curve.algorithm))
        #expect(thrown { try SSHPublicKey.ecdsa(curve: curve, q: offCurve).validate() } == .inconsistentKey(curve.algorithm))
        // Truncated, compressed, or another curve's point.
        errors.append(importing(Array(qa.dropLast()), da))
        #expect(errors.last == .malformedComponent("\(curve.algorithm) point Q (\(curve.pointBytes - 1) bytes; an uncompressed point has \(curve.pointBytes))"))
        var compressed = Array(qa.prefix(curve.fieldBytes + 1))
        compressed[0] = 0x02
        errors.append(importing(compressed, da))
        #expect(errors.last != nil)
        let other: SSHCurve = curve == .p256 ? .p384 : .p256
        errors.append(importing(qa, da, on: other))
        #expect(errors.last != nil)
        // d too long, zero, or beyond the group order.
        errors.append(importing(qa, secure([1] + bytes(da))))
        #expect(errors.last == .malformedComponent("\(curve.algorithm) private scalar d (longer than \(curve.fieldBytes) bytes)"))
        errors.append(importing(qa, SecureBytes(count: curve.fieldBytes)))
        #expect(errors.last == .inconsistentKey(curve.algorithm))
        errors.append(importing(qa, secure([UInt8](repeating: 0xff, count: curve.fieldBytes))))
        #expect(errors.last == .inconsistentKey(curve.algorithm))
        // A d with leading zero bytes, as an mpint decodes, is the same key.
        #expect(importing(qa, secure([0, 0] + bytes(da))) == nil)

        // No error names the secret.
        let secretHex = hexString(bytes(da))
        for case let error? in errors {
            #expect(!String(describing: error).lowercased().contains(secretHex.prefix(8)), "\(error) shows the secret")
        }
    }
}
