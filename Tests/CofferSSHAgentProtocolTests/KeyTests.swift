import CofferCrypto
import CofferSSHAgentProtocol
import Testing

/// Key blobs, signature blobs and private keys in raw components (rules 5–8).
@Suite struct KeyTests {
    let q256 = [UInt8(4)] + [UInt8](repeating: 0x11, count: 64)

    @Test func publicKeysRoundTripThroughBlobs() throws {
        let keys: [SSHWirePublicKey] = [
            try .ed25519(validating: [UInt8](repeating: 0xab, count: 32)),
            try .ecdsa(validating: .nistp256, q: q256),
            try .ecdsa(validating: .nistp384, q: [4] + [UInt8](repeating: 0x22, count: 96)),
            try .ecdsa(validating: .nistp521, q: [4] + [UInt8](repeating: 0x33, count: 132)),
            .rsa(exponent: [0, 1, 0, 1], modulus: [0xc0] + [UInt8](repeating: 0x44, count: 255)),
        ]
        for k in keys { #expect(try SSHWirePublicKey(blob: k.blob) == k) }
        // e = 65537 and an n with its high bit set: minimal mpints, n with its 00 prefix.
        let rsaHead: [UInt8] = hex("00000007") + bytes("ssh-rsa") + hex("000000030100010000010100c04444")
        #expect(Array(keys[4].blob.prefix(rsaHead.count)) == rsaHead)
    }

    /// Rule 6: exact sizes.
    @Test func wrongSizesAreRefused() {
        #expect(throws: SSHAgentWireError.badLength) { try SSHWirePublicKey.ed25519(validating: [UInt8](repeating: 1, count: 31)) }
        #expect(throws: SSHAgentWireError.badLength) { try SSHWirePublicKey.ed25519(validating: [UInt8](repeating: 1, count: 33)) }
        #expect(throws: SSHAgentWireError.badLength) { try SSHWirePublicKey.ecdsa(validating: .nistp384, q: q256) }
        #expect(throws: SSHAgentWireError.badLength) { try SSHWirePublicKey.ecdsa(validating: .nistp256, q: [2] + [UInt8](repeating: 1, count: 32)) }
        #expect(throws: SSHAgentWireError.badLength) { try SSHWireSignature.ed25519(validating: [UInt8](repeating: 1, count: 63)) }
        #expect(throws: SSHAgentWireError.badLength) { try SSHWireSignature.ecdsa(validating: .nistp256, r: [UInt8](repeating: 1, count: 33), s: [1]) }
        #expect(throws: SSHAgentWireError.badLength) { try SSHWireSignature.ecdsa(validating: .nistp256, r: [0, 0], s: [1]) }
        #expect(throws: SSHAgentWireError.badLength) { try SSHWireSignature.rsa(validating: .sha256, []) }
        let shortSig = hex("0000000b") + bytes("ssh-ed25519") + hex("00000003010203")
        #expect(throws: SSHAgentWireError.badLength) { try SSHWireSignature(blob: shortSig) }
    }

    /// Rules 5 and 7: unknown types, curve names that do not match, points not uncompressed.
    @Test func unknownTypesAndCurveMismatchesAreRefused() {
        let dss = hex("00000007") + bytes("ssh-dss") + hex("00000000")
        #expect(throws: SSHAgentWireError.unknownKeyType("ssh-dss")) { try SSHWirePublicKey(blob: dss) }
        var w = SSHWireWriter()
        w.writeText("ecdsa-sha2-nistp256"); w.writeText("nistp384"); w.writeString(q256)
        #expect(throws: SSHAgentWireError.badCurve) { try SSHWirePublicKey(blob: w.bytes) }
        w = SSHWireWriter()
        w.writeText("ecdsa-sha2-nistp256"); w.writeText("nistp256"); w.writeString([5] + q256.dropFirst())
        #expect(throws: SSHAgentWireError.badCurve) { try SSHWirePublicKey(blob: w.bytes) }
        w = SSHWireWriter()
        w.writeText("ecdsa-sha2-nistp999"); w.writeText("nistp999"); w.writeString(q256)
        #expect(throws: SSHAgentWireError.unknownKeyType("ecdsa-sha2-nistp999")) { try SSHWirePublicKey(blob: w.bytes) }
        w = SSHWireWriter()
        w.writeText("rsa-sha2-384"); w.writeString([1])
        #expect(throws: SSHAgentWireError.unknownKeyType("rsa-sha2-384")) { try SSHWireSignature(blob: w.bytes) }
        let trailing = (try! SSHWirePublicKey.ed25519(validating: [UInt8](repeating: 1, count: 32))).blob + [0]
        #expect(throws: SSHAgentWireError.trailingBytes(1)) { try SSHWirePublicKey(blob: trailing) }
    }

    /// ECDSA signatures from fixed-width r and s: leading zeros dropped on the wire, back on request.
    @Test func ecdsaSignaturesFromRawScalars() throws {
        let r = [UInt8](repeating: 0, count: 2) + [0x80] + [UInt8](repeating: 5, count: 29)
        let s = [UInt8](repeating: 0x7f, count: 32)
        let sig = try SSHWireSignature.ecdsa(validating: .nistp256, r: r, s: s)
        var inner = SSHWireWriter()
        inner.writeUInt32(31); inner.writeRaw([0, 0x80] + [UInt8](repeating: 5, count: 29))
        inner.writeUInt32(32); inner.writeRaw(s)
        var outer = SSHWireWriter()
        outer.writeText("ecdsa-sha2-nistp256"); outer.writeString(inner.bytes)
        #expect(sig.blob == outer.bytes)
        let back = try SSHWireSignature(blob: sig.blob)
        #expect(back == sig)
        #expect(back.fixedWidthECDSA?.r == r)
        #expect(back.fixedWidthECDSA?.s == s)
        // An ECDSA inner string with a byte after s is refused (rule 2).
        var bad = SSHWireWriter()
        bad.writeText("ecdsa-sha2-nistp256"); bad.writeString(inner.bytes + [0])
        #expect(throws: SSHAgentWireError.trailingBytes(1)) { try SSHWireSignature(blob: bad.bytes) }
    }

    @Test func rsaAlgorithmFollowsTheSignFlags() {
        #expect(SSHRSASignatureAlgorithm(signFlags: 0) == .sha1)
        #expect(SSHRSASignatureAlgorithm(signFlags: SSHAgentSignFlags.rsaSHA2_256) == .sha256)
        #expect(SSHRSASignatureAlgorithm(signFlags: SSHAgentSignFlags.rsaSHA2_512) == .sha512)
        #expect(SSHRSASignatureAlgorithm(signFlags: 6) == .sha512)
    }

    func ed25519Key() -> SSHWirePrivateKey {
        let (pk, sk) = Ed25519.generateKeyPair()
        return .ed25519(publicKey: pk, secret: sk)
    }

    /// The stored form: version 1 then the wire form; other versions and leftovers are refused.
    @Test func storedFormIsVersioned() throws {
        let key = ed25519Key()
        let stored = key.encodeStored()
        let raw = plain(stored)
        #expect(raw.first == 1)
        #expect(Array(raw.dropFirst()) == plain(key.encodeWire()))
        let back = try SSHWirePrivateKey.decodeStored(stored)
        #expect(back.publicKey == key.publicKey)
        var v2 = raw
        v2[0] = 2
        #expect(throws: SSHAgentWireError.unsupportedStoredVersion(2)) { try SSHWirePrivateKey.decodeStored(SecureBytes(consuming: &v2)) }
        var v0 = raw
        v0[0] = 0
        #expect(throws: SSHAgentWireError.unsupportedStoredVersion(0)) { try SSHWirePrivateKey.decodeStored(SecureBytes(consuming: &v0)) }
        var empty: [UInt8] = []
        #expect(throws: SSHAgentWireError.truncated) { try SSHWirePrivateKey.decodeStored(SecureBytes(consuming: &empty)) }
        var longer = raw + [0]
        #expect(throws: SSHAgentWireError.trailingBytes(1)) { try SSHWirePrivateKey.decodeStored(SecureBytes(consuming: &longer)) }
        for n in 0..<raw.count {
            var cut = Array(raw.prefix(n))
            #expect(throws: SSHAgentWireError.self) { try SSHWirePrivateKey.decodeStored(SecureBytes(consuming: &cut)) }
        }
    }

    /// Rule 8, and a signature from the decoded secret verifies (the 64 bytes are libsodium's secret key).
    @Test func ed25519PrivateKeysAreConsistent() throws {
        let key = ed25519Key()
        guard case .ed25519(let pk, let sk) = try SSHWirePrivateKey(wire: key.encodeWire()) else { Issue.record("type"); return }
        #expect(Ed25519.verify(signature: Ed25519.sign(bytes("m"), secretKey: sk), message: bytes("m"), publicKey: pk))
        var other = pk
        other[0] ^= 1
        #expect(throws: SSHAgentWireError.inconsistentKey) { try SSHWirePrivateKey.ed25519(publicKey: other, secret: sk).validate() }
        #expect(throws: SSHAgentWireError.badLength) { try SSHWirePrivateKey.ed25519(publicKey: pk, secret: sk.slice(0..<63)).validate() }
    }

    @Test func ecdsaAndRSAPrivateKeysRoundTrip() throws {
        var dBytes = [UInt8](repeating: 0x9c, count: 32)
        let ec = SSHWirePrivateKey.ecdsa(.nistp256, q: q256, d: SecureBytes(consuming: &dBytes))
        let ecBack = try SSHWirePrivateKey.decodeStored(ec.encodeStored())
        #expect(plain(ecBack.encodeWire()) == plain(ec.encodeWire()))
        // A fixed-width d with leading zeros is accepted and comes back minimal.
        var padded = [UInt8](repeating: 0, count: 31) + [7]
        guard case .ecdsa(_, _, let d) = try SSHWirePrivateKey.decodeStored(SSHWirePrivateKey.ecdsa(.nistp256, q: q256, d: SecureBytes(consuming: &padded)).encodeStored())
        else { Issue.record("type"); return }
        #expect(plain(d) == [7])
        var zero = [UInt8](repeating: 0, count: 32)
        #expect(throws: SSHAgentWireError.badLength) { try SSHWirePrivateKey.ecdsa(.nistp256, q: q256, d: SecureBytes(consuming: &zero)).validate() }
        var big = [UInt8](repeating: 1, count: 33)
        #expect(throws: SSHAgentWireError.badLength) { try SSHWirePrivateKey.ecdsa(.nistp256, q: q256, d: SecureBytes(consuming: &big)).validate() }
        var pHigh: [UInt8] = [0x80, 0x70]
        let rsa = SSHWirePrivateKey.rsa(n: [0xc1, 2, 3], e: [1, 0, 1], d: secure("d"), iqmp: secure("i"), p: SecureBytes(consuming: &pHigh), q: secure("q"))
        guard case .rsa(let n, let e, _, _, let p, _) = try SSHWirePrivateKey(wire: rsa.encodeWire()) else { Issue.record("type"); return }
        #expect(n == [0xc1, 2, 3] && e == [1, 0, 1])
        #expect(plain(p) == [0x80, 0x70])
        // p's high bit is set: on the wire it is the mpint 00 80 70.
        let wire = plain(rsa.encodeWire())
        #expect(wire.indices.contains { Array(wire[$0...].prefix(7)) == [0, 0, 0, 3, 0, 0x80, 0x70] })
        #expect(rsa.publicKey == .rsa(e: [1, 0, 1], n: [0xc1, 2, 3]))
        let padded3 = SSHWirePrivateKey.rsa(n: [0, 0xc1, 2, 3], e: [0, 1, 0, 1], d: secure("d"), iqmp: secure("i"), p: secure("p"), q: secure("q"))
        #expect(padded3.publicKey == rsa.publicKey)
    }
}
