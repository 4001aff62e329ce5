import CofferCrypto
import CofferSSHAgentProtocol
import Foundation
import Testing

/// FIDO keys (OpenSSH's PROTOCOL.u2f) in the spec's vectors: frames captured from OpenSSH 9.2p1's
/// `ssh-add -S` and `ssh-keygen -Y sign` with OpenSSH's sk-dummy authenticator, and what they carry.
@Suite struct SecurityKeyTests {
    static let vectors = sshVectors.filter { $0.fields["sk-fingerprint"] != nil || $0.fields["sk-key"] != nil }

    /// Both FIDO key types come to the agent with their sk-provider constraint; the key's fields are
    /// what ssh-keygen made (application `ssh:`, user presence required, sk-dummy's key handle).
    @Test func addedFIDOKeysDecodeWithTheirMiddleware() throws {
        var types: Set<String> = []
        for v in Self.vectors where v.direction == "request" {
            guard case .addSecurityKey(let key, let comment, let constraints) = try SSHAgentRequest.decode(frame: v.frame) else {
                Issue.record("\(v.name): not a FIDO key"); continue
            }
            types.insert(key.publicKey.keyType)
            #expect(key.publicKey.fingerprint == v.fields["sk-fingerprint"], "\(v.name)")
            #expect(key.publicKey.application == "ssh:" && key.flags == SSHSecurityKeyFlags.userPresenceRequired && key.reserved.isEmpty)
            #expect(key.keyHandle.count > 0 && comment.hasPrefix("coffer-test-sk-"))
            #expect(constraints == [.skProvider("/usr/lib/coffer-test/sk-dummy.so")], "\(v.name)")
            // The public key blob decodes on its own and re-encodes to the same bytes.
            #expect(try SSHSecurityKeyPublicKey(blob: key.publicKey.blob) == key.publicKey)
        }
        #expect(types == ["sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"])
    }

    /// The listing's key blobs are FIDO keys with the fingerprint and authorized_keys line ssh-keygen printed.
    @Test func listedFIDOKeysMatchSSHKeygen() throws {
        let v = try #require(Self.vectors.first { $0.direction == "reply" && $0.fields["sk-authorized"] != nil })
        guard case .identities(let ids) = try SSHAgentReply.decode(frame: v.frame) else { Issue.record("not a listing"); return }
        let keys = try ids.map { try SSHSecurityKeyPublicKey(blob: $0.keyBlob) }
        #expect(keys.map(\.keyType) == ["sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com"])
        #expect(keys[0].fingerprint == v.fields["sk-fingerprint"])
        #expect(keys[0].authorizedKeysLine(comment: ids[0].comment) == v.fields["sk-authorized"])
        // A FIDO blob is not a plain key, and a plain key's blob is not a FIDO key.
        #expect(throws: SSHAgentWireError.unknownKeyType("sk-ssh-ed25519@openssh.com")) { try SSHWirePublicKey(blob: ids[0].keyBlob) }
        let plain = SSHWirePublicKey.ed25519([UInt8](repeating: 1, count: 32)).blob
        #expect(throws: SSHAgentWireError.unknownKeyType("ssh-ed25519")) { try SSHSecurityKeyPublicKey(blob: plain) }
    }

