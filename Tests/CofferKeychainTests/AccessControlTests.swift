import CofferCrypto
import CofferKeybag
import CofferKeychain
import CofferModel
import CofferSystem
import Glibc
import CofferTestSupport
import Testing

/// The access-control rule itself (issue #14): its CLI and stored forms, and which authentications satisfy it.
@Suite struct AccessControlRuleTests {
    @Test func cliFormRoundTripsAndRejectsMixedOrUnknownJoiners() throws {
        for text in ["user-presence", "biometry-any,or,device-passcode", "biometry-current-set,and,device-passcode",
                     "biometry-any,or,device-passcode,or,user-presence"] {
            let a = try #require(AccessControl(parsing: text), "\(text)")
            #expect(a.description == text)
            #expect(AccessControl(encoded: a.encoded()) == a)
        }
        for bad in ["", "fingers", "user-presence,", "biometry-any,or", "biometry-any,xor,device-passcode",
                    "biometry-any,or,device-passcode,and,user-presence", "device-passcode,or,device-passcode", ",or,"] {
            #expect(AccessControl(parsing: bad) == nil, "\(bad)")
        }
    }

    @Test func onlyTheCanonicalEncodingDecodes() throws {
        let a = try #require(AccessControl(factors: [.biometryCurrentSet], operations: [.useSecret], domainState: [1, 2, 3]))
        let e = a.encoded()
        #expect(AccessControl(encoded: e) == a)
        #expect(AccessControl(encoded: e + [0]) == nil)            // trailing byte
        #expect(AccessControl(encoded: [2] + e.dropFirst()) == nil) // unknown version
        var badFactor = e; badFactor[3] = 99
        #expect(AccessControl(encoded: badFactor) == nil)
        var noOps = e; noOps[4] = 0
        #expect(AccessControl(encoded: noOps) == nil)
        // One factor is stored as `or`, so "and" with one factor is not a second encoding of it.
        var one = e; one[1] = AccessControl.Combination.and.rawValue
        #expect(AccessControl(encoded: one) == nil)
        #expect(AccessControl(encoded: []) == nil)
    }

    @Test func whichAuthenticationsSatisfyWhichFactors() throws {
        let passcode = AuthorizationContext(passcodeVerified: true)
        let finger = AuthorizationContext(biometryVerified: true, biometryDomainState: [7])
        let otherSet = AuthorizationContext(biometryVerified: true, biometryDomainState: [8])
        func rule(_ t: String, _ ds: [UInt8] = []) -> AccessControl { AccessControl(parsing: t)!.with(domainState: ds) }
        #expect(rule("user-presence").isSatisfied(by: passcode) && rule("user-presence").isSatisfied(by: finger))
        #expect(!rule("user-presence").isSatisfied(by: .none))
        #expect(rule("biometry-any").isSatisfied(by: finger) && !rule("biometry-any").isSatisfied(by: passcode))
        #expect(rule("biometry-current-set", [7]).isSatisfied(by: finger))
        #expect(!rule("biometry-current-set", [7]).isSatisfied(by: otherSet), "a changed enrolled set must not satisfy it")
        #expect(rule("device-passcode").isSatisfied(by: passcode) && !rule("device-passcode").isSatisfied(by: finger))
        #expect(rule("biometry-any,or,device-passcode").isSatisfied(by: passcode))
        #expect(!rule("biometry-any,and,device-passcode").isSatisfied(by: passcode))
        let both = AuthorizationContext(passcodeVerified: true, biometryVerified: true, biometryDomainState: [7])
        #expect(rule("biometry-any,and,device-passcode").isSatisfied(by: both))
    }
}

