@testable import CofferNativeFrontEnd
import CofferAudit
import CofferKeychain
import CofferModel
import CofferPolicy
import CofferProtocol
import CofferService
import CofferServiceTestSupport
import CofferSystem
import CofferTestSupport
import Foundation
import Testing

/// Issue #14's authentication path through `Pipeline.handle`: a scripted client (AUTH_NEEDED /
/// AUTH_RESPONSE), a fake biometric sensor, the stub passcode verifier, a real keychain.
@Suite struct AuthenticationTests {
    static func add(_ rule: String, service: String = "bank") -> AgentRequest {
        .add(NewItem(itemClass: .genericPassword,
                     attributes: ["svce": .string(service), "acct": .string("me"),
                                  AccessControl.attributeName: .data(AccessControl(parsing: rule)!.encoded())],
                     secret: secret("pin 1234")), [])
    }
    static func get(_ service: String = "bank") -> AgentRequest {
        .copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(service)], returnData: true))
    }
    static let passcode = AuthenticationAnswer.passcode(secret(AgentRig.passcode))

    /// A rig with the keychain unlocked and a session past HELLO.
    static func ready(_ sensor: FakeSensor = FakeSensor()) throws -> (AgentRig, Session) {
        let rig = try AgentRig(sensor: sensor)
        var s = rig.greetedSession(as: rig.signedCaller("com.example.bank", ["bank"]))
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s)) == nil)
        return (rig, s)
    }

    static func secretText(_ r: AgentResponse) -> String? {
        guard case .items(let items) = r else { return nil }
        return text(items.first?.data)
    }

    @Test func aUserPresenceItemWaitsForAFingerThenReturnsTheSecret() throws {
        var (rig, s) = try Self.ready()
        #expect(errorStatus(rig.pipeline.handle(Self.add("user-presence"), session: &s)) == nil)
        rig.sensor.queue(.match())
        let client = ScriptedChannel([.waitForStop])
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: client)) == "pin 1234")
        let asked = try #require(client.asked.first)
        #expect(asked.methods == [.biometry, .passcode], "enrolled biometry is preferred, the passcode is the fallback")
        #expect(asked.app == "com.example.bank" && asked.prompt.contains("bank"))
        // Without a channel (no way to ask) and without UI the secret stays put.
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s)) == .interactionNotAllowed)
        // Attributes only: no authentication, as on iOS.
        let attributes = AgentRequest.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("bank")], returnAttributes: true))
        guard case .items = rig.pipeline.handle(attributes, session: &s) else { Issue.record("attributes"); return }
        // Every authentication is in the audit log.
        let records = AuditReader.read(directory: rig.dir.path).records.filter { $0.operation == "authenticate" }
        #expect(records.map(\.result) == [0, -25308])
    }

    @Test func theSensorsRetryMessagesReachThePerson() throws {
        var (rig, s) = try Self.ready()
        _ = rig.pipeline.handle(Self.add("user-presence"), session: &s)
        rig.sensor.say("Finger not centred: try again")
        let client = ScriptedChannel([.waitForStop, .waitForStop])
        // The message first (the evaluation goes on), then the match.
        let sensor = rig.sensor
        Thread.detachNewThread { usleep(50_000); sensor.queue(.match()) }
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: client)) == "pin 1234")
        #expect(client.feedbacks == ["Finger not centred: try again"] && client.feedbackKinds == [.notice])
    }

    @Test func withoutBiometryThePasscodeIsAskedForAndCheckedByPAM() throws {
        var (rig, s) = try Self.ready(FakeSensor(enrolled: false))
        _ = rig.pipeline.handle(Self.add("user-presence"), session: &s)
        let calls = rig.verifier.callCount
        let client = ScriptedChannel([.answer(.passcode(secret("wrong"))), .answer(Self.passcode)])
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: client)) == "pin 1234")
        #expect(client.asked.first?.methods == [.passcode]
                && client.feedbacks == ["Wrong passcode. Try again (3 attempts left before a wait of 1 min)."], "\(client.feedbacks)")
        #expect(client.feedbackKinds == [.wrongPasscode], "the agent waits for another answer, and says so")
        #expect(rig.verifier.callCount == calls + 2)
        // Three wrong passcodes fail the request.
        let wrong = AuthenticationAnswer.passcode(secret("nope"))
        let stubborn = ScriptedChannel([.answer(wrong), .answer(wrong), .answer(wrong)])
        let refusal = rig.pipeline.handle(Self.get(), session: &s, channel: stubborn)
        #expect(errorStatus(refusal) == .authFailed)
        #expect(stubborn.feedbacks == ["Wrong passcode. Try again (3 attempts left before a wait of 1 min).",
                                       "Wrong passcode. Try again (2 attempts left before a wait of 1 min)."], "\(stubborn.feedbacks)")
        #expect(errorMessage(refusal)?.contains("1 attempt left before a wait of 1 min") == true, "\(String(describing: errorMessage(refusal)))")
        // One more wrong passcode uses the last free attempt: the dialog ends at once, saying so,
        // instead of asking for an answer the schedule would refuse untried.
        let last = ScriptedChannel([.answer(wrong), .answer(Self.passcode)])
        let ended = rig.pipeline.handle(Self.get(), session: &s, channel: last)
        #expect(errorStatus(ended) == .authFailed && last.feedbacks.isEmpty, "\(last.feedbacks)")
        #expect(errorMessage(ended)?.contains("the next attempt must wait 1 min") == true, "\(String(describing: errorMessage(ended)))")
    }

    @Test func fiveFailedMatchesLockBiometryOutUntilThePasscodeSucceeds() throws {
        var (rig, s) = try Self.ready()
        _ = rig.pipeline.handle(Self.add("user-presence"), session: &s)
        _ = rig.pipeline.handle(Self.add("biometry-any", service: "vault"), session: &s)
        rig.sensor.queue(.noMatch, .noMatch, .noMatch, .noMatch, .noMatch)
        let client = ScriptedChannel([.waitForStop, .waitForStop, .waitForStop, .waitForStop, .waitForStop, .answer(Self.passcode)])
        // Five misses, then only the passcode: it is accepted and lifts the lockout.
        let r = rig.pipeline.handle(Self.get(), session: &s, channel: client)
        #expect(Self.secretText(r) == "pin 1234", "\(r) \(client.feedbacks)")
        #expect(client.feedbacks.filter { $0 == "No match. Try again." }.count == 4)
        #expect(client.feedbacks.last?.contains("locked out") == true)
        #expect(client.feedbackKinds == [.noMatch, .noMatch, .noMatch, .noMatch, .passcodeOnly],
                "a miss needs no answer; after the lockout only a passcode can answer")
        #expect(rig.sensor.evaluations == 5)
        // Biometry works again.
        rig.sensor.queue(.match())
        #expect(Self.secretText(rig.pipeline.handle(Self.get("vault"), session: &s, channel: ScriptedChannel([.waitForStop]))) == "pin 1234")
        // Locked out again, a biometry-only item fails at once (lockout), without asking.
        rig.sensor.queue(.noMatch, .noMatch, .noMatch, .noMatch, .noMatch)
        let misses = ScriptedChannel([.waitForStop, .waitForStop, .waitForStop, .waitForStop, .waitForStop])
        #expect(errorStatus(rig.pipeline.handle(Self.get("vault"), session: &s, channel: misses)) == .authFailed)
        let after = ScriptedChannel([])
        #expect(errorStatus(rig.pipeline.handle(Self.get("vault"), session: &s, channel: after)) == .authFailed)
        #expect(after.asked.isEmpty)
    }

    /// Issue #24, finding 4: a match from an evaluation that started before biometry was locked out
    /// (five misses on another connection while it ran) must not be accepted.
    @Test func aMatchFromAnEvaluationStartedBeforeALockoutIsRefused() throws {
        var (rig, s) = try Self.ready()
        _ = rig.pipeline.handle(Self.add("biometry-any", service: "vault"), session: &s)
        // Connection A waits for a finger on evaluation 1, which the test holds.
        rig.sensor.hold(evaluation: 1)
        final class Box: @unchecked Sendable {
            var session: Session
            var reply: AgentResponse? = nil
            let done = Protected(false)
            init(_ s: Session) { session = s }
        }
        let a = Box(rig.greetedSession(as: rig.signedCaller("com.example.bank", ["bank"])))
        let pipeline = rig.pipeline
        Thread.detachNewThread {
            a.reply = pipeline.handle(Self.get("vault"), session: &a.session, channel: ScriptedChannel([.waitForStop]))
            a.done.withLock { $0 = true }
        }
        for _ in 0..<30_000 where rig.sensor.evaluations < 1 { usleep(1000) }
        #expect(rig.sensor.evaluations == 1)
        // Connection B: five misses lock biometry out.
        rig.sensor.queue(.noMatch, .noMatch, .noMatch, .noMatch, .noMatch)
        let misses = ScriptedChannel([.waitForStop, .waitForStop, .waitForStop, .waitForStop, .waitForStop])
        #expect(errorStatus(rig.pipeline.handle(Self.get("vault"), session: &s, channel: misses)) == .authFailed)
        #expect(rig.authenticator.biometry.lockedOut)
        // Now A's evaluation reports a match: it started before the lockout, and is refused.
        rig.sensor.answer(evaluation: 1, .match())
        for _ in 0..<30_000 where !a.done.withLock({ $0 }) { usleep(1000) }
        let reply = try #require(a.done.withLock { $0 } ? a.reply : nil)
        #expect(errorStatus(reply) == .authFailed, "\(reply)")
        #expect(Self.secretText(reply) == nil)
        #expect(rig.authenticator.biometry.lockedOut, "a match cannot lift a lockout")
    }

    @Test func aCurrentSetItemIsUnusableOnceTheEnrolledSetChanges() throws {
        var (rig, s) = try Self.ready()
        #expect(errorStatus(rig.pipeline.handle(Self.add("biometry-current-set"), session: &s)) == nil)
        rig.sensor.queue(.match())
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([.waitForStop]))) == "pin 1234")
        rig.sensor.enrollAnother()
        let client = ScriptedChannel([.waitForStop])
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s, channel: client)) == .authFailed)
        #expect(client.asked.isEmpty, "no prompt for an item that can no longer be opened")
        // Without enrolled biometry such an item cannot be made.
        var (bare, t) = try Self.ready(FakeSensor(enrolled: false))
        #expect(errorStatus(bare.pipeline.handle(Self.add("biometry-current-set"), session: &t)) == .notAvailable)
    }

    @Test func noUserInterfaceFailsAtOnceAndCancelIsUserCanceled() throws {
        var (rig, s) = try Self.ready()
        _ = rig.pipeline.handle(Self.add("user-presence"), session: &s)
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(noUserInterface: true)), session: &s)
        let client = ScriptedChannel([.waitForStop])
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s, channel: client)) == .interactionNotAllowed)
        #expect(client.asked.isEmpty && rig.sensor.evaluations == 0)
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions()), session: &s)
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([.answer(.cancel)]))) == .userCanceled)
        // A client that goes away mid-conversation cancels too.
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([]))) == .userCanceled)
    }

    /// Using a reused authentication, even adding an application password to it (ADD of an item
    /// protected by one), never moves its end: one touch does not last as long as the app keeps asking.
    @Test func reuseNeverExtendsItsOwnWindow() throws {
        var (rig, s) = try Self.ready(FakeSensor(enrolled: false))
        _ = rig.pipeline.handle(Self.add("user-presence"), session: &s)
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(reuseSeconds: 60, applicationPassword: secret("z"))), session: &s)
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([.answer(Self.passcode)]))) == "pin 1234")
        for (i, at) in [20.0, 20, 15].enumerated() {
            rig.clock.advance(at)
            #expect(errorStatus(rig.pipeline.handle(Self.add("application-password", service: "throwaway\(i)"), session: &s,
                                                    channel: ScriptedChannel([]))) == nil)
            let quiet = ScriptedChannel([])
            #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: quiet)) == "pin 1234" && quiet.asked.isEmpty, "at \(at)")
        }
        // 61 s after the person authenticated, whatever happened since: asked again.
        rig.clock.advance(6)
        let late = ScriptedChannel([.answer(Self.passcode)])
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: late)) == "pin 1234")
        #expect(late.asked.count == 1)
    }

    /// Removing the passcode ends every reuse: access-controlled items cannot be opened until a
    /// passcode is set again (-25291), even by a connection that authenticated a moment before.
    @Test func removingThePasscodeEndsReuse() throws {
        var (rig, s) = try Self.ready(FakeSensor(enrolled: false))
        _ = rig.pipeline.handle(Self.add("user-presence"), session: &s)
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(reuseSeconds: 60)), session: &s)
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([.answer(Self.passcode)]))) == "pin 1234")
        var owner = rig.greetedSession()
        #expect(errorStatus(rig.pipeline.handle(.removePasscode(current: secret(AgentRig.passcode)), session: &owner)) == nil)
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([]))) == .notAvailable)
    }

    @Test func anAuthenticationIsReusedWithinItsWindowAndNotAfterOrAcrossALock() throws {
        var (rig, s) = try Self.ready()
        _ = rig.pipeline.handle(Self.add("user-presence"), session: &s)
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(reuseSeconds: 60)), session: &s)
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([.answer(Self.passcode)]))) == "pin 1234")
        let second = ScriptedChannel([])
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: second)) == "pin 1234")
        #expect(second.asked.isEmpty, "reused within the window")
        rig.clock.advance(61)
        let late = ScriptedChannel([.answer(Self.passcode)])
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: late)) == "pin 1234")
        #expect(late.asked.count == 1)
        rig.schedule.lockNow(reason: "test")
        _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s)
        let afterLock = ScriptedChannel([.answer(Self.passcode)])
        _ = rig.pipeline.handle(Self.get(), session: &s, channel: afterLock)
        #expect(afterLock.asked.count == 1, "a lock ends the reuse")
        // New options invalidate it too (LAContext.invalidate).
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(reuseSeconds: 60)), session: &s)
        let fresh = ScriptedChannel([.answer(Self.passcode)])
        _ = rig.pipeline.handle(Self.get(), session: &s, channel: fresh)
        #expect(fresh.asked.count == 1)
    }

    /// AUTH_OPTIONS' keep-for-the-connection flag (an evaluated LAContext, valid until invalidate on Apple
    /// platforms): no window at all — an hour later the authentication still covers the connection — until a
    /// lock or new options end it; another connection of the same caller holds nothing.
    @Test func anAuthenticationKeptForTheConnectionOutlivesAnyWindowButNotALockOrNewOptions() throws {
        var (rig, s) = try Self.ready()
        _ = rig.pipeline.handle(Self.add("user-presence"), session: &s)
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(keepsForConnection: true)), session: &s)
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([.answer(Self.passcode)]))) == "pin 1234")
        rig.clock.advance(3600)
        let later = ScriptedChannel([])
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: later)) == "pin 1234")
        #expect(later.asked.isEmpty, "an hour later (beyond the 300 s cap of a window) the connection's authentication still holds")
        var other = rig.greetedSession(as: s.caller)
        let elsewhere = ScriptedChannel([.answer(Self.passcode)])
        _ = rig.pipeline.handle(Self.get(), session: &other, channel: elsewhere)
        #expect(elsewhere.asked.count == 1, "another connection holds nothing")
        rig.schedule.lockNow(reason: "test")
        _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s)
        let afterLock = ScriptedChannel([.answer(Self.passcode)])
        _ = rig.pipeline.handle(Self.get(), session: &s, channel: afterLock)
        #expect(afterLock.asked.count == 1, "a lock ends it")
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions()), session: &s)
        let fresh = ScriptedChannel([.answer(Self.passcode)])
        _ = rig.pipeline.handle(Self.get(), session: &s, channel: fresh)
        #expect(fresh.asked.count == 1, "new options end it")
    }

    /// A paged search authenticates once, on its first page; the later pages of that search reuse it —
    /// only that query's, from the cursor the last page returned, without a lock in between.
    @Test func aPagedSearchsAuthenticationCoversOnlyItsOwnNextPages() throws {
        var (rig, s) = try Self.ready(FakeSensor(enrolled: false))
        let big = String(repeating: "x", count: 600 * 1024)   // two such items fill a page (1.5 MiB at version 4)
        for service in ["bank", "other"] {
            for account in ["a", "b", "c"] {
                let attrs: Attributes = ["svce": .string(service), "acct": .string(account),
                                         AccessControl.attributeName: .data(AccessControl(parsing: "device-passcode")!.encoded())]
                #expect(errorStatus(rig.pipeline.handle(.add(NewItem(itemClass: .genericPassword, attributes: attrs, secret: secret(big)), []),
                                                        session: &s)) == nil)
            }
        }
        func query(_ service: String) -> ItemQuery {
            ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string(service)], limit: .all, returnData: true)
        }
        func page(_ q: ItemQuery, _ cursor: UInt64, _ channel: ScriptedChannel) -> (items: Int, next: UInt64)? {
            guard case .itemsPage(let items, let next) = rig.pipeline.handle(.copyMatchingPage(q, cursor: cursor), session: &s, channel: channel)
            else { return nil }
            return (items.count, next)
        }
        let first = ScriptedChannel([.answer(Self.passcode)])
        let p1 = try #require(page(query("bank"), 0, first))
        #expect(p1.items == 2 && p1.next != 0 && first.asked.count == 1)
        // Another query from that cursor, or this query from another cursor: asked again (here the
        // client answers nothing: canceled), never served on the first page's authentication.
        for (q, cursor) in [(query("other"), p1.next), (query("bank"), p1.next - 1)] {
            let silent = ScriptedChannel([])
            #expect(page(q, cursor, silent) == nil && silent.asked.count == 1, "\(q.attributes) from \(cursor)")
        }
        // (Past the last match nothing is protected: an empty last page, and the search is undisturbed.)
        let past = page(query("bank"), p1.next + 1, ScriptedChannel([]))
        #expect(past?.items == 0 && past?.next == 0)
        // The search itself continues without asking.
        let next = ScriptedChannel([])
        let p2 = try #require(page(query("bank"), p1.next, next))
        #expect(p2.items == 1 && p2.next == 0 && next.asked.isEmpty)
        // Done: its last cursor no longer carries the authorization; nor does a lock in mid-search.
        let again = ScriptedChannel([])
        #expect(page(query("bank"), p1.next, again) == nil && again.asked.count == 1)
        let restart = try #require(page(query("bank"), 0, ScriptedChannel([.answer(Self.passcode)])))
        rig.schedule.lockNow(reason: "test")
        _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s)
        let afterLock = ScriptedChannel([])
        #expect(page(query("bank"), restart.next, afterLock) == nil && afterLock.asked.count == 1, "a lock ends it")
    }

    @Test func aPasscodeGivenInAdvanceIsUsedWithoutAsking() throws {
        var (rig, s) = try Self.ready(FakeSensor(enrolled: false))
        _ = rig.pipeline.handle(Self.add("device-passcode"), session: &s)
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(passcode: secret(AgentRig.passcode))), session: &s)
        let client = ScriptedChannel([])
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: client)) == "pin 1234")
        #expect(client.asked.isEmpty)
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(passcode: secret("wrong"))), session: &s)
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([]))) == .authFailed)
    }

    /// A sandboxed app's authentication never tries the passcode (given in advance, typed in its own
    /// prompt, or for LocalAuthentication): the keybag's throttle is not its to spend. Biometry still works.
    @Test func aSandboxedAppsAuthenticationNeverTriesThePasscode() throws {
        let rig = try AgentRig(sensor: FakeSensor(enrolled: false))
        let app = CallerIdentity(pid: rig.peer.pid, uid: rig.peer.uid, establishedBy: .flatpak(appID: "org.example.Bank"),
                                 accessGroups: ["flatpak:org.example.Bank"])
        var s = rig.greetedSession(as: app)
        #expect(errorStatus(rig.pipeline.handle(Self.add("device-passcode"), session: &s)) == nil)
        #expect(errorStatus(rig.pipeline.handle(Self.add("user-presence", service: "either"), session: &s)) == nil)
        let calls = rig.verifier.callCount
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(passcode: secret("guess"))), session: &s)
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([]))) == .notAvailable)
        guard case .laResult(let la) = rig.pipeline.handle(.laEvaluate(.deviceOwnerAuthentication, reason: "x"), session: &s,
                                                           channel: ScriptedChannel([])) else { Issue.record("la"); return }
        #expect(la.error == .passcodeNotSet)
        // canEvaluatePolicy says the same before it asks (it used to say the passcode was available).
        guard case .laResult(let can) = rig.pipeline.handle(.laCanEvaluate(.deviceOwnerAuthentication), session: &s) else {
            Issue.record("can-evaluate"); return
        }
        #expect(can.error == .passcodeNotSet)
        var shell = rig.greetedSession()
        guard case .laResult(let forShell) = rig.pipeline.handle(.laCanEvaluate(.deviceOwnerAuthentication), session: &shell) else {
            Issue.record("can-evaluate, shell"); return
        }
        #expect(forShell.error == nil, "an unsandboxed caller may use the passcode")
        // Typed into its own prompt: not tried either.
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions()), session: &s)
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([.answer(Self.passcode)]))) == .notAvailable)
        #expect(rig.verifier.callCount == calls, "PAM was never asked")
        // With a finger enrolled, user presence is offered as biometry alone, and a touch opens it.
        rig.sensor.enrollAnother()
        rig.sensor.queue(.match())
        let touch = ScriptedChannel([.waitForStop])
        #expect(Self.secretText(rig.pipeline.handle(Self.get("either"), session: &s, channel: touch)) == "pin 1234")
        #expect(touch.asked.map(\.methods) == [[.biometry]])
        #expect(errorStatus(rig.pipeline.handle(Self.get("either"), session: &s, channel: ScriptedChannel([.answer(Self.passcode)]))) == .userCanceled)
        #expect(rig.verifier.callCount == calls)
    }

    @Test func updateAndDeleteOfAProtectedItemNeedTheAuthenticationToo() throws {
        var (rig, s) = try Self.ready(FakeSensor(enrolled: false))
        _ = rig.pipeline.handle(Self.add("user-presence"), session: &s)
        let match = ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("bank")], limit: .all)
        #expect(errorStatus(rig.pipeline.handle(.delete(match), session: &s, channel: ScriptedChannel([.answer(.cancel)]))) == .userCanceled)
        #expect(try rig.keychain.count() == 1)
        guard case .count(1) = rig.pipeline.handle(.update(match, ItemChanges(secret: secret("new"))), session: &s,
                                                    channel: ScriptedChannel([.answer(Self.passcode)])) else { Issue.record("update"); return }
        guard case .count(1) = rig.pipeline.handle(.delete(match), session: &s, channel: ScriptedChannel([.answer(Self.passcode)])) else {
            Issue.record("delete"); return
        }
    }

    @Test func localAuthenticationPolicies() throws {
        var (rig, s) = try Self.ready(FakeSensor(enrolled: false))
        guard case .laResult(let r) = rig.pipeline.handle(.laCanEvaluate(.deviceOwnerAuthenticationWithBiometrics), session: &s) else { return }
        #expect(r.error == .biometryNotEnrolled && r.biometryType == 1)
        guard case .laResult(let r2) = rig.pipeline.handle(.laCanEvaluate(.deviceOwnerAuthentication), session: &s) else { return }
        #expect(r2.error == nil)
        guard case .laResult(let ok) = rig.pipeline.handle(.laEvaluate(.deviceOwnerAuthentication, reason: "sign in"), session: &s,
                                                           channel: ScriptedChannel([.answer(Self.passcode)])) else { return }
        #expect(ok.error == nil)
        rig.sensor.enrollAnother()
        guard case .laResult(let fb) = rig.pipeline.handle(.laEvaluate(.deviceOwnerAuthenticationWithBiometrics, reason: "sign in"), session: &s,
                                                           channel: ScriptedChannel([.answer(.fallback)])) else { return }
        #expect(fb.error == .userFallback, "biometrics-only has no passcode fallback: the app gets userFallback")
        rig.sensor.queue(.match())
        guard case .laResult(let bio) = rig.pipeline.handle(.laEvaluate(.deviceOwnerAuthenticationWithBiometrics, reason: "sign in"),
                                                            session: &s, channel: ScriptedChannel([.waitForStop])) else { return }
        #expect(bio.error == nil && bio.domainState.count == 32)
        guard case .laResult(let cancel) = rig.pipeline.handle(.laEvaluate(.deviceOwnerAuthentication, reason: "x"), session: &s,
                                                               channel: ScriptedChannel([.answer(.cancel)])) else { return }
        #expect(cancel.error == .userCancel)
        // No passcode set: passcodeNotSet.
        let bare = try AgentRig(passcodeSet: false)
        var t = bare.greetedSession()
        guard case .laResult(let np) = bare.pipeline.handle(.laCanEvaluate(.deviceOwnerAuthentication), session: &t) else { return }
        #expect(np.error == .passcodeNotSet)
    }
}

