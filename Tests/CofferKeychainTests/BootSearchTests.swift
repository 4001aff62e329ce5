import CofferKeychain
import CofferModel
import CofferTestSupport
import Testing

/// Before the first unlock, a search whose candidates span a locked class and an available one is
/// errSecInteractionNotAllowed (-25308), never the available class's items alone (SecItemSemantics.md,
/// Search; WireProtocol.md, the rule and its vector `boot-search-spans-classes`): a partial answer
/// would look complete (issue #44).
@Suite struct BootSearchTests {
    static func fixture() throws -> Fixture {
        let f = try Fixture(passcode: "pw")
        try f.addPassword(service: "db", account: "always", secret: "a", ["pdmn": .string("dk"), "agrp": .string("g")])
        try f.addPassword(service: "db", account: "unlocked", secret: "u", ["agrp": .string("g")])
        try f.reboot()
        #expect(f.keychain.status.lockState == .boot)
        return f
    }

    @Test(arguments: [MatchLimit.all, .one])
    func aSearchSpanningALockedClassIsInteractionNotAllowed(limit: MatchLimit) throws {
        let f = try Self.fixture()
        for scope in [AccessScope.unrestricted, AccessScope(groups: ["g"], defaultGroup: "g")] {
            var q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("db")], returnAttributes: true)
            q.limit = limit
            #expect(status { _ = try f.keychain.copyMatching(q, scope: scope) } == .interactionNotAllowed, "\(scope) \(limit)")
            q.returnAttributes = false
            q.returnData = true
            #expect(status { _ = try f.keychain.copyMatching(q, scope: scope) } == .interactionNotAllowed, "\(scope) \(limit)")
        }
        // Naming the available class alone reads it.
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("db"), "pdmn": .string("dk")], returnData: true)
        #expect(text(try f.keychain.copyMatching(q, scope: .unrestricted).first?.data) == "a")
    }
}