/// Items with an access control in the keychain: stored sealed with the item, checked on every
/// operation that touches it, against the decision the agent's policy made (AuthorizationContext).
@Suite struct AccessControlKeychainTests {
    static let presence = AccessControl(parsing: "user-presence")!
    static func item(_ acl: AccessControl?, service: String = "bank", _ extra: Attributes = [:]) -> NewItem {
        var attrs: Attributes = ["svce": .string(service), "acct": .string("me")]
        if let acl { attrs[AccessControl.attributeName] = .data(acl.encoded()) }
        attrs.merge(extra) { $1 }
        return NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret("pin 1234"))
    }
    static let query = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("bank")], limit: .all, returnData: true)

    @Test func anItemWithAnAccessControlNeedsAPasscodeAndStaysOnTheDevice() throws {
        let none = try Fixture()
        #expect(status { try none.keychain.add(Self.item(Self.presence), scope: .unrestricted) } == .notAvailable)
        let f = try Fixture(passcode: "pw")
        #expect(status { try f.keychain.add(Self.item(Self.presence, ["pdmn": .string("ak")]), scope: .unrestricted) } == .param)
        let r = try f.keychain.add(Self.item(Self.presence), scope: .unrestricted, returnAttributes: true)
        #expect(r.attributes?["pdmn"] == .string("aku"), "defaults to WhenUnlockedThisDeviceOnly")
        #expect(r.attributes?[AccessControl.attributeName] == .data(Self.presence.encoded()))
        // It cannot be moved off the device or have its rule changed.
        let match = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("bank")], limit: .all)
        let passcode = AuthorizationContext(passcodeVerified: true)
        #expect(status { try f.keychain.update(match, ItemChanges(attributes: ["pdmn": .string("ck")]), scope: .unrestricted, authorization: passcode) } == .param)
        // Nor moved to another ThisDeviceOnly class: AlwaysThisDeviceOnly would let the device key alone
        // open it offline, around its read rule. Naming the class it has is no change.
        for other in ["dku", "cku", "akpu"] {
            #expect(status { try f.keychain.update(match, ItemChanges(attributes: ["pdmn": .string(other)]), scope: .unrestricted, authorization: passcode) } == .param, "\(other)")
        }
        #expect(try f.keychain.update(match, ItemChanges(attributes: ["pdmn": .string("aku"), "labl": .string("renamed")]), scope: .unrestricted, authorization: passcode) == 1)
        let kept = try f.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("bank")], limit: .all,
                                                         returnAttributes: true), scope: .unrestricted, authorization: passcode)
        #expect(kept.first?.attributes?["pdmn"] == .string("aku") && kept.first?.attributes?["labl"] == .string("renamed"))
        #expect(status { try f.keychain.update(match, ItemChanges(attributes: [AccessControl.attributeName: .data(AccessControl(parsing: "device-passcode")!.encoded())]), scope: .unrestricted,
                                               authorization: passcode) } == .param)
        // Malformed rules, a current-set rule without the domain state the agent records, a search on the rule.
        #expect(status { try f.keychain.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("x"), "accc": .data([1, 2])], secret: secret("s")), scope: .unrestricted) } == .param)
        #expect(status { try f.keychain.add(Self.item(AccessControl(parsing: "biometry-current-set")!, service: "y"), scope: .unrestricted) } == .param)
        #expect(status { try f.keychain.add(Self.item(AccessControl(parsing: "application-password")!, service: "z"), scope: .unrestricted) } == .authFailed,
                "an application-password item needs its password when it is made")
        #expect(status { try f.keychain.add(Self.item(AccessControl(parsing: "biometry-any,or,application-password")!, service: "z"), scope: .unrestricted,
                                            applicationPassword: secret("apw")) } == .param)
        var searchOnRule = match
        searchOnRule.attributes[AccessControl.attributeName] = .data(Self.presence.encoded())
        #expect(status { try f.keychain.copyMatching(searchOnRule, scope: .unrestricted) } == .param)
    }

    /// Issue #42: the refusal of a first page that needs the person carries a match handle; given back
    /// with the authentication, the page opens the attempt's rows without searching the indexes again
    /// (one search for a protected read). Anything written in between voids the handle: the page then
    /// searches again and sees the change. A handle never widens a query: each row is compared in full.
    @Test func theRetryOpensTheAttemptsMatchesUnlessTheKeychainChanged() throws {
        let f = try Fixture(passcode: "pw")
        try f.keychain.add(Self.item(Self.presence, service: "bank"), scope: .unrestricted)
        try f.keychain.add(Self.item(nil, service: "bank", ["acct": .string("other")]), scope: .unrestricted)
        try f.keychain.add(Self.item(Self.presence, service: "shop"), scope: .unrestricted)
        let passcode = AuthorizationContext(passcodeVerified: true)
        func attempt(_ q: ItemQuery) throws -> MatchHandle {
            do {
                _ = try f.keychain.copyMatchingPage(q, scope: .unrestricted, after: 0) { _ in true }
            } catch {
                #expect(error.needsAuthentication)
                return try #require(error.matchHandle, "\(error)")
            }
            Issue.record("a protected read was answered without authentication")
            throw SecError.itemNotFound()
        }
        func secrets(_ page: Keychain.MatchPage) -> [String] { page.items.map { text($0.data) ?? "?" } }
        let bank = Self.query
        let handle = try attempt(bank)
        #expect(handle.rowIDs.count == 2 && handle.complete)
        var searches = f.keychain.searchCount
        let retried = try f.keychain.copyMatchingPage(bank, scope: .unrestricted, after: 0, authorization: passcode, matching: handle) { _ in true }
        #expect(f.keychain.searchCount == searches, "the retry searched the indexes again")
        let searched = try f.keychain.copyMatchingPage(bank, scope: .unrestricted, after: 0, authorization: passcode) { _ in true }
        #expect(secrets(retried) == secrets(searched) && retried.items.count == 2 && retried.isComplete)
        // Another query given this handle still gets only its own matches.
        var narrower = bank
        narrower.attributes["acct"] = .string("other")
        #expect(secrets(try f.keychain.copyMatchingPage(narrower, scope: .unrestricted, after: 0, authorization: passcode, matching: handle) { _ in true }) == ["pin 1234"])
        // A write between the attempt and the retry (another match added while the person was asked):
        // the handle is void, the retry searches and finds the new item too.
        let stale = try attempt(bank)
        try f.keychain.add(Self.item(nil, service: "bank", ["acct": .string("third")]), scope: .unrestricted)
        searches = f.keychain.searchCount
        let after = try f.keychain.copyMatchingPage(bank, scope: .unrestricted, after: 0, authorization: passcode, matching: stale) { _ in true }
        #expect(f.keychain.searchCount == searches + 1 && after.items.count == 3)
        // A deleted match: void too, and the deleted item is not returned.
        let beforeDelete = try attempt(bank)
        #expect(try f.keychain.delete(ItemQuery(itemClass: .genericPassword, attributes: ["acct": .string("third")], limit: .all),
                                      scope: .unrestricted) == 1)
        #expect(try f.keychain.copyMatchingPage(bank, scope: .unrestricted, after: 0, authorization: passcode, matching: beforeDelete) { _ in true }.items.count == 2)
    }

    /// Issue #42: a grant for one item (what a Secret Service prompt gives the client's process) opens
    /// that item alone; the refusal names the protected matches (the grant's targets); the access-state
    /// flag tells per match whether its secret needs the person, grants and held authorization counted.
    @Test func aGrantOpensItsItemAloneAndTheAccessStateTellsWhichNeedThePerson() throws {
        let f = try Fixture(passcode: "pw")
        let a = try f.keychain.add(Self.item(Self.presence, service: "bank"), scope: .unrestricted, returnPersistentRef: true)
        let b = try f.keychain.add(Self.item(Self.presence, service: "shop"), scope: .unrestricted, returnPersistentRef: true)
        try f.keychain.add(Self.item(nil, service: "plain"), scope: .unrestricted)
        let refA = try #require(a.persistentRef), refB = try #require(b.persistentRef)
        let every = ItemQuery(itemClass: .genericPassword, limit: .all, returnData: true)
        // The refusal names both protected matches, never the plain one.
        do {
            _ = try f.keychain.copyMatching(every, scope: .unrestricted)
            Issue.record("a protected read was answered without authentication")
        } catch {
            #expect(error.needsAuthentication && Set(error.accessTargets) == [refA, refB], "\(error)")
        }
        // A grant for `bank` reads `bank` (and the plain item), not `shop`.
        let granted: [[UInt8]: AuthorizationContext] = [refA: AuthorizationContext(passcodeVerified: true)]
        let bank = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("bank")], limit: .all, returnData: true)
        #expect(text(try f.keychain.copyMatching(bank, scope: .unrestricted, grants: granted).first?.data) == "pin 1234")
        #expect(text(try f.keychain.copyMatchingPage(bank, scope: .unrestricted, after: 0, grants: granted) { _ in true }.items.first?.data) == "pin 1234")
        #expect(status { try f.keychain.copyMatching(every, scope: .unrestricted, grants: granted) } == .interactionNotAllowed)
        // A grant that does not satisfy the rule (biometry for a passcode-only rule) opens nothing.
        let passcodeOnly = try f.keychain.add(Self.item(AccessControl(parsing: "device-passcode")!, service: "tax"), scope: .unrestricted,
                                              returnPersistentRef: true)
        let wrong: [[UInt8]: AuthorizationContext] = [try #require(passcodeOnly.persistentRef): AuthorizationContext(biometryVerified: true)]
        let tax = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("tax")], limit: .all, returnData: true)
        #expect(status { try f.keychain.copyMatching(tax, scope: .unrestricted, grants: wrong) } == .interactionNotAllowed)
        // The access state: per match, with the grants and with what the caller holds.
        var listing = ItemQuery(itemClass: .genericPassword, limit: .all, returnAttributes: true, returnPersistentRef: true)
        listing.reportsAccessState = true
        func needs(_ results: [ItemResult]) -> [String: Bool] {
            var out: [String: Bool] = [:]
            for r in results { if case .string(let s)? = r.attributes?["svce"] { out[s] = r.needsAuthentication } }
            return out
        }
        #expect(needs(try f.keychain.copyMatching(listing, scope: .unrestricted)) == ["bank": true, "shop": true, "plain": false, "tax": true])
        #expect(needs(try f.keychain.copyMatching(listing, scope: .unrestricted, grants: granted)) == ["bank": false, "shop": true, "plain": false, "tax": true])
        #expect(needs(try f.keychain.copyMatchingPage(listing, scope: .unrestricted, after: 0, authorization: AuthorizationContext(passcodeVerified: true)) { _ in true }.items)
                == ["bank": false, "shop": false, "plain": false, "tax": false])
        // Without the flag nothing is told.
        listing.reportsAccessState = false
        #expect(try f.keychain.copyMatching(listing, scope: .unrestricted).allSatisfy { !$0.needsAuthentication })
    }

    @Test func theSecretNeedsTheAuthenticationButTheAttributesDoNot() throws {
        let f = try Fixture(passcode: "pw")
        try f.keychain.add(Self.item(Self.presence), scope: .unrestricted)
        try f.keychain.add(Self.item(nil, service: "plain"), scope: .unrestricted)
        #expect(status { try f.keychain.copyMatching(Self.query, scope: .unrestricted) } == .interactionNotAllowed)
        #expect(status { try f.keychain.copyMatchingPage(Self.query, scope: .unrestricted, after: 0) { _ in true } } == .interactionNotAllowed)
        var attributesOnly = Self.query
        attributesOnly.returnData = false
        attributesOnly.returnAttributes = true
        #expect(try f.keychain.copyMatching(attributesOnly, scope: .unrestricted).count == 1)
        #expect(text(try f.keychain.copyMatching(Self.query, scope: .unrestricted, authorization: AuthorizationContext(passcodeVerified: true)).first?.data) == "pin 1234")
        // An unprotected item needs nothing.
        #expect(try f.password(service: "plain", account: "me") == "pin 1234")
        // What the policy must satisfy: the rule, for reading the secret; nothing for the plain item.
        #expect(try f.keychain.accessRequirements(Self.query, scope: .unrestricted, for: .useSecret) == [Self.presence])
        let plain = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("plain")], limit: .all, returnData: true)
        #expect(try f.keychain.accessRequirements(plain, scope: .unrestricted, for: .useSecret).isEmpty)
    }

    @Test func updateAndDeleteAreGuardedUnlessTheRuleLeavesThemOut() throws {
        let f = try Fixture(passcode: "pw")
        try f.keychain.add(Self.item(Self.presence), scope: .unrestricted)
        let match = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("bank")], limit: .all)
        #expect(status { try f.keychain.update(match, ItemChanges(secret: secret("new")), scope: .unrestricted) } == .interactionNotAllowed)
        #expect(status { try f.keychain.delete(match, scope: .unrestricted) } == .interactionNotAllowed)
        #expect(try f.keychain.accessRequirements(match, scope: .unrestricted, for: .delete) == [Self.presence])
        #expect(try f.keychain.count() == 1, "a refused delete deleted something")
        let finger = AuthorizationContext(biometryVerified: true, biometryDomainState: [1])
        #expect(try f.keychain.update(match, ItemChanges(secret: secret("new")), scope: .unrestricted, authorization: finger) == 1)
        #expect(text(try f.keychain.copyMatching(Self.query, scope: .unrestricted, authorization: finger).first?.data) == "new")
        // A rule for the secret only: delete and update need nothing.
        let readOnly = AccessControl(factors: [.devicePasscode], operations: [.useSecret])!
        try f.keychain.add(Self.item(readOnly, service: "reader"), scope: .unrestricted)
        let reader = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("reader")], limit: .all)
        #expect(try f.keychain.update(reader, ItemChanges(attributes: ["labl": .string("x")]), scope: .unrestricted) == 1)
        #expect(try f.keychain.delete(reader, scope: .unrestricted) == 1)
        #expect(try f.keychain.delete(match, scope: .unrestricted, authorization: AuthorizationContext(passcodeVerified: true)) == 1)
    }

    @Test func theRuleSurvivesAPasscodeChangeAndARestart() throws {
        let f = try Fixture(passcode: "pw")
        try f.keychain.add(Self.item(Self.presence), scope: .unrestricted)
        try f.keychain.setPasscode(current: secret("pw"), new: secret("pw2"), kdf: testKDF)
        try f.reboot()
        try f.keychain.unlock(passcode: secret("pw2"))
        #expect(status { try f.keychain.copyMatching(Self.query, scope: .unrestricted) } == .interactionNotAllowed)
        #expect(text(try f.keychain.copyMatching(Self.query, scope: .unrestricted, authorization: AuthorizationContext(passcodeVerified: true)).first?.data) == "pin 1234")
    }

    @Test func anApplicationPasswordItemOpensOnlyWithItsPassword() throws {
        let f = try Fixture(passcode: "pw")
        let rule = AccessControl(parsing: "application-password")!
        try f.keychain.add(Self.item(rule), scope: .unrestricted, applicationPassword: secret("open sesame"))
        try f.keychain.add(Self.item(AccessControl(parsing: "device-passcode,and,application-password")!, service: "both"), scope: .unrestricted,
                           applicationPassword: secret("both pw"))
        // No password: the rule is not satisfied. A wrong one: the cryptography refuses.
        #expect(status { try f.keychain.copyMatching(Self.query, scope: .unrestricted) } == .interactionNotAllowed)
        #expect(status { try f.keychain.copyMatching(Self.query, scope: .unrestricted, authorization: AuthorizationContext(applicationPassword: secret("guess"))) }
                == .authFailed)
        #expect(text(try f.keychain.copyMatching(Self.query, scope: .unrestricted, authorization: AuthorizationContext(applicationPassword: secret("open sesame"))).first?.data)
                == "pin 1234")
        // "and": the passcode and the password.
        let both = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("both")], limit: .all, returnData: true)
        #expect(status { try f.keychain.copyMatching(both, scope: .unrestricted, authorization: AuthorizationContext(applicationPassword: secret("both pw"))) }
                == .interactionNotAllowed)
        #expect(text(try f.keychain.copyMatching(both, scope: .unrestricted, authorization: AuthorizationContext(passcodeVerified: true, applicationPassword: secret("both pw"))).first?.data)
                == "pin 1234")
        // An update that keeps the secret re-seals it under the same password; a passcode change keeps it readable.
        let match = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("bank")], limit: .all)
        #expect(try f.keychain.update(match, ItemChanges(attributes: ["labl": .string("renamed")]), scope: .unrestricted,
                                      authorization: AuthorizationContext(applicationPassword: secret("open sesame"))) == 1)
        try f.keychain.setPasscode(current: secret("pw"), new: secret("pw2"), kdf: testKDF)
        #expect(text(try f.keychain.copyMatching(Self.query, scope: .unrestricted, authorization: AuthorizationContext(applicationPassword: secret("open sesame"))).first?.data)
                == "pin 1234")
        // Neither deleting nor replacing the secret opens it, yet a wrong password does not do either:
        // it is proven first (errSecAuthFailed), and the item is as it was.
        let guess = AuthorizationContext(applicationPassword: secret("guess"))
        #expect(status { try f.keychain.update(match, ItemChanges(secret: secret("attacker's")), scope: .unrestricted, authorization: guess) } == .authFailed)
        #expect(status { try f.keychain.delete(match, scope: .unrestricted, authorization: guess) } == .authFailed)
        #expect(text(try f.keychain.copyMatching(Self.query, scope: .unrestricted, authorization: AuthorizationContext(applicationPassword: secret("open sesame"))).first?.data)
                == "pin 1234")
        // "and" with the passcode: the password is proven too; the right one does both.
        let bothMatch = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("both")], limit: .all)
        #expect(status { try f.keychain.delete(bothMatch, scope: .unrestricted, authorization: AuthorizationContext(passcodeVerified: true, applicationPassword: secret("guess"))) }
                == .authFailed)
        let right = AuthorizationContext(applicationPassword: secret("open sesame"))
        #expect(try f.keychain.update(match, ItemChanges(secret: secret("new pin")), scope: .unrestricted, authorization: right) == 1)
        #expect(text(try f.keychain.copyMatching(Self.query, scope: .unrestricted, authorization: right).first?.data) == "new pin")
        #expect(try f.keychain.delete(match, scope: .unrestricted, authorization: right) == 1)
        #expect(try f.keychain.delete(bothMatch, scope: .unrestricted, authorization: AuthorizationContext(passcodeVerified: true, applicationPassword: secret("both pw"))) == 1)
    }

    /// A stolen copy of the whole state directory, with the device key and the passcode (so every
    /// class key unwraps), still cannot open an application-password item: even a context that claims
    /// the password was given (bypassing the rule check) meets the cryptography.
    @Test func aStolenCopyWithTheDeviceKeyAndThePasscodeCannotReadIt() throws {
        let f = try Fixture(passcode: "pw")
        try f.keychain.add(Self.item(AccessControl(parsing: "application-password")!), scope: .unrestricted, applicationPassword: secret("open sesame"))
        let thief = TemporaryDirectory("coffer-thief")
        for name in ["device.key", "keybag", "keybag.key", "keychain.db", "keychain.db-wal", "keychain.db-shm"] where Files.exists(f.dir.file(name)) {
            writeFileBytes(thief.file(name), fileBytes(f.dir.file(name)))
            chmod(thief.file(name), 0o600)
        }
        let stolen = try Keychain(directory: thief.path, lockingStateDirectory: false)
        try stolen.unlock(passcode: secret("pw"))
        for guess in ["", "pw", "open sesam", "Open sesame"] where !guess.isEmpty {
            #expect(status { try stolen.copyMatching(Self.query, scope: .unrestricted, authorization: AuthorizationContext(passcodeVerified: true, applicationPassword: secret(guess))) }
                    == .authFailed, "\(guess)")
        }
        #expect(text(try stolen.copyMatching(Self.query, scope: .unrestricted, authorization: AuthorizationContext(applicationPassword: secret("open sesame"))).first?.data)
                == "pin 1234", "only the password opens it")
    }

    /// Removing the passcode (issue #16 item 3): WhenPasscodeSet items are deleted, the others are
    /// re-keyed under the device key and stay readable (also after a restart, without unlocking), and
    /// items with an access control stay but need a passcode nobody can give.
    @Test func removingThePasscodeDeletesWhenPasscodeSetItemsAndKeepsTheRest() throws {
        let f = try Fixture(passcode: "pw")
        try f.addPassword(service: "wpc", account: "me", secret: "gone", ["pdmn": .string("akpu")])
        try f.addPassword(service: "wu", account: "me", secret: "kept1")
        try f.addPassword(service: "afu", account: "me", secret: "kept2", ["pdmn": .string("ck")])
        try f.addPassword(service: "always", account: "me", secret: "kept3", ["pdmn": .string("dk")])
        try f.keychain.add(Self.item(Self.presence, service: "guarded"), scope: .unrestricted)
        #expect(status { try f.keychain.removePasscode(current: secret("wrong")) } == .authFailed)
        #expect(try f.password(service: "wpc", account: "me") == "gone", "a refused removal changed something")
        try f.keychain.removePasscode(current: secret("pw"))
        #expect(!f.keychain.status.passcodeSet)
        #expect(try f.keychain.count() == 4)
        #expect(status { try f.password(service: "wpc", account: "me") } == .itemNotFound)
        try f.reboot()
        #expect(f.keychain.status.lockState == .unlocked, "no passcode: always unlocked")
        #expect(try f.password(service: "wu", account: "me") == "kept1")
        #expect(try f.password(service: "afu", account: "me") == "kept2")
        #expect(try f.password(service: "always", account: "me") == "kept3")
        #expect(status { try f.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("guarded")], returnData: true), scope: .unrestricted) }
                == .interactionNotAllowed)
        // A passcode can be set again; the guarded item then opens with it.
        try f.keychain.setPasscode(current: nil, new: secret("pw2"), kdf: testKDF)
        #expect(text(try f.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("guarded")], returnData: true), scope: .unrestricted,
                                                  authorization: AuthorizationContext(passcodeVerified: true)).first?.data) == "pin 1234")
    }
}

