import CofferCrypto
import CofferSSHAgentProtocol
import Foundation
import Testing

/// The spec's vectors: each `ok` frame decodes and re-encodes to its bytes, each `error` frame throws
/// the named case, and the keys and signatures they carry match what OpenSSH's tools printed.
@Suite struct SSHAgentVectorTests {
    @Test func theSpecHasVectorsOfEveryKindAndOutcome() {
        #expect(sshVectors.count >= 50)
        let outcomes = Set(sshVectors.map(\.outcome))
        for o in ["ok", "error truncated", "error trailingBytes", "error oversize", "error emptyMessage", "error nonMinimalMPInt",
                  "error negativeMPInt", "error unknownKeyType", "error badLength", "error badCurve", "error inconsistentKey",
                  "error badBoolean", "error badUTF8", "error unknownConstraint", "error unknownConstraintExtension",
                  "error duplicateConstraint", "error badDestinationConstraint", "error unknownReply"] {
            #expect(outcomes.contains(o), "no vector with outcome \(o)")
        }
        // A signature vector per algorithm, a private key vector per key type, frames captured from OpenSSH.
        let algorithms = Set(sshVectors.compactMap { v -> String? in
            guard v.outcome == "ok", case .signResponse(let blob)? = try? SSHAgentReply.decode(frame: v.frame) else { return nil }
            return (try? SSHWireSignature(blob: blob))?.algorithm
        })
        #expect(algorithms == ["ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                               "ssh-rsa", "rsa-sha2-256", "rsa-sha2-512"])
        let privateTypes = Set(sshVectors.compactMap { v -> String? in
            guard v.outcome == "ok", case .addIdentity(let key, _, _)? = try? SSHAgentRequest.decode(frame: v.frame) else { return nil }
            return key.publicKey.keyType
        })
        #expect(privateTypes == ["ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa"])
        #expect(sshVectors.filter { $0.fields["source"]?.contains("captured") == true }.count >= 15)
    }

    @Test(arguments: sshVectors)
    func vector(_ v: SSHVector) throws {
        if v.outcome == "ok" {
            #expect(try reencode(v.frame, direction: v.direction) == v.frame)
        } else {
            let expected = try #require(v.outcome.split(separator: " ").last.map(String.init))
            #expect(v.outcome.hasPrefix("error "))
            do {
                _ = try reencode(v.frame, direction: v.direction)
                Issue.record("decoded, expected \(expected)")
            } catch {
                #expect(caseName(error) == expected)
            }
        }
    }

    /// Every strict prefix of every vector is refused (its length prefix no longer matches), and
    /// every prefix of its body decodes or throws without trapping, stably.
    @Test(arguments: sshVectors)
    func truncationsThrow(_ v: SSHVector) {
        for n in 0..<v.frame.count {
            let cut = Array(v.frame.prefix(n))
            #expect(throws: SSHAgentWireError.self) { try reencode(cut, direction: v.direction) }
        }
        guard v.frame.count > 4 else { return }
        let body = Array(v.frame[4...])
        for n in 0...body.count { decodesStably(body: Array(body.prefix(n))) }
    }

    /// Every single-byte change of every vector decodes or throws, never traps, and stays canonical.
    @Test(arguments: sshVectors)
    func mutationsNeverTrap(_ v: SSHVector) {
        guard v.frame.count > 4 else { return }
        let body = Array(v.frame[4...])
        for i in body.indices {
            for delta: UInt8 in [1, 0x80, 0xff] {
                var m = body
                m[i] &+= delta
                decodesStably(body: m)
            }
        }
    }

    /// Public keys: fingerprints and authorized_keys lines as ssh-keygen printed them for the same keys.
    @Test func fingerprintsAndAuthorizedKeysLinesMatchSSHKeygen() throws {
        var checked = 0
        for v in sshVectors where v.outcome == "ok" {
            guard let fp = v.fields["fingerprint"] else { continue }
            if v.direction == "reply" {
                guard case .identities(let ids) = try SSHAgentReply.decode(frame: v.frame) else { Issue.record("\(v.name)"); continue }
                let key = try SSHWirePublicKey(blob: ids[0].keyBlob)
                #expect(key.fingerprint == fp, "\(v.name)")
                #expect(key.authorizedKeysLine(comment: ids[0].comment) == v.fields["authorized"], "\(v.name)")
            } else {
                guard case .addIdentity(let key, _, _) = try SSHAgentRequest.decode(frame: v.frame) else { Issue.record("\(v.name)"); continue }
                #expect(key.publicKey.fingerprint == fp, "\(v.name)")
                // The stored form carries the same key.
                let stored = try SSHWirePrivateKey.decodeStored(key.encodeStored())
                #expect(plain(stored.encodeWire()) == plain(key.encodeWire()))
            }
            checked += 1
        }
        #expect(checked >= 12)
    }

    /// Signature vectors name the key that made them: the algorithm fits that key's type, and the
    /// ed25519 answer to ssh-add -T verifies over the data of the request before it (libsodium).
    @Test func signaturesFitTheirKeysAndVerify() throws {
        let keys = Dictionary(sshVectors.compactMap { v -> (String, SSHWirePublicKey)? in
            guard let fp = v.fields["fingerprint"], case .identities(let ids)? = try? SSHAgentReply.decode(frame: v.frame),
                  let k = try? SSHWirePublicKey(blob: ids[0].keyBlob) else { return nil }
            return (fp, k)
        }, uniquingKeysWith: { a, _ in a })
        var verified = 0
        for (i, v) in sshVectors.enumerated() where v.outcome == "ok" {
            guard let fp = v.fields["key"], case .signResponse(let blob) = try SSHAgentReply.decode(frame: v.frame) else { continue }
            let key = try #require(keys[fp], "no key \(fp)")
            let sig = try SSHWireSignature(blob: blob)
            switch (key, sig) {
            case (.ed25519, .ed25519), (.rsa, .rsa): break
            case (.ecdsa(let c, _), .ecdsa(let sc, _, _)): #expect(c == sc)
            default: Issue.record("\(v.name): \(sig.algorithm) from a \(key.keyType) key")
            }
            if v.fields["signs"] == "previous" {
                guard case .signRequest(let keyBlob, let data, _) = try SSHAgentRequest.decode(frame: sshVectors[i - 1].frame),
                      case .ed25519(let raw) = sig, case .ed25519(let pub) = key else { Issue.record("bad pairing"); continue }
                #expect(keyBlob == key.blob)
                #expect(Ed25519.verify(signature: raw, message: data, publicKey: pub))
                var tampered = data
                tampered[0] ^= 1
                #expect(!Ed25519.verify(signature: raw, message: tampered, publicKey: pub))
                verified += 1
            }
        }
        #expect(verified == 1)
    }
}
