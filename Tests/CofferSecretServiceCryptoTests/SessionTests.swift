import CofferCrypto
import CofferSecretServiceCrypto
import Testing

/// Opening sessions, round trips and every refused input of the Secret Service session algorithms.
@Suite struct SessionTests {
    static let dh = SecretServiceAlgorithm.dhIETF1024SHA256AES128CBCPKCS7.rawValue
    static let invalidArgs = "org.freedesktop.DBus.Error.InvalidArgs"

    /// A DH session pair: our client's side and our server's side of one handshake.
    static func dhPair() throws -> (client: SecretServiceSession, server: SecretServiceSession) {
        let handshake = try SecretServiceClientHandshake.begin(.dhIETF1024SHA256AES128CBCPKCS7)
        #expect(handshake.input.count == 128)
        let (output, server) = try SecretServiceSession.open(algorithm: dh, input: handshake.input)
        #expect(output.count == 128)
        return (try handshake.complete(serverOutput: output), server)
    }

    /// The session error `body` throws, or nil (any other error is an issue).
    static func error(_ body: () throws -> Void) -> SecretServiceSessionError? {
        do {
            try body()
            return nil
        } catch let e as SecretServiceSessionError {
            return e
        } catch {
            Issue.record("not a SecretServiceSessionError: \(error)")
            return nil
        }
    }

    // MARK: Algorithms

    @Test func theAlgorithmNamesAreTheSpecs() {
        #expect(SecretServiceAlgorithm.allCases.map(\.rawValue) == ["plain", "dh-ietf1024-sha256-aes128-cbc-pkcs7"])
    }

    @Test(arguments: ["", "PLAIN", "Plain", "dh-ietf1024-sha256-aes128-cbc-pkcs7 ", "DH-IETF1024-SHA256-AES128-CBC-PKCS7",
                      "dh-ietf2048-sha256-aes128-cbc-pkcs7", "dh-ietf1024-sha256-aes128-cbc", "plain\u{0}"])
    func anUnsupportedAlgorithmIsNotSupported(name: String) {
        let e = Self.error { _ = try SecretServiceSession.open(algorithm: name, input: []) }
        #expect(e == .unsupportedAlgorithm(name))
        #expect(e?.dbusErrorName == "org.freedesktop.DBus.Error.NotSupported")
    }

    @Test func aLongUnsupportedNameIsCutInTheError() {
        let name = String(repeating: "x", count: 10_000)
        guard case .unsupportedAlgorithm(let shown) = Self.error({ _ = try SecretServiceSession.open(algorithm: name, input: []) }) else {
            Issue.record("not refused as unsupported"); return
        }
        #expect(shown.count == 64)
    }

    // MARK: plain

    @Test func plainCarriesTheSecretAsItIs() throws {
        let (output, session) = try SecretServiceSession.open(algorithm: "plain", input: [1, 2, 3])
        #expect(output.isEmpty)
        #expect(session.algorithm == .plain)
        for secret in [[], [0], Array("hunter2".utf8), [UInt8](repeating: 0xFF, count: 4096)] as [[UInt8]] {
            let sealed = try session.encrypt(secure(secret))
            #expect(sealed.parameters.isEmpty)
            #expect(bytes(sealed.value) == secret)
            #expect(bytes(try session.decrypt(parameters: [], value: secret)) == secret)
        }
        let client = try SecretServiceClientHandshake.begin(.plain)
        #expect(client.input.isEmpty)
        #expect(try client.complete(serverOutput: []).algorithm == .plain)
    }

    @Test func plainRefusesParameters() throws {
        let (_, session) = try SecretServiceSession.open(algorithm: "plain", input: [])
        let e = Self.error { _ = try session.decrypt(parameters: [0], value: [1]) }
        #expect(e == .invalidParameters(expected: 0, actual: 1))
        #expect(e?.dbusErrorName == Self.invalidArgs)
        #expect(Self.error { _ = try SecretServiceClientHandshake.begin(.plain).complete(serverOutput: [0]) } == .invalidServerOutput("plain takes no output, got 1 bytes"))
    }

    // MARK: DH round trips

    @Test func ourClientAndServerAgreeAtEverySize() throws {
        let (client, server) = try Self.dhPair()
        for n in [0, 1, 15, 16, 17, 31, 32, 33, 100, 255, 256, 1000, 1 << 20] {
            let secret = SecureBytes.random(count: n)
            let toClient = try server.encrypt(secret)
            #expect(toClient.parameters.count == 16)
            #expect(toClient.value.count == (n / 16 + 1) * 16, "PKCS#7 always pads, 1 to 16 bytes")
            #expect(try client.decrypt(parameters: toClient.parameters, value: bytes(toClient.value)).constantTimeEquals(secret))
            let toServer = try client.encrypt(secret)
            #expect(try server.decrypt(parameters: toServer.parameters, value: bytes(toServer.value)).constantTimeEquals(secret))
        }
    }