/// The escrow keybag (issue #16 item 6).
@Suite struct EscrowTests {
    @Test func anEscrowSecretUnlocksAfterARestartOnThisDeviceOnlyUntilTheKeysChange() throws {
        let f = try Fixture(passcode: "pw")
        try f.addPassword(service: "server", account: "db", secret: "s3", ["pdmn": .string("ck")])
        try f.addPassword(service: "wu", account: "db", secret: "s4")
        let secretBytes = try f.keychain.createEscrow()
        #expect(f.keychain.hasEscrow && Files.mode(f.dir.file(Keychain.escrowFileName)) == 0o600)
        try f.reboot()
        #expect(f.keychain.status.lockState == .boot)
        #expect(status { try f.keychain.unlock(escrowSecret: secret(count: 32)) } == .authFailed)
        try f.keychain.unlock(escrowSecret: secretBytes)
        #expect(f.keychain.status.lockState == .unlocked)
        #expect(try f.password(service: "server", account: "db") == "s3")
        #expect(try f.password(service: "wu", account: "db") == "s4")
        // On another device (another device key) the record opens nothing.
        let other = TemporaryDirectory("coffer-escrow-other")
        for name in ["keybag", "keybag.key", "keychain.db", Keychain.escrowFileName] {
            writeFileBytes(other.file(name), fileBytes(f.dir.file(name)))
            chmod(other.file(name), 0o600)
        }
        writeFileBytes(other.file("device.key"), Array(repeating: 7, count: 32))
        chmod(other.file("device.key"), 0o600)
        if let elsewhere = try? Keychain(directory: other.path, lockingStateDirectory: false) {
            #expect(status { try elsewhere.unlock(escrowSecret: secretBytes) } != nil)
        }
        // A passcode change rotates the keys: the record is stale.
        let copy = fileBytes(f.dir.file(Keychain.escrowFileName))
        try f.keychain.setPasscode(current: secret("pw"), new: secret("pw2"), kdf: testKDF)
        try f.reboot()
        #expect(status { try f.keychain.unlock(escrowSecret: secretBytes) } == .authFailed)
        // Deleted: not found; a copy of the old record stays stale.
        f.keychain.deleteEscrow()
        #expect(status { try f.keychain.unlock(escrowSecret: secretBytes) } == .itemNotFound)
        writeFileBytes(f.dir.file(Keychain.escrowFileName), copy)
        #expect(status { try f.keychain.unlock(escrowSecret: secretBytes) } == .authFailed)
        // Locked: no escrow can be made.
        try f.keychain.unlock(passcode: secret("pw2"))
        _ = f.keychain.lock()
        #expect(status { _ = try f.keychain.createEscrow() } == .interactionNotAllowed)
    }
}