    /// The signatures decode with the authenticator's flags and counter, re-encode to the same blob,
    /// and the ed25519 one verifies (libsodium) over what the authenticator signs for the previous
    /// request's data, and over nothing else.
    @Test func signaturesCarryFlagsAndCounterAndVerify() throws {
        let keys = try Dictionary(Self.vectors.compactMap { v -> (String, SSHSecurityKeyPublicKey)? in
            guard v.direction == "request", case .addSecurityKey(let key, _, _) = try SSHAgentRequest.decode(frame: v.frame) else { return nil }
            return (key.publicKey.fingerprint, key.publicKey)
        }, uniquingKeysWith: { a, _ in a })
        var verified = 0
        for (i, v) in sshVectors.enumerated() where v.fields["sk-key"] != nil {
            guard case .signResponse(let blob) = try SSHAgentReply.decode(frame: v.frame) else { Issue.record("\(v.name)"); continue }
            let key = try #require(keys[v.fields["sk-key"]!])
            let signature = try SSHSecurityKeySignature(blob: blob)
            #expect(signature.blob == blob)
            #expect(signature.algorithm == key.algorithm && signature.flags == 1 && signature.counter == 0x1234_5678, "\(v.name)")
            #expect(v.fields["sk-signs"] == "previous")
            guard case .signRequest(let keyBlob, let data, _) = try SSHAgentRequest.decode(frame: sshVectors[i - 1].frame) else {
                Issue.record("\(v.name): no request before it"); continue
            }
            #expect(keyBlob == key.blob)
            guard case .ed25519(let raw) = signature.body else { continue }   // ECDSA is verified in CofferAgentTests (OpenSSL)
            let signed = SSHSecurityKeySignature.signedBytes(application: key.application, flags: signature.flags, counter: signature.counter, data: data)
            #expect(signed.count == 69)
            #expect(Ed25519.verify(signature: raw, message: signed, publicKey: key.key))
            #expect(!Ed25519.verify(signature: raw, message: data, publicKey: key.key), "the signature is over the data itself")
            let other = SSHSecurityKeySignature.signedBytes(application: key.application, flags: signature.flags, counter: signature.counter + 1, data: data)
            #expect(!Ed25519.verify(signature: raw, message: other, publicKey: key.key))
            verified += 1
        }
        #expect(verified == 1)
    }

    /// A signature blob is read whole: cut short, with bytes after it, of the wrong size or type, it is refused.
    @Test func malformedSignatureBlobsAreRefused() throws {
        let good = try SSHSecurityKeySignature(algorithm: .ed25519, body: .ed25519([UInt8](repeating: 9, count: 64)), flags: 1, counter: 7)
        let blob = good.blob
        #expect(try SSHSecurityKeySignature(blob: blob) == good)
        #expect(throws: SSHAgentWireError.truncated) { try SSHSecurityKeySignature(blob: Array(blob.dropLast())) }
        #expect(throws: SSHAgentWireError.trailingBytes(1)) { try SSHSecurityKeySignature(blob: blob + [0]) }
        #expect(throws: SSHAgentWireError.badLength) {
            try SSHSecurityKeySignature(algorithm: .ed25519, body: .ed25519([UInt8](repeating: 9, count: 63)), flags: 1, counter: 7)
        }
        #expect(throws: SSHAgentWireError.badLength) {
            try SSHSecurityKeySignature(algorithm: .ecdsaP256, body: .ed25519([UInt8](repeating: 9, count: 64)), flags: 1, counter: 7)
        }
        #expect(throws: SSHAgentWireError.badLength) {
            try SSHSecurityKeySignature(algorithm: .ecdsaP256, body: .ecdsa(r: [UInt8](repeating: 1, count: 33), s: [1]), flags: 1, counter: 7)
        }
        // Leading zeros of r and s are dropped (mpints are minimal), and the blob re-reads the same.
        let ecdsa = try SSHSecurityKeySignature(algorithm: .ecdsaP256, body: .ecdsa(r: [0, 0x80, 1], s: [0, 2]), flags: 5, counter: 1)
        #expect(ecdsa.body == .ecdsa(r: [0x80, 1], s: [2]))
        #expect(try SSHSecurityKeySignature(blob: ecdsa.blob) == ecdsa)
        var w = SSHWireWriter()
        w.writeText("ssh-ed25519"); w.writeString([UInt8](repeating: 9, count: 64)); w.writeByte(1); w.writeUInt32(7)
        #expect(throws: SSHAgentWireError.unknownKeyType("ssh-ed25519")) { try SSHSecurityKeySignature(blob: w.bytes) }
    }

    /// The stored key handle re-encodes byte for byte, and the whole request with it.
    @Test func aFIDOKeyReencodesExactly() throws {
        for v in Self.vectors where v.direction == "request" {
            guard case .addSecurityKey(let key, _, _) = try SSHAgentRequest.decode(frame: v.frame) else { continue }
            let again = try SSHAgentRequest.addSecurityKey(key, comment: "c", constraints: []).encodeFrame()
            guard case .addSecurityKey(let back, "c", [])? = try? SSHAgentRequest.decode(frame: again) else { Issue.record("\(v.name)"); continue }
            #expect(plain(back.keyHandle) == plain(key.keyHandle) && back.publicKey == key.publicKey && back.flags == key.flags)
        }
    }
}