    @Test func everySecretGetsAFreshIV() throws {
        let (_, server) = try Self.dhPair()
        let secret = secure(Array("same secret".utf8))
        let sealed = try (0..<16).map { _ in try server.encrypt(secret) }
        #expect(Set(sealed.map(\.parameters)).count == 16)
        #expect(Set(sealed.map { bytes($0.value) }).count == 16)
    }

    @Test func everySessionGetsAFreshKeyPair() throws {
        let a = try SecretServiceClientHandshake.begin(.dhIETF1024SHA256AES128CBCPKCS7)
        let outputs = try (0..<4).map { _ in try SecretServiceSession.open(algorithm: Self.dh, input: a.input).output }
        #expect(Set(outputs).count == 4)
    }

    @Test func aSecretForAnotherSessionDoesNotDecrypt() throws {
        let (client, _) = try Self.dhPair()
        let (_, other) = try Self.dhPair()
        let secret = secure(Array("for the first session only".utf8))
        for _ in 0..<32 {
            let sealed = try client.encrypt(secret)
            do {
                let got = try other.decrypt(parameters: sealed.parameters, value: bytes(sealed.value))
                #expect(!got.constantTimeEquals(secret), "another session's key decrypted the secret")
            } catch {
                #expect(error == .invalidPadding)
                #expect(error.dbusErrorName == Self.invalidArgs)
            }
        }
    }

    // MARK: Bad public values

    static let p: [UInt8] = hex("""
        ffffffffffffffffc90fdaa22168c234c4c6628b80dc1cd129024e088a67cc74020bbea63b139b22514a08798e3404dd\
        ef9519b3cd3a431b302b0a6df25f14374fe1356d6d51c245e485b576625e7ec6f44c42e9a637ed6b0bff5cb6f406b7ed\
        ee386bfb5a899fa5ae9f24117c4b1fe649286651ece65381ffffffffffffffff
        """)

    /// p + k as 128 bytes (k may be negative; test arithmetic on bytes, with carry and borrow).
    static func p(plus k: Int) -> [UInt8] {
        var v = p, carry = k
        for i in stride(from: 127, through: 0, by: -1) where carry != 0 {
            let sum = Int(v[i]) + carry
            v[i] = UInt8(truncatingIfNeeded: sum)
            carry = sum >> 8
        }
        return v
    }

    @Test func theGroupsPrimeIsRFC2409s() throws {
        #expect(try DHKeyPair.prime() == Self.p)
    }

    static let badPublicValues: [(name: String, value: [UInt8], reason: String)] = [
        ("empty", [], "empty"),
        ("0", [0], "0 or 1"),
        ("0 at full width", [UInt8](repeating: 0, count: 128), "0 or 1"),
        ("1", [1], "0 or 1"),
        ("1 at full width", [UInt8](repeating: 0, count: 127) + [1], "0 or 1"),
        ("p − 1", p(plus: -1), "p − 1"),
        ("p", p, "not less than the prime"),
        ("p + 1", p(plus: 1), "not less than the prime"),
        ("2^1024 − 1", [UInt8](repeating: 0xFF, count: 128), "not less than the prime"),
        ("p − 2, outside the order-q subgroup", p(plus: -2), "not in the prime-order subgroup"),
        // More non-residues (y^q ≢ 1 mod p, worked out with Python's pow): the Legendre symbol's
        // answer must be the exponentiation's, for small values and values near p alike.
        ("5, outside the subgroup", [5], "not in the prime-order subgroup"),
        ("p − 3, outside the subgroup", p(plus: -3), "not in the prime-order subgroup"),
        ("p − 9, outside the subgroup", p(plus: -9), "not in the prime-order subgroup"),
        ("129 bytes", [0] + p(plus: -3), "129 bytes, longer than the 128-byte prime"),
        ("1000 bytes", [UInt8](repeating: 7, count: 1000), "1000 bytes, longer than the 128-byte prime"),
    ]

    @Test(arguments: badPublicValues.indices)
    func aBadClientPublicValueIsInvalidArguments(index: Int) throws {
        let bad = Self.badPublicValues[index]
        let e = Self.error { _ = try SecretServiceSession.open(algorithm: Self.dh, input: bad.value) }
        #expect(e == .invalidPublicValue(bad.reason), "\(bad.name)")
        #expect(e?.dbusErrorName == Self.invalidArgs)
        // The client's side refuses a server that sends one.
        let client = try SecretServiceClientHandshake.begin(.dhIETF1024SHA256AES128CBCPKCS7)
        #expect(Self.error { _ = try client.complete(serverOutput: bad.value) } == .invalidPublicValue(bad.reason), "\(bad.name)")
    }