/// An erase (too many failed attempts) or a keybag created afresh leaves no escrow record that
/// could open the new keybag: the record is deleted, and a copy put back is stale.
@Suite struct EscrowAfterEraseTests {
    @Test func anEscrowOfAnErasedKeybagNeverUnlocksTheNextOne() throws {
        let f = try Fixture(passcode: "pw")
        try f.addPassword(service: "old", account: "me", secret: "o1")
        let oldSecret = try f.keychain.createEscrow()
        let oldRecord = fileBytes(f.dir.file(Keychain.escrowFileName))
        f.keychain.eraseEverything()
        #expect(!f.keychain.hasEscrow, "the erase left the escrow record")
        // The same directory, the same device key: a new keybag with the same passcode and a new item.
        try f.reboot()
        try f.keychain.setPasscode(current: nil, new: secret("pw"), kdf: testKDF)
        try f.addPassword(service: "new", account: "me", secret: "n1")
        try f.reboot()
        #expect(status { try f.keychain.unlock(escrowSecret: oldSecret) } == .itemNotFound)
        // The old record put back (a copy kept somewhere) is stale for the new keybag.
        writeFileBytes(f.dir.file(Keychain.escrowFileName), oldRecord)
        #expect(status { try f.keychain.unlock(escrowSecret: oldSecret) } == .authFailed)
        #expect(f.keychain.status.lockState == .boot)
        try f.keychain.unlock(passcode: secret("pw"))
        #expect(try f.password(service: "new", account: "me") == "n1")
    }