extension AuthenticationTests {
    @Test func anApplicationPasswordIsAskedForWhenMadeAndWhenRead() throws {
        var (rig, s) = try Self.ready(FakeSensor(enrolled: false))
        // Made: the password is asked for (or given in advance).
        let maker = ScriptedChannel([.answer(.applicationPassword(secret("open sesame")))])
        #expect(errorStatus(rig.pipeline.handle(Self.add("application-password"), session: &s, channel: maker)) == nil)
        #expect(maker.asked.first?.methods == [.applicationPassword])
        // Audited as an authentication, like every other.
        let made = AuditReader.read(directory: rig.dir.path).records.filter { $0.operation == "authenticate" && $0.app == "com.example.bank" }
        #expect(made.count == 1 && made.first?.result == 0, "\(made)")
        // Read: asked again, and only the right one opens it.
        let reader = ScriptedChannel([.answer(.applicationPassword(secret("open sesame")))])
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: reader)) == "pin 1234")
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([.answer(.applicationPassword(secret("guess")))])))
                == .authFailed)
        #expect(errorStatus(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([.answer(.cancel)]))) == .userCanceled)
        // Given in advance: no question.
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions(applicationPassword: secret("open sesame"))), session: &s)
        let quiet = ScriptedChannel([])
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: quiet)) == "pin 1234")
        #expect(quiet.asked.isEmpty)
        // "and" with the passcode: both are asked for, one after the other.
        _ = rig.pipeline.handle(.authOptions(AuthenticationOptions()), session: &s)
        let both = ScriptedChannel([.answer(.applicationPassword(secret("pw2")))])
        #expect(errorStatus(rig.pipeline.handle(Self.add("device-passcode,and,application-password", service: "two"), session: &s, channel: both)) == nil)
        let twoSteps = ScriptedChannel([.answer(Self.passcode), .answer(.applicationPassword(secret("pw2")))])
        #expect(Self.secretText(rig.pipeline.handle(Self.get("two"), session: &s, channel: twoSteps)) == "pin 1234")
        #expect(twoSteps.asked.map(\.methods) == [[.passcode], [.applicationPassword]])
    }
}

