@testable import CofferKeybag
import CofferCrypto
import CofferModel
import CofferSystem
import CofferTestSupport
import Testing

/// The keybag's state is owned by its lock (`Protected<State>`): concurrent lock calls and key reads
/// see whole transitions, never a half-wiped key (run under ThreadSanitizer by contrib/test.sh).
@Suite struct KeybagConcurrencyTests {
    @Test func concurrentLocksSeeOneTransitionAndReadersSeeTheWholeKeyOrNone() async throws {
        let dir = TemporaryDirectory()
        let bag = try Keybag.openOrCreate(directory: dir.path, deviceKey: FileDeviceKey(path: dir.file("device.key")))
        try bag.setPasscode(current: nil, new: secret("1234"), kdf: testKDF)
        let key = try keyBytes(bag, .whenUnlocked)
        #expect(key.count == Keybag.keyBytes && key.contains { $0 != 0 })
        for _ in 0..<20 {
            try bag.unlock(passcode: secret("1234"))
            #expect(bag.status.lockState == .unlocked)
            let outcomes = await withTaskGroup(of: (locked: Int, reads: Int, bad: Int).self) { group in
                for worker in 0..<6 {
                    group.addTask {
                        if worker < 3 { return (bag.lock() ? 1 : 0, 0, 0) }
                        var reads = 0, bad = 0
                        for _ in 0..<50 {
                            do throws(SecError) {
                                let seen = try bag.withClassKey(.whenUnlocked) { Array($0) }
                                if seen == key { reads += 1 } else { bad += 1 }
                            } catch {
                                if error.status != .interactionNotAllowed { bad += 1 }
                            }
                        }
                        return (0, reads, bad)
                    }
                }
                var total = (locked: 0, reads: 0, bad: 0)
                for await r in group { total.locked += r.locked; total.reads += r.reads; total.bad += r.bad }
                return total
            }
            #expect(outcomes.locked == 1, "exactly one of the concurrent lock() calls locks")
            #expect(outcomes.bad == 0, "a reader saw a partial key or an unexpected error")
            #expect(bag.status == LockStatus(lockState: .locked, passcodeSet: true))
            #expect(!bag.isAvailable(.whenUnlocked) && bag.isAvailable(.afterFirstUnlock))
        }
    }
}
