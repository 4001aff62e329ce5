import Foundation
import LocalAuthentication
import Security
import Testing

/// Apple's keychain API as Apple code calls it (the WWDC sessions' patterns, Apple's documented errors),
/// against a real agent over a real socket. One suite, serialized: every test shares the process's agent
/// connection, and one of them points it at a socket nobody serves.
@Suite(.serialized) struct AppleSecurityAPITests {
    let agent = TestAgent.shared

    /// A fresh service name, so tests never see each other's items.
    func service(_ name: String = #function) -> String { "api-test-\(name)-\(UUID().uuidString.prefix(8))" }

    // MARK: SecItem, as WWDC 2014 session 711 shows it

    @Test func addCopyUpdateDeleteAsTheWWDCSessionShowsIt() {
        let svc = service()
        let secret = "top secret".data(using: .utf8)!
        let attributes: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: svc,
            kSecAttrAccount as String: "account name here",
            kSecValueData as String: secret,
        ]
        #expect(SecItemAdd(attributes as CFDictionary, nil) == errSecSuccess)

        let query: [String: Any] = [
            kSecClass as String: kSecClassGenericPassword,
            kSecAttrService as String: svc,
            kSecAttrAccount as String: "account name here",
            kSecReturnData as String: kCFBooleanTrue!,
            kSecMatchLimit as String: kSecMatchLimitOne,
        ]
        var result: CFTypeRef?
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
        #expect(result as? Data == secret)

        let search: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                     kSecAttrAccount as String: "account name here"]
        let changes: [String: Any] = [kSecValueData as String: "new secret".data(using: .utf8)!, kSecAttrLabel as String: "changed"]
        #expect(SecItemUpdate(search as CFDictionary, changes as CFDictionary) == errSecSuccess)

        var both: CFTypeRef?
        var q2 = search
        q2[kSecReturnData as String] = true
        q2[kSecReturnAttributes as String] = true
        #expect(SecItemCopyMatching(q2 as CFDictionary, &both) == errSecSuccess)
        let dict = both as? [String: Any]
        #expect(dict?[kSecValueData as String] as? Data == "new secret".data(using: .utf8)!)
        #expect(dict?[kSecAttrLabel as String] as? String == "changed")
        #expect(dict?[kSecAttrAccount as String] as? String == "account name here")
        #expect(dict?[kSecAttrCreationDate as String] is Date)