    @Test func leadingZerosAndShortValuesAreAccepted() throws {
        let handshake = try SecretServiceClientHandshake.begin(.dhIETF1024SHA256AES128CBCPKCS7)
        let minimal = Array(handshake.input.drop { $0 == 0 })
        let (output, server) = try SecretServiceSession.open(algorithm: Self.dh, input: minimal)
        let client = try handshake.complete(serverOutput: Array(output.drop { $0 == 0 }))
        let sealed = try server.encrypt(secure([42]))
        #expect(bytes(try client.decrypt(parameters: sealed.parameters, value: bytes(sealed.value))) == [42])
        // g itself (2) is a member of the subgroup: accepted, and so are these residues (y^q ≡ 1).
        for member in [[2], [3], [6], [7], Self.p(plus: -5)] {
            #expect(throws: Never.self, "\(member.suffix(1))") { try SecretServiceSession.open(algorithm: Self.dh, input: member) }
        }
    }

    /// The server's private values are 256 bits with the top bit set (CSS_DH_PRIVATE_BITS), fresh
    /// each time, and their public values agree with them.
    @Test func aGeneratedPrivateValueIs256Bits() throws {
        var seen = Set<[UInt8]>()
        for _ in 0..<8 {
            let pair = try DHKeyPair.generate()
            let x = bytes(pair.privateValue)
            #expect(x.count == 128)
            #expect(x.prefix(96).allSatisfy { $0 == 0 } && x[96] & 0x80 != 0, "not a 256-bit value")
            #expect(try DHKeyPair.publicValue(of: pair.privateValue) == pair.publicValue)
            seen.insert(x)
        }
        #expect(seen.count == 8)
    }

    // MARK: Bad secrets

    @Test(arguments: [0, 1, 8, 15, 17, 32])
    func aBadIVLengthIsInvalidParameters(length: Int) throws {
        let (client, server) = try Self.dhPair()
        let sealed = try client.encrypt(secure([1, 2, 3]))
        let e = Self.error { _ = try server.decrypt(parameters: [UInt8](repeating: 0, count: length), value: bytes(sealed.value)) }
        #expect(e == .invalidParameters(expected: 16, actual: length))
        #expect(e?.dbusErrorName == Self.invalidArgs)
        #expect(Self.error { _ = try server.encrypt(secure([1]), iv: [UInt8](repeating: 0, count: length)) } == .invalidParameters(expected: 16, actual: length))
    }

    @Test(arguments: [0, 1, 15, 17, 31, 33, 1000])
    func aBadValueLengthIsInvalid(length: Int) throws {
        let (_, server) = try Self.dhPair()
        let e = Self.error { _ = try server.decrypt(parameters: [UInt8](repeating: 0, count: 16), value: [UInt8](repeating: 0, count: length)) }
        #expect(e == .invalidValueLength(length))
        #expect(e?.dbusErrorName == Self.invalidArgs)
    }

    /// Bad padding, made deterministically: the first AES vector's one block decrypts to "hunter" and
    /// ten 0x0a bytes; changing the IV changes those bytes exactly.
    @Test(arguments: [(15, 0x0a), (15, 0x1b), (15, 0x0a ^ 0x07), (14, 0x01), (6, 0x01)])
    func badPaddingIsInvalid(byte: Int, flip: Int) throws {
        let v = try #require(sessionVectors.first { $0.kind == "aes" && $0["plaintext"] == Array("hunter".utf8) })
        let session = SecretServiceSession.withKey(secure(v["aes-key"]))
        var iv = v["iv"]
        iv[byte] ^= UInt8(flip)
        let e = Self.error { _ = try session.decrypt(parameters: iv, value: v["ciphertext"]) }
        #expect(e == .invalidPadding)
        #expect(e?.dbusErrorName == Self.invalidArgs)
        let text = e.map(\.description) ?? ""
        #expect(!text.contains("hunter") && !text.contains("68756e746572"))
        // The untouched IV still decrypts: the refusal was the padding's.
        #expect(bytes(try session.decrypt(parameters: v["iv"], value: v["ciphertext"])) == Array("hunter".utf8))
    }

    /// Flipping the IV's last byte so the padding reads 1 (valid) instead of 10 gives a longer plaintext,
    /// not an error: CBC has no MAC, as the spec says, and the session's own client is the only sender.
    @Test func aValidPaddingOfAnotherLengthIsNotAnError() throws {
        let v = try #require(sessionVectors.first { $0.kind == "aes" && $0["plaintext"] == Array("hunter".utf8) })
        let session = SecretServiceSession.withKey(secure(v["aes-key"]))
        var iv = v["iv"]
        iv[15] ^= 0x0a ^ 0x01
        #expect(try session.decrypt(parameters: iv, value: v["ciphertext"]).count == 15)
    }

    @Test func errorsNameTheirDBusErrors() {
        #expect(SecretServiceSessionError.cryptoFailed("x").dbusErrorName == "org.freedesktop.DBus.Error.Failed")
        #expect(SecretServiceSessionError.invalidPadding.description.contains("padding"))
        #expect(SecretServiceSessionError.invalidValueLength(15).description.contains("15"))
    }
}
