import CofferCrypto
import Testing

/// `SecureBytes.wipe(_:)` zeroes one range (the keybag wipes one key slot of its arena with it).
@Suite struct SecureBytesRangeWipeTests {
    @Test func wipesExactlyTheRange() {
        let s = SecureBytes(count: 96)
        s.withUnsafeMutableBytes { for i in 0..<$0.count { $0[i] = 0xA5 } }
        s.wipe(32..<64)
        let bytes = s.withUnsafeBytes { Array($0) }
        #expect(bytes[..<32].allSatisfy { $0 == 0xA5 })
        #expect(bytes[32..<64].allSatisfy { $0 == 0 })
        #expect(bytes[64...].allSatisfy { $0 == 0xA5 })
    }

    @Test func emptyAndWholeRanges() {
        let s = SecureBytes(count: 32)
        s.withUnsafeMutableBytes { for i in 0..<$0.count { $0[i] = 7 } }
        s.wipe(10..<10)
        #expect(s.withUnsafeBytes { $0.allSatisfy { $0 == 7 } })
        s.wipe(0..<32)
        #expect(s.withUnsafeBytes { $0.allSatisfy { $0 == 0 } })
    }
}
