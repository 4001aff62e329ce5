import CofferCrypto
import CofferKeybag
@testable import CofferKeychain
import CofferModel
import CofferTestSupport
import Foundation
import Testing

/// General attributes (issue #26 part 4: `@NAME` string attributes, any name) in a real keychain file:
/// sealed, blind-indexed, searched by exact match on any subset, replaced as a set by an update, held to
/// their limits, isolated by access group, and added to items of a keychain the previous format wrote.
@Suite struct GeneralAttributeTests {
    static func general(_ pairs: [String: String]) -> Attributes {
        var out: Attributes = [:]
        for (k, v) in pairs { out[GeneralAttributes.key(k)] = .string(v) }
        return out
    }

    /// The accounts of the items a search for `pairs` (general attributes) finds, sorted; empty for none.
    static func accounts(_ kc: Keychain, _ pairs: [String: String], scope: AccessScope = .unrestricted) throws -> [String] {
        let q = ItemQuery(attributes: general(pairs), limit: .all, returnAttributes: true)
        do {
            return try kc.copyMatching(q, scope: scope).compactMap { r in
                if case .string(let a)? = r.attributes?["acct"] { return a }
                return nil
            }.sorted()
        } catch {
            guard error.status == .itemNotFound else { throw error }
            return []
        }
    }

