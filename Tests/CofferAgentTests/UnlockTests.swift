@testable import CofferAgent
@testable import CofferNativeFrontEnd
@testable import CofferService
import CofferServiceTestSupport
import CofferTestSupport
import CofferModel
import CofferCrypto
import CofferKeychain
import CofferKeybag
import CofferProtocol
import CofferSystem
import Foundation
import Logging
import Testing

@Suite struct AttemptScheduleTests {
    @Test func iOSsDelaysByDefault() {
        let delays = (0...12).map { AttemptSchedule.standard.delay(afterFailures: $0) }
        // Attempts 1–4 free; the 5th waits 1 min, the 6th 5 min, the 7th and 8th 15 min, then 1 h.
        #expect(delays == [0, 0, 0, 0, 60, 300, 900, 900, 3600, 3600, 3600, 3600, 3600])
        #expect(AttemptSchedule.standard.eraseAfter == nil)
    }

    /// Issue #43: the person learns how many attempts are left before a wait (and before an erase).
    @Test func aWrongPasscodeSaysHowManyAttemptsAreLeftBeforeAWait() {
        let standard = AttemptSchedule.standard
        #expect(standard.wrongPasscodeFeedback(afterFailures: 1) == "Wrong passcode. Try again (3 attempts left before a wait of 1 min).")
        #expect(standard.wrongPasscodeFeedback(afterFailures: 3) == "Wrong passcode. Try again (1 attempt left before a wait of 1 min).")
        #expect(standard.attemptsNotice(afterFailures: 4) == "the next attempt must wait 1 min")
        #expect(standard.attemptsNotice(afterFailures: 5) == "the next attempt must wait 5 min")
        #expect(standard.attemptsNotice(afterFailures: 40) == "the next attempt must wait 1 h")
        // A schedule that never waits says nothing of waits; erase-after is counted down.
        let erasing = AttemptSchedule(delays: [0], eraseAfter: 3)
        #expect(erasing.wrongPasscodeFeedback(afterFailures: 1) == "Wrong passcode. Try again (2 more wrong passcodes erase the keychain).")
        #expect(erasing.attemptsNotice(afterFailures: 2) == "1 more wrong passcode erases the keychain")
        #expect(AttemptSchedule(delays: [0], eraseAfter: nil).wrongPasscodeFeedback(afterFailures: 7) == "Wrong passcode. Try again.")
        let both = AttemptSchedule(delays: [0, 30], eraseAfter: 10)
        #expect(both.attemptsNotice(afterFailures: 1) == "1 attempt left before a wait of 30 s; 9 more wrong passcodes erase the keychain")
        #expect(both.attemptsNotice(afterFailures: 2) == "the next attempt must wait 30 s; 8 more wrong passcodes erase the keychain")
    }

    @Test func theFileRoundTripsAndADamagedOneFailsClosed() throws {
        let dir = TemporaryDirectory("coffer-attempts")
        let path = dir.file("attempts")
        #expect(FailedAttempts.read(path, schedule: .standard, now: 5) == .none)
        writeFileBytes(path, FailedAttempts(failures: 3, lastFailure: 1700000000.5).encoded)
        #expect(FailedAttempts.read(path, schedule: .standard, now: 5) == FailedAttempts(failures: 3, lastFailure: 1700000000.5))
        for junk in ["", "coffer attempts v2 1 2\n", "coffer attempts v1 -1 2\n", "garbage"] {
            writeFileBytes(path, Array(junk.utf8))
            #expect(FailedAttempts.read(path, schedule: .standard, now: 99) == FailedAttempts(failures: 8, lastFailure: 99), "\(junk)")
        }
    }
}