/// The seeds' policy table, pure.
@Suite struct AuthenticationPlannerTests {
    let enrolled = BiometryState(available: true, enrolled: true, domainState: [1])
    func rule(_ t: String, _ ds: [UInt8] = []) -> AccessControl { AccessControl(parsing: t)!.with(domainState: ds) }

    @Test func userPresencePrefersBiometryWithPasscodeFallbackElsePasscode() {
        #expect(AuthenticationPlanner.next(rules: [rule("user-presence")], established: .none, biometry: enrolled, passcodeSet: true)
                == .ask([.biometry, .passcode]))
        #expect(AuthenticationPlanner.next(rules: [rule("user-presence")], established: .none, biometry: .unavailable, passcodeSet: true)
                == .ask([.passcode]))
        var locked = enrolled
        locked.lockedOut = true
        #expect(AuthenticationPlanner.next(rules: [rule("user-presence")], established: .none, biometry: locked, passcodeSet: true)
                == .ask([.passcode]))
    }

    @Test func biometryOnlyRulesFailWithTheSensorsReason() {
        let notEnrolled = BiometryState(available: true, enrolled: false)
        guard case .fail(let e) = AuthenticationPlanner.next(rules: [rule("biometry-any")], established: .none, biometry: notEnrolled, passcodeSet: true) else {
            Issue.record("expected a failure"); return
        }
        #expect(e.code == .biometryNotEnrolled)
        guard case .fail(let n) = AuthenticationPlanner.next(rules: [rule("biometry-any")], established: .none, biometry: .unavailable, passcodeSet: true) else { return }
        #expect(n.code == .biometryNotAvailable)
        guard case .fail(let c) = AuthenticationPlanner.next(rules: [rule("biometry-current-set", [9])], established: .none, biometry: enrolled,
                                                             passcodeSet: true) else { return }
        #expect(c.code == .authenticationFailed)
        guard case .fail(let p) = AuthenticationPlanner.next(rules: [rule("user-presence")], established: .none, biometry: enrolled, passcodeSet: false) else { return }
        #expect(p.code == .passcodeNotSet)
    }

    @Test func andRulesAskForEachFactorInTurn() {
        let both = rule("biometry-any,and,device-passcode")
        #expect(AuthenticationPlanner.next(rules: [both], established: .none, biometry: enrolled, passcodeSet: true) == .ask([.biometry]))
        let afterFinger = AuthorizationContext(biometryVerified: true, biometryDomainState: [1])
        #expect(AuthenticationPlanner.next(rules: [both], established: afterFinger, biometry: enrolled, passcodeSet: true) == .ask([.passcode]))
        let all = AuthorizationContext(passcodeVerified: true, biometryVerified: true, biometryDomainState: [1])
        #expect(AuthenticationPlanner.next(rules: [both], established: all, biometry: enrolled, passcodeSet: true) == .satisfied)
        #expect(AuthenticationPlanner.next(rules: [rule("biometry-any,or,device-passcode")], established: .none, biometry: enrolled, passcodeSet: true)
                == .ask([.biometry, .passcode]))
    }

    @Test func theLockoutCountsFiveMissesAndOnlyThePasscodeLiftsIt() {
        var l = BiometricLockout()
        for i in 1...4 {
            let locked = l.recordFailure()
            #expect(!locked, "miss \(i)")
        }
        let locked = l.recordFailure()
        #expect(locked && l.isLockedOut)
        l.recordMatch()
        #expect(l.isLockedOut, "a match cannot lift a lockout")
        l.recordPasscode()
        #expect(!l.isLockedOut)
    }
}

