import Foundation
import Security
import Testing

extension AppleSecurityAPITests {
    // MARK: kSecReturnRef for passwords (issue #46)

    /// Apple's data protection keychain has no reference type for passwords (its SecItem makes refs for keys,
    /// certificates and identities only): kSecReturnRef is ignored for them. Alone it returns no value and
    /// errSecSuccess when something matched (nil for one match, an empty array for all); beside other parts it
    /// adds no kSecValueRef; without a match it is errSecItemNotFound.
    @Test func aPasswordHasNoReferenceAndTheRequestIsIgnored() throws {
        let svc = service()
        let add: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                  kSecAttrAccount as String: "me", kSecValueData as String: Data("pw".utf8)]
        #expect(SecItemAdd(add as CFDictionary, nil) == errSecSuccess)
        var result: CFTypeRef? = "left over" as CFString
        var q: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc, kSecReturnRef as String: true]
        #expect(SecItemCopyMatching(q as CFDictionary, &result) == errSecSuccess)
        #expect(result == nil)
        q[kSecMatchLimit as String] = kSecMatchLimitAll
        #expect(SecItemCopyMatching(q as CFDictionary, &result) == errSecSuccess)
        #expect((result as? [Any])?.isEmpty == true)
        q[kSecReturnAttributes as String] = true
        #expect(SecItemCopyMatching(q as CFDictionary, &result) == errSecSuccess)
        let rows = try #require(result as? [[String: Any]])
        #expect(rows.count == 1)
        #expect(rows.first?[kSecAttrAccount as String] as? String == "me")
        #expect(rows.first?[kSecValueRef as String] == nil)
        #expect(rows.first?[kSecValueData as String] == nil)
        var none = q
        none[kSecAttrService as String] = svc + "-missing"
        #expect(SecItemCopyMatching(none as CFDictionary, &result) == errSecItemNotFound)
        // SecItemAdd asking for a reference gets none, and the item is added.
        var made: CFTypeRef? = "left over" as CFString
        let inet: [String: Any] = [kSecClass as String: kSecClassInternetPassword, kSecAttrServer as String: svc + ".example.com",
                                   kSecValueData as String: Data("pw".utf8), kSecReturnRef as String: true]
        #expect(SecItemAdd(inet as CFDictionary, &made) == errSecSuccess)
        #expect(made == nil)
    }

    /// A key's reference beside its attributes: a dictionary with kSecValueRef (a SecKey).
    @Test func aKeyReferenceComesWithItsAttributes() throws {
        let tag = Data(service().utf8)
        let attributes: [String: Any] = [kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom, kSecAttrKeySizeInBits as String: 256,
                                         kSecPrivateKeyAttrs as String: [kSecAttrIsPermanent as String: true, kSecAttrApplicationTag as String: tag]]
        let made = try #require(SecKeyCreateRandomKey(attributes as CFDictionary, nil))
        var found: CFTypeRef?
        let q: [String: Any] = [kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag, kSecReturnRef as String: true,
                                kSecReturnAttributes as String: true]
        #expect(SecItemCopyMatching(q as CFDictionary, &found) == errSecSuccess)
        let d = try #require(found as? [String: Any])
        let key = try #require(d[kSecValueRef as String] as? SecKey)
        #expect(d[kSecAttrApplicationTag as String] as? Data == tag)
        #expect(d[kSecValueData as String] == nil)
        #expect(SecKeyCopyExternalRepresentation(key, nil) as Data? == SecKeyCopyExternalRepresentation(made, nil) as Data?)
        // The key's reference names its item in a delete: that key goes, another stays.
        let otherTag = Data(service().utf8)
        var other = attributes
        other[kSecPrivateKeyAttrs as String] = [kSecAttrIsPermanent as String: true, kSecAttrApplicationTag as String: otherTag]
        _ = try #require(SecKeyCreateRandomKey(other as CFDictionary, nil))
        #expect(SecItemDelete([kSecValueRef as String: made] as CFDictionary) == errSecSuccess)
        #expect(SecItemCopyMatching(q as CFDictionary, &found) == errSecItemNotFound)
        var otherQuery = q
        otherQuery[kSecAttrApplicationTag as String] = otherTag
        #expect(SecItemCopyMatching(otherQuery as CFDictionary, &found) == errSecSuccess, "only the named key was deleted")
        #expect(SecItemDelete([kSecValueRef as String: made] as CFDictionary) == errSecItemNotFound)
    }
}