    @Test func searchIsExactOnAnySubsetAndAnUpdateReplacesTheSet() throws {
        let f = try Fixture()
        let schema = "org.freedesktop.Secret.Generic"
        try f.addPassword(service: "s", account: "a", secret: "1", Self.general(["xdg:schema": schema, "env": "prod", "user": "alice"]))
        try f.addPassword(service: "s", account: "b", secret: "2", Self.general(["xdg:schema": schema, "env": "test", "user": "alice"]))
        try f.addPassword(service: "s", account: "c", secret: "3", Self.general(["xdg:schema": schema, "env": "prod"]))
        try f.addPassword(service: "s", account: "d", secret: "4")

        #expect(try Self.accounts(f.keychain, ["env": "prod"]) == ["a", "c"])
        #expect(try Self.accounts(f.keychain, ["xdg:schema": schema]) == ["a", "b", "c"])
        #expect(try Self.accounts(f.keychain, ["env": "prod", "user": "alice"]) == ["a"])
        #expect(try Self.accounts(f.keychain, ["xdg:schema": schema, "env": "prod", "user": "alice"]) == ["a"])
        // One value differing: no match. Exact: no prefix, no longer value, no other case, no name prefix.
        #expect(try Self.accounts(f.keychain, ["env": "prod", "user": "bob"]).isEmpty)
        #expect(try Self.accounts(f.keychain, ["env": "pro"]).isEmpty)
        #expect(try Self.accounts(f.keychain, ["env": "prod2"]).isEmpty)
        #expect(try Self.accounts(f.keychain, ["env": "PROD"]).isEmpty)
        #expect(try Self.accounts(f.keychain, ["en": "prod"]).isEmpty)
        #expect(try Self.accounts(f.keychain, ["env": ""]).isEmpty)
        // Byte for byte: a canonically equivalent spelling (ü as u + combining diaeresis) is another value,
        // also where the search reaches the item through its service + account entry.
        try f.addPassword(service: "u", account: "u", secret: "5", Self.general(["city": "Z\u{FC}rich"]))
        #expect(try Self.accounts(f.keychain, ["city": "Z\u{FC}rich"]) == ["u"])
        #expect(try Self.accounts(f.keychain, ["city": "Zu\u{308}rich"]).isEmpty)
        let equivalent = ItemQuery(attributes: ["svce": .string("u"), "acct": .string("u")].merging(Self.general(["city": "Zu\u{308}rich"])) { $1 })
        #expect(throws: SecError.self) { try f.keychain.copyMatching(equivalent, scope: .unrestricted) }
        // A general attribute named like a catalog one is not that attribute.
        #expect(try Self.accounts(f.keychain, ["acct": "a"]).isEmpty)
        // With catalog attributes, and returned with the item's other attributes.
        let q = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("s")].merging(Self.general(["env": "test"])) { $1 },
                          returnData: true, returnAttributes: true)
        let got = try #require(try f.keychain.copyMatching(q, scope: .unrestricted).first)
        #expect(text(got.data) == "2")
        #expect(got.attributes?.generalAttributes == ["xdg:schema": schema, "env": "test", "user": "alice"])

        // An update naming a general attribute leaves the item exactly the ones it gives.
        let n = try f.keychain.update(ItemQuery(attributes: Self.general(["env": "test"]), limit: .all),
                                      ItemChanges(attributes: Self.general(["env": "staging", "team": "ops"])), scope: .unrestricted)
        #expect(n == 1)
        #expect(try Self.accounts(f.keychain, ["env": "test"]).isEmpty)
        #expect(try Self.accounts(f.keychain, ["user": "alice"]) == ["a"])
        #expect(try Self.accounts(f.keychain, ["env": "staging", "team": "ops"]) == ["b"])
        // One naming none keeps them.
        try f.keychain.update(ItemQuery(attributes: ["acct": .string("b")], limit: .all), ItemChanges(attributes: ["labl": .string("B")]), scope: .unrestricted)
        #expect(try Self.accounts(f.keychain, ["team": "ops"]) == ["b"])
        // Still there after a restart (sealed in the row, indexed in the file).
        try f.reboot()
        #expect(try Self.accounts(f.keychain, ["env": "prod"]) == ["a", "c"])
        #expect(try f.keychain.delete(ItemQuery(attributes: Self.general(["env": "prod"]), limit: .all), scope: .unrestricted) == 2)
        #expect(try Self.accounts(f.keychain, ["xdg:schema": schema]).isEmpty)   // b's update removed it
        #expect(try Self.accounts(f.keychain, ["team": "ops"]) == ["b"])
        // `@` alone with the empty value leaves it none (the Secret Service's Attributes = {}).
        #expect(try f.keychain.update(ItemQuery(attributes: Self.general(["team": "ops"]), limit: .all),
                                      ItemChanges(attributes: [GeneralAttributes.noneKey: .string("")]), scope: .unrestricted) == 1)
        #expect(try Self.accounts(f.keychain, ["team": "ops"]).isEmpty)
        let b = try f.keychain.copyMatching(ItemQuery(attributes: ["acct": .string("b")], returnAttributes: true), scope: .unrestricted)
        #expect(b.first?.attributes?.generalAttributes == [:] && b.first?.attributes?["svce"] == .string("s"))
    }

    @Test func noNameOrValueIsInTheFileAndEveryOneIsIndexed() throws {
        let f = try Fixture()
        let name = "zq-name-7f3a", value = "zq-value-91be"
        try f.addPassword(service: "s", account: "a", secret: "1", Self.general([name: value]))
        f.keychain.checkpoint()
        let bytes = ["keychain.db", "keychain.db-wal"].flatMap { fileBytes(f.dir.file($0)) }
        #expect(bytes.count > 0)
        for needle in [name, value, "@" + name] {
            let n = Array(needle.utf8)
            #expect(!bytes.indices.contains { i in bytes[i...].starts(with: n) }, "'\(needle)' is in the database file")
        }
        // It has its own blind-index entry: one more than an item without it.
        try f.addPassword(service: "s", account: "b", secret: "2")
        let entries = sqlRows(f.dir.file("keychain.db"), "SELECT count(*) FROM attr_index GROUP BY item ORDER BY item")
        #expect(entries.count == 2 && entries.first.flatMap { Int(String(decoding: $0, as: UTF8.self)) }
                    == entries.last.flatMap { Int(String(decoding: $0, as: UTF8.self)) }.map { $0 + 1 })
    }

    @Test func limitsAreErrSecParam() throws {
        let f = try Fixture()
        func refused(_ attrs: Attributes) -> Bool {
            do {
                try f.addPassword(service: "s", account: UUID().uuidString, secret: "x", attrs)
                return false
            } catch {
                return (error as? SecError)?.status == .param
            }
        }
        let longName = String(repeating: "n", count: GeneralAttributes.maxNameBytes)
        #expect(!refused(Self.general([longName: "v", "e": ""])))
        #expect(refused(Self.general([longName + "n": "v"])))                                     // name too long
        #expect(refused([GeneralAttributes.key(""): .string("v")]))                             // empty name
        #expect(refused([GeneralAttributes.noneKey: .string("")]))                              // only an update's
        #expect(refused(Self.general(["a\nb": "v"])))                                          // control character
        #expect(refused([GeneralAttributes.key("n"): .integer(1)]))                            // not a string
        #expect(!refused(Self.general(["v": String(repeating: "v", count: GeneralAttributes.maxValueBytes)])))
        #expect(refused(Self.general(["v": String(repeating: "v", count: GeneralAttributes.maxValueBytes + 1)])))
        var many: [String: String] = [:]
        for i in 0..<GeneralAttributes.maxCount { many["k\(i)"] = "v" }
        #expect(!refused(Self.general(many)))
        many["one-more"] = "v"
        #expect(refused(Self.general(many)))
        var large: [String: String] = [:]
        for i in 0..<16 { large["k\(i)"] = String(repeating: "v", count: 4090) }               // 65,478 bytes
        large["k16"] = String(repeating: "v", count: 55)
        #expect(!refused(Self.general(large)))                                                 // 65,536 bytes
        large["k17"] = "v"
        #expect(refused(Self.general(large)))                                                  // 65,540 bytes
        // A query is held to the same limits; an update too.
        do {
            _ = try f.keychain.copyMatching(ItemQuery(attributes: Self.general([longName + "n": "v"])), scope: .unrestricted)
            Issue.record("an over-long name searched")
        } catch {
            #expect(error.status == .param)
        }
        do {
            try f.keychain.update(ItemQuery(attributes: ["svce": .string("s")], limit: .all), ItemChanges(attributes: Self.general(many)), scope: .unrestricted)
            Issue.record("too many general attributes set")
        } catch {
            #expect(error.status == .param)
        }
    }

    @Test func anotherGroupsItemWithTheSameAttributesIsNotFound() throws {
        let f = try Fixture()
        let mail = AccessScope(groups: ["mail"], defaultGroup: "mail"), chat = AccessScope(groups: ["chat"], defaultGroup: "chat")
        let same = Self.general(["xdg:schema": "org.example", "user": "alice"])
        for (scope, account) in [(mail, "m"), (chat, "c")] {
            try f.keychain.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("s"), "acct": .string(account)].merging(same) { $1 },
                                       secret: secret(account)), scope: scope)
        }
        #expect(try Self.accounts(f.keychain, ["user": "alice"], scope: mail) == ["m"])
        #expect(try Self.accounts(f.keychain, ["user": "alice", "xdg:schema": "org.example"], scope: chat) == ["c"])
        #expect(try f.keychain.delete(ItemQuery(attributes: same, limit: .all), scope: chat) == 1)
        #expect(try Self.accounts(f.keychain, ["user": "alice"], scope: chat).isEmpty)
        #expect(try Self.accounts(f.keychain, ["user": "alice"], scope: mail) == ["m"])
    }

    /// The state directory the agent and CLI of the previous format wrote (`Fixtures/schema3`: store
    /// schema 3): it opens as schema 7 (through 4, 5, 6 and 7, one transaction each), every item reads back and is found by its
    /// attributes, a general attribute given to a migrated item finds it, and a second open changes nothing.
    @Test func aSchema3KeychainMigratesAndItsItemsTakeGeneralAttributes() throws {
        let dir = try Fixtures.copy("schema3")
        let path = dir.file("keychain.db")
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("3".utf8)])
        let kc = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("7".utf8)])
        let expected: [(ItemClass, Attributes, String)] = [
            (.genericPassword, ["svce": .string("mail"), "acct": .string("alice"), "labl": .string("Mail (alice)"), "pdmn": .string("ak")], "pw-alice"),
            (.genericPassword, ["svce": .string("mail"), "acct": .string("bob"), "desc": .string("second"), "pdmn": .string("dk")], "pw-bob"),
            (.internetPassword, ["srvr": .string("example.org"), "acct": .string("carol"), "ptcl": .string("htps"), "port": .integer(443),
                                 "path": .string("/login"), "pdmn": .string("ck")], "pw-carol"),
            (.genericPassword, ["svce": .string("shared"), "acct": .string("dave"), "icmt": .string("comment"), "gena": .data([1, 2, 3, 4]),
                                "pdmn": .string("aku")], "pw-dave"),
            (.genericPassword, ["svce": .string("shared"), "acct": .string("erin"), "pdmn": .string("dku")], "pw-erin"),
        ]
        func expectIntact(_ kc: Keychain) throws {
            #expect(try kc.count() == expected.count)
            for (cls, attrs, pw) in expected {
                // Found by each indexed attribute alone and by all of them, with its secret and attributes.
                for probe in attrs.filter({ AttributeCatalog.indexed.contains($0.key) }).map({ [$0.key: $0.value] }) + [attrs] {
                    let got = try kc.copyMatching(ItemQuery(itemClass: cls, attributes: probe, limit: .all, returnData: true, returnAttributes: true),
                                                  scope: .unrestricted)
                    let mine = got.filter { $0.attributes?["acct"] == attrs["acct"] }
                    #expect(mine.count == 1 && text(mine.first?.data) == pw, "\(pw) by \(probe.keys.sorted())")
                    for (k, v) in attrs { #expect(mine.first?.attributes?[k] == v, "\(pw) \(k)") }
                    #expect(mine.first?.attributes?["agrp"] == .string("unsigned"))
                }
            }
        }
        try expectIntact(kc)
        // Migrated items take general attributes, and are found by them.
        #expect(try kc.update(ItemQuery(attributes: ["svce": .string("shared")], limit: .all),
                              ItemChanges(attributes: Self.general(["application": "coffer-test"])), scope: .unrestricted) == 2)
        #expect(try Self.accounts(kc, ["application": "coffer-test"]) == ["dave", "erin"])
        try kc.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("new")].merging(Self.general(["application": "coffer-test"])) { $1 },
                           secret: secret("n")), scope: .unrestricted)
        #expect(try Self.accounts(kc, ["application": "coffer-test"]).count == 2)   // the new item has no account
        #expect(try kc.copyMatching(ItemQuery(attributes: Self.general(["application": "coffer-test"]), limit: .all), scope: .unrestricted).count == 3)
        // A second open is a no-op; everything still reads.
        let again = try Keychain(directory: dir.path, lockingStateDirectory: false)
        #expect(sqlRows(path, "PRAGMA user_version") == [Array("7".utf8)])
        #expect(try Self.accounts(again, ["application": "coffer-test"]) == ["dave", "erin"])
        #expect(try again.delete(ItemQuery(attributes: ["svce": .string("new")], limit: .all), scope: .unrestricted) == 1)
        try expectIntact(again)
    }

    /// Names are in the order of their bytes, as the wire spec says (Swift's `<` on strings orders a
    /// decomposed é after z), and two spellings of one name are refused, in the codec and in an item.
    @Test func namesAreOrderedByTheirBytes() throws {
        let decomposed = GeneralAttributes.key("e\u{301}"), z = GeneralAttributes.key("z")
        let bytes = AttributeCodec.encode([decomposed: .string("1"), z: .string("2")])
        let expected: [UInt8] = [0, 2, 0, 4] + Array(decomposed.utf8) + [1, 0, 0, 0, 1] + Array("1".utf8)
            + [0, 2] + Array(z.utf8) + [1, 0, 0, 0, 1] + Array("2".utf8)
        #expect(bytes == expected)
        var r = ByteReader(bytes)
        #expect(try AttributeCodec.decodeAttributes(from: &r).generalAttributes == ["e\u{301}": "1", "z": "2"])
        let swapped: [UInt8] = [0, 2, 0, 2] + Array(z.utf8) + [1, 0, 0, 0, 1] + Array("2".utf8)
            + [0, 4] + Array(decomposed.utf8) + [1, 0, 0, 0, 1] + Array("1".utf8)
        let twice: [UInt8] = [0, 2, 0, 4] + Array(decomposed.utf8) + [1, 0, 0, 0, 0]
            + [0, 3] + Array(GeneralAttributes.key("\u{E9}").utf8) + [1, 0, 0, 0, 0]
        for (bad, why) in [(swapped, "not sorted"), (twice, "two spellings")] {
            var reader = ByteReader(bad)
            do {
                _ = try AttributeCodec.decodeAttributes(from: &reader)
                Issue.record("decoded names \(why)")
            } catch {
                #expect("\(error)".contains(why == "not sorted" ? "not sorted" : "two spellings"), "\(error)")
            }
        }
        // Through a keychain: both come back, each found by its own bytes.
        let f = try Fixture()
        try f.addPassword(service: "s", account: "a", secret: "1", [decomposed: .string("1"), z: .string("2")])
        #expect(try Self.accounts(f.keychain, ["e\u{301}": "1", "z": "2"]) == ["a"])
        #expect(try Self.accounts(f.keychain, ["\u{E9}": "1"]).isEmpty)
    }

    /// A passcode set (a rekey: rows re-sealed and re-indexed under the passcode tier's key) keeps
    /// them searchable, as a passcode change does.
    @Test func aRekeyReindexesThem() throws {
        let f = try Fixture()
        try f.addPassword(service: "s", account: "a", secret: "1", Self.general(["env": "prod"]))
        try f.addPassword(service: "s", account: "d", secret: "2", Self.general(["env": "prod", "pdmn": "x"]).merging(["pdmn": .string("dk")]) { $1 })
        try f.keychain.setPasscode(current: nil, new: secret("pc"), kdf: testKDF)
        #expect(try Self.accounts(f.keychain, ["env": "prod"]) == ["a", "d"])
        try f.keychain.setPasscode(current: secret("pc"), new: secret("pc2"), kdf: testKDF)
        #expect(try Self.accounts(f.keychain, ["env": "prod", "pdmn": "x"]) == ["d"])
        #expect(try Self.accounts(f.keychain, ["env": "prod"]) == ["a", "d"])
    }

    /// A backup keeps them: restored elsewhere, the item is found by them.
    @Test func aBackupCarriesThem() throws {
        let f = try Fixture(), other = try Fixture()
        try f.addPassword(service: "s", account: "a", secret: "1", Self.general(["xdg:schema": "org.example", "env": "prod"]))
        let (bytes, n) = try f.keychain.backup(password: secret("backup pw"), kdf: KDFParameters(opsLimit: 1, memLimit: UInt64(Argon2id.minimumMemory)))
        #expect(n == 1)
        _ = try other.keychain.restoreBackup(bytes, password: secret("backup pw"), dryRun: false)
        #expect(try Self.accounts(other.keychain, ["env": "prod", "xdg:schema": "org.example"]) == ["a"])
    }

    /// A database newer than this Coffer is refused, not opened (the guard schema 4 relies on).
    @Test func aNewerSchemaIsRefused() throws {
        let dir = try Fixtures.copy("schema3")
        let path = dir.file("keychain.db")
        CheckTests.damage(path, "PRAGMA user_version = 8")
        do {
            _ = try Keychain(directory: dir.path, lockingStateDirectory: false)
            Issue.record("a schema-8 database opened")
        } catch {
            #expect(error.status == .decode)
        }
    }
}