    @Test func aKeybagCreatedAfreshDeletesAnEscrowRecordLeftBeside() throws {
        let f = try Fixture(passcode: "pw")
        let oldSecret = try f.keychain.createEscrow()
        // The keybag's files removed by hand (not through an erase); the record stays behind.
        for name in ["keybag", "keybag.key"] { unlink(f.dir.file(name)) }
        try f.reboot()
        #expect(!f.keychain.hasEscrow)
        try f.keychain.setPasscode(current: nil, new: secret("pw"), kdf: testKDF)
        try f.reboot()
        #expect(status { try f.keychain.unlock(escrowSecret: oldSecret) } == .itemNotFound)
    }

    @Test func newKeybagsStartAtDifferentGenerations() throws {
        // Two fresh keybags: generations drawn at random (the escrow binding relies on it).
        var seen = Set<UInt64>()
        for _ in 0..<4 {
            let d = TemporaryDirectory("coffer-generation")
            _ = try Keychain(directory: d.path, lockingStateDirectory: false)
            let key = fileBytes(d.file("keybag.key"))
            seen.insert(key[5..<13].reduce(0) { $0 << 8 | UInt64($1) })
        }
        #expect(seen.count == 4 && !seen.contains(1), "\(seen)")
    }
}

/// Backups (issue #16 item 5).
@Suite struct BackupTests {
    static let kdf = KDFParameters(opsLimit: 1, memLimit: UInt64(Argon2id.minimumMemory))