/// The unlock service with a stub verifier and a fake wall clock: an attempt before the schedule's
/// delay is refused at once and not counted; every attempt is written down before it runs; the count
/// survives a restart; success resets it.
@Suite struct UnlockServiceTests {
    @Test func theFifthAttemptWaitsAMinuteAndEarlyAttemptsAreRefusedUncounted() throws {
        let rig = try AgentRig()
        _ = rig.keychain.lock()
        var s = rig.greetedSession()
        for _ in 0..<4 {
            #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s)) == .authFailed)
        }
        #expect(rig.unlocking.failures == 4 && rig.verifier.callCount == 4)
        // Too early: refused at once, PAM never runs, nothing counted; the message says when.
        guard case .error(let early) = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s) else {
            Issue.record("an early attempt ran"); return
        }
        #expect(early.status == .authFailed && early.message.contains("try again in 60 s"), "\(early.message)")
        #expect(rig.unlocking.failures == 4 && rig.verifier.callCount == 4)
        rig.clock.advance(59)
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s)) == .authFailed)
        #expect(rig.verifier.callCount == 4)
        rig.clock.advance(1)
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s)) == .authFailed)
        #expect(rig.unlocking.failures == 5 && rig.unlocking.retryAfter == 300)
        rig.clock.advance(300)
        guard case .ok = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s) else {
            Issue.record("unlock failed"); return
        }
        #expect(rig.unlocking.failures == 0 && rig.unlocking.retryAfter == 0 && rig.keychain.status.lockState == .unlocked)
        #expect(rig.clock.sleeps.isEmpty, "nothing waits while holding the gate")
    }

    @Test func theCountSurvivesARestartAndIsWrittenBeforeTheCheck() throws {
        let rig = try AgentRig()
        _ = rig.keychain.lock()
        var s = rig.greetedSession()
        for _ in 0..<4 { _ = rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s) }
        // A new service over the same file (the agent restarted): still four failures, still a minute to wait.
        let again = UnlockService(keychain: rig.keychain, verifier: rig.verifier, userName: "tester", kdfPolicy: cheapKDF, clock: rig.clock,
                                  logger: .init(label: "test"), attemptsFile: rig.dir.file("attempts"))
        #expect(again.failures == 4 && again.retryAfter == 60)
        // During the check the file already says "failed": a kill now would earn no free attempt.
        rig.clock.advance(60)
        let watcher = FileWatchingVerifier(path: rig.dir.file("attempts"), accepting: AgentRig.passcode)
        let watched = UnlockService(keychain: rig.keychain, verifier: watcher, userName: "tester", kdfPolicy: cheapKDF, clock: rig.clock,
                                    logger: .init(label: "test"), attemptsFile: rig.dir.file("attempts"))
        #expect(throws: SecError.self) { try watched.unlock(secret("wrong")) }
        #expect(watcher.seen == ["coffer attempts v1 5 \(rig.clock.now())"], "\(watcher.seen)")
    }

    /// The login password changed behind Coffer's back: PAM takes the new one, the keybag does not.
    @Test func aLoginPasswordChangedOutsideCofferIsKeptAndSyncedWithThePreviousOne() throws {
        let rig = try AgentRig()
        try rig.keychain.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("mail")], secret: secret("kept")), scope: .unrestricted)
        _ = rig.keychain.lock()
        var s = rig.greetedSession()
        rig.verifier.accepted = "new login password"
        guard case .error(let e) = rig.pipeline.handle(.unlock(passcode: secret("new login password")), session: &s) else {
            Issue.record("the old keybag opened with the new password"); return
        }
        #expect(e.status == .authFailed && e.message.contains("coffer passcode sync"))
        #expect(rig.unlocking.failures == 0, "PAM vouched for it: not a guess")
        guard case .count(1) = rig.pipeline.handle(.passcodeSync(oldPasscode: nil), session: &s) else { Issue.record("not out of sync"); return }
        // A wrong previous passcode changes nothing.
        #expect(errorStatus(rig.pipeline.handle(.passcodeSync(oldPasscode: secret("nope")), session: &s)) == .authFailed)
        guard case .ok = rig.pipeline.handle(.passcodeSync(oldPasscode: secret(AgentRig.passcode)), session: &s) else {
            Issue.record("sync failed"); return
        }
        guard case .count(0) = rig.pipeline.handle(.passcodeSync(oldPasscode: nil), session: &s) else { Issue.record("still out of sync"); return }
        #expect(rig.keychain.status.lockState == .unlocked)
        _ = rig.keychain.lock()
        guard case .ok = rig.pipeline.handle(.unlock(passcode: secret("new login password")), session: &s) else { Issue.record("new password"); return }
        #expect(text(try rig.keychain.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("mail")], returnData: true), scope: .unrestricted).first?.data) == "kept")
        #expect(errorStatus(rig.pipeline.handle(.passcodeSync(oldPasscode: secret(AgentRig.passcode)), session: &s)) == .notAvailable)
    }

    @Test func eraseAfterDestroysTheKeybagAndEveryItem() throws {
        let rig = try AgentRig()
        try rig.keychain.add(NewItem(itemClass: .genericPassword, attributes: ["svce": .string("x")], secret: secret("s")), scope: .unrestricted)
        _ = rig.keychain.lock()
        let erased = Protected(false)
        let service = UnlockService(keychain: rig.keychain, verifier: rig.verifier, userName: "tester", kdfPolicy: cheapKDF, clock: rig.clock,
                                    logger: .init(label: "test"), schedule: AttemptSchedule(delays: [0], eraseAfter: 3),
                                    attemptsFile: rig.dir.file("attempts")) { erased.withLock { $0 = true } }
        for i in 1...3 {
            do { try service.unlock(secret("wrong")) } catch {
                #expect(error.status == .authFailed)
                if i == 3 { #expect(error.message.contains("erased")) }
            }
        }
        #expect(erased.withLock { $0 })
        #expect(!Files.exists(rig.dir.file("keybag")) && !Files.exists(rig.dir.file("keybag.key")) && !Files.exists(rig.dir.file("attempts")))
        // Opened again: a fresh keybag, no passcode, no items.
        let fresh = try Keychain(directory: rig.dir.path)
        #expect(try fresh.count() == 0 && !fresh.status.passcodeSet)
    }

    @Test func theVerifierRunsBeforeTheKeybagAndAWrongKeybagPasscodeCountsToo() throws {
        let rig = try AgentRig()
        _ = rig.keychain.lock()
        var s = rig.greetedSession()
        // The stub accepts only the right passcode, so a refusal never reaches Argon2id.
        _ = rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s)
        #expect(rig.verifier.callCount == 1 && rig.unlocking.failures == 1)
        // A passcode set change that PAM refuses counts as well.
        _ = rig.pipeline.handle(.setPasscode(current: secret(AgentRig.passcode), new: secret("not the login password")), session: &s)
        #expect(rig.unlocking.failures == 2 && rig.keychain.status.lockState == .locked)
    }

    @Test func unlockWithoutAPasscodeIsNotAvailableAndCountsNothing() throws {
        let rig = try AgentRig(passcodeSet: false)
        var s = rig.greetedSession()
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret("x")), session: &s)) == .notAvailable)
        #expect(errorStatus(rig.pipeline.handle(.lock, session: &s)) == .notAvailable)
        #expect(rig.unlocking.failures == 0 && rig.verifier.callCount == 0)
    }

    @Test func settingThePasscodeUnlocksAndTellsSubscribers() throws {
        let rig = try AgentRig(passcodeSet: false)
        var s = rig.greetedSession()
        guard case .ok = rig.pipeline.handle(.setPasscode(current: secret(""), new: secret(AgentRig.passcode)), session: &s) else {
            Issue.record("passcode set failed"); return
        }
        #expect(rig.keychain.status == LockStatus(lockState: .unlocked, passcodeSet: true))
        #expect(rig.events.all == [.unlocked])
    }
}

