import Foundation
import LocalAuthentication
import Security
import Testing

/// SecKeyCreateSignature with a key the agent holds whose access control needs the person (issue #46): the
/// program's own prompt asks, once per signature without a context; a key found through an evaluated LAContext
/// (kSecUseAuthenticationContext) signs with no second prompt; through an invalidated one it fails at once.
extension AppleSecurityAPITests {
    /// A Secure Enclave-style key (made in the agent) that needs `flags` to sign; its tag.
    func agentKey(_ flags: SecAccessControlCreateFlags) throws -> (SecKey, Data) {
        let access = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, [.privateKeyUsage, flags], nil))
        let tag = Data(service().utf8)
        let attributes: [String: Any] = [
            kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom, kSecAttrKeySizeInBits as String: 256,
            kSecAttrTokenID as String: kSecAttrTokenIDSecureEnclave,
            kSecPrivateKeyAttrs as String: [kSecAttrIsPermanent as String: true, kSecAttrApplicationTag as String: tag,
                                            kSecAttrAccessControl as String: access],
        ]
        var error: Unmanaged<CFError>?
        let key = try #require(SecKeyCreateRandomKey(attributes as CFDictionary, &error), "\(String(describing: error?.takeRetainedValue()))")
        return (key, tag)
    }

    /// The key item tagged `tag`, as a SecKey, found with `extra` in the query.
    func findKey(_ tag: Data, _ extra: [String: Any] = [:]) throws -> SecKey {
        var query: [String: Any] = [kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag, kSecReturnRef as String: true]
        query.merge(extra) { $1 }
        var item: CFTypeRef?
        #expect(SecItemCopyMatching(query as CFDictionary, &item) == errSecSuccess)
        return try #require(item as? SecKey)
    }

    /// Signs `message` and checks the signature against `publicKey`; the CFError's code and its underlying
    /// error's domain and code when it fails.
    func sign(_ key: SecKey, _ message: Data, verifyingWith publicKey: SecKey) -> (ok: Bool, code: Int?, underlying: (String, Int)?) {
        var error: Unmanaged<CFError>?
        guard let signature = SecKeyCreateSignature(key, .ecdsaSignatureMessageX962SHA256, message as CFData, &error) as Data? else {
            let e = error?.takeRetainedValue() as NSError?
            let u = e?.userInfo[NSUnderlyingErrorKey] as? NSError
            return (false, e?.code, u.map { ($0.domain, $0.code) })
        }
        return (SecKeyVerifySignature(publicKey, .ecdsaSignatureMessageX962SHA256, message as CFData, signature as CFData, nil), nil, nil)
    }

    /// Without a context each signature asks the person through the program's own pinentry (with the key query's
    /// kSecUseOperationPrompt), and signs once answered.
    @Test func aSignatureWithAUserPresenceKeyAsksTheProgramsPrompt() throws {
        let (made, tag) = try agentKey(.userPresence)
        let publicKey = try #require(SecKeyCopyPublicKey(made))
        let key = try findKey(tag, [kSecUseOperationPrompt as String: "Sign the release"])
        let before = pinentryPrompts()
        #expect(sign(key, Data("release 1.0".utf8), verifyingWith: publicKey).ok)
        #expect(pinentryPrompts() == before + 1, "asked once")
        #expect(pinentryLog().contains("Sign the release"))
        #expect(sign(key, Data("release 1.1".utf8), verifyingWith: publicKey).ok)
        #expect(pinentryPrompts() == before + 2, "no context: every signature asks")
        // kSecUseAuthenticationUIFail on the key's query: the signature may not ask.
        let quiet = try findKey(tag, [kSecUseAuthenticationUI as String: kSecUseAuthenticationUIFail])
        let refused = sign(quiet, Data("quietly".utf8), verifyingWith: publicKey)
        #expect(!refused.ok && refused.code == Int(errSecInteractionNotAllowed))
        #expect(pinentryPrompts() == before + 2)
    }

    /// Apple's pattern: evaluate the device owner with an LAContext, find the key with the context in
    /// kSecUseAuthenticationContext, sign — no second prompt, for every signature inside the reuse window.
    /// Invalidated, the context signs nothing and asks nobody: errSecAuthFailed with the LAError
    /// invalidContext beneath.
    @Test func anEvaluatedContextSignsWithoutASecondPrompt() async throws {
        let (made, tag) = try agentKey(.userPresence)
        let publicKey = try #require(SecKeyCopyPublicKey(made))
        let context = LAContext()
        let before = pinentryPrompts()
        #expect(try await context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "Sign the commit"))
        #expect(pinentryPrompts() == before + 1)
        let key = try findKey(tag, [kSecUseAuthenticationContext as String: context])
        #expect(sign(key, Data("commit a".utf8), verifyingWith: publicKey).ok)
        #expect(sign(key, Data("commit b".utf8), verifyingWith: publicKey).ok)
        #expect(pinentryPrompts() == before + 1, "the evaluation covered both signatures")

        context.invalidate()
        let refused = sign(key, Data("commit c".utf8), verifyingWith: publicKey)
        #expect(!refused.ok)
        #expect(refused.code == Int(errSecAuthFailed))
        #expect(refused.underlying?.0 == LAErrorDomain && refused.underlying?.1 == LAError.Code.invalidContext.rawValue)
        #expect(pinentryPrompts() == before + 1, "nobody was asked")
        // A search through the invalidated context fails the same way.
        var item: CFTypeRef?
        #expect(SecItemCopyMatching([kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag, kSecReturnRef as String: true,
                                     kSecUseAuthenticationContext as String: context] as CFDictionary, &item) == errSecAuthFailed)
    }

    /// A context that was not evaluated authenticates at the first signature that needs it (on the context's
    /// connection), and that authentication is reused by the next one, as Apple's documentation of
    /// kSecUseAuthenticationContext says; a key of .devicePasscode works the same way.
    @Test func aFreshContextAuthenticatesOnceForItsSignatures() throws {
        let (made, tag) = try agentKey(.devicePasscode)
        let publicKey = try #require(SecKeyCopyPublicKey(made))
        let context = LAContext()
        let key = try findKey(tag, [kSecUseAuthenticationContext as String: context])
        let before = pinentryPrompts()
        #expect(sign(key, Data("first".utf8), verifyingWith: publicKey).ok)
        #expect(pinentryPrompts() == before + 1)
        #expect(sign(key, Data("second".utf8), verifyingWith: publicKey).ok)
        #expect(pinentryPrompts() == before + 1, "the context kept the authentication")
        // The same key found without the context asks again.
        #expect(sign(try findKey(tag), Data("third".utf8), verifyingWith: publicKey).ok)
        #expect(pinentryPrompts() == before + 2)
    }
}
