@testable import CofferAgent
import CofferTestSupport
import CofferModel
import CofferProtocol
import Testing

@Suite struct RetryThrottleTests {
    @Test func noDelayForTheFirstTwoFailuresThenDoublingToSixty() {
        let delays = (0...12).map { RetryThrottle.delay(afterFailures: $0) }
        #expect(delays == [0, 0, 0, 1, 2, 4, 8, 16, 32, 60, 60, 60, 60])
    }

    @Test func aValueCountsFailuresAndResetsOnSuccess() {
        var t = RetryThrottle()
        #expect(t.recordFailure() == 0 && t.recordFailure() == 0 && t.recordFailure() == 1 && t.recordFailure() == 2)
        #expect(t.failures == 4 && t.delay == 2)
        t.recordSuccess()
        #expect(t.failures == 0 && t.delay == 0 && t.recordFailure() == 0)
    }
}

/// The unlock service with a stub verifier and a fake clock: the backoff is waited out on the clock
/// (no real sleep), attempts are counted, success resets.
@Suite struct UnlockServiceTests {
    @Test func failedUnlocksWaitOneTwoFourSecondsFromTheThirdAndSuccessResets() throws {
        let rig = try AgentRig()
        _ = rig.keychain.lock()
        var s = rig.greetedSession()
        for _ in 0..<6 {
            #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s)) == .authFailed)
        }
        // Attempts 1–3 started at once; attempt 4 waited 1 s (after 3 failures), 5 waited 2 s, 6 waited 4 s.
        #expect(rig.clock.sleeps == [1, 2, 4])
        #expect(rig.unlocking.failures == 6)
        // The seventh attempt (right passcode) waits 8 s, then succeeds and resets the throttle.
        guard case .ok = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s) else {
            Issue.record("unlock failed"); return
        }
        #expect(rig.clock.sleeps == [1, 2, 4, 8])
        #expect(rig.unlocking.failures == 0 && rig.keychain.status.lockState == .unlocked)
        _ = rig.keychain.lock()
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s)) == .authFailed)
        #expect(errorStatus(rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s)) == .authFailed)
        #expect(rig.clock.sleeps == [1, 2, 4, 8], "after a success, two failures cost no wait")
    }

    @Test func theWaitIsCappedAtSixtySeconds() throws {
        let rig = try AgentRig()
        var s = rig.greetedSession()
        for _ in 0..<12 { _ = rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s) }
        #expect(rig.clock.sleeps == [1, 2, 4, 8, 16, 32, 60, 60, 60])
    }

    @Test func timeThatAlreadyPassedIsNotWaitedAgain() throws {
        let rig = try AgentRig()
        var s = rig.greetedSession()
        for _ in 0..<3 { _ = rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s) }
        rig.clock.advance(5)
        _ = rig.pipeline.handle(.unlock(passcode: secret("wrong")), session: &s)
        #expect(rig.clock.sleeps.isEmpty)
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
