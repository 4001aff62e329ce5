import CofferTestSupport
import CofferKeychain
import CofferModel
import Testing

/// The keychain's access scope: rows outside it are invisible, writes outside it are refused, and the
/// same item in two groups is two items.
@Suite struct AccessScopeTests {
    let mail = AccessScope(groups: ["mail"], defaultGroup: "mail")
    let chat = AccessScope(groups: ["chat"], defaultGroup: "chat")

    func item(_ s: String = "pw", _ extra: Attributes = [:]) -> NewItem {
        NewItem(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string("me")].merging(extra) { $1 },
                secret: secret(s))
    }
    let query = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string("me")],
                          returnData: true, returnAttributes: true)

    @Test func accessGroupIsPartOfEveryPrimaryKey() {
        for c in ItemClass.allCases { #expect(c.primaryKey.contains("agrp")) }
    }

    @Test func theUnrestrictedScopeAddsToTheDefaultGroupAndSeesEveryGroup() throws {
        let f = try Fixture()
        try f.keychain.add(item(), scope: .unrestricted)
        try f.keychain.add(item("m"), scope: mail)
        let all = try f.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, limit: .all, returnAttributes: true), scope: .unrestricted)
        #expect(Set(all.compactMap { $0.attributes?["agrp"] }) == [.string("coffer.default"), .string("mail")])
    }

    @Test func rowsOutsideTheScopeAreInvisible() throws {
        let f = try Fixture()
        try f.keychain.add(item("for mail"), scope: mail)
        #expect(text(try f.keychain.copyMatching(query, scope: mail).first?.data) == "for mail")
        #expect(status { try f.keychain.copyMatching(query, scope: chat) } == .itemNotFound)
        #expect(status { try f.keychain.copyMatchingPage(query, scope: chat, after: 0) { _ in true } } == .itemNotFound)
        #expect(status { try f.keychain.update(query, ItemChanges(secret: secret("x")), scope: chat) } == .itemNotFound)
        #expect(status { try f.keychain.delete(query, scope: chat) } == .itemNotFound)
        // Naming the hidden group is an entitlement error (issue #13), the same whether or not it holds
        // anything: it says nothing about the items.
        var named = query
        named.attributes["agrp"] = AttributeValue.string("mail")
        #expect(status { try f.keychain.copyMatching(named, scope: chat) } == .missingEntitlement)
        #expect(status { try f.keychain.update(named, ItemChanges(secret: secret("x")), scope: chat) } == .missingEntitlement)
        #expect(status { try f.keychain.delete(named, scope: chat) } == .missingEntitlement)
        named.attributes["agrp"] = AttributeValue.string("empty.group")
        #expect(status { try f.keychain.copyMatching(named, scope: chat) } == .missingEntitlement)
        #expect(text(try f.keychain.copyMatching(query, scope: mail).first?.data) == "for mail", "the hidden row changed")
    }

    /// While locked, another group's item that the query's blind hashes find (its class key is gone,
    /// so it cannot be opened to see its group) is invisible, not "locked": the answer must not tell
    /// an app that another app has an item for this service and account.
    @Test func aLockedKeychainDoesNotRevealAnotherGroupsItems() throws {
        let f = try Fixture(passcode: "1234")
        try f.keychain.add(item("for mail"), scope: mail)
        let found = try f.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc")],
                                                          returnPersistentRef: true), scope: mail)
        let persistent = try #require(found.first?.persistentRef)
        #expect(f.keychain.lock())
        let attributesOnly = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string("me")],
                                       returnAttributes: true)
        let byService = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc")], limit: .all, returnAttributes: true)
        let everything = ItemQuery(limit: .all, returnAttributes: true)
        for q in [query, attributesOnly, byService, everything] {
            #expect(status { try f.keychain.copyMatching(q, scope: chat) } == .itemNotFound, "\(q)")
            #expect(status { try f.keychain.copyMatching(q, scope: mail) } == .interactionNotAllowed, "\(q)")
        }
        #expect(status { try f.keychain.update(attributesOnly, ItemChanges(secret: secret("x")), scope: chat) } == .itemNotFound)
        #expect(status { try f.keychain.delete(attributesOnly, scope: chat) } == .itemNotFound)
        let byRef = ItemQuery(itemClass: .genericPassword, returnAttributes: true, persistentRef: persistent)
        #expect(status { try f.keychain.copyMatching(byRef, scope: chat) } == .itemNotFound)
        #expect(status { try f.keychain.copyMatching(byRef, scope: mail) } == .interactionNotAllowed)
        // The unrestricted scope (the keychain library's own use) still says why it cannot answer.
        #expect(status { try f.keychain.copyMatching(attributesOnly, scope: .unrestricted) } == .interactionNotAllowed)
        try f.keychain.unlock(passcode: secret("1234"))
        #expect(text(try f.keychain.copyMatching(query, scope: mail).first?.data) == "for mail")
    }

    /// Before the first unlock the passcode tier's index key is not in memory, so a locked row's
    /// group cannot be read from its index entry: the caller's own WhenUnlocked item must not be
    /// skipped as "another group's" (a full listing would then succeed with only the Always items).
    @Test func beforeTheFirstUnlockAListingIsNotASilentPartialAnswer() throws {
        let f = try Fixture(passcode: "1234")
        try f.keychain.add(item("locked away"), scope: mail)
        try f.keychain.add(item("always", ["acct": .string("other"), "pdmn": .string("dk")]), scope: mail)
        try f.reboot()
        let everything = ItemQuery(limit: .all, returnAttributes: true)
        #expect(status { try f.keychain.copyMatching(everything, scope: mail) } == .interactionNotAllowed)
        #expect(status { try f.keychain.copyMatchingPage(everything, scope: mail, after: 0) { _ in true } } == .interactionNotAllowed)
        // The Always item alone is still there to be asked for by name.
        let always = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "acct": .string("other"),
                                                                         "pdmn": .string("dk")], returnData: true)
        #expect(text(try f.keychain.copyMatching(always, scope: mail).first?.data) == "always")
        try f.keychain.unlock(passcode: secret("1234"))
        #expect(try f.keychain.copyMatching(everything, scope: mail).count == 2)
    }

    @Test func writingIntoAGroupOutsideTheScopeIsMissingEntitlement() throws {
        let f = try Fixture()
        #expect(status { try f.keychain.add(item("x", ["agrp": .string("chat")]), scope: mail) } == .missingEntitlement)
        try f.keychain.add(item(), scope: mail)
        #expect(status { try f.keychain.update(query, ItemChanges(attributes: ["agrp": .string("chat")]), scope: mail) }
                == .missingEntitlement)
        #expect(try f.keychain.copyMatching(query, scope: mail).first?.attributes?["agrp"] == .string("mail"))
    }

    @Test func theSameItemInTwoGroupsIsNotADuplicate() throws {
        let f = try Fixture()
        try f.keychain.add(item("m"), scope: mail)
        try f.keychain.add(item("c"), scope: chat)
        #expect(status { try f.keychain.add(item("again"), scope: mail) } == .duplicateItem)
        #expect(text(try f.keychain.copyMatching(query, scope: mail).first?.data) == "m")
        #expect(text(try f.keychain.copyMatching(query, scope: chat).first?.data) == "c")
        #expect(try f.keychain.delete(query, scope: chat) == 1)
        #expect(text(try f.keychain.copyMatching(query, scope: mail).first?.data) == "m")
    }

    @Test func statusAndLockReportWhatChanged() throws {
        let f = try Fixture(passcode: "pass")
        #expect(f.keychain.status == LockStatus(lockState: .unlocked, passcodeSet: true))
        #expect(f.keychain.lock())
        #expect(!f.keychain.lock(), "a second lock changed nothing")
        #expect(f.keychain.status.lockState == .locked)
        try f.reboot()
        #expect(f.keychain.status == LockStatus(lockState: .boot, passcodeSet: true))
        #expect(!f.keychain.lock(), "locking in boot state changed nothing")
    }
}