/// A verifier that records what the attempts file says while it checks.
final class FileWatchingVerifier: PasscodeVerifier, @unchecked Sendable {
    let path: String
    let accepted: String
    private(set) var seen: [String] = []
    init(path: String, accepting: String) {
        self.path = path
        accepted = accepting
    }
    func verify(user: String, passcode: SecureBytes) throws(PasscodeRejected) {
        seen.append(String(decoding: fileBytes(path), as: UTF8.self).trimmingCharacters(in: .newlines))
        guard text(passcode) == accepted else { throw PasscodeRejected(description: "no") }
    }
}

/// The configuration keys of the device key (issue #28).
@Suite struct DeviceKeyConfigurationTests {
    @Test func deviceKeyAndTCTIParseAndChooseTheSource() throws {
        var config = AgentConfiguration(socketPath: "/x", stateDirectory: "/state", userName: "u")
        #expect(config.deviceKey == .file && config.deviceKeySource == nil, "the file key by default")
        try config.apply(configFile: "device-key = tpm\ntpm-tcti = swtpm:host=127.0.0.1,port=2321\n", name: "c")
        let source = try #require(config.deviceKeySource as? TPMDeviceKey)
        #expect(source.tcti == "swtpm:host=127.0.0.1,port=2321" && source.path == "/state/device-key.tpm")
        for bad in ["device-key = sealed\n", "device-key =\n", "tpm-tcti =\n"] {
            let error = try #require(throws: AgentError.self) { try config.apply(configFile: bad, name: "c") }
            #expect(error.description.contains("c:1"), "\(error)")
        }
        try config.apply(configFile: "device-key = file\n", name: "c")
        #expect(config.deviceKeySource == nil)
    }
}