        #expect(SecItemDelete(search as CFDictionary) == errSecSuccess)
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecItemNotFound)
        #expect(SecItemDelete(search as CFDictionary) == errSecItemNotFound)
    }

    @Test func aPersistentReferenceNamesItsItem() throws {
        let svc = service()
        let add: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                  kSecValueData as String: Data("by reference".utf8), kSecReturnPersistentRef as String: true]
        var made: CFTypeRef?
        #expect(SecItemAdd(add as CFDictionary, &made) == errSecSuccess)
        let ref = try #require(made as? Data)
        var found: CFTypeRef?
        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecValuePersistentRef as String: ref,
                                    kSecReturnData as String: true, kSecReturnAttributes as String: true]
        #expect(SecItemCopyMatching(query as CFDictionary, &found) == errSecSuccess)
        let d = found as? [String: Any]
        #expect(d?[kSecValueData as String] as? Data == Data("by reference".utf8))
        #expect(d?[kSecAttrService as String] as? String == svc)
        #expect(SecItemDelete([kSecClass as String: kSecClassGenericPassword, kSecValuePersistentRef as String: ref] as CFDictionary) == errSecSuccess)
        #expect(SecItemCopyMatching(query as CFDictionary, &found) == errSecItemNotFound)
    }

    @Test func aSecondAddOfTheSameItemIsADuplicate() {
        let q: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service(),
                                kSecAttrAccount as String: "me", kSecValueData as String: Data([1, 2, 3])]
        #expect(SecItemAdd(q as CFDictionary, nil) == errSecSuccess)
        #expect(SecItemAdd(q as CFDictionary, nil) == errSecDuplicateItem)
    }

    @Test func aSearchWithoutAMatchIsItemNotFound() {
        var result: CFTypeRef? = "left over" as CFString
        let q: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service(),
                                kSecReturnData as String: true]
        #expect(SecItemCopyMatching(q as CFDictionary, &result) == errSecItemNotFound)
        #expect(result == nil)
    }

    /// A search without kSecReturn… only says whether something matches (SimpleKeychain's hasItem).
    @Test func aSearchAskingForNothingTellsWhetherAnItemExists() {
        let svc = service()
        let base: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc, kSecAttrAccount as String: "a"]
        #expect(SecItemCopyMatching(base as CFDictionary, nil) == errSecItemNotFound)
        var add = base
        add[kSecValueData as String] = Data("x".utf8)
        #expect(SecItemAdd(add as CFDictionary, nil) == errSecSuccess)
        #expect(SecItemCopyMatching(base as CFDictionary, nil) == errSecSuccess)
        var result: CFTypeRef? = "left over" as CFString
        #expect(SecItemCopyMatching(base as CFDictionary, &result) == errSecSuccess)
        #expect(result == nil)
        let wrongService: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc + "x"]
        #expect(SecItemCopyMatching(wrongService as CFDictionary, nil) == errSecItemNotFound)
    }

    /// iOS (and macOS's data protection keychain) return an array of Data for kSecMatchLimitAll with
    /// kSecReturnData; only macOS's old file keychain refuses the combination. Coffer is the former.
    @Test func matchLimitAllWithReturnDataGivesEveryPassword() {
        let svc = service()
        for i in 0..<3 {
            let a: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                    kSecAttrAccount as String: "user\(i)", kSecValueData as String: Data("pw\(i)".utf8)]
            #expect(SecItemAdd(a as CFDictionary, nil) == errSecSuccess)
        }
        var result: CFTypeRef?
        let q: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                kSecMatchLimit as String: kSecMatchLimitAll, kSecReturnData as String: true]
        #expect(SecItemCopyMatching(q as CFDictionary, &result) == errSecSuccess)
        let all = (result as? [Data])?.map { String(decoding: $0, as: UTF8.self) }
        #expect(all.map(Set.init) == ["pw0", "pw1", "pw2"])

        var withAttributes: CFTypeRef?
        var q2 = q
        q2[kSecReturnAttributes as String] = kCFBooleanTrue
        #expect(SecItemCopyMatching(q2 as CFDictionary, &withAttributes) == errSecSuccess)
        let rows = withAttributes as? [[String: Any]]
        #expect(rows?.count == 3)
        #expect(Set(rows?.compactMap { $0[kSecAttrAccount as String] as? String } ?? []) == ["user0", "user1", "user2"])
        #expect(rows?.allSatisfy { $0[kSecValueData as String] is Data } == true)
    }

    /// kSecAttrSynchronizable is Coffer's sync: as on Apple platforms a search without it sees local items only,
    /// kSecAttrSynchronizableAny both.
    @Test func synchronizableItemsNeedAskingFor() {
        let svc = service()
        let add: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                  kSecAttrAccount as String: "synced", kSecAttrSynchronizable as String: kCFBooleanTrue!,
                                  kSecValueData as String: Data("s".utf8)]
        #expect(SecItemAdd(add as CFDictionary, nil) == errSecSuccess)
        var result: CFTypeRef?
        let plain: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                    kSecReturnAttributes as String: true]
        #expect(SecItemCopyMatching(plain as CFDictionary, &result) == errSecItemNotFound)
        var any = plain
        any[kSecAttrSynchronizable as String] = kSecAttrSynchronizableAny
        #expect(SecItemCopyMatching(any as CFDictionary, &result) == errSecSuccess)
        #expect((result as? [String: Any])?[kSecAttrSynchronizable as String] as? Bool == true)
        #expect(SecItemDelete(any as CFDictionary) == errSecSuccess)
    }

    @Test func internetPasswordsMatchOnServerAndProtocol() {
        let server = service() + ".example.com"
        let a: [String: Any] = [kSecClass as String: kSecClassInternetPassword, kSecAttrServer as String: server,
                                kSecAttrProtocol as String: kSecAttrProtocolHTTPS, kSecAttrPort as String: 443,
                                kSecAttrAccount as String: "me", kSecValueData as String: Data("hunter2".utf8)]
        #expect(SecItemAdd(a as CFDictionary, nil) == errSecSuccess)
        var result: CFTypeRef?
        let q: [String: Any] = [kSecClass as String: kSecClassInternetPassword, kSecAttrServer as String: server,
                                kSecReturnAttributes as String: true]
        #expect(SecItemCopyMatching(q as CFDictionary, &result) == errSecSuccess)
        let d = result as? [String: Any]
        #expect(d?[kSecAttrPort as String] as? Int == 443)
        #expect(d?[kSecAttrProtocol as String] as? String == kSecAttrProtocolHTTPS as String)
    }

    @Test func anUnknownAttributeIsAParameterError() {
        let q: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service(),
                                "notAnAttribute": "x", kSecValueData as String: Data([1])]
        #expect(SecItemAdd(q as CFDictionary, nil) == errSecParam)
        let wrongType: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: 42]
        #expect(SecItemDelete(wrongType as CFDictionary) == errSecParam)
        let identity: [String: Any] = [kSecClass as String: kSecClassIdentity]
        #expect(SecItemDelete(identity as CFDictionary) == errSecUnimplemented)
        // Names near the known ones (the keys are found by their packed bytes): empty, a byte short or over, a NUL
        // after a known name, not ASCII, one byte over the 16 a name is packed in, and far longer.
        for name in ["", "svc", "svcee", "svce\u{0}", "sv\u{E9}e", "v_PersistentRefs", "v_PersistentRefs1",
                     "an attribute name far longer than sixteen bytes"] {
            let q: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service(), name: "x"]
            #expect(SecItemDelete(q as CFDictionary) == errSecParam, "\(name.debugDescription)")
        }
    }

    @Test func everyKeyAndValueIsCheckedAsApplesAPIChecksThem() {
        let svc = service()
        func add(_ extra: [String: Any]) -> OSStatus {
            var a: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                    kSecAttrAccount as String: UUID().uuidString, kSecValueData as String: Data([1])]
            a.merge(extra) { _, given in given }
            return SecItemAdd(a as CFDictionary, nil)
        }
        // An attribute of another class (given as itself, or as a key class read after the others), one only the
        // keychain sets, a protection class that is none.
        #expect(add([kSecAttrServer as String: "example.com"]) == errSecParam)
        #expect(add([kSecAttrKeyClass as String: kSecAttrKeyClassPrivate]) == errSecParam)
        #expect(add([kSecAttrCreationDate as String: Date()]) == errSecParam)
        #expect(add([kSecAttrAccessible as String: "nonsense"]) == errSecParam)
        #expect(add([kSecAttrIsInvisible as String: "yes"]) == errSecParam)
        // Values as Apple code gives them: Foundation objects, Swift numbers and booleans, a number as a string.
        #expect(add([kSecAttrAccessible as String: kSecAttrAccessibleAfterFirstUnlock, kSecAttrLabel as String: "label",
                     kSecAttrGeneric as String: Data([1, 2]), kSecAttrIsInvisible as String: true,
                     kSecAttrCreator as String: "42", kSecAttrSynchronizable as String: kCFBooleanFalse!]) == errSecSuccess)
        var result: CFTypeRef?
        let q: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                kSecAttrCreator as String: 42, kSecReturnAttributes as String: true]
        #expect(SecItemCopyMatching(q as CFDictionary, &result) == errSecSuccess)
        let d = result as? [String: Any]
        #expect(d?[kSecAttrGeneric as String] as? Data == Data([1, 2]))
        #expect(d?[kSecAttrIsInvisible as String] as? Bool == true)
        #expect(d?[kSecAttrAccessible as String] as? String == kSecAttrAccessibleAfterFirstUnlock as String)
        // A key that is not a string is the dictionary's error, whatever else is in it.
        let mixed: [AnyHashable: Any] = [1: "x", kSecClass as String: kSecClassIdentity]
        #expect(SecItemDelete(mixed as CFDictionary) == errSecParam)
        #expect(SecItemDelete([kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc] as CFDictionary) == errSecSuccess)
    }

    @Test func errorMessagesHaveApplesWording() {
        #expect(SecCopyErrorMessageString(errSecItemNotFound, nil) as String? == "The specified item could not be found in the keychain.")
        #expect(SecCopyErrorMessageString(errSecDuplicateItem, nil) != nil)
        #expect(SecCopyErrorMessageString(12345, nil) == nil)
    }

    // MARK: Access control and authentication

    @Test func anItemWithAccessControlAsksWithTheOperationPrompt() throws {
        let svc = service()
        var error: Unmanaged<CFError>?
        let access = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly,
                                                                  .userPresence, &error))
        #expect(error == nil)
        let secret = "mySecret".data(using: .utf8)!
        let attributes: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                         kSecValueData as String: secret, kSecAttrAccessControl as String: access]
        #expect(SecItemAdd(attributes as CFDictionary, nil) == errSecSuccess)

        // Attributes alone never need the person, and the access control comes back as one.
        var attrs: CFTypeRef?
        let attributesQuery: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                              kSecReturnAttributes as String: true]
        #expect(SecItemCopyMatching(attributesQuery as CFDictionary, &attrs) == errSecSuccess)
        #expect((attrs as? [String: Any])?[kSecAttrAccessControl as String] is SecAccessControl)
        #expect((attrs as? [String: Any])?[kSecAttrAccessible as String] as? String == kSecAttrAccessibleWhenPasscodeSetThisDeviceOnly as String)

        let before = pinentryPrompts()
        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                    kSecReturnData as String: true, kSecUseOperationPrompt as String: "Authenticate to see the secret"]
        var result: CFTypeRef?
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
        #expect(result as? Data == secret)
        #expect(pinentryPrompts() == before + 1, "the pinentry was asked once")
        #expect(pinentryLog().contains("Authenticate to see the secret"))

        var noUI = query
        noUI[kSecUseAuthenticationUI as String] = kSecUseAuthenticationUIFail
        #expect(SecItemCopyMatching(noUI as CFDictionary, &result) == errSecInteractionNotAllowed)
        var skip = query
        skip[kSecUseAuthenticationUI as String] = kSecUseAuthenticationUISkip
        #expect(SecItemCopyMatching(skip as CFDictionary, &result) == errSecItemNotFound)
        #expect(pinentryPrompts() == before + 1, "neither asked")

        // Skip leaves out what would need the person and returns the rest.
        let plain: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                    kSecAttrAccount as String: "plain", kSecValueData as String: Data("open".utf8)]
        #expect(SecItemAdd(plain as CFDictionary, nil) == errSecSuccess)
        var all = skip
        all[kSecMatchLimit as String] = kSecMatchLimitAll
        all[kSecReturnAttributes as String] = true
        #expect(SecItemCopyMatching(all as CFDictionary, &result) == errSecSuccess)
        let rows = result as? [[String: Any]]
        #expect(rows?.count == 1)
        #expect(rows?.first?[kSecAttrAccount as String] as? String == "plain")
        #expect(rows?.first?[kSecValueData as String] as? Data == Data("open".utf8))
        #expect(pinentryPrompts() == before + 1, "still nobody asked")
    }

    /// The application password pattern (seed 004): the same LAContext credential makes and opens the item.
    @Test func theApplicationPasswordComesFromLAContextSetCredential() throws {
        let svc = service()
        let acl = try #require(SecAccessControlCreateWithFlags(kCFAllocatorDefault, kSecAttrAccessibleWhenUnlockedThisDeviceOnly,
                                                               .applicationPassword, nil))
        let context = LAContext()
        context.setCredential("app password".data(using: .utf8), type: .applicationPassword)
        #expect(context.isCredentialSet(.applicationPassword))
        var attributes = [String: AnyObject]()
        attributes[kSecClass as String] = kSecClassGenericPassword as String as AnyObject
        attributes[kSecAttrAccount as String] = "exampleAccount" as AnyObject
        attributes[kSecAttrService as String] = svc as AnyObject
        attributes[kSecValueData as String] = "s3cr3t".data(using: .utf8)! as AnyObject
        attributes[kSecAttrAccessControl as String] = acl
        attributes[kSecUseAuthenticationContext as String] = context
        #expect(SecItemAdd(attributes as CFDictionary, nil) == errSecSuccess)

        var query = [String: AnyObject]()
        query[kSecClass as String] = kSecClassGenericPassword as String as AnyObject
        query[kSecAttrAccount as String] = "exampleAccount" as AnyObject
        query[kSecAttrService as String] = svc as AnyObject
        query[kSecReturnData as String] = kCFBooleanTrue
        query[kSecMatchLimit as String] = kSecMatchLimitOne
        query[kSecAttrAccessControl as String] = acl
        query[kSecUseAuthenticationContext as String] = context
        var result: CFTypeRef?
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
        #expect(result as? Data == "s3cr3t".data(using: .utf8))

        let wrong = LAContext()
        wrong.setCredential("not it".data(using: .utf8), type: .applicationPassword)
        query[kSecUseAuthenticationContext as String] = wrong
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecAuthFailed)
    }

    @Test func anEvaluatedContextCarriesIntoTheSecItemCall() async throws {
        let svc = service()
        let access = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .devicePasscode, nil))
        let add: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                  kSecValueData as String: Data("guarded".utf8), kSecAttrAccessControl as String: access]
        #expect(SecItemAdd(add as CFDictionary, nil) == errSecSuccess)

        let context = LAContext()
        context.localizedReason = "Unlock the demo"
        var error: NSError?
        #expect(context.canEvaluatePolicy(.deviceOwnerAuthentication, error: &error))
        #expect(error == nil)
        #expect(context.biometryType == .none)
        let before = pinentryPrompts()
        let ok = try await context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "Unlock the demo")
        #expect(ok)
        #expect(pinentryPrompts() == before + 1)

        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                    kSecReturnData as String: true, kSecUseAuthenticationContext as String: context,
                                    kSecUseOperationPrompt as String: "Read the demo secret"]
        var result: CFTypeRef?
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
        #expect(result as? Data == Data("guarded".utf8))
        #expect(pinentryPrompts() == before + 1, "the evaluation covered the read")

        context.invalidate()
        await #expect(throws: LAError.self) { try await context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "again") }
        do {
            _ = try await context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "again")
        } catch let e as LAError {
            #expect(e.code == .invalidContext)
            #expect((e as NSError).domain == LAErrorDomain)
        }
    }

    @Test func evaluateAccessControlAsksForWhatTheRuleNeeds() async throws {
        let passcode = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .devicePasscode, nil))
        let context = LAContext()
        let before = pinentryPrompts()
        #expect(try await context.evaluateAccessControl(passcode, operation: .useItem, localizedReason: "Use the item"))
        #expect(pinentryPrompts() == before + 1)
        #expect(context.evaluatedPolicyDomainState == nil, "no biometry is enrolled with this agent")
        #expect(context.domainState.biometry.biometryType == .none)

        let appPassword = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly,
                                                                       .applicationPassword, nil))
        await #expect(throws: LAError.self) {
            try await LAContext().evaluateAccessControl(appPassword, operation: .useItem, localizedReason: "needs a credential")
        }
        let withCredential = LAContext()
        withCredential.setCredential(Data("pw".utf8), type: .applicationPassword)
        #expect(try await withCredential.evaluateAccessControl(appPassword, operation: .useItem, localizedReason: "has one"))
        #expect(pinentryPrompts() == before + 1, "an application password alone asks nobody")
    }

    /// The agent honours the context's reuse duration: inside it the evaluation covers a read, after it the
    /// person is asked again.
    @Test func theReuseDurationIsHonoured() async throws {
        let svc = service()
        let access = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .devicePasscode, nil))
        let add: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                  kSecValueData as String: Data("timed".utf8), kSecAttrAccessControl as String: access]
        #expect(SecItemAdd(add as CFDictionary, nil) == errSecSuccess)
        let context = LAContext()
        context.touchIDAuthenticationAllowableReuseDuration = 1
        let before = pinentryPrompts()
        #expect(try await context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "for a second"))
        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                    kSecReturnData as String: true, kSecUseAuthenticationContext as String: context]
        var result: CFTypeRef?
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
        #expect(pinentryPrompts() == before + 1, "covered by the evaluation")
        try await Task.sleep(nanoseconds: 1_300_000_000)
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
        #expect(result as? Data == Data("timed".utf8))
        #expect(pinentryPrompts() == before + 2, "the window had ended: the person was asked again")
    }

    /// With no reuse duration set, an evaluated context covers its calls as on Apple platforms, until
    /// invalidate: past what a 1 s window would allow, nobody is asked again; after invalidate the context
    /// opens nothing.
    @Test func anEvaluatedContextLastsUntilInvalidated() async throws {
        let svc = service()
        let access = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .devicePasscode, nil))
        let add: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                  kSecValueData as String: Data("kept".utf8), kSecAttrAccessControl as String: access]
        #expect(SecItemAdd(add as CFDictionary, nil) == errSecSuccess)
        let context = LAContext()
        let before = pinentryPrompts()
        #expect(try await context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "until invalidated"))
        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                    kSecReturnData as String: true, kSecUseAuthenticationContext as String: context]
        var result: CFTypeRef?
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
        try await Task.sleep(nanoseconds: 1_300_000_000)
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
        #expect(result as? Data == Data("kept".utf8))
        #expect(pinentryPrompts() == before + 1, "the evaluation alone asked")
        context.invalidate()
        #expect(SecItemCopyMatching(query as CFDictionary, &result) != errSecSuccess, "an invalidated context opened the item")
    }

    @Test func aContextThatMayNotAskIsNotInteractive() {
        let context = LAContext()
        context.interactionNotAllowed = true
        let done = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var outcome: (Bool, Int?) = (true, nil)
        context.evaluatePolicy(.deviceOwnerAuthentication, localizedReason: "Never shown") { success, error in
            outcome = (success, (error as? LAError)?.code.rawValue)
            done.signal()
        }
        done.wait()
        #expect(outcome.0 == false)
        #expect(outcome.1 == LAError.Code.notInteractive.rawValue)
        var error: NSError?
        #expect(!context.canEvaluatePolicy(.deviceOwnerAuthenticationWithWatch, error: &error))
        #expect(error?.code == LAError.Code.watchNotAvailable.rawValue)
        // This agent has no biometric authenticator: biometry alone cannot be evaluated, and says why.
        error = nil
        #expect(!LAContext().canEvaluatePolicy(.deviceOwnerAuthenticationWithBiometrics, error: &error))
        #expect(error?.domain == LAErrorDomain)
        #expect(error?.code == LAError.Code.biometryNotAvailable.rawValue || error?.code == LAError.Code.biometryNotEnrolled.rawValue)
    }

    @Test func unsupportedKeysAreRefusedAsApplesCodesSay() {
        var error: Unmanaged<CFError>?
        let rsa: [String: Any] = [kSecAttrKeyType as String: kSecAttrKeyTypeRSA, kSecAttrKeySizeInBits as String: 2048]
        #expect(SecKeyCreateRandomKey(rsa as CFDictionary, &error) == nil)
        #expect((error?.takeRetainedValue() as Error?).map { ($0 as NSError).code } == Int(errSecUnimplemented))
        let odd: [String: Any] = [kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom, kSecAttrKeySizeInBits as String: 192]
        #expect(SecKeyCreateRandomKey(odd as CFDictionary, nil) == nil)
        #expect(SecKeyCreateWithData(Data([1, 2, 3]) as CFData, [kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom,
                                                                kSecAttrKeyClass as String: kSecAttrKeyClassPublic] as CFDictionary, nil) == nil)
    }

    @Test func accessControlFlagsAreChecked() {
        var error: Unmanaged<CFError>?
        #expect(SecAccessControlCreateWithFlags(nil, "nonsense" as CFString, .userPresence, &error) == nil)
        #expect((error?.takeRetainedValue() as Error?).map { ($0 as NSError).code } == Int(errSecParam))
        #expect(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlocked, [.biometryAny, .devicePasscode], nil) == nil)
        #expect(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlocked, [.biometryAny, .or, .devicePasscode], nil) != nil)
        #expect(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlocked, [.biometryCurrentSet, .and, .applicationPassword], nil) != nil)
        #expect(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .privateKeyUsage, nil) != nil)
    }

    // MARK: No agent

    @Test func withoutAnAgentTheKeychainIsNotAvailable() {
        let saved = AgentSession.socket
        AgentSession.socket = agent.file("nobody-here.sock")
        defer { AgentSession.socket = saved }
        let q: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: service(),
                                kSecValueData as String: Data([1])]
        // Standard error goes to a file for the call: the line saying how to start the agent.
        let log = agent.file("no-agent-\(UUID().uuidString.prefix(8)).log")
        let fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        let stderrCopy = dup(2)
        dup2(fd, 2)
        let status = SecItemAdd(q as CFDictionary, nil)
        dup2(stderrCopy, 2)
        close(stderrCopy)
        close(fd)
        #expect(status == errSecNotAvailable)
        let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
        #expect(text.contains("no keychain agent") && text.contains("start the agent with: cofferd"), "\(text)")
    }

    /// The process's connection outlives the agent: after a restart, the next call connects again.
    @Test func aRestartedAgentIsReachedAgain() throws {
        let svc = service()
        let add: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                  kSecValueData as String: Data("kept".utf8)]
        #expect(SecItemAdd(add as CFDictionary, nil) == errSecSuccess)
        try agent.restart()
        var result: CFTypeRef?
        let query: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                    kSecReturnData as String: true]
        #expect(SecItemCopyMatching(query as CFDictionary, &result) == errSecSuccess)
        #expect(result as? Data == Data("kept".utf8))
        try agent.restart()
        #expect(SecItemDelete(query as CFDictionary) == errSecSuccess, "a write finds the hung-up connection before sending")
    }

    // MARK: Keys

    enum KeyKind: Sendable, CaseIterable { case p256DER, p256Raw, ed25519 }

    @Test(arguments: KeyKind.allCases)
    func keysSignAndVerify(kind: KeyKind) throws {
        let (type, bits, algorithm): (CFString, Int, SecKeyAlgorithm) = switch kind {
        case .p256DER: (kSecAttrKeyTypeECSECPrimeRandom, 256, .ecdsaSignatureMessageX962SHA256)
        case .p256Raw: (kSecAttrKeyTypeECSECPrimeRandom, 256, .ecdsaSignatureMessageRFC4754SHA256)
        case .ed25519: (kSecAttrKeyTypeEd25519, 256, .ed25519SignatureMessage)
        }
        let attributes: [String: Any] = [kSecAttrKeyType as String: type, kSecAttrKeySizeInBits as String: bits]
        var error: Unmanaged<CFError>?
        let privateKey = try #require(SecKeyCreateRandomKey(attributes as CFDictionary, &error))
        let publicKey = try #require(SecKeyCopyPublicKey(privateKey))
        #expect(SecKeyIsAlgorithmSupported(privateKey, .sign, algorithm))
        #expect(!SecKeyIsAlgorithmSupported(publicKey, .sign, algorithm))
        #expect(!SecKeyIsAlgorithmSupported(privateKey, .sign, .rsaSignatureMessagePKCS1v15SHA256))
        let message = "message to sign".data(using: .utf8)!
        let signature = try #require(SecKeyCreateSignature(privateKey, algorithm, message as CFData, &error) as Data?)
        #expect(SecKeyVerifySignature(publicKey, algorithm, message as CFData, signature as CFData, &error))
        var tampered = signature
        tampered[tampered.count - 1] ^= 1
        #expect(!SecKeyVerifySignature(publicKey, algorithm, message as CFData, tampered as CFData, &error))
        #expect((error?.takeRetainedValue() as Error?).map { ($0 as NSError).code } == Int(errSecVerifyFailed))
        #expect(SecKeyCreateSignature(privateKey, .ecdsaSignatureDigestX962SHA256, message as CFData, nil) == nil)

        // The public key travels as its external representation and verifies on the other side.
        let exported = try #require(SecKeyCopyExternalRepresentation(publicKey, nil) as Data?)
        let imported = try #require(SecKeyCreateWithData(exported as CFData, [kSecAttrKeyType as String: type,
            kSecAttrKeyClass as String: kSecAttrKeyClassPublic] as CFDictionary, nil))
        #expect(SecKeyVerifySignature(imported, algorithm, message as CFData, signature as CFData, nil))
        let privateData = try #require(SecKeyCopyExternalRepresentation(privateKey, nil) as Data?)
        let again = try #require(SecKeyCreateWithData(privateData as CFData, [kSecAttrKeyType as String: type,
            kSecAttrKeyClass as String: kSecAttrKeyClassPrivate] as CFDictionary, nil))
        let second = try #require(SecKeyCreateSignature(again, algorithm, message as CFData, nil) as Data?)
        #expect(SecKeyVerifySignature(publicKey, algorithm, message as CFData, second as CFData, nil))
    }

    @Test func aPermanentKeyIsFoundByItsTag() throws {
        let tag = service().data(using: .utf8)!
        let attributes: [String: Any] = [
            kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom,
            kSecAttrKeySizeInBits as String: 256,
            kSecPrivateKeyAttrs as String: [kSecAttrIsPermanent as String: true, kSecAttrApplicationTag as String: tag],
        ]
        var error: Unmanaged<CFError>?
        let made = try #require(SecKeyCreateRandomKey(attributes as CFDictionary, &error))
        let query: [String: Any] = [kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag,
                                    kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom, kSecReturnRef as String: true]
        var item: CFTypeRef?
        #expect(SecItemCopyMatching(query as CFDictionary, &item) == errSecSuccess)
        let found = try #require(item as? SecKey)
        let message = Data("signed by the stored key".utf8)
        let signature = try #require(SecKeyCreateSignature(found, .ecdsaSignatureMessageX962SHA256, message as CFData, nil) as Data?)
        #expect(SecKeyVerifySignature(try #require(SecKeyCopyPublicKey(made)), .ecdsaSignatureMessageX962SHA256, message as CFData,
                                      signature as CFData, nil))
    }

    @Test func aSecureEnclaveKeyStaysInTheAgent() throws {
        let access = try #require(SecAccessControlCreateWithFlags(nil, kSecAttrAccessibleWhenUnlockedThisDeviceOnly, .privateKeyUsage, nil))
        let tag = service().data(using: .utf8)!
        let attributes: [String: Any] = [
            kSecAttrKeyType as String: kSecAttrKeyTypeECSECPrimeRandom,
            kSecAttrKeySizeInBits as String: 256,
            kSecAttrTokenID as String: kSecAttrTokenIDSecureEnclave,
            kSecPrivateKeyAttrs as String: [kSecAttrIsPermanent as String: true, kSecAttrApplicationTag as String: tag,
                                            kSecAttrAccessControl as String: access],
        ]
        var error: Unmanaged<CFError>?
        let key = try #require(SecKeyCreateRandomKey(attributes as CFDictionary, &error))
        #expect(SecKeyCopyExternalRepresentation(key, &error) == nil, "the private half never leaves the agent")
        #expect((error?.takeRetainedValue() as Error?).map { ($0 as NSError).code } == Int(errSecNotAvailable))
        let publicKey = try #require(SecKeyCopyPublicKey(key))
        #expect((SecKeyCopyExternalRepresentation(publicKey, nil) as Data?)?.count == 65)

        var item: CFTypeRef?
        let query: [String: Any] = [kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag, kSecReturnRef as String: true]
        #expect(SecItemCopyMatching(query as CFDictionary, &item) == errSecSuccess)
        let found = try #require(item as? SecKey)
        #expect(SecKeyCopyExternalRepresentation(try #require(SecKeyCopyPublicKey(found)), nil) as Data?
                == SecKeyCopyExternalRepresentation(publicKey, nil) as Data?)
        // The agent signs (its ssh-agent socket), and the signature verifies with the public key.
        let message = Data("signed in the agent".utf8)
        let signature = try #require(SecKeyCreateSignature(found, .ecdsaSignatureMessageX962SHA256, message as CFData, &error) as Data?)
        #expect(SecKeyVerifySignature(publicKey, .ecdsaSignatureMessageX962SHA256, message as CFData, signature as CFData, nil))
        #expect(!SecKeyVerifySignature(publicKey, .ecdsaSignatureMessageX962SHA256, Data("other".utf8) as CFData, signature as CFData, nil))
        var data: CFTypeRef?
        let dataQuery: [String: Any] = [kSecClass as String: kSecClassKey, kSecAttrApplicationTag as String: tag, kSecReturnData as String: true]
        #expect(SecItemCopyMatching(dataQuery as CFDictionary, &data) == errSecNotAvailable)
    }

    @Test func randomBytesAreRandom() {
        var a = [UInt8](repeating: 0, count: 32), b = a
        #expect(SecRandomCopyBytes(kSecRandomDefault, a.count, &a) == errSecSuccess)
        #expect(SecRandomCopyBytes(kSecRandomDefault, b.count, &b) == errSecSuccess)
        #expect(a != b && a != [UInt8](repeating: 0, count: 32))
    }

    // MARK: Threads

    @Test func callsFromManyThreadsShareTheConnection() {
        let svc = service()
        let threads = 8, rounds = 25
        let failures = Failures()
        let group = DispatchGroup()
        for t in 0..<threads {
            group.enter()
            Thread.detachNewThread {
                defer { group.leave() }
                for r in 0..<rounds {
                    let base: [String: Any] = [kSecClass as String: kSecClassGenericPassword, kSecAttrService as String: svc,
                                               kSecAttrAccount as String: "t\(t)-r\(r)"]
                    var add = base
                    add[kSecValueData as String] = Data("\(t)/\(r)".utf8)
                    var got: CFTypeRef?
                    var query = base
                    query[kSecReturnData as String] = true
                    let statuses = [SecItemAdd(add as CFDictionary, nil), SecItemCopyMatching(query as CFDictionary, &got)]
                    if statuses != [errSecSuccess, errSecSuccess] || got as? Data != Data("\(t)/\(r)".utf8)
                        || SecItemDelete(base as CFDictionary) != errSecSuccess {
                        failures.add("thread \(t) round \(r): \(statuses)")
                    }
                }
            }
        }
        group.wait()
        #expect(failures.all.isEmpty, "\(failures.all.prefix(5))")
    }

    final class Failures: @unchecked Sendable {
        private let lock = NSLock()
        private var list: [String] = []
        func add(_ s: String) { lock.lock(); list.append(s); lock.unlock() }
        var all: [String] { lock.lock(); defer { lock.unlock() }; return list }
    }

    // MARK: Helpers

    func pinentryLog() -> String { (try? String(contentsOfFile: agent.pinentryLog, encoding: .utf8)) ?? "" }
    func pinentryPrompts() -> Int { pinentryLog().split(separator: "\n").filter { $0.hasPrefix("GETPIN") }.count }
}