    static func filled() throws -> Fixture {
        let f = try Fixture(passcode: "pw")
        try f.addPassword(service: "mail", account: "me", secret: "m1")
        try f.addPassword(service: "vpn", account: "me", secret: "v1", ["pdmn": .string("cku")])   // this device only
        try f.addPassword(service: "boot", account: "me", secret: "b1", ["pdmn": .string("dk")])
        try f.addPassword(service: "pin", account: "me", secret: "p1", ["pdmn": .string("akpu")])  // never backed up
        try f.keychain.add(AccessControlKeychainTests.item(AccessControlKeychainTests.presence, service: "guarded"), scope: .unrestricted) // never backed up
        return f
    }

    @Test func aRoundTripOnThisDeviceAndOnAnother() throws {
        let f = try Self.filled()
        let (bytes, count) = try f.keychain.backup(password: secret("backup pw"), kdf: Self.kdf)
        #expect(count == 3)
        #expect(!containsSubsequence(bytes, Array("mail".utf8)) && !containsSubsequence(bytes, Array("vpn".utf8)), "attributes in the clear")
        // Restored into the same keychain: everything is already there.
        var r = try f.keychain.restoreBackup(bytes, password: secret("backup pw"), dryRun: false)
        #expect(r == Keychain.RestoreSummary(added: 0, duplicates: 3, otherDevice: 0))
        // Same device (same device key), a fresh keychain: all three back.
        let same = TemporaryDirectory("coffer-restore-same")
        writeFileBytes(same.file("device.key"), fileBytes(f.dir.file("device.key")))
        chmod(same.file("device.key"), 0o600)
        let kc = try Keychain(directory: same.path, lockingStateDirectory: false)
        r = try kc.restoreBackup(bytes, password: secret("backup pw"), dryRun: true)
        let afterDryRun = try kc.count()
        #expect(r == Keychain.RestoreSummary(added: 3, duplicates: 0, otherDevice: 0) && afterDryRun == 0, "a dry run changed something")
        r = try kc.restoreBackup(bytes, password: secret("backup pw"), dryRun: false)
        #expect(r == Keychain.RestoreSummary(added: 3, duplicates: 0, otherDevice: 0))
        for (svc, s) in [("mail", "m1"), ("vpn", "v1"), ("boot", "b1")] {
            let got = try kc.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(svc)], returnData: true), scope: .unrestricted)
            #expect(text(got.first?.data) == s, "\(svc)")
        }
        // Another device (another device key): the ThisDeviceOnly item stays behind.
        let other = TemporaryDirectory("coffer-restore-other")
        let kc2 = try Keychain(directory: other.path, lockingStateDirectory: false)
        r = try kc2.restoreBackup(bytes, password: secret("backup pw"), dryRun: false)
        #expect(r == Keychain.RestoreSummary(added: 2, duplicates: 0, otherDevice: 1))
    }

    @Test func emptyAndLargeSecretsRoundTrip() throws {
        let f = try Fixture(passcode: "pw")
        let large = String(repeating: "L", count: 150_000)
        try f.addPassword(service: "empty", account: "me", secret: "")
        try f.addPassword(service: "empty-here", account: "me", secret: "", ["pdmn": .string("cku")])
        try f.addPassword(service: "large", account: "me", secret: large)
        let (bytes, count) = try f.keychain.backup(password: secret("backup pw"), kdf: Self.kdf)
        #expect(count == 3)
        let same = TemporaryDirectory("coffer-restore-sizes")
        writeFileBytes(same.file("device.key"), fileBytes(f.dir.file("device.key")))
        chmod(same.file("device.key"), 0o600)
        let kc = try Keychain(directory: same.path, lockingStateDirectory: false)
        #expect(try kc.restoreBackup(bytes, password: secret("backup pw"), dryRun: false) == Keychain.RestoreSummary(added: 3, duplicates: 0, otherDevice: 0))
        for (svc, s) in [("empty", ""), ("empty-here", ""), ("large", large)] {
            let got = try kc.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(svc)], returnData: true), scope: .unrestricted)
            #expect(got.count == 1 && (text(got.first?.data) ?? "") == s, "\(svc)")
        }
    }

    @Test func aWrongPasswordOrADamagedFileChangesNothing() throws {
        let f = try Self.filled()
        let (bytes, _) = try f.keychain.backup(password: secret("backup pw"), kdf: Self.kdf)
        let target = TemporaryDirectory("coffer-restore-bad")
        let kc = try Keychain(directory: target.path, lockingStateDirectory: false)
        try kc.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("mine")], secret: secret("x")), scope: .unrestricted)
        kc.checkpoint()
        let before = ["keychain.db", "keychain.db-wal"].map { fileBytes(target.file($0)) }
        #expect(status { try kc.restoreBackup(bytes, password: secret("wrong"), dryRun: false) } == .authFailed)
        var flipped = bytes
        flipped[flipped.count / 2] ^= 1
        #expect(status { try kc.restoreBackup(flipped, password: secret("backup pw"), dryRun: false) } == .authFailed)
        #expect(status { try kc.restoreBackup(Array(bytes.prefix(bytes.count - 10)), password: secret("backup pw"), dryRun: false) } == .decode)
        #expect(status { try kc.restoreBackup(Array("not a backup".utf8), password: secret("backup pw"), dryRun: false) } == .decode)
        let after = ["keychain.db", "keychain.db-wal"].map { fileBytes(target.file($0)) }
        #expect(before == after, "a refused restore wrote something")
        #expect(try kc.count() == 1)
    }
}