/// Review of issue #23 part 6: what the person is told when a passcode cannot be tried, and when the
/// sensor gives up.
extension AuthenticationTests {
    /// C2: a passcode the attempt schedule refuses before trying it (too soon after failures in a
    /// row) ends the request at once with -25293 saying how long to wait. It used to be "Wrong
    /// passcode. Try again." (kind 1: ask again), though no answer could succeed before the wait ended.
    @Test func aPasscodeTheAttemptScheduleRefusesEndsTheRequestWithTheWait() throws {
        var (rig, s) = try Self.ready(FakeSensor(enrolled: false))
        #expect(errorStatus(rig.pipeline.handle(Self.add("device-passcode"), session: &s)) == nil)
        // Four wrong passcodes in a row (at UNLOCK): by the standard schedule the next attempt waits 1 min.
        for _ in 0..<4 {
            #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s)) == .authFailed)
        }
        let calls = rig.verifier.callCount
        let client = ScriptedChannel([.answer(Self.passcode), .answer(Self.passcode), .answer(Self.passcode)])
        let r = rig.pipeline.handle(Self.get(), session: &s, channel: client)
        guard case .error(let e) = r else { Issue.record("expected -25293, got \(r)"); return }
        #expect(e.status == .authFailed && e.message.contains("try again in"), "\(e)")
        #expect(client.feedbacks.isEmpty, "not 'Wrong passcode': \(client.feedbacks)")
        #expect(client.steps.count == 2, "the request ended at the first answer")
        #expect(rig.verifier.callCount == calls, "the passcode was not tried")
        // LocalAuthentication the same: authenticationFailed with the wait, at the first answer.
        guard case .laResult(let la) = rig.pipeline.handle(.laEvaluate(.deviceOwnerAuthentication, reason: "sign in"), session: &s,
                                                           channel: ScriptedChannel([.answer(Self.passcode), .answer(Self.passcode)])) else {
            Issue.record("LA_RESULT"); return
        }
        #expect(la.error == .authenticationFailed && la.message.contains("try again in"), "\(la)")
        // Once the wait is over the right passcode is accepted.
        rig.clock.advance(61)
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: ScriptedChannel([.answer(Self.passcode)]))) == "pin 1234")
    }

    /// C3: a sensor that ends its evaluation itself (cancelled on the sensor, its own timeout) while
    /// the passcode is among the methods: the client is told that only the passcode is left (kind 3).
    /// Nothing was sent before, so a client still showed "touch the sensor".
    @Test func aSensorThatGivesUpLeavesThePasscodeAndSaysSo() throws {
        var (rig, s) = try Self.ready()
        #expect(errorStatus(rig.pipeline.handle(Self.add("user-presence"), session: &s)) == nil)
        rig.sensor.queue(.cancelled)
        let client = ScriptedChannel([.waitForStop, .answer(Self.passcode)])
        #expect(Self.secretText(rig.pipeline.handle(Self.get(), session: &s, channel: client)) == "pin 1234")
        #expect(client.feedbacks == ["The sensor stopped: type your passcode."] && client.feedbackKinds == [.passcodeOnly])
        #expect(rig.sensor.evaluations == 1)
    }

    /// The agent's own stop of the sensor (while it checks a wrong passcode) is not the sensor giving
    /// up: the wrong-passcode feedback is the only frame, and the sensor goes on.
    @Test func aWrongPasscodeWhileTheSensorWaitsKeepsTheSensor() throws {
        var (rig, s) = try Self.ready()
        #expect(errorStatus(rig.pipeline.handle(Self.add("user-presence"), session: &s)) == nil)
        // Evaluation 1 ends (cancelled) only after the wrong passcode was checked, as a sensor slow
        // to stop does; the next one matches.
        rig.sensor.holdThroughCancel(evaluation: 1)
        rig.sensor.queue(.match())
        let (sensor, verifier, calls) = (rig.sensor, rig.verifier, rig.verifier.callCount)
        Thread.detachNewThread {
            for _ in 0..<30_000 where verifier.callCount == calls { usleep(1000) }
            sensor.answer(evaluation: 1, .cancelled)
        }
        let client = ScriptedChannel([.answer(.passcode(secret("wrong"))), .waitForStop, .waitForStop])
        let r = rig.pipeline.handle(Self.get(), session: &s, channel: client)
        #expect(Self.secretText(r) == "pin 1234", "\(r)")
        #expect(client.feedbacks == ["Wrong passcode. Try again (3 attempts left before a wait of 1 min)."]
                && client.feedbackKinds == [.wrongPasscode], "\(client.feedbacks)")
        #expect(rig.sensor.evaluations == 2)
    }
}
