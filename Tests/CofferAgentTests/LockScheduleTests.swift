@testable import CofferNativeFrontEnd
import CofferKeychain
import CofferService
import CofferServiceTestSupport
import CofferTestSupport
import CofferModel
import CofferProtocol
import Testing

/// Idle and grace locks with a fake clock: no sleeps.
@Suite struct LockScheduleTests {
    let query = AgentRequest.copyMatching(ItemQuery(itemClass: .genericPassword, attributes: ["svce": .string("nothing")]))

    @Test func idleTimeAnnouncesTheLockThenLocksAfterTheGrace() throws {
        let rig = try AgentRig(idleSeconds: 60, graceSeconds: 10)
        rig.clock.advance(59.9)
        rig.schedule.tick()
        #expect(rig.events.all.isEmpty)
        rig.clock.advance(0.1)
        rig.schedule.tick()
        #expect(rig.events.all == [.willLock(graceMillis: 10_000)])
        #expect(rig.keychain.status.lockState == .unlocked, "keys wiped before the grace period ended")
        rig.clock.advance(9.9)
        rig.schedule.tick()
        #expect(rig.keychain.status.lockState == .unlocked)
        rig.clock.advance(0.1)
        rig.schedule.tick()
        #expect(rig.events.all == [.willLock(graceMillis: 10_000), .locked])
        #expect(rig.keychain.status.lockState == .locked)
        rig.clock.advance(600)
        rig.schedule.tick()
        #expect(rig.events.all.count == 2, "a locked keybag is not locked again")
    }

    @Test func statusAndSubscribeAreNotActivityButKeychainRequestsAre() throws {
        let rig = try AgentRig(idleSeconds: 60, graceSeconds: 0)
        var s = rig.greetedSession()
        rig.clock.advance(50)
        _ = rig.pipeline.handle(.status, session: &s)
        _ = rig.pipeline.handle(.subscribe, session: &s)
        _ = rig.pipeline.handle(.files(.status(path: nil)), session: &s)
        rig.clock.advance(10)
        rig.schedule.tick()
        #expect(rig.events.all == [.willLock(graceMillis: 0), .locked], "STATUS, SUBSCRIBE or FILES status kept the keys unlocked")

        _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s)
        rig.events.clear()
        rig.clock.advance(50)
        _ = rig.pipeline.handle(query, session: &s) // a keychain request: activity
        rig.clock.advance(10)
        rig.schedule.tick()
        #expect(rig.events.all.isEmpty)
        rig.clock.advance(50)
        rig.schedule.tick()
        #expect(rig.events.all == [.willLock(graceMillis: 0), .locked])
    }

    @Test func sessionLockWaitsForTheGraceAndAnUnlockCancelsIt() throws {
        let rig = try AgentRig(graceSeconds: 5)
        rig.schedule.requestLock(reason: "test")
        rig.schedule.requestLock(reason: "again")
        #expect(rig.events.all == [.willLock(graceMillis: 5000)], "a second request while one is pending announced again")
        #expect(rig.schedule.isLockPending)
        var s = rig.greetedSession()
        rig.clock.advance(2)
        _ = rig.pipeline.handle(.unlock(passcode: secret(AgentRig.passcode)), session: &s)
        #expect(!rig.schedule.isLockPending)
        rig.clock.advance(10)
        rig.schedule.tick()
        #expect(rig.events.all == [.willLock(graceMillis: 5000), .unlocked])
        #expect(rig.keychain.status.lockState == .unlocked)
    }

    @Test func noPasscodeMeansNoIdleLock() throws {
        let rig = try AgentRig(passcodeSet: false, idleSeconds: 1, graceSeconds: 0)
        rig.clock.advance(100)
        rig.schedule.tick()
        #expect(rig.events.all.isEmpty && rig.keychain.status.lockState == .unlocked)
    }

    @Test func lockNowBroadcastsLockedOnlyWhenItLocked() throws {
        let rig = try AgentRig()
        rig.schedule.lockNow(reason: "first")
        rig.schedule.lockNow(reason: "second")
        #expect(rig.events.all == [.locked])
    }

    @Test func concurrentLocksBroadcastLockedOnce() async throws {
        for _ in 0..<20 {
            let rig = try AgentRig()
            let schedule = rig.schedule
            await withTaskGroup(of: Void.self) { g in
                for _ in 0..<4 { g.addTask { schedule.lockNow(reason: "race") } }
            }
            #expect(rig.events.all == [.locked])
        }
    }
}
