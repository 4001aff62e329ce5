import CofferCrypto
import CofferSecretServiceCrypto
import Testing

/// The test vectors of SecretServiceSessions.md, computed with Python's integers, `hmac` and the
/// `cryptography` package: this module reproduces each from its inputs.
@Suite struct SessionVectorTests {
    static let dh = "dh-ietf1024-sha256-aes128-cbc-pkcs7"

    @Test func theSpecHasVectorsOfEveryKind() {
        #expect(sessionVectors.filter { $0.kind == "dh" }.count >= 3)
        #expect(sessionVectors.filter { $0.kind == "aes" }.count >= 4)
        #expect(Set(sessionVectors.map(\.kind)) == ["dh", "aes"])
        // The cases the vectors are there for: a 127-byte client value, a shared secret with a leading zero.
        #expect(sessionVectors.contains { $0.kind == "dh" && $0["client-public"].count == 127 })
        #expect(sessionVectors.contains { $0.kind == "dh" && $0["shared-secret"].first == 0 })
        #expect(sessionVectors.contains { $0.kind == "aes" && $0["plaintext"].isEmpty })
    }

    @Test(arguments: sessionVectors.filter { $0.kind == "dh" })
    func dhVector(_ v: SessionVector) throws {
        let serverPrivate = secure(v["server-private"]), clientPrivate = secure(v["client-private"])
        // Each side's public value from its private value.
        #expect(try DHKeyPair.publicValue(of: serverPrivate) == v["server-public"])
        let clientPublic = try DHKeyPair.publicValue(of: clientPrivate)
        #expect(Array(clientPublic.drop { $0 == 0 }) == Array(v["client-public"].drop { $0 == 0 }))
        #expect(clientPublic.count == 128, "our own public values are sent at full width")

        // The shared secret at 128 bytes, leading zeros kept, from both sides; the key from it.
        let shared = try DHKeyPair.sharedSecret(privateValue: serverPrivate, peer: v["client-public"])
        #expect(bytes(shared) == v["shared-secret"])
        #expect(bytes(try DHKeyPair.sharedSecret(privateValue: clientPrivate, peer: v["server-public"])) == v["shared-secret"])
        #expect(bytes(try SecretServiceSession.deriveKey(shared)) == v["aes-key"])

        // The server's side as the front end calls it, and the client's side, agree with the key.
        let (output, server) = try SecretServiceSession.open(algorithm: Self.dh, input: v["client-public"], serverPrivateValue: serverPrivate)
        #expect(output == v["server-public"])
        #expect(server.algorithm == .dhIETF1024SHA256AES128CBCPKCS7)
        let client = try SecretServiceClientHandshake.begin(privateValue: clientPrivate).complete(serverOutput: v["server-public"])
        let reference = SecretServiceSession.withKey(secure(v["aes-key"]))
        let iv = [UInt8](repeating: 0xA5, count: 16), secret = secure(Array("vector \(v.name)".utf8))
        let expected = bytes(try reference.encrypt(secret, iv: iv).value)
        #expect(bytes(try server.encrypt(secret, iv: iv).value) == expected)
        #expect(bytes(try client.encrypt(secret, iv: iv).value) == expected)
        #expect(bytes(try server.decrypt(parameters: iv, value: expected)) == bytes(secret))
        // The same with the server's key pair made ahead (as the front end does): the same key.
        let pair = (privateValue: secure(bytes(serverPrivate)), publicValue: try DHKeyPair.publicValue(of: serverPrivate))
        let (aheadOutput, ahead) = try SecretServiceSession.open(algorithm: Self.dh, input: v["client-public"], keyPair: pair)
        let aheadSealed = bytes(try ahead.encrypt(secret, iv: iv).value)
        #expect(aheadOutput == v["server-public"] && aheadSealed == expected)
        #expect(bytes(pair.privateValue).allSatisfy { $0 == 0 }, "the pair's private value is wiped once used")
    }

    @Test(arguments: sessionVectors.filter { $0.kind == "aes" })
    func aesVector(_ v: SessionVector) throws {
        let session = SecretServiceSession.withKey(secure(v["aes-key"]))
        let sealed = try session.encrypt(secure(v["plaintext"]), iv: v["iv"])
        #expect(sealed.parameters == v["iv"])
        #expect(bytes(sealed.value) == v["ciphertext"])
        #expect(bytes(try session.decrypt(parameters: v["iv"], value: v["ciphertext"])) == v["plaintext"])
    }

    /// The AES vectors use the first DH vector's key, so a session opened from that vector decrypts them.
    @Test func theAESVectorsDecryptInTheFirstDHVectorsSession() throws {
        let first = try #require(sessionVectors.first { $0.kind == "dh" })
        let (_, session) = try SecretServiceSession.open(algorithm: Self.dh, input: first["client-public"],
                                                         serverPrivateValue: secure(first["server-private"]))
        for v in sessionVectors where v.kind == "aes" {
            #expect(v["aes-key"] == first["aes-key"])
            #expect(bytes(try session.decrypt(parameters: v["iv"], value: v["ciphertext"])) == v["plaintext"], "\(v.name)")
        }
    }
}
