import Foundation
import Security
import Testing

/// The CF types' objects equal their Swift values as AnyHashables, as on Apple platforms (FoundationParity.swift):
/// so two dictionaries holding the same Security constants, strings, data and booleans compare equal the way
/// Apple code compares them, and different ones do not.
@Suite struct FoundationParityTests {
    private func same(_ a: [String: Any], _ b: [String: Any]) -> Bool { NSDictionary(dictionary: a).isEqual(to: b) }

    private var query: [String: Any] {
        [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: "svc", kSecAttrAccount as String: "me",
         kSecValueData as String: Data("pw".utf8), kSecAttrSynchronizable as String: kCFBooleanTrue as Any,
         kSecMatchLimit as String: kSecMatchLimitAll, kSecAttrAccessible as String: kSecAttrAccessibleWhenUnlocked]
    }

    @Test func aQueryEqualsTheSameQueryAsAppleCodeComparesThem() {
        #expect(same(query, query))
        // The part of a larger query that names the same keys (SimpleKeychain's containsBaseQuery).
        var larger = query
        larger[kSecReturnAttributes as String] = kCFBooleanTrue
        let base = query
        #expect(same(larger.filter { base.keys.contains($0.key) }, base))
        // A value made another way but equal is equal: a Swift String for the constant, Data for NSData, true.
        var spelled = query
        spelled[kSecClass as String] = "genp"
        spelled[kSecValueData as String] = NSData(data: Data("pw".utf8))
        spelled[kSecAttrSynchronizable as String] = true
        #expect(same(spelled, query))
    }

    @Test func aQueryDiffersFromOneWithAnotherValue() {
        let changes: [(String, Any)] = [
            (kSecClass as String, kSecClassInternetPassword), (kSecAttrService as String, "other"),
            (kSecValueData as String, Data("pW".utf8)), (kSecAttrSynchronizable as String, kCFBooleanFalse as Any),
            (kSecMatchLimit as String, kSecMatchLimitOne), (kSecAttrSynchronizable as String, NSNumber(value: 1)),
        ]
        for (key, value) in changes {
            var other = query
            other[key] = value
            #expect(!same(other, query), "\(key) changed to \(value)")
        }
    }

    @Test func anObjectEqualsItsSwiftValueAsAnAnyHashable() {
        #expect(AnyHashable("genp" as NSString) == AnyHashable("genp"))
        #expect(AnyHashable(kSecClassGenericPassword) == AnyHashable(kSecClassGenericPassword as String))
        #expect(AnyHashable(kSecClassGenericPassword).hashValue == AnyHashable("genp").hashValue)
        #expect(AnyHashable(kCFBooleanTrue!) == AnyHashable(true))
        #expect(AnyHashable(kCFBooleanFalse!) == AnyHashable(false))
        #expect(AnyHashable("genp" as NSString) != AnyHashable("inet"))
        // An integer is not a boolean, and keeps equalling its Swift number.
        #expect(AnyHashable(NSNumber(value: 1)) != AnyHashable(true))
        #expect(AnyHashable(NSNumber(value: 7)) == AnyHashable(7))
        // A mutable string is taken as it was: changing it later changes nothing already hashed.
        let m = NSMutableString(string: "ab")
        let before = AnyHashable(m)
        m.append("c")
        #expect(before == AnyHashable("ab"))
        let set: Set<AnyHashable> = ["x" as NSString]
        #expect(set.contains("x"))
    }
}
