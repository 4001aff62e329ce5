import CofferCrypto
import CofferKeychain
import CofferModel
import CofferTestSupport
import Testing

@Suite struct SecItemSemanticsTests {
    @Test func addThenCopyMatchingReturnsTheSecret() throws {
        let f = try Fixture()
        try f.addPassword(service: "mail", account: "alice", secret: "s3cret")
        #expect(try f.password(service: "mail", account: "alice") == "s3cret")
        #expect(try f.keychain.count() == 1)
    }

    @Test func duplicatesFollowApplesPrimaryKey() throws {
        let f = try Fixture()
        try f.addPassword(service: "mail", account: "alice", secret: "a")
        // pdmn is not part of the primary key: same service+account under another class is a duplicate.
        #expect(status { try f.addPassword(service: "mail", account: "alice", secret: "b", ["pdmn": .string("dk")]) } == .duplicateItem)
        #expect(status { try f.addPassword(service: "mail", account: "alice", secret: "b", ["labl": .string("other")]) } == .duplicateItem)
        try f.addPassword(service: "mail", account: "bob", secret: "b")
        try f.addPassword(service: "web", account: "alice", secret: "c")
        try f.addPassword(service: "mail", account: "alice", secret: "d", ["agrp": .string("team.shared")])
        // Internet passwords: port and path are part of the key.
        let inet: Attributes = ["srvr": .string("example.org"), "acct": .string("alice"), "ptcl": .string("htps"), "port": .integer(443)]
        try f.keychain.add(NewItem(itemClass: .internetPassword, attributes: inet, secret: secret("x")), scope: .unrestricted)
        #expect(status { try f.keychain.add(NewItem(itemClass: .internetPassword, attributes: inet, secret: secret("y")), scope: .unrestricted) } == .duplicateItem)
        var other = inet
        other["port"] = .integer(8443)
        try f.keychain.add(NewItem(itemClass: .internetPassword, attributes: other, secret: secret("z")), scope: .unrestricted)
        // A generic password with the same account is a different class: no clash.
        try f.addPassword(service: "example.org", account: "alice", secret: "w")
        #expect(try f.keychain.count() == 7)
        #expect(try f.password(service: "mail", account: "alice") == "a")
    }

    @Test func matchLimitOneAllAndN() throws {
        let f = try Fixture()
        for i in 0..<5 { try f.addPassword(service: "svc", account: "user\(i)", secret: "pw\(i)") }
        let base = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc")], returnAttributes: true)
        #expect(try f.keychain.copyMatching(base, scope: .unrestricted).count == 1)
        #expect(try f.keychain.copyMatching(base, scope: .unrestricted).first?.attributes?["acct"] == .string("user0"))
        var all = base
        all.limit = .all
        #expect(try f.keychain.copyMatching(all, scope: .unrestricted).count == 5)
        var three = base
        three.limit = .count(3)
        #expect(try f.keychain.copyMatching(three, scope: .unrestricted).map { $0.attributes?["acct"] } == ["user0", "user1", "user2"].map { .string($0) })
        var none = base
        none.attributes["acct"] = .string("nobody")
        #expect(status { try f.keychain.copyMatching(none, scope: .unrestricted) } == .itemNotFound)
        var zero = base
        zero.limit = .count(0)
        #expect(status { try f.keychain.copyMatching(zero, scope: .unrestricted) } == .param)
    }

    @Test func returnFlagsAndPersistentReferences() throws {
        let f = try Fixture()
        let added = try f.addPassword(service: "svc", account: "a", secret: "pw", ["labl": .string("My label")])
        let ref = try #require(added.persistentRef)
        #expect(ref.count == 16)
        let bare = try f.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc")]), scope: .unrestricted)
        #expect(bare.count == 1 && bare[0].data == nil && bare[0].attributes == nil && bare[0].persistentRef == nil)

        let byRef = try f.keychain.copyMatching(ItemQuery(returnData: true, returnAttributes: true, persistentRef: ref), scope: .unrestricted)
        #expect(text(byRef[0].data) == "pw")
        let attrs = try #require(byRef[0].attributes)
        #expect(attrs["labl"] == .string("My label"))
        #expect(attrs["pdmn"] == .string("ak"))
        #expect(attrs["agrp"] == .string("coffer.default"))
        #expect(attrs["sync"] == .bool(false))
        #expect(attrs["cdat"] != nil && attrs["mdat"] != nil)
        #expect(attrs["class"] == nil && byRef[0].itemClass == .genericPassword)
        #expect(status { try f.keychain.copyMatching(ItemQuery(persistentRef: [UInt8](repeating: 0, count: 16)), scope: .unrestricted) } == .itemNotFound)
        #expect(status { try f.keychain.copyMatching(ItemQuery(persistentRef: [1, 2]), scope: .unrestricted) } == .param)
    }

