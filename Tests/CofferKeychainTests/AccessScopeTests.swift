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

    /// A search naming locked matches (ItemQuery.listsLockedItems, what the Secret Service front end
    /// sends): a locked match is its reference alone, told by its index entries, in the caller's
    /// groups only, matching every attribute the query names; an open one (Always) is whole; the
    /// reference reads the item once unlocked; paged and whole searches agree.
    @Test func aSearchNamingLockedMatchesGivesTheirReferences() throws {
        let f = try Fixture(passcode: "1234")
        try f.keychain.add(item("locked away", ["@kind": .string("web")]), scope: mail)
        try f.keychain.add(item("other kind", ["acct": .string("two"), "@kind": .string("ssh")]), scope: mail)
        try f.keychain.add(item("always", ["acct": .string("three"), "@kind": .string("web"), "pdmn": .string("dk")]), scope: mail)
        try f.keychain.add(item("chat's", ["@kind": .string("web")]), scope: chat)
        let refs = try f.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["@kind": .string("web")], limit: .all,
                                                         returnPersistentRef: true), scope: mail).compactMap(\.persistentRef)
        #expect(refs.count == 2)
        #expect(f.keychain.lock())
        var q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc"), "@kind": .string("web")], limit: .all,
                          returnAttributes: true, returnPersistentRef: true)
        #expect(status { try f.keychain.copyMatching(q, scope: mail) } == .interactionNotAllowed, "without the flag: as before")
        q.listsLockedItems = true
        let found = try f.keychain.copyMatching(q, scope: mail)
        #expect(found.count == 2, "\(found)")
        let locked = try #require(found.first { $0.locked })
        #expect(locked.attributes == nil && locked.data == nil && locked.itemClass == .genericPassword)
        #expect(locked.persistentRef == refs[0])
        let open = try #require(found.first { !$0.locked })
        #expect(open.attributes?["acct"] == .string("three") && open.persistentRef == refs[1])
        // Paged: the same answer.
        let page = try f.keychain.copyMatchingPage(q, scope: mail, after: 0) { _ in true }
        #expect(page.items.map(\.locked) == [true, false] && page.items.map(\.persistentRef) == found.map(\.persistentRef))
        // Another group's matching row is not named; nor is a row a query attribute rules out.
        #expect(try f.keychain.copyMatching(q, scope: chat).map(\.locked) == [true])
        var other = q
        other.attributes["@kind"] = .string("mail")
        #expect(status { try f.keychain.copyMatching(other, scope: mail) } == .itemNotFound)
        other.attributes = ["svce": .string("svc"), "pdmn": .string("dku")]
        #expect(status { try f.keychain.copyMatching(other, scope: mail) } == .itemNotFound, "pdmn is the row's clear class")
        other.attributes = ["svce": .string("svc"), "pdmn": .string("ak")]
        #expect(try f.keychain.copyMatching(other, scope: mail).map(\.locked) == [true, true])
        // Such a query must name the class, ask for references, use indexed attributes only.
        var anyClass = q, noRefs = q, unindexed = q, skipping = q
        anyClass.itemClass = nil
        noRefs.returnPersistentRef = false
        unindexed.attributes["desc"] = .string("x")
        skipping.skipUnreadable = true
        for bad in [anyClass, noRefs, unindexed, skipping] {
            #expect(status { try f.keychain.copyMatching(bad, scope: mail) } == .param, "\(bad)")
        }
        // Unlocked, the reference reads the item.
        try f.keychain.unlock(passcode: secret("1234"))
        let byRef = ItemQuery(itemClass: .genericPassword, returnData: true, persistentRef: refs[0])
        #expect(text(try f.keychain.copyMatching(byRef, scope: mail).first?.data) == "locked away")
        #expect(try f.keychain.copyMatching(q, scope: mail).allSatisfy { !$0.locked && $0.attributes != nil })
    }

    /// Before the first unlock a row of the passcode tier can be neither matched nor ruled out: a
    /// search naming locked matches is errSecInteractionNotAllowed as any other.
    @Test func beforeTheFirstUnlockASearchNamingLockedMatchesIsRefused() throws {
        let f = try Fixture(passcode: "1234")
        try f.keychain.add(item("locked away"), scope: mail)
        try f.reboot()
        var q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc")], limit: .all, returnPersistentRef: true)
        q.listsLockedItems = true
        #expect(status { try f.keychain.copyMatching(q, scope: mail) } == .interactionNotAllowed)
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
