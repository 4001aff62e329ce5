@testable import CofferCrypto
import Testing

private func hex(_ b: [UInt8]) -> String { b.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() }
private func bytes(_ h: String) -> [UInt8] {
    let c = Array(h.filter { !$0.isWhitespace }.utf8)
    return stride(from: 0, to: c.count, by: 2).map { UInt8(String(decoding: c[$0..<$0 + 2], as: UTF8.self), radix: 16)! }
}
private func secure(_ b: [UInt8]) -> SecureBytes { unsafe b.withUnsafeBytes { unsafe SecureBytes(copying: $0) } }
private func plain(_ s: SecureBytes) -> [UInt8] { unsafe s.withUnsafeBytes { unsafe Array($0) } }

/// CPace over ristretto255 and SHA-512 against the vectors of draft-irtf-cfrg-cpace (appendix "Test
/// vector for CPace using group ristretto255 and hash SHA-512"; the draft's own numbers, copied here),
/// and the runs Coffer's pairing makes of it: same code, same key; another code, no key and a tag
/// that fails; a message that is no group element refused.
@Suite struct CPaceTests {
    static let prs = Array("Password".utf8)
    static let ci = bytes("0b415f696e69746961746f720b425f726573706f6e646572")
    static let sid = bytes("7e4b4791d6a8ef019b936c79fb7f2c57")
    static let ya = bytes("da3d23700a9e5699258aef94dc060dfda5ebb61f02a5ea77fad53f4ff0976d08")
    static let yb = bytes("d2316b454718c35362d83d69df6320f38578ed5984651435e2949762d900b80d")

    @Test func prependLengthAndLvCatAreTheDraftsLEB128() {
        #expect(CPace.prependLength(0) == [0x00])
        #expect(CPace.prependLength(127) == [0x7f])
        #expect(CPace.prependLength(128) == [0x80, 0x01])
        #expect(hex(CPace.lvCat([Array("1234".utf8), Array("5".utf8), Array("6789".utf8)])) == "04313233340135043637383" + "9")
    }

    @Test func theDraftsVectorsHold() throws {
        let gs = plain(CPace.generatorString(prs: secure(Self.prs), ci: Self.ci, sid: Self.sid))
        #expect(gs.count == 170)
        #expect(hex(gs) == """
            11435061636552697374726574746f3235350850617373776f726464\
            00000000000000000000000000000000000000000000000000000000\
            00000000000000000000000000000000000000000000000000000000\
            00000000000000000000000000000000000000000000000000000000\
            00000000000000000000000000000000180b415f696e69746961746f\
            720b425f726573706f6e646572107e4b4791d6a8ef019b936c79fb7f\
            2c57
            """)
        #expect(hex(plain(CPace.generator(prs: secure(Self.prs), ci: Self.ci, sid: Self.sid)))
                == "222b6b195fe84b1652badb6f6a3ae3d24341e7306967f0b8115b40d5698c7e56")
        let a = CPace.start(prs: secure(Self.prs), ci: Self.ci, sid: Self.sid, scalar: secure(Self.ya))
        let b = CPace.start(prs: secure(Self.prs), ci: Self.ci, sid: Self.sid, scalar: secure(Self.yb))
        #expect(hex(a.message) == "d6bac480f2c386c394efc7c47adb9925dcd2630b64f240c50f8d0eec482b9157")
        #expect(hex(b.message) == "3ea7e0b19560d7c0b0f5734f63b955286dfa8232b5ebe63324e2d9e7433f7258")
        let k = try #require(a.message.withUnsafeBytes { CPace.multiply(b.scalar, $0) })
        #expect(hex(plain(k)) == "80b69a8a76457ab6a4d7f887a4bf6b55a2f80ac19c333f917a05fc9887c8b40f")
        let ada = Array("ADa".utf8), adb = Array("ADb".utf8)
        let iskA = try #require(CPace.sessionKey(own: a, peerMessage: b.message, sid: Self.sid, ya: a.message, ada: ada, yb: b.message, adb: adb))
        let iskB = try #require(CPace.sessionKey(own: b, peerMessage: a.message, sid: Self.sid, ya: a.message, ada: ada, yb: b.message, adb: adb))
        let expected = "b69effbf61b51d56401c0f65601abe428de8206feaaf0e32198896dcae7b35cd2b38950a39dfd5d4a79164614c2984f7daa460b588c1e80c3fa2068af7900447"
        #expect(hex(plain(iskA)) == expected && hex(plain(iskB)) == expected)
    }

    @Test func anotherCodeGivesAnotherKeyAndTagsThatFail() throws {
        let ci = Array("coffer-sync pairing 1".utf8), sid = Random.bytes(16)
        let a = CPace.start(prs: secure(Array("ABCDEFGHIJKL".utf8)), ci: ci, sid: sid)
        let right = CPace.start(prs: secure(Array("ABCDEFGHIJKL".utf8)), ci: ci, sid: sid)
        let wrong = CPace.start(prs: secure(Array("ABCDEFGHIJKM".utf8)), ci: ci, sid: sid)
        func key(_ own: CPace.Party, _ peer: CPace.Party, initiator: Bool) throws -> [UInt8] {
            let (ya, yb) = initiator ? (own.message, peer.message) : (peer.message, own.message)
            return plain(try #require(CPace.sessionKey(own: own, peerMessage: peer.message, sid: sid, ya: ya, ada: [1], yb: yb, adb: [2])))
        }
        #expect(try key(a, right, initiator: true) == key(right, a, initiator: false))
        #expect(try key(a, wrong, initiator: true) != key(wrong, a, initiator: false))
        let isk = secure(try key(a, right, initiator: true)), other = secure(try key(wrong, a, initiator: false))
        let tag = CPace.confirmationTag(isk: isk, sid: sid, message: a.message, ad: [1])
        #expect(CPace.tagsEqual(tag, CPace.confirmationTag(isk: isk, sid: sid, message: a.message, ad: [1])))
        #expect(!CPace.tagsEqual(tag, CPace.confirmationTag(isk: other, sid: sid, message: a.message, ad: [1])))
        #expect(!CPace.tagsEqual(tag, CPace.confirmationTag(isk: isk, sid: sid, message: a.message, ad: [9])))
        #expect(!CPace.tagsEqual(tag, []))
    }

    @Test func aMessageThatIsNoGroupElementIsRefused() {
        let a = CPace.start(prs: secure(Array("code".utf8)), ci: [], sid: [1])
        for bad in [[UInt8](repeating: 0, count: 32), [UInt8](repeating: 0xff, count: 32), [UInt8](repeating: 1, count: 31)] {
            #expect(CPace.sessionKey(own: a, peerMessage: bad, sid: [1], ya: a.message, ada: [], yb: bad, adb: []) == nil)
        }
    }
}