    /// Issue #42: several references in one query (a Secret Service GetSecrets of several items): those
    /// items, oldest first, each still matched against the rest of the query and the caller's scope;
    /// an unknown reference matches nothing; one named twice, or more than 256, is errSecParam.
    @Test func severalPersistentReferencesFindThoseItems() throws {
        let f = try Fixture()
        let refs = try (0..<4).map { i in try #require(f.addPassword(service: "svc", account: "a\(i)", secret: "pw\(i)").persistentRef) }
        let unknown = [UInt8](repeating: 7, count: 16)
        let before = f.keychain.searchCount
        let found = try f.keychain.copyMatching(ItemQuery(limit: .all, returnData: true, persistentRef: refs[3] + unknown + refs[1]),
                                                scope: .unrestricted)
        #expect(found.map { text($0.data) } == ["pw1", "pw3"])
        #expect(f.keychain.searchCount == before, "opening items by reference is not a search")
        let narrowed = try f.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("a3")], limit: .all,
                                                             returnData: true, persistentRef: refs[3] + refs[1]), scope: .unrestricted)
        #expect(narrowed.map { text($0.data) } == ["pw3"])
        #expect(try f.keychain.copyMatching(ItemQuery(limit: .one, returnData: true, persistentRef: refs[2] + refs[0]), scope: .unrestricted)
                    .map { text($0.data) } == ["pw0"])
        #expect(status { try f.keychain.copyMatching(ItemQuery(persistentRef: refs[0] + refs[0]), scope: .unrestricted) } == .param)
        #expect(status { try f.keychain.copyMatching(ItemQuery(persistentRef: refs[0] + [1]), scope: .unrestricted) } == .param)
        let tooMany = (0..<257).flatMap { i in [UInt8](repeating: 0, count: 14) + [UInt8(i >> 8), UInt8(i & 0xff)] }
        #expect(status { try f.keychain.copyMatching(ItemQuery(persistentRef: tooMany), scope: .unrestricted) } == .param)
        let other = AccessScope(groups: ["elsewhere"], defaultGroup: "elsewhere")
        #expect(status { try f.keychain.copyMatching(ItemQuery(persistentRef: refs[0] + refs[1]), scope: other) } == .itemNotFound)
        #expect(try f.keychain.delete(ItemQuery(limit: .all, persistentRef: refs[0] + refs[2]), scope: .unrestricted) == 2)
    }

    @Test func searchByNonIndexedAttributeAndAcrossClasses() throws {
        let f = try Fixture()
        try f.addPassword(service: "a", account: "x", secret: "1", ["desc": .string("deploy key")])
        try f.addPassword(service: "b", account: "x", secret: "2")
        try f.keychain.add(NewItem(itemClass: .key, attributes: ["atag": .data([1, 2, 3]), "kcls": .integer(1)], secret: secret("k")), scope: .unrestricted)
        let q = ItemQuery(attributes: ["desc": .string("deploy key")], limit: .all, returnData: true)
        #expect(try f.keychain.copyMatching(q, scope: .unrestricted).map { text($0.data) } == ["1"])
        #expect(try f.keychain.copyMatching(ItemQuery(limit: .all), scope: .unrestricted).count == 3)
        #expect(try f.keychain.copyMatching(ItemQuery(itemClass: .key, limit: .all), scope: .unrestricted).map(\.itemClass) == [.key])
        #expect(status { try f.keychain.copyMatching(ItemQuery(itemClass: .certificate), scope: .unrestricted) } == .itemNotFound)
    }

    @Test func badAttributesAreErrSecParam() throws {
        let f = try Fixture()
        #expect(status { try f.addPassword(service: "s", account: "a", secret: "x", ["bogus": .string("1")]) } == .param)
        #expect(status { try f.addPassword(service: "s", account: "a", secret: "x", ["port": .string("80")]) } == .param)
        #expect(status { try f.addPassword(service: "s", account: "a", secret: "x", ["srvr": .string("h")]) } == .param)
        #expect(status { try f.addPassword(service: "s", account: "a", secret: "x", ["pdmn": .string("sometimes")]) } == .param)
        #expect(status { try f.addPassword(service: "s", account: "a", secret: "x", ["cdat": .date(0)]) } == .param)
        #expect(status { try f.keychain.copyMatching(ItemQuery(attributes: ["nope": .bool(true)]), scope: .unrestricted) } == .param)
        #expect(status { try f.keychain.update(ItemQuery(), ItemChanges(), scope: .unrestricted) } == .param)
        #expect(try f.keychain.count() == 0)
    }

    @Test func updateSecretLabelAndAllMatches() throws {
        let f = try Fixture()
        try f.addPassword(service: "svc", account: "a", secret: "old")
        try f.addPassword(service: "svc", account: "b", secret: "old")
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("a")])
        #expect(try f.keychain.update(q, ItemChanges(secret: secret("new")), scope: .unrestricted) == 1)
        #expect(try f.password(service: "svc", account: "a") == "new")
        #expect(try f.password(service: "svc", account: "b") == "old")
        // Update applies to every match, regardless of kSecMatchLimit.
        let all = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("svc")])
        #expect(try f.keychain.update(all, ItemChanges(attributes: ["labl": .string("L")]), scope: .unrestricted) == 2)
        let labels = try f.keychain.copyMatching(ItemQuery(attributes: ["labl": .string("L")], limit: .all, returnAttributes: true), scope: .unrestricted)
        #expect(labels.count == 2)
        #expect(status { try f.keychain.update(ItemQuery(attributes: ["svce": .string("none")]), ItemChanges(secret: secret("x")), scope: .unrestricted) } == .itemNotFound)
    }

    @Test func updateIntoADuplicateChangesNothing() throws {
        let f = try Fixture()
        try f.addPassword(service: "svc", account: "a", secret: "A")
        try f.addPassword(service: "svc", account: "b", secret: "B")
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("b")])
        #expect(status { try f.keychain.update(q, ItemChanges(attributes: ["acct": .string("a")], secret: secret("C")), scope: .unrestricted) } == .duplicateItem)
        #expect(try f.password(service: "svc", account: "a") == "A")
        #expect(try f.password(service: "svc", account: "b") == "B")
        // Renaming to a free key works, and the old key no longer matches.
        #expect(try f.keychain.update(q, ItemChanges(attributes: ["acct": .string("c")]), scope: .unrestricted) == 1)
        #expect(try f.password(service: "svc", account: "c") == "B")
        #expect(status { try f.password(service: "svc", account: "b") } == .itemNotFound)
    }

    @Test func deleteRemovesEveryMatch() throws {
        let f = try Fixture()
        for i in 0..<3 { try f.addPassword(service: "svc", account: "u\(i)", secret: "p") }
        try f.addPassword(service: "keep", account: "u0", secret: "p")
        #expect(try f.keychain.delete(ItemQuery(attributes: ["svce": .string("svc")]), scope: .unrestricted) == 3)
        #expect(try f.keychain.count() == 1)
        #expect(status { try f.keychain.delete(ItemQuery(attributes: ["svce": .string("svc")]), scope: .unrestricted) } == .itemNotFound)
        // The deleted item can be added again.
        try f.addPassword(service: "svc", account: "u0", secret: "again")
        #expect(try f.password(service: "svc", account: "u0") == "again")
    }

    @Test func concurrentAddsFromManyThreadsAllLand() async throws {
        let f = try Fixture()
        let kc = f.keychain
        try await withThrowingTaskGroup(of: Void.self) { group in
            for t in 0..<8 {
                group.addTask {
                    for i in 0..<25 {
                        try kc.add(NewItem(itemClass: .genericPassword,
                                           attributes: ["svce": .string("t\(t)"), "acct": .string("\(i)")], secret: secret("\(t)-\(i)")), scope: .unrestricted)
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(try kc.count() == 200)
        #expect(try f.password(service: "t7", account: "24") == "7-24")
    }
}
